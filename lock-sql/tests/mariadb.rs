//! MariaDB 10.11 started by the harness: the whole conformance suite, a
//! killed holder and a restarted database, fencing (LOCK IN SHARE MODE).

mod admin_checks;
mod common;
mod fair_checks;
mod multi_checks;

use std::time::Duration;

use conformance::{Harness, OrSkip, Target, run_suite};
use lock_core::{LockBackend, LockKey, WaitStrategy};
use lock_sql::SqlBackend;
use lock_sql::sqlx::{self, AssertSqlSafe};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb() {
    let Some(target) = common::deployed("mariadb").await.or_skip() else {
        return;
    };
    let url = common::client_url(&target);
    run_suite(&Harness::new(target.clone()))
        .await
        .assert_passed();
    common::check_floor(&url).await;
    // Fair mode on the same server: the mutex cases (FIFO included) and
    // the fair checks (their broken variants run on SQLite: the same
    // checks, dialect-independent doubles).
    fair_checks::run_fair_suite("mariadb", &url).await;
    fair_checks::fair_checks(&url).await;
    multi_checks::multi_checks(&url).await;
    admin_checks::admin_checks(&url).await;

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

    // Fenced write in the same database.
    let pool = a.mysql_pool().unwrap().clone();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS ledger (id INT PRIMARY KEY, v BIGINT NOT NULL) ENGINE=InnoDB",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("INSERT IGNORE INTO ledger VALUES (1, 0)")
        .execute(&pool)
        .await
        .unwrap();
    let fence = a.fence(&next, 2);
    let sql = format!(
        "UPDATE ledger SET v = ? WHERE id = 1 AND {}",
        fence.predicate()
    );
    let done = fence
        .bind(sqlx::query(AssertSqlSafe(sql.clone())).bind(7_i64))
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(done.rows_affected(), 1);
    a.release(&next).await.unwrap();
    let stale = fence
        .bind(sqlx::query(AssertSqlSafe(sql)).bind(8_i64))
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(stale.rows_affected(), 0, "released lease wrote");

    common::holder_killed_and_database_restarted(&url, || async {
        assert!(
            target
                .kill_and_restart_server()
                .await
                .expect("restart mariadb"),
            "the deployment restarts"
        );
    })
    .await;
}
