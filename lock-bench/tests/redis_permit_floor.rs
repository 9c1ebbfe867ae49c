//! The Redis permit floor (the driver's semaphore scripts by hand on one
//! bare connection) against the driver: the same permits, the same round
//! trips.

use std::time::Duration;

use conformance::OrSkip;
use conformance::floor::RawFloor;
use conformance::proxy::{CyclePlan, FaultProxy};
use conformance::servers::redis::RedisServer;
use lock_bench::redis::RedisPermitFloor;
use lock_core::{ErrorKind, LeaseKind, LockBackend, LockBackendExt, LockKey, LockShape};
use lock_redis::{RedisBackend, RedisConfig};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(5);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("{name}-{}", std::process::id())).unwrap()
}

fn permits(count: u32, limit: u32) -> LeaseKind {
    LeaseKind::permits(count, limit).unwrap()
}

fn soon(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

async fn single() -> Option<(RedisServer, RedisBackend)> {
    let server = RedisServer::start().await.or_skip()?;
    let backend = client(&format!("redis://127.0.0.1:{}", server.port())).await;
    Some((server, backend))
}

async fn raw(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

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

/// The permit floor (the driver's semaphore scripts by hand on one bare
/// connection) counts against the driver's permits on the same key, and a
/// permit acquire+release costs 2 round trips for both, counted by the
/// fault proxy (a third one fails the comparison: the warm-up cycle with
/// its `NOSCRIPT` fallback shows the count seeing it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_floor_excludes_with_the_driver_and_costs_what_the_driver_costs() {
    let Some((server, driver)) = single().await else {
        return;
    };
    let (proxy, url) = proxied(server.port()).await;
    let floor = RedisPermitFloor::connect(&url, 1, 3).await.unwrap();
    let k = key("floor");
    // The driver holds 2 of 3: the floor gets the last one, then nothing.
    let two = driver
        .try_acquire_kind(&k, permits(2, 3), TTL)
        .await
        .unwrap()
        .unwrap();
    let grant = floor
        .try_grant(k.as_str(), TTL)
        .await
        .unwrap()
        .expect("1 left");
    assert!(grant.token > two.token().get());
    assert!(floor.try_grant(k.as_str(), TTL).await.unwrap().is_none());
    let holders = driver.holders(&k, LockShape::Semaphore).await.unwrap();
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert!(
        driver
            .try_acquire_kind(&k, permits(1, 3), TTL)
            .await
            .unwrap()
            .is_none(),
        "the floor's permit counts for the driver"
    );
    assert!(floor.release(&grant).await.unwrap());
    assert!(!floor.release(&grant).await.unwrap());
    assert!(driver.release(&two).await.unwrap());
    let mismatch = RedisPermitFloor::connect(&url, 1, 4).await.unwrap();
    let _held = driver
        .try_acquire_kind(&k, permits(1, 3), TTL)
        .await
        .unwrap()
        .unwrap();
    let err = mismatch.try_grant(k.as_str(), TTL).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert_eq!(
        RedisPermitFloor::connect(&url, 4, 3)
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );

    // The descriptor's permit floor: one permit of a semaphore of 4, on
    // one server only.
    let of = lock_bench::for_driver("redis")
        .permit_floor
        .expect("a permit floor");
    let described = of(&url).await.unwrap().expect("redis:// has one");
    let dk = key("described");
    let grant = described
        .try_grant(dk.as_str(), TTL)
        .await
        .unwrap()
        .unwrap();
    let holders = driver.holders(&dk, LockShape::Semaphore).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].kind, permits(1, 4));
    assert!(described.release(&grant).await.unwrap());
    assert!(of("redis+cluster://127.0.0.1:1").await.unwrap().is_none());

    // Round trips per cycle: the floor's, then the driver's (its own
    // connection through the proxy), each after a warm-up.
    let through = client(&url).await;
    let fk = key("floor-cycle");
    let floor_trips = per_cycle(&proxy, async || {
        floor.cycle(fk.as_str(), TTL).await.unwrap();
    })
    .await;
    let dk = key("driver-cycle");
    let driver_trips = per_cycle(&proxy, async || {
        let lease = through
            .acquire_kind(&dk, permits(1, 3), TTL, soon(5_000))
            .await
            .unwrap();
        assert!(through.release(&lease).await.unwrap());
    })
    .await;
    assert_eq!(floor.round_trips_per_cycle(), 2);
    assert_eq!(floor_trips, 2, "floor");
    assert_eq!(
        driver_trips, 2,
        "driver: acquire_kind + release of one permit"
    );
    // The count sees a third round trip: a cold script cache costs the
    // NOSCRIPT answer and the EVAL on every call.
    let mut admin = raw(server.port()).await;
    let cold = per_cycle(&proxy, async || {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut admin)
            .await
            .unwrap();
        floor.cycle(fk.as_str(), TTL).await.unwrap();
    })
    .await;
    assert!(
        cold > 2,
        "a flushed cache must cost more round trips: {cold}"
    );
}
