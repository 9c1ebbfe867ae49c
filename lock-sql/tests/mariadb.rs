//! MariaDB 10.11 started by the harness: the whole conformance suite, a
//! killed holder and a restarted database, writes guarded by the lease row
//! (LOCK IN SHARE MODE).

mod admin_checks;
mod common;
mod fair_checks;
mod guarded_checks;
mod multi_checks;
mod server_checks;

use std::time::Duration;

use lock_core::{LockBackend, LockBackendExt, LockKey, WaitStrategy};
use lock_sql::SqlBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb() {
    let Some((target, url)) = server_checks::deployed_and_checked("mariadb").await else {
        return;
    };

    let a = SqlBackend::connect_url(&url).await.unwrap();
    let b = SqlBackend::connect_url(&url).await.unwrap();
    assert_eq!(b.capabilities().waiting, WaitStrategy::Poll);
    let key = LockKey::new("fence/mariadb").unwrap();
    let next = a
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    // Held: the duplicate-key grant changes nothing and reports "held"
    // (CLIENT_FOUND_ROWS would say 1 row).
    assert!(
        b.try_acquire(&key, Duration::from_secs(30))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        b.inspect(&key).await.unwrap().unwrap().token,
        Some(next.token())
    );
    // Keys are exact byte strings (VARBINARY): no case folding, no
    // trailing-space padding as a collation would do.
    let upper = LockKey::new("FENCE/MariaDB").unwrap();
    let other = b
        .try_acquire(&upper, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        other.is_some(),
        "a key differing only in case must be a different lock"
    );
    let padded = LockKey::new("fence/mariadb ").unwrap();
    assert!(
        b.try_acquire(&padded, Duration::from_secs(30))
            .await
            .unwrap()
            .is_some()
    );

    // A write guarded by the lease row, in the same database.
    common::guarded_write!(
        a,
        a,
        &next,
        a.mysql_pool().unwrap().clone(),
        [
            "CREATE TABLE IF NOT EXISTS ledger (id INT PRIMARY KEY, v BIGINT NOT NULL) ENGINE=InnoDB",
            "INSERT IGNORE INTO ledger VALUES (1, 0)",
        ],
        "UPDATE ledger SET v = ? WHERE id = 1 AND {}"
    );

    guarded_checks::guarded_checks(&url).await;

    common::holder_killed_and_deployment_restarted(&url, &target, "mariadb").await;
}
