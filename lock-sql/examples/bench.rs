//! Benchmark: our acquire+release cycle against the raw floor, the same
//! two statements issued by hand with sqlx on the same pool
//! ([`lock_sql::floor::SqlFloor`]), per database.
//!
//! `cargo run --release -p lock-sql --example bench`
//!
//! Starts its own PostgreSQL and MariaDB where installed (skipped with a
//! note otherwise) and uses a SQLite file in a temporary directory. Runs
//! ours and the floor in alternating rounds so both see the same machine
//! load, sequentially on one key and with 8 tasks on 8 keys, and prints
//! p50/p99 and the ratios. Measures only; asserts nothing.
//!
//! Environment: `BENCH_CYCLES` (per variant, default 2000), `BENCH_ROUNDS`
//! (alternations, default 4).

use std::time::Duration;

use conformance::bench::{LatencyStats, ratio};
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use lock_core::LockKey;
use lock_sql::SqlBackend;
use lock_sql::floor::SqlFloor;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);
const TASKS: usize = 8;

async fn our_cycle(backend: &SqlBackend, key: &LockKey) -> Result<(), lock_core::LockError> {
    conformance::bench::cycle(backend, key, TTL).await
}

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Ours,
    Raw,
}

/// Runs `cycles` cycles spread over `tasks` tasks (each on its own key) and
/// returns every cycle's latency.
async fn run(
    backend: &SqlBackend,
    floor: &SqlFloor,
    variant: Variant,
    prefix: &str,
    tasks: usize,
    cycles: usize,
) -> Vec<Duration> {
    let per_task = cycles / tasks;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let backend = backend.clone();
        let floor = floor.clone();
        let name = format!("bench/{prefix}-{t}");
        handles.push(tokio::spawn(async move {
            let key = LockKey::new(name.clone()).expect("valid key");
            let mut samples = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                let started = Instant::now();
                match variant {
                    Variant::Ours => our_cycle(&backend, &key).await.expect("our cycle"),
                    Variant::Raw => floor.cycle(&name, TTL).await.expect("raw cycle"),
                }
                samples.push(started.elapsed());
            }
            samples
        }));
    }
    let mut all = Vec::with_capacity(cycles);
    for handle in handles {
        all.extend(handle.await.expect("bench task"));
    }
    all
}

struct Row2 {
    database: String,
    mode: &'static str,
    ours: LatencyStats,
    raw: LatencyStats,
}

async fn bench_database(name: &str, url: &str, cycles: usize, rounds: usize) -> Vec<Row2> {
    let backend = match SqlBackend::connect_url(url).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{name}: cannot connect: {e}");
            return Vec::new();
        }
    };
    let floor = SqlFloor::from_backend(&backend);
    let mut rows = Vec::new();
    for (mode, tasks) in [("sequential", 1), ("8 tasks/8 keys", TASKS)] {
        // Warm up both paths (connections, prepared statements, rows).
        let _ = run(
            &backend,
            &floor,
            Variant::Ours,
            "warm",
            tasks,
            100.max(tasks * 10),
        )
        .await;
        let _ = run(
            &backend,
            &floor,
            Variant::Raw,
            "warm",
            tasks,
            100.max(tasks * 10),
        )
        .await;
        let mut ours = Vec::new();
        let mut raw = Vec::new();
        let mut ours_wall = Duration::ZERO;
        let mut raw_wall = Duration::ZERO;
        let per_round = (cycles / rounds).max(tasks);
        for round in 0..rounds {
            // Alternate which goes first, so neither always runs warmer.
            let order = if round % 2 == 0 {
                [Variant::Ours, Variant::Raw]
            } else {
                [Variant::Raw, Variant::Ours]
            };
            for variant in order {
                let started = Instant::now();
                let samples = run(&backend, &floor, variant, "k", tasks, per_round).await;
                let wall = started.elapsed();
                if variant == Variant::Ours {
                    ours.extend(samples);
                    ours_wall += wall;
                } else {
                    raw.extend(samples);
                    raw_wall += wall;
                }
            }
        }
        rows.push(Row2 {
            database: name.to_owned(),
            mode,
            ours: LatencyStats::from_samples(ours, ours_wall),
            raw: LatencyStats::from_samples(raw, raw_wall),
        });
    }
    let _ = backend.close().await;
    rows
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let cycles = env_usize("BENCH_CYCLES", 2000);
    let rounds = env_usize("BENCH_ROUNDS", 4);
    let mut rows = Vec::new();

    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite_url = format!(
        "sqlite://{}?pool_size=8",
        dir.path().join("bench.db").display()
    );
    rows.extend(bench_database("sqlite (file, WAL)", &sqlite_url, cycles, rounds).await);

    match PostgresServer::start().await {
        Ok(server) => {
            let url = format!("{}?pool_size=8", server.url());
            rows.extend(bench_database("postgres 15", &url, cycles, rounds).await);
        }
        Err(e) => eprintln!("postgres skipped: {e}"),
    }
    match MariaDbServer::start().await {
        Ok(server) => {
            let url = format!("{}?pool_size=8", server.url());
            rows.extend(bench_database("mariadb", &url, cycles, rounds).await);
        }
        Err(e) => eprintln!("mariadb skipped: {e}"),
    }

    println!(
        "\nlock-sql: acquire+release cycle vs the same two statements by hand on the same pool \
         ({cycles} cycles per variant, {rounds} alternating rounds)\n"
    );
    println!(
        "{:<20} {:<16} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>10} {:>10}",
        "database",
        "mode",
        "ours p50",
        "raw p50",
        "ours p99",
        "raw p99",
        "p50 x",
        "p99 x",
        "ours/s",
        "raw/s"
    );
    for r in &rows {
        println!(
            "{:<20} {:<16} {:>8.0}us {:>8.0}us {:>8.0}us {:>8.0}us {:>8.3} {:>8.3} {:>10.0} {:>10.0}",
            r.database,
            r.mode,
            r.ours.p50_us,
            r.raw.p50_us,
            r.ours.p99_us,
            r.raw.p99_us,
            ratio(r.ours.p50_us, r.raw.p50_us),
            ratio(r.ours.p99_us, r.raw.p99_us),
            r.ours.per_sec,
            r.raw.per_sec,
        );
    }
}
