//! CPU time per acquire+release cycle, ours against the floor, in one
//! process: a measure that a shared, busy machine does not blur the way it
//! blurs wall-clock throughput.
//!
//! ```text
//! cargo run --release -p lock-bench --example sql_cpu
//! ```
//!
//! Per database (`CPU_DBS`, default `sqlite,postgres-session`; also
//! `postgres`, `mariadb`, `mariadb-session`) and contender it runs
//! `CPU_CYCLES` cycles (default 10,000), first on one client, then spread
//! over 8 independent clients on 8 keys, and prints the CPU time this
//! process spent per cycle (every live thread, from
//! `/proc/self/task/*/schedstat`, nanoseconds) and the server's (the
//! server process and its children, from `/proc/<pid>/stat`, clock ticks).
//! Contenders, each on its own connections, with the URLs `compare` uses:
//!
//! - **floor**: the database's floor (`SqlFloor`, or `SessionFloor` in
//!   session mode) asking again at once on a held key, as `compare` runs it;
//! - **trait**: `LockBackendExt::acquire` (waiting) + `LockBackend::release`,
//!   no guard;
//! - **ours**: `client.lock(k).ttl(30s).wait(60s).acquire()` then
//!   `guard.release()`.
//!
//! The three alternate over `CPU_ROUNDS` rounds (default 3); the median
//! per contender is printed. `CPU_ONLY=floor,ours` picks contenders,
//! `CPU_PAR=1` the client counts.

use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{Contender, FloorCycle};
use conformance::cpu::{median, process_tree_cpu_ns, self_cpu_ns};
use conformance::floor::RawFloor;
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use lock_bench::sql::SessionFloor;
use lock_bench::sql::SqlFloor;
use lock_core::{LockBackend, LockBackendExt, LockClient, LockError, LockKey};
use lock_sql::{SqlConfig, SqlMode};
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TTL: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(60);
const CLIENTS: usize = 8;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Trait(Arc<dyn LockBackend>);

#[lock_core::async_trait]
impl Contender for Trait {
    async fn cycle(&self, key: &str) -> Result<(), LockError> {
        let key = LockKey::new(key)?;
        let lease = self.0.acquire(&key, TTL, Instant::now() + WAIT).await?;
        self.0.release(&lease).await?;
        Ok(())
    }
}

struct Ours(LockClient);

#[lock_core::async_trait]
impl Contender for Ours {
    async fn cycle(&self, key: &str) -> Result<(), LockError> {
        let guard = self.0.lock(key).ttl(TTL).wait(WAIT).acquire().await?;
        guard.release().await?;
        Ok(())
    }
}

/// (client CPU us per cycle, server CPU us per cycle, wall us per cycle).
async fn measure(
    contenders: &[Arc<dyn Contender>],
    name: &str,
    parallel: usize,
    cycles: usize,
    server: Option<u32>,
) -> Result<(f64, f64, f64), BoxError> {
    let per = cycles / parallel;
    let (cpu0, srv0, wall) = (self_cpu_ns(), process_tree_cpu_ns(server), Instant::now());
    let mut tasks = Vec::new();
    for (t, contender) in contenders.iter().take(parallel).enumerate() {
        let contender = contender.clone();
        let key = format!("cpu-{name}-{t}");
        tasks.push(tokio::spawn(async move {
            for _ in 0..per {
                contender.cycle(&key).await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let wall = wall.elapsed();
    let (cpu1, srv1) = (self_cpu_ns(), process_tree_cpu_ns(server));
    #[allow(clippy::cast_precision_loss)]
    let n = (per * parallel) as f64;
    #[allow(clippy::cast_precision_loss)]
    Ok((
        cpu1.saturating_sub(cpu0) as f64 / 1e3 / n,
        srv1.saturating_sub(srv0) as f64 / 1e3 / n,
        wall.as_secs_f64() * 1e6 / n,
    ))
}

async fn floor(url: &str) -> Result<Box<dyn RawFloor>, LockError> {
    Ok(match SqlConfig::from_url(url)?.lock_mode() {
        SqlMode::Session => Box::new(SessionFloor::connect(url).await?),
        _ => Box::new(SqlFloor::connect(url).await?),
    })
}

async fn run(db: &str, url: &str, server: Option<u32>) -> Result<(), BoxError> {
    let cycles = env("CPU_CYCLES", 10_000);
    let rounds = env("CPU_ROUNDS", 3).max(1);
    let only = std::env::var("CPU_ONLY").ok();
    let mut sides: Vec<(&str, Vec<Arc<dyn Contender>>)> = vec![
        ("floor", Vec::new()),
        ("trait", Vec::new()),
        ("ours", Vec::new()),
    ];
    sides.retain(|(name, _)| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|n| n == *name))
    });
    for _ in 0..CLIENTS {
        for (name, list) in &mut sides {
            let contender: Arc<dyn Contender> = match *name {
                "floor" => Arc::new(FloorCycle::new(floor(url).await?, TTL)),
                "trait" => Arc::new(Trait(Arc::new(lock_sql::connect(url).await?))),
                _ => Arc::new(Ours(LockClient::new(lock_sql::connect(url).await?))),
            };
            list.push(contender);
        }
    }
    for (name, list) in &sides {
        measure(list, name, CLIENTS, 800, server).await?;
    }
    println!("{db}: {cycles} cycles per contender per round, {rounds} rounds; us per cycle");
    let levels: Vec<usize> = std::env::var("CPU_PAR").map_or_else(
        |_| vec![1, CLIENTS],
        |v| v.split(',').filter_map(|n| n.parse().ok()).collect(),
    );
    for parallel in levels {
        let mut results: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); sides.len()];
        for round in 0..rounds {
            for j in 0..sides.len() {
                let j = if round % 2 == 0 {
                    j
                } else {
                    sides.len() - 1 - j
                };
                let (name, list) = &sides[j];
                results[j].push(measure(list, name, parallel, cycles, server).await?);
            }
        }
        for ((name, _), runs) in sides.iter().zip(results) {
            println!(
                "  {parallel} client(s) {name:<6} client cpu {:>6.1}  server cpu {:>6.1}  wall {:>6.1}",
                median(runs.iter().map(|r| r.0).collect()),
                median(runs.iter().map(|r| r.1).collect()),
                median(runs.iter().map(|r| r.2).collect()),
            );
        }
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let dbs = std::env::var("CPU_DBS").unwrap_or_else(|_| "sqlite,postgres-session".into());
    for db in dbs.split(',') {
        match db {
            "sqlite" => {
                let dir = tempfile::tempdir()?;
                let url = format!("sqlite://{}", dir.path().join("locks.db").display());
                run(db, &url, None).await?;
            }
            "postgres" | "postgres-session" => {
                let mut server = PostgresServer::start().await?;
                let pid = server.process().pid();
                let mut url = server.url();
                if db.ends_with("-session") {
                    url.push_str("?mode=session");
                }
                run(db, &url, pid).await?;
            }
            "mariadb" | "mariadb-session" => {
                let mut server = MariaDbServer::start().await?;
                let pid = server.process().pid();
                let mut url = server.url();
                if db.ends_with("-session") {
                    url.push_str("?mode=session");
                }
                run(db, &url, pid).await?;
            }
            other => return Err(format!("unknown database {other:?}").into()),
        }
    }
    Ok(())
}
