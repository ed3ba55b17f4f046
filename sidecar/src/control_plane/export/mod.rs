//! `clawback-sidecar export`: a tenant's completed trajectories as training rows, one row per
//! trainable step ([`row::Row`]), written as JSONL or Parquet for TRL/verl-style trainers. The
//! format and the reward rule are documented in `sidecar/EXPORT.md`.
//!
//! The walk reads the store the sidecar records into, through the [`Store`] trait only: first the
//! tenant's trajectory headers page by page (cheap, and it gives the progress bar its length),
//! then each completed trajectory whole. Open and abandoned trajectories are skipped and counted:
//! an open one may still grow, an abandoned one was never meant to be trained on alone.

mod jsonl;
mod parquet;
pub mod row;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use clawback_datapool::{
    LocalStore, RedisConfig, RedisStore, Store, TenantId, TrajectoryId, TrajectoryStatus, UnixMs,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use self::row::Row;
use crate::data_plane::store::Location;

/// How many trajectory headers one store call lists.
const PAGE: usize = 500;

/// The file formats of an export.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One JSON object per line; JSON-valued columns stay nested JSON.
    Jsonl,
    /// Apache Parquet (snappy); JSON-valued columns are JSON strings.
    Parquet,
}

/// What to export and where.
#[derive(Clone, Debug)]
pub struct Options {
    pub tenant: TenantId,
    pub format: Format,
    /// The output file; `None` writes JSONL to stdout (Parquet needs a file).
    pub out: Option<PathBuf>,
    /// Only trajectories completed at or after this time.
    pub since: Option<UnixMs>,
    /// At most this many trajectories (the oldest first).
    pub limit: Option<usize>,
}

