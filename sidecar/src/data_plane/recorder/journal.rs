//! The recorder's journal: every write a served call makes is appended here — one line of JSON
//! per record, in the page cache before [`Journal::append`] returns, so before the agent sees
//! the end of its answer — and applied to the datapool from here by the writer.
//!
//! The writer usually gets each record from its queue, already parsed; the file is what makes it
//! durable. A record the queue had no room for is only in the file, and so is everything a killed
//! process left behind: the writer applies records in file order, reading whatever it did not get
//! through the queue (a gap before the record it holds, or the tail) back from the file. How far
//! it got is kept beside the journal ([`Journal::checkpoint`]); after a crash, whatever follows
//! the checkpoint is applied again. The datapool's writes are idempotent (step and evaluation ids,
//! upserts, completions that happen once), so a record applied twice lands once.
//!
//! Each process takes a journal of its own: the first free slot `journal/recorder-{n}.log` it can
//! lock in `data_dir`. Replicas that share a `data_dir` get different slots, and a replica
//! restarted after a crash takes over a slot whose owner is gone, finishing its work first.
//!
//! When everything in the file has been applied and it has grown past [`ROTATE_BYTES`], the
//! writer empties it and starts a new epoch: positions from the old one are known to be applied.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use clawback_datapool::WriteOp;
use serde::{Deserialize, Serialize};

/// How many journal slots a `data_dir` offers (replicas sharing it, at most).
const SLOTS: usize = 64;

/// An applied journal is emptied once it is this large.
pub const ROTATE_BYTES: u64 = 16 << 20;

/// Where a record lies in the journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// Bumped each time the file is emptied.
    pub epoch: u64,
    pub start: u64,
    pub end: u64,
}

impl Position {
    /// The record's bytes in the journal.
    pub fn bytes(&self) -> u64 {
        self.end - self.start
    }
}

/// One line of the journal: the writes of one call (or of one handshake, feedback, sweep).
#[derive(Debug, Serialize, Deserialize)]
pub struct Record {
    pub ops: Vec<WriteOp>,
}

#[derive(Debug, thiserror::Error)]
#[error("the recorder's journal {path}: {source}")]
pub struct JournalError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

struct Tail {
    file: File,
    epoch: u64,
    /// Bytes in the file: where the next record starts.
    end: u64,
}

pub struct Journal {
    path: PathBuf,
    tail: Mutex<Tail>,
    /// The same open file, for reading back without the tail's lock: bytes before the tail's
    /// end never change while they are read (only the writer, which reads, empties the file).
    reader: File,
    /// How far the writer has applied, persisted as 8 bytes.
    checkpoint: File,
    /// Held for the life of the process: the slot is ours.
    _lock: File,
    fsync: bool,
    /// Where the writer starts: the checkpoint found at open.
    recovered_from: u64,
    /// The bytes after it then.
    left_at_open: u64,
}

