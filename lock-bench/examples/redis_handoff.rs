//! Probe (not a test): Redis handoffs (issue #43), 4 clients on one key,
//! each looping a waiting acquire then a release, against a redis-server
//! this process starts:
//!
//! - ours: each client its own `LockClient` on its own
//!   `lock_redis::connect(url)` (`lock(key).ttl(30 s).wait(60 s)`,
//!   then `release`), waiting as the driver waits (release notification);
//! - the hand floor: each client its own [`lock_bench::redis::RedisFloor`]
//!   (the driver's acquire and release scripts on a bare connection),
//!   asking again at once while the key is held (no waiting at all).
//!
//! Windows of `WINDOW_MS` (default 1000) alternate between the two sides,
//! `ROUNDS` (default 5) each, the order swapped every round, each window on
//! a fresh key. Per side: the median handoffs/s (grants per second, all
//! clients), the median busiest/least-busy spread, and the release-to-grant
//! latency over all windows: from the moment a holder sends its release to
//! the next grant's answer (any client's, the releaser's own next grant
//! included), p50/p90/p99. Then ours / floor.
//!
//! ```text
//! cargo build --release -p lock-bench --example redis_handoff
//! target/release/examples/redis_handoff
//! FAIR=1 target/release/examples/redis_handoff   # ours in fair mode
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::floor::RawFloor;
use conformance::servers::redis::RedisServer;
use lock_bench::redis::RedisFloor;
use lock_core::LockClient;
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const CLIENTS: usize = 4;
const TTL: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(60);

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The moment the last release was sent, shared by a window's clients; a
/// grant takes it (so each release counts once, for the grant after it).
#[derive(Default)]
struct Handoff {
    released_at: Mutex<Option<Instant>>,
    gaps: Mutex<Vec<Duration>>,
}

impl Handoff {
    fn releasing(&self) {
        *self.released_at.lock().unwrap() = Some(Instant::now());
    }

    fn granted(&self) {
        let now = Instant::now();
        if let Some(at) = self.released_at.lock().unwrap().take() {
            self.gaps.lock().unwrap().push(now - at);
        }
    }
}

enum Side {
    Ours(Vec<LockClient>),
    Floor(Vec<Arc<RedisFloor>>),
}

/// One window of `window` on `key`: grants per client, and the gaps.
async fn window(
    side: &Side,
    key: &str,
    window: Duration,
) -> Result<(Vec<u64>, Vec<Duration>), BoxError> {
    let stop = Instant::now() + window;
    let handoff = Arc::new(Handoff::default());
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let key = key.to_owned();
        let handoff = handoff.clone();
        let task = match side {
            Side::Ours(clients) => {
                let client = clients[i].clone();
                tokio::spawn(async move {
                    let mut grants = 0u64;
                    while Instant::now() < stop {
                        let guard = client.lock(&key).ttl(TTL).wait(WAIT).acquire().await?;
                        handoff.granted();
                        grants += 1;
                        handoff.releasing();
                        guard.release().await?;
                    }
                    Ok::<_, BoxError>(grants)
                })
            }
            Side::Floor(floors) => {
                let floor = floors[i].clone();
                tokio::spawn(async move {
                    let mut grants = 0u64;
                    while Instant::now() < stop {
                        let grant = loop {
                            if let Some(grant) = floor.try_grant(&key, TTL).await? {
                                break grant;
                            }
                        };
                        handoff.granted();
                        grants += 1;
                        handoff.releasing();
                        floor.release(&grant).await?;
                    }
                    Ok::<_, BoxError>(grants)
                })
            }
        };
        tasks.push(task);
    }
    let mut per_client = Vec::new();
    for task in tasks {
        per_client.push(task.await??);
    }
    let gaps = std::mem::take(&mut *handoff.gaps.lock().unwrap());
    Ok((per_client, gaps))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn quantile_us(sorted: &[Duration], q: f64) -> f64 {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let rounds = usize::try_from(env("ROUNDS", 5))?;
    let window_len = Duration::from_millis(env("WINDOW_MS", 1000));
    let fair = env("FAIR", 0) == 1;
    let server = RedisServer::start().await?;
    let url = format!("redis://127.0.0.1:{}", server.port());
    let ours_url = if fair {
        format!("{url}?fair=true")
    } else {
        url.clone()
    };
    let mut clients = Vec::new();
    let mut floors = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(LockClient::new(lock_redis::connect(&ours_url).await?));
        floors.push(Arc::new(RedisFloor::connect(&url).await?));
    }
    let sides = [Side::Ours(clients), Side::Floor(floors)];
    let names = [if fair { "ours (fair)" } else { "ours" }, "hand floor"];
    // Warm-up: connections, scripts, pub/sub.
    for side in &sides {
        window(side, "handoff-warm", Duration::from_millis(300)).await?;
    }
    let mut rates = [Vec::new(), Vec::new()];
    let mut spreads = [Vec::new(), Vec::new()];
    let mut gaps = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for turn in 0..2 {
            let s = (turn + round) % 2;
            let key = format!("handoff-{round}-{s}");
            let started = Instant::now();
            let (per_client, g) = window(&sides[s], &key, window_len).await?;
            let secs = started.elapsed().as_secs_f64();
            #[allow(clippy::cast_precision_loss)]
            let total = per_client.iter().sum::<u64>() as f64;
            rates[s].push(total / secs);
            let (max, min) = (
                per_client.iter().copied().max().unwrap_or(0),
                per_client.iter().copied().min().unwrap_or(0),
            );
            #[allow(clippy::cast_precision_loss)]
            spreads[s].push(if min == 0 {
                f64::INFINITY
            } else {
                max as f64 / min as f64
            });
            gaps[s].extend(g);
        }
    }
    println!("Redis, {CLIENTS} clients on 1 key, {rounds} windows of {window_len:?} per side:");
    let mut medians = [0.0; 2];
    for s in 0..2 {
        gaps[s].sort();
        medians[s] = median(rates[s].clone());
        println!(
            "  {:<12} {:>8.0} handoffs/s (windows {:?})  spread {:.2}  release->grant p50 {:>7.1} us  p90 {:>7.1} us  p99 {:>8.1} us",
            names[s],
            medians[s],
            rates[s].iter().map(|r| r.round()).collect::<Vec<_>>(),
            median(spreads[s].clone()),
            quantile_us(&gaps[s], 0.5),
            quantile_us(&gaps[s], 0.9),
            quantile_us(&gaps[s], 0.99),
        );
    }
    println!("  ours / floor handoffs/s: {:.3}x", medians[0] / medians[1]);
    Ok(())
}
