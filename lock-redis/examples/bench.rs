//! Benchmark of the Redis driver against the raw round trips, in one run
//! against one redis-server started here.
//!
//! ```text
//! cargo run --release -p lock-redis --example bench
//! ```
//!
//! - Uncontended acquire+release cycles through `LockBackend`, vs the same
//!   two round trips issued by hand on a raw multiplexed connection
//!   (`EVALSHA` of the same acquire script, `EVALSHA` of the same release
//!   script: [`lock_redis::floor::RedisFloor`]), and vs the minimal
//!   `SET NX PX` + compare-and-delete by hand;
//!   sequentially and with 8 tasks on 8 keys.
//! - Contended handoff: 4 tasks on one key, time from a release to the next
//!   grant, in round trips.
//! - 10,000 locks held at once by guards: renewal round trips per period and
//!   memory per held lock.
//!
//! Environment: `BENCH_CYCLES` (sequential cycles per round, default 3000),
//! `BENCH_LOCKS` (held locks, default 10000).

use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{self, LatencyStats};
use conformance::servers::redis::RedisServer;
use lock_core::{LockBackend, LockClient, LockKey, OwnerId};
use lock_redis::floor::RedisFloor;
use lock_redis::{RedisBackend, RedisConfig};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

// The minimal lock's compare-and-delete (the floor's scripts are the
// driver's own, see `lock_redis::floor`).
const CAD: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// Interleaved rounds of each measurement; the median round is reported.
const ROUNDS: usize = 5;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A raw connection for PING, the minimal lock and the admin queries.
#[derive(Clone)]
struct Raw {
    conn: MultiplexedConnection,
    cad: String,
}

impl Raw {
    async fn new(url: &str) -> Result<Self, BoxError> {
        let client = redis::Client::open(url)?;
        // The driver's connection settings: no per-request timer inside the
        // connection (the driver bounds calls itself).
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let cad: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(CAD)
            .query_async(&mut conn)
            .await?;
        Ok(Self { conn, cad })
    }

    /// The minimal lock by hand: `SET NX PX` + compare-and-delete.
    async fn set_nx_cycle(&self, name: &str) -> Result<(), BoxError> {
        let mut conn = self.conn.clone();
        let lock = format!("raw:{{{name}}}");
        let owner = OwnerId::random().to_hex();
        let ok: Option<String> = redis::cmd("SET")
            .arg(&lock)
            .arg(&owner)
            .arg("NX")
            .arg("PX")
            .arg(10_000)
            .query_async(&mut conn)
            .await?;
        assert!(ok.is_some(), "benchmark key unexpectedly held");
        let _: i64 = redis::cmd("EVALSHA")
            .arg(&self.cad)
            .arg(1)
            .arg(&lock)
            .arg(&owner)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }
}

fn line(label: &str, s: &LatencyStats) {
    println!(
        "  {label:<34} p50 {:>8.1} us  p99 {:>8.1} us  {:>9.0} cycles/s",
        s.p50_us, s.p99_us, s.per_sec
    );
}

