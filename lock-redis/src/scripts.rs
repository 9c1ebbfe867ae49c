//! The Lua scripts, the calls that send them, and the key layout.

use std::time::Duration;

use lock_core::{LockError, LockKey, Operation};
use redis::Value;

use crate::conn::Conn;
use crate::error::unexpected;

/// A Lua script with its SHA1, sent by `EVALSHA` (with an `EVAL` fallback
/// when the server lost its script cache).
#[derive(Debug)]
pub(crate) struct LuaScript {
    pub(crate) code: &'static str,
    pub(crate) hash: String,
}

impl LuaScript {
    pub(crate) fn new(code: &'static str) -> Self {
        let hash = redis::Script::new(code).get_hash().to_owned();
        Self { code, hash }
    }
}

/// KEYS: lock, counter. ARGV: owner, ttl ms.
/// Returns `{1, token}` when granted, `{0, pttl of the holder}` otherwise.
///
/// Idempotent for its own owner value: the same call sent again (the
/// cluster client retries a script after a lost reply or a MOVED/ASK
/// redirect) finds our owner in the key and returns the grant it made,
/// with the TTL set again as a grant would. The token is the counter's
/// value: only a grant (`SET NX` succeeding, so nobody held the key)
/// increments it, so while our owner value is in the key the counter still
/// holds our token. `pcall` because a foreign client may keep another type
/// at the key (then it is simply held). A counter that vanished (evicted)
/// cannot give our token back: fail rather than invent one.
const ACQUIRE: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('INCR', KEYS[2])}
end
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  local token = redis.call('GET', KEYS[2])
  if not token then
    return redis.error_reply('ERR distlock: the lock holds our owner value but its token counter is gone (evicted?)')
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, token}
end
return {0, redis.call('PTTL', KEYS[1])}
";

/// KEYS: lock. ARGV: owner, channel. Compare-and-delete, then tell waiters.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
return 0
";

/// KEYS: lock. ARGV: owner, ttl ms. Compare-and-pexpire.
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// KEYS: lock, counter. Returns `{}` when free, else `{holder, pttl, counter}`.
const INSPECT: &str = r"
local holder = redis.call('GET', KEYS[1])
if not holder then return {} end
return {holder, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or '0'}
";

/// The four scripts, hashed once per backend.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) acquire: LuaScript,
    pub(crate) release: LuaScript,
    pub(crate) renew: LuaScript,
    pub(crate) inspect: LuaScript,
}

impl Scripts {
    /// The native layout's scripts (also those of `layout=plain`, which
    /// only names its keys differently).
    pub(crate) fn new() -> Self {
        Self::for_layout(crate::RedisLayout::Native)
    }

    /// The mutex scripts of `layout`: the same KEYS and ARGV shapes in
    /// every layout, so every caller stays layout-blind.
    pub(crate) fn for_layout(layout: crate::RedisLayout) -> Self {
        let [acquire, release, renew, inspect] = match layout {
            crate::RedisLayout::Redisson => crate::layout::redisson_scripts(),
            _ => [ACQUIRE, RELEASE, RENEW, INSPECT],
        };
        Self {
            acquire: LuaScript::new(acquire),
            release: LuaScript::new(release),
            renew: LuaScript::new(renew),
            inspect: LuaScript::new(inspect),
        }
    }

    pub(crate) fn all(&self) -> [&LuaScript; 4] {
        [&self.acquire, &self.release, &self.renew, &self.inspect]
    }

    /// The acquire call on one connection: the driver's and the floor's.
    /// `ttl_ms` comes from [`ttl_ms`].
    pub(crate) async fn call_acquire(
        &self,
        conn: &mut Conn,
        names: &KeyNames,
        owner: &str,
        ttl_ms: &str,
    ) -> redis::RedisResult<Value> {
        conn.eval(
            &self.acquire,
            &[&names.lock, &names.counter],
            &[owner, ttl_ms],
        )
        .await
    }

    /// The release call (compare-and-delete, then publish) on one
    /// connection: the driver's and the floor's.
    pub(crate) async fn call_release(
        &self,
        conn: &mut Conn,
        names: &KeyNames,
        owner: &str,
    ) -> redis::RedisResult<Value> {
        conn.eval(&self.release, &[&names.lock], &[owner, &names.channel])
            .await
    }
}

/// What one node said to an acquire script.
pub(crate) enum NodeGrant {
    Granted(u64),
    Held(i64),
}

/// One element of an acquire answer, from either reply reader (the redis
/// crate's `Value` in the driver, the floors' own RESP reader).
pub(crate) enum Answer<'a> {
    Int(i64),
    Text(&'a [u8]),
    Other,
}

/// The acquire script's answer `{flag, answer}` (see [`ACQUIRE`]): `{1,
/// token}` granted, the token an integer, or the counter's string when a
/// retried acquire found its own grant; `{0, pttl of the holder}` held;
/// `None` for anything else. The driver's and the floors' reading.
pub(crate) fn grant_of(flag: i64, answer: Answer<'_>) -> Option<NodeGrant> {
    match (flag, answer) {
        (1, Answer::Int(n)) => u64::try_from(n).ok().map(NodeGrant::Granted),
        (1, Answer::Text(bytes)) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|t| t.parse::<u64>().ok())
            .map(NodeGrant::Granted),
        (0, Answer::Int(n)) => Some(NodeGrant::Held(n)),
        _ => None,
    }
}

/// An acquire answer as the redis crate read it.
pub(crate) fn parse_grant(value: &Value) -> Result<NodeGrant, LockError> {
    if let Value::Array(items) = value
        && let [Value::Int(flag), answer] = items.as_slice()
    {
        let answer = match answer {
            Value::Int(n) => Answer::Int(*n),
            Value::BulkString(bytes) => Answer::Text(bytes),
            _ => Answer::Other,
        };
        if let Some(grant) = grant_of(*flag, answer) {
            return Ok(grant);
        }
    }
    Err(unexpected(Operation::Acquire, value))
}

