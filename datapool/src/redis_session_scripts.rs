//! The Lua scripts of [`crate::Sessions`] on Redis: every session transition is one script, so
//! replicas racing on a session see it change whole.
//!
//! Each script gets the tenant's key prefix (`clawback:{t}:`) as `ARGV[1]` and derives from it
//! the keys of the trajectories it finds by name or stitching key — which it cannot know in
//! advance. Every such key carries the tenant's hash tag, so it is on the slot of the declared
//! key (`KEYS[1]`, the tenant's live index): a Redis Cluster node serves them from the script.
//!
//! Layout (see [`crate::keys`]): `live` zset (trajectory → last call, ms); `live:{id}` hash
//! (`next` index, `last` step, `covered`, `eval`, `after` = a completion waiting for calls,
//! `name`, `keys` = its stitching keys, `c:{step}` = a call in flight since ms); `name:{name}` →
//! trajectory id; `stitch:{hash}` → `{trajectory}|{context_rebuilt}`, or `*{n}|…` when `n`
//! trajectories hold it; `finished:{id}` → `{reason}|{steps}|{last step}` for a while after a
//! trajectory was finished; `completing` zset (trajectory → when its completion is overdue, ms)
//! and `completing:why` hash (trajectory → `{reason}|{steps}`): finished trajectories whose
//! completion the finishing replica has not reported written yet. Every key but the two indexes
//! and `completing:why` expires after the retention time unless touched.
//!
//! A caller whose connection broke after a script ran but before its reply arrived asks again:
//! every script answers a repeat as it answered the first time (a step already numbered keeps
//! its index, a finished trajectory is reported finished to whoever asks about it), so retrying
//! never loses a completion nor numbers a step twice.

use std::sync::LazyLock;

use redis::Script;

/// Helpers every session script starts with.
const COMMON: &str = r#"
local P = ARGV[1]
local LIVE = KEYS[1]
local function live_key(id) return P .. 'live:' .. id end
local function stitch_key(k) return P .. 'stitch:' .. k end
-- A call in flight on trajectory `id` (hash `h`): marked there, and its trajectory left under
-- the call's id so that a caller who lost JOIN's answer can still take the mark away.
local function in_flight(id, h, call, now, ttl)
  redis.call('HSET', h, 'c:' .. call, now)
  redis.call('SET', P .. 'call:' .. call, id, 'PX', ttl)
end
local function split(v, sep)
  local at = string.find(v, sep, 1, true)
  return string.sub(v, 1, at - 1), string.sub(v, at + 1)
end
local function busy(h, stale_before)
  local f = redis.call('HGETALL', h)
  for i = 1, #f, 2 do
    if string.sub(f[i], 1, 2) == 'c:' and tonumber(f[i + 1]) >= stale_before then
      return true
    end
  end
  return false
end
local function release_keys(id, h)
  local held = redis.call('HGET', h, 'keys')
  if not held then return end
  for k in string.gmatch(held, '%S+') do
    local sk = stitch_key(k)
    local v = redis.call('GET', sk)
    if v then
      local holder, ctx = split(v, '|')
      if holder == id then
        redis.call('DEL', sk)
      elseif string.sub(holder, 1, 1) == '*' then
        local n = tonumber(string.sub(holder, 2))
        if n <= 1 then
          redis.call('DEL', sk)
        else
          redis.call('SET', sk, '*' .. (n - 1) .. '|' .. ctx, 'KEEPTTL')
        end
      end
    end
  end
  redis.call('HDEL', h, 'keys')
