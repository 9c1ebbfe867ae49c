//! Round trips per acquire+release cycle, counted by the fault proxy
//! between the client and a real nats-server: our waiting acquire as users
//! write it and our `try_acquire` each cost the hand-written floor's 2
//! (the KV create and the conditioned purge; counted on the floor in
//! `lock-bench`'s `tests/nats_floor.rs`) on one key cycled again and
//! again: the release's purge marker is remembered, so the next create
//! expects it. A backend that looks at the key first is counted one
//! higher and fails the same check.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::bench;
use conformance::doubles::LooksFirst;
use conformance::proxy::{CyclePlan, FaultProxy};
use conformance::servers::nats::{BUCKET, NatsServer};
use lock_core::LockClient;

const FLOOR_ROUND_TRIPS: u64 = 2;
const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_costs_what_the_floor_costs() {
    let Some(server) = NatsServer::start().await.or_skip() else {
        return;
    };
    let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, server.port()));
    let url = |proxy: &FaultProxy| format!("nats://127.0.0.1:{}/{BUCKET}", proxy.port());
    let plan = || CyclePlan::new(5, 100).with_idle();

    let proxy = FaultProxy::start(upstream).await.unwrap();
    let client = LockClient::new(lock_nats::connect(&url(&proxy)).await.unwrap());
    let counted = proxy
        .count_cycles(plan(), || bench::waiting_cycle(&client, "wait", TTL))
        .await;
    println!(
        "waiting acquire + release: {:.2} per cycle ({counted:?})",
        counted.per_cycle()
    );
    counted
        .check(FLOOR_ROUND_TRIPS)
        .expect("a waiting cycle costs the floor's");
    let counted = proxy
        .count_cycles(plan(), || bench::try_cycle(&client, "try", TTL))
        .await;
    println!(
        "try_acquire + release: {:.2} per cycle ({counted:?})",
        counted.per_cycle()
    );
    counted
        .check(FLOOR_ROUND_TRIPS)
        .expect("a try cycle costs the floor's");

    let proxy = FaultProxy::start(upstream).await.unwrap();
    let backend = Arc::new(lock_nats::connect(&url(&proxy)).await.unwrap());
    let looks = LockClient::new(LooksFirst(backend));
    let counted = proxy
        .count_cycles(plan(), || bench::waiting_cycle(&looks, "looks", TTL))
        .await;
    println!("looking first: {:.2} per cycle", counted.per_cycle());
    assert!(
        counted.check(FLOOR_ROUND_TRIPS).is_err(),
        "one more request per cycle is seen: {counted:?}"
    );
}
