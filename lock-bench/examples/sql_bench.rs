//! Benchmark of the SQL driver (row mode), used as users use it, against
//! the raw floor written by hand on one bare connection, per database.
//!
//! ```text
//! cargo run --release -p lock-bench --example sql_bench
//! ```
//!
//! - **ours**: `client.lock(k).ttl(30s).wait(60s).acquire()` then
//!   `guard.release()`, each client its own `lock_sql::connect(url)`;
//! - **floor**: [`lock_bench::sql::SqlFloor`] (the driver's grant and
//!   guarded release statements by hand on one bare connection), each
//!   client its own floor; contended, a floor asks again at once (a
//!   hand-written polling loop).
//!
//! Starts its own PostgreSQL and MariaDB where installed (skipped with a
//! note otherwise) and uses a SQLite file in a temporary directory. Ours and
//! the floor run interleaved round by round (the order swapped every round)
//! so both see the same machine load: 1 client (p50, p99), 8 independent
//! clients on 8 keys (throughput), 4 independent clients contending on one
//! key (handoffs/s and the busiest client's grants over the least busy
//! one's), and, on the servers, round trips per cycle counted by the fault
//! proxy. Measures only; asserts nothing.
//!
//! Environment: `BENCH_CYCLES` (1-client cycles per variant, default
//! 2000), `BENCH_ROUNDS` (alternations, default 4), `BENCH_HANDOFF_SECS`
//! (seconds per handoff round, default 3).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{self, Contender, FloorCycle, Handoffs, LatencyStats, Ours};
use conformance::floor::RawFloor;
use conformance::proxy::FaultProxy;
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use lock_bench::sql::SqlFloor;
use lock_core::LockClient;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TTL: Duration = Duration::from_secs(30);
const CLIENTS: usize = 8;
const HANDOFF_CLIENTS: usize = 4;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

async fn ours(url: &str) -> Result<Arc<dyn Contender>, BoxError> {
    let client = LockClient::new(lock_sql::connect(url).await?);
    Ok(Arc::new(Ours::new(client, TTL)))
}

async fn floor(url: &str) -> Result<Arc<dyn Contender>, BoxError> {
    let floor: Box<dyn RawFloor> = Box::new(SqlFloor::connect(url).await?);
    Ok(Arc::new(FloorCycle::new(floor, TTL)))
}

struct Report {
    database: String,
    one: (LatencyStats, LatencyStats),
    eight: (LatencyStats, LatencyStats),
    handoffs: (Handoffs, Handoffs),
    round_trips: Option<(f64, f64)>,
}

/// Handoff rounds, ours and the floor alternating; per-client grants and
/// rates summed over the rounds.
async fn handoffs(
    ours: &[Arc<dyn Contender>],
    floors: &[Arc<dyn Contender>],
    run: &str,
    rounds: usize,
    secs: usize,
) -> Result<(Handoffs, Handoffs), BoxError> {
    let duration = Duration::from_secs(u64::try_from(secs).unwrap_or(3));
    let mut sums = (Handoffs::default(), Handoffs::default());
    for round in 0..rounds {
        for side in [round % 2, 1 - round % 2] {
            let (who, sum, key) = if side == 0 {
                (ours, &mut sums.0, format!("{run}/handoff-ours"))
            } else {
                (floors, &mut sums.1, format!("{run}/handoff-floor"))
            };
            let h = bench::handoffs(who, &key, duration).await?;
            sum.per_sec += h.per_sec / rounds as f64;
            if sum.per_client.is_empty() {
                sum.per_client = vec![0; h.per_client.len()];
            }
            for (total, n) in sum.per_client.iter_mut().zip(&h.per_client) {
                *total += n;
            }
        }
    }
    Ok(sums)
}

async fn bench_database(
    name: &str,
    url: &str,
    proxied: Option<(&str, &FaultProxy)>,
) -> Result<Report, BoxError> {
    let cycles = env("BENCH_CYCLES", 2000);
    let rounds = env("BENCH_ROUNDS", 4);
    let secs = env("BENCH_HANDOFF_SECS", 3);
    let run = &lock_core::OwnerId::random().to_hex()[..8];
    let mut our_clients = Vec::new();
    let mut floors = Vec::new();
    for _ in 0..CLIENTS {
        our_clients.push(ours(url).await?);
        floors.push(floor(url).await?);
    }
    // Warm-up: connections, prepared statements, rows.
    for (o, f) in our_clients.iter().zip(&floors) {
        for _ in 0..50 {
            o.cycle(&format!("{run}/warm")).await?;
            f.cycle(&format!("{run}/warm-floor")).await?;
        }
    }
    let one = bench::interleaved_latency(
        &*our_clients[0],
        &*floors[0],
        (&format!("{run}/seq-ours"), &format!("{run}/seq-floor")),
        cycles,
        rounds,
    )
    .await?;
    let eight = bench::interleaved_throughput(
        &our_clients,
        &floors,
        (&format!("{run}/par-ours"), &format!("{run}/par-floor")),
        cycles / 2,
        rounds,
    )
    .await?;
    let handoffs = handoffs(
        &our_clients[..HANDOFF_CLIENTS],
        &floors[..HANDOFF_CLIENTS],
        run,
        2,
        secs,
    )
    .await?;
    let round_trips = match proxied {
        Some((url, proxy)) => {
            let ours = ours(url).await?;
            let floor = floor(url).await?;
            let o = bench::round_trips_per_cycle(&*ours, proxy, &format!("{run}/rt-ours"), 5, 200)
                .await?;
            let f =
                bench::round_trips_per_cycle(&*floor, proxy, &format!("{run}/rt-floor"), 5, 200)
                    .await?;
            Some((o, f))
        }
        None => None,
    };
    Ok(Report {
        database: name.to_owned(),
        one,
        eight,
        handoffs,
        round_trips,
    })
}

