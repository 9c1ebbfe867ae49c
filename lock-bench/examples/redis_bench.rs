//! Benchmark of the Redis driver, used as users use it, against the raw
//! floor written by hand on bare connections, in one run against
//! redis-servers started here.
//!
//! ```text
//! cargo run --release -p lock-bench --example redis_bench
//! ```
//!
//! - **ours**: `client.lock(k).ttl(30s).wait(60s).acquire()` then
//!   `guard.release()`, each client its own `lock_redis::connect(url)`;
//! - **floor**: [`lock_bench::redis::RedisFloor`] (`EVALSHA` acquire +
//!   `EVALSHA` release on one bare TCP connection, RESP by hand), each
//!   client its own floor.
//!
//! Measured, ours and the floor interleaved round by round (the order
//! swapped every round) so both see the same machine load:
//! 1 client (p50, p99, cycles/s), 8 independent clients on 8 keys
//! (throughput), 4 clients contending on one key (handoffs/s and spread),
//! 10,000 locks held at once (renewal round trips per period, memory per
//! held lock), and the same 1- and 8-client runs on Redlock over 5 servers
//! against [`lock_bench::redis::RedlockFloor`]; one permit of a semaphore
//! (1 client) against [`lock_bench::redis::RedisPermitFloor`], and 8
//! readers on one key against 8 clients of the mutex on one key (each
//! holding 1 ms).
//!
//! Environment: `BENCH_CYCLES` (1-client cycles per round, default 2000),
//! `BENCH_ROUNDS` (default 5), `BENCH_LOCKS` (held locks, default 10000;
//! 0 skips), `BENCH_REDLOCK` (`0` skips the Redlock runs).

mod redis_bench_support;

use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{self, LatencyStats};
use conformance::floor::RawFloor;
use conformance::servers::redis::RedisServer;
use lock_bench::redis::{RedisFloor, RedisPermitFloor, RedlockFloor};
use lock_core::LockClient;
use redis_bench_support::{BoxError, CLIENTS, TTL, WAIT, env, ours_cycle};
use tokio::time::Instant;

fn line(label: &str, s: &LatencyStats) {
    println!(
        "  {label:<40} p50 {:>8.1} us  p99 {:>8.1} us  {:>9.0} cycles/s",
        s.p50_us, s.p99_us, s.per_sec
    );
}

/// Ours against the floor, one client: the p50, p99 and throughput ratios.
fn ratios(ours: &LatencyStats, floor: &LatencyStats) {
    println!(
        "  ours/floor: p50 {:.3}x  p99 {:.3}x  throughput {:.3}x",
        bench::ratio(ours.p50_us, floor.p50_us),
        bench::ratio(ours.p99_us, floor.p99_us),
        bench::ratio(ours.per_sec, floor.per_sec)
    );
}

/// The round with the median p50 (1 client) or the median rate (8).
fn median_by(mut runs: Vec<LatencyStats>, key: fn(&LatencyStats) -> f64) -> LatencyStats {
    runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    runs[runs.len() / 2]
}

/// One deployment's clients: ours and the floors, one connection each.
struct Side {
    ours: Arc<Vec<LockClient>>,
    floors: Arc<Vec<Arc<dyn RawFloor>>>,
}

impl Side {
    async fn connect(
        url: &str,
        floor: impl AsyncFn(&str) -> Result<Arc<dyn RawFloor>, lock_core::LockError>,
    ) -> Result<Self, BoxError> {
        let mut ours = Vec::new();
        let mut floors = Vec::new();
        for _ in 0..CLIENTS {
            ours.push(LockClient::new(lock_redis::connect(url).await?));
            floors.push(floor(url).await?);
        }
        Ok(Self {
            ours: Arc::new(ours),
            floors: Arc::new(floors),
        })
    }

