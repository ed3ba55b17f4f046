//! [`LocalSessions`]: [`Sessions`] in SQLite — in a file that every sidecar replica on one
//! machine opens (the embedded default), or in memory (one process's own state, the fallback
//! while a shared store is unreachable).
//!
//! Session state is small and touched twice per call, so it has a file of its own: its
//! transactions never queue behind the datapool's batch writes for SQLite's one write lock.
//! Every operation is one `BEGIN IMMEDIATE` transaction, so replicas in several processes take
//! turns and see each other's state whole.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use tokio::sync::Mutex;

use crate::codec::parse_stored;
use crate::error::Result;
use crate::ids::{StepId, TenantId, TrajectoryId, UnixMs};
use crate::schema::CompletionReason;
use crate::sessions::{
    digest_hex, hash_hex, Anchor, Finish, Finishing, Join, Joined, KeyedSession, Matched, Previous,
    Sessions, StepDone, StepSlot, Timing, SESSION_KEY_TTL,
};

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS live (
    tenant TEXT NOT NULL, id TEXT NOT NULL,
    next_index INTEGER NOT NULL DEFAULT 0, last_step TEXT, covered INTEGER NOT NULL DEFAULT 0,
    evaluation_only INTEGER NOT NULL DEFAULT 0, finish_after TEXT, seen INTEGER NOT NULL,
    PRIMARY KEY (tenant, id));
CREATE INDEX IF NOT EXISTS live_by_seen ON live (tenant, seen);
CREATE TABLE IF NOT EXISTS live_calls (
    tenant TEXT NOT NULL, trajectory TEXT NOT NULL, step TEXT NOT NULL, started INTEGER NOT NULL,
    PRIMARY KEY (tenant, trajectory, step));
CREATE TABLE IF NOT EXISTS live_unanswered (
    tenant TEXT NOT NULL, trajectory TEXT NOT NULL, step TEXT NOT NULL, idx INTEGER NOT NULL,
    PRIMARY KEY (tenant, trajectory, step));
CREATE TABLE IF NOT EXISTS live_names (
    tenant TEXT NOT NULL, name TEXT NOT NULL, trajectory TEXT NOT NULL,
    PRIMARY KEY (tenant, name));
CREATE INDEX IF NOT EXISTS live_names_of ON live_names (tenant, trajectory);
CREATE TABLE IF NOT EXISTS stitch_keys (
    tenant TEXT NOT NULL, key TEXT NOT NULL, holder TEXT, holders INTEGER NOT NULL,
    context_rebuilt INTEGER NOT NULL,
    PRIMARY KEY (tenant, key));
CREATE TABLE IF NOT EXISTS finished (
    tenant TEXT NOT NULL, id TEXT NOT NULL, reason TEXT NOT NULL, steps INTEGER NOT NULL,
    last_step TEXT, at INTEGER NOT NULL,
    PRIMARY KEY (tenant, id));
CREATE INDEX IF NOT EXISTS finished_by_age ON finished (at);
CREATE TABLE IF NOT EXISTS completing (
    tenant TEXT NOT NULL, id TEXT NOT NULL, reason TEXT NOT NULL, steps INTEGER NOT NULL,
    due INTEGER NOT NULL,
    PRIMARY KEY (tenant, id));
