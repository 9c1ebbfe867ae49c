//! SQLite: the whole conformance suite on a file, several child processes
//! contending on one file, a holder process killed mid-hold, writes
//! guarded by the lease row.

mod admin_checks;
mod common;
mod fair_checks;
mod guarded_checks;
mod multi_checks;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use conformance::{Harness, run_suite};
use lock_core::{ErrorKind, LockBackend, LockBackendExt, LockKey};
use lock_sql::sqlx::{self, AssertSqlSafe};
use lock_sql::{OwnerPredicate, SqlBackend, SqlConfig};
use tokio::time::Instant;

const CHILD_DB: &str = "LOCK_SQL_CHILD_DB";
const CHILD_MODE: &str = "LOCK_SQL_CHILD_MODE";
const CHILD_ITERATIONS: &str = "LOCK_SQL_CHILD_ITERATIONS";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_on_a_sqlite_file() {
    let target = Arc::new(common::SqliteTarget::new());
    run_suite(&Harness::new(target)).await.assert_passed();
}

/// Fair mode on a SQLite file: the mutex cases (FIFO included) on a fair
/// target, the fair checks, and each check failing on its broken variant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_on_a_sqlite_file() {
    let target = common::SqliteTarget::new();
    fair_checks::run_fair_suite("sqlite", &target.url).await;
    fair_checks::fair_checks(&target.url).await;
    fair_checks::broken_variants(&target.url).await;
}

/// `try_acquire_all` on a SQLite file: the multi checks and their broken
/// variants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_lock_sets_on_a_sqlite_file() {
    let target = common::SqliteTarget::new();
    multi_checks::multi_checks(&target.url).await;
    multi_checks::broken_variant(&target.url).await;
}

/// Writes guarded by the lease table on a SQLite file: the guarded-write
/// cases in the statement and transaction forms, and the unchecked write
/// failing them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_writes_on_a_sqlite_file() {
    let target = common::SqliteTarget::new();
    guarded_checks::guarded_checks(&target.url).await;
}