    /// 1 client, then 8 clients on 8 keys, ours and the floor interleaved.
    async fn run(&self, name: &str, cycles: usize, rounds: usize) -> Result<(), BoxError> {
        // Warm-up.
        for i in 0..CLIENTS {
            for _ in 0..200 {
                ours_cycle(&self.ours[i], "warm").await?;
                self.floors[i].cycle("warm-floor", TTL).await?;
            }
        }
        let (mut ours1, mut floor1, mut ours8, mut floor8) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            for side in [round % 2, 1 - round % 2] {
                if side == 0 {
                    let client = &self.ours[0];
                    ours1.push(
                        bench::measure_sequential(cycles, |_| ours_cycle(client, "seq-ours"))
                            .await?,
                    );
                    let clients = self.ours.clone();
                    ours8.push(
                        bench::measure_parallel(CLIENTS, cycles / 2, move |t, _| {
                            let clients = clients.clone();
                            async move { ours_cycle(&clients[t], &format!("par-ours-{t}")).await }
                        })
                        .await?,
                    );
                } else {
                    let floor = &self.floors[0];
                    floor1.push(
                        bench::measure_sequential(cycles, |_| floor.cycle("seq-floor", TTL))
                            .await?,
                    );
                    let floors = self.floors.clone();
                    floor8.push(
                        bench::measure_parallel(CLIENTS, cycles / 2, move |t, _| {
                            let floors = floors.clone();
                            async move { floors[t].cycle(&format!("par-floor-{t}"), TTL).await }
                        })
                        .await?,
                    );
                }
            }
        }
        let p50 = |s: &LatencyStats| s.p50_us;
        let rate = |s: &LatencyStats| s.per_sec;
        let (ours1, floor1) = (median_by(ours1, p50), median_by(floor1, p50));
        let (ours8, floor8) = (median_by(ours8, rate), median_by(floor8, rate));
        let rt = self.floors[0].round_trips_per_cycle();
        println!("\n{name}: 1 client, acquire (wait 60 s) + release:");
        line(&format!("floor ({rt} round trips)"), &floor1);
        line("ours", &ours1);
        ratios(&ours1, &floor1);
        println!("{name}: {CLIENTS} independent clients on {CLIENTS} keys:");
        line("floor", &floor8);
        line("ours", &ours8);
        println!(
            "  ours/floor: p50 {:.3}x  throughput {:.3}x",
            bench::ratio(ours8.p50_us, floor8.p50_us),
            bench::ratio(ours8.per_sec, floor8.per_sec)
        );
        Ok(())
    }

    /// 4 of our clients contending on one key for `duration`
    /// (`conformance::bench::handoffs`, as `distlock-compare compare` measures it).
    async fn handoffs(&self, duration: Duration) -> Result<(), BoxError> {
        let contenders: Vec<Arc<dyn bench::Contender>> = self
            .ours
            .iter()
            .take(4)
            .map(|c| Arc::new(bench::Ours::new(c.clone(), TTL)) as Arc<dyn bench::Contender>)
            .collect();
        let h = bench::handoffs(&contenders, "handoff", duration).await?;
        println!(
            "\n4 clients on one key (ours): {:.0} handoffs/s, per client {:?} \
             (busiest/least busy {:.2}x)",
            h.per_sec,
            h.per_client,
            h.spread()
        );
        Ok(())
    }
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

/// One permit of a semaphore of 3 as a user takes it, then releases it.
async fn permit_cycle(client: &LockClient, key: &str) -> Result<(), lock_core::LockError> {
    let guard = client
        .semaphore(key, 3)
        .ttl(TTL)
        .wait(WAIT)
        .acquire()
        .await?;
    guard.release().await?;
    Ok(())
}

