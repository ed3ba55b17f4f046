//! Parquet output: the [`Row`] columns as Arrow arrays, snappy-compressed. Token ids, logprobs
//! and the loss mask are `list<int32>` / `list<float>`; JSON-valued columns (`prompt`,
//! `completion`, `messages`, `tools`, `next_state`) are JSON strings, because OpenAI messages
//! have no fixed struct shape (content as text or parts, optional tool calls) to give Arrow.

use std::fs::File;
use std::sync::Arc;

use arrow_array::types::{Float32Type, Int32Type};
use arrow_array::{
    ArrayRef, Float64Array, ListArray, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use super::row::Row;
use super::{ExportError, RowSink};

/// Rows buffered into one Arrow batch: large enough for columnar encoding to pay off, small
/// enough that a long export's memory stays flat.
const BATCH_ROWS: usize = 1024;

/// Version of the exported column set, in the file's key-value metadata.
const EXPORT_VERSION: &str = "1";

pub struct ParquetSink {
    writer: ArrowWriter<File>,
    buffered: Vec<Row>,
}

impl ParquetSink {
    pub fn new(file: File) -> Result<Self, ExportError> {
        let schema = batch(&[])?.schema();
        let properties = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_key_value_metadata(Some(vec![KeyValue::new(
                "clawback.export_version".to_owned(),
                EXPORT_VERSION.to_owned(),
            )]))
            .build();
        Ok(ParquetSink {
            writer: ArrowWriter::try_new(file, schema, Some(properties))?,
            buffered: Vec::with_capacity(BATCH_ROWS),
        })
    }

    fn flush_batch(&mut self) -> Result<(), ExportError> {
        if !self.buffered.is_empty() {
            self.writer.write(&batch(&self.buffered)?)?;
            self.buffered.clear();
        }
        Ok(())
    }
}

impl RowSink for ParquetSink {
    fn write(&mut self, rows: Vec<Row>) -> Result<(), ExportError> {
        self.buffered.extend(rows);
        if self.buffered.len() >= BATCH_ROWS {
            self.flush_batch()?;
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<(), ExportError> {
        self.flush_batch()?;
        self.writer.close()?;
        Ok(())
    }
}

/// The rows as one Arrow batch; its schema (of an empty batch) is the file's schema.
fn batch(rows: &[Row]) -> Result<RecordBatch, ExportError> {
    let text = |f: fn(&Row) -> Option<&str>| -> ArrayRef {
        Arc::new(rows.iter().map(f).collect::<StringArray>())
    };
    let json = |f: fn(&Row) -> Option<&serde_json::Value>| -> Result<ArrayRef, ExportError> {
        let values = rows
            .iter()
            .map(|r| f(r).map(serde_json::to_string).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(StringArray::from(values)))
    };
    let ids = |f: fn(&Row) -> &[u32]| -> Result<ArrayRef, ExportError> {
        let lists = rows
            .iter()
            .map(|r| {
                f(r).iter()
                    .map(|&id| {
                        i32::try_from(id)
                            .map(Some)
                            .map_err(|_| ExportError::TokenIdOutOfRange(id))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Some)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(
            lists,
        )))
    };
    // Nullability is explicit: inferring it from a batch would make the empty batch that
    // gives the schema refuse the nulls of later ones.
    let columns: Vec<(&str, ArrayRef, bool)> = vec![
        ("tenant", text(|r| Some(r.tenant.as_str())), false),
        (
            "trajectory_id",
            text(|r| Some(r.trajectory_id.as_str())),
            false,
        ),
        ("group_id", text(|r| r.group_id.as_deref()), true),
        ("step_id", text(|r| Some(r.step_id.as_str())), false),
        (
            "step_index",
            Arc::new(UInt32Array::from_iter_values(
                rows.iter().map(|r| r.step_index),
            )),
            false,
        ),
        ("prompt", json(|r| Some(&r.prompt))?, false),
        ("completion", json(|r| Some(&r.completion))?, false),
        ("messages", json(|r| Some(&r.messages))?, false),
        ("tools", json(|r| Some(&r.tools))?, false),
        ("prompt_token_ids", ids(|r| &r.prompt_token_ids)?, false),
        (
            "completion_token_ids",
            ids(|r| &r.completion_token_ids)?,
            false,
        ),
        (
            "completion_logprobs",
            Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(
                rows.iter()
                    .map(|r| Some(r.completion_logprobs.iter().map(|&l| Some(l)))),
            )),
            false,
        ),
        (
            "loss_mask",
            Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(
                rows.iter()
                    .map(|r| Some(r.loss_mask.iter().map(|&m| Some(i32::from(m))))),
            )),
            false,
        ),
        ("tokens_source", text(|r| Some(r.tokens_source)), false),
        (
            "reward",
            Arc::new(rows.iter().map(|r| r.reward).collect::<Float64Array>()),
            true,
        ),
        ("reward_source", text(|r| r.reward_source), true),
        ("hint", text(|r| r.hint.as_deref()), true),
        ("next_state", json(|r| r.next_state.as_ref())?, true),
        ("finish_reason", text(|r| r.finish_reason.as_deref()), true),
        (
            "policy_adapter",
            text(|r| r.policy_adapter.as_deref()),
            true,
        ),
        (
            "policy_version",
            Arc::new(
                rows.iter()
                    .map(|r| r.policy_version)
                    .collect::<UInt64Array>(),
            ),
            true,
        ),
        ("model", text(|r| Some(r.model.as_str())), false),
    ];
    Ok(RecordBatch::try_from_iter_with_nullable(columns)?)
}
