//! Probe (not a test): what TLS (`etcds://`) costs one etcd acquire+release
//! cycle, one client, interleaved rounds:
//!
//! - the hand floor ([`lock_bench::etcd::EtcdFloor`], plaintext: it has no
//!   TLS) against a plaintext server;
//! - ours (`LockClient`, waiting acquire, then `release`) against the same
//!   plaintext server;
//! - ours against a TLS server started beside it (certificates generated
//!   for the run, the CA given as `ca=`): `etcd-client`'s channel over
//!   rustls.
//!
//! Per side: p50 and mean wall time and this process's CPU per cycle.
//! `ONLY=<0..2>` runs one side alone (for `strace` or a profiler).
//!
//! ```text
//! cargo build --release -p lock-bench --example etcd_tls
//! target/release/examples/etcd_tls 2000
//! ```
#![allow(missing_docs)]

#[path = "../../lock-etcd/tests/certs/mod.rs"]
mod certs;

use std::time::{Duration, Instant};

use conformance::servers::etcd::EtcdServer;
use lock_core::LockClient;

const TTL: Duration = Duration::from_secs(30);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let certs = certs::Certs::generate();
    let plain = EtcdServer::start().await.expect("a plaintext etcd");
    let tls = EtcdServer::start_tls(certs.server_files(false))
        .await
        .expect("a TLS etcd");
    let plain_url = plain.url("probe", "");
    let tls_url = tls.url("probe", &format!("ca={}", certs.path("ca.pem").display()));
    let floor = lock_bench::etcd::EtcdFloor::connect(&plain_url)
        .await
        .expect("floor");
    let ours_plain = LockClient::new(lock_etcd::connect(&plain_url).await.expect("plaintext"));
    let ours_tls = LockClient::new(lock_etcd::connect(&tls_url).await.expect("TLS"));

    const SIDES: usize = 3;
    let rounds = 10;
    let mut samples: [Vec<Duration>; SIDES] = Default::default();
    let mut walls = [Duration::ZERO; SIDES];
    let mut cpu = [0u64; SIDES];
    let only: Option<usize> = std::env::var("ONLY").ok().and_then(|v| v.parse().ok());
    // A warm-up round, then interleaved rounds (the order rotates).
    for round in 0..=rounds {
        for side in 0..SIDES {
            let side = (side + round) % SIDES;
            if only.is_some_and(|o| o != side) {
                continue;
            }
            let count = if round == 0 { 200 } else { n / rounds };
            let (started, cpu_before) = (Instant::now(), conformance::cpu::self_cpu_ns());
            for _ in 0..count {
                let at = Instant::now();
                match side {
                    0 => floor.cycle("probe-floor", TTL).await.expect("floor cycle"),
                    _ => {
                        let client = if side == 1 { &ours_plain } else { &ours_tls };
                        let guard = client
                            .lock("probe-ours")
                            .ttl(TTL)
                            .wait(Duration::from_secs(60))
                            .acquire()
                            .await
                            .expect("acquire");
                        guard.release().await.expect("release");
                    }
                }
                if round > 0 {
                    samples[side].push(at.elapsed());
                }
            }
            if round > 0 {
                walls[side] += started.elapsed();
                cpu[side] += conformance::cpu::self_cpu_ns() - cpu_before;
            }
        }
    }
    let labels = [
        "hand floor (plaintext)",
        "ours, plaintext",
        "ours, TLS (etcds://)",
    ];
    for (side, label) in labels.iter().enumerate() {
        let s = &mut samples[side];
        if s.is_empty() {
            continue;
        }
        s.sort();
        let cycles = s.len().max(1);
        println!(
            "{label:<24} p50 {:>8.1} us  mean {:>8.1} us  client cpu {:>6.1} us",
            s[s.len() / 2].as_secs_f64() * 1e6,
            walls[side].as_secs_f64() * 1e6 / cycles as f64,
            cpu[side] as f64 / 1e3 / cycles as f64,
        );
    }
}
