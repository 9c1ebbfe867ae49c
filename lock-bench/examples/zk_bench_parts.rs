//! Probe (not a test): where one acquire+release cycle's time goes, 1
//! client, interleaved rounds:
//! - the floor (hand-written jute on one bare connection);
//! - the `zookeeper-client` crate alone: create, list, delete, the three
//!   requests our cycle sends, the list behind the create as ours sends it
//!   (2 round trips), with the same node data, without any lock-zk code;
//! - `ZkBackend::acquire` + `release` directly (no `LockClient`);
//! - the user API (`LockClient`, guard, renewal scheduler).
//!
//! `cargo run --release -p lock-bench --example zk_bench_parts [-- <cycles>]`

use std::time::Duration;

use conformance::bench::{self, LatencyStats};
use conformance::floor::RawFloor;
use conformance::servers::zookeeper::ZkServer;
use lock_bench::zk::ZkFloor;
use lock_core::{LockBackend, LockBackendExt, LockClient, LockKey, OwnerId};
use tokio::time::Instant;
use zookeeper_client as zk;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
const TTL: Duration = Duration::from_secs(30);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let server = ZkServer::start().await?;
    let url = format!("{}?session_timeout=10s", server.url());
    // Each zookeeper-client session writes the create and the list behind
    // it in one write or in two (Nagle then holds the list for the create's
    // reply: 3 round trips a cycle instead of 2), fixed per session by the
    // crate's select order (see lock-zk's crate docs). A p50 ratio of two
    // sessions is only like with like when both took the same branch:
    // `zk_transport` (RTT_US=0) counts each side's round trips.
    let raw = zk::Client::connect(&server.connect_string()).await?;
    let floor = ZkFloor::connect(&url).await?;
    let backend = lock_zk::connect(&url).await?;
    let client = LockClient::new(lock_zk::connect(&url).await?);
    let dir = "/bench-parts-raw";
    let _ = raw
        .create(
            dir,
            &[],
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await;
    let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let key_b = LockKey::new("parts-backend")?;
    // The node data ours writes (the attempt id, the holder details).
    let details = lock_core::HolderDetails::encode_current();

    // ONLY=<0..3>: run that side alone (for a profiler).
    let only: Option<usize> = std::env::var("ONLY").ok().and_then(|v| v.parse().ok());
    let rounds = 10;
    let per = (n / rounds).max(1);
    let mut samples: [Vec<Duration>; 4] = Default::default();
    let mut walls = [Duration::ZERO; 4];
    // Warm-up, then interleaved rounds (the order rotates every round).
    for round in 0..=rounds {
        for side in 0..4 {
            let side = (side + round) % 4;
            if only.is_some_and(|o| o != side) {
                continue;
            }
            let count = if round == 0 { 300 } else { per };
            let started = Instant::now();
            for _ in 0..count {
                let at = Instant::now();
                match side {
                    0 => {
                        let grant = floor.try_grant("parts-floor", TTL).await?.expect("free");
                        floor.release(&grant).await?;
                    }
                    1 => {
                        let owner = OwnerId::random().to_hex();
                        let prefix = format!("{dir}/_c_{owner}-lock-");
                        let data = format!("{owner}\n{details}");
                        // The list sent behind the create, before its reply, as
                        // ours does (the crate sends a request when it is made).
                        let create = raw.create(&prefix, data.as_bytes(), &options);
                        let list = raw.list_children(dir);
                        let (_, seq) = create.await?;
                        let _ = list.await?;
                        raw.delete(&format!("{prefix}{seq}"), None).await?;
                    }
                    2 => {
                        let deadline = Instant::now() + Duration::from_secs(60);
                        let lease = backend.acquire(&key_b, TTL, deadline).await?;
                        backend.release(&lease).await?;
                    }
                    _ => {
                        let guard = client
                            .lock("parts-client")
                            .ttl(TTL)
                            .wait(Duration::from_secs(60))
                            .acquire()
                            .await?;
                        guard.release().await?;
                    }
                }
                if round > 0 {
                    samples[side].push(at.elapsed());
                }
            }
            if round > 0 {
                walls[side] += started.elapsed();
            }
        }
    }
    let labels = [
        "floor (bare connection)",
        "zookeeper-client alone",
        "ZkBackend acquire+release",
        "LockClient (user API)",
    ];
    let stats: Vec<LatencyStats> = samples
        .into_iter()
        .zip(walls)
        .map(|(s, w)| LatencyStats::from_samples(s, w))
        .collect();
    for (label, s) in labels.iter().zip(&stats) {
        println!(
            "  {label:<28} p50 {:>8.1} us  p99 {:>8.1} us  mean {:>8.1} us  ratio p50 {:.3}x",
            s.p50_us,
            s.p99_us,
            s.mean_us,
            bench::ratio(s.p50_us, stats[0].p50_us)
        );
    }
    if only.is_none() {
        eight_clients(&server, &url).await?;
    }
    drop(server);
    Ok(())
}

