//! The client shapes' two extra baselines on real servers: the client
//! library alone (`lock_bench::crate_alone`) and SQL session mode's raw
//! server lock (`lock_bench::sql::SqlRawLock`). Each cycles on a free key,
//! and takes the very lock the driver takes for the same key: refused
//! while the driver holds it. A baseline connected with another namespace
//! (the deliberately wrong layout) is not refused, which shows the
//! exclusion check can fail.

use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::bench::Contender;
use conformance::servers::etcd::EtcdServer;
use conformance::servers::postgres::PostgresServer;
use conformance::servers::redis::RedisServer;
use conformance::servers::zookeeper::ZkServer;
use lock_core::LockClient;

const TTL: Duration = Duration::from_secs(30);

/// A crate-alone client of the driver at `url`.
async fn alone(url: &str) -> Arc<dyn Contender> {
    let driver = distlock::backend::driver_for(url).unwrap().name;
    let alone = lock_bench::crate_alone::for_driver(driver).expect("a library alone");
    (alone.connect)(url, TTL)
        .await
        .unwrap()
        .expect("a form with a library alone")
}

/// `baseline` cycles on a free key and is refused on a key the driver
/// at `url` holds; `wrong` (another namespace) is not.
async fn excludes_with_the_driver(url: &str, baseline: &dyn Contender, wrong: &dyn Contender) {
    for _ in 0..3 {
        baseline.cycle("free").await.unwrap();
    }
    let client = LockClient::from_arc(distlock::backend::open(url).await.unwrap());
    let guard = client
        .lock("held")
        .ttl(TTL)
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    let refused = baseline.cycle("held").await;
    assert!(refused.is_err(), "the baseline took a key the driver holds");
    wrong
        .cycle("held")
        .await
        .expect("another namespace's key is free");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_client_alone_takes_the_drivers_lock() {
    let Some(server) = ZkServer::start().await.or_skip() else {
        return;
    };
    let url = |chroot: &str| format!("{}/{chroot}?session_timeout=10s&timeout=2s", server.url());
    let baseline = alone(&url("alone")).await;
    let wrong = alone(&url("elsewhere")).await;
    excludes_with_the_driver(&url("alone"), &*baseline, &*wrong).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_client_alone_takes_the_drivers_lock() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let baseline = alone(&server.url("alone", "timeout=2s")).await;
    let wrong = alone(&server.url("elsewhere", "timeout=2s")).await;
    excludes_with_the_driver(&server.url("alone", "timeout=2s"), &*baseline, &*wrong).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_rs_alone_takes_the_drivers_lock() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let url = |prefix: &str| format!("{}?prefix={prefix}&timeout=2s", server.url());
    let baseline = alone(&url("alone:")).await;
    let wrong = alone(&url("elsewhere:")).await;
    excludes_with_the_driver(&url("alone:"), &*baseline, &*wrong).await;
}

/// Redlock: redis-rs alone on five nodes takes the lock on a majority, as
/// the driver does; refused while the driver holds the key on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_rs_alone_takes_the_redlock_drivers_lock() {
    let Some(servers) = RedisServer::start_many(5).await.or_skip() else {
        return;
    };
    let nodes = RedisServer::redlock_url(&servers);
    let url = |prefix: &str| format!("{nodes}?prefix={prefix}&timeout=2s");
    let baseline = alone(&url("alone:")).await;
    let wrong = alone(&url("elsewhere:")).await;
    excludes_with_the_driver(&url("alone:"), &*baseline, &*wrong).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_server_lock_takes_session_modes_lock() {
    let Some(server) = PostgresServer::start().await.or_skip() else {
        return;
    };
    let url = |table: &str| format!("{}?mode=session&table={table}&timeout=1s", server.url());
    let raw = |url: String| async move {
        let raw = lock_bench::sql::raw_lock_of_session_url(&url)
            .await
            .unwrap();
        Arc::new(raw.expect("session mode")) as Arc<dyn Contender>
    };
    // Row mode has no server lock to compare with.
    let row = format!("{}?table=alone", server.url());
    assert!(
        lock_bench::sql::raw_lock_of_session_url(&row)
            .await
            .unwrap()
            .is_none()
    );
    let baseline = raw(url("alone")).await;
    let wrong = raw(url("elsewhere")).await;
    excludes_with_the_driver(&url("alone"), &*baseline, &*wrong).await;
}