/// What an export wrote and what it left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub trajectories: usize,
    pub steps: usize,
    pub skipped_abandoned: usize,
    pub skipped_open: usize,
    /// Steps recorded but marked not-for-training (side turns).
    pub skipped_side_turns: usize,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exported {} trajectories, {} steps; skipped {} abandoned, {} open trajectories, \
             {} side turns",
            self.trajectories,
            self.steps,
            self.skipped_abandoned,
            self.skipped_open,
            self.skipped_side_turns
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("no datapool at {}: nothing was recorded there (check --data-dir)", .0.display())]
    NoDatapool(PathBuf),
    #[error("reading the datapool failed: {0}")]
    Store(#[from] clawback_datapool::Error),
    #[error("--format parquet needs --out FILE: Parquet is not streamed to stdout")]
    ParquetNeedsFile,
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot encode a row as JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot write Parquet: {0}")]
    Parquet(#[from] ::parquet::errors::ParquetError),
    #[error("cannot build the Arrow batch: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error("token id {0} does not fit the int32 column")]
    TokenIdOutOfRange(u32),
}

/// Where rows go: one implementation per [`Format`].
trait RowSink {
    fn write(&mut self, rows: Vec<Row>) -> Result<(), ExportError>;
    /// Flushes and closes the output; a Parquet file is unreadable without its footer.
    fn finish(self: Box<Self>) -> Result<(), ExportError>;
}

/// Parses `--since`: an RFC 3339 time (`2026-11-29T08:00:00Z`) or a duration back from now
/// (`24h`, `7days`).
pub fn parse_since(s: &str) -> Result<UnixMs, String> {
    if let Ok(at) = humantime::parse_rfc3339_weak(s) {
        let ms = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_err(|_| format!("{s} is before 1970"))?
            .as_millis();
        return Ok(UnixMs(u64::try_from(ms).unwrap_or(u64::MAX)));
    }
    match humantime::parse_duration(s) {
        Ok(ago) => Ok(UnixMs::now().saturating_sub(ago)),
        Err(_) => Err(format!(
            "{s:?} is neither an RFC 3339 time (2026-11-29T08:00:00Z) nor a duration (24h)"
        )),
    }
}

/// Opens the datapool at `config`, for reading. Not [`crate::data_plane::store::open`]: that one wraps
/// Redis in the spool and starts replaying it, which is the serving sidecar's job — a second
/// replayer beside it would write the backlog twice. An export reads what reached the store, and
/// a missing embedded store is an error rather than a new, empty one.
pub async fn open_store(config: Location<'_>) -> Result<Arc<dyn Store>, ExportError> {
    match config.redis {
        Some(url) => Ok(Arc::new(
            RedisStore::connect(&RedisConfig::single(url.to_owned())).await?,
        )),
        None => {
            let path = config.data_dir.join(crate::data_plane::store::LOCAL_FILE);
            if !path.is_file() {
                return Err(ExportError::NoDatapool(path));
            }
            Ok(Arc::new(LocalStore::open(path)?))
        }
    }
}

/// Exports `options.tenant`'s completed trajectories from `store`. A file output is written
/// beside its name and renamed when complete: a failed export never leaves a file that looks
/// whole (a truncated JSONL would read as a smaller data set).
pub async fn run(store: &dyn Store, options: &Options) -> Result<Summary, ExportError> {
    let partial = options.out.as_ref().map(|out| {
        let mut name = out.clone().into_os_string();
        name.push(".partial");
        PathBuf::from(name)
    });
    let result = write_rows(store, options, partial.as_deref()).await;
    if let (Some(partial), Some(out)) = (&partial, &options.out) {
        match &result {
            Ok(_) => std::fs::rename(partial, out).map_err(|source| ExportError::Write {
                path: out.display().to_string(),
                source,
            })?,
            // Best effort: the error being reported matters more than a leftover file.
            Err(_) => {
                let _ = std::fs::remove_file(partial);
            }
        }
    }
    result
}

/// The export as JSONL in memory, for the admin API's `GET /tenants/{tenant}/export` (bounded
/// by `options.limit`): the same rows as the JSONL file. Nothing that is not `Send` is held
/// across the store's awaits, so the future can run on the server's threads.
pub async fn to_jsonl(
    store: &dyn Store,
    options: &Options,
) -> Result<(Vec<u8>, Summary), ExportError> {
    let mut out = Vec::new();
    let summary = walk(store, options, &ProgressBar::hidden(), |rows| {
        for row in &rows {
            serde_json::to_writer(&mut out, row).map_err(ExportError::Json)?;
            out.push(b'\n');
        }
        Ok(())
    })
    .await?;
    Ok((out, summary))
}

async fn write_rows(
    store: &dyn Store,
    options: &Options,
    file: Option<&Path>,
) -> Result<Summary, ExportError> {
    let mut sink = open_sink(options.format, file)?;
    let progress = progress_bar(0);
    let summary = walk(store, options, &progress, |rows| sink.write(rows)).await?;
    sink.finish()?;
    progress.finish_and_clear();
    Ok(summary)
}

/// Hands `emit` the rows of every completed trajectory to export, oldest first.
async fn walk(
    store: &dyn Store,
    options: &Options,
    progress: &ProgressBar,
    mut emit: impl FnMut(Vec<Row>) -> Result<(), ExportError>,
) -> Result<Summary, ExportError> {
    let mut summary = Summary::default();
    let ids = completed_ids(store, options, &mut summary).await?;
    progress.set_length(ids.len() as u64);
    for id in &ids {
        // Gone between the two passes (trimmed by a cap): nothing to export.
        if let Some(record) = store.trajectory(&options.tenant, id).await? {
            let (rows, side_turns) = row::rows(&record);
            summary.trajectories += 1;
            summary.steps += rows.len();
            summary.skipped_side_turns += side_turns;
            emit(rows)?;
        }
        progress.inc(1);
    }
    Ok(summary)
}

/// The ids to export, oldest first, counting the trajectories skipped for their status.
async fn completed_ids(
    store: &dyn Store,
    options: &Options,
    summary: &mut Summary,
) -> Result<Vec<TrajectoryId>, ExportError> {
    let limit = options.limit.unwrap_or(usize::MAX);
    let mut ids = Vec::new();
    let mut after = None;
    while ids.len() < limit {
        let page = store
            .list_trajectories(&options.tenant, after.as_ref(), PAGE)
            .await?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        for header in &page {
            if ids.len() >= limit {
                break;
            }
            // Completion time, not creation: an export "since the last one" must not miss a
            // trajectory that started before it and completed after. Open ones go by creation.
            let at = header.completed_at.unwrap_or(header.created_at);
            if options.since.is_some_and(|since| at < since) {
                continue;
            }
            match header.status {
                TrajectoryStatus::Open => summary.skipped_open += 1,
                TrajectoryStatus::Abandoned => summary.skipped_abandoned += 1,
                TrajectoryStatus::Completed => ids.push(header.id),
            }
        }
    }
    Ok(ids)
}

fn open_sink(format: Format, file: Option<&Path>) -> Result<Box<dyn RowSink>, ExportError> {
    match (format, file) {
        (Format::Jsonl, None) => Ok(Box::new(jsonl::JsonlSink::new(
            Box::new(std::io::stdout().lock()),
            "stdout".to_owned(),
        ))),
        (Format::Jsonl, Some(path)) => Ok(Box::new(jsonl::JsonlSink::new(
            Box::new(create(path)?),
            path.display().to_string(),
        ))),
        (Format::Parquet, None) => Err(ExportError::ParquetNeedsFile),
        (Format::Parquet, Some(path)) => Ok(Box::new(parquet::ParquetSink::new(create(path)?)?)),
    }
}

fn create(path: &Path) -> Result<std::fs::File, ExportError> {
    std::fs::File::create(path).map_err(|source| ExportError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// A bar on stderr, drawn only when stderr is a terminal: logs and CI output stay clean.
fn progress_bar(len: usize) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len as u64), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} trajectories ({eta} left)",
    ) {
        bar.set_style(style);
    }
    bar
}