end
local function finish_now(id, h, reason, ttl, due)
  release_keys(id, h)
  local name = redis.call('HGET', h, 'name')
  if name then
    local nk = P .. 'name:' .. name
    if redis.call('GET', nk) == id then redis.call('DEL', nk) end
  end
  local steps = tonumber(redis.call('HGET', h, 'next')) or 0
  local last = redis.call('HGET', h, 'last') or ''
  redis.call('DEL', h)
  redis.call('ZREM', LIVE, id)
  -- What a caller whose reply was lost finds when it asks again.
  redis.call('SET', P .. 'finished:' .. id, reason .. '|' .. steps .. '|' .. last, 'PX', ttl)
  -- Taken over by another replica's sweep unless the finisher reports it written by `due`.
  redis.call('ZADD', P .. 'completing', due, id)
  redis.call('HSET', P .. 'completing:why', id, reason .. '|' .. steps)
  return {id, reason, steps}
end
local function finished(id)
  local v = redis.call('GET', P .. 'finished:' .. id)
  if not v then return nil end
  local reason, rest = split(v, '|')
  local steps, last = split(rest, '|')
  return reason, tonumber(steps), last
end
local function touch(id, h, now, ttl)
  redis.call('ZADD', LIVE, now, id)
  redis.call('PEXPIRE', h, ttl)
  local name = redis.call('HGET', h, 'name')
  if name then redis.call('PEXPIRE', P .. 'name:' .. name, ttl) end
end
"#;

fn script(body: &str) -> Script {
    Script::new(&format!("{COMMON}{body}"))
}

/// ARGV: prefix, mode (`name`/`traj`/`stitch`/`new`), anchor, open id, call step id or "", now,
/// idle_before, ttl, then for `stitch` the prefixes `{hash}:{end}`, shortest first.
/// Returns {trajectory, opened 0/1, ambiguous 0/1, next, last step or "", covered, eval or "",
/// matched end or "", matched context_rebuilt or ""}.
pub(crate) static JOIN: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local mode, anchor, open, call = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now, idle_before, ttl = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local found, m_end, m_ctx, ambiguous = nil, '', '', 0
if redis.call('EXISTS', live_key(open)) == 1 then
  -- The trajectory this join asked to open is live already: a retry of the join.
  found = open
elseif mode == 'name' then
  local id = redis.call('GET', P .. 'name:' .. anchor)
  if id and redis.call('EXISTS', live_key(id)) == 1 then found = id end
elseif mode == 'traj' then
  if redis.call('EXISTS', live_key(anchor)) == 1 then found = anchor end
elseif mode == 'stitch' then
  -- Only the longest matching prefix decides.
  for i = #ARGV, 9, -1 do
    local k, e = split(ARGV[i], ':')
    local v = redis.call('GET', stitch_key(k))
    if v then
      local holder, ctx = split(v, '|')
      if string.sub(holder, 1, 1) == '*' then
        ambiguous = 1
      else
        local seen = redis.call('ZSCORE', LIVE, holder)
        if seen and tonumber(seen) >= idle_before
           and redis.call('EXISTS', live_key(holder)) == 1 then
          found, m_end, m_ctx = holder, e, ctx
        end
      end
      break
    end
  end
end
if found then
  local h = live_key(found)
  if call ~= '' then in_flight(found, h, call, now, ttl) end
  touch(found, h, now, ttl)
  local f = redis.call('HMGET', h, 'next', 'last', 'covered', 'eval')
  -- The trajectory this join asked to open: a retry whose first answer was lost, and its
  -- header is still the caller's to write.
  local opened = (found == open) and 1 or 0
  return {found, opened, 0, f[1] or '0', f[2] or '', f[3] or '0', f[4] or '', m_end, m_ctx}
end
local h = live_key(open)
redis.call('HSET', h, 'next', 0, 'covered', 0)
if call ~= '' then in_flight(open, h, call, now, ttl) end
if mode == 'name' then
  redis.call('SET', P .. 'name:' .. anchor, open, 'PX', ttl)
  redis.call('HSET', h, 'name', anchor)
end
touch(open, h, now, ttl)
return {open, 1, ambiguous, '0', '', '0', '', '', ''}
"#,
    )
});

