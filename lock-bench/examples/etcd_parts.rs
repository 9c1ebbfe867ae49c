//! Probe (not a test): where one etcd acquire+release cycle's time goes,
//! one client, interleaved rounds, against a server this process starts:
//!
//! - the hand floor ([`lock_bench::etcd::EtcdFloor`]: the driver's two
//!   transactions, gRPC by hand on one bare HTTP/2 connection);
//! - the same two transactions through `etcd-client` on its own tonic
//!   channel, no lock-etcd code;
//! - the same through `etcd-client` on one bare hyper HTTP/2 connection
//!   (`Channel::Custom`, no tower buffer or balancer): what the client
//!   library costs apart from its channel;
//! - the same through the `etcd-client` a backend connected (its
//!   [`client`](lock_etcd::EtcdBackend::client), no other lock-etcd
//!   code): the transport the driver uses;
//! - `EtcdBackend::acquire` + `release` directly (no `LockClient`, guard
//!   or renewal scheduler);
//! - ours: `LockClient` with a waiting acquire, then `release`.
//!
//! Per side: p50 and mean wall time, and CPU per cycle of this process and
//! of the etcd server. Pin it to one CPU to take thread placement out:
//!
//! ```text
//! cargo build --release -p lock-bench --example etcd_parts
//! taskset -c 0 target/release/examples/etcd_parts 2000
//! ```
//!
//! `ONLY=<0..5>` runs one side alone (for a profiler).
#![allow(missing_docs)]
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use conformance::servers::etcd::EtcdServer;
use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
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

async fn cycle(c: &mut Client, lease: i64, _i: u64) {
    use etcd_client::{GetOptions, SortOrder, SortTarget};
    let prefix = "probe/k/";
    let entry = format!("{prefix}{lease:x}");
    let owner = "0123456789abcdef0123456789abcdef";
    let value = format!("{owner} some-host 1234 details");
    let oldest = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let t = Txn::new()
        .when([Compare::create_revision(
            entry.as_str(),
            CompareOp::Equal,
            0,
        )])
        .and_then([
            TxnOp::put(
                entry.as_str(),
                value.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::get(prefix, Some(oldest.clone())),
        ])
        .or_else([
            TxnOp::get(entry.as_str(), None),
            TxnOp::get(prefix, Some(oldest)),
        ]);
    let r = c.txn(t).await.unwrap();
    let rev = r.header().unwrap().revision();
    let d = Txn::new()
        .when([
            Compare::create_revision(entry.as_str(), CompareOp::Equal, rev),
            Compare::value(entry.as_str(), CompareOp::Greater, owner),
            Compare::value(entry.as_str(), CompareOp::Less, format!("{owner}!")),
        ])
        .and_then([TxnOp::delete(entry.as_str(), None)]);
    assert!(c.txn(d).await.unwrap().succeeded());
}

#[tokio::main]
async fn main() {
    let mut server = EtcdServer::start().await.unwrap();
    let spid = server.member(0).process().pid();
    let url = server.url("probe", "");
    let endpoint = url
        .trim_start_matches("etcd://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let mut tonic_client = Client::connect([format!("http://{endpoint}")], None)
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
    let mut h2_client = Client::from_channel(channel, None).await.unwrap();
    let floor = lock_bench::etcd::EtcdFloor::connect(&url).await.unwrap();
    let lease = tonic_client.lease_grant(30, None).await.unwrap().id();
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
    let mut channel_client = lender.client().clone();
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
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
            for i in 0..n / 10 {
                let at = Instant::now();
                match side {
                    0 => floor
                        .cycle("probe-floor", Duration::from_secs(30))
                        .await
                        .unwrap(),
                    1 => cycle(&mut tonic_client, lease, i).await,
                    2 => cycle(&mut h2_client, lease, i).await,
                    3 => cycle(&mut channel_client, lease, i).await,
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
        println!(
            "{name:<20} p50 {:>8.1} us  mean {:>8.1} us  client cpu {:>6.1} us  server cpu {:>6.1} us",
            p50.as_secs_f64() * 1e6,
            totals[i].as_secs_f64() * 1e6 / n as f64,
            cpu[i].0 as f64 / 1e3 / n as f64,
            cpu[i].1 as f64 / 1e3 / n as f64
        );
    }
}