/// 8 independent clients on 8 keys, each side in turn for a second, five
/// rounds: the floor, the crate alone (its own client per task, the same
/// three requests) and the user API, cycles per second.
async fn eight_clients(server: &ZkServer, url: &str) -> Result<(), BoxError> {
    const CLIENTS: usize = 8;
    let mut totals = [0u64; 3];
    let mut cpu = [0u64; 3];
    let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let mut floors = Vec::new();
    let mut raws = Vec::new();
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        floors.push(std::sync::Arc::new(ZkFloor::connect(url).await?));
        let raw = zk::Client::connect(&server.connect_string()).await?;
        let dir = format!("/bench-eight-{i}");
        let _ = raw
            .create(
                &dir,
                &[],
                &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
            )
            .await;
        raws.push((raw, dir));
        clients.push(LockClient::new(lock_zk::connect(url).await?));
    }
    for round in 0..=5 {
        for side in 0..3 {
            let side = (side + round) % 3;
            let stop = Instant::now() + Duration::from_secs(1);
            let cpu_before = conformance::cpu::self_cpu_ns();
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..CLIENTS {
                let floor = floors[i].clone();
                let (raw, dir) = raws[i].clone();
                let client = clients[i].clone();
                let options = options.clone();
                tasks.spawn(async move {
                    let mut done = 0u64;
                    while Instant::now() < stop {
                        match side {
                            0 => {
                                let key = format!("eight-floor-{i}");
                                let grant = floor.try_grant(&key, TTL).await?.expect("free");
                                floor.release(&grant).await?;
                            }
                            1 => {
                                let prefix = format!("{dir}/_c_x-lock-");
                                let create = raw.create(&prefix, b"x", &options);
                                let list = raw.list_children(&dir);
                                let (_, seq) = create.await?;
                                let _ = list.await?;
                                raw.delete(&format!("{prefix}{seq}"), None).await?;
                            }
                            _ => {
                                let guard = client
                                    .lock(format!("eight-client-{i}"))
                                    .ttl(TTL)
                                    .wait(Duration::from_secs(60))
                                    .acquire()
                                    .await?;
                                guard.release().await?;
                            }
                        }
                        done += 1;
                    }
                    Ok::<u64, BoxError>(done)
                });
            }
            while let Some(done) = tasks.join_next().await {
                if round > 0 {
                    totals[side] += done??;
                }
            }
            if round > 0 {
                cpu[side] += conformance::cpu::self_cpu_ns() - cpu_before;
            }
        }
    }
    let labels = ["floor", "zookeeper-client alone", "LockClient"];
    for (i, (label, total)) in labels.iter().zip(totals).enumerate() {
        println!(
            "  8 clients {label:<24} {:>8.0} cycles/s  ratio {:.3}x  client CPU {:.1} us/cycle",
            total as f64 / 5.0,
            total as f64 / totals[0] as f64,
            cpu[i] as f64 / 1e3 / total as f64
        );
    }
    Ok(())
}
