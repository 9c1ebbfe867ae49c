//! What the Redis benchmarks (`redis_bench`, `redis_cpu`) share: the lease
//! and wait times, the client count, the environment knobs, and our cycle
//! as a user writes it.

use std::time::Duration;

use lock_core::{LockClient, LockError};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) const TTL: Duration = Duration::from_secs(30);
pub(crate) const WAIT: Duration = Duration::from_secs(60);
pub(crate) const CLIENTS: usize = 8;

/// The environment variable `name` as a number, or `default`.
pub(crate) fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Our cycle as a user writes it.
pub(crate) async fn ours_cycle(client: &LockClient, key: &str) -> Result<(), LockError> {
    let guard = client.lock(key).ttl(TTL).wait(WAIT).acquire().await?;
    guard.release().await?;
    Ok(())
}
