//! Read-write locks and semaphores behind the fault proxy: round trips per
//! cycle of our read, write and permit grant+release and of the permit
//! floor ([`SqlPermitFloor`]), on PostgreSQL and MariaDB; the floor's
//! permits count against the driver's.
//!
//! The count sees an extra statement: a permit floor that also runs
//! `SELECT 1` on a connection of its own through the proxy counts one more
//! than it declares (checked below).

mod common;
mod proxied;

use std::time::Duration;

use conformance::OrSkip;
use conformance::floor::RawFloor;
use conformance::proxy::FaultProxy;
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use lock_bench::sql::SqlPermitFloor;
use lock_core::{LeaseKind, LockBackend, LockBackendExt, LockKey};
use lock_sql::SqlBackend;
use proxied::{Extra, ExtraStatement, proxy_to, through};

const CYCLES: u64 = 30;
const TTL: Duration = Duration::from_secs(30);

async fn per_cycle(proxy: &FaultProxy, cycle: impl AsyncFnMut()) -> u64 {
    proxied::per_cycle(proxy, 3, CYCLES, cycle).await
}

async fn kind_cycle(backend: &SqlBackend, key: &LockKey, kind: LeaseKind) {
    let lease = backend
        .try_acquire_kind(key, kind, TTL)
        .await
        .expect("try")
        .expect("a free key is granted");
    assert!(backend.release(&lease).await.expect("release"));
}

async fn check(url: &str, proxy: &FaultProxy, extra: Extra, name: &str, lock_statements: u64) {
    let backend = SqlBackend::connect_url(url).await.unwrap();
    let permit = LeaseKind::permits(1, 4).unwrap();
    let k = |s: &str| LockKey::new(s).unwrap();
    let read = per_cycle(proxy, async || {
        kind_cycle(&backend, &k("srt/r"), LeaseKind::Read).await
    })
    .await;
    let write = per_cycle(proxy, async || {
        kind_cycle(&backend, &k("srt/w"), LeaseKind::Write).await
    })
    .await;
    let permits = per_cycle(proxy, async || {
        kind_cycle(&backend, &k("srt/p"), permit).await
    })
    .await;
    let floor = SqlPermitFloor::connect(url, 1, 4).await.unwrap();
    let floor_count = per_cycle(proxy, async || {
        floor.cycle("srt/floor", TTL).await.expect("floor cycle");
    })
    .await;
    println!(
        "{name}: read {read}, write {write}, permit {permits}, permit floor {floor_count} round trips per grant+release"
    );
    // BEGIN, the key row, the state, the holder, COMMIT; the release.
    let expected = 5 + lock_statements;
    assert_eq!(u64::from(floor.round_trips_per_cycle()), expected, "{name}");
    assert_eq!(
        floor_count, expected,
        "{name}: the floor counts what it declares"
    );
    assert_eq!(permits, expected, "{name}: permit grant+release");
    // Readers lock the key's row in share mode: create-if-missing, then
    // the locking read (two statements on both databases).
    assert_eq!(read, 5 + 2, "{name}: read grant+release");
    assert_eq!(
        write,
        expected + 1,
        "{name}: write grant (and its epoch)+release"
    );

    let extra = ExtraStatement::new(SqlPermitFloor::connect(url, 1, 4).await.unwrap(), extra);
    let with_extra = per_cycle(proxy, async || {
        RawFloor::cycle(&extra, "srt/extra", TTL)
            .await
            .expect("cycle");
    })
    .await;
    assert_eq!(
        with_extra,
        expected + 1,
        "{name}: one more statement is seen"
    );

    // The floor's permits count against the driver's on the same key.
    let key = k("srt/shared");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            backend
                .try_acquire_kind(&key, permit, TTL)
                .await
                .unwrap()
                .expect("free"),
        );
    }
    let grant = floor
        .try_grant("srt/shared", TTL)
        .await
        .unwrap()
        .expect("the 4th permit");
    assert!(
        floor.try_grant("srt/shared", TTL).await.unwrap().is_none(),
        "{name}: a 5th of 4"
    );
    assert!(
        backend
            .try_acquire_kind(&key, permit, TTL)
            .await
            .unwrap()
            .is_none(),
        "{name}"
    );
    assert!(floor.release(&grant).await.unwrap());
    for lease in &held {
        assert!(backend.release(lease).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_shared_round_trips() {
    let Some(server) = PostgresServer::start().await.or_skip() else {
        return;
    };
    let proxy = proxy_to(server.port()).await;
    let url = through(&server.url(), server.port(), &proxy);
    check(&url, &proxy, Extra::postgres(&url).await, "postgres", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_shared_round_trips() {
    let Some(server) = MariaDbServer::start().await.or_skip() else {
        return;
    };
    let proxy = proxy_to(server.port()).await;
    let url = through(&server.url(), server.port(), &proxy);
    check(&url, &proxy, Extra::mariadb(&url).await, "mariadb", 2).await;
}
