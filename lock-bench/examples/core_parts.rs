//! Probe (not a test): `LockClient`'s own share of one acquire+release
//! cycle, over the backend it wraps, one client, interleaved rounds:
//!
//! 0. lock-core's `MemoryBackend` directly: a waiting acquire
//!    (`LockBackendExt::acquire`) and `release`, no client, guard or
//!    renewal scheduler;
//! 1. ours over the same kind of backend: `LockClient` with a waiting
//!    acquire, then `release`, as users write it (guard, registration with
//!    the renewal scheduler on its dedicated thread, deregistration);
//! 2. `RedisBackend` directly (a redis-server this process starts);
//! 3. ours over `RedisBackend`.
//!
//! The memory sides show the client's share with no network in the way
//! (a cycle is a few microseconds); the Redis sides the same share beside
//! a real backend's. Per side: p50, p99, mean, CPU per cycle; then ours /
//! direct for both. Pin it to one CPU:
//!
//! ```text
//! cargo build --release -p lock-bench --example core_parts
//! taskset -c 0 target/release/examples/core_parts 20000
//! ```
//!
//! `ONLY=<0..3>` runs one side alone (for a profiler); `RTT_US=<µs>` puts
//! a fault proxy adding that round-trip time in front of each Redis side.

mod parts_support;

use conformance::servers::redis::RedisServer;
use lock_core::{LockClient, LockKey, MemoryBackend};
use parts_support::BoxError;

const NAMES: [&str; 4] = [
    "memory direct",
    "ours over memory",
    "RedisBackend direct",
    "ours over RedisBackend",
];

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let cycles = parts_support::cycles();
    let mut server = RedisServer::start().await?;
    let server_pid = server.process().pid();
    let rtt = parts_support::rtt();
    let proxies = parts_support::proxies(server.port(), NAMES.len(), rtt).await?;
    let url = |side: usize| {
        format!(
            "redis://127.0.0.1:{}",
            parts_support::port_of(&proxies, side, server.port())
        )
    };
    let memory = MemoryBackend::new();
    let ours_memory = LockClient::new(MemoryBackend::new());
    let redis = lock_redis::connect(&url(2)).await?;
    let ours_redis = LockClient::new(lock_redis::connect(&url(3)).await?);
    let memory_key = LockKey::new("parts-direct")?;
    let redis_key = LockKey::new("parts-direct")?;
    let measured = parts_support::interleaved(
        &NAMES,
        cycles,
        server_pid,
        &proxies,
        async |side| -> Result<(), BoxError> {
            match side {
                0 => parts_support::direct_cycle(&memory, &memory_key).await?,
                1 => parts_support::ours_cycle(&ours_memory).await?,
                2 => parts_support::direct_cycle(&redis, &redis_key).await?,
                _ => parts_support::ours_cycle(&ours_redis).await?,
            }
            Ok(())
        },
    )
    .await?;
    println!("lock-core's share, 1 client, {cycles} cycles per side:");
    measured.print(&[(1, 0), (3, 2)]);
    Ok(())
}
