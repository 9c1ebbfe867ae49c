//! Benchmark (not a test): our acquire+release cycle as users write it
//! (`client.lock(k).ttl(30s).wait(60s).acquire()`, then `guard.release()`)
//! against the raw floor ([`lock_zk::floor::ZkFloor`]: create / getChildren
//! / delete written by hand on one bare TCP connection), measured in one run
//! against a ZooKeeper server this program starts.
//!
//! `cargo run --release -p lock-zk --example zk_bench [-- <cycles>]`
//!
//! Prints, ours and the floor interleaved so that machine load hits both
//! alike:
//! - 1 client: p50/p99 per cycle and the ratios;
//! - 8 independent clients on 8 keys (each its own `connect()`, each floor
//!   its own connection): throughput and the ratio;
//! - 4 independent clients on one key: handoffs per second (the floor polls
//!   with `try_grant`; ours waits on its predecessor's watch) and the
//!   busiest client's grants over the least busy one's.

use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{
    self, Contender, FloorCycle, Handoffs, LatencyStats, Ours, handoffs, interleaved_latency,
    interleaved_throughput,
};
use conformance::process::HarnessError;
use conformance::servers::zookeeper::ZkServer;
use lock_core::LockClient;
use lock_core::floor::RawFloor;
use lock_zk::floor::ZkFloor;

const TTL: Duration = Duration::from_secs(30);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn line(label: &str, stats: &LatencyStats) {
    println!(
        "  {label:<40} p50 {:>8.1} us   p99 {:>8.1} us   {:>8.0} cycles/s   ({} samples)",
        stats.p50_us, stats.p99_us, stats.per_sec, stats.samples
    );
}

fn report(floor: &LatencyStats, ours: &LatencyStats) {
    line("raw floor (bare connection, by hand)", floor);
    line("lock-zk (waiting acquire + release)", ours);
    println!(
        "  ratio lock-zk / floor: p50 {:.3}x   p99 {:.3}x   throughput {:.3}x",
        bench::ratio(ours.p50_us, floor.p50_us),
        bench::ratio(ours.p99_us, floor.p99_us),
        bench::ratio(ours.per_sec, floor.per_sec)
    );
}

fn handoff_line(label: &str, h: &Handoffs) {
    println!(
        "  {label:<40} {:>8.0} handoffs/s   per client {:?}   spread {:.2}x",
        h.per_sec,
        h.per_client,
        h.spread()
    );
}

async fn ours(url: &str) -> Result<Arc<dyn Contender>, BoxError> {
    let client = LockClient::new(lock_zk::connect(url).await?);
    Ok(Arc::new(Ours::new(client, TTL)))
}

async fn floor(url: &str) -> Result<Arc<dyn Contender>, BoxError> {
    let floor: Box<dyn RawFloor> = Box::new(ZkFloor::connect(url).await?);
    Ok(Arc::new(FloorCycle::new(floor, TTL)))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let cycles: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let server = match ZkServer::start().await {
        Ok(server) => server,
        Err(err @ HarnessError::MissingBinary { .. }) => {
            eprintln!("cannot run the benchmark: {err}");
            return Ok(());
        }
        Err(err) => return Err(err.into()),
    };
    let url = format!("{}?session_timeout=10s", server.url());
    println!("ZooKeeper 3.8 on loopback, {cycles} cycles per side");

    let (one, one_floor) = (ours(&url).await?, floor(&url).await?);
    // Warm both paths (JIT on the server, key directories, allocators).
    for _ in 0..300 {
        one.cycle("seq").await?;
        one_floor.cycle("floor-seq").await?;
    }
    println!("\n1 client, sequential acquire+release on one key (10 interleaved rounds):");
    let (mine, theirs) =
        interleaved_latency(&*one, &*one_floor, ("seq", "floor-seq"), cycles, 10).await?;
    report(&theirs, &mine);

    let clients = 8;
    let mut ours8 = Vec::with_capacity(clients);
    let mut floors8 = Vec::with_capacity(clients);
    for _ in 0..clients {
        ours8.push(ours(&url).await?);
        floors8.push(floor(&url).await?);
    }
    let per_client = (cycles / 2).max(100);
    // Warm-up: every client's key directory exists before measuring.
    interleaved_throughput(&ours8, &floors8, ("par", "floor-par"), 20, 1).await?;
    println!(
        "\n{clients} independent clients on {clients} keys, {per_client} cycles each (4 interleaved rounds):"
    );
    let (mine, theirs) =
        interleaved_throughput(&ours8, &floors8, ("par", "floor-par"), per_client, 4).await?;
    report(&theirs, &mine);

    println!("\n4 independent clients on one key, 3 s each side:");
    let run = Duration::from_secs(3);
    let floor4: Vec<_> = floors8[..4].to_vec();
    let ours4: Vec<_> = ours8[..4].to_vec();
    let theirs = handoffs(&floor4, "floor-handoff", run).await?;
    let mine = handoffs(&ours4, "handoff", run).await?;
    handoff_line("raw floor (polling try_grant)", &theirs);
    handoff_line("lock-zk (predecessor watch)", &mine);
    println!(
        "  ratio lock-zk / floor: {:.3}x",
        bench::ratio(mine.per_sec, theirs.per_sec)
    );
    drop(server);
    Ok(())
}
