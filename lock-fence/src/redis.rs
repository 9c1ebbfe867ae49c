//! Fenced writes to Redis: a value, a hash field or a counter, each changed
//! only by a token not below the last accepted one, in one script.
//!
//! The last accepted token of key `k` is kept at `{k}:fence` (or, when `k`
//! has a hash tag already, at `k:fence`), which lands in `k`'s slot on a
//! Cluster, so the script's two keys are one slot. Tokens are compared as
//! 20-digit decimal strings inside the script: Lua's numbers would lose
//! the low bits of a migration's epoch tokens (above 2^53).
//!
//! What it promises is what Redis promises the script: the check, the
//! advance and the write are one atomic step on the master. A failover that
//! loses acknowledged writes can lose the advance with the write.

use lock_core::FencingToken;
use redis::aio::ConnectionLike;
use redis::{Script, ToRedisArgs};

use crate::FenceError;

const FENCED: &str = r"
local current = redis.call('GET', KEYS[2])
if current and ARGV[1] < current then
  return {0, current}
end
redis.call('SET', KEYS[2], ARGV[1])
local op = ARGV[2]
if op == 'set' then
  redis.call('SET', KEYS[1], ARGV[3])
  return {1, ''}
elseif op == 'hset' then
  redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
  return {1, ''}
elseif op == 'incrby' then
  return {1, tostring(redis.call('INCRBY', KEYS[1], ARGV[3]))}
end
return redis.error_reply('lock-fence: unknown operation ' .. tostring(op))
";

/// Fenced writes through one Redis connection (a multiplexed connection, a
/// connection manager, a Cluster connection: anything `ConnectionLike`
/// that clones cheaply).
#[derive(Clone)]
pub struct RedisFence<C> {
    conn: C,
    script: Script,
}

impl<C> std::fmt::Debug for RedisFence<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisFence").finish_non_exhaustive()
    }
}

/// The key that keeps `key`'s last accepted token (same Cluster slot).
pub fn fence_key(key: &str) -> String {
    match key.find('{') {
        Some(open) if key[open + 1..].find('}').is_some_and(|len| len > 0) => {
            format!("{key}:fence")
        }
        _ => format!("{{{key}}}:fence"),
    }
}

fn padded(token: FencingToken) -> String {
    format!("{:020}", token.get())
}

impl<C: ConnectionLike + Clone + Send + Sync> RedisFence<C> {
    /// Fenced writes on `conn`.
    pub fn new(conn: C) -> Self {
        Self {
            conn,
            script: Script::new(FENCED),
        }
    }

    async fn run(
        &self,
        key: &str,
        token: FencingToken,
        op: &str,
        args: &[Vec<u8>],
    ) -> Result<String, FenceError> {
        let mut conn = self.conn.clone();
        let mut invocation = self.script.key(key);
        invocation.key(fence_key(key)).arg(padded(token)).arg(op);
        for arg in args {
            invocation.arg(arg.as_slice());
        }
        let (accepted, answer): (i64, String) = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(FenceError::store)?;
        if accepted == 1 {
            Ok(answer)
        } else {
            Err(FenceError::Stale {
                resource: key.to_owned(),
                token: token.get(),
                current: answer.parse().unwrap_or(0),
            })
        }
    }

    /// `SET key value`, fenced.
    ///
    /// # Errors
    ///
    /// [`FenceError::Stale`] when `token` is below `key`'s last accepted
    /// token (nothing written); [`FenceError::Store`] with Redis's error.
    ///
    /// # Cancel safety
    ///
    /// The script may have run when a call is dropped after sending it.
    pub async fn set(
        &self,
        key: &str,
        value: impl ToRedisArgs,
        token: FencingToken,
    ) -> Result<(), FenceError> {
        self.run(key, token, "set", &value.to_redis_args()).await?;
        Ok(())
    }

    /// `HSET key field value`, fenced (one token per hash, not per field).
    ///
    /// # Errors
    ///
    /// As [`set`](Self::set).
    ///
    /// # Cancel safety
    ///
    /// As [`set`](Self::set).
    pub async fn hset(
        &self,
        key: &str,
        field: impl ToRedisArgs,
        value: impl ToRedisArgs,
        token: FencingToken,
    ) -> Result<(), FenceError> {
        let mut args = field.to_redis_args();
        args.extend(value.to_redis_args());
        if args.len() != 2 {
            return Err(FenceError::InvalidArgument(
                "hset takes one field and one value".into(),
            ));
        }
        self.run(key, token, "hset", &args).await?;
        Ok(())
    }

    /// `INCRBY key delta`, fenced; the new value.
    ///
    /// # Errors
    ///
    /// As [`set`](Self::set).
    ///
    /// # Cancel safety
    ///
    /// As [`set`](Self::set).
    pub async fn incr_by(
        &self,
        key: &str,
        delta: i64,
        token: FencingToken,
    ) -> Result<i64, FenceError> {
        let answer = self
            .run(key, token, "incrby", &delta.to_redis_args())
            .await?;
        answer
            .parse()
            .map_err(|_| FenceError::InvalidArgument(format!("INCRBY answered {answer:?}")))
    }

    /// `key`'s last accepted token (`None` before any).
    ///
    /// # Errors
    ///
    /// [`FenceError::Store`] with Redis's error.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    pub async fn current(&self, key: &str) -> Result<Option<u64>, FenceError> {
        let mut conn = self.conn.clone();
        let raw: Option<String> = redis::cmd("GET")
            .arg(fence_key(key))
            .query_async(&mut conn)
            .await
            .map_err(FenceError::store)?;
        Ok(raw.and_then(|t| t.parse().ok()))
    }
}