CREATE INDEX IF NOT EXISTS completing_by_due ON completing (tenant, due);
CREATE TABLE IF NOT EXISTS session_keys (
    digest TEXT PRIMARY KEY, tenant TEXT NOT NULL, trajectory TEXT NOT NULL,
    expires INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS live_keys (
    tenant TEXT NOT NULL, trajectory TEXT NOT NULL, key TEXT NOT NULL,
    PRIMARY KEY (tenant, trajectory, key));
"#;

/// Session state in SQLite; see the module docs.
#[derive(Clone)]
pub struct LocalSessions {
    conn: Arc<Mutex<Connection>>,
}

impl LocalSessions {
    /// The session state in the file at `path`, shared with every process that opens it.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        crate::local_store::create_private(path.as_ref());
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // Session state is rebuilt by the calls that follow a crash: no fsync per transaction.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.set_prepared_statement_cache_capacity(64);
        conn.busy_timeout(Duration::from_secs(10))?;
        Self::with_connection(conn)
    }

    /// Session state of this process only.
    pub fn in_memory() -> Result<Self> {
        Self::with_connection(Connection::open_in_memory()?)
    }

    fn with_connection(conn: Connection) -> Result<Self> {
        conn.execute_batch(SCHEMA)?;
        Ok(LocalSessions {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `f` in an immediate transaction on the blocking pool, and commits what it returns.
    async fn transaction<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T> + Send + 'static,
    {
        // The connection first, then a blocking thread (as `LocalStore::with`).
        let mut conn = Arc::clone(&self.conn).lock_owned().await;
        tokio::task::spawn_blocking(move || {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        })
        .await?
    }
}

/// A live trajectory's row.
struct LiveRow {
    next_index: u32,
    last_step: Option<String>,
    covered: u32,
    evaluation_only: bool,
    finish_after: Option<String>,
    seen: u64,
}

fn live_row(tx: &Transaction<'_>, tenant: &str, id: &str) -> Result<Option<LiveRow>> {
    Ok(tx
        .prepare_cached(
            "SELECT next_index, last_step, covered, evaluation_only, finish_after, seen
             FROM live WHERE tenant = ?1 AND id = ?2",
        )?
        .query_row([tenant, id], |r| {
            Ok(LiveRow {
                next_index: r.get(0)?,
                last_step: r.get(1)?,
                covered: r.get(2)?,
                evaluation_only: r.get(3)?,
                finish_after: r.get(4)?,
                seen: r.get::<_, i64>(5)?.max(0) as u64,
            })
        })
        .optional()?)
}

/// Whether a call that is not stale is in flight on the trajectory.
fn busy(tx: &Transaction<'_>, tenant: &str, id: &str, stale_before: u64) -> Result<bool> {
    Ok(tx
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM live_calls
                            WHERE tenant = ?1 AND trajectory = ?2 AND started >= ?3)",
        )?
        .query_row(params![tenant, id, stale_before as i64], |r| r.get(0))?)
}

/// Takes the trajectory's claim on a stitching key back.
fn release_key(tx: &Transaction<'_>, tenant: &str, id: &str, key: &str) -> Result<()> {
    let row: Option<(Option<String>, i64)> = tx
        .prepare_cached("SELECT holder, holders FROM stitch_keys WHERE tenant = ?1 AND key = ?2")?
        .query_row([tenant, key], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match row {
        Some((Some(holder), _)) if holder == id => {
            tx.prepare_cached("DELETE FROM stitch_keys WHERE tenant = ?1 AND key = ?2")?
                .execute([tenant, key])?;
        }
        // Shared: it stays ambiguous while anyone holds it (which one is not kept).
        Some((None, holders)) if holders <= 1 => {
            tx.prepare_cached("DELETE FROM stitch_keys WHERE tenant = ?1 AND key = ?2")?
                .execute([tenant, key])?;
        }
        Some((None, _)) => {
            tx.prepare_cached(
                "UPDATE stitch_keys SET holders = holders - 1 WHERE tenant = ?1 AND key = ?2",
            )?
            .execute([tenant, key])?;
        }
        _ => {}
    }
    Ok(())
}

/// Claims a stitching key for the trajectory; a key another trajectory holds becomes shared.
fn hold_key(
    tx: &Transaction<'_>,
    tenant: &str,
    id: &str,
    key: &str,
    context_rebuilt: bool,
) -> Result<()> {
    let holder: Option<Option<String>> = tx
        .prepare_cached("SELECT holder FROM stitch_keys WHERE tenant = ?1 AND key = ?2")?
        .query_row([tenant, key], |r| r.get(0))
        .optional()?;
    match holder {
        None => {
            tx.prepare_cached(
                "INSERT INTO stitch_keys (tenant, key, holder, holders, context_rebuilt)
                 VALUES (?1, ?2, ?3, 1, ?4)",
            )?
            .execute(params![tenant, key, id, context_rebuilt])?;
        }
        Some(Some(holder)) if holder == id => {}
        Some(Some(_)) => {
            tx.prepare_cached(
                "UPDATE stitch_keys SET holder = NULL, holders = 2 WHERE tenant = ?1 AND key = ?2",
            )?
            .execute([tenant, key])?;
        }
        Some(None) => {
            tx.prepare_cached(
                "UPDATE stitch_keys SET holders = holders + 1 WHERE tenant = ?1 AND key = ?2",
            )?
            .execute([tenant, key])?;
        }
    }
    tx.prepare_cached(
        "INSERT OR IGNORE INTO live_keys (tenant, trajectory, key) VALUES (?1, ?2, ?3)",
    )?
    .execute([tenant, id, key])?;
    Ok(())
}

fn release_all_keys(tx: &Transaction<'_>, tenant: &str, id: &str) -> Result<()> {
    let keys: Vec<String> = {
        let mut q =
            tx.prepare_cached("SELECT key FROM live_keys WHERE tenant = ?1 AND trajectory = ?2")?;
        let rows = q.query_map([tenant, id], |r| r.get(0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for key in &keys {
        release_key(tx, tenant, id, key)?;
    }
    tx.prepare_cached("DELETE FROM live_keys WHERE tenant = ?1 AND trajectory = ?2")?
        .execute([tenant, id])?;
    Ok(())
}

/// A trajectory finished lately: reason, steps and last step.
fn finished(
    tx: &Transaction<'_>,
    tenant: &str,
    id: &str,
) -> Result<Option<(CompletionReason, u32, Option<String>)>> {
    let row: Option<(String, u32, Option<String>)> = tx
        .prepare_cached(
            "SELECT reason, steps, last_step FROM finished WHERE tenant = ?1 AND id = ?2",
        )?
        .query_row([tenant, id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    Ok(row.and_then(|(reason, steps, last)| {
        CompletionReason::parse(&reason).map(|reason| (reason, steps, last))
    }))
}

/// Removes every trace of a live trajectory; what the caller completes it with (and reports
/// written before the completion lease runs out).
fn finish_now(
    tx: &Transaction<'_>,
    tenant: &str,
    id: &str,
    row: &LiveRow,
    reason: CompletionReason,
    now: UnixMs,
    timing: Timing,
) -> Result<Finishing> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO completing (tenant, id, reason, steps, due)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        tenant,
        id,
        reason.as_str(),
        row.next_index,
        timing.completion_due(now).0 as i64
    ])?;
    tx.prepare_cached(
        "INSERT OR REPLACE INTO finished (tenant, id, reason, steps, last_step, at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        tenant,
        id,
        reason.as_str(),
        row.next_index,
        row.last_step,
        now.0 as i64
    ])?;
    release_all_keys(tx, tenant, id)?;
    tx.prepare_cached("DELETE FROM live_calls WHERE tenant = ?1 AND trajectory = ?2")?
        .execute([tenant, id])?;
    tx.prepare_cached("DELETE FROM live_unanswered WHERE tenant = ?1 AND trajectory = ?2")?
        .execute([tenant, id])?;
    tx.prepare_cached("DELETE FROM live_names WHERE tenant = ?1 AND trajectory = ?2")?
        .execute([tenant, id])?;
    tx.prepare_cached("DELETE FROM live WHERE tenant = ?1 AND id = ?2")?
        .execute([tenant, id])?;
    Ok(Finishing {
        trajectory: parse_stored("live trajectory id", id)?,
        reason,
        steps: row.next_index,
    })
}

fn stored_reason(reason: Option<&str>) -> Option<CompletionReason> {
    reason.and_then(CompletionReason::parse)
}

/// What a join's anchor found.
#[derive(Default)]
struct Found {
    /// The live trajectory it names: id and row.
    live: Option<(String, LiveRow)>,
    matched: Option<Matched>,
    ambiguous: bool,
}

impl Found {
    fn live(live: Option<(String, LiveRow)>) -> Self {
        Found {
            live,
            ..Found::default()
        }
    }
}

/// The trajectory a join's anchor names, if it is live, and the stitching match.
fn find(tx: &Transaction<'_>, join: &Join, timing: Timing) -> Result<Found> {
    let tenant = join.tenant.as_str();
    match &join.anchor {
        Anchor::New => Ok(Found::default()),
        Anchor::Name(name) => {
            let id: Option<String> = tx
                .prepare_cached(
                    "SELECT trajectory FROM live_names WHERE tenant = ?1 AND name = ?2",
                )?
                .query_row([tenant, name.as_str()], |r| r.get(0))
                .optional()?;
            let Some(id) = id else {
                return Ok(Found::default());
            };
            Ok(Found::live(live_row(tx, tenant, &id)?.map(|row| (id, row))))
        }
        Anchor::Trajectory(id) => {
            let id = id.to_string();
            Ok(Found::live(live_row(tx, tenant, &id)?.map(|row| (id, row))))
        }
        Anchor::Prefixes(prefixes) => {
            let idle_before = join.now.saturating_sub(timing.idle).0;
            // Only the longest matching prefix decides: a shorter one belongs to a history the
            // longer one already extends.
            for prefix in prefixes.iter().rev() {
                let key = hash_hex(prefix.hash);
                let found: Option<(Option<String>, bool)> = tx
                    .prepare_cached(
                        "SELECT holder, context_rebuilt FROM stitch_keys
                         WHERE tenant = ?1 AND key = ?2",
                    )?
                    .query_row([tenant, key.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?;
                match found {
                    None => continue,
                    Some((None, _)) => {
                        return Ok(Found {
                            ambiguous: true,
                            ..Found::default()
                        })
                    }
                    Some((Some(id), context_rebuilt)) => {
                        let row = live_row(tx, tenant, &id)?.filter(|row| row.seen >= idle_before);
                        let matched = Matched {
                            end: prefix.end,
                            context_rebuilt,
                        };
                        return Ok(Found {
                            live: row.map(|row| (id, row)),
                            matched: Some(matched),
                            ambiguous: false,
                        });
                    }
                }
            }
            Ok(Found::default())
        }
    }
}

#[async_trait]
impl Sessions for LocalSessions {
    async fn join(&self, join: &Join, timing: Timing) -> Result<Joined> {
        let join = join.clone();
        self.transaction(move |tx| {
            let tenant = join.tenant.as_str();
            let now = join.now.0 as i64;
            // The trajectory this join asked to open is live already: a retry of the join.
            let open = join.open.to_string();
            let Found {
                live,
                matched,
                ambiguous,
            } = match live_row(tx, tenant, &open)? {
                Some(row) => Found::live(Some((open, row))),
                None => find(tx, &join, timing)?,
            };
            let call = join.call.map(|c| c.to_string());
            if let Some((id, row)) = live {
                tx.prepare_cached("UPDATE live SET seen = ?3 WHERE tenant = ?1 AND id = ?2")?
                    .execute(params![tenant, id, now])?;
                if let Some(call) = &call {
                    tx.prepare_cached(
                        "INSERT OR REPLACE INTO live_calls (tenant, trajectory, step, started)
                         VALUES (?1, ?2, ?3, ?4)",
                    )?
                    .execute(params![tenant, id, call, now])?;
                }
                let previous = match &row.last_step {
                    Some(step) => Some(Previous {
                        step: parse_stored::<StepId>("last step id", step)?,
                        covered: row.covered,
                    }),
                    None => None,
                };
                return Ok(Joined {
                    trajectory: parse_stored("live trajectory id", &id)?,
                    // The trajectory this join asked to open: a retry whose first answer was
                    // lost, and its header is still the caller's to write.
                    opened: id == join.open.to_string(),
                    ambiguous: false,
                    previous,
                    matched,
                    evaluation_only: row.evaluation_only,
                    next_index: row.next_index,
                });
            }
            let id = join.open.to_string();
            tx.prepare_cached("INSERT INTO live (tenant, id, seen) VALUES (?1, ?2, ?3)")?
                .execute(params![tenant, id, now])?;
            if let Some(call) = &call {
                tx.prepare_cached(
                    "INSERT INTO live_calls (tenant, trajectory, step, started)
                     VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(params![tenant, id, call, now])?;
            }
            if let Anchor::Name(name) = &join.anchor {
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO live_names (tenant, name, trajectory)
                     VALUES (?1, ?2, ?3)",
                )?
                .execute(params![tenant, name, id])?;
            }
            Ok(Joined {
                ambiguous,
                ..Joined::alone(join.open)
            })
        })
        .await
    }

    async fn step_done(&self, done: &StepDone, timing: Timing) -> Result<StepSlot> {
        let done = done.clone();
        self.transaction(move |tx| {
            let tenant = done.tenant.as_str();
            let id = done.trajectory.to_string();
            let step = done.step.to_string();
            tx.prepare_cached(
                "DELETE FROM live_calls WHERE tenant = ?1 AND trajectory = ?2 AND step = ?3",
            )?
            .execute([tenant, &id, &step])?;
            let Some(mut row) = live_row(tx, tenant, &id)? else {
                // Asked again after it finished the trajectory: the same answer.
                return Ok(match finished(tx, tenant, &id)? {
                    Some((reason, steps, Some(last))) if last == step => StepSlot {
                        index: steps.checked_sub(1),
                        finishing: Some(Finishing {
                            trajectory: done.trajectory,
                            reason,
                            steps,
                        }),
                    },
                    _ => StepSlot {
                        index: None,
                        finishing: None,
                    },
                });
            };
            if row.last_step.as_deref() == Some(step.as_str()) {
                return Ok(StepSlot {
                    index: row.next_index.checked_sub(1),
                    finishing: None,
                });
            }
            let numbered: Option<u32> = tx
                .prepare_cached(
                    "SELECT idx FROM live_unanswered WHERE tenant = ?1 AND trajectory = ?2 AND step = ?3",
                )?
                .query_row([tenant, &id, &step], |r| r.get(0))
                .optional()?;
            if let Some(index) = numbered {
                // Asked again (its first answer lost): the index it was given.
                return Ok(StepSlot {
                    index: Some(index),
                    finishing: None,
                });
            }
            let index = row.next_index;
            row.next_index += 1;
            if done.answered {
                row.last_step = Some(step.clone());
                row.covered = done.covered;
            } else {
                tx.prepare_cached(
                    "INSERT INTO live_unanswered (tenant, trajectory, step, idx) VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(params![tenant, id, step, index])?;
            }
            if row.finish_after.is_none() {
                row.finish_after = done.finish.map(|r| r.as_str().to_owned());
            }
            tx.prepare_cached(
                "UPDATE live SET next_index = ?3, last_step = ?4, covered = ?5, seen = ?6,
                                 finish_after = ?7
                 WHERE tenant = ?1 AND id = ?2",
            )?
            .execute(params![
                tenant,
                id,
                row.next_index,
                row.last_step,
                row.covered,
                done.now.0 as i64,
                row.finish_after
            ])?;
            let stale_before = done.now.saturating_sub(timing.stale_call).0;
            if let Some(reason) = stored_reason(row.finish_after.as_deref()) {
                if !busy(tx, tenant, &id, stale_before)? {
                    let finishing = finish_now(tx, tenant, &id, &row, reason, done.now, timing)?;
                    return Ok(StepSlot {
                        index: Some(index),
                        finishing: Some(finishing),
                    });
                }
            }
            // The previous call's keys give way to this one's: a call that branches from an
            // older point of the conversation starts a new trajectory. An unanswered call
            // leaves them: the conversation goes on from the call before.
            if done.answered {
                release_all_keys(tx, tenant, &id)?;
                for key in &done.keys {
                    hold_key(tx, tenant, &id, &hash_hex(key.hash), key.context_rebuilt)?;
                }
            }
            Ok(StepSlot {
                index: Some(index),
                finishing: None,
            })
        })
        .await
    }

    async fn forget_call(
        &self,
        tenant: &TenantId,
        call: &StepId,
        now: UnixMs,
        timing: Timing,
    ) -> Result<Option<Finishing>> {
        let (owner, step) = (tenant.to_string(), call.to_string());
        let marked: Option<String> = self
            .transaction(move |tx| {
                Ok(tx
                    .prepare_cached(
                        "SELECT trajectory FROM live_calls WHERE tenant = ?1 AND step = ?2",
                    )?
                    .query_row([&owner, &step], |r| r.get(0))
                    .optional()?)
            })
            .await?;
        let Some(marked) = marked else {
            return Ok(None);
        };
        let trajectory = parse_stored("an in-flight call's trajectory", &marked)?;
        self.call_abandoned(tenant, &trajectory, call, now, timing)
            .await
    }

    async fn call_abandoned(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
        call: &StepId,
        now: UnixMs,
        timing: Timing,
    ) -> Result<Option<Finishing>> {
        let (tenant, id, step) = (tenant.to_string(), trajectory.to_string(), call.to_string());
        let call_trajectory = *trajectory;
        self.transaction(move |tx| {
            tx.prepare_cached(
                "DELETE FROM live_calls WHERE tenant = ?1 AND trajectory = ?2 AND step = ?3",
            )?
            .execute([&tenant, &id, &step])?;
            let Some(row) = live_row(tx, &tenant, &id)? else {
                return Ok(
                    finished(tx, &tenant, &id)?.map(|(reason, steps, _)| Finishing {
                        trajectory: call_trajectory,
                        reason,
                        steps,
                    }),
                );
            };
            tx.prepare_cached("UPDATE live SET seen = ?3 WHERE tenant = ?1 AND id = ?2")?
                .execute(params![tenant, id, now.0 as i64])?;
            let stale_before = now.saturating_sub(timing.stale_call).0;
            match stored_reason(row.finish_after.as_deref()) {
                Some(reason) if !busy(tx, &tenant, &id, stale_before)? => {
                    finish_now(tx, &tenant, &id, &row, reason, now, timing).map(Some)
                }
                _ => Ok(None),
            }
        })
        .await
    }

    async fn finish(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
        reason: CompletionReason,
        now: UnixMs,
        timing: Timing,
    ) -> Result<Finish> {
        let (tenant, id) = (tenant.to_string(), trajectory.to_string());
        self.transaction(move |tx| {
            let Some(row) = live_row(tx, &tenant, &id)? else {
                return Ok(match finished(tx, &tenant, &id)? {
                    Some((reason, steps, _)) => Finish::Now(Finishing {
                        trajectory: parse_stored("finished trajectory id", &id)?,
                        reason,
                        steps,
                    }),
                    None => Finish::NotLive,
                });
            };
            let stale_before = now.saturating_sub(timing.stale_call).0;
            if busy(tx, &tenant, &id, stale_before)? {
                if row.finish_after.is_none() {
                    tx.prepare_cached(
                        "UPDATE live SET finish_after = ?3 WHERE tenant = ?1 AND id = ?2",
                    )?
                    .execute(params![tenant, id, reason.as_str()])?;
                }
                return Ok(Finish::Deferred);
            }
            let reason = stored_reason(row.finish_after.as_deref()).unwrap_or(reason);
            finish_now(tx, &tenant, &id, &row, reason, now, timing).map(Finish::Now)
        })
        .await
    }

    async fn finish_idle(
        &self,
        tenant: &TenantId,
        now: UnixMs,
        timing: Timing,
        limit: usize,
    ) -> Result<Vec<Finishing>> {
        let tenant = tenant.to_string();
        self.transaction(move |tx| {
            let idle_before = now.saturating_sub(timing.idle).0 as i64;
            let stale_before = now.saturating_sub(timing.stale_call).0;
            let ids: Vec<String> = {
                let mut q = tx.prepare_cached(
                    "SELECT id FROM live WHERE tenant = ?1 AND seen < ?2 ORDER BY seen LIMIT ?3",
                )?;
                let rows = q.query_map(params![tenant, idle_before, limit as i64], |r| r.get(0))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            let mut finished = Vec::new();
            for id in ids {
                if busy(tx, &tenant, &id, stale_before)? {
                    continue;
                }
                if let Some(row) = live_row(tx, &tenant, &id)? {
                    let reason = stored_reason(row.finish_after.as_deref())
                        .unwrap_or(CompletionReason::IdleTimeout);
                    finished.push(finish_now(tx, &tenant, &id, &row, reason, now, timing)?);
                }
            }
            // What repeats are answered from, kept as long as Redis keeps it.
            tx.prepare_cached("DELETE FROM finished WHERE at < ?1")?
                .execute([now.saturating_sub(timing.retention()).0 as i64])?;
            Ok(finished)
        })
        .await
    }

    async fn overdue_completions(
        &self,
        tenant: &TenantId,
        now: UnixMs,
        timing: Timing,
        limit: usize,
    ) -> Result<Vec<Finishing>> {
        let tenant = tenant.to_string();
        self.transaction(move |tx| {
            let overdue: Vec<(String, String, u32)> = {
                let mut q = tx.prepare_cached(
                    "SELECT id, reason, steps FROM completing
                     WHERE tenant = ?1 AND due < ?2 ORDER BY due LIMIT ?3",
                )?;
                let rows = q.query_map(params![tenant, now.0 as i64, limit as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            let due = timing.completion_due(now).0 as i64;
            let mut handed = Vec::with_capacity(overdue.len());
            for (id, reason, steps) in overdue {
                tx.prepare_cached("UPDATE completing SET due = ?3 WHERE tenant = ?1 AND id = ?2")?
                    .execute(params![tenant, id, due])?;
                handed.push(Finishing {
                    trajectory: parse_stored("completing trajectory id", &id)?,
                    reason: CompletionReason::parse(&reason)
                        .unwrap_or(CompletionReason::IdleTimeout),
                    steps,
                });
            }
            Ok(handed)
        })
        .await
    }

    async fn completions_written(
        &self,
        tenant: &TenantId,
        trajectories: &[TrajectoryId],
    ) -> Result<()> {
        let tenant = tenant.to_string();
        let ids: Vec<String> = trajectories.iter().map(ToString::to_string).collect();
        self.transaction(move |tx| {
            let mut delete =
                tx.prepare_cached("DELETE FROM completing WHERE tenant = ?1 AND id = ?2")?;
            for id in &ids {
                delete.execute([&tenant, id])?;
            }
            Ok(())
        })
        .await
    }

    async fn is_live(&self, tenant: &TenantId, trajectory: &TrajectoryId) -> Result<bool> {
        let (tenant, id) = (tenant.to_string(), trajectory.to_string());
        self.transaction(move |tx| Ok(live_row(tx, &tenant, &id)?.is_some()))
            .await
    }

    async fn set_evaluation_only(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
    ) -> Result<bool> {
        let (tenant, id) = (tenant.to_string(), trajectory.to_string());
        self.transaction(move |tx| {
            Ok(tx
                .prepare_cached(
                    "UPDATE live SET evaluation_only = 1 WHERE tenant = ?1 AND id = ?2",
                )?
                .execute([&tenant, &id])?
                > 0)
        })
        .await
    }

    async fn put_session_key(&self, digest: &[u8; 32], session: &KeyedSession) -> Result<()> {
        let (digest, session) = (digest_hex(digest), session.clone());
        let expires = UnixMs::now().0 + SESSION_KEY_TTL.as_millis() as u64;
        self.transaction(move |tx| {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO session_keys (digest, tenant, trajectory, expires)
                 VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![
                digest,
                session.tenant.as_str(),
                session.trajectory.to_string(),
                expires as i64
            ])?;
            Ok(())
        })
        .await
    }

    async fn session_key(&self, digest: &[u8; 32]) -> Result<Option<KeyedSession>> {
        let digest = digest_hex(digest);
        let now = UnixMs::now().0;
        self.transaction(move |tx| {
            let row: Option<(String, String)> = tx
                .prepare_cached(
                    "SELECT tenant, trajectory FROM session_keys
                     WHERE digest = ?1 AND expires > ?2",
                )?
                .query_row(params![digest, now as i64], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            let Some((tenant, trajectory)) = row else {
                return Ok(None);
            };
            tx.prepare_cached("UPDATE session_keys SET expires = ?2 WHERE digest = ?1")?
                .execute(params![
                    digest,
                    (now + SESSION_KEY_TTL.as_millis() as u64) as i64
                ])?;
            Ok(Some(KeyedSession {
                tenant: TenantId::new(tenant)?,
                trajectory: parse_stored("session key trajectory", &trajectory)?,
            }))
        })
        .await
    }

    async fn live_tenants(&self) -> Result<Vec<TenantId>> {
        self.transaction(|tx| {
            let mut q =
                tx.prepare_cached("SELECT tenant FROM live UNION SELECT tenant FROM completing")?;
            let rows = q.query_map([], |r| r.get::<_, String>(0))?;
            rows.map(|t| TenantId::new(t?)).collect()
        })
        .await
    }
}
