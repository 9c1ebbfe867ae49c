//! The Lua scripts and key layout of the fair (FIFO) mutex and of the
//! multi-key acquire.
//!
//! A fair mutex is the plain mutex (the same lock key, holding the owner
//! as a plain string with `PX`, and the same token counter: fair, unfair
//! and foreign clients exclude each other, and renew / release / inspect
//! are the mutex's scripts) plus a wait queue per key: a sorted set of
//! waiter ids scored by arrival (a sequence number), and a sorted set of
//! the same ids scored by the server instant at which each waiter's own
//! entry lease ends. Every key carries the mutex's hash tag `{<key>}`, so
//! a cluster serves each script on one slot.

use std::sync::LazyLock;

use lock_core::LockKey;

use crate::keys::names::KeyNames;
use crate::keys::scripts::LuaScript;
use crate::keys::shared::prelude;

/// KEYS: lock, counter, queue, queue expiries, sequence, holder details,
/// [token floor].
/// ARGV: owner, ttl ms, wait ms (above 0: join the queue, or refresh our
/// place, for that long when refused; `0`: a try), channel, holder details
/// (the token and the details as the mutex's: `scripts::grant_fns`).
///
/// Returns `{1, token}` granted, `{0, ms}` refused (`ms`: when the blocker
/// ends at the latest: the holder's PTTL, or the end of the queue head's
/// entry lease when the key is free but someone else is first).
///
/// - Waiters whose entry lease ended are swept first (a dead waiter is
///   skipped at once once its lease is over); when that leaves a free key
///   to someone else, the channel is told, so the new head tries at once.
/// - A free key is granted only to the queue's head, or to anyone when the
///   queue is empty (so a try on a free key with no waiters is granted and
///   a try on a key with waiters is refused: nobody jumps the queue).
/// - A resent script (same owner) finds its own grant and returns it, as
///   the mutex's acquire does.
const FAIR_ACQUIRE: &str = concat!(
    prelude!(),
    crate::keys::scripts::grant_fns!(),
    r"
local owner, wait = ARGV[1], tonumber(ARGV[3])
if redis.pcall('GET', KEYS[1]) == owner then
  return grant_again(KEYS[1], KEYS[2], KEYS[6], owner, ARGV[5], ARGV[2], 'value')
end
local swept = sweep(KEYS[4], {{'ZREM', KEYS[3]}})
local head = redis.call('ZRANGE', KEYS[3], 0, 0)
local ms
if redis.call('EXISTS', KEYS[1]) == 0 then
  if #head == 0 or head[1] == owner then
    redis.call('SET', KEYS[1], owner, 'PX', ARGV[2])
    local token = grant_token(KEYS[2], KEYS[7])
    put_details(KEYS[1], KEYS[6], owner, ARGV[5], ARGV[2])
    if #head > 0 then
      redis.call('ZREM', KEYS[3], owner)
      redis.call('ZREM', KEYS[4], owner)
      keep(KEYS[4], {KEYS[4], KEYS[3], KEYS[5]})
    end
    return {1, token}
  end
  if swept > 0 then redis.call('PUBLISH', ARGV[4], '1') end
  ms = tonumber(redis.call('ZSCORE', KEYS[4], head[1]) or now) - now
else
  ms = redis.call('PTTL', KEYS[1])
end
if wait > 0 then
  if not redis.call('ZSCORE', KEYS[3], owner) then
    redis.call('ZADD', KEYS[3], redis.call('INCR', KEYS[5]), owner)
  end
  redis.call('ZADD', KEYS[4], fmt(now + wait), owner)
  keep(KEYS[4], {KEYS[4], KEYS[3], KEYS[5]})
end
return {0, ms}
"
);

/// KEYS: lock, queue, queue expiries. ARGV: owner, channel.
/// Removes every trace of `owner` (a grant whose answer was lost, a queue
/// entry): the undo of a fair acquire that did not end with a lease. Tells
/// the channel when anything went, so the next waiter goes on at once.
/// Returns how many were removed.
const FAIR_ABANDON: &str = r"
local n = 0
if redis.pcall('GET', KEYS[1]) == ARGV[1] then n = n + redis.call('DEL', KEYS[1]) end
n = n + redis.call('ZREM', KEYS[2], ARGV[1]) + redis.call('ZREM', KEYS[3], ARGV[1])
if n > 0 then redis.call('PUBLISH', ARGV[2], '1') end
return n
";

