//! Held locks at scale in row mode on real PostgreSQL and MariaDB servers
//! (and SQLite, in process): client-side heap per held lock and round trips
//! per renewal period (counted by the fault proxy), renewed with one
//! `UPDATE` per batch of keys. `DISTLOCK_SCALE=1000,10000,100000` runs more
//! sizes.

use std::net::SocketAddr;
use std::sync::Arc;

use conformance::OrSkip;
use conformance::scale::{
    CountingAllocator, ScaleConfig, check_report, held_locks, held_locks_proxied, print_report,
    scales_from_env,
};
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use lock_core::{
    ErrorKind, FencingToken, Lease, LockBackend, LockBackendExt, LockError, LockKey, OwnerId,
};
use lock_sql::RENEW_ROWS_PER_STATEMENT;

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

/// One at a time: the heap counter is process-wide.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Connects `url` with its host and port replaced by the proxy's.
async fn through(
    url: &str,
    port: u16,
    addr: SocketAddr,
) -> Result<Arc<dyn LockBackend>, lock_core::LockError> {
    let url = url.replacen(&format!("127.0.0.1:{port}"), &addr.to_string(), 1);
    Ok(Arc::new(lock_sql::connect(&url).await?) as Arc<dyn LockBackend>)
}

/// A batch with leases that are ours, one released, one with a forged owner
/// and one with a stale token: only ours are renewed, the others come back
/// `NotHeld` and their rows are untouched (a statement missing the owner or
/// token guard renews the forged ones and fails here).
async fn mixed_batch(backend: &dyn LockBackend) {
    let ttl = std::time::Duration::from_secs(5);
    let mut ours = Vec::new();
    for i in 0..5 {
        let key = LockKey::new(format!("mixed-{}/{i}", std::process::id())).unwrap();
        ours.push(backend.try_acquire(&key, ttl).await.unwrap().unwrap());
    }
    assert!(backend.release(&ours[1]).await.unwrap());
    let forged = |lease: &Lease, owner: OwnerId, token: u64| {
        Lease::from_parts(
            lease.key().clone(),
            owner,
            FencingToken::new(token),
            ttl,
            lease.validity_deadline(),
            lease.backend_data().to_owned(),
        )
    };
    let wrong_owner = forged(&ours[2], OwnerId::random(), ours[2].token().get());
    let wrong_token = forged(&ours[3], ours[3].owner(), ours[3].token().get() + 1);
    let batch = [
        &ours[0],
        &ours[1],
        &wrong_owner,
        &wrong_token,
        &ours[4],
        &ours[2],
    ];
    let results = backend.renew_many(&batch).await;
    let kinds: Vec<Option<ErrorKind>> = results
        .iter()
        .map(|r| r.as_ref().err().map(LockError::kind))
        .collect();
    assert_eq!(
        kinds,
        [
            None,
            Some(ErrorKind::NotHeld),
            Some(ErrorKind::NotHeld),
            Some(ErrorKind::NotHeld),
            None,
            None
        ],
        "{results:?}"
    );
    for lease in [&ours[0], &ours[2], &ours[3], &ours[4]] {
        assert!(backend.release(lease).await.unwrap());
    }
}

async fn run(url: String, port: u16) {
    let backend = lock_sql::connect(&url).await.unwrap();
    mixed_batch(&backend).await;
    drop(backend);
    let upstream = SocketAddr::from(([127, 0, 0, 1], port));
    for locks in scales_from_env(&[1_000]) {
        let url = url.clone();
        let report = held_locks_proxied(upstream, &ScaleConfig::new(locks), |addr| async move {
            through(&url, port, addr).await
        })
        .await
        .unwrap();
        print_report(&report);
        // A pool keep-alive or two may fall in a period.
        check_report(&report, RENEW_ROWS_PER_STATEMENT, 2).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_renews_many_held_locks_in_one_statement_per_batch() {
    let _serial = SERIAL.lock().await;
    let Some(server) = PostgresServer::start().await.or_skip() else {
        return;
    };
    run(server.url(), server.port()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_renews_many_held_locks_in_one_statement_per_batch() {
    let _serial = SERIAL.lock().await;
    let Some(server) = MariaDbServer::start().await.or_skip() else {
        return;
    };
    run(server.url(), server.port()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_renews_many_held_locks_in_one_statement_per_batch() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    mixed_batch(&lock_sql::connect(&url).await.unwrap()).await;
    for locks in scales_from_env(&[1_000]) {
        let backend: Arc<dyn LockBackend> = Arc::new(lock_sql::connect(&url).await.unwrap());
        // SQLite's own memory is C heap, not counted; the statement count is
        // the renew_many calls.
        let report = held_locks(backend, &ScaleConfig::new(locks), None, None)
            .await
            .unwrap();
        print_report(&report);
        check_report(&report, RENEW_ROWS_PER_STATEMENT, 0).unwrap();
    }
}
