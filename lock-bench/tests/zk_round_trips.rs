//! The ZooKeeper floor's round trips per acquire+release cycle, counted by
//! the fault proxy between it and a real server: exactly the 2 it declares
//! (create with getChildren written behind it, then delete) on a free key,
//! on one connection. `lock-zk`'s `tests/round_trips.rs` holds the driver
//! to the same count.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use conformance::OrSkip;
use conformance::floor::RawFloor;
use conformance::proxy::{CyclePlan, FaultProxy};
use conformance::servers::zookeeper::ZkServer;
use lock_bench::zk::ZkFloor;

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_costs_what_it_declares() {
    let Some(server) = ZkServer::start().await.or_skip() else {
        return;
    };
    let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, server.node().client_port()));
    let floor_proxy = FaultProxy::start(upstream).await.unwrap();
    let url = format!(
        "zk://127.0.0.1:{}/rt?session_timeout=2000ms&timeout=3s",
        floor_proxy.port()
    );
    let floor = ZkFloor::connect(&url).await.unwrap();
    let expected = u64::from(floor.round_trips_per_cycle());
    assert_eq!(expected, 2);
    let plan = CyclePlan::new(5, 100).with_idle();
    let counted = floor_proxy
        .count_cycles(plan, || async {
            floor.cycle("floor", TTL).await.expect("floor cycle");
        })
        .await;
    println!("floor: {:.2} per cycle ({counted:?})", counted.per_cycle());
    counted
        .check(expected)
        .expect("the floor costs what it declares");
    assert_eq!(floor_proxy.connections(), 1, "the floor has one connection");
}