/// `url` with the server's port replaced by the proxy's.
fn through(url: &str, port: u16, proxy: &FaultProxy) -> String {
    url.replace(
        &format!("127.0.0.1:{port}/"),
        &format!("127.0.0.1:{}/", proxy.port()),
    )
}

fn print(r: &Report) {
    let (o1, f1) = &r.one;
    let (o8, f8) = &r.eight;
    let (oh, fh) = &r.handoffs;
    println!("\n{}:", r.database);
    println!(
        "  1 client      p50 ours {:>7.0} us  floor {:>7.0} us  ({:.3}x);  p99 ours {:>7.0} us  floor {:>7.0} us  ({:.3}x)",
        o1.p50_us,
        f1.p50_us,
        bench::ratio(o1.p50_us, f1.p50_us),
        o1.p99_us,
        f1.p99_us,
        bench::ratio(o1.p99_us, f1.p99_us),
    );
    println!(
        "  {CLIENTS} clients/{CLIENTS} keys  ours {:>7.0}/s  floor {:>7.0}/s  ({:.3}x)",
        o8.per_sec,
        f8.per_sec,
        bench::ratio(o8.per_sec, f8.per_sec),
    );
    println!(
        "  {HANDOFF_CLIENTS} clients/1 key  ours {:>7.0} handoffs/s {:?} (spread {:.2}x)  floor {:>7.0}/s {:?} (spread {:.2}x)  ({:.3}x)",
        oh.per_sec,
        oh.per_client,
        oh.spread(),
        fh.per_sec,
        fh.per_client,
        fh.spread(),
        bench::ratio(oh.per_sec, fh.per_sec),
    );
    if let Some((o, f)) = r.round_trips {
        println!("  round trips per cycle (proxy)  ours {o:.2}  floor {f:.2}");
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let mut reports = Vec::new();

    let dir = tempfile::tempdir()?;
    let sqlite = format!("sqlite://{}", dir.path().join("bench.db").display());
    reports.push(bench_database("sqlite (file, WAL)", &sqlite, None).await?);
    print(&reports[reports.len() - 1]);

    match PostgresServer::start().await {
        Ok(server) => {
            let proxy =
                FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], server.port()))).await?;
            let proxied = through(&server.url(), server.port(), &proxy);
            reports.push(
                bench_database("postgres 15", &server.url(), Some((&proxied, &proxy))).await?,
            );
            print(&reports[reports.len() - 1]);
        }
        Err(e) => eprintln!("postgres skipped: {e}"),
    }
    match MariaDbServer::start().await {
        Ok(server) => {
            let proxy =
                FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], server.port()))).await?;
            let proxied = through(&server.url(), server.port(), &proxy);
            reports.push(bench_database("mariadb", &server.url(), Some((&proxied, &proxy))).await?);
            print(&reports[reports.len() - 1]);
        }
        Err(e) => eprintln!("mariadb skipped: {e}"),
    }

    println!("\nlock-sql row mode vs its floor (ratios ours/floor):");
    println!(
        "{:<20} {:>9} {:>12} {:>11} {:>14} {:>10}",
        "database", "p50 x", "8 clients x", "handoffs x", "spread (ours)", "rt/cycle"
    );
    for r in &reports {
        let rt = r
            .round_trips
            .map_or_else(|| "-".to_owned(), |(o, f)| format!("{o:.1} ({f:.1})"));
        println!(
            "{:<20} {:>9.3} {:>12.3} {:>11.3} {:>14.2} {:>10}",
            r.database,
            bench::ratio(r.one.0.p50_us, r.one.1.p50_us),
            bench::ratio(r.eight.0.per_sec, r.eight.1.per_sec),
            bench::ratio(r.handoffs.0.per_sec, r.handoffs.1.per_sec),
            r.handoffs.0.spread(),
            rt,
        );
    }
    Ok(())
}
