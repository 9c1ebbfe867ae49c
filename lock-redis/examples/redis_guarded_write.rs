//! A write guarded by the lock's own Redis: the data lives beside the
//! lock, and a Lua script changes it only while the guard's lease still
//! holds the lock, the owner check and the write in one server call. No
//! fencing token has to reach the data; a holder that lost the lock
//! (paused past its TTL, released, broken by an operator) gets
//! `NotHeld` instead of a write.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p lock-redis --example redis_guarded_write
//! ```
//!
//! `redis+sentinel://`, `redis+cluster://` (the data keys carry the
//! lock's hash tag, so they share its slot) and `rediss://` work too;
//! `redlock://` refuses guarded writes (`Unsupported`: no one server can
//! check a majority's lock).

use std::time::Duration;

use lock_core::{LockClient, LockKey};
use lock_redis::{RedisGuardedReply, RedisGuardedScript, RedisValue};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let backend = lock_redis::connect(&url).await?;
    // The client takes a handle; this one runs the guarded scripts (clones
    // share the connections).
    let client = LockClient::new(backend.clone());

    // The account's balance, named with the lock's hash tag: in Redis
    // Cluster every key of a guarded script must be in the lock's slot.
    let key = LockKey::new("accounts/7")?;
    let tag = backend
        .hash_tag(&key)
        .ok_or("the native layout tags every key")?;
    let balance = format!("{tag}:balance");

    // Adds ARGV[1] to KEYS[1] and answers the new balance; the caller's
    // KEYS and ARGV, as in any EVAL (the lock's own come before them and
    // are not visible here).
    let deposit = RedisGuardedScript::new("return redis.call('INCRBY', KEYS[1], ARGV[1])");

    let guard = client
        .lock(key.as_str())
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(5))
        .acquire()
        .await?;
    let lease = guard.lease();
    match backend
        .run_guarded(&lease, &deposit, &[&balance], &["40"])
        .await?
    {
        RedisGuardedReply::Ran(RedisValue::Int(total)) => {
            println!("deposited 40, balance now {total}")
        }
        RedisGuardedReply::NotHeld => println!("lost the lock before the deposit: nothing written"),
        other => println!("unexpected answer {other:?}"),
    }
    guard.release().await?;

    // The same lease after its release: the server refuses the write.
    match backend
        .run_guarded(&lease, &deposit, &[&balance], &["1000"])
        .await?
    {
        RedisGuardedReply::NotHeld => println!("after release: refused, nothing written"),
        other => println!("after release the write was not refused: {other:?}"),
    }
    Ok(())
}
