//! PostgreSQL 15 started by the harness: the whole conformance suite, a
//! killed holder and a restarted database, NOTIFY-driven waiting, writes
//! guarded by the lease row.

mod admin_checks;
mod common;
mod fair_checks;
mod guarded_checks;
mod multi_checks;
mod server_checks;

use std::time::Duration;

use lock_core::{LockBackend, LockBackendExt, LockKey, WaitStrategy};
use lock_sql::SqlBackend;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let Some((target, url)) = server_checks::deployed_and_checked("postgres").await else {
        return;
    };

    // Waiters are woken by NOTIFY, long before the re-check interval.
    let notify_url = common::with_options(&url, "recheck=5s");
    let a = SqlBackend::connect_url(&notify_url).await.unwrap();
    let b = SqlBackend::connect_url(&notify_url).await.unwrap();
    assert_eq!(b.capabilities().waiting, WaitStrategy::Notify);
    let key = LockKey::new("notify/wake").unwrap();
    let lease = a
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let waiter = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move {
            let lease = b
                .acquire(
                    &key,
                    Duration::from_secs(5),
                    Instant::now() + Duration::from_secs(10),
                )
                .await
                .unwrap();
            (Instant::now(), lease)
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released_at = Instant::now();
    assert!(a.release(&lease).await.unwrap());
    let (granted_at, next) = waiter.await.unwrap();
    let wake = granted_at - released_at;
    println!("postgres NOTIFY wake-up after release: {wake:?}");
    assert!(
        wake < Duration::from_secs(2),
        "woken after {wake:?}: NOTIFY not used"
    );
    assert!(next.token() > lease.token());

    // A write guarded by the lease row, in the same database.
    common::guarded_write!(
        a,
        b,
        &next,
        a.pg_pool().unwrap().clone(),
        [
            "CREATE TABLE IF NOT EXISTS ledger (id INT PRIMARY KEY, v BIGINT NOT NULL)",
            "INSERT INTO ledger VALUES (1, 0) ON CONFLICT DO NOTHING",
        ],
        "UPDATE ledger SET v = $1 WHERE id = 1 AND {}"
    );

    guarded_checks::guarded_checks(&url).await;

    common::holder_killed_and_deployment_restarted(&url, &target, "postgres").await;
}
