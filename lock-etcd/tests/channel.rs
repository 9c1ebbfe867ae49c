//! The client leaves a member that cannot serve: one whose connection
//! stops answering (found by `etcd-client`'s HTTP/2 keep-alive PING, which
//! the driver turns on also while no call is in flight), and one cut off
//! from its peers (found by the driver's member watch,
//! `src/connection/members.rs`). Each test lists the bad member first.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{cycle, twenty_cycles_in_a_row};
use conformance::OrSkip;
use conformance::proxy::FaultProxy;
use conformance::servers::etcd::EtcdServer;
use lock_core::LockKey;
use tokio::time::{Instant, sleep};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_stops_answering_is_left_by_the_keep_alive() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let direct = server.endpoints()[0].clone();
    let upstream: SocketAddr = direct.parse().unwrap();
    let proxy = FaultProxy::start(upstream).await.unwrap();
    // The proxy first: the client connects through it.
    let url = format!(
        "etcd://127.0.0.1:{},{direct}/channel?ttl=60s&timeout=1s",
        proxy.port()
    );
    let backend = lock_etcd::connect(&url).await.unwrap();
    let key = LockKey::new("k").unwrap();
    cycle(&backend, &key).await.unwrap();
    assert_eq!(proxy.connections(), 1);
    // Everything sent through the proxy now vanishes, and nothing closes
    // the connection. No call is made until the keep-alive (a PING after
    // 2 s of silence, 2 s for its answer) had time to give up on it; one
    // that waited on the dead connection would fail (1 s timeout).
    proxy.blackhole();
    sleep(Duration::from_secs(7)).await;
    let started = Instant::now();
    cycle(&backend, &key)
        .await
        .expect("the first cycle after the keep-alive went to the other endpoint");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cut_off_from_its_peers_is_left() {
    let Some(server) = EtcdServer::start_cluster_with_peer_proxies(3)
        .await
        .or_skip()
    else {
        return;
    };
    let leader = server.wait_leader(Duration::from_secs(10)).await.unwrap();
    // A follower, listed first: the client connects to it.
    let cut = (leader + 1) % server.len();
    let mut endpoints = server.endpoints();
    endpoints.rotate_left(cut);
    let url = format!("etcd://{}/channel?ttl=60s&timeout=1s", endpoints.join(","));
    let backend = lock_etcd::connect(&url).await.unwrap();
    let key = LockKey::new("k").unwrap();
    cycle(&backend, &key).await.unwrap();
    assert!(server.partition_member(cut));
    // The first calls may wait on the member and fail; within a bounded
    // time cycles succeed again, and keep succeeding.
    let failures = twenty_cycles_in_a_row(&backend, &key)
        .await
        .unwrap_or_else(|why| panic!("after the partition: {why}"));
    println!("cycles failed before the client left the member: {failures:?}");
    server.heal_member(cut);
}