/// ARGV: prefix, trajectory, step, covered, now, stale_before, ttl, finish reason or "",
/// answered 1/0, completion due, then the step's stitching keys `{hash}:{context_rebuilt}`.
/// Returns {index (-1: not live), finishing reason or "", steps}.
pub(crate) static STEP_DONE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local id, step = ARGV[2], ARGV[3]
local now, stale_before, ttl = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local h = live_key(id)
redis.call('HDEL', h, 'c:' .. step)
redis.call('DEL', P .. 'call:' .. step)
if redis.call('EXISTS', h) == 0 then
  local reason, steps, last = finished(id)
  if reason and last == step then return {steps - 1, reason, steps} end
  return {-1, '', 0}
end
if redis.call('HGET', h, 'last') == step then
  return {tonumber(redis.call('HGET', h, 'next')) - 1, '', 0}
end
-- Asked again for a step without an answer (its first reply lost): the index it was given.
local numbered = redis.call('HGET', h, 'u:' .. step)
if numbered then return {tonumber(numbered), '', 0} end
local index = redis.call('HINCRBY', h, 'next', 1) - 1
local answered = ARGV[9] == '1'
if answered then
  redis.call('HSET', h, 'last', step, 'covered', ARGV[4])
else
  redis.call('HSET', h, 'u:' .. step, index)
end
if ARGV[8] ~= '' then redis.call('HSETNX', h, 'after', ARGV[8]) end
local after = redis.call('HGET', h, 'after')
if after and not busy(h, stale_before) then
  local f = finish_now(id, h, after, ttl, ARGV[10])
  return {index, f[2], f[3]}
end
if not answered then
  touch(id, h, now, ttl)
  return {index, '', 0}
end
-- The previous call's keys give way to this one's.
release_keys(id, h)
local held = {}
for i = 11, #ARGV do
  local k, ctx = split(ARGV[i], ':')
  local sk = stitch_key(k)
  local v = redis.call('GET', sk)
  if not v then
    redis.call('SET', sk, id .. '|' .. ctx, 'PX', ttl)
  else
    local holder, hctx = split(v, '|')
    if holder == id then
      redis.call('PEXPIRE', sk, ttl)
    elseif string.sub(holder, 1, 1) == '*' then
      redis.call('SET', sk, '*' .. (tonumber(string.sub(holder, 2)) + 1) .. '|' .. hctx, 'PX', ttl)
    else
      redis.call('SET', sk, '*2|' .. hctx, 'PX', ttl)
    end
  end
  held[#held + 1] = k
end
if #held > 0 then redis.call('HSET', h, 'keys', table.concat(held, ' ')) end
touch(id, h, now, ttl)
return {index, '', 0}
"#,
    )
});

/// ARGV: prefix, call, stale_before, ttl, completion due.
/// Returns {trajectory or "", finishing reason or "", steps}: the live trajectory the call was
/// marked on, and what taking the mark away finished.
pub(crate) static FORGET_CALL: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local call = ARGV[2]
local k = P .. 'call:' .. call
local id = redis.call('GET', k)
if not id then return {'', '', 0} end
redis.call('DEL', k)
local h = live_key(id)
if redis.call('EXISTS', h) == 0 then return {'', '', 0} end
redis.call('HDEL', h, 'c:' .. call)
local after = redis.call('HGET', h, 'after')
if after and not busy(h, tonumber(ARGV[3])) then
  local f = finish_now(id, h, after, ARGV[4], ARGV[5])
  return {id, f[2], f[3]}
end
return {id, '', 0}
"#,
    )
});

/// ARGV: prefix, trajectory, step, now, stale_before, ttl, completion due.
/// Returns {finishing reason or "", steps}.
pub(crate) static CALL_ABANDONED: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local id = ARGV[2]
local h = live_key(id)
redis.call('HDEL', h, 'c:' .. ARGV[3])
redis.call('DEL', P .. 'call:' .. ARGV[3])
if redis.call('EXISTS', h) == 0 then
  local reason, steps = finished(id)
  if reason then return {reason, steps} end
  return {'', 0}