impl Journal {
    /// Takes the first free journal slot in `data_dir` (left by a process that is gone, or
    /// new). With `fsync`, each append also reaches the disk before it returns.
    pub fn open(data_dir: &Path, fsync: bool) -> Result<Self, JournalError> {
        let dir = data_dir.join("journal");
        let fail = |path: &Path| {
            let path = path.to_path_buf();
            move |source| JournalError { path, source }
        };
        // It holds conversations: the owner's alone, whatever the process umask says.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(fail(&dir))?;
        for slot in 0..SLOTS {
            let lock_path = dir.join(format!("recorder-{slot}.lock"));
            let lock = OpenOptions::new()
                .create(true)
                .mode(0o600)
                .truncate(false)
                .write(true)
                .open(&lock_path)
                .map_err(fail(&lock_path))?;
            match lock.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => continue,
                Err(std::fs::TryLockError::Error(e)) => return Err(fail(&lock_path)(e)),
            }
            let path = dir.join(format!("recorder-{slot}.log"));
            return Self::take(path, lock, fsync);
        }
        Err(fail(&dir)(std::io::Error::other(format!(
            "all {SLOTS} journal slots are held by running processes"
        ))))
    }

    fn take(path: PathBuf, lock: File, fsync: bool) -> Result<Self, JournalError> {
        let fail = |source| JournalError {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .create(true)
            .mode(0o600)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(fail)?;
        // A record cut off by a crash (a machine's, or a full disk) never reached the agent as
        // written: drop the partial line so the next record starts on a line of its own.
        let end = complete_length(&mut file).map_err(fail)?;
        file.set_len(end).map_err(fail)?;
        file.seek(SeekFrom::End(0)).map_err(fail)?;
        let checkpoint_path = path.with_extension("applied");
        let checkpoint = OpenOptions::new()
            .create(true)
            .mode(0o600)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&checkpoint_path)
            .map_err(|source| JournalError {
                path: checkpoint_path.clone(),
                source,
            })?;
        let mut applied = [0u8; 8];
        let read = checkpoint.read_at(&mut applied, 0).unwrap_or(0);
        let applied = if read == 8 {
            u64::from_le_bytes(applied).min(end)
        } else {
            0
        };
        let reader = file.try_clone().map_err(fail)?;
        let journal = Journal {
            path,
            reader,
            tail: Mutex::new(Tail {
                file,
                epoch: 0,
                end,
            }),
            checkpoint,
            _lock: lock,
            fsync,
            recovered_from: applied,
            left_at_open: end - applied,
        };
        journal.checkpoint(applied)?;
        Ok(journal)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn tail(&self) -> MutexGuard<'_, Tail> {
        self.tail.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fail(&self, source: std::io::Error) -> JournalError {
        JournalError {
            path: self.path.clone(),
            source,
        }
    }

    /// A blocking-pool task that did the journal's I/O and did not finish (a panic, shutdown).
    pub fn failed_task(&self, e: tokio::task::JoinError) -> JournalError {
        self.fail(std::io::Error::other(e))
    }

    /// Where the writer starts: what was applied before this process took the journal. What
    /// lies between it and [`Journal::end`] is a predecessor's unfinished work.
    pub fn recovered_from(&self) -> Position {
        Position {
            epoch: 0,
            start: self.recovered_from,
            end: self.recovered_from,
        }
    }

    /// Bytes a predecessor left unapplied: what lay after the checkpoint when this process took
    /// the journal.
    pub fn left_at_open(&self) -> u64 {
        self.left_at_open
    }

    /// The journal's end now.
    pub fn end(&self) -> Position {
        let tail = self.tail();
        Position {
            epoch: tail.epoch,
            start: tail.end,
            end: tail.end,
        }
    }

    /// Appends one record: it is in the page cache (with `fsync`, on disk) when this returns.
    /// With `fsync` the wait for the disk is announced to the runtime, whose other tasks move
    /// to another worker meanwhile; a write to the page cache does not wait.
    pub fn append(&self, ops: &[WriteOp]) -> Result<Position, JournalError> {
        let line = encode(ops).map_err(|e| self.fail(e.into()))?;
        match self.fsync && on_a_multi_thread_runtime() {
            true => tokio::task::block_in_place(|| self.append_line(&line)),
            false => self.append_line(&line),
        }
    }

    fn append_line(&self, line: &[u8]) -> Result<Position, JournalError> {
        let mut tail = self.tail();
        let start = tail.end;
        // One write per record: a reader never sees half of one, and a failed write leaves the
        // file as it was (a short write is undone below).
        if let Err(e) = tail.file.write_all(line) {
            let _ = tail.file.set_len(start);
            let _ = tail.file.seek(SeekFrom::Start(start));
            return Err(self.fail(e));
        }
        if self.fsync {
            tail.file.sync_data().map_err(|e| self.fail(e))?;
        }
        tail.end = start + line.len() as u64;
        Ok(Position {
            epoch: tail.epoch,
            start,
            end: tail.end,
        })
    }

    /// The records of `epoch` from `from` on (the writer's gap), in order: those in the next
    /// `max_bytes` up to `to` (at least one record, however long), and where they end. `None`
    /// when the journal has moved to another epoch (everything of `epoch` was applied).
    pub fn read(
        &self,
        epoch: u64,
        from: u64,
        to: u64,
        max_bytes: u64,
    ) -> Result<Option<(Vec<Record>, u64)>, JournalError> {
        // The lock only for where the tail is: appends go on while the bytes are read.
        let to = {
            let tail = self.tail();
            if tail.epoch != epoch {
                return Ok(None);
            }
            to.min(tail.end)
        };
        if to <= from {
            return Ok(Some((Vec::new(), from)));
        }
        let read = |len: u64| -> Result<Vec<u8>, JournalError> {
            let mut bytes = vec![0u8; len as usize];
            self.reader
                .read_exact_at(&mut bytes, from)
                .map_err(|e| self.fail(e))?;
            Ok(bytes)
        };
        // Whole lines only; a record longer than `max_bytes` is read whole, by doubling reads.
        let mut len = (to - from).min(max_bytes.max(1));
        let mut bytes = read(len)?;
        loop {
            match bytes.iter().rposition(|&b| b == b'\n') {
                Some(last) => {
                    bytes.truncate(last + 1);
                    break;
                }
                None if len == to - from => break,
                None => {
                    len = len.saturating_mul(2).min(to - from);
                    bytes = read(len)?;
                }
            }
        }
        let reached = from + bytes.len() as u64;
        let mut records = Vec::new();
        for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            match serde_json::from_slice::<Record>(line) {
                Ok(record) => records.push(record),
                // Written by this process or a predecessor of the same build: cannot happen
                // short of disk corruption; skipping keeps the rest.
                Err(e) => tracing::error!(error = %e, "skipping an unreadable journal record"),
            }
        }
        Ok(Some((records, reached)))
    }

    /// Persists that everything before `applied` is in the datapool.
    pub fn checkpoint(&self, applied: u64) -> Result<(), JournalError> {
        self.checkpoint
            .write_all_at(&applied.to_le_bytes(), 0)
            .map_err(|e| self.fail(e))?;
        if self.fsync {
            self.checkpoint.sync_data().map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    /// Empties the journal when everything in it was applied (`applied` is its end) and it is
    /// larger than [`ROTATE_BYTES`]; the new epoch, if it did.
    pub fn rotate_if_applied(&self, epoch: u64, applied: u64) -> Result<Option<u64>, JournalError> {
        let mut tail = self.tail();
        if tail.epoch != epoch || tail.end != applied || tail.end < ROTATE_BYTES {
            return Ok(None);
        }
        tail.file.set_len(0).map_err(|e| self.fail(e))?;
        tail.file
            .seek(SeekFrom::Start(0))
            .map_err(|e| self.fail(e))?;
        tail.end = 0;
        tail.epoch += 1;
        // The file first, then the checkpoint: a crash in between leaves a checkpoint past the
        // end, which `open` clamps.
        self.checkpoint(0)?;
        Ok(Some(tail.epoch))
    }
}

/// Whether this thread is a worker of a multi-thread tokio runtime (where a blocking section can
/// hand its other tasks on).
fn on_a_multi_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// One record's line, as [`Journal::append`] writes it: the record as JSON and a newline.
pub fn encode(ops: &[WriteOp]) -> serde_json::Result<Vec<u8>> {
    #[derive(Serialize)]
    struct RecordRef<'a> {
        ops: &'a [WriteOp],
    }
    // Sized for a typical record (a step with its tokens and logprobs): no regrowth.
    let mut line = Vec::with_capacity(32 << 10);
    serde_json::to_writer(&mut line, &RecordRef { ops })?;
    line.push(b'\n');
    Ok(line)
}

