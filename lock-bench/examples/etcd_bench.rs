//! Benchmark (not a test): our acquire+release cycle as users write it
//! (`client.lock(k).ttl(30s).wait(60s).acquire()`, then `guard.release()`)
//! against the raw floor ([`lock_bench::etcd::EtcdFloor`]: the create
//! transaction and the guarded delete on a client and lease of its own), on
//! an etcd this program starts itself. Asserts nothing.
//!
//! `cargo run --release -p lock-bench --example etcd_bench [-- <cycles>]`
//!
//! Prints, ours and the floor interleaved so that machine load hits both
//! alike, [`conformance::bench::StandardFigures`]:
//! - 1 client: p50/p99 per cycle and the ratios;
//! - 8 independent clients on 8 keys (each its own `connect()`, each floor
//!   its own client): throughput and the ratio;
//! - 4 independent clients on one key: handoffs per second (the floor polls
//!   with `try_grant`; ours watches its predecessor) and the busiest
//!   client's grants over the least busy one's;
//! - 1 client, one permit of a semaphore of 4 (a waiting acquire and its
//!   release) against [`lock_bench::etcd::EtcdPermitFloor`];
//! - 8 clients on one key, each holding 1 ms: as readers of a read-write
//!   lock against as clients of the mutex (throughput).

use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{
    Contender, FloorCycle, LatencyStats, Ours, StandardRun, interleaved_latency, measure_parallel,
    ratio, standard_figures,
};
use conformance::floor::RawFloor;
use conformance::servers::etcd::EtcdServer;
use lock_bench::etcd::{EtcdFloor, EtcdPermitFloor};
use lock_core::LockClient;

const TTL: Duration = Duration::from_secs(30);

/// The mutex floor's row label.
const FLOOR: &str = "raw floor (own client, 2 txns)";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn row(name: &str, s: &LatencyStats) {
    println!(
        "  {name:<40} p50 {:>8.0} µs  p99 {:>8.0} µs  {:>8.0} cycles/s  ({} samples)",
        s.p50_us, s.p99_us, s.per_sec, s.samples
    );
}

/// 200 warm-up cycles a side, then `cycles` of one client on one key a
/// side, interleaved over 10 rounds, reported under `title`.
async fn one_client(
    title: &str,
    (ours, floor): (&dyn Contender, &dyn Contender),
    keys: (&str, &str),
    floor_label: &str,
    cycles: usize,
) -> Result<(), BoxError> {
    for _ in 0..200 {
        ours.cycle(keys.0).await?;
        floor.cycle(keys.1).await?;
    }
    println!("\n1 client, {title} ({cycles} cycles, 10 interleaved rounds):");
    let (mine, theirs) = interleaved_latency(ours, floor, keys, cycles, 10).await?;
    row(floor_label, &theirs);
    row("lock-etcd (waiting acquire + release)", &mine);
    println!(
        "  ours / floor: p50 {:.3}x  p99 {:.3}x",
        ratio(mine.p50_us, theirs.p50_us),
        ratio(mine.p99_us, theirs.p99_us)
    );
    Ok(())
}

async fn ours(url: &str) -> Result<Arc<dyn Contender>, BoxError> {
    let client = LockClient::new(lock_etcd::connect(url).await?);
    Ok(Arc::new(Ours::new(client, TTL)))
}

async fn floor(url: &str) -> Result<Arc<dyn Contender>, BoxError> {
    let floor: Box<dyn RawFloor> = Box::new(EtcdFloor::connect(url).await?);
    Ok(Arc::new(FloorCycle::new(floor, TTL)))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let cycles: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let server = EtcdServer::start().await?;
    println!("etcd 3.4 single member at {}", server.endpoints()[0]);
    // The session lease has the locks' TTL: granted once per client.
    let url = server.url("bench", "ttl=30s");

    let (mut ours8, mut floors8) = (Vec::new(), Vec::new());
    for _ in 0..8 {
        ours8.push(ours(&url).await?);
        floors8.push(floor(&url).await?);
    }
    standard_figures(&ours8, &floors8, &StandardRun::new(cycles))
        .await?
        .print("etcd", "lock-etcd (waiting acquire + release)", FLOOR);

    shared_kinds(&url, cycles).await
}

/// One permit of 4 against the permit floor (1 client), and 8 readers on
/// one key against 8 clients of the mutex on one key, each holding 1 ms.
async fn shared_kinds(url: &str, cycles: usize) -> Result<(), BoxError> {
    let kind = lock_core::LeaseKind::permits(1, 4)?;
    let permit: Arc<dyn Contender> = Arc::new(Ours::with_kind(
        LockClient::new(lock_etcd::connect(url).await?),
        TTL,
        kind,
    ));
    let permit_floor: Arc<dyn Contender> = Arc::new(FloorCycle::new(
        Box::new(EtcdPermitFloor::connect(url, 1, 4).await?),
        TTL,
    ));
    one_client(
        "one permit of 4 acquired and released",
        (&*permit, &*permit_floor),
        ("permit", "floor-permit"),
        "permit floor (own client, 2 txns)",
        cycles,
    )
    .await?;

    let clients = 8;
    let mut all = Vec::with_capacity(clients);
    for _ in 0..clients {
        all.push(LockClient::new(lock_etcd::connect(url).await?));
    }
    let all = Arc::new(all);
    let per_client = (cycles / 20).max(50);
    println!("\n{clients} clients on one key, each holding 1 ms, {per_client} grants each:");
    let mut rates = [Vec::new(), Vec::new()];
    for round in 0..4 {
        for side in [round % 2, 1 - round % 2] {
            let all = all.clone();
            let stats = measure_parallel(clients, per_client, move |t, _| {
                let all = all.clone();
                async move {
                    let request = if side == 0 {
                        all[t].read_lock("readers")
                    } else {
                        all[t].lock("readers-mutex")
                    };
                    let guard = request
                        .ttl(TTL)
                        .wait(Duration::from_secs(60))
                        .acquire()
                        .await?;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    guard.release().await.map(drop)
                }
            })
            .await?;
            rates[side].push(stats);
        }
    }
    let [readers, mutex] = rates.map(|mut runs| {
        runs.sort_by(|a, b| a.per_sec.total_cmp(&b.per_sec));
        runs.swap_remove(runs.len() / 2)
    });
    row("mutex", &mutex);
    row("readers", &readers);
    println!(
        "  readers / mutex throughput {:.3}x",
        ratio(readers.per_sec, mutex.per_sec)
    );
    Ok(())
}