/// KEYS: per key, in order: lock, counter, queue, queue expiries, holder
/// details (5 each), then the token floor where there is one.
/// ARGV: ttl ms, `1` (fair: a key with live waiters counts as held) or
/// `0`, then one owner per key, then the holder details.
///
/// All or nothing: `{0, i}` when the `i`-th key (1-based) is held (nothing
/// was written), else every lock is `SET <owner> PX <ttl>` and its counter
/// `INCR`ed: `{1, token1, token2, ...}`. A resent script (the first lock
/// holds our first owner, so the whole set is ours: the script is atomic)
/// returns the grants it made, their TTLs set again.
const MULTI_ACQUIRE: &str = concat!(
    prelude!(),
    crate::keys::scripts::grant_fns!(),
    r"
local ttl, fair, n = ARGV[1], ARGV[2] == '1', math.floor(#KEYS / 5)
local floor, details = KEYS[5 * n + 1], ARGV[3 + n]
if redis.pcall('GET', KEYS[1]) == ARGV[3] then
  local out = {1}
  for i = 0, n - 1 do
    local token = redis.call('GET', KEYS[5 * i + 2])
    if redis.pcall('GET', KEYS[5 * i + 1]) ~= ARGV[3 + i] or not token then
      return redis.error_reply('ERR distlock: a resent multi-lock found its set changed (evicted?)')
    end
    redis.call('PEXPIRE', KEYS[5 * i + 1], ttl)
    put_details(KEYS[5 * i + 1], KEYS[5 * i + 5], ARGV[3 + i], details, ttl)
    out[#out + 1] = token
  end
  return out
end
for i = 0, n - 1 do
  if redis.call('EXISTS', KEYS[5 * i + 1]) == 1 then return {0, i + 1} end
  if fair then
    sweep(KEYS[5 * i + 4], {{'ZREM', KEYS[5 * i + 3]}})
    if redis.call('ZCARD', KEYS[5 * i + 3]) > 0 then return {0, i + 1} end
  end
end
local out = {1}
for i = 0, n - 1 do
  redis.call('SET', KEYS[5 * i + 1], ARGV[3 + i], 'PX', ttl)
  out[#out + 1] = grant_token(KEYS[5 * i + 2], floor)
  put_details(KEYS[5 * i + 1], KEYS[5 * i + 5], ARGV[3 + i], details, ttl)
end
return out
"
);

/// The fair mutex's and the multi-lock's scripts, hashed once.
#[derive(Debug)]
pub(crate) struct FairScripts {
    pub(crate) acquire: LuaScript,
    pub(crate) abandon: LuaScript,
    pub(crate) multi_acquire: LuaScript,
}

pub(crate) static FAIR: LazyLock<FairScripts> = LazyLock::new(|| FairScripts {
    acquire: LuaScript::new(FAIR_ACQUIRE),
    abandon: LuaScript::new(FAIR_ABANDON),
    multi_acquire: LuaScript::new(MULTI_ACQUIRE),
});

/// The Redis names of one fair mutex: the mutex's names, plus its queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FairNames {
    /// The mutex's lock key, token counter and release channel.
    pub(crate) mutex: KeyNames,
    /// Waiters: sorted set, member = waiter id (the owner it will hold
    /// with), score = arrival sequence number.
    pub(crate) queue: String,
    /// The same waiters, score = the server instant (ms) their entry lease
    /// ends.
    pub(crate) queue_expiry: String,
    /// The arrival sequence (a counter; goes with the queue when it empties).
    pub(crate) seq: String,
}

impl FairNames {
    pub(crate) fn new(prefix: &str, key: &LockKey) -> Self {
        let mutex = KeyNames::new(prefix, key);
        let base = format!("{}:fair", mutex.lock);
        Self {
            queue: format!("{base}:queue"),
            queue_expiry: format!("{base}:queue_expiry"),
            seq: format!("{base}:seq"),
            mutex,
        }
    }

    /// The acquire script's KEYS (without the optional floor).
    pub(crate) fn acquire_keys(&self) -> [&str; 6] {
        [
            &self.mutex.lock,
            &self.mutex.counter,
            &self.queue,
            &self.queue_expiry,
            &self.seq,
            &self.mutex.holder,
        ]
    }

    /// The multi-acquire script's five KEYS of this key.
    pub(crate) fn multi_keys(&self) -> [&str; 5] {
        [
            &self.mutex.lock,
            &self.mutex.counter,
            &self.queue,
            &self.queue_expiry,
            &self.mutex.holder,
        ]
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use redis::Value;

    use super::*;
    use crate::connection::node::Conn;
    use crate::test_redis::broken;

    /// `{flag, n}` of an acquire.
    async fn call(
        conn: &mut Conn,
        script: &LuaScript,
        n: &FairNames,
        args: [&str; 3],
    ) -> (i64, i64) {
        let [owner, ttl, wait] = args;
        let value = conn
            .eval(
                script,
                &n.acquire_keys(),
                &[owner, ttl, wait, &n.mutex.channel, ""],
            )
            .await
            .unwrap();
        match value {
            Value::Array(items) => match items.as_slice() {
                [Value::Int(flag), Value::Int(n)] => (*flag, *n),
                [Value::Int(flag), Value::BulkString(b)] => {
                    (*flag, String::from_utf8_lossy(b).parse().unwrap())
                }
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    /// The queue order is kept (only the head takes a free key; a try does
    /// not jump), and a waiter whose entry lease ended is skipped by the
    /// next attempt. The broken variants are caught: without the head
    /// check a later waiter (and a try) takes the key before the head;
    /// without the sweep a dead head stalls the queue.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_live_head_takes_a_free_key() {
        let Some((_server, mut c)) = crate::test_redis::server_and_conn().await else {
            return;
        };
        let real = &FAIR.acquire;
        let no_head_check = broken(FAIR_ACQUIRE, "#head == 0 or head[1] == owner", "true");
        let no_sweep = broken(
            FAIR_ACQUIRE,
            "local swept = sweep(KEYS[4], {{'ZREM', KEYS[3]}})",
            "local swept = 0",
        );
        for (name, script, fair) in [
            ("real", real, true),
            ("no head check", &no_head_check, false),
        ] {
            let n = FairNames::new(
                &format!("order-{}:", name.len()),
                &LockKey::new("k").unwrap(),
            );
            // h holds; a then b queue (long entry leases).
            assert_eq!(call(&mut c, script, &n, ["h", "5000", "0"]).await.0, 1);
            assert_eq!(call(&mut c, script, &n, ["a", "5000", "5000"]).await.0, 0);
            assert_eq!(call(&mut c, script, &n, ["b", "5000", "5000"]).await.0, 0);
            let _: i64 = c.query(redis::cmd("DEL").arg(&n.mutex.lock)).await.unwrap();
            // The key is free: b (second in line) and a try must wait for a.
            let b = call(&mut c, script, &n, ["b", "5000", "5000"]).await.0;
            let t = call(&mut c, script, &n, ["t", "5000", "0"]).await.0;
            assert_eq!((b == 0 && t == 0), fair, "{name}: b {b}, try {t}");
        }
        // A dead head (its entry lease ended, nobody removed it) is skipped.
        for (name, script, fair) in [("real", real, true), ("no sweep", &no_sweep, false)] {
            let n = FairNames::new(
                &format!("dead-{}:", name.len()),
                &LockKey::new("k").unwrap(),
            );
            assert_eq!(call(&mut c, script, &n, ["h", "5000", "0"]).await.0, 1);
            assert_eq!(call(&mut c, script, &n, ["dead", "5000", "100"]).await.0, 0);
            assert_eq!(call(&mut c, script, &n, ["b", "5000", "5000"]).await.0, 0);
            let _: i64 = c.query(redis::cmd("DEL").arg(&n.mutex.lock)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
            let b = call(&mut c, script, &n, ["b", "5000", "5000"]).await.0;
            assert_eq!(
                b == 1,
                fair,
                "{name}: the live waiter behind a dead head got {b}"
            );
        }
        // The queue's keys never outlive their last entry lease.
        let n = FairNames::new("gone:", &LockKey::new("k").unwrap());
        assert_eq!(call(&mut c, real, &n, ["h", "5000", "0"]).await.0, 1);
        assert_eq!(call(&mut c, real, &n, ["a", "5000", "80"]).await.0, 0);
        tokio::time::sleep(Duration::from_millis(150)).await;
        for name in [&n.queue, &n.queue_expiry, &n.seq] {
            let exists: i64 = c.query(redis::cmd("EXISTS").arg(name)).await.unwrap();
            assert_eq!(exists, 0, "{name} outlived its waiters");
        }
    }

    /// All or nothing: a set with one held key writes nothing (the broken
    /// variant that sets keys while checking leaves the free keys held).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_multi_acquire_with_a_held_key_writes_nothing() {
        let Some((_server, mut c)) = crate::test_redis::server_and_conn().await else {
            return;
        };
        let one_pass = broken(
            MULTI_ACQUIRE,
            "if redis.call('EXISTS', KEYS[5 * i + 1]) == 1 then return {0, i + 1} end",
            "if redis.call('SET', KEYS[5 * i + 1], ARGV[3 + i], 'NX', 'PX', ttl) == false then return {0, i + 1} end",
        );
        for (name, script, safe) in [
            ("real", &FAIR.multi_acquire, true),
            ("one pass", &one_pass, false),
        ] {
            let prefix = format!("multi-{}:", name.len());
            let names: Vec<FairNames> = ["a", "b", "c"]
                .iter()
                .map(|k| FairNames::new(&prefix, &LockKey::new(*k).unwrap()))
                .collect();
            let _: () = c
                .query(redis::cmd("SET").arg(&names[2].mutex.lock).arg("someone"))
                .await
                .unwrap();
            let keys: Vec<&str> = names.iter().flat_map(FairNames::multi_keys).collect();
            let value = c
                .eval(script, &keys, &["5000", "0", "o1", "o2", "o3"])
                .await
                .unwrap();
            assert_eq!(
                value,
                Value::Array(vec![Value::Int(0), Value::Int(3)]),
                "{name}"
            );
            let mut left = 0;
            for n in &names[..2] {
                let exists: i64 = c
                    .query(redis::cmd("EXISTS").arg(&n.mutex.lock))
                    .await
                    .unwrap();
                left += exists;
            }
            assert_eq!(left == 0, safe, "{name}: {left} keys left behind");
        }
    }
}