fn merge(a: &[LatencyStats]) -> LatencyStats {
    // Rounds are interleaved; report the median round by p50.
    let mut v = a.to_vec();
    v.sort_by(|x, y| x.p50_us.total_cmp(&y.p50_us));
    v[v.len() / 2]
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

async fn used_memory(conn: &mut MultiplexedConnection) -> Result<u64, BoxError> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let cycles: usize = std::env::var("BENCH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let held: usize = std::env::var("BENCH_LOCKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let server = RedisServer::start().await?;
    let url = server.url();
    println!("redis-server on {url}; {cycles} cycles per round, {ROUNDS} interleaved rounds");
    let backend = RedisBackend::connect(RedisConfig::from_url(&url)?).await?;
    let dyn_backend: Arc<dyn LockBackend> = Arc::new(backend.clone());
    let raw = Raw::new(&url).await?;
    let floor_conn = RedisFloor::connect(&url).await?;
    let ttl = Duration::from_secs(10);

    // Round-trip time of one PING, for scale.
    let ping = {
        let conn = raw.conn.clone();
        bench::measure_sequential(cycles, move |_| {
            let mut conn = conn.clone();
            async move {
                redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .map(|_| ())
            }
        })
        .await?
    };

    // Warm-up.
    bench::cycle_latency(dyn_backend.clone(), &LockKey::new("warm")?, ttl, 500).await?;
    for _ in 0..500 {
        floor_conn.cycle("warm-raw", ttl).await?;
    }

    // Sequential, interleaved rounds.
    let (mut ours, mut floor, mut minimal) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let f = floor_conn.clone();
        floor.push(
            bench::measure_sequential(cycles, |_| {
                let f = f.clone();
                async move { f.cycle(&format!("seq-raw-{round}"), ttl).await }
            })
            .await?,
        );
        ours.push(
            bench::cycle_latency(
                dyn_backend.clone(),
                &LockKey::new(format!("seq-ours-{round}"))?,
                ttl,
                cycles,
            )
            .await?,
        );
        let r = raw.clone();
        minimal.push(
            bench::measure_sequential(cycles, |_| {
                let r = r.clone();
                async move { r.set_nx_cycle(&format!("seq-min-{round}")).await }
            })
            .await?,
        );
    }
    let (ours, floor, minimal) = (merge(&ours), merge(&floor), merge(&minimal));
    println!("\nsequential acquire+release (1 task):");
    line("PING (one round trip)", &ping);
    line("raw floor: EVALSHA acquire + release", &floor);
    line("raw SET NX PX + compare-and-delete", &minimal);
    line("ours: try_acquire + release", &ours);
    println!(
        "  ratio ours/floor: p50 {:.3}x  p99 {:.3}x  throughput {:.3}x",
        bench::ratio(ours.p50_us, floor.p50_us),
        bench::ratio(ours.p99_us, floor.p99_us),
        bench::ratio(ours.per_sec, floor.per_sec)
    );

    // 8 tasks on 8 keys.
    let tasks = 8;
    let per_task = cycles / 2;
    let (mut ours8, mut floor8) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let f = floor_conn.clone();
        floor8.push(
            bench::measure_parallel(tasks, per_task, move |t, _| {
                let f = f.clone();
                async move { f.cycle(&format!("par-raw-{round}-{t}"), ttl).await }
            })
            .await?,
        );
        ours8.push(
            bench::cycle_throughput(
                dyn_backend.clone(),
                &format!("par-ours-{round}"),
                ttl,
                tasks,
                per_task,
            )
            .await?,
        );
    }
    let (ours8, floor8) = (merge(&ours8), merge(&floor8));
    println!("\n{tasks} tasks on {tasks} keys, one shared connection:");
    line("raw floor: EVALSHA acquire + release", &floor8);
    line("ours: try_acquire + release", &ours8);
    println!(
        "  ratio ours/floor: p50 {:.3}x  p99 {:.3}x  throughput {:.3}x",
        bench::ratio(ours8.p50_us, floor8.p50_us),
        bench::ratio(ours8.p99_us, floor8.p99_us),
        bench::ratio(ours8.per_sec, floor8.per_sec)
    );

    // Contended handoff: 4 tasks, one key, each with its own client.
    let handoff =
        bench::handoff(dyn_backend.clone(), &LockKey::new("handoff")?, ttl, 4, 2000).await?;
    println!("\ncontended handoff (4 tasks, 1 key, release -> next grant):");
    println!(
        "  p50 {:.1} us  p99 {:.1} us  = {:.1} / {:.1} round trips (PING p50 {:.1} us); {:.0} grants/s",
        handoff.p50_us,
        handoff.p99_us,
        bench::ratio(handoff.p50_us, ping.p50_us),
        bench::ratio(handoff.p99_us, ping.p50_us),
        ping.p50_us,
        handoff.per_sec
    );

    // Many locks held at once, renewed by their guards.
    let mut admin = raw.conn.clone();
    let period = Duration::from_secs(1);
    let held_ttl = period * 3;
    let many = RedisBackend::connect(RedisConfig::from_url(&url)?).await?;
    let client = LockClient::new(many.clone());
    let rss_before = rss_bytes();
    let server_before = used_memory(&mut admin).await?;
    let started = Instant::now();
    let mut guards = Vec::with_capacity(held);
    for i in 0..held {
        guards.push(
            client
                .lock(format!("held/{i}"))
                .ttl(held_ttl)
                .acquire()
                .await?,
        );
    }
    let acquired_in = started.elapsed();
    let rss_after = rss_bytes();
    let server_after = used_memory(&mut admin).await?;
    // Let the first renewals happen, then count over 3 periods.
    tokio::time::sleep(period * 2).await;
    let before = many.renewal_stats();
    tokio::time::sleep(period * 3).await;
    let after = many.renewal_stats();
    let still_held = guards.iter().filter(|g| g.is_held()).count();
    let periods = 3u64;
    let per_lock = |before: u64, after: u64| {
        #[allow(clippy::cast_precision_loss)]
        let v = after.saturating_sub(before) as f64 / held as f64;
        v
    };
    println!("\n{held} locks held at once (TTL {held_ttl:?}, renewal period {period:?}):");
    println!("  acquired in {acquired_in:?}; still held after 5 s: {still_held}/{held}");
    println!(
        "  renewals per period: {}; round trips per period: {} ({:.0} renewals per round trip)",
        (after.renewals - before.renewals) / periods,
        (after.round_trips - before.round_trips) / periods,
        bench::ratio(
            (after.renewals - before.renewals) as f64,
            (after.round_trips - before.round_trips) as f64
        )
    );
    println!(
        "  memory per held lock: client {:.0} bytes (RSS), server {:.0} bytes (used_memory)",
        per_lock(rss_before, rss_after),
        per_lock(server_before, server_after)
    );
    for guard in guards {
        guard.release().await?;
    }
    Ok(())
}