/// `fair=true` in session mode is refused before connecting
/// (Unsupported: server session locks have no documented waiter order);
/// a bad `fair` value is a Config error.
#[tokio::test]
async fn fair_session_mode_is_refused() {
    for url in [
        "postgres://u@127.0.0.1:1/db?mode=session&fair=true",
        "mysql://u@127.0.0.1:1/db?mode=session&fair=true",
    ] {
        let err = lock_sql::connect(url).await.expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{url}: {err}");
    }
    let err = SqlConfig::from_url("sqlite://x.db?fair=maybe").expect_err("bad value");
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(
        SqlConfig::from_url("sqlite://x.db?fair=true")
            .unwrap()
            .is_fair()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operating_calls_on_a_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    admin_checks::admin_checks(&url_for(&dir.path().join("admin.db"))).await;
}

#[tokio::test]
async fn benchmark_floor_uses_the_driver_statements() {
    let dir = tempfile::tempdir().unwrap();
    common::check_floor(&url_for(&dir.path().join("floor.db"))).await;
}

fn url_for(path: &std::path::Path) -> String {
    format!("sqlite://{}?timeout=5s&busy_timeout=5s", path.display())
}

async fn prepare_counter(backend: &SqlBackend) {
    let pool = backend.sqlite_pool().expect("sqlite pool");
    sqlx::query("CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("INSERT OR IGNORE INTO counter VALUES (1, 0)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS grants (seq INTEGER PRIMARY KEY AUTOINCREMENT, token INTEGER NOT NULL, pid INTEGER NOT NULL)",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// The counter's value.
async fn read_counter(pool: &sqlx::SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT v FROM counter WHERE id = 1")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Writes `value` to the counter guarded by `owner`: the rows written (0
/// where the predicate refuses an expired or released lease).
async fn write_counter(pool: &sqlx::SqlitePool, owner: &OwnerPredicate, value: i64) -> u64 {
    let sql = format!("UPDATE counter SET v = ?1 WHERE id = 1 AND {}", owner.sql());
    owner
        .bind(sqlx::query(AssertSqlSafe(sql)).bind(value))
        .execute(pool)
        .await
        .unwrap()
        .rows_affected()
}

/// One contender: `iterations` times acquire the shared key, read the
/// counter, yield, write it back +1 guarded by the lease row, log the
/// token, release.
/// A lost update or an out-of-order token shows in the checks afterwards.
async fn contend(path: &std::path::Path, iterations: usize) {
    let backend = SqlBackend::connect_url(&url_for(path)).await.unwrap();
    prepare_counter(&backend).await;
    let pool = backend.sqlite_pool().unwrap().clone();
    let key = LockKey::new("shared/counter").unwrap();
    for _ in 0..iterations {
        let lease = backend
            .acquire(
                &key,
                Duration::from_secs(5),
                Instant::now() + Duration::from_secs(60),
            )
            .await
            .unwrap();
        let v = read_counter(&pool).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        let owner = backend.owner_predicate(&lease, 2).unwrap();
        assert_eq!(
            write_counter(&pool, &owner, v + 1).await,
            1,
            "guarded write refused while holding"
        );
        sqlx::query("INSERT INTO grants (token, pid) VALUES (?1, ?2)")
            .bind(owner.token())
            .bind(i64::from(std::process::id()))
            .execute(&pool)
            .await
            .unwrap();
        assert!(backend.release(&lease).await.unwrap());
    }
}

/// The entry point of child processes (re-executed test binary). Without
/// the environment variable it runs one contender in-process on its own
/// file, so it is a real test either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_child_worker() {
    match (
        std::env::var(CHILD_DB),
        std::env::var(CHILD_MODE).as_deref(),
    ) {
        (Ok(path), Ok("hold")) => {
            let backend = SqlBackend::connect_url(&url_for(path.as_ref()))
                .await
                .unwrap();
            let key = LockKey::new("shared/held").unwrap();
            let lease = backend
                .try_acquire(&key, Duration::from_secs(1))
                .await
                .unwrap()
                .expect("free");
            println!("HELD {}", lease.token());
            // Wait to be killed.
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        (Ok(path), _) => {
            let iterations = std::env::var(CHILD_ITERATIONS)
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(10);
            contend(path.as_ref(), iterations).await;
        }
        (Err(_), _) => {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("solo.db");
            contend(&path, 5).await;
            let backend = SqlBackend::connect_url(&url_for(&path)).await.unwrap();
            assert_eq!(read_counter(backend.sqlite_pool().unwrap()).await, 5);
        }
    }
}

fn child(path: &std::path::Path, mode: &str, iterations: usize) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "sqlite_child_worker",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_DB, path)
    .env(CHILD_MODE, mode)
    .env(CHILD_ITERATIONS, iterations.to_string())
    .stdin(Stdio::null());
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_processes_contend_on_one_file() {
    const PROCESSES: usize = 4;
    const ITERATIONS: usize = 25;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let backend = SqlBackend::connect_url(&url_for(&path)).await.unwrap();
    prepare_counter(&backend).await;
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            child(&path, "contend", ITERATIONS)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    common::all_succeed(children, "child failed").await;
    let pool = backend.sqlite_pool().unwrap();
    assert_eq!(
        read_counter(pool).await,
        i64::try_from(PROCESSES * ITERATIONS).unwrap(),
        "lost updates"
    );
    let tokens: Vec<(i64, i64)> = sqlx::query_as("SELECT token, pid FROM grants ORDER BY seq")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(tokens.len(), PROCESSES * ITERATIONS);
    assert!(
        tokens.windows(2).all(|w| w[0].0 < w[1].0),
        "tokens not strictly increasing in write order: {tokens:?}"
    );
    let pids: std::collections::HashSet<i64> = tokens.iter().map(|t| t.1).collect();
    assert_eq!(pids.len(), PROCESSES, "every process got the lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_frees_by_expiry() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("killed.db");
    let backend = SqlBackend::connect_url(&url_for(&path)).await.unwrap();
    let key = LockKey::new("shared/held").unwrap();
    // Some history first, so the token has something to go back to.
    for _ in 0..3 {
        let lease = backend
            .try_acquire(&key, Duration::from_secs(1))
            .await
            .unwrap()
            .unwrap();
        backend.release(&lease).await.unwrap();
    }
    let mut holder = child(&path, "hold", 0)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = holder.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| l.split("HELD ").nth(1).map(str::to_owned))
    })
    .await
    .unwrap()
    .expect("holder reported its grant");
    let held_token: u64 = line.trim().parse().unwrap();
    assert_eq!(held_token, 4);
    let killed_at = Instant::now();
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(
        backend
            .try_acquire(&key, Duration::from_secs(1))
            .await
            .unwrap()
            .is_none()
    );
    let lease = backend
        .acquire(
            &key,
            Duration::from_secs(1),
            Instant::now() + Duration::from_secs(5),
        )
        .await
        .unwrap();
    let freed_after = killed_at.elapsed();
    assert!(lease.token().get() > held_token);
    assert!(
        freed_after <= Duration::from_millis(1500),
        "freed after {freed_after:?}"
    );
}

#[tokio::test]
async fn owner_predicate_refuses_stale_writers() {
    let backend = SqlBackend::connect_url("sqlite::memory:").await.unwrap();
    prepare_counter(&backend).await;
    let pool = backend.sqlite_pool().unwrap().clone();
    let key = LockKey::new("fenced").unwrap();
    let old = backend
        .try_acquire(&key, Duration::from_millis(50))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let new = backend
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let write = |lease: &lock_core::Lease, value: i64| {
        let (owner, pool) = (backend.owner_predicate(lease, 2).unwrap(), pool.clone());
        async move { write_counter(&pool, &owner, value).await }
    };
    assert_eq!(
        write(&old, 1).await,
        0,
        "an expired, taken-over lease must not write"
    );
    assert_eq!(write(&new, 2).await, 1);
    backend.release(&new).await.unwrap();
    assert_eq!(write(&new, 3).await, 0, "a released lease must not write");
}

#[tokio::test]
async fn table_option_and_schema() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?table=main.app_locks",
        dir.path().join("t.db").display()
    );
    let backend = SqlBackend::connect_url(&url).await.unwrap();
    assert_eq!(backend.quoted_table(), "\"main\".\"app_locks\"");
    let key = LockKey::new("x").unwrap();
    assert!(
        backend
            .try_acquire(&key, Duration::from_secs(1))
            .await
            .unwrap()
            .is_some()
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM app_locks")
        .fetch_one(backend.sqlite_pool().unwrap())
        .await
        .unwrap();
    assert_eq!(rows, 1);
    assert!(backend.schema_sql()[0].starts_with("CREATE TABLE IF NOT EXISTS"));
    // Connecting again is idempotent; without creation a missing table is
    // an error at first use, not a panic.
    SqlBackend::connect_url(&url).await.unwrap();
    let bare = SqlBackend::connect_url(&format!(
        "sqlite://{}?table=missing&create_table=false",
        dir.path().join("t.db").display()
    ))
    .await
    .unwrap();
    let err = bare
        .try_acquire(&key, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
}

#[tokio::test]
async fn unreachable_and_bad_configs_fail_typed_and_bounded() {
    let started = Instant::now();
    for unreachable in [
        "postgres://u:hunter2@127.0.0.1:1/db?timeout=500ms",
        "mysql://u:hunter2@127.0.0.1:1/db?timeout=500ms",
    ] {
        let err = SqlBackend::connect_url(unreachable).await.unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
            "{err}"
        );
        assert!(!format!("{err} {err:?}").contains("hunter2"));
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    let err = SqlBackend::connect_url("sqlite:///nonexistent-dir/x/y.db?mode=rw")
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Backend),
        "{err}"
    );
    for bad in [
        "sqlite::memory:?mode=bogus",
        "postgres://h:notaport/db",
        "oracle://x",
        // Session locks asked of the row backend: refused, never row locks.
        "postgres://u@127.0.0.1:1/db?mode=session",
    ] {
        let err = SqlBackend::connect_url(bad).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{bad}: {err}");
    }
    let config = SqlConfig::from_url("sqlite::memory:").unwrap();
    let backend = SqlBackend::connect(config).await.unwrap();
    let key = LockKey::new("k").unwrap();
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(1),
        Duration::from_secs(10 * 86_400),
    ] {
        let err = backend.try_acquire(&key, ttl).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    }
}

