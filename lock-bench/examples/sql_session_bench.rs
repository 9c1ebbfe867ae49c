//! Benchmark of session mode (`?mode=session`) against its floor
//! ([`lock_bench::sql::SessionFloor`]: the same grant statements and
//! releases by hand on one bare connection), with row mode's own cycle for
//! context.
//!
//! `cargo run --release -p lock-bench --example sql_session_bench`
//!
//! Starts its own PostgreSQL and MariaDB (skipped with a note where not
//! installed). Ours is the user's cycle:
//! `client.lock(k).ttl(30s).wait(60s).acquire()` then `guard.release()`.
//! Prints, per database, [`conformance::bench::StandardFigures`] (ours and
//! the floor interleaved): 1 client p50, 8 independent clients on 8 keys
//! (each its own backend / floor connection), 4 clients on one key
//! (handoffs and the busiest / least busy client); then row mode's p50 and
//! round trips per cycle counted by the fault proxy.
//! Measures only; asserts nothing.
//!
//! Environment: `BENCH_CYCLES` (1-client cycles per side, default 2000),
//! `BENCH_ROUNDS` (alternations, default 6), `BENCH_HANDOFF_SECS`
//! (default 3).

use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{
    Contender, FloorCycle, Ours, StandardRun, interleaved_latency, round_trips_per_cycle,
    standard_figures,
};
use conformance::proxy::FaultProxy;
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use lock_bench::sql::SessionFloor;
use lock_core::LockClient;
use lock_sql::SqlSessionBackend;

const TTL: Duration = Duration::from_secs(30);

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn ours(url: &str) -> Arc<dyn Contender> {
    let backend = SqlSessionBackend::connect_url(url).await.expect("connect");
    Arc::new(Ours::new(LockClient::new(backend), TTL))
}

async fn floor(url: &str) -> Arc<dyn Contender> {
    let floor = SessionFloor::connect(url).await.expect("floor");
    Arc::new(FloorCycle::new(Box::new(floor), TTL))
}

fn via(url: &str, port: u16, proxy: u16) -> String {
    url.replacen(&format!(":{port}/"), &format!(":{proxy}/"), 1)
}

async fn run(name: &str, base: &str, port: u16) {
    let url = format!("{base}?mode=session&pool_size=4");
    let cycles = env("BENCH_CYCLES", 2000);
    let rounds = env("BENCH_ROUNDS", 6);
    let tag = lock_core::OwnerId::random().to_hex()[..6].to_owned();

    // Row mode's user cycle on the same server, for context.
    let row = lock_sql::connect(base).await.expect("row mode");
    let row: Arc<dyn Contender> = Arc::new(Ours::new(LockClient::new(row), TTL));

    let (mut ours8, mut floors8) = (Vec::new(), Vec::new());
    for _ in 0..8 {
        ours8.push(ours(&url).await);
        floors8.push(floor(&url).await);
    }
    let mut run = StandardRun::new(cycles);
    run.rounds = rounds;
    run.handoff_window =
        Duration::from_secs(u64::try_from(env("BENCH_HANDOFF_SECS", 3)).unwrap_or(3));
    standard_figures(&ours8, &floors8, &run)
        .await
        .expect("standard figures")
        .print(
            name,
            "session mode (waiting acquire + release)",
            "session floor (bare connection)",
        );
    let (r, _) = interleaved_latency(
        &*row,
        &*floors8[0],
        (&format!("{tag}/lat-r"), &format!("{tag}/lat-f2")),
        cycles / 2,
        rounds,
    )
    .await
    .expect("row latency");
    println!(
        "{name} row mode's user cycle on the same server, for context: p50 {:.0} us",
        r.p50_us
    );

    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let p_ours = FaultProxy::start(addr).await.expect("proxy");
    let p_floor = FaultProxy::start(addr).await.expect("proxy");
    let o_rt = ours(&via(&url, port, p_ours.port())).await;
    let f_rt = floor(&via(&url, port, p_floor.port())).await;
    let ours_rt = round_trips_per_cycle(&*o_rt, &p_ours, &format!("{tag}/rt"), 10, 200)
        .await
        .expect("round trips");
    let floor_rt = round_trips_per_cycle(&*f_rt, &p_floor, &format!("{tag}/rt-f"), 10, 200)
        .await
        .expect("floor round trips");
    println!("{name} round trips per cycle (proxy): ours {ours_rt:.2}, floor {floor_rt:.2}");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    match PostgresServer::start().await {
        Ok(server) => run("postgres-session", &server.url(), server.port()).await,
        Err(e) => println!("postgres skipped: {e}"),
    }
    match MariaDbServer::start().await {
        Ok(server) => run("mariadb-session", &server.url(), server.port()).await,
        Err(e) => println!("mariadb skipped: {e}"),
    }
}
