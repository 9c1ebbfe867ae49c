//! The Lua scripts and key layout of the read-write lock and the
//! semaphore (the mutex's are in `scripts.rs` and `names.rs`).
//!
//! Every key of one lock carries the mutex's hash tag `{<key>}`, so a
//! cluster serves each script on one slot; each shape has its own suffix
//! (`:rw:`, `:sem:`), so a mutex, a read-write lock and a semaphore of the
//! same name are three different locks. Expiry is the server's clock
//! (`TIME` inside the script; scripts replicate by effects, Redis >= 5), so
//! a member's score is the server instant at which its share ends.

use std::sync::LazyLock;
#[cfg(test)]
use std::time::Duration;

use lock_core::{LeaseKind, LockKey, LockShape};

use crate::keys::names::{KeyNames, holder_key};
use crate::keys::scripts::LuaScript;

/// The Lua helpers every script starts with: `now` (server ms), `fmt`,
/// `sweep` (drop members whose expiry passed, and the same members from
/// companion keys), `put_share` (a share's holder details in its shape's
/// details hash; nothing without details) and `keep` (expire keys with the
/// latest member: one absolute instant, `PEXPIREAT`, for every key; a
/// relative `PEXPIRE` per key is counted from the server's clock at each
/// call, which Redis 7.0 does not freeze inside a script, so a key set a
/// millisecond later (a details hash after its readers set) outlived it).
macro_rules! prelude {
    () => {
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function fmt(n) return string.format('%.0f', n) end
local function sweep(z, companions)
  local gone = redis.call('ZRANGEBYSCORE', z, '-inf', now)
  if #gone == 0 then return 0 end
  redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
  for _, c in ipairs(companions) do
    for i = 1, #gone, 1000 do
      redis.call(c[1], c[2], unpack(gone, i, math.min(i + 999, #gone)))
    end
  end
  return #gone
end
local function put_share(h, owner, details)
  if details and details ~= '' then redis.call('HSET', h, owner, details) end
end
local function keep(z, keys)
  local last = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  if #last == 0 then
    for _, k in ipairs(keys) do redis.call('DEL', k) end
    return
  end
  local at = tonumber(last[2])
  if at < now + 1 then at = now + 1 end
  for _, k in ipairs(keys) do redis.call('PEXPIREAT', k, fmt(at)) end
end
"
    };
}
pub(crate) use prelude;

/// KEYS: writer, readers, queue, queue expiries, counters, readers'
/// details, writer's details.
/// ARGV: owner, ttl ms, `r` | `w`, wait ms (above 0: register as a waiting
/// writer for that long when refused; `0`: a try), channel, holder details
/// (`HolderDetails::encode_current`; empty: none).
///
/// Returns `{1, token}` granted, `{0, ms}` refused (`ms`: when the blocker
/// ends at the latest).
///
/// - A reader is refused while a writer holds, or while any live writer
///   waits (writer preference); otherwise it joins the readers set scored
///   by its own expiry and gets the epoch (the last write token, 0 if none).
/// - A writer is granted when there is no writer, no live reader, and no
///   waiting writer ahead of it (the queue is ordered by arrival); the
///   token is `HINCRBY token`, above every earlier grant, and becomes the
///   epoch.
/// - A resent script (same owner) finds its own grant and returns it.
/// - Every grant writes its holder details in the same call: a reader's in
///   the readers' details hash (field = owner, expiring with the readers
///   set, swept with its member), the writer's in the side key
///   `<writer>:holder` as the mutex does (`<owner> <details>`, with the
///   writer's `PX`).
const RW_ACQUIRE: &str = concat!(
    prelude!(),
    crate::keys::scripts::grant_fns!(),
    r"
local owner, ttl, kind, wait = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local swept = sweep(KEYS[4], {{'ZREM', KEYS[3]}}) + sweep(KEYS[2], {{'HDEL', KEYS[6]}})
if swept > 0 then redis.call('PUBLISH', ARGV[5], '1') end
local function epoch() return tonumber(redis.call('HGET', KEYS[5], 'epoch') or '0') end
local writer = redis.call('GET', KEYS[1])
if kind == 'r' then
  if redis.call('ZSCORE', KEYS[2], owner) then
    redis.call('ZADD', KEYS[2], 'XX', fmt(now + ttl), owner)
    put_share(KEYS[6], owner, ARGV[6])
    keep(KEYS[2], {KEYS[2], KEYS[6]})
    return {1, epoch()}
  end
  if writer then return {0, redis.call('PTTL', KEYS[1])} end
  local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  if #first > 0 then return {0, tonumber(first[2]) - now} end
  redis.call('ZADD', KEYS[2], fmt(now + ttl), owner)
  put_share(KEYS[6], owner, ARGV[6])
  keep(KEYS[2], {KEYS[2], KEYS[6]})
  return {1, epoch()}
end
if writer == owner then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  put_details(KEYS[1], KEYS[7], owner, ARGV[6], ARGV[2])
  return {1, epoch()}
end
local wait_ms
if writer then
  wait_ms = redis.call('PTTL', KEYS[1])
else
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if #last > 0 then
    wait_ms = tonumber(last[2]) - now
  else
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)
    if #head == 0 or head[1] == owner then
      local token = redis.call('HINCRBY', KEYS[5], 'token', 1)
      redis.call('HSET', KEYS[5], 'epoch', token)
      redis.call('SET', KEYS[1], owner, 'PX', ARGV[2])
      put_details(KEYS[1], KEYS[7], owner, ARGV[6], ARGV[2])
      if #head > 0 then
        redis.call('ZREM', KEYS[3], owner)
        redis.call('ZREM', KEYS[4], owner)
        keep(KEYS[4], {KEYS[4], KEYS[3]})
      end
      return {1, token}
    end
    wait_ms = tonumber(redis.call('ZSCORE', KEYS[4], head[1]) or now) - now
  end
end
if wait > 0 then
  if not redis.call('ZSCORE', KEYS[3], owner) then
    redis.call('ZADD', KEYS[3], redis.call('HINCRBY', KEYS[5], 'seq', 1), owner)
  end
  redis.call('ZADD', KEYS[4], fmt(now + wait), owner)
  keep(KEYS[4], {KEYS[4], KEYS[3]})
end
return {0, wait_ms}
"
);

/// KEYS: writer, readers, counters, readers' details, writer's details.
/// ARGV: owner, ttl ms, channel.
/// If `owner` is the writer: the writer entry goes and `owner` joins the
/// readers, in one step, keeping its token (the epoch) and its holder
/// details (moved from the writer's side key to the readers' hash).
/// `{1, token}` or `{0}` when `owner` is not the writer.
const RW_DOWNGRADE: &str = concat!(
    prelude!(),
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0} end
sweep(KEYS[2], {{'HDEL', KEYS[4]}})
local side = redis.call('GET', KEYS[5])
redis.call('DEL', KEYS[1], KEYS[5])
redis.call('ZADD', KEYS[2], fmt(now + tonumber(ARGV[2])), ARGV[1])
local mark = ARGV[1] .. ' '
if side and string.sub(side, 1, #mark) == mark then
  put_share(KEYS[4], ARGV[1], string.sub(side, #mark + 1))
end
keep(KEYS[2], {KEYS[2], KEYS[4]})
redis.call('PUBLISH', ARGV[3], '1')
return {1, tonumber(redis.call('HGET', KEYS[3], 'epoch') or '0')}
"
);

/// KEYS: writer, readers, queue, queue expiries, readers' details,
/// writer's details. ARGV: owner, channel.
/// Removes every trace of `owner` (grant with its details, or waiting
/// entry): the undo of an acquire that did not end with a lease. Returns
/// how many entries were removed (details not counted).
const RW_ABANDON: &str = r"
local n = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  n = n + redis.call('DEL', KEYS[1])
  redis.call('DEL', KEYS[6])
end
n = n + redis.call('ZREM', KEYS[2], ARGV[1]) + redis.call('ZREM', KEYS[3], ARGV[1])
  + redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
if n > 0 then redis.call('PUBLISH', ARGV[2], '1') end
return n
";

/// KEYS: `nz` sorted sets, then hashes. ARGV: owner, channel, nz.
/// Removes `owner` from all of them and publishes if anything went.
/// Returns 1 when `owner` was a live member of the first set (its share
/// had not expired), else 0.
const REMOVE: &str = concat!(
    prelude!(),
    r"
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
local live = s and tonumber(s) > now
local n = 0
local nz = tonumber(ARGV[3])
for i, k in ipairs(KEYS) do
  if i <= nz then n = n + redis.call('ZREM', k, ARGV[1])
  else n = n + redis.call('HDEL', k, ARGV[1]) end
end
if n > 0 then redis.call('PUBLISH', ARGV[2], '1') end
if live then return 1 end
return 0
"
);

/// KEYS: a sorted set of shares, then keys expiring with it. ARGV: owner,
/// ttl ms. Extends a live share (never one whose expiry passed); `1` or `0`.
const ZRENEW: &str = concat!(
    prelude!(),
    r"
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) <= now then return 0 end
redis.call('ZADD', KEYS[1], 'XX', fmt(now + tonumber(ARGV[2])), ARGV[1])
keep(KEYS[1], KEYS)
return 1
"
);

/// KEYS: writer, readers, counters, readers' details, writer's details.
/// Returns `{writer or '', writer pttl, epoch, writer's side key or '',
/// reader, ms, details or '', reader, ms, details...}` (live readers only).
const RW_HOLDERS: &str = concat!(
    prelude!(),
    r"
local out = {redis.call('GET', KEYS[1]) or '', redis.call('PTTL', KEYS[1]),
  tonumber(redis.call('HGET', KEYS[3], 'epoch') or '0'), redis.call('GET', KEYS[5]) or ''}
local rs = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. fmt(now), '+inf', 'WITHSCORES')
for i = 1, #rs, 2 do
  out[#out + 1] = rs[i]
  out[#out + 1] = tonumber(rs[i + 1]) - now
  out[#out + 1] = redis.call('HGET', KEYS[4], rs[i]) or ''
end
return out
"
);

/// KEYS: holders, counts, tokens, queue, queue expiries, counters, details.
/// ARGV: owner, ttl ms, count, limit, wait ms (above 0: join the queue for
/// that long when refused; `0`: a try), channel, holder details
/// (`HolderDetails::encode_current`; empty: none), written in the details
/// hash (field = owner) by the grant, expiring and swept with the holder.
///
/// Returns `{1, token}` granted, `{0, ms}` refused (`ms`: when the first
/// holder or waiter ends at the latest), `{-1, limit}` when the semaphore
/// is in use (holders or waiters) with another limit.
///
/// FIFO: a request is granted only when no waiter is queued before it (the
/// queue is ordered by arrival) and its count fits beside the permits
/// held; a waiting request joins the queue, so a large request at the head
/// is not overtaken by smaller later ones.
const SEM_ACQUIRE: &str = concat!(
    prelude!(),
    r"
local owner, ttl, count, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local swept = sweep(KEYS[1], {{'HDEL', KEYS[2]}, {'HDEL', KEYS[3]}, {'HDEL', KEYS[7]}})
  + sweep(KEYS[5], {{'ZREM', KEYS[4]}})
if swept > 0 then redis.call('PUBLISH', ARGV[6], '1') end
if redis.call('ZSCORE', KEYS[1], owner) then
  redis.call('ZADD', KEYS[1], 'XX', fmt(now + ttl), owner)
  put_share(KEYS[7], owner, ARGV[7])
  keep(KEYS[1], {KEYS[1], KEYS[2], KEYS[3], KEYS[7]})
  return {1, tonumber(redis.call('HGET', KEYS[3], owner) or '0')}
end
local busy = redis.call('ZCARD', KEYS[1]) > 0 or redis.call('ZCARD', KEYS[4]) > 0
local stored = redis.call('HGET', KEYS[6], 'limit')
if busy and stored and tonumber(stored) ~= limit then return {-1, tonumber(stored)} end
if not busy or not stored then redis.call('HSET', KEYS[6], 'limit', limit) end
local held = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do held = held + tonumber(v) end
local head = redis.call('ZRANGE', KEYS[4], 0, 0)
if (#head == 0 or head[1] == owner) and held + count <= limit then
  local token = redis.call('HINCRBY', KEYS[6], 'token', 1)
  redis.call('ZADD', KEYS[1], fmt(now + ttl), owner)
  redis.call('HSET', KEYS[2], owner, count)
  redis.call('HSET', KEYS[3], owner, token)
  put_share(KEYS[7], owner, ARGV[7])
  keep(KEYS[1], {KEYS[1], KEYS[2], KEYS[3], KEYS[7]})
  if #head > 0 then
    redis.call('ZREM', KEYS[4], owner)
    redis.call('ZREM', KEYS[5], owner)
    keep(KEYS[5], {KEYS[5], KEYS[4]})
    redis.call('PUBLISH', ARGV[6], '1')
  end
  return {1, token}
end
local wait = tonumber(ARGV[5])
if wait > 0 then
  if not redis.call('ZSCORE', KEYS[4], owner) then
    redis.call('ZADD', KEYS[4], redis.call('HINCRBY', KEYS[6], 'seq', 1), owner)
  end
  redis.call('ZADD', KEYS[5], fmt(now + wait), owner)
  keep(KEYS[5], {KEYS[5], KEYS[4]})
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #first == 0 then first = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES') end
if #first == 0 then return {0, 0} end
return {0, tonumber(first[2]) - now}
"
);

/// KEYS: holders, counts, tokens, counters, details. Returns `{limit,
/// owner, ms, count, token, details or '', ...}` (live holders only; limit
/// 0 when never used).
const SEM_HOLDERS: &str = concat!(
    prelude!(),
    r"
local out = {tonumber(redis.call('HGET', KEYS[4], 'limit') or '0')}
local hs = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. fmt(now), '+inf', 'WITHSCORES')
for i = 1, #hs, 2 do
  out[#out + 1] = hs[i]
  out[#out + 1] = tonumber(hs[i + 1]) - now
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[2], hs[i]) or '0')
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[3], hs[i]) or '0')
  out[#out + 1] = redis.call('HGET', KEYS[5], hs[i]) or ''
end
return out
"
);

/// The scripts of the shared shapes (read-write locks and semaphores),
/// hashed once per process. Each script's KEYS and ARGV are described at
/// its text in the source.
#[derive(Debug)]
pub struct SharedScripts {
    /// A read or write grant (or a waiting writer's entry).
    pub rw_acquire: LuaScript,
    /// A write lease turned into a read lease with the same token.
    pub rw_downgrade: LuaScript,
    /// Removes a read-write waiter's traces.
    pub rw_abandon: LuaScript,
    /// The writer and readers of a read-write lock.
    pub rw_holders: LuaScript,
    /// KEYS: holders, counts, tokens, queue, queue expiry, counters,
    /// details. ARGV: owner, ttl ms, count, limit, wait ms (`0`: a try),
    /// channel, details. `{1, token}` granted, `{0, _}` refused, `{-1,
    /// limit in use}` for another limit.
    pub sem_acquire: LuaScript,
    /// The permit holders of a semaphore.
    pub sem_holders: LuaScript,
    /// KEYS: `nz` sorted sets, then hashes. ARGV: owner, channel, `nz`.
    /// Removes a share (a reader, a permit holder, a waiter) from all of
    /// them and publishes: 1 when it was a live member of the first set.
    pub remove: LuaScript,
    /// Compare-and-renew of a share's expiry.
    pub zrenew: LuaScript,
}

/// The shared shapes' scripts.
pub static SHARED: LazyLock<SharedScripts> = LazyLock::new(|| SharedScripts {
    rw_acquire: LuaScript::new(RW_ACQUIRE),
    rw_downgrade: LuaScript::new(RW_DOWNGRADE),
    rw_abandon: LuaScript::new(RW_ABANDON),
    rw_holders: LuaScript::new(RW_HOLDERS),
    sem_acquire: LuaScript::new(SEM_ACQUIRE),
    sem_holders: LuaScript::new(SEM_HOLDERS),
    remove: LuaScript::new(REMOVE),
    zrenew: LuaScript::new(ZRENEW),
});

/// The Redis names of one read-write lock: `<prefix>{<key>}:rw:<part>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RwNames {
    /// The writer: a plain string (the owner) with PX.
    pub writer: String,
    /// Readers: sorted set, member = owner, score = its expiry (server ms).
    pub readers: String,
    /// Waiting writers by arrival (score = sequence number).
    pub queue: String,
    /// Waiting writers by expiry (score = server ms).
    pub queue_expiry: String,
    /// Hash kept forever: `token` (counter), `epoch` (last write token),
    /// `seq` (arrival counter).
    pub counters: String,
    /// Hash owner -> holder details of each reader (expires with the
    /// readers set).
    pub details: String,
    /// `<writer>:holder`: the writer's holder details, as the mutex keeps
    /// its holder's (`<owner> <details>`, the writer's `PX`; renewed by
    /// the mutex's renewal batches with the writer).
    pub writer_details: String,
    /// The channel a release publishes on.
    pub channel: String,
}

impl RwNames {
    /// The names of `key`'s read-write lock under `prefix`.
    pub fn new(prefix: &str, key: &LockKey) -> Self {
        let base = format!("{}:rw", KeyNames::new(prefix, key).lock);
        let writer = format!("{base}:writer");
        Self {
            writer_details: holder_key(&writer),
            writer,
            readers: format!("{base}:readers"),
            queue: format!("{base}:queue"),
            queue_expiry: format!("{base}:queue-expiry"),
            counters: format!("{base}:counters"),
            details: format!("{base}:details"),
            channel: format!("{base}:released"),
        }
    }
}

/// The Redis names of one semaphore: `<prefix>{<key>}:sem:<part>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SemNames {
    /// Permit holders: sorted set, member = owner, score = its expiry.
    pub holders: String,
    /// Hash owner -> permits it holds.
    pub counts: String,
    /// Hash owner -> its fencing token.
    pub tokens: String,
    /// Waiting requests by arrival.
    pub queue: String,
    /// Waiting requests by expiry.
    pub queue_expiry: String,
    /// Hash kept forever: `token`, `seq`, `limit` (the limit in use).
    pub counters: String,
    /// Hash owner -> holder details of each permit holder (expires with
    /// the holders set).
    pub details: String,
    /// The channel a release publishes on.
    pub channel: String,
}

impl SemNames {
    /// The names of `key`'s semaphore under `prefix`.
    pub fn new(prefix: &str, key: &LockKey) -> Self {
        let base = format!("{}:sem", KeyNames::new(prefix, key).lock);
        Self {
            holders: format!("{base}:holders"),
            counts: format!("{base}:counts"),
            tokens: format!("{base}:tokens"),
            queue: format!("{base}:queue"),
            queue_expiry: format!("{base}:queue-expiry"),
            counters: format!("{base}:counters"),
            details: format!("{base}:details"),
            channel: format!("{base}:released"),
        }
    }
}

/// The Redis names of a lock of one shared shape.
#[derive(Clone, Debug)]
pub(crate) enum SharedNames {
    Rw(RwNames),
    Sem(SemNames),
}

impl SharedNames {
    /// The names of `key`'s lock of the shape of `kind` under `prefix`.
    pub(crate) fn new(prefix: &str, key: &LockKey, kind: LeaseKind) -> Self {
        match kind.shape() {
            LockShape::Semaphore => Self::Sem(SemNames::new(prefix, key)),
            _ => Self::Rw(RwNames::new(prefix, key)),
        }
    }

    /// The channel a release publishes on.
    pub(crate) fn channel(&self) -> &str {
        match self {
            Self::Rw(n) => &n.channel,
            Self::Sem(n) => &n.channel,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_redis::broken;

    fn tag(key: &str) -> &str {
        let open = key.find('{').unwrap();
        let len = key[open + 1..].find('}').unwrap();
        &key[open + 1..open + 1 + len]
    }

    #[test]
    fn every_key_of_a_lock_shares_the_mutex_hash_tag_but_not_its_names() {
        let key = LockKey::new("a}b{c").unwrap();
        let mutex = KeyNames::new("p:", &key);
        let rw = RwNames::new("p:", &key);
        let sem = SemNames::new("p:", &key);
        let all = [
            &rw.writer,
            &rw.readers,
            &rw.queue,
            &rw.queue_expiry,
            &rw.counters,
            &rw.details,
            &rw.writer_details,
            &sem.holders,
            &sem.counts,
            &sem.tokens,
            &sem.queue,
            &sem.queue_expiry,
            &sem.counters,
            &sem.details,
        ];
        for name in all {
            assert_eq!(tag(name), tag(&mutex.lock), "{name}");
            assert_ne!(name, &mutex.lock);
            assert_ne!(name, &mutex.counter);
        }
        let mut unique: Vec<_> = all.iter().collect();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), all.len());
        assert_eq!(rw.writer, "p:{a%7Db{c}:rw:writer");
    }

    async fn int(
        conn: &mut crate::connection::node::Conn,
        script: &LuaScript,
        keys: &[&str],
        args: &[&str],
    ) -> i64 {
        match conn.eval(script, keys, args).await.unwrap() {
            redis::Value::Int(n) => n,
            other => panic!("{other:?}"),
        }
    }

    /// A share whose expiry passed is dead even while its member is still
    /// in the set (no script swept it yet): renewing it fails and releasing
    /// it says "not held"; and a set never outlives its latest member. The
    /// broken variants (no expiry check, no `keep`) are caught.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn expired_shares_stay_dead_and_never_keep_a_key_alive() {
        let Some((_server, mut conn)) = crate::test_redis::server_and_conn().await else {
            return;
        };
        let n = RwNames::new("t:", &LockKey::new("expired").unwrap());
        let keys = [
            n.writer.as_str(),
            n.readers.as_str(),
            n.queue.as_str(),
            n.queue_expiry.as_str(),
            n.counters.as_str(),
            n.details.as_str(),
            n.writer_details.as_str(),
        ];
        let acquire = |owner: &'static str, ttl: &'static str| {
            [owner, ttl, "r", "0", n.channel.as_str()].map(str::to_owned)
        };
        for (owner, ttl) in [("a", "60"), ("b", "60"), ("long", "5000")] {
            let args = acquire(owner, ttl);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let value = conn.eval(&SHARED.rw_acquire, &keys, &args).await.unwrap();
            assert!(
                matches!(&value, redis::Value::Array(a) if a.first() == Some(&redis::Value::Int(1))),
                "{value:?}"
            );
        }
        // The readers set lives as long as its latest member, not longer.
        let pttl: i64 = conn
            .query(redis::cmd("PTTL").arg(&n.readers))
            .await
            .unwrap();
        assert!(pttl > 4_000 && pttl <= 5_000, "{pttl}");
        tokio::time::sleep(Duration::from_millis(120)).await;
        // `a` and `b` expired, still unswept: renewing one fails, and the
        // variant without the expiry check resurrects the other.
        let zrenew = &SHARED.zrenew;
        let renewed = int(&mut conn, zrenew, &[&n.readers], &["a", "5000"]).await;
        assert_eq!(renewed, 0, "an expired share was renewed");
        let no_check = broken(
            ZRENEW,
            "if not s or tonumber(s) <= now then",
            "if not s then",
        );
        let renewed = int(&mut conn, &no_check, &[&n.readers], &["b", "5000"]).await;
        assert_eq!(renewed, 1, "the broken renew resurrects an expired share");
        // Releasing an expired share says "not held"; the variant without
        // the check says "released".
        let remove = &SHARED.remove;
        let released = int(&mut conn, remove, &[&n.readers], &["a", &n.channel, "1"]).await;
        assert_eq!(released, 0, "an expired share released as held");
        let args = acquire("c", "30");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        conn.eval(&SHARED.rw_acquire, &keys, &args).await.unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        let no_live = broken(
            REMOVE,
            "local live = s and tonumber(s) > now",
            "local live = s",
        );
        let released = int(&mut conn, &no_live, &[&n.readers], &["c", &n.channel, "1"]).await;
        assert_eq!(
            released, 1,
            "the broken release calls an expired share held"
        );
        // Drop `b`, renew `long` down to 200 ms: the set must now expire
        // with its latest member (without `keep` it would not).
        int(&mut conn, remove, &[&n.readers], &["b", &n.channel, "1"]).await;
        assert_eq!(
            int(&mut conn, zrenew, &[&n.readers], &["long", "200"]).await,
            1
        );
        let pttl: i64 = conn
            .query(redis::cmd("PTTL").arg(&n.readers))
            .await
            .unwrap();
        assert!(
            pttl > 0 && pttl <= 200,
            "the set outlives its members: {pttl}"
        );
        let no_keep = broken(ZRENEW, "keep(KEYS[1], KEYS)", "");
        let _: () = conn
            .query(redis::cmd("PEXPIRE").arg(&n.readers).arg(60_000))
            .await
            .unwrap();
        assert_eq!(
            int(&mut conn, &no_keep, &[&n.readers], &["long", "200"]).await,
            1
        );
        let pttl: i64 = conn
            .query(redis::cmd("PTTL").arg(&n.readers))
            .await
            .unwrap();
        assert!(pttl > 200, "the broken renew leaves the set alive: {pttl}");
    }
}
