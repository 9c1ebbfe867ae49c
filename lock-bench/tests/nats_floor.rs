//! The NATS floor against a real nats-server: its grants exclude the
//! driver's on the same key both ways, tokens rise, and cycles on one key
//! repeat (its release marker is expected by its next grant).

use std::time::Duration;

use std::net::{Ipv4Addr, SocketAddr};

use conformance::OrSkip;
use conformance::floor::RawFloor;
use conformance::proxy::{CyclePlan, FaultProxy};
use conformance::servers::nats::{BUCKET, NatsServer};
use lock_bench::nats::NatsFloor;
use lock_core::{LockBackend, LockBackendExt, LockKey};

const TTL: Duration = Duration::from_secs(5);

#[tokio::test]
async fn the_floor_takes_the_drivers_lock() {
    let Some(server) = NatsServer::start().await.or_skip() else {
        return;
    };
    let url = server.url(BUCKET);
    let floor = NatsFloor::connect(&url).await.expect("floor");
    let driver = lock_nats::connect(&url).await.expect("driver");
    assert_eq!(floor.round_trips_per_cycle(), 2);

    let mut last = 0;
    for _ in 0..20 {
        let grant = floor
            .try_grant("floor/key", TTL)
            .await
            .unwrap()
            .expect("free");
        assert!(grant.token > last, "tokens rise");
        last = grant.token;
        assert!(floor.release(&grant).await.unwrap());
    }

    let grant = floor
        .try_grant("floor/key", TTL)
        .await
        .unwrap()
        .expect("free");
    let key = LockKey::new("floor/key").unwrap();
    assert!(driver.try_acquire(&key, TTL).await.unwrap().is_none());
    assert!(floor.release(&grant).await.unwrap());
    assert!(!floor.release(&grant).await.unwrap(), "released once");

    let lease = driver.try_acquire(&key, TTL).await.unwrap().expect("free");
    assert!(floor.try_grant("floor/key", TTL).await.unwrap().is_none());
    assert!(driver.release(&lease).await.unwrap());
    // The driver's purge marker holds the floor off until it expires.
    let start = tokio::time::Instant::now();
    loop {
        if let Some(grant) = floor.try_grant("floor/key", TTL).await.unwrap() {
            assert!(floor.release(&grant).await.unwrap());
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the marker expires"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_costs_what_it_declares() {
    let Some(server) = NatsServer::start().await.or_skip() else {
        return;
    };
    let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, server.port()));
    let proxy = FaultProxy::start(upstream).await.unwrap();
    let url = format!("nats://127.0.0.1:{}/{BUCKET}", proxy.port());
    let floor = NatsFloor::connect(&url).await.unwrap();
    let expected = u64::from(floor.round_trips_per_cycle());
    let plan = CyclePlan::new(5, 100).with_idle();
    let counted = proxy
        .count_cycles(plan, || async {
            floor.cycle("floor", TTL).await.expect("floor cycle");
        })
        .await;
    println!("floor: {:.2} per cycle ({counted:?})", counted.per_cycle());
    counted
        .check(expected)
        .expect("the floor costs what it declares");
}
