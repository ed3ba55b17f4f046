//! Where the recorder's writes go when its queue is full, instead of being dropped: a journal
//! file (`recorder-overflow.jsonl` in `data_dir`, one [`WriteOp`] per line) that the writer
//! drains, in order, as soon as its queue is empty.
//!
//! Order is what the datapool needs (a trajectory before its steps, a step before its next
//! state), so once one write has spilled every later one spills too, until the writer has taken
//! the journal whole: the queue's writes are all older than the journal's, and the journal's
//! older than whatever is queued after it was taken. A write reaches the page cache before
//! `spill` returns, so a killed process loses none of it: on start, a journal left behind is
//! replayed before anything newer is written.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use clawback_datapool::WriteOp;

pub const FILE_NAME: &str = "recorder-overflow.jsonl";

#[derive(Debug)]
pub struct Overflow {
    path: PathBuf,
    /// Writes are going to the journal (it holds some the writer has not taken).
    spilling: AtomicBool,
    /// The journal, open for appending while spilling.
    file: Mutex<Option<File>>,
}

#[derive(Debug, thiserror::Error)]
#[error("the recorder's overflow journal {path}: {source}")]
pub struct OverflowError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

impl Overflow {
    /// The journal in `dir`; one left by an earlier process is spilling until it is drained.
    pub fn open(dir: &Path) -> Result<Self, OverflowError> {
        let path = dir.join(FILE_NAME);
        let fail = |source| OverflowError {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(fail)?;
        let left_behind = std::fs::metadata(&path).is_ok_and(|m| m.len() > 0);
        Ok(Self {
            spilling: AtomicBool::new(left_behind),
            file: Mutex::new(None),
            path,
        })
    }

    /// Whether writes must go to the journal to stay in order.
    pub fn is_spilling(&self) -> bool {
        self.spilling.load(Ordering::Acquire)
    }

    /// Appends `op` to the journal; from now on writes spill until the writer drains it.
    pub fn spill(&self, op: &WriteOp) -> Result<(), OverflowError> {
        let fail = |source| OverflowError {
            path: self.path.clone(),
            source,
        };
        let mut line = serde_json::to_vec(op).map_err(|e| fail(e.into()))?;
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        if file.is_none() {
            *file = Some(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.path)
                    .map_err(fail)?,
            );
        }
        if let Some(file) = file.as_mut() {
            // One write per line: a reader never sees half of one (lines are far below the
            // size an append can interleave at, and the lock keeps them whole anyway).
            file.write_all(&line).map_err(fail)?;
        }
        self.spilling.store(true, Ordering::Release);
        Ok(())
    }

    /// Takes every spilled write, in order, and empties the journal; writes go to the queue
    /// again from here. A line that cannot be read (a process killed mid-line) is skipped and
    /// counted.
    pub fn drain(&self) -> Result<(Vec<WriteOp>, usize), OverflowError> {
        let fail = |source| OverflowError {
            path: self.path.clone(),
            source,
        };
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let mut ops = Vec::new();
        let mut unreadable = 0;
        match File::open(&self.path) {
            Ok(journal) => {
                for line in BufReader::new(journal).lines() {
                    let line = line.map_err(fail)?;
                    if line.trim().is_empty() {
                        continue;
                    }
                    match serde_json::from_str::<WriteOp>(&line) {
                        Ok(op) => ops.push(op),
                        Err(_) => unreadable += 1,
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail(e)),
        }
        *file = None;
        File::create(&self.path).map_err(fail)?;
        self.spilling.store(false, Ordering::Release);
        Ok((ops, unreadable))
    }
}

#[cfg(test)]
mod tests {
    use clawback_datapool::{NextState, StepId, TenantId, TrajectoryId, UnixMs, WriteOp};

    use super::*;

    fn op(n: usize) -> WriteOp {
        WriteOp::SetNextState {
            tenant: TenantId::new("t").unwrap(),
            trajectory: TrajectoryId::new(),
            step: StepId::new(),
            next_state: NextState {
                messages: vec![serde_json::json!(n)],
                observed_at: UnixMs::now(),
            },
        }
    }

    fn number(op: &WriteOp) -> u64 {
        match op {
            WriteOp::SetNextState { next_state, .. } => next_state.messages[0].as_u64().unwrap(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn spilled_writes_come_back_in_order_and_a_journal_left_behind_spills_on_start() {
        let dir = tempfile::tempdir().unwrap();
        let overflow = Overflow::open(dir.path()).unwrap();
        assert!(!overflow.is_spilling());
        for n in 0..3 {
            overflow.spill(&op(n)).unwrap();
        }
        assert!(overflow.is_spilling());
        // A restart finds the journal and keeps order by spilling.
        let reopened = Overflow::open(dir.path()).unwrap();
        assert!(reopened.is_spilling());
        let (ops, unreadable) = reopened.drain().unwrap();
        assert_eq!(ops.iter().map(number).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(unreadable, 0);
        assert!(!reopened.is_spilling());
        assert!(reopened.drain().unwrap().0.is_empty());
    }

    #[test]
    fn a_line_cut_off_by_a_kill_is_skipped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let overflow = Overflow::open(dir.path()).unwrap();
        overflow.spill(&op(0)).unwrap();
        let mut file = OpenOptions::new()
            .append(true)
            .open(dir.path().join(FILE_NAME))
            .unwrap();
        file.write_all(b"{\"op\":\"append_ev").unwrap();
        let (ops, unreadable) = overflow.drain().unwrap();
        assert_eq!((ops.len(), unreadable), (1, 1));
    }
}