pub(crate) fn as_int(value: &Value, op: Operation) -> Result<i64, LockError> {
    match value {
        Value::Int(n) => Ok(*n),
        other => Err(unexpected(op, other)),
    }
}

pub(crate) fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

pub(crate) fn pttl(ms: i64) -> Option<Duration> {
    u64::try_from(ms)
        .ok()
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

/// A TTL as the acquire script's `PX` argument (whole milliseconds).
pub(crate) fn ttl_ms(ttl: Duration) -> String {
    ttl.as_millis().to_string()
}

/// The Redis names of one lock.
///
/// `lock` = `<prefix>{<key>}`: the hash tag makes the lock and its counter
/// `<prefix>{<key>}:token` share a cluster slot. In the key, `%` and `}`
/// are percent-encoded so the tag always ends where we put its brace and is
/// never empty. The lock key holds the owner value as a plain string, so
/// any client doing `SET <prefix>{<key>} <random> NX PX <ttl>` excludes
/// with us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyNames {
    pub(crate) lock: String,
    pub(crate) counter: String,
    pub(crate) channel: String,
}

impl KeyNames {
    pub(crate) fn new(prefix: &str, key: &LockKey) -> Self {
        let mut escaped = String::with_capacity(key.as_str().len());
        for c in key.as_str().chars() {
            match c {
                '%' => escaped.push_str("%25"),
                '}' => escaped.push_str("%7D"),
                c => escaped.push(c),
            }
        }
        let lock = format!("{prefix}{{{escaped}}}");
        Self {
            counter: format!("{lock}:token"),
            channel: format!("{lock}:released"),
            lock,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot_tag(key: &str) -> &str {
        // The cluster rule: the text between the first '{' and the next '}'.
        if let Some(open) = key.find('{')
            && let Some(len) = key[open + 1..].find('}')
            && len > 0
        {
            return &key[open + 1..open + 1 + len];
        }
        key
    }

    #[test]
    fn lock_and_counter_share_a_hash_tag() {
        for name in ["a", "jobs/x", "}", "{", "a}b{c}", "%7D", "}{}"] {
            let names = KeyNames::new("distlock:", &LockKey::new(name).unwrap());
            let tag = slot_tag(&names.lock);
            assert!(!tag.is_empty());
            assert_eq!(tag, slot_tag(&names.counter), "{name}");
            assert_ne!(tag, names.lock, "{name}: the tag must apply");
        }
        // Distinct keys never map to the same Redis key.
        let a = KeyNames::new("p:", &LockKey::new("}").unwrap());
        let b = KeyNames::new("p:", &LockKey::new("%7D").unwrap());
        assert_ne!(a.lock, b.lock);
        assert_eq!(
            KeyNames::new("p:", &LockKey::new("x").unwrap()).lock,
            "p:{x}"
        );
    }

    async fn plain_conn(port: u16) -> Conn {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        Conn::Plain(client.get_multiplexed_async_connection().await.unwrap())
    }

    fn grant(value: &Value) -> Option<u64> {
        match parse_grant(value).unwrap() {
            NodeGrant::Granted(token) => Some(token),
            NodeGrant::Held(_) => None,
        }
    }

    /// Bug 7: a retried acquire script (the cluster client resends it after
    /// a lost reply or a MOVED/ASK redirect) finds our own value in the key.
    /// It must answer with the grant it made, not "held", and extend the TTL
    /// as a grant would; anyone else still finds the key held.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_retried_acquire_returns_its_own_grant() {
        use conformance::OrSkip;
        let Some(server) = conformance::servers::redis::RedisServer::start()
            .await
            .or_skip()
        else {
            return;
        };
        let scripts = Scripts::new();
        let mut conn = plain_conn(server.port()).await;
        let names = KeyNames::new("t:", &LockKey::new("retried").unwrap());
        let owner = lock_core::OwnerId::random().to_hex();
        let first = scripts
            .call_acquire(&mut conn, &names, &owner, "2000")
            .await
            .unwrap();
        let token = grant(&first).expect("the first call grants");
        // Time passes before the retry: its PX must be applied again.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let retried = scripts
            .call_acquire(&mut conn, &names, &owner, "5000")
            .await
            .unwrap();
        assert_eq!(
            grant(&retried),
            Some(token),
            "the retried acquire must return the same grant, got {retried:?}"
        );
        let pttl: i64 = conn
            .query(redis::cmd("PTTL").arg(&names.lock))
            .await
            .unwrap();
        assert!(pttl > 4000, "the retry must extend the TTL: pttl {pttl}");
        let value: String = conn
            .query(redis::cmd("GET").arg(&names.lock))
            .await
            .unwrap();
        assert_eq!(value, owner, "the lock key stays a plain owner string");
        // Someone else is still excluded, and the counter did not move.
        let other = lock_core::OwnerId::random().to_hex();
        let held = scripts
            .call_acquire(&mut conn, &names, &other, "2000")
            .await
            .unwrap();
        assert_eq!(grant(&held), None);
        let counter: u64 = conn
            .query(redis::cmd("GET").arg(&names.counter))
            .await
            .unwrap();
        assert_eq!(counter, token);
        // A lock whose counter vanished (evicted) is not granted a made-up
        // token: the script fails loudly.
        let _: () = conn
            .query(redis::cmd("DEL").arg(&names.counter))
            .await
            .unwrap();
        let err = scripts
            .call_acquire(&mut conn, &names, &owner, "2000")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("counter"), "{err}");
    }
}