/// A permit acquire+release (1 client) against the permit floor, and 8
/// clients on one key as readers against 8 on one key as a mutex.
async fn shared_kinds(url: &str, cycles: usize, rounds: usize) -> Result<(), BoxError> {
    let client = LockClient::new(lock_redis::connect(url).await?);
    let floor = RedisPermitFloor::connect(url, 1, 3).await?;
    for _ in 0..200 {
        permit_cycle(&client, "warm-permit").await?;
        floor.cycle("warm-permit-floor", TTL).await?;
    }
    let (mut ours, mut floors) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for side in [round % 2, 1 - round % 2] {
            if side == 0 {
                ours.push(
                    bench::measure_sequential(cycles, |_| permit_cycle(&client, "permit-ours"))
                        .await?,
                );
            } else {
                floors.push(
                    bench::measure_sequential(cycles, |_| floor.cycle("permit-floor", TTL)).await?,
                );
            }
        }
    }
    let p50 = |s: &LatencyStats| s.p50_us;
    let (ours, floors) = (median_by(ours, p50), median_by(floors, p50));
    println!(
        "
redis: 1 client, one permit of 3 (wait 60 s) + release:"
    );
    line(
        &format!(
            "permit floor ({} round trips)",
            floor.round_trips_per_cycle()
        ),
        &floors,
    );
    line("ours", &ours);
    ratios(&ours, &floors);
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(LockClient::new(lock_redis::connect(url).await?));
    }
    let clients = Arc::new(clients);
    let hold = Duration::from_millis(1);
    let (mut readers, mut mutex) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for side in [round % 2, 1 - round % 2] {
            let clients = clients.clone();
            let stats = bench::measure_parallel(CLIENTS, cycles / 20, move |t, _| {
                let clients = clients.clone();
                async move {
                    let request = if side == 0 {
                        clients[t].read_lock("readers")
                    } else {
                        clients[t].lock("readers-mutex")
                    };
                    let guard = request.ttl(TTL).wait(WAIT).acquire().await?;
                    tokio::time::sleep(hold).await;
                    guard.release().await.map(drop)
                }
            })
            .await?;
            if side == 0 {
                readers.push(stats);
            } else {
                mutex.push(stats);
            }
        }
    }
    let rate = |s: &LatencyStats| s.per_sec;
    let (readers, mutex) = (median_by(readers, rate), median_by(mutex, rate));
    println!("redis: {CLIENTS} clients on one key, each holding 1 ms:");
    line("mutex", &mutex);
    line("readers", &readers);
    println!(
        "  readers/mutex throughput {:.3}x",
        bench::ratio(readers.per_sec, mutex.per_sec)
    );
    Ok(())
}

/// Many locks held at once, renewed by their guards.
async fn held_locks(url: &str, held: usize) -> Result<(), BoxError> {
    let period = Duration::from_secs(1);
    let held_ttl = period * 3;
    let many = lock_redis::connect(url).await?;
    let client = LockClient::new(many.clone());
    let rss_before = rss_bytes();
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
    // Let the first renewals happen, then count over 3 periods.
    tokio::time::sleep(period * 2).await;
    let before = many.renewal_stats();
    tokio::time::sleep(period * 3).await;
    let after = many.renewal_stats();
    let still_held = guards.iter().filter(|g| g.is_held()).count();
    #[allow(clippy::cast_precision_loss)]
    let per_lock = rss_after.saturating_sub(rss_before) as f64 / held as f64;
    println!("\n{held} locks held at once (TTL {held_ttl:?}, renewal period {period:?}):");
    println!("  acquired in {acquired_in:?}; still held after 5 s: {still_held}/{held}");
    println!(
        "  renewals per period: {}; round trips per period: {}; client RSS per held lock {per_lock:.0} bytes",
        (after.renewals - before.renewals) / 3,
        (after.round_trips - before.round_trips) / 3,
    );
    for guard in guards {
        guard.release().await?;
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let cycles = env("BENCH_CYCLES", 2000);
    let rounds = env("BENCH_ROUNDS", 5).max(1);
    let held = env("BENCH_LOCKS", 10_000);
    let server = RedisServer::start().await?;
    let url = server.url();
    println!("redis-server on {url}; {cycles} cycles per round, {rounds} interleaved rounds");
    let single = Side::connect(&url, async |url| {
        Ok(Arc::new(RedisFloor::connect(url).await?) as Arc<dyn RawFloor>)
    })
    .await?;
    single.run("redis", cycles, rounds).await?;
    single.handoffs(Duration::from_secs(3)).await?;
    drop(single);
    shared_kinds(&url, cycles, rounds).await?;
    if env("BENCH_REDLOCK", 1) != 0 {
        let mut nodes = Vec::new();
        for _ in 0..5 {
            nodes.push(RedisServer::start().await?);
        }
        let hosts: Vec<String> = nodes
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        let url = format!("redlock://{}", hosts.join(","));
        let redlock = Side::connect(&url, async |url| {
            Ok(Arc::new(RedlockFloor::connect(url).await?) as Arc<dyn RawFloor>)
        })
        .await?;
        redlock
            .run("redlock (5 servers)", cycles / 2, rounds)
            .await?;
    }
    if held > 0 {
        held_locks(&url, held).await?;
    }
    Ok(())
}
