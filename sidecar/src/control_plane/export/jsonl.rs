//! JSONL output: one [`Row`] per line, JSON-valued columns as nested JSON, so
//! `datasets.load_dataset("json", ...)` yields TRL's conversational `prompt`/`completion` as is.

use std::io::{BufWriter, Write};

use super::row::Row;
use super::{ExportError, RowSink};

pub struct JsonlSink {
    out: BufWriter<Box<dyn Write>>,
    /// Named in errors: a file path, or "stdout".
    name: String,
}

impl JsonlSink {
    pub fn new(out: Box<dyn Write>, name: String) -> Self {
        JsonlSink {
            out: BufWriter::new(out),
            name,
        }
    }

    fn io_error(&self, source: std::io::Error) -> ExportError {
        ExportError::Write {
            path: self.name.clone(),
            source,
        }
    }
}

impl RowSink for JsonlSink {
    fn write(&mut self, rows: Vec<Row>) -> Result<(), ExportError> {
        for row in &rows {
            serde_json::to_writer(&mut self.out, row).map_err(|e| {
                // A broken pipe is a write failure, not a row that cannot be encoded.
                if e.is_io() {
                    self.io_error(e.into())
                } else {
                    ExportError::Json(e)
                }
            })?;
            self.out.write_all(b"\n").map_err(|e| self.io_error(e))?;
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<(), ExportError> {
        self.out.flush().map_err(|e| self.io_error(e))
    }
}
