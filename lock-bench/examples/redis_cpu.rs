//! CPU time per acquire+release cycle, ours against the floor, in one
//! process: a measure that a shared, busy machine does not blur the way it
//! blurs wall-clock throughput.
//!
//! ```text
//! cargo run --release -p lock-bench --example redis_cpu
//! ```
//!
//! For each contender it runs `CPU_CYCLES` cycles (default 20,000), first
//! on one client, then spread over 8 independent clients on 8 keys, and
//! prints the CPU time this process spent per cycle (every thread: the
//! runtime's workers, the renewal thread; read from
//! `/proc/self/task/*/schedstat`, nanoseconds) and the server's (from
//! `/proc/<pid>/stat`, clock ticks). Contenders, each on its own
//! connections:
//!
//! - **floor**: [`lock_bench::redis::RedisFloor`]'s cycle;
//! - **trait**: `LockBackendExt::acquire` (waiting) + `LockBackend::release`
//!   on a `RedisBackend`, no guard;
//! - **ours**: `client.lock(k).ttl(30s).wait(60s).acquire()` then
//!   `guard.release()`.
//!
//! The three run in alternating order over `CPU_ROUNDS` rounds (default 3);
//! the median per contender is printed. `CPU_ONLY=floor,ours` picks
//! contenders, `CPU_PAR=1` the client counts.

mod redis_bench_support;

use std::sync::Arc;

use conformance::cpu::{median, process_tree_cpu_ns, self_cpu_ns};
use conformance::floor::RawFloor;
use conformance::servers::redis::RedisServer;
use lock_bench::redis::RedisFloor;
use lock_core::{LockBackend, LockBackendExt, LockClient, LockError, LockKey};
use redis_bench_support::{BoxError, CLIENTS, TTL, WAIT, env, ours_cycle};
use tokio::time::Instant;

#[derive(Clone, Copy)]
enum Kind {
    Floor,
    Trait,
    Ours,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Floor => "floor",
            Self::Trait => "trait",
            Self::Ours => "ours",
        }
    }
}

struct Clients {
    floors: Vec<Arc<dyn RawFloor>>,
    backends: Vec<Arc<dyn LockBackend>>,
    ours: Vec<LockClient>,
}

async fn cycle(clients: &Clients, kind: Kind, i: usize, key: &str) -> Result<(), LockError> {
    match kind {
        Kind::Floor => clients.floors[i].cycle(key, TTL).await,
        Kind::Trait => {
            let backend = &clients.backends[i];
            let key = LockKey::new(key)?;
            let lease = backend.acquire(&key, TTL, Instant::now() + WAIT).await?;
            backend.release(&lease).await?;
            Ok(())
        }
        Kind::Ours => ours_cycle(&clients.ours[i], key).await,
    }
}

/// (client CPU us per cycle, server CPU us per cycle, wall us per cycle).
async fn measure(
    clients: &Arc<Clients>,
    kind: Kind,
    parallel: usize,
    cycles: usize,
    server: u32,
) -> Result<(f64, f64, f64), BoxError> {
    let per = cycles / parallel;
    let (cpu0, srv0, wall) = (
        self_cpu_ns(),
        process_tree_cpu_ns(Some(server)),
        Instant::now(),
    );
    let mut tasks = Vec::new();
    for t in 0..parallel {
        let clients = clients.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("cpu-{}-{t}", kind.name());
            for _ in 0..per {
                cycle(&clients, kind, t, &key).await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let wall = wall.elapsed();
    let (cpu1, srv1) = (self_cpu_ns(), process_tree_cpu_ns(Some(server)));
    #[allow(clippy::cast_precision_loss)]
    let n = (per * parallel) as f64;
    #[allow(clippy::cast_precision_loss)]
    Ok((
        (cpu1 - cpu0) as f64 / 1e3 / n,
        (srv1 - srv0) as f64 / 1e3 / n,
        wall.as_secs_f64() * 1e6 / n,
    ))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let cycles = env("CPU_CYCLES", 20_000);
    let rounds = env("CPU_ROUNDS", 3).max(1);
    let only = std::env::var("CPU_ONLY").ok();
    let mut server = RedisServer::start().await?;
    let pid = server.process().pid().ok_or("no server pid")?;
    let url = server.url();
    let mut clients = Clients {
        floors: Vec::new(),
        backends: Vec::new(),
        ours: Vec::new(),
    };
    for _ in 0..CLIENTS {
        clients
            .floors
            .push(Arc::new(RedisFloor::connect(&url).await?));
        clients
            .backends
            .push(Arc::new(lock_redis::connect(&url).await?));
        clients
            .ours
            .push(LockClient::new(lock_redis::connect(&url).await?));
    }
    let clients = Arc::new(clients);
    let kinds: Vec<Kind> = [Kind::Floor, Kind::Trait, Kind::Ours]
        .into_iter()
        .filter(|k| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|n| n == k.name()))
        })
        .collect();
    for kind in &kinds {
        measure(&clients, *kind, CLIENTS, 2000, pid).await?;
    }
    println!(
        "redis on {url}: {cycles} cycles per contender per round, {rounds} rounds; us per cycle"
    );
    let levels: Vec<usize> = std::env::var("CPU_PAR").map_or_else(
        |_| vec![1, CLIENTS],
        |v| v.split(',').filter_map(|n| n.parse().ok()).collect(),
    );
    for parallel in levels {
        let mut results: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); kinds.len()];
        for round in 0..rounds {
            for j in 0..kinds.len() {
                let j = if round % 2 == 0 {
                    j
                } else {
                    kinds.len() - 1 - j
                };
                results[j].push(measure(&clients, kinds[j], parallel, cycles, pid).await?);
            }
        }
        for (kind, runs) in kinds.iter().zip(results) {
            println!(
                "  {parallel} client(s) {:<6} client cpu {:>6.1}  server cpu {:>6.1}  wall {:>6.1}",
                kind.name(),
                median(runs.iter().map(|r| r.0).collect()),
                median(runs.iter().map(|r| r.1).collect()),
                median(runs.iter().map(|r| r.2).collect()),
            );
        }
    }
    Ok(())
}