end
touch(id, h, tonumber(ARGV[4]), ARGV[6])
local after = redis.call('HGET', h, 'after')
if after and not busy(h, tonumber(ARGV[5])) then
  local f = finish_now(id, h, after, ARGV[6], ARGV[7])
  return {f[2], f[3]}
end
return {'', 0}
"#,
    )
});

/// ARGV: prefix, trajectory, reason, stale_before, ttl, completion due.
/// Returns {0 not live / 1 deferred / 2 finished, reason, steps}: a trajectory finished a
/// moment ago is reported finished again (its completion is written again, which changes
/// nothing), so a caller that lost the first answer still writes it.
pub(crate) static FINISH: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local id = ARGV[2]
local h = live_key(id)
if redis.call('EXISTS', h) == 0 then
  local reason, steps = finished(id)
  if reason then return {2, reason, steps} end
  return {0, '', 0}
end
if busy(h, tonumber(ARGV[4])) then
  redis.call('HSETNX', h, 'after', ARGV[3])
  return {1, '', 0}
end
local f = finish_now(id, h, redis.call('HGET', h, 'after') or ARGV[3], ARGV[5], ARGV[6])
return {2, f[2], f[3]}
"#,
    )
});

/// ARGV: prefix, idle_before, stale_before, limit, ttl, completion due.
/// Returns {{trajectory, reason, steps}, ...}.
pub(crate) static FINISH_IDLE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ids = redis.call('ZRANGEBYSCORE', LIVE, '-inf', '(' .. ARGV[2], 'LIMIT', 0, ARGV[4])
local out = {}
for _, id in ipairs(ids) do
  local h = live_key(id)
  if redis.call('EXISTS', h) == 0 then
    -- Its state expired (the whole pool was down past the retention): finish it all the same.
    redis.call('ZREM', LIVE, id)
    redis.call('ZADD', P .. 'completing', ARGV[6], id)
    redis.call('HSET', P .. 'completing:why', id, 'idle_timeout|0')
    out[#out + 1] = {id, 'idle_timeout', 0}
  elseif not busy(h, tonumber(ARGV[3])) then
    out[#out + 1] = finish_now(id, h, redis.call('HGET', h, 'after') or 'idle_timeout', ARGV[5], ARGV[6])
  end
end
return out
"#,
    )
});

/// Hands the caller completions overdue at `now` (their finisher never reported them written),
/// each due again a lease later. ARGV: prefix, now, limit, completion due.
/// Returns {{trajectory, reason, steps}, ...}.
pub(crate) static OVERDUE_COMPLETIONS: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ids = redis.call('ZRANGEBYSCORE', P .. 'completing', '-inf', '(' .. ARGV[2], 'LIMIT', 0, ARGV[3])
local out = {}
for _, id in ipairs(ids) do
  redis.call('ZADD', P .. 'completing', ARGV[4], id)
  local why = redis.call('HGET', P .. 'completing:why', id) or 'idle_timeout|0'
  local reason, steps = split(why, '|')
  out[#out + 1] = {id, reason, tonumber(steps)}
end
return out
"#,
    )
});

/// Forgets completions their finisher has written. ARGV: prefix, then trajectory ids.
pub(crate) static COMPLETIONS_WRITTEN: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
for i = 2, #ARGV do
  redis.call('ZREM', P .. 'completing', ARGV[i])
  redis.call('HDEL', P .. 'completing:why', ARGV[i])
end
return 0
"#,
    )
});

/// ARGV: prefix, trajectory. Returns 1 when it was live.
pub(crate) static SET_EVALUATION_ONLY: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local h = live_key(ARGV[2])
if redis.call('EXISTS', h) == 0 then return 0 end
redis.call('HSET', h, 'eval', '1')
return 1
"#,
    )
});
