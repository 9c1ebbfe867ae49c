//! Probe (not a test): where one etcd acquire+release cycle's time goes,
//! one client, interleaved rounds, against a server this process starts:
//!
//! - the hand floor ([`lock_bench::etcd::EtcdFloor`]: the driver's two
//!   transactions, gRPC by hand on one bare HTTP/2 connection);
//! - the driver's two transactions (lock-etcd's own builders, each bounded
//!   by the operation timeout: [`lock_bench::etcd::EtcdCrateAlone`])
//!   through `etcd-client` on its own tonic channel with default options,
//!   no other lock-etcd code;
//! - the same through `etcd-client` on one bare hyper HTTP/2 connection
//!   (`Channel::Custom`, no tower buffer or balancer): what the client
//!   library costs apart from its channel;
//! - the same through the `etcd-client` a backend connected (its
//!   [`client`](lock_etcd::EtcdBackend::client)): the transport the
//!   driver uses, and the "crate alone" that issue 39 compares ours with;
//! - `EtcdBackend::acquire` + `release` directly (no `LockClient`, guard
//!   or renewal scheduler);
//! - ours: `LockClient` with a waiting acquire, then `release`.
//!
//! Per side: p50 and mean wall time, and CPU per cycle of this process and
//! of the etcd server; last, ours and the backend over the driver's
//! transport alone (p50). Pin it to one CPU to take thread placement out:
//!
//! ```text
//! cargo build --release -p lock-bench --example etcd_parts
//! taskset -c 0 target/release/examples/etcd_parts [<cycles>]
//! ```
//!
//! `ONLY=<0..5>` runs one side alone (for a profiler).
#![allow(missing_docs)]
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use conformance::bench::Contender;
use conformance::servers::etcd::EtcdServer;
use etcd_client::Client;
use lock_bench::etcd::EtcdCrateAlone;
use lock_core::LockBackend;
use lock_core::LockBackendExt;

#[derive(Clone)]
struct H2 {
    send: hyper::client::conn::http2::SendRequest<tonic::body::Body>,
    authority: String,
}

impl tower::Service<http::Request<tonic::body::Body>> for H2 {
    type Response = http::Response<tonic::body::Body>;
    type Error = tower::BoxError;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.send.poll_ready(cx).map_err(Into::into)
    }
    fn call(&mut self, mut req: http::Request<tonic::body::Body>) -> Self::Future {
        let path = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default();
        *req.uri_mut() = format!("http://{}{}", self.authority, path)
            .parse()
            .unwrap();
        let fut = self.send.send_request(req);
        Box::pin(async move { Ok(fut.await?.map(tonic::body::Body::new)) })
    }
}

#[tokio::main]
async fn main() {
    let n: u64 = match std::env::args().nth(1).map(|arg| arg.parse()) {
        None => 2000,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return println!("usage: etcd_parts [<cycles, default 2000>]  (ONLY=<0..5>: one side)");
        }
    };
    let mut server = EtcdServer::start().await.unwrap();
    let spid = server.member(0).process().pid();
    let url = server.url("probe", "");
    let endpoint = url
        .trim_start_matches("etcd://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let config = lock_etcd::EtcdConfig::from_url(&url).unwrap();
    let tonic_client = Client::connect([format!("http://{endpoint}")], None)
        .await
        .unwrap();
    let tonic_alone = EtcdCrateAlone::on_client(tonic_client, &config)
        .await
        .unwrap();
    let tcp = tokio::net::TcpStream::connect(&endpoint).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let channel = etcd_client::Channel::Custom(tower::util::BoxCloneSyncService::new(H2 {
        send,
        authority: endpoint.clone(),
    }));
    let h2_client = Client::from_channel(channel, None).await.unwrap();
    let h2_alone = EtcdCrateAlone::on_client(h2_client, &config).await.unwrap();
    let floor = lock_bench::etcd::EtcdFloor::connect(&url).await.unwrap();
    let backend = lock_etcd::EtcdBackend::connect(lock_etcd::EtcdConfig::from_url(&url).unwrap())
        .await
        .unwrap();
    let ours = lock_core::LockClient::new(backend);
    // A second backend (own connection and session) used directly.
    let direct = lock_etcd::EtcdBackend::connect(lock_etcd::EtcdConfig::from_url(&url).unwrap())
        .await
        .unwrap();
    let direct_key = lock_core::LockKey::new("probe-direct").unwrap();
    // A third backend lends its etcd-client (on the driver's channel).
    let lender = lock_etcd::EtcdBackend::connect(lock_etcd::EtcdConfig::from_url(&url).unwrap())
        .await
        .unwrap();
    let channel_alone = EtcdCrateAlone::on_client(lender.client().clone(), lender.config())
        .await
        .unwrap();
    const SIDES: usize = 6;
    let mut totals = [Duration::ZERO; SIDES];
    let mut cpu = [(0u64, 0u64); SIDES];
    let mut samples: [Vec<Duration>; SIDES] = Default::default();
    for round in 0..10usize {
        for side in 0..SIDES {
            let side = (side + round) % SIDES;
            if std::env::var("ONLY")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .is_some_and(|o| o != side)
            {
                continue;
            }
            let started = Instant::now();
            let (c0, s0) = (
                conformance::cpu::self_cpu_ns(),
                conformance::cpu::process_tree_cpu_ns(spid),
            );
            for _ in 0..n / 10 {
                let at = Instant::now();
                match side {
                    0 => floor
                        .cycle("probe-floor", Duration::from_secs(30))
                        .await
                        .unwrap(),
                    1 => tonic_alone.cycle("probe-tonic").await.unwrap(),
                    2 => h2_alone.cycle("probe-h2").await.unwrap(),
                    3 => channel_alone.cycle("probe-alone").await.unwrap(),
                    4 => {
                        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
                        let lease = direct
                            .acquire(&direct_key, Duration::from_secs(30), deadline)
                            .await
                            .unwrap();
                        direct.release(&lease).await.unwrap();
                    }
                    _ => {
                        let g = ours
                            .lock("probe-ours")
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
            cpu[side].0 += conformance::cpu::self_cpu_ns() - c0;
            cpu[side].1 += conformance::cpu::process_tree_cpu_ns(spid) - s0;
        }
    }
    let mut p50s = [0.0f64; SIDES];
    for (i, name) in [
        "hand floor",
        "etcd-client/tonic",
        "etcd-client/h2",
        "etcd-client/ours",
        "EtcdBackend direct",
        "ours (LockClient)",
    ]
    .iter()
    .enumerate()
    {
        if samples[i].is_empty() {
            continue;
        }
        samples[i].sort();
        let p50 = samples[i][samples[i].len() / 2];
        p50s[i] = p50.as_secs_f64();
        println!(
            "{name:<20} p50 {:>8.1} us  mean {:>8.1} us  client cpu {:>6.1} us  server cpu {:>6.1} us",
            p50.as_secs_f64() * 1e6,
            totals[i].as_secs_f64() * 1e6 / n as f64,
            cpu[i].0 as f64 / 1e3 / n as f64,
            cpu[i].1 as f64 / 1e3 / n as f64
        );
    }
    if p50s[3] > 0.0 {
        for (i, name) in [(4, "EtcdBackend direct"), (5, "ours (LockClient)")] {
            if p50s[i] > 0.0 {
                println!("{name} / etcd-client/ours p50: {:.3}", p50s[i] / p50s[3]);
            }
        }
    }
}
