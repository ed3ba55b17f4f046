//! Writes tensors as a `.safetensors` file with the `{"format": "pt"}` header that
//! transformers and PEFT expect (tch's own writer leaves the metadata out).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensorError, View};
use tch::{Device, Kind, Tensor};

/// A tensor copied to contiguous CPU memory, ready to serialise.
struct HostTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl HostTensor {
    fn new(t: &Tensor) -> Result<Self, SafeTensorError> {
        let dtype = match t.kind() {
            Kind::Float => Dtype::F32,
            Kind::BFloat16 => Dtype::BF16,
            Kind::Half => Dtype::F16,
            Kind::Double => Dtype::F64,
            Kind::Int64 => Dtype::I64,
            Kind::Int => Dtype::I32,
            Kind::Int16 => Dtype::I16,
            Kind::Int8 => Dtype::I8,
            Kind::Uint8 => Dtype::U8,
            Kind::Bool => Dtype::BOOL,
            other => {
                return Err(SafeTensorError::IoError(std::io::Error::other(format!(
                    "cannot store a {other:?} tensor in safetensors"
                ))))
            }
        };
        let host = t.detach().to_device(Device::Cpu).contiguous();
        let numel = host.numel();
        let mut bytes = vec![0u8; numel * host.kind().elt_size_in_bytes()];
        host.f_copy_data_u8(&mut bytes, numel)
            .map_err(|e| SafeTensorError::IoError(std::io::Error::other(e.to_string())))?;
        Ok(HostTensor {
            dtype,
            shape: host.size().iter().map(|&d| d as usize).collect(),
            bytes,
        })
    }
}

impl View for &HostTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Writes `named` tensors to `path`.
pub fn write(named: &[(String, &Tensor)], path: &Path) -> Result<(), SafeTensorError> {
    let host = named
        .iter()
        .map(|(name, t)| Ok((name.clone(), HostTensor::new(t)?)))
        .collect::<Result<Vec<_>, SafeTensorError>>()?;
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::tensor::serialize_to_file(
        host.iter().map(|(name, t)| (name.as_str(), t)),
        Some(metadata),
        path,
    )
}
