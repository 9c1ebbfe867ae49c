//! Benchmark of session mode (`?mode=session`) against its floor
//! ([`lock_sql::SessionFloor`]: the same grant statement and release by
//! hand on one bare connection), with row mode's own cycle for context.
//!
//! `cargo run --release -p lock-sql --example session_bench`
//!
//! Starts its own PostgreSQL and MariaDB (skipped with a note where not
//! installed). Ours is the user's cycle:
//! `client.lock(k).ttl(30s).wait(60s).acquire()` then `guard.release()`.
//! Prints, per database: 1 client p50 (ours and floor interleaved), 8
//! independent clients on 8 keys (each its own backend / floor
//! connection), 4 clients on one key (handoffs and the busiest / least
//! busy client), and round trips per cycle counted by the fault proxy.
//! Measures only; asserts nothing.
//!
//! Environment: `BENCH_CYCLES` (1-client cycles per side, default 2000),
//! `BENCH_ROUNDS` (alternations, default 6), `BENCH_HANDOFF_SECS`
//! (default 3).

use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{
    Contender, FloorCycle, Ours, handoffs, interleaved_latency, interleaved_throughput, ratio,
    round_trips_per_cycle,
};
use conformance::proxy::FaultProxy;
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use lock_core::LockClient;
use lock_sql::{SessionFloor, SqlSessionBackend};

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

    let (a, f) = (ours(&url).await, floor(&url).await);
    let (o, fl) = interleaved_latency(
        &*a,
        &*f,
        (&format!("{tag}/lat-o"), &format!("{tag}/lat-f")),
        cycles,
        rounds,
    )
    .await
    .expect("latency");
    let (r, _) = interleaved_latency(
        &*row,
        &*f,
        (&format!("{tag}/lat-r"), &format!("{tag}/lat-f2")),
        cycles / 2,
        rounds,
    )
    .await
    .expect("row latency");
    println!(
        "{name} 1 client p50: session ours {:.0} us, floor {:.0} us, ratio {:.2}x (p99 {:.0} / {:.0} us); row mode ours {:.0} us",
        o.p50_us,
        fl.p50_us,
        ratio(o.p50_us, fl.p50_us),
        o.p99_us,
        fl.p99_us,
        r.p50_us
    );

    let mut ours8 = Vec::new();
    let mut floors8 = Vec::new();
    for _ in 0..8 {
        ours8.push(ours(&url).await);
        floors8.push(floor(&url).await);
    }
    let (o8, f8) = interleaved_throughput(
        &ours8,
        &floors8,
        (&format!("{tag}/t-o"), &format!("{tag}/t-f")),
        cycles / 4,
        rounds,
    )
    .await
    .expect("throughput");
    println!(
        "{name} 8 clients on 8 keys: ours {:.0}/s, floor {:.0}/s, ratio {:.2}x (p50 {:.0} / {:.0} us)",
        o8.per_sec,
        f8.per_sec,
        o8.per_sec / f8.per_sec.max(1e-9),
        o8.p50_us,
        f8.p50_us
    );

    let secs = u64::try_from(env("BENCH_HANDOFF_SECS", 3)).unwrap_or(3);
    let h_ours = handoffs(
        &ours8[..4],
        &format!("{tag}/h-o"),
        Duration::from_secs(secs),
    )
    .await
    .expect("handoffs");
    let h_floor = handoffs(
        &floors8[..4],
        &format!("{tag}/h-f"),
        Duration::from_secs(secs),
    )
    .await
    .expect("floor handoffs");
    println!(
        "{name} 4 clients on one key: ours {:.0} handoffs/s {:?} (spread {:.2}), floor {:.0}/s {:?} (spread {:.2}), ratio {:.2}x",
        h_ours.per_sec,
        h_ours.per_client,
        h_ours.spread(),
        h_floor.per_sec,
        h_floor.per_client,
        h_floor.spread(),
        h_ours.per_sec / h_floor.per_sec.max(1e-9)
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
