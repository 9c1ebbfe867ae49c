//! Read-write locks and semaphores in row mode, against real PostgreSQL and
//! MariaDB (started by the test kit) and a SQLite file: exclusion observed
//! under contention, readers overlapping, writer preference, downgrade,
//! limit mismatch, a crashed holder's expiry, tokens, cancelled waits.
//!
//! The checks live in `shared_checks`; `tests/shared_broken.rs` shows each
//! one failing on a deliberately broken wrapper of the SQLite backend.

mod common;
mod shared_checks;

use conformance::OrSkip;
use lock_core::ErrorKind;
use shared_checks::all_checks;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_shared() {
    let Some(target) = common::deployed("postgres").await.or_skip() else {
        return;
    };
    all_checks(&common::client_url(&target), "pg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_shared() {
    let Some(target) = common::deployed("mariadb").await.or_skip() else {
        return;
    };
    all_checks(&common::client_url(&target), "maria").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_shared() {
    let target = common::SqliteTarget::new();
    all_checks(&target.url, "lite").await;
}

/// The permit floor refuses what the driver refuses, before connecting:
/// session mode (no semaphores there) and bad counts.
#[tokio::test]
async fn permit_floor_refuses_session_mode_and_bad_counts() {
    use lock_bench::sql::SqlPermitFloor;
    let session = SqlPermitFloor::connect("postgres://u@127.0.0.1:1/db?mode=session", 1, 4).await;
    assert_eq!(session.unwrap_err().kind(), ErrorKind::Unsupported);
    let bad = SqlPermitFloor::connect("sqlite::memory:", 5, 4).await;
    assert_eq!(bad.unwrap_err().kind(), ErrorKind::InvalidArgument);
}
