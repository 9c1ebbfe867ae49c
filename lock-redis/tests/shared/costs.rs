//! What shared grants cost, counted by the fault proxy: `renew_many` of
//! many shares in one pipeline, and a waiting read, write or downgrade
//! cycle on a free lock (the permit floor's comparison is in
//! `lock-bench/tests/redis_permit_floor.rs`).

use std::time::Duration;

use conformance::proxy::{CyclePlan, FaultProxy};
use lock_core::{ErrorKind, Lease, LeaseKind, LockBackend, LockBackendExt};
use lock_redis::{RedisBackend, RedisConfig};
use tokio::time::{Instant, sleep};

use super::shared_checks::*;

/// A fault proxy in front of the server on `port`, counting round trips,
/// and the URL that goes through it.
async fn proxied(port: u16) -> (FaultProxy, String) {
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let proxy = FaultProxy::start(upstream).await.unwrap();
    let url = format!("redis://127.0.0.1:{}", proxy.port());
    (proxy, url)
}

/// A client of its own through `url`.
async fn client(url: &str) -> RedisBackend {
    RedisBackend::connect(RedisConfig::from_url(url).unwrap())
        .await
        .unwrap()
}

/// Round trips per cycle through `proxy` (rounded), after a warm-up.
async fn per_cycle(proxy: &FaultProxy, cycle: impl AsyncFnMut()) -> u64 {
    proxy
        .count_cycles(CyclePlan::new(3, 40), cycle)
        .await
        .rounded()
}

/// `renew_many` renews read and permit leases in one pipeline (round trips
/// counted by the fault proxy: 600 shares in at most 2), each with its own
/// result: an expired share is `NotHeld`, the others are renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_many_pipelines_shares() {
    let Some((server, _)) = single().await else {
        return;
    };
    let (proxy, url) = proxied(server.port()).await;
    let b = client(&url).await;
    let rw = key("many-rw");
    let sem = key("many-sem");
    let mut leases = Vec::new();
    for _ in 0..300 {
        leases.push(
            b.try_acquire_kind(&rw, LeaseKind::Read, TTL)
                .await
                .unwrap()
                .unwrap(),
        );
        leases.push(
            b.try_acquire_kind(&sem, permits(1, 1000), TTL)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let short = b
        .try_acquire_kind(&rw, LeaseKind::Read, Duration::from_millis(50))
        .await
        .unwrap()
        .unwrap();
    sleep(Duration::from_millis(120)).await;
    let mut all: Vec<&Lease> = leases.iter().collect();
    all.insert(7, &short);
    // Warm the script cache, then count.
    let _ = b.renew_many(&all[..2]).await;
    sleep(Duration::from_millis(20)).await;
    proxy.reset_counters();
    let results = b.renew_many(&all).await;
    let trips = proxy.round_trips();
    assert_eq!(results.len(), all.len());
    for (i, result) in results.iter().enumerate() {
        if i == 7 {
            assert_eq!(result.as_ref().unwrap_err().kind(), ErrorKind::NotHeld);
        } else {
            let deadline = result.as_ref().expect("renewed");
            assert!(*deadline > Instant::now() + Duration::from_secs(4));
        }
    }
    assert!(
        trips <= 2,
        "{} shares renewed in {trips} round trips",
        all.len()
    );
    for lease in &leases {
        b.release(lease).await.unwrap();
    }
}

/// A waiting read, write or downgrade cycle on a free lock costs what the
/// mutex's costs: one script to acquire, one to release (nothing
/// subscribed); a downgrade adds exactly its one script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_cycles_on_a_free_lock_cost_two_round_trips() {
    let Some((server, _)) = single().await else {
        return;
    };
    let (proxy, url) = proxied(server.port()).await;
    let b = client(&url).await;
    let k = key("cycles");
    for kind in [LeaseKind::Read, LeaseKind::Write] {
        let trips = per_cycle(&proxy, async || {
            let lease = b.acquire_kind(&k, kind, TTL, soon(5_000)).await.unwrap();
            assert!(b.release(&lease).await.unwrap());
        })
        .await;
        assert_eq!(trips, 2, "{kind}");
    }
    let trips = per_cycle(&proxy, async || {
        let w = b
            .acquire_kind(&k, LeaseKind::Write, TTL, soon(5_000))
            .await
            .unwrap();
        let r = b.downgrade(&w).await.unwrap();
        assert!(b.release(&r).await.unwrap());
    })
    .await;
    assert_eq!(trips, 3, "write, downgrade, release");
}
