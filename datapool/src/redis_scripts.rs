//! The Lua scripts of [`crate::RedisStore`]: the state transitions that must be atomic across
//! several keys of one tenant (all on one cluster slot thanks to the hash tag). Each declares
//! every key it touches in `KEYS`, as Redis Cluster requires.

use std::sync::LazyLock;

use redis::Script;

/// What a finished trajectory makes ready, shared by [`COMPLETE`] and [`SETTLE_PENDING`].
/// KEYS: traj hash, ready stream, group hash, group finished set, open groups zset.
/// Returns 1 finished, 2 enqueued the trajectory, 3 the group.
const ENQUEUE: &str = r#"
local function enqueue(id, status, at, group, maxlen)
  if group == '' then
    if status == 'completed' then
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'kind', 'trajectory', 'id', id)
      return 2
    end
    return 1
  end
  redis.call('SADD', KEYS[4], id)
  local size = tonumber(redis.call('HGET', KEYS[3], 'size'))
  if size and redis.call('HGET', KEYS[3], 'state') == 'open'
     and redis.call('SCARD', KEYS[4]) >= size then
    redis.call('HSET', KEYS[3], 'state', 'ready', 'settled_at', at)
    redis.call('ZREM', KEYS[5], group)
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'kind', 'group', 'id', group)
    return 3
  end
  return 1
end
"#;

/// Finishes a trajectory and enqueues what became ready. One whose header is not written yet, or
/// that holds fewer steps than expected (another replica's writes still on their way), keeps its
/// completion as pending, indexed by when it finished, and [`SETTLE_PENDING`] enqueues it when
/// they arrive.
/// KEYS: as [`ENQUEUE`], then the waiting completions zset. ARGV: traj id, status, at ms,
/// completion JSON, group id or "", ready MAXLEN, steps expected (0: any).
/// Returns 0 already finished, 1-3 as [`ENQUEUE`], 4 pending.
pub(crate) static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{ENQUEUE}{}",
        r#"
local current = redis.call('HGET', KEYS[1], 'status')
if current and current ~= 'open' then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'completed_at', ARGV[3], 'completion', ARGV[4])
if redis.call('HEXISTS', KEYS[1], 'json') == 0
   or (tonumber(redis.call('HGET', KEYS[1], 'steps')) or 0) < tonumber(ARGV[7]) then
  redis.call('HSET', KEYS[1], 'pending', '1', 'expect', ARGV[7])
  redis.call('ZADD', KEYS[6], ARGV[3], ARGV[1])
  return 4
end
return enqueue(ARGV[1], ARGV[2], ARGV[3], ARGV[5], ARGV[6])
"#
    ))
});

/// Enqueues a pending completion once its trajectory's header and expected steps are written
/// (or, overdue, once the header is: the steps it has are all it gets).
/// KEYS: as [`COMPLETE`]. ARGV: traj id, group id or "", ready MAXLEN, "1" when overdue.
/// Returns 0 when it still waits (or nothing was pending), else as [`ENQUEUE`].
pub(crate) static SETTLE_PENDING: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{ENQUEUE}{}",
        r#"
if redis.call('HGET', KEYS[1], 'pending') ~= '1' then
  redis.call('ZREM', KEYS[6], ARGV[1])
  return 0
end
if redis.call('HEXISTS', KEYS[1], 'json') == 0 then
  -- Only the header's write settles it; the overdue sweep need not look at it again.
  if ARGV[4] == '1' then redis.call('ZREM', KEYS[6], ARGV[1]) end
  return 0
end
local f = redis.call('HMGET', KEYS[1], 'status', 'completed_at', 'steps', 'expect')
if ARGV[4] ~= '1' and (tonumber(f[3]) or 0) < (tonumber(f[4]) or 0) then return 0 end
redis.call('HDEL', KEYS[1], 'pending', 'expect')
redis.call('ZREM', KEYS[6], ARGV[1])
return enqueue(ARGV[1], f[1], f[2], ARGV[2], ARGV[3])
"#
    ))
});

