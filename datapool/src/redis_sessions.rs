//! [`Sessions`] on Redis: each operation is one script ([`crate::redis_session_scripts`]) on
//! the tenant's slot — one round trip, atomic across every replica of a pool.

use async_trait::async_trait;

use crate::codec::parse_stored;
use crate::error::{Error, Result};
use crate::ids::{StepId, TenantId, TrajectoryId, UnixMs};
use crate::keys;
use crate::redis_session_scripts::{
    CALL_ABANDONED, COMPLETIONS_WRITTEN, FINISH, FINISH_IDLE, FORGET_CALL, JOIN,
    OVERDUE_COMPLETIONS, SET_EVALUATION_ONLY, STEP_DONE,
};
use crate::redis_store::RedisStore;
use crate::schema::CompletionReason;
use crate::sessions::{
    digest_hex, hash_hex, Anchor, Finish, Finishing, Join, Joined, KeyedSession, Matched, Previous,
    Sessions, StepDone, StepSlot, Timing, SESSION_KEY_TTL,
};

fn millis(timing: std::time::Duration) -> u64 {
    u64::try_from(timing.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn reason(what: &'static str, s: &str) -> Result<CompletionReason> {
    CompletionReason::parse(s).ok_or_else(|| Error::UnexpectedReply {
        what,
        detail: format!("completion reason {s:?}"),
    })
}

fn finishing(id: &str, why: &str, steps: i64) -> Result<Finishing> {
    Ok(Finishing {
        trajectory: parse_stored("finished trajectory id", id)?,
        reason: reason("finished trajectory", why)?,
        steps: u32::try_from(steps).unwrap_or(0),
    })
}

/// The `{trajectory, reason, steps}` rows a sweep script answers.
fn finishings(rows: &[(String, String, i64)]) -> Result<Vec<Finishing>> {
    rows.iter()
        .map(|(id, why, steps)| finishing(id, why, *steps))
        .collect()
}

fn number(what: &'static str, s: &str) -> Result<u32> {
    parse_stored(what, s)
}

type JoinReply = (
    String,
    i64,
    i64,
    String,
    String,
    String,
    String,
    String,
    String,
);

#[async_trait]
impl Sessions for RedisStore {
    async fn join(&self, join: &Join, timing: Timing) -> Result<Joined> {
        let tenant = &join.tenant;
        let (mode, anchor) = match &join.anchor {
            Anchor::Name(name) => ("name", name.clone()),
            Anchor::Trajectory(id) => ("traj", id.to_string()),
            Anchor::Prefixes(_) => ("stitch", String::new()),
            Anchor::New => ("new", String::new()),
        };
        let mut invocation = JOIN.key(keys::live(tenant));
        invocation
            .arg(keys::tenant_prefix(tenant))
            .arg(mode)
            .arg(anchor)
            .arg(join.open.to_string())
            .arg(join.call.map(|c| c.to_string()).unwrap_or_default())
            .arg(join.now.0)
            .arg(join.now.saturating_sub(timing.idle).0)
            .arg(millis(timing.retention()));
        if let Anchor::Prefixes(prefixes) = &join.anchor {
            for prefix in prefixes {
                invocation.arg(format!("{}:{}", hash_hex(prefix.hash), prefix.end));
            }
        }
        let (id, opened, ambiguous, next, last, covered, eval, m_end, m_ctx): JoinReply =
            invocation.invoke_async(&mut self.conn()).await?;
        let previous = match last.as_str() {
            "" => None,
            step => Some(Previous {
                step: parse_stored("last step id", step)?,
                covered: number("covered", &covered)?,
            }),
        };
        let matched = match m_end.as_str() {
            "" => None,
            end => Some(Matched {
                end: number("matched prefix end", end)?,
                context_rebuilt: m_ctx == "1",
            }),
        };
        Ok(Joined {
            trajectory: parse_stored("live trajectory id", &id)?,
            opened: opened == 1,
            ambiguous: ambiguous == 1,
            previous,
            matched,
            evaluation_only: eval == "1",
            next_index: number("next index", &next)?,
        })
    }

    async fn step_done(&self, done: &StepDone, timing: Timing) -> Result<StepSlot> {
        let tenant = &done.tenant;
        let mut invocation = STEP_DONE.key(keys::live(tenant));
        invocation
            .arg(keys::tenant_prefix(tenant))
            .arg(done.trajectory.to_string())
            .arg(done.step.to_string())
            .arg(done.covered)
            .arg(done.now.0)
            .arg(done.now.saturating_sub(timing.stale_call).0)
            .arg(millis(timing.retention()))
            .arg(
                done.finish
                    .map(CompletionReason::as_str)
                    .unwrap_or_default(),
            )
            .arg(if done.answered { "1" } else { "0" })
            .arg(timing.completion_due(done.now).0);
        for key in &done.keys {
            invocation.arg(format!(
                "{}:{}",
                hash_hex(key.hash),
                u8::from(key.context_rebuilt)
            ));
        }
        let (index, why, steps): (i64, String, i64) =
            invocation.invoke_async(&mut self.conn()).await?;
        let finishing = match why.as_str() {
            "" => None,
            why => Some(finishing(&done.trajectory.to_string(), why, steps)?),
        };
        Ok(StepSlot {
            index: u32::try_from(index).ok(),
            finishing,
        })
    }

    async fn forget_call(
        &self,
        tenant: &TenantId,
        call: &StepId,
        now: UnixMs,
        timing: Timing,
    ) -> Result<Option<Finishing>> {
        // JOIN leaves which trajectory a call joined under the call's id (STEP_DONE and
        // CALL_ABANDONED take it away).
        let (trajectory, why, steps): (String, String, i64) = FORGET_CALL
            .key(keys::live(tenant))
            .arg(keys::tenant_prefix(tenant))
            .arg(call.to_string())
            .arg(now.saturating_sub(timing.stale_call).0)
            .arg(millis(timing.retention()))
            .arg(timing.completion_due(now).0)
            .invoke_async(&mut self.conn())
            .await?;
        match why.as_str() {
            "" => Ok(None),
            why => finishing(&trajectory, why, steps).map(Some),
        }
    }

    async fn call_abandoned(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
        call: &StepId,
        now: UnixMs,
        timing: Timing,
    ) -> Result<Option<Finishing>> {
        let (why, steps): (String, i64) = CALL_ABANDONED
            .key(keys::live(tenant))
            .arg(keys::tenant_prefix(tenant))
            .arg(trajectory.to_string())
            .arg(call.to_string())
            .arg(now.0)
            .arg(now.saturating_sub(timing.stale_call).0)
            .arg(millis(timing.retention()))
            .arg(timing.completion_due(now).0)
            .invoke_async(&mut self.conn())
            .await?;
        match why.as_str() {
            "" => Ok(None),
            why => finishing(&trajectory.to_string(), why, steps).map(Some),
        }
    }

    async fn finish(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
        reason: CompletionReason,
        now: UnixMs,
        timing: Timing,
    ) -> Result<Finish> {
        let (outcome, why, steps): (i64, String, i64) = FINISH
            .key(keys::live(tenant))
            .arg(keys::tenant_prefix(tenant))
            .arg(trajectory.to_string())
            .arg(reason.as_str())
            .arg(now.saturating_sub(timing.stale_call).0)
            .arg(millis(timing.retention()))
            .arg(timing.completion_due(now).0)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(match outcome {
            0 => Finish::NotLive,
            1 => Finish::Deferred,
            _ => Finish::Now(finishing(&trajectory.to_string(), &why, steps)?),
        })
    }

    async fn finish_idle(
        &self,
        tenant: &TenantId,
        now: UnixMs,
        timing: Timing,
        limit: usize,
    ) -> Result<Vec<Finishing>> {
        let finished: Vec<(String, String, i64)> = FINISH_IDLE
            .key(keys::live(tenant))
            .arg(keys::tenant_prefix(tenant))
            .arg(now.saturating_sub(timing.idle).0)
            .arg(now.saturating_sub(timing.stale_call).0)
            .arg(limit)
            .arg(millis(timing.retention()))
            .arg(timing.completion_due(now).0)
            .invoke_async(&mut self.conn())
            .await?;
        finishings(&finished)
    }

    async fn overdue_completions(
        &self,
        tenant: &TenantId,
        now: UnixMs,
        timing: Timing,
        limit: usize,
    ) -> Result<Vec<Finishing>> {
        let overdue: Vec<(String, String, i64)> = OVERDUE_COMPLETIONS
            .key(keys::live(tenant))
            .arg(keys::tenant_prefix(tenant))
            .arg(now.0)
            .arg(limit)
            .arg(timing.completion_due(now).0)
            .invoke_async(&mut self.conn())
            .await?;
        finishings(&overdue)
    }

    async fn completions_written(
        &self,
        tenant: &TenantId,
        trajectories: &[TrajectoryId],
    ) -> Result<()> {
        if trajectories.is_empty() {
            return Ok(());
        }
        let mut invocation = COMPLETIONS_WRITTEN.key(keys::live(tenant));
        invocation.arg(keys::tenant_prefix(tenant));
        for id in trajectories {
            invocation.arg(id.to_string());
        }
        let _: i64 = invocation.invoke_async(&mut self.conn()).await?;
        Ok(())
    }

    async fn is_live(&self, tenant: &TenantId, trajectory: &TrajectoryId) -> Result<bool> {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(keys::live_trajectory(tenant, trajectory))
            .query_async(&mut self.conn())
            .await?;
        Ok(exists == 1)
    }

    async fn set_evaluation_only(
        &self,
        tenant: &TenantId,
        trajectory: &TrajectoryId,
    ) -> Result<bool> {
        let set: i64 = SET_EVALUATION_ONLY
            .key(keys::live(tenant))
            .arg(keys::tenant_prefix(tenant))
            .arg(trajectory.to_string())
            .invoke_async(&mut self.conn())
            .await?;
        Ok(set == 1)
    }

    async fn put_session_key(&self, digest: &[u8; 32], session: &KeyedSession) -> Result<()> {
        // Not tenant-tagged: the call that presents the key does not know its tenant yet.
        let _: () = redis::cmd("SET")
            .arg(keys::session_key(&digest_hex(digest)))
            .arg(format!("{}|{}", session.tenant, session.trajectory))
            .arg("PX")
            .arg(millis(SESSION_KEY_TTL))
            .query_async(&mut self.conn())
            .await?;
        Ok(())
    }

    async fn session_key(&self, digest: &[u8; 32]) -> Result<Option<KeyedSession>> {
        let value: Option<String> = redis::cmd("GETEX")
            .arg(keys::session_key(&digest_hex(digest)))
            .arg("PX")
            .arg(millis(SESSION_KEY_TTL))
            .query_async(&mut self.conn())
            .await?;
        let Some(value) = value else {
            return Ok(None);
        };
        let bad = || Error::UnexpectedReply {
            what: "session key",
            detail: format!("{value:?}"),
        };
        let (tenant, trajectory) = value.split_once('|').ok_or_else(bad)?;
        Ok(Some(KeyedSession {
            tenant: TenantId::new(tenant)?,
            trajectory: parse_stored("session key trajectory", trajectory)?,
        }))
    }

    async fn live_tenants(&self) -> Result<Vec<TenantId>> {
        // The index of tenants with data: a tenant's first trajectory header is written long
        // before anything of it can be idle.
        crate::Store::tenants(self).await
    }
}
