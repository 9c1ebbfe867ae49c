//! Benchmark (not a test): our acquire+release cycle against the raw floor,
//! the same create / list / delete requests issued by hand on one session
//! ([`lock_zk::floor::ZkFloor`]), measured in one run against a ZooKeeper
//! server this program starts.
//!
//! `cargo run --release -p lock-zk --example bench [-- <cycles>]`
//!
//! Prints p50/p99 per cycle and the ratios, sequential and with 8 tasks on
//! 8 keys (samples interleaved cycle by cycle, so machine load hits both
//! sides alike), and the handoff latency (release → next waiter's grant,
//! driven by the predecessor watch) against the same delete / watch event /
//! list done by hand.

use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{self, LatencyStats};
use conformance::process::HarnessError;
use conformance::servers::zookeeper::ZkServer;
use lock_core::{LockBackend, LockKey, OwnerId};
use lock_zk::ZkBackend;
use lock_zk::floor::ZkFloor;
use tokio::time::Instant;
use zookeeper_client as zk;

const TTL: Duration = Duration::from_secs(10);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A Curator-style protected node name's id part (for the handoff floor).
fn uuid_like() -> String {
    let hex = OwnerId::random().to_hex();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

fn report(floor: &LatencyStats, ours: &LatencyStats) {
    line("raw floor (same requests by hand)", floor);
    line("lock-zk", ours);
    println!(
        "  ratio lock-zk / floor: p50 {:.3}x   p99 {:.3}x",
        bench::ratio(ours.p50_us, floor.p50_us),
        bench::ratio(ours.p99_us, floor.p99_us)
    );
}

fn line(label: &str, stats: &LatencyStats) {
    println!(
        "  {label:<36} p50 {:>8.1} us   p99 {:>8.1} us   ({} samples)",
        stats.p50_us, stats.p99_us, stats.samples
    );
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
    let backend = Arc::new(ZkBackend::connect(lock_zk::ZkConfig::from_url(&url)?).await?);
    // The floor: a session of its own with the backend's configuration.
    let floor = Arc::new(ZkFloor::from_backend(&backend).await?);
    let run = &OwnerId::random().to_hex()[..8];
    let key = LockKey::new(format!("bench-{run}"))?;
    let floor_key = format!("floor-{run}");
    // The keys' directories exist before measuring, as in steady state.
    let lease = backend.try_acquire(&key, TTL).await?.ok_or("held")?;
    backend.release(&lease).await?;
    floor.cycle(&floor_key, TTL).await?;

    println!("ZooKeeper 3.8 on loopback, {cycles} cycles per side, one session each side");
    // Warm both paths (JIT on the server, connections, allocators).
    for _ in 0..300 {
        floor.cycle(&floor_key, TTL).await?;
        bench::cycle(&*backend, &key, TTL).await?;
    }

    // Every sample pair is taken back to back (alternating which goes
    // first), so load from other processes on the machine hits both sides
    // alike.
    println!("\nsequential acquire+release on one key, interleaved cycle by cycle:");
    let (mut floor_samples, mut ours) = (Vec::with_capacity(cycles), Vec::with_capacity(cycles));
    let wall = Instant::now();
    for i in 0..cycles {
        for side in [i % 2, 1 - i % 2] {
            let started = Instant::now();
            if side == 0 {
                floor.cycle(&floor_key, TTL).await?;
                floor_samples.push(started.elapsed());
            } else {
                bench::cycle(&*backend, &key, TTL).await?;
                ours.push(started.elapsed());
            }
        }
    }
    let wall = wall.elapsed();
    report(
        &LatencyStats::from_samples(floor_samples, wall),
        &LatencyStats::from_samples(ours, wall),
    );

    println!("\n8 tasks on 8 keys, interleaved cycle by cycle in every task:");
    let tasks = 8;
    let per_task = (cycles / tasks).max(100);
    let mut handles = Vec::new();
    let wall = Instant::now();
    for t in 0..tasks {
        let (floor, backend) = (floor.clone(), backend.clone());
        let floor_key = format!("floor8-{run}-{t}");
        floor.cycle(&floor_key, TTL).await?;
        let key = LockKey::new(format!("bench8-{run}-{t}"))?;
        bench::cycle(&*backend, &key, TTL).await?;
        handles.push(tokio::spawn(async move {
            let (mut floor_samples, mut ours) = (Vec::new(), Vec::new());
            for i in 0..per_task {
                for side in [i % 2, 1 - i % 2] {
                    let started = Instant::now();
                    if side == 0 {
                        floor.cycle(&floor_key, TTL).await?;
                        floor_samples.push(started.elapsed());
                    } else {
                        bench::cycle(&*backend, &key, TTL).await?;
                        ours.push(started.elapsed());
                    }
                }
            }
            Ok::<_, BoxError>((floor_samples, ours))
        }));
    }
    let (mut floor_samples, mut ours) = (Vec::new(), Vec::new());
    for handle in handles {
        let (f, o) = handle.await??;
        floor_samples.extend(f);
        ours.extend(o);
    }
    let wall = wall.elapsed();
    report(
        &LatencyStats::from_samples(floor_samples, wall),
        &LatencyStats::from_samples(ours, wall),
    );

    println!("\nhandoff: release -> next waiter's grant, driven by the predecessor watch:");
    let raw = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&server.connect_string())
        .await?;
    let raw_dir = format!("/raw-{run}");
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    raw.mkdir(&raw_dir, &container).await?;
    let raw_b = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&server.connect_string())
        .await?;
    let handoffs = (cycles / 2).max(100);
    let mut samples = Vec::with_capacity(handoffs);
    let wall = Instant::now();
    let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    for _ in 0..handoffs {
        // Raw floor: A's node is watched by B; A deletes it; B's watch
        // fires and B lists the directory (what our waiter does next).
        let prefix = format!("{raw_dir}/_c_{}-lock-", uuid_like());
        let (_, sequence) = raw.create(&prefix, &[], &options).await?;
        let path = format!("{prefix}{sequence}");
        let (_, watcher) = raw_b.check_and_watch_stat(&path).await?;
        let started = Instant::now();
        let delete = raw.delete(&path, None);
        let woken = async {
            watcher.changed().await;
            raw_b.list_children(&raw_dir).await
        };
        let (deleted, listed) = tokio::join!(delete, woken);
        deleted?;
        listed?;
        samples.push(started.elapsed());
    }
    let floor = LatencyStats::from_samples(samples, wall.elapsed());
    let handoff_key = LockKey::new(format!("handoff-{run}"))?;
    let mut waiters: Vec<Arc<dyn LockBackend>> = Vec::new();
    for _ in 0..4 {
        waiters.push(Arc::new(
            ZkBackend::connect(lock_zk::ZkConfig::from_url(&url)?).await?,
        ));
    }
    // 4 waiters, each on its own session as separate processes would be.
    let ours = handoff_over(&waiters, &handoff_key, handoffs).await?;
    println!("  (floor: delete, watch event, list, by hand on two sessions)");
    report(&floor, &ours);
    drop(server);
    Ok(())
}