/// Settles an open group as partial (its timeout passed) and enqueues it.
/// KEYS: group hash, open groups zset, ready stream. ARGV: group id, at ms, ready MAXLEN.
/// Returns 1 when it settled the group, 0 when the group was no longer open.
pub(crate) static EXPIRE_GROUP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'partial', 'settled_at', ARGV[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'kind', 'group', 'id', ARGV[1])
return 1
"#,
    )
});

/// Moves one pending ready entry to the dead letters; only the caller whose XACK took it writes
/// the dead letter, so racing trainers do not write it twice.
/// KEYS: ready stream, dead-letter stream. ARGV: consumer group, entry id, last consumer,
/// deliveries, at ms. Returns 1 when it dead-lettered the entry, 0 when another caller did or
/// the entry was trimmed away.
pub(crate) static DEAD_LETTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local entry = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
-- An entry trimmed from the stream (MAXLEN) has nothing left to keep: acking it is enough.
if not entry[1] then return 0 end
local kind, id = '', ''
local f = entry[1][2]
for i = 1, #f, 2 do
  if f[i] == 'kind' then kind = f[i + 1] elseif f[i] == 'id' then id = f[i + 1] end
end
redis.call('XADD', KEYS[2], '*', 'ready_id', ARGV[2], 'kind', kind, 'id', id,
  'deliveries', ARGV[4], 'consumer', ARGV[3], 'dead_at', ARGV[5])
return 1
"#,
    )
});

/// Deletes one trajectory to bring its tenant under a cap, and gives its steps and bytes back.
/// KEYS: traj hash, steps stream, next-state hash, evaluations stream, usage hash, trajs zset.
/// ARGV: traj id. Returns the tenant's usage after the deletion: {steps, bytes}.
pub(crate) static TRIM_TRAJECTORY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local c = redis.call('HMGET', KEYS[1], 'steps', 'bytes')
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
redis.call('ZREM', KEYS[6], ARGV[1])
local s, b = tonumber(c[1]) or 0, tonumber(c[2]) or 0
if s ~= 0 then redis.call('HINCRBY', KEYS[5], 'steps', -s) end
if b ~= 0 then redis.call('HINCRBY', KEYS[5], 'bytes', -b) end
local u = redis.call('HMGET', KEYS[5], 'steps', 'bytes')
return {tonumber(u[1]) or 0, tonumber(u[2]) or 0}
"#,
    )
});

/// Writes a field a trajectory's bytes count (its header, a step's next state) and counts the
/// change in its length against the trajectory and the tenant.
/// KEYS: the hash holding the field, the trajectory hash, the tenant's usage hash.
/// ARGV: field, value. Returns the tenant's `{steps, bytes}` after.
pub(crate) static PUT_COUNTED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local delta = #ARGV[2] - redis.call('HSTRLEN', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if delta ~= 0 then
  redis.call('HINCRBY', KEYS[2], 'bytes', delta)
  redis.call('HINCRBY', KEYS[3], 'bytes', delta)
end
local u = redis.call('HMGET', KEYS[3], 'steps', 'bytes')
return {tonumber(u[1]) or 0, tonumber(u[2]) or 0}
"#,
    )
});

/// Replaces a rollback order with its settled self, unless a newer order replaced it.
/// KEYS: rollback key. ARGV: the order's id, the settled order's JSON. Returns 1 when written.
pub(crate) static SETTLE_ROLLBACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
if cjson.decode(current)['id'] ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"#,
    )
});

/// Makes a policy live unless a newer one already is, and publishes the switch.
/// KEYS: policy hash. ARGV: version, policy JSON, notification channel.
/// The same version replaces the record (a canary started or ended) unless it is the same.
/// Returns -2 when it switched, -1 when that record was already live, else the newer live version.
pub(crate) static SET_POLICY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local live = tonumber(redis.call('HGET', KEYS[1], 'version'))
local v = tonumber(ARGV[1])
if live and live > v then return live end
if live and live == v and redis.call('HGET', KEYS[1], 'json') == ARGV[2] then return -1 end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'json', ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[2])
return -2
"#,
    )
});
