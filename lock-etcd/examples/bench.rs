//! Benchmark: our acquire+release cycle vs. the raw floor (the same create
//! transaction and guarded delete issued by hand with a pre-granted lease,
//! [`lock_etcd::floor::EtcdFloor`], on the same client), on an
//! etcd this program starts itself. Prints p50/p99 and ratios; asserts
//! nothing.
//!
//! `cargo run --release -p lock-etcd --example bench [-- <cycles>]`

use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{LatencyStats, cycle, handoff, measure_parallel, ratio};
use conformance::servers::etcd::EtcdServer;
use lock_core::{LockBackend, LockKey};
use lock_etcd::floor::EtcdFloor;
use lock_etcd::{EtcdBackend, EtcdConfig};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

fn row(name: &str, s: &LatencyStats) {
    println!(
        "  {name:<34} p50 {:>8.0} µs  p99 {:>8.0} µs  {:>8.0} cycles/s",
        s.p50_us, s.p99_us, s.per_sec
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cycles: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let server = EtcdServer::start().await?;
    println!("etcd 3.4 single member at {}", server.endpoints()[0]);
    let config = EtcdConfig::new(server.endpoints()).prefix("bench").ttl(TTL);
    let backend = EtcdBackend::connect(config).await?;
    let ours: Arc<dyn LockBackend> = Arc::new(backend.clone());
    let raw = backend.client().clone();
    let floor = Arc::new(EtcdFloor::from_backend(&backend).await?);

    // Sequential: floor and ours interleaved cycle by cycle, so that drift
    // of the machine's load hits both alike.
    let key = LockKey::new("seq")?;
    let ours_prefix = backend.key_prefix(&key);
    let floor_key = "floor-seq";
    for _ in 0..200 {
        floor.cycle(floor_key, TTL).await?;
        cycle(&*ours, &key, TTL).await?;
    }
    let (mut floor_samples, mut ours_samples) = (Vec::new(), Vec::new());
    let wall = Instant::now();
    let (mut floor_wall, mut ours_wall) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..cycles {
        let t = Instant::now();
        floor.cycle(floor_key, TTL).await?;
        let f = t.elapsed();
        let t = Instant::now();
        cycle(&*ours, &key, TTL).await?;
        let o = t.elapsed();
        floor_samples.push(f);
        ours_samples.push(o);
        floor_wall += f;
        ours_wall += o;
    }
    let _ = wall;
    let floor_seq = LatencyStats::from_samples(floor_samples, floor_wall);
    let ours_seq = LatencyStats::from_samples(ours_samples, ours_wall);
    assert!(ours_prefix.starts_with("bench/"));

    // 8 tasks on 8 keys, floor then ours, twice; the second round is kept.
    let tasks = 8;
    let per_task = (cycles / tasks).max(50);
    let mut par = (LatencyStats::default(), LatencyStats::default());
    for _ in 0..2 {
        let floor_handle = floor.clone();
        let floor_keys: Arc<Vec<String>> =
            Arc::new((0..tasks).map(|t| format!("floor-par-{t}")).collect());
        let floor_stats = measure_parallel(tasks, per_task, move |t, _| {
            let floor = floor_handle.clone();
            let keys = floor_keys.clone();
            async move { floor.cycle(&keys[t], TTL).await }
        })
        .await?;
        let backend = ours.clone();
        let keys: Arc<Vec<LockKey>> = Arc::new(
            (0..tasks)
                .map(|t| LockKey::new(format!("par-{t}")))
                .collect::<Result<_, _>>()?,
        );
        let mine = measure_parallel(tasks, per_task, move |t, _| {
            let backend = backend.clone();
            let keys = keys.clone();
            async move { cycle(&*backend, &keys[t], TTL).await }
        })
        .await?;
        par = (floor_stats, mine);
    }

    // Handoff: 4 tasks of one backend contending on one key; each grant
    // after the first is woken by the watch on its predecessor.
    let handoff_key = LockKey::new("handoff")?;
    let handoff_stats = handoff(ours.clone(), &handoff_key, TTL, 4, (cycles / 2).max(200)).await?;
    let leases_before = raw.lease_client().leases().await?.leases().len();

    println!("\nsequential acquire+release ({cycles} cycles, interleaved with the floor):");
    row("floor (2 txns by hand)", &floor_seq);
    row("lock-etcd try_acquire + release", &ours_seq);
    println!(
        "  ratio p50 {:.3}x  p99 {:.3}x  throughput {:.3}x",
        ratio(ours_seq.p50_us, floor_seq.p50_us),
        ratio(ours_seq.p99_us, floor_seq.p99_us),
        ratio(ours_seq.per_sec, floor_seq.per_sec)
    );
    println!("\n{tasks} tasks on {tasks} keys ({per_task} cycles each):");
    row("floor (2 txns by hand)", &par.0);
    row("lock-etcd try_acquire + release", &par.1);
    println!(
        "  ratio p50 {:.3}x  p99 {:.3}x  throughput {:.3}x",
        ratio(par.1.p50_us, par.0.p50_us),
        ratio(par.1.p99_us, par.0.p99_us),
        ratio(par.1.per_sec, par.0.per_sec)
    );
    println!("\nhandoff, 4 tasks on one key (release -> next grant, via the watch):");
    println!(
        "  p50 {:>8.0} µs  p99 {:>8.0} µs  {:>8.0} handoffs/s  ({:.1}x the floor's sequential p50 cycle)",
        handoff_stats.p50_us,
        handoff_stats.p99_us,
        handoff_stats.per_sec,
        ratio(handoff_stats.p50_us, floor_seq.p50_us)
    );
    println!(
        "\nleases on the server after the run: {leases_before} (the floor's + our one session: no lease grant on the acquire path)"
    );
    Ok(())
}