/// The writes of one backend take turns in the process (issue #13): with a
/// busy timeout of 1 ms, 16 tasks granting, renewing in batches and
/// releasing on one file through the backend's 4 connections never meet
/// SQLite's "database is locked". (Writers of several connections racing
/// for the file's one write lock wait in SQLite's busy handler instead,
/// where a large renewal batch could lose to a stream of grants for
/// seconds; with the turn taken away this test fails on "database is
/// locked".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_one_backend_take_turns() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?busy_timeout=1ms&pool_size=4",
        dir.path().join("turns.db").display()
    );
    let backend = Arc::new(SqlBackend::connect_url(&url).await.unwrap());
    let ttl = Duration::from_secs(30);
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..16 {
        let backend = backend.clone();
        tasks.spawn(async move {
            let mut leases = Vec::new();
            for i in 0..40 {
                let key = LockKey::new(format!("turns/{task}/{i}")).unwrap();
                leases.push(backend.try_acquire(&key, ttl).await?.expect("a free key"));
            }
            for _ in 0..3 {
                let refs: Vec<_> = leases.iter().collect();
                for result in backend.renew_many(&refs).await {
                    result?;
                }
            }
            for lease in &leases {
                assert!(backend.release(lease).await?);
            }
            Ok::<_, lock_core::LockError>(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.unwrap().unwrap();
    }
}
