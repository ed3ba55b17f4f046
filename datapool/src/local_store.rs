//! [`LocalStore`]: the datapool in one SQLite file. The embedded default when no Redis is
//! configured, with the same semantics as Redis (ready queue, consumer groups, ack, redelivery
//! after an idle time, dead letters), and the durable spool of [`crate::SpooledStore`].
//!
//! The file is opened in WAL mode with a busy timeout, so a trainer process on the same machine
//! can open it too: readers never block the writer, and the ready queue is claimed inside
//! `BEGIN IMMEDIATE` transactions, so two processes never get the same new entry.
//!
//! Opened [`LocalStore::with_caps`] (the sidecar's embedded store), a tenant's steps and bytes
//! are bounded as on Redis ([`crate::Caps`]): triggers count every row a trajectory holds — its
//! header (the agent's `metadata` in it), steps, next states and evaluations — per trajectory
//! and per tenant, and a write that takes a tenant over a cap deletes its oldest trajectories
//! until it is back under 90% of both. Rows written before the counting existed are not counted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use tokio::sync::Mutex;

use crate::codec::{decode, decode_gate_decision, encode, parse_stored};
use crate::encoded::EncodedStep;
use crate::error::{Error, Result};
use crate::ids::{GroupId, StepId, TenantId, TrajectoryId, UnixMs};
use crate::redis_store::Caps;
use crate::schema::{
    check_version, CompletionReason, Evaluation, GateDecision, Group, GroupMembership, GroupState,
    NextState, PolicyVersion, Rollback, Step, Trajectory, TrajectoryRecord, TrajectoryStatus,
    GATE_DECISIONS_KEPT,
};
use crate::store::{
    Complete, Completed, Consumer, ConsumerGroupLag, ConsumerName, DeadLetter, Delivery,
    DeliveryId, ReadyItem, Store, OVERDUE_PER_SWEEP,
};

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS tenants (tenant TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS trajectories (
    tenant TEXT NOT NULL, id TEXT NOT NULL, json TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'open', completed_at INTEGER, completion TEXT,
    group_id TEXT, group_size INTEGER,
    PRIMARY KEY (tenant, id));
CREATE TABLE IF NOT EXISTS steps (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, trajectory TEXT NOT NULL,
    step_id TEXT NOT NULL, json TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS steps_of_trajectory ON steps (tenant, trajectory, seq);
CREATE TABLE IF NOT EXISTS next_states (
    tenant TEXT NOT NULL, trajectory TEXT NOT NULL, step_id TEXT NOT NULL, json TEXT NOT NULL,
    PRIMARY KEY (tenant, trajectory, step_id));
CREATE TABLE IF NOT EXISTS evaluations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, trajectory TEXT NOT NULL,
    json TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS evaluations_of_trajectory ON evaluations (tenant, trajectory, seq);
CREATE TABLE IF NOT EXISTS groups (
    tenant TEXT NOT NULL, id TEXT NOT NULL, size INTEGER NOT NULL, state TEXT NOT NULL,
    created_at INTEGER NOT NULL, settled_at INTEGER,
    PRIMARY KEY (tenant, id));
CREATE INDEX IF NOT EXISTS open_groups ON groups (tenant, state, created_at);
CREATE TABLE IF NOT EXISTS group_members (
    tenant TEXT NOT NULL, group_id TEXT NOT NULL, trajectory TEXT NOT NULL,
    finished INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, group_id, trajectory));
CREATE TABLE IF NOT EXISTS ready (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, kind TEXT NOT NULL,
    item TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS ready_of_tenant ON ready (tenant, seq);
CREATE TABLE IF NOT EXISTS consumer_groups (
    tenant TEXT NOT NULL, name TEXT NOT NULL, last_seq INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, name));
CREATE TABLE IF NOT EXISTS pending (
    tenant TEXT NOT NULL, consumer_group TEXT NOT NULL, seq INTEGER NOT NULL,
    consumer TEXT NOT NULL, delivered_at INTEGER NOT NULL, deliveries INTEGER NOT NULL,
    PRIMARY KEY (tenant, consumer_group, seq));
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, consumer_group TEXT NOT NULL,
    seq INTEGER NOT NULL, kind TEXT NOT NULL, item TEXT NOT NULL, deliveries INTEGER NOT NULL,
    consumer TEXT NOT NULL, dead_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS policies (
    tenant TEXT PRIMARY KEY, version INTEGER NOT NULL, json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rollbacks (
    tenant TEXT PRIMARY KEY, id TEXT NOT NULL, json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS gate_decisions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, json TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS gate_decisions_by_tenant ON gate_decisions (tenant, seq);
CREATE TABLE IF NOT EXISTS waiting_completions (
    tenant TEXT NOT NULL, id TEXT NOT NULL, expect INTEGER NOT NULL, completed_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, id));
CREATE INDEX IF NOT EXISTS waiting_since ON waiting_completions (tenant, completed_at);
CREATE TABLE IF NOT EXISTS spool (seq INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS usage (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, trajectory TEXT NOT NULL,
    steps INTEGER NOT NULL DEFAULT 0, bytes INTEGER NOT NULL DEFAULT 0,
    UNIQUE (tenant, trajectory));
CREATE TABLE IF NOT EXISTS tenant_usage (
    tenant TEXT PRIMARY KEY, steps INTEGER NOT NULL DEFAULT 0, bytes INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS usage_of_tenant ON usage (tenant, seq);
CREATE TRIGGER IF NOT EXISTS usage_counted AFTER UPDATE ON usage BEGIN
    INSERT INTO tenant_usage (tenant) SELECT NEW.tenant
        WHERE NOT EXISTS (SELECT 1 FROM tenant_usage WHERE tenant = NEW.tenant);
    UPDATE tenant_usage SET steps = steps + NEW.steps - OLD.steps,
        bytes = bytes + NEW.bytes - OLD.bytes WHERE tenant = NEW.tenant;
END;
CREATE TRIGGER IF NOT EXISTS usage_dropped AFTER DELETE ON usage BEGIN
    UPDATE tenant_usage SET steps = steps - OLD.steps, bytes = bytes - OLD.bytes
        WHERE tenant = OLD.tenant;
END;
"#;

/// The triggers that count the rows of `table` (its trajectory in column `trajectory`, its
/// bytes in `json`, `steps` steps a row) in `usage`. No `OR IGNORE` in a trigger: an outer
/// statement's conflict clause (an upsert's) overrides it.
fn counting(table: &str, trajectory: &str, steps: u8) -> String {
    let bytes = |row: &str| format!("length(CAST({row}.json AS BLOB))");
    let (new, old) = (bytes("NEW"), bytes("OLD"));
    format!(
        "CREATE TRIGGER IF NOT EXISTS {table}_counted AFTER INSERT ON {table} BEGIN
             INSERT INTO usage (tenant, trajectory) SELECT NEW.tenant, NEW.{trajectory}
                 WHERE NOT EXISTS (SELECT 1 FROM usage
                     WHERE tenant = NEW.tenant AND trajectory = NEW.{trajectory});
             UPDATE usage SET steps = steps + {steps}, bytes = bytes + {new}
                 WHERE tenant = NEW.tenant AND trajectory = NEW.{trajectory};
         END;
         CREATE TRIGGER IF NOT EXISTS {table}_recounted AFTER UPDATE OF json ON {table} BEGIN
             UPDATE usage SET bytes = bytes + {new} - {old}
                 WHERE tenant = NEW.tenant AND trajectory = NEW.{trajectory};
         END;
         CREATE TRIGGER IF NOT EXISTS {table}_uncounted AFTER DELETE ON {table} BEGIN
             UPDATE usage SET steps = steps - {steps}, bytes = bytes - {old}
                 WHERE tenant = OLD.tenant AND trajectory = OLD.{trajectory};
         END;"
    )
}

/// Every table whose rows belong to a trajectory: `(table, its trajectory column, steps a row)`.
const COUNTED: [(&str, &str, u8); 4] = [
    ("trajectories", "id", 0),
    ("steps", "trajectory", 1),
    ("next_states", "trajectory", 0),
    ("evaluations", "trajectory", 0),
];

/// The datapool in a SQLite file. Cheap to clone; clones share one connection, and every call
/// runs on tokio's blocking pool so SQLite never stalls the async workers.
#[derive(Clone)]
pub struct LocalStore {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
    /// Each tenant's bounds; `None`: bounded by the disk (the spool).
    caps: Option<Caps>,
}

/// Creates the SQLite file at `path`, when missing, readable by its owner alone (it holds
/// conversations), whatever the process umask says; SQLite gives its `-wal` and `-shm` files
/// the database file's permissions. A file that cannot be created here is reported by SQLite's
/// own open, which tries the same.
pub(crate) fn create_private(path: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path);
}

impl LocalStore {
    /// Opens (or creates) the store at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        create_private(&path);
        let conn = Connection::open(&path)?;
        // WAL: a trainer process can read while the sidecar writes. The busy timeout lets two
        // processes take turns on the write lock instead of failing with SQLITE_BUSY.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(Duration::from_secs(10))?;
        conn.execute_batch(SCHEMA)?;
        for (table, trajectory, steps) in COUNTED {
            conn.execute_batch(&counting(table, trajectory, steps))?;
        }
        Ok(LocalStore {
            conn: Arc::new(Mutex::new(conn)),
            path,
            caps: None,
        })
    }

    /// This store with each tenant's steps and bytes bounded by `caps` (of which the steps and
    /// bytes per tenant apply here): a write that takes a tenant over either deletes its oldest
    /// trajectories.
    pub fn with_caps(mut self, caps: Caps) -> Self {
        self.caps = Some(caps);
        self
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` with the connection on the blocking pool.
    async fn with<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        // The connection is taken before a blocking thread is: callers wait their turn as tasks,
        // so many calls at once hold one thread, not one parked thread each (each with its
        // stack and its allocator's cache). A panic in `f` releases the lock as it unwinds;
        // SQLite stays consistent (transactions roll back on drop).
        let mut conn = Arc::clone(&self.conn).lock_owned().await;
        tokio::task::spawn_blocking(move || f(&mut conn)).await?
    }

    /// Appends operations to the spool, in order.
    pub(crate) async fn spool_push(&self, ops: Vec<String>) -> Result<()> {
        self.with(move |c| {
            let tx = c.transaction()?;
            {
                let mut insert = tx.prepare_cached("INSERT INTO spool (op) VALUES (?1)")?;
                for op in &ops {
                    insert.execute([op])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// The oldest `limit` spooled operations with their sequence numbers.
    pub(crate) async fn spool_peek(&self, limit: usize) -> Result<Vec<(i64, String)>> {
        self.with(move |c| {
            let mut q = c.prepare_cached("SELECT seq, op FROM spool ORDER BY seq LIMIT ?1")?;
            let rows = q.query_map([limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    /// Forgets spooled operations up to and including `seq` (they reached Redis).
    pub(crate) async fn spool_remove_through(&self, seq: i64) -> Result<()> {
        self.with(move |c| {
            c.execute("DELETE FROM spool WHERE seq <= ?1", [seq])?;
            Ok(())
        })
        .await
    }

    /// How many operations wait in the spool.
    pub async fn spool_len(&self) -> Result<u64> {
        self.with(|c| {
            let n: i64 = c.query_row("SELECT COUNT(*) FROM spool", [], |r| r.get(0))?;
            Ok(n as u64)
        })
        .await
    }
}

/// One row of `trajectories`, laid over its stored JSON as in Redis.
struct HeaderRow {
    json: String,
    status: String,
    completed_at: Option<i64>,
    completion: Option<String>,
    group_id: Option<String>,
    group_size: Option<i64>,
}

const HEADER_COLUMNS: &str = "json, status, completed_at, completion, group_id, group_size";

fn header_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<HeaderRow> {
    Ok(HeaderRow {
        json: r.get(0)?,
        status: r.get(1)?,
        completed_at: r.get(2)?,
        completion: r.get(3)?,
        group_id: r.get(4)?,
        group_size: r.get(5)?,
    })
}

fn trajectory_from_row(row: HeaderRow) -> Result<Trajectory> {
    let mut t: Trajectory = decode("trajectory", &row.json)?;
    check_version("trajectory", t.schema_version)?;
    if let Some(s) = TrajectoryStatus::parse(&row.status) {
        t.status = s;
    }
    t.completed_at = row.completed_at.map(|ms| UnixMs(ms as u64));
    t.completion = match row.completion {
        Some(c) => Some(decode::<CompletionReason>("completion reason", &c)?),
        None => None,
    };
    t.group = match (row.group_id, row.group_size) {
        (Some(g), Some(size)) => Some(GroupMembership {
            id: parse_stored("trajectory group", &g)?,
            size: size as u32,
        }),
        _ => None,
    };
    Ok(t)
}

fn enqueue(tx: &rusqlite::Transaction<'_>, tenant: &str, item: ReadyItem) -> Result<()> {
    tx.execute(
        "INSERT INTO ready (tenant, kind, item) VALUES (?1, ?2, ?3)",
        params![tenant, item.kind(), item.id_string()],
    )?;
    Ok(())
}

/// Enqueues what a finished trajectory makes ready: itself, or its group once every member
/// finished.
fn enqueue_finished(
    tx: &rusqlite::Transaction<'_>,
    tenant: &str,
    trajectory: TrajectoryId,
    group: Option<GroupId>,
    status: TrajectoryStatus,
    at: UnixMs,
) -> Result<Option<ReadyItem>> {
    let id = trajectory.to_string();
    let Some(group) = group else {
        if status != TrajectoryStatus::Completed {
            return Ok(None);
        }
        let item = ReadyItem::Trajectory(trajectory);
        enqueue(tx, tenant, item)?;
        return Ok(Some(item));
    };
    let gid = group.to_string();
    tx.execute(
        "UPDATE group_members SET finished = 1
         WHERE tenant = ?1 AND group_id = ?2 AND trajectory = ?3",
        [tenant, &gid, &id],
    )?;
    let (state, size, finished): (String, i64, i64) = tx.query_row(
        "SELECT g.state, g.size,
                (SELECT COUNT(*) FROM group_members m
                 WHERE m.tenant = g.tenant AND m.group_id = g.id AND m.finished = 1)
         FROM groups g WHERE g.tenant = ?1 AND g.id = ?2",
        [tenant, &gid],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    if state != GroupState::Open.as_str() || finished < size {
        return Ok(None);
    }
    tx.execute(
        "UPDATE groups SET state = 'ready', settled_at = ?3 WHERE tenant = ?1 AND id = ?2",
        params![tenant, gid, at.0 as i64],
    )?;
    let item = ReadyItem::Group(group);
    enqueue(tx, tenant, item)?;
    Ok(Some(item))
}

/// Enqueues the waiting completion of `id` if what it waits for is written: its header, and
/// (unless `overdue`) the steps it expects. `None` while it waits (or nothing waited), else
/// what it enqueued.
fn settle_waiting(
    tx: &rusqlite::Transaction<'_>,
    tenant: &str,
    id: TrajectoryId,
    overdue: bool,
) -> Result<Option<Option<ReadyItem>>> {
    let key = id.to_string();
    // Only a trajectory whose header is written can be enqueued.
    let row: Option<(i64, String, Option<i64>, Option<String>)> = tx
        .query_row(
            "SELECT w.expect, t.status, t.completed_at, t.group_id
             FROM waiting_completions w JOIN trajectories t ON t.tenant = w.tenant AND t.id = w.id
             WHERE w.tenant = ?1 AND w.id = ?2 AND t.json != ''",
            [tenant, &key],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()?;
    let Some((expect, status, at, group)) = row else {
        return Ok(None);
    };
    if !overdue {
        let have: i64 = tx.query_row(
            "SELECT COUNT(*) FROM steps WHERE tenant = ?1 AND trajectory = ?2",
            [tenant, &key],
            |r| r.get(0),
        )?;
        if have < expect {
            return Ok(None);
        }
    }
    tx.execute(
        "DELETE FROM waiting_completions WHERE tenant = ?1 AND id = ?2",
        [tenant, &key],
    )?;
    let status = TrajectoryStatus::parse(&status).unwrap_or(TrajectoryStatus::Completed);
    let group = match group {
        Some(gid) => Some(parse_stored::<GroupId>("group id", &gid)?),
        None => None,
    };
    let at = UnixMs(at.unwrap_or_default().max(0) as u64);
    Ok(Some(enqueue_finished(tx, tenant, id, group, status, at)?))
}

/// Deletes `tenant`'s oldest trajectories, whole, while it is over `caps`: once over either
/// cap, down to 90% of both (a tenant at its cap does not trim on every write).
fn trim_to_caps(tx: &rusqlite::Transaction<'_>, tenant: &str, caps: Option<Caps>) -> Result<()> {
    let Some(caps) = caps else {
        return Ok(());
    };
    let usage = || -> Result<(u64, u64)> {
        let counted: Option<(i64, i64)> = tx
            .query_row(
                "SELECT steps, bytes FROM tenant_usage WHERE tenant = ?1",
                [tenant],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let (steps, bytes) = counted.unwrap_or_default();
        Ok((steps.max(0) as u64, bytes.max(0) as u64))
    };
    let (steps, bytes) = usage()?;
    if !caps.exceeded(steps, bytes) {
        return Ok(());
    }
    let target = caps.trim_target();
    let mut trimmed = 0usize;
    loop {
        let (steps, bytes) = usage()?;
        if steps <= target.0 && bytes <= target.1 {
            break;
        }
        let oldest: Option<String> = tx
            .query_row(
                "SELECT trajectory FROM usage WHERE tenant = ?1 ORDER BY seq LIMIT 1",
                [tenant],
                |r| r.get(0),
            )
            .optional()?;
        let Some(trajectory) = oldest else {
            break;
        };
        // The count first (the tenant's total drops by all of it), then the rows, whose
        // triggers find no count left to update.
        tx.execute(
            "DELETE FROM usage WHERE tenant = ?1 AND trajectory = ?2",
            [tenant, &trajectory],
        )?;
        for (table, column, _) in COUNTED {
            tx.execute(
                &format!("DELETE FROM {table} WHERE tenant = ?1 AND {column} = ?2"),
                [tenant, &trajectory],
            )?;
        }
        trimmed += 1;
    }
    tracing::debug!(
        tenant,
        trimmed,
        "trimmed the tenant's oldest trajectories to its caps"
    );
    Ok(())
}

#[async_trait]
impl Store for LocalStore {
    async fn upsert_trajectory(&self, t: &Trajectory) -> Result<()> {
        let json = encode("trajectory", t)?;
        let t = t.clone();
        let caps = self.caps;
        self.with(move |c| {
            let tx = c.transaction()?;
            let tenant = t.tenant.as_str();
            let id = t.id.to_string();
            tx.execute(
                "INSERT OR IGNORE INTO tenants (tenant) VALUES (?1)",
                [tenant],
            )?;
            tx.execute(
                "INSERT INTO trajectories (tenant, id, json, group_id, group_size)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (tenant, id) DO UPDATE SET json = excluded.json,
                     group_id = coalesce(group_id, excluded.group_id),
                     group_size = coalesce(group_size, excluded.group_size)",
                params![
                    tenant,
                    id,
                    json,
                    t.group.map(|g| g.id.to_string()),
                    t.group.map(|g| g.size)
                ],
            )?;
            if let Some(g) = t.group {
                let gid = g.id.to_string();
                tx.execute(
                    "INSERT OR IGNORE INTO groups (tenant, id, size, state, created_at)
                     VALUES (?1, ?2, ?3, 'open', ?4)",
                    params![tenant, gid, g.size, t.created_at.0 as i64],
                )?;
                tx.execute(
                    "INSERT OR IGNORE INTO group_members (tenant, group_id, trajectory)
                     VALUES (?1, ?2, ?3)",
                    params![tenant, gid, id],
                )?;
            }
            // A completion written before this header (another replica's) takes effect now.
            settle_waiting(&tx, tenant, t.id, false)?;
            trim_to_caps(&tx, tenant, caps)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn append_encoded_steps(&self, steps: &[EncodedStep]) -> Result<()> {
        // The rows' JSON shared, not copied: the statement binds it where it lies.
        let rows: Vec<(String, String, String, EncodedStep)> = steps
            .iter()
            .map(|s| {
                (
                    s.tenant().to_string(),
                    s.trajectory().to_string(),
                    s.id().to_string(),
                    s.clone(),
                )
            })
            .collect();
        // Each trajectory once: a completion may wait for these steps.
        let trajectories: std::collections::BTreeSet<(TenantId, TrajectoryId)> = steps
            .iter()
            .map(|s| (s.tenant().clone(), s.trajectory()))
            .collect();
        let caps = self.caps;
        self.with(move |c| {
            let tx = c.transaction()?;
            {
                // A write replayed (at least once) is the same step: kept where it first landed.
                let mut insert = tx.prepare_cached(
                    "INSERT INTO steps (tenant, trajectory, step_id, json)
                     SELECT ?1, ?2, ?3, ?4 WHERE NOT EXISTS (
                         SELECT 1 FROM steps WHERE tenant = ?1 AND trajectory = ?2 AND step_id = ?3)",
                )?;
                for (tenant, traj, id, step) in &rows {
                    insert.execute(params![tenant, traj, id, step.json()])?;
                }
            }
            // A completion that waited for these steps (another replica's) takes effect now.
            for (tenant, traj) in &trajectories {
                settle_waiting(&tx, tenant.as_str(), *traj, false)?;
            }
            let tenants: std::collections::BTreeSet<&TenantId> =
                trajectories.iter().map(|(tenant, _)| tenant).collect();
            for tenant in tenants {
                trim_to_caps(&tx, tenant.as_str(), caps)?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn set_next_state(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
        step: &StepId,
        next_state: &NextState,
    ) -> Result<()> {
        let row = (
            tenant.to_string(),
            trajectory.to_string(),
            step.to_string(),
            encode("next state", next_state)?,
        );
        let caps = self.caps;
        self.with(move |c| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO next_states (tenant, trajectory, step_id, json) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (tenant, trajectory, step_id) DO UPDATE SET json = excluded.json",
                params![row.0, row.1, row.2, row.3],
            )?;
            trim_to_caps(&tx, &row.0, caps)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn append_evaluations(&self, evaluations: &[Evaluation]) -> Result<()> {
        let rows = evaluations
            .iter()
            .map(|e| {
                Ok((
                    e.tenant.to_string(),
                    e.trajectory.to_string(),
                    encode("evaluation", e)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let caps = self.caps;
        self.with(move |c| {
            let tx = c.transaction()?;
            {
                let mut insert = tx.prepare_cached(
                    "INSERT INTO evaluations (tenant, trajectory, json) VALUES (?1, ?2, ?3)",
                )?;
                for (tenant, traj, json) in &rows {
                    insert.execute(params![tenant, traj, json])?;
                }
            }
            let tenants: std::collections::BTreeSet<&String> =
                rows.iter().map(|(tenant, _, _)| tenant).collect();
            for tenant in tenants {
                trim_to_caps(&tx, tenant, caps)?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn complete_trajectory(&self, req: &Complete) -> Result<Completed> {
        let status = req.finished_status()?;
        let completion = encode("completion reason", &req.reason)?;
        let req = req.clone();
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let tenant = req.tenant.as_str();
            let id = req.trajectory.to_string();
            let current: Option<String> = tx
                .query_row(
                    "SELECT status FROM trajectories WHERE tenant = ?1 AND id = ?2",
                    [tenant, &id],
                    |r| r.get(0),
                )
                .optional()?;
            if current.is_some_and(|s| s != TrajectoryStatus::Open.as_str()) {
                return Ok(Completed {
                    newly_finished: false,
                    enqueued: None,
                    deferred: false,
                });
            }
            // A row without a header (another replica's write still on its way) holds the
            // completion until the header arrives.
            tx.execute(
                "INSERT INTO trajectories (tenant, id, json, status, completed_at, completion)
                 VALUES (?1, ?2, '', ?3, ?4, ?5)
                 ON CONFLICT (tenant, id) DO UPDATE SET status = excluded.status,
                     completed_at = excluded.completed_at, completion = excluded.completion",
                params![tenant, id, status.as_str(), req.at.0 as i64, completion],
            )?;
            // It waits, and is enqueued as soon as it waits for nothing.
            tx.execute(
                "INSERT OR REPLACE INTO waiting_completions (tenant, id, expect, completed_at)
                 VALUES (?1, ?2, ?3, ?4)",
                params![tenant, id, req.steps.unwrap_or(0), req.at.0 as i64],
            )?;
            let settled = settle_waiting(&tx, tenant, req.trajectory, false)?;
            tx.commit()?;
            Ok(Completed {
                newly_finished: true,
                enqueued: settled.flatten(),
                deferred: settled.is_none(),
            })
        })
        .await
    }

    async fn expire_groups(
        &self,
        tenant: &TenantId,
        created_before: UnixMs,
    ) -> Result<Vec<GroupId>> {
        let tenant = tenant.to_string();
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let due: Vec<String> = {
                let mut q = tx.prepare_cached(
                    "SELECT id FROM groups WHERE tenant = ?1 AND state = 'open' AND created_at < ?2
                     ORDER BY created_at",
                )?;
                let rows = q.query_map(params![tenant, created_before.0 as i64], |r| r.get(0))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            let now = UnixMs::now().0 as i64;
            let mut settled = Vec::with_capacity(due.len());
            for gid in due {
                tx.execute(
                    "UPDATE groups SET state = 'partial', settled_at = ?3
                     WHERE tenant = ?1 AND id = ?2",
                    params![tenant, gid, now],
                )?;
                let group: GroupId = parse_stored("group id", &gid)?;
                enqueue(&tx, &tenant, ReadyItem::Group(group))?;
                settled.push(group);
            }
            tx.commit()?;
            Ok(settled)
        })
        .await
    }

    async fn release_overdue(
        &self,
        tenant: &TenantId,
        completed_before: UnixMs,
    ) -> Result<Vec<TrajectoryId>> {
        let tenant = tenant.to_string();
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let due = {
                let mut q = tx.prepare_cached(
                    "SELECT w.id FROM waiting_completions w
                     JOIN trajectories t ON t.tenant = w.tenant AND t.id = w.id
                     WHERE w.tenant = ?1 AND w.completed_at < ?2 AND t.json != ''
                     ORDER BY w.completed_at LIMIT ?3",
                )?;
                let rows = q.query_map(
                    params![tenant, completed_before.0 as i64, OVERDUE_PER_SWEEP as i64],
                    |r| r.get::<_, String>(0),
                )?;
                rows.collect::<rusqlite::Result<Vec<_>>>()?
            };
            let mut released = Vec::new();
            for id in due {
                let id = parse_stored::<TrajectoryId>("trajectory id", &id)?;
                if settle_waiting(&tx, &tenant, id, true)?.is_some() {
                    released.push(id);
                }
            }
            tx.commit()?;
            Ok(released)
        })
        .await
    }

    async fn read_ready(
        &self,
        tenant: &TenantId,
        consumer: &Consumer,
        count: usize,
    ) -> Result<Vec<Delivery>> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let tenant = tenant.to_string();
        let consumer = consumer.clone();
        self.with(move |c| {
            // IMMEDIATE: the write lock is taken up front, so two processes reading the queue at
            // once are serialised here instead of both handing out the same entries.
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let group = consumer.group.as_str();
            let now = UnixMs::now().0 as i64;
            tx.execute(
                "INSERT OR IGNORE INTO consumer_groups (tenant, name) VALUES (?1, ?2)",
                [&tenant, group],
            )?;
            let mut out = Vec::new();

            // 1. Entries idle too long: dead-letter the ones delivered too often, take over the rest.
            let stale: Vec<(i64, String, i64, String, String)> = {
                let mut q = tx.prepare_cached(
                    "SELECT p.seq, p.consumer, p.deliveries, r.kind, r.item
                     FROM pending p JOIN ready r ON r.seq = p.seq
                     WHERE p.tenant = ?1 AND p.consumer_group = ?2 AND p.delivered_at <= ?3
                     ORDER BY p.seq LIMIT ?4",
                )?;
                let idle_before = now - consumer.claim_idle.as_millis() as i64;
                let rows = q.query_map(
                    params![tenant, group, idle_before, count as i64],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
                )?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            for (seq, last_consumer, deliveries, kind, item) in stale {
                if deliveries >= i64::from(consumer.max_deliveries) {
                    tx.execute(
                        "INSERT INTO dead_letters
                         (tenant, consumer_group, seq, kind, item, deliveries, consumer, dead_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                        params![tenant, group, seq, kind, item, deliveries, last_consumer, now],
                    )?;
                    tx.execute(
                        "DELETE FROM pending WHERE tenant = ?1 AND consumer_group = ?2 AND seq = ?3",
                        params![tenant, group, seq],
                    )?;
                    tracing::warn!(%tenant, consumer_group = group, seq, deliveries, "dead-lettered a ready entry");
                    continue;
                }
                tx.execute(
                    "UPDATE pending SET consumer = ?4, delivered_at = ?5, deliveries = deliveries + 1
                     WHERE tenant = ?1 AND consumer_group = ?2 AND seq = ?3",
                    params![tenant, group, seq, consumer.name.as_str(), now],
                )?;
                out.push(Delivery {
                    id: DeliveryId(seq.to_string()),
                    item: ReadyItem::parse(&kind, &item)?,
                    deliveries: deliveries as u32 + 1,
                });
            }

            // 2. New entries past the group's cursor.
            let remaining = count.saturating_sub(out.len());
            if remaining > 0 {
                let fresh: Vec<(i64, String, String)> = {
                    let mut q = tx.prepare_cached(
                        "SELECT seq, kind, item FROM ready
                         WHERE tenant = ?1 AND seq > (SELECT last_seq FROM consumer_groups
                                                      WHERE tenant = ?1 AND name = ?2)
                         ORDER BY seq LIMIT ?3",
                    )?;
                    let rows = q.query_map(params![tenant, group, remaining as i64], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })?;
                    rows.collect::<rusqlite::Result<_>>()?
                };
                for (seq, kind, item) in fresh {
                    tx.execute(
                        "INSERT INTO pending (tenant, consumer_group, seq, consumer, delivered_at, deliveries)
                         VALUES (?1, ?2, ?3, ?4, ?5, 1)",
                        params![tenant, group, seq, consumer.name.as_str(), now],
                    )?;
                    tx.execute(
                        "UPDATE consumer_groups SET last_seq = ?3 WHERE tenant = ?1 AND name = ?2",
                        params![tenant, group, seq],
                    )?;
                    out.push(Delivery {
                        id: DeliveryId(seq.to_string()),
                        item: ReadyItem::parse(&kind, &item)?,
                        deliveries: 1,
                    });
                }
            }
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    async fn ack(
        &self,
        tenant: &TenantId,
        consumer_group: &ConsumerName,
        deliveries: &[DeliveryId],
    ) -> Result<()> {
        let tenant = tenant.to_string();
        let group = consumer_group.to_string();
        // Ids that are not ours (not a number) cannot be pending here: nothing to ack.
        let seqs: Vec<i64> = deliveries.iter().filter_map(|d| d.0.parse().ok()).collect();
        self.with(move |c| {
            let tx = c.transaction()?;
            {
                let mut del = tx.prepare_cached(
                    "DELETE FROM pending WHERE tenant = ?1 AND consumer_group = ?2 AND seq = ?3",
                )?;
                for seq in seqs {
                    del.execute(params![tenant, group, seq])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn dead_letters(
        &self,
        tenant: &TenantId,
        consumer_group: &ConsumerName,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        let tenant = tenant.to_string();
        let group = consumer_group.to_string();
        self.with(move |c| {
            let mut q = c.prepare_cached(
                "SELECT seq, kind, item, deliveries, consumer, dead_at FROM dead_letters
                 WHERE tenant = ?1 AND consumer_group = ?2 ORDER BY id LIMIT ?3",
            )?;
            let rows = q.query_map(params![tenant, group, limit as i64], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, i64>(5)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (seq, kind, item, deliveries, consumer, dead_at) = row?;
                out.push(DeadLetter {
                    id: DeliveryId(seq.to_string()),
                    item: ReadyItem::parse(&kind, &item)?,
                    deliveries: deliveries as u32,
                    last_consumer: consumer,
                    dead_at: UnixMs(dead_at as u64),
                });
            }
            Ok(out)
        })
        .await
    }

    async fn consumer_lag(&self, tenant: &TenantId) -> Result<Vec<ConsumerGroupLag>> {
        let tenant = tenant.to_string();
        self.with(move |c| {
            let mut q = c.prepare_cached(
                "SELECT g.name,
                        (SELECT COUNT(*) FROM ready r WHERE r.tenant = g.tenant AND r.seq > g.last_seq),
                        (SELECT COUNT(*) FROM pending p
                          WHERE p.tenant = g.tenant AND p.consumer_group = g.name)
                 FROM consumer_groups g WHERE g.tenant = ?1 ORDER BY g.name",
            )?;
            let rows = q.query_map(params![tenant], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (group, undelivered, pending) = row?;
                out.push(ConsumerGroupLag {
                    group: ConsumerName::new(group)?,
                    undelivered: Some(undelivered as u64),
                    pending: pending as u64,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn trajectory(
        &self,
        tenant: &TenantId,
        id: &TrajectoryId,
    ) -> Result<Option<TrajectoryRecord>> {
        let tenant = tenant.to_string();
        let id = id.to_string();
        self.with(move |c| {
            // One read transaction: a consistent snapshot of header, steps and evaluations.
            let tx = c.transaction()?;
            let row = tx
                .query_row(
                    &format!(
                        "SELECT {HEADER_COLUMNS} FROM trajectories
                         WHERE tenant = ?1 AND id = ?2 AND json != ''"
                    ),
                    [&tenant, &id],
                    header_row,
                )
                .optional()?;
            let Some(row) = row else { return Ok(None) };
            let trajectory = trajectory_from_row(row)?;
            let mut steps = Vec::new();
            {
                let mut q = tx.prepare_cached(
                    "SELECT s.json, n.json FROM steps s
                     LEFT JOIN next_states n
                       ON n.tenant = s.tenant AND n.trajectory = s.trajectory AND n.step_id = s.step_id
                     WHERE s.tenant = ?1 AND s.trajectory = ?2 ORDER BY s.seq",
                )?;
                let rows = q.query_map([&tenant, &id], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
                })?;
                for row in rows {
                    let (json, next) = row?;
                    let mut step: Step = decode("step", &json)?;
                    check_version("step", step.schema_version)?;
                    if let Some(n) = next {
                        step.next_state = Some(decode("next state", &n)?);
                    }
                    steps.push(step);
                }
            }
            let mut evaluations = Vec::new();
            {
                let mut q = tx.prepare_cached(
                    "SELECT json FROM evaluations WHERE tenant = ?1 AND trajectory = ?2 ORDER BY seq",
                )?;
                let rows = q.query_map([&tenant, &id], |r| r.get::<_, String>(0))?;
                for row in rows {
                    let e: Evaluation = decode("evaluation", &row?)?;
                    check_version("evaluation", e.schema_version)?;
                    evaluations.push(e);
                }
            }
            Ok(Some(TrajectoryRecord {
                trajectory,
                steps,
                evaluations,
            }))
        })
        .await
    }

    async fn group(&self, tenant: &TenantId, id: &GroupId) -> Result<Option<Group>> {
        let tenant_id = tenant.clone();
        let tenant = tenant.to_string();
        let gid = *id;
        let id = id.to_string();
        self.with(move |c| {
            let tx = c.transaction()?;
            let row: Option<(i64, String, i64, Option<i64>)> = tx
                .query_row(
                    "SELECT size, state, created_at, settled_at FROM groups
                     WHERE tenant = ?1 AND id = ?2",
                    [&tenant, &id],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )
                .optional()?;
            let Some((size, state, created_at, settled_at)) = row else {
                return Ok(None);
            };
            let (mut members, mut finished) = (Vec::new(), Vec::new());
            {
                let mut q = tx.prepare_cached(
                    "SELECT trajectory, finished FROM group_members
                     WHERE tenant = ?1 AND group_id = ?2 ORDER BY trajectory",
                )?;
                let rows = q.query_map([&tenant, &id], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, bool>(1)?))
                })?;
                for row in rows {
                    let (member, done) = row?;
                    let member: TrajectoryId = parse_stored("group member", &member)?;
                    members.push(member);
                    if done {
                        finished.push(member);
                    }
                }
            }
            Ok(Some(Group {
                id: gid,
                tenant: tenant_id,
                size: size as u32,
                members,
                finished,
                state: GroupState::parse(&state).ok_or_else(|| Error::UnexpectedReply {
                    what: "group state",
                    detail: state.clone(),
                })?,
                created_at: UnixMs(created_at as u64),
                settled_at: settled_at.map(|ms| UnixMs(ms as u64)),
            }))
        })
        .await
    }

    async fn list_trajectories(
        &self,
        tenant: &TenantId,
        after: Option<&TrajectoryId>,
        limit: usize,
    ) -> Result<Vec<Trajectory>> {
        let tenant = tenant.to_string();
        // "" sorts before every id: no cursor means from the start.
        let after = after.map(ToString::to_string).unwrap_or_default();
        self.with(move |c| {
            let mut q = c.prepare_cached(&format!(
                "SELECT {HEADER_COLUMNS} FROM trajectories
                 WHERE tenant = ?1 AND id > ?2 AND json != '' ORDER BY id LIMIT ?3"
            ))?;
            let rows = q.query_map(params![tenant, after, limit as i64], header_row)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(trajectory_from_row(row?)?);
            }
            Ok(out)
        })
        .await
    }

    async fn tenants(&self) -> Result<Vec<TenantId>> {
        self.with(|c| {
            let mut q = c.prepare_cached("SELECT tenant FROM tenants ORDER BY tenant")?;
            let rows = q.query_map([], |r| r.get::<_, String>(0))?;
            let mut out = Vec::new();
            for row in rows {
                if let Ok(t) = TenantId::new(row?) {
                    out.push(t);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn policy_version(&self, tenant: &TenantId) -> Result<Option<PolicyVersion>> {
        let tenant = tenant.to_string();
        self.with(move |c| {
            let json: Option<String> = c
                .query_row(
                    "SELECT json FROM policies WHERE tenant = ?1",
                    [&tenant],
                    |r| r.get(0),
                )
                .optional()?;
            match json {
                Some(j) => {
                    let p: PolicyVersion = decode("policy version", &j)?;
                    check_version("policy version", p.schema_version)?;
                    Ok(Some(p))
                }
                None => Ok(None),
            }
        })
        .await
    }

    /// There is no pub/sub here: routers of an embedded store poll [`Store::policy_version`].
    async fn set_policy_version(&self, policy: &PolicyVersion) -> Result<()> {
        let json = encode("policy version", policy)?;
        let policy = policy.clone();
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let tenant = policy.tenant.as_str();
            let live: Option<(i64, String)> = tx
                .query_row(
                    "SELECT version, json FROM policies WHERE tenant = ?1",
                    [tenant],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            match live {
                Some((v, _)) if v as u64 > policy.version => {
                    return Err(Error::StalePolicyVersion {
                        tenant: tenant.into(),
                        attempted: policy.version,
                        live: v as u64,
                    })
                }
                Some((v, live)) if v as u64 == policy.version && live == json => return Ok(()),
                _ => {}
            }
            tx.execute(
                "INSERT INTO policies (tenant, version, json) VALUES (?1, ?2, ?3)
                 ON CONFLICT (tenant) DO UPDATE SET version = excluded.version, json = excluded.json",
                params![tenant, policy.version as i64, json],
            )?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn order_rollback(&self, order: &Rollback) -> Result<()> {
        let json = encode("rollback order", order)?;
        let (tenant, id) = (order.tenant.to_string(), order.id.clone());
        self.with(move |c| {
            c.execute(
                "INSERT INTO rollbacks (tenant, id, json) VALUES (?1, ?2, ?3)
                 ON CONFLICT (tenant) DO UPDATE SET id = excluded.id, json = excluded.json",
                params![tenant, id, json],
            )?;
            Ok(())
        })
        .await
    }

    async fn rollback(&self, tenant: &TenantId) -> Result<Option<Rollback>> {
        let tenant = tenant.to_string();
        self.with(move |c| {
            let json: Option<String> = c
                .query_row(
                    "SELECT json FROM rollbacks WHERE tenant = ?1",
                    [&tenant],
                    |r| r.get(0),
                )
                .optional()?;
            json.map(|j| {
                let order: Rollback = decode("rollback order", &j)?;
                check_version("rollback order", order.schema_version)?;
                Ok(order)
            })
            .transpose()
        })
        .await
    }

    async fn settle_rollback(&self, order: &Rollback) -> Result<bool> {
        let json = encode("rollback order", order)?;
        let (tenant, id) = (order.tenant.to_string(), order.id.clone());
        self.with(move |c| {
            let written = c.execute(
                "UPDATE rollbacks SET json = ?3 WHERE tenant = ?1 AND id = ?2",
                params![tenant, id, json],
            )?;
            Ok(written == 1)
        })
        .await
    }

    async fn record_gate_decision(&self, decision: &GateDecision) -> Result<()> {
        let json = encode("gate decision", decision)?;
        let tenant = decision.tenant.to_string();
        self.with(move |c| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO gate_decisions (tenant, json) VALUES (?1, ?2)",
                params![tenant, json],
            )?;
            tx.execute(
                "DELETE FROM gate_decisions WHERE tenant = ?1 AND seq NOT IN
                 (SELECT seq FROM gate_decisions WHERE tenant = ?1 ORDER BY seq DESC LIMIT ?2)",
                params![tenant, GATE_DECISIONS_KEPT as i64],
            )?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn gate_decisions(&self, tenant: &TenantId, limit: usize) -> Result<Vec<GateDecision>> {
        let tenant = tenant.to_string();
        let limit = limit.min(GATE_DECISIONS_KEPT) as i64;
        self.with(move |c| {
            let mut statement = c.prepare(
                "SELECT json FROM gate_decisions WHERE tenant = ?1 ORDER BY seq DESC LIMIT ?2",
            )?;
            let json = statement
                .query_map(params![tenant, limit], |r| r.get::<_, String>(0))?
                .collect::<std::result::Result<Vec<_>, _>>()?;
            json.iter().map(|j| decode_gate_decision(j)).collect()
        })
        .await
    }
}