/// Like `conformance::bench::handoff`, but every task has its own backend.
async fn handoff_over(
    backends: &[Arc<dyn LockBackend>],
    key: &LockKey,
    grants: usize,
) -> Result<LatencyStats, lock_core::LockError> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let remaining = Arc::new(AtomicUsize::new(grants));
    let last_release: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::new(Mutex::new(Vec::new()));
    let wall = Instant::now();
    let mut handles = Vec::new();
    for backend in backends {
        let (backend, key, remaining, last_release, samples) = (
            backend.clone(),
            key.clone(),
            remaining.clone(),
            last_release.clone(),
            samples.clone(),
        );
        handles.push(tokio::spawn(async move {
            while remaining
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let lease = backend
                    .acquire(&key, TTL, Instant::now() + Duration::from_secs(30))
                    .await?;
                let granted = Instant::now();
                if let Some(released) = last_release.lock().expect("lock").take() {
                    samples.lock().expect("lock").push(granted - released);
                }
                *last_release.lock().expect("lock") = Some(Instant::now());
                backend.release(&lease).await?;
            }
            Ok::<(), lock_core::LockError>(())
        }));
    }
    for handle in handles {
        match handle.await {
            Ok(result) => result?,
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }
    let samples = std::mem::take(&mut *samples.lock().expect("lock"));
    Ok(LatencyStats::from_samples(samples, wall.elapsed()))
}