/// The length of the file's complete lines (a cut-off last line excluded).
fn complete_length(file: &mut File) -> std::io::Result<u64> {
    file.seek(SeekFrom::Start(0))?;
    let mut reader = BufReader::new(&mut *file);
    let mut complete = 0u64;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 || line.last() != Some(&b'\n') {
            break;
        }
        complete += n as u64;
    }
    Ok(complete)
}

#[cfg(test)]
mod tests {
    use clawback_datapool::{NextState, StepId, TenantId, TrajectoryId, UnixMs};

    use super::*;

    fn op(n: u64) -> WriteOp {
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

    fn numbers(records: &[Record]) -> Vec<u64> {
        records
            .iter()
            .flat_map(|r| &r.ops)
            .map(|op| match op {
                WriteOp::SetNextState { next_state, .. } => {
                    next_state.messages[0].as_u64().unwrap()
                }
                _ => unreachable!(),
            })
            .collect()
    }

    #[test]
    fn the_journal_is_its_owners_alone_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path(), false).unwrap();
        journal.append(&[op(1)]).unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let folder = dir.path().join("journal");
        assert_eq!(mode(&folder), 0o700);
        let files: Vec<_> = std::fs::read_dir(&folder)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect();
        assert_eq!(files.len(), 3, "{files:?}");
        for file in files {
            assert_eq!(mode(&file), 0o600, "{}", file.display());
        }
    }

    #[test]
    fn records_read_back_in_order_and_a_restart_resumes_after_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path(), false).unwrap();
        assert_eq!(journal.left_at_open(), 0);
        let positions: Vec<Position> = (0..4).map(|n| journal.append(&[op(n)]).unwrap()).collect();
        assert_eq!(positions[0].start, 0);
        assert_eq!(positions[1].start, positions[0].end);
        let all = journal
            .read(0, 0, journal.end().end, u64::MAX)
            .unwrap()
            .unwrap()
            .0;
        assert_eq!(numbers(&all), [0, 1, 2, 3]);
        journal.checkpoint(positions[1].end).unwrap();
        drop(journal);

        // The next process finds the slot free and resumes after what was applied.
        let journal = Journal::open(dir.path(), false).unwrap();
        let from = journal.recovered_from();
        assert_eq!(from.start, positions[1].end);
        assert_eq!(journal.left_at_open(), positions[3].end - positions[1].end);
        let left = journal
            .read(0, from.start, journal.end().end, u64::MAX)
            .unwrap()
            .unwrap()
            .0;
        assert_eq!(numbers(&left), [2, 3]);
    }

    #[test]
    fn a_bounded_read_returns_whole_records_and_where_they_end() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path(), false).unwrap();
        let positions: Vec<Position> = (0..4).map(|n| journal.append(&[op(n)]).unwrap()).collect();
        let end = journal.end().end;
        // Room for one record and a half: one comes back.
        let (first, reached) = journal
            .read(0, 0, end, positions[0].bytes() * 3 / 2)
            .unwrap()
            .unwrap();
        assert_eq!((numbers(&first), reached), (vec![0], positions[0].end));
        // Less than one record: that record, whole.
        let (next, reached) = journal.read(0, reached, end, 1).unwrap().unwrap();
        assert_eq!((numbers(&next), reached), (vec![1], positions[1].end));
        let (rest, reached) = journal.read(0, reached, end, u64::MAX).unwrap().unwrap();
        assert_eq!((numbers(&rest), reached), (vec![2, 3], end));
    }

    #[test]
    fn two_processes_sharing_a_data_dir_take_different_slots() {
        let dir = tempfile::tempdir().unwrap();
        let a = Journal::open(dir.path(), false).unwrap();
        let b = Journal::open(dir.path(), false).unwrap();
        assert_ne!(a.path(), b.path());
    }

    #[test]
    fn a_record_cut_off_by_a_crash_is_dropped_and_the_journal_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path(), false).unwrap();
        journal.append(&[op(0)]).unwrap();
        let path = journal.path().to_path_buf();
        drop(journal);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"{\"ops\":[{\"op\":\"append_ev").unwrap();
        let journal = Journal::open(dir.path(), false).unwrap();
        journal.append(&[op(1)]).unwrap();
        let all = journal
            .read(0, 0, journal.end().end, u64::MAX)
            .unwrap()
            .unwrap()
            .0;
        assert_eq!(numbers(&all), [0, 1]);
    }

    #[test]
    fn an_applied_journal_past_its_size_is_emptied_into_a_new_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path(), false).unwrap();
        let big = WriteOp::AppendEvaluations {
            evaluations: Vec::new(),
        };
        let mut end = 0;
        while end < ROTATE_BYTES {
            let ops: Vec<WriteOp> = (0..2000).map(|_| big.clone()).collect();
            end = journal.append(&ops).unwrap().end;
        }
        assert_eq!(journal.rotate_if_applied(0, end - 1).unwrap(), None);
        assert_eq!(journal.rotate_if_applied(0, end).unwrap(), Some(1));
        assert_eq!(journal.end().end, 0);
        assert!(journal.read(0, 0, end, u64::MAX).unwrap().is_none());
        let at = journal.append(&[op(7)]).unwrap();
        assert_eq!((at.epoch, at.start), (1, 0));
    }
}
