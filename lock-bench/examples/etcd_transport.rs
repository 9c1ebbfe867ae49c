//! Probe (not a test): what the transport costs one etcd acquire+release
//! cycle at a real network's round-trip time, one client, interleaved
//! rounds, each side on a fault proxy of its own that adds the round-trip
//! time (`RTT_US`, default 1000: 1 ms, half each way):
//!
//! - `etcd-client` on its own channel (`Client::connect` with the driver's
//!   options), sending the driver's two transactions (the create and the
//!   guarded delete, lock-etcd's own builders:
//!   [`lock_bench::etcd::EtcdCrateAlone`]);
//! - the same two transactions through the `etcd-client` a backend
//!   connected ([`EtcdBackend::client`](lock_etcd::EtcdBackend::client)):
//!   the transport the driver uses;
//! - ours: `LockClient` with a waiting acquire, then `release`.
//!
//! Per side: p50 and mean wall time.
//!
//! ```text
//! cargo run --release -p lock-bench --example etcd_transport [-- <cycles>]
//! ```
#![allow(missing_docs)]
use std::time::{Duration, Instant};

use conformance::bench::Contender;
use conformance::proxy::FaultProxy;
use conformance::servers::etcd::EtcdServer;
use lock_bench::etcd::EtcdCrateAlone;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = match std::env::args().nth(1).map(|arg| arg.parse()) {
        None => 1000,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return println!(
                "usage: etcd_transport [<cycles, default 1000>]  (RTT_US: round trip)"
            );
        }
    };
    let rtt = Duration::from_micros(
        std::env::var("RTT_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000),
    );
    let server = EtcdServer::start().await.expect("an etcd server");
    let upstream = server.endpoints()[0].parse().unwrap();
    let mut proxies = Vec::new();
    for _ in 0..3 {
        let proxy = FaultProxy::start(upstream).await.unwrap();
        proxy.set_latency(rtt / 2, Duration::ZERO);
        proxies.push(proxy);
    }
    let url = |p: &FaultProxy| format!("etcd://127.0.0.1:{}/probe?ttl=30s", p.port());
    let library = EtcdCrateAlone::connect(&url(&proxies[0])).await.unwrap();
    let lender = lock_etcd::connect(&url(&proxies[1])).await.unwrap();
    let driver_transport = EtcdCrateAlone::on_client(lender.client().clone(), lender.config())
        .await
        .unwrap();
    let ours = lock_core::LockClient::new(lock_etcd::connect(&url(&proxies[2])).await.unwrap());
    const SIDES: usize = 3;
    let names = [
        "etcd-client, its own channel",
        "etcd-client, the driver's transport",
        "ours (LockClient)",
    ];
    let mut totals = [Duration::ZERO; SIDES];
    let mut samples: [Vec<Duration>; SIDES] = Default::default();
    let rounds = 10;
    for round in 0..rounds {
        for side in 0..SIDES {
            let side = (side + round) % SIDES;
            let started = Instant::now();
            for _ in 0..n / rounds {
                let at = Instant::now();
                match side {
                    0 => library.cycle("lib").await.unwrap(),
                    1 => driver_transport.cycle("drv").await.unwrap(),
                    _ => {
                        let g = ours
                            .lock("ours")
                            .ttl(Duration::from_secs(30))
                            .wait(Duration::from_secs(60))
                            .acquire()
                            .await
                            .unwrap();
                        g.release().await.unwrap();
                    }
                }
                samples[side].push(at.elapsed());
            }
            totals[side] += started.elapsed();
        }
    }
    println!("RTT {} us, {n} cycles per side", rtt.as_micros());
    for (i, name) in names.iter().enumerate() {
        samples[i].sort();
        let p50 = samples[i][samples[i].len() / 2];
        #[allow(clippy::cast_precision_loss)]
        let mean = totals[i].as_secs_f64() * 1e6 / samples[i].len() as f64;
        println!(
            "{name:<38} p50 {:>8.1} us  mean {:>8.1} us",
            p50.as_secs_f64() * 1e6,
            mean
        );
    }
}
