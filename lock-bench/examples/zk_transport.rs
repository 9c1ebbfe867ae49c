//! Probe (not a test): one client's acquire+release cycle at 1 ms
//! round-trip time (`RTT_US`), each side on a fault proxy of its own:
//! the `zookeeper-client` crate alone sending the driver's requests
//! (create with the list behind it, delete), and ours (`LockClient`,
//! waiting acquire + release) on the client crate's own socket, and ours
//! again with `TCP_NODELAY` set on its socket from outside (the `/proc`
//! scan the driver used to run, kept here as a measuring device only).
//! p50 and mean per side, interleaved rounds, and each side's round trips
//! per cycle (counted by its proxy).
//!
//! ```text
//! RTT_US=1000 cargo run -p lock-bench --example zk_transport [-- <cycles>]
//! ```
#![allow(missing_docs)]
use std::time::{Duration, Instant};

use conformance::bench::LatencyStats;
use conformance::proxy::FaultProxy;
use conformance::servers::zookeeper::ZkServer;
use zookeeper_client as zk;

async fn crate_cycle(client: &zk::Client, dir: &str) {
    let owner = lock_core::OwnerId::random();
    let prefix = lock_zk::keys::node_path_prefix(dir, owner);
    let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let data = format!("{}\nsome details", owner.to_hex());
    let create = client.create(&prefix, data.as_bytes(), &options);
    let list = client.list_children(dir);
    let ((_, seq), children) = tokio::try_join!(create, list).unwrap();
    assert!(!children.is_empty());
    let path = format!("{prefix}{seq}");
    client.delete(&path, None).await.unwrap();
}

/// Sets `TCP_NODELAY` on this process's TCP sockets connected to `peer`.
fn nodelay_to(peer: std::net::SocketAddr) -> usize {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut set = 0;
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: duplicates whatever the number names now; the duplicate
        // is owned (and closed) here alone.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            continue;
        }
        // SAFETY: `dup` was just made and nothing else knows of it.
        let stream = std::net::TcpStream::from(unsafe { OwnedFd::from_raw_fd(dup) });
        if stream.peer_addr().is_ok_and(|p| p == peer) && stream.set_nodelay(true).is_ok() {
            set += 1;
        }
    }
    set
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let rtt = Duration::from_micros(
        std::env::var("RTT_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000),
    );
    let server = ZkServer::start().await.expect("a ZooKeeper server");
    let upstream: std::net::SocketAddr = format!("127.0.0.1:{}", server.node().client_port())
        .parse()
        .unwrap();
    let mut proxies = Vec::new();
    for _ in 0..3 {
        let proxy = FaultProxy::start(upstream).await.unwrap();
        proxy.set_latency(rtt / 2, Duration::ZERO);
        proxies.push(proxy);
    }
    let library = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&format!("127.0.0.1:{}", proxies[0].port()))
        .await
        .unwrap();
    let dir = "/probe";
    let _ = library
        .create(
            dir,
            b"",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await;
    let ours = lock_core::LockClient::new(
        lock_zk::connect(&format!(
            "zk://127.0.0.1:{}/probe2?session_timeout=10s",
            proxies[1].port()
        ))
        .await
        .unwrap(),
    );
    let nodelay = lock_core::LockClient::new(
        lock_zk::connect(&format!(
            "zk://127.0.0.1:{}/probe3?session_timeout=10s",
            proxies[2].port()
        ))
        .await
        .unwrap(),
    );
    assert_eq!(
        nodelay_to(proxies[2].addr()),
        1,
        "one socket to the third proxy"
    );
    for proxy in &proxies {
        proxy.reset_counters();
    }
    let names = [
        "zookeeper-client alone",
        "ours (LockClient), the crate's socket",
        "ours (LockClient), TCP_NODELAY set from outside",
    ];
    let mut samples: [Vec<Duration>; 3] = Default::default();
    let rounds = 10;
    for round in 0..rounds {
        for side in 0..3 {
            let side = (side + round) % 3;
            for _ in 0..n / rounds {
                let at = Instant::now();
                if side == 0 {
                    crate_cycle(&library, dir).await;
                } else {
                    let client = if side == 1 { &ours } else { &nodelay };
                    let g = client
                        .lock("ours")
                        .ttl(Duration::from_secs(30))
                        .wait(Duration::from_secs(10))
                        .acquire()
                        .await
                        .unwrap();
                    g.release().await.unwrap();
                }
                samples[side].push(at.elapsed());
            }
        }
    }
    for (side, name) in names.iter().enumerate() {
        let s = LatencyStats::from_samples(samples[side].clone(), Duration::from_secs(1));
        println!(
            "{name}: p50 {:.0} us, mean {:.0} us, p99 {:.0} us",
            s.p50_us, s.mean_us, s.p99_us
        );
    }
    for (i, proxy) in proxies.iter().enumerate() {
        println!(
            "{}: {:.2} round trips per cycle",
            names[i],
            proxy.round_trips() as f64 / n as f64
        );
    }
    let p50 =
        |i: usize| LatencyStats::from_samples(samples[i].clone(), Duration::from_secs(1)).p50_us;
    println!("ours / crate p50: {:.3}", p50(1) / p50(0));
    println!(
        "nodelay lower than the crate's socket by {:.1}%",
        (1.0 - p50(2) / p50(1)) * 100.0
    );
}
