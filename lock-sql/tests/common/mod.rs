//! Targets for the shared conformance suite: PostgreSQL and MariaDB
//! deployments started by the harness (`conformance::deploy`), and SQLite
//! files (no deployment has them: a target of its own, below).

#![allow(dead_code, unreachable_pub)] // each test binary uses part of this

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use conformance::deploy::{self, DeployedTarget, Opener};
use conformance::{HarnessError, Target};
use lock_core::{LockBackend, LockBackendExt, LockError, LockKey, async_trait};
use lock_sql::SqlBackend;
use lock_sql::sqlx::{self, Connection};
use tokio::time::Instant;

/// Options every test client uses: short operation timeouts so a paused
/// server shows up quickly as a timeout.
pub const CLIENT_OPTIONS: &str = "timeout=1s&pool_size=4";

/// Waits for every child process (off the runtime's threads) and fails the
/// test, naming `what` and showing the child's output, when one did not
/// exit successfully.
pub async fn all_succeed(children: Vec<std::process::Child>, what: &str) {
    let outputs = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    for out in &outputs {
        assert!(
            out.status.success(),
            "{what}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Appends `options` to `url`.
pub fn with_options(url: &str, options: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{options}")
}

/// The `SqlBackend` opener of a deployment: the deployment's URL with
/// [`CLIENT_OPTIONS`] added (the proxied clients' URLs too).
pub fn opener() -> Opener {
    Arc::new(|url: String| {
        Box::pin(async move {
            let url = with_options(&url, CLIENT_OPTIONS);
            Ok(Arc::new(SqlBackend::connect_url(&url).await?) as Arc<dyn LockBackend>)
        })
    })
}

#[allow(unused_imports)] // each test binary uses part of this
pub use conformance::UrlTarget;

/// A started deployment of `kind` (`postgres`, `mariadb`) as a suite
/// target: unreachable = SIGSTOP of the server, kill-and-restart, proxied
/// clients (see [`DeployedTarget`]).
pub async fn deployed(kind: &str) -> Result<Arc<DeployedTarget>, HarnessError> {
    let deployment = deploy::start(kind).await?;
    Ok(Arc::new(DeployedTarget::new(deployment, opener())))
}

/// The URL the deployment's clients use, with [`CLIENT_OPTIONS`].
pub fn client_url(target: &DeployedTarget) -> String {
    with_options(&target.url(), CLIENT_OPTIONS)
}

/// A SQLite file. SQLite has no server to pause: "unreachable" is another
/// connection holding the file's exclusive write lock (`BEGIN EXCLUSIVE`),
/// which stalls every writer, in every process, until the busy timeout.
pub struct SqliteTarget {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub url: String,
    blocker: tokio::sync::Mutex<Option<sqlx::SqliteConnection>>,
}

impl SqliteTarget {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("locks.db");
        let url = format!(
            "sqlite://{}?{CLIENT_OPTIONS}&busy_timeout=800ms",
            path.display()
        );
        Self {
            dir,
            path,
            url,
            blocker: tokio::sync::Mutex::new(None),
        }
    }
}

#[async_trait]
impl Target for SqliteTarget {
    fn name(&self) -> String {
        "sqlite".into()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(SqlBackend::connect_url(&self.url).await?))
    }

    async fn make_unreachable(&self) -> Result<bool, HarnessError> {
        let url = format!("sqlite://{}", self.path.display());
        let mut conn = sqlx::SqliteConnection::connect(&url)
            .await
            .map_err(|e| HarnessError::Io(std::io::Error::other(e)))?;
        sqlx::query("BEGIN EXCLUSIVE")
            .execute(&mut conn)
            .await
            .map_err(|e| HarnessError::Io(std::io::Error::other(e)))?;
        *self.blocker.lock().await = Some(conn);
        Ok(true)
    }

    async fn heal(&self) -> Result<(), HarnessError> {
        if let Some(mut conn) = self.blocker.lock().await.take() {
            let _ = sqlx::query("ROLLBACK").execute(&mut conn).await;
            let _ = conn.close().await;
        }
        Ok(())
    }
}

/// Retries `op` through temporary errors (dead pooled connections after a
/// restart) for up to 20 s.
pub async fn retry<T, F, Fut>(mut op: F) -> Result<T, LockError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LockError>>,
{
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match op().await {
            Err(e)
                if e.is_temporary() && !e.is_contended() && tokio::time::Instant::now() < until =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

/// A wait with no queue, as the broken doubles wait: `try_grant` every
/// 20 ms until it grants, or Contended (`why`) once `deadline` has passed.
pub async fn poll_until_granted<F, Fut>(
    deadline: tokio::time::Instant,
    why: &str,
    mut try_grant: F,
) -> Result<lock_core::Lease, LockError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<lock_core::Lease>, LockError>>,
{
    loop {
        if let Some(lease) = try_grant().await? {
            return Ok(lease);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(LockError::new(
                lock_core::ErrorKind::Contended,
                lock_core::Operation::Acquire,
                why,
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Kills every other session of the database from `killer`'s pool.
pub async fn kill_other_sessions(killer: &SqlBackend) {
    if let Some(pool) = killer.pg_pool() {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND datname = current_database()",
        )
        .execute(pool)
        .await
        .expect("terminate sessions");
    } else if let Some(pool) = killer.mysql_pool() {
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND USER = CURRENT_USER()",
        )
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        let ids: Vec<i64> = if ids.is_empty() {
            sqlx::query_scalar("SELECT ID FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND DB = DATABASE()")
                .fetch_all(pool)
                .await
                .expect("process list")
        } else {
            ids
        };
        for id in ids {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
                .execute(pool)
                .await;
        }
    }
}

/// The guarded write a server suite checks on the users' pool `$pool` of
/// `$holder` (`$setup`: the ledger table and its row): `$update` (a format
/// string: `v` bound first, then `{}` the ownership predicate from
/// parameter 2)
/// writes while `$lease` is held, and no more once `$releaser` released it.
#[allow(unused_macros)] // only the server suites write
macro_rules! guarded_write {
    ($holder:expr, $releaser:expr, $lease:expr, $pool:expr, $setup:expr, $update:literal) => {{
        use lock_sql::sqlx::{self, AssertSqlSafe};
        let pool = $pool;
        for statement in $setup {
            sqlx::query(statement).execute(&pool).await.unwrap();
        }
        let owner = $holder.owner_predicate($lease, 2).unwrap();
        let sql = format!($update, owner.sql());
        let done = owner
            .bind(sqlx::query(AssertSqlSafe(sql.clone())).bind(7_i64))
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(done.rows_affected(), 1);
        $releaser.release($lease).await.unwrap();
        let stale = owner
            .bind(sqlx::query(AssertSqlSafe(sql)).bind(8_i64))
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(stale.rows_affected(), 0, "released lease wrote");
    }};
}
#[allow(unused_imports)]
pub(crate) use guarded_write;

/// [`holder_killed_and_database_restarted`] on a harness deployment of
/// `kind`, restarted by killing its server.
pub async fn holder_killed_and_deployment_restarted(
    url: &str,
    target: &DeployedTarget,
    kind: &str,
) {
    holder_killed_and_database_restarted(url, || async {
        assert!(
            target
                .kill_and_restart_server()
                .await
                .unwrap_or_else(|e| panic!("restart {kind}: {e:?}")),
            "the deployment restarts"
        );
    })
    .await;
}

/// A holder whose connections are killed, then the database restarted
/// (SIGKILL + start) mid-hold: the row survives, the key stays held until
/// `expires_at`, then frees, and the next token is larger than every
/// earlier one. The old holder's renew is refused afterwards.
pub async fn holder_killed_and_database_restarted<R, RFut>(url: &str, restart: R)
where
    R: FnOnce() -> RFut,
    RFut: std::future::Future<Output = ()>,
{
    use lock_core::LockKey;
    use std::time::Duration;
    use tokio::time::Instant;

    let holder = SqlBackend::connect_url(url).await.unwrap();
    let other = SqlBackend::connect_url(url).await.unwrap();
    let key = LockKey::new(format!("restart/{}", lock_core::OwnerId::random())).unwrap();
    let mut last_token = 0;
    for _ in 0..5 {
        let lease = holder
            .try_acquire(&key, Duration::from_secs(1))
            .await
            .unwrap()
            .unwrap();
        assert!(lease.token().get() > last_token);
        last_token = lease.token().get();
        holder.release(&lease).await.unwrap();
    }
    let ttl = Duration::from_secs(4);
    let sent = Instant::now();
    let held = holder.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert!(held.token().get() > last_token);
    // The holder's connections die: nothing is tied to a session.
    kill_other_sessions(&other).await;
    assert!(
        retry(|| other.try_acquire(&key, ttl))
            .await
            .unwrap()
            .is_none(),
        "a killed connection must not free the lock"
    );
    restart().await;
    let info = retry(|| other.inspect(&key))
        .await
        .unwrap()
        .expect("still held after restart");
    assert_eq!(info.token, Some(held.token()));
    assert!(
        retry(|| other.try_acquire(&key, ttl))
            .await
            .unwrap()
            .is_none(),
        "a restart must not free the lock"
    );
    let next = retry(|| other.acquire(&key, ttl, Instant::now() + Duration::from_secs(20)))
        .await
        .unwrap();
    let freed_after = sent.elapsed();
    assert!(next.token() > held.token(), "token went backwards");
    assert!(
        freed_after >= ttl - Duration::from_millis(100)
            && freed_after <= ttl + Duration::from_secs(2),
        "freed {freed_after:?} after the grant (TTL {ttl:?})"
    );
    let renewed = retry(|| holder.renew(&held)).await;
    assert!(
        renewed.is_err_and(|e| e.is_not_held()),
        "the old holder renewed"
    );
    assert!(!retry(|| holder.release(&held)).await.unwrap());
    println!(
        "restart: freed {freed_after:?} after grant; tokens {} -> {}",
        held.token(),
        next.token()
    );
}

/// The benchmark floor on `url`: cycles on a free key, refuses a key the
/// driver holds (without waiting or stealing it), and bumps the same
/// per-key token the driver uses.
pub async fn check_floor(url: &str) {
    use lock_bench::sql::SqlFloor;
    use lock_core::{ErrorKind, LockKey};
    let ttl = std::time::Duration::from_secs(30);
    let floor = SqlFloor::connect(url).await.unwrap();
    let backend = SqlBackend::connect_url(url).await.unwrap();
    let key = LockKey::new("floor/check").unwrap();
    // The key's first token: 1, or above the token floor where a `gc`
    // (the suite's) ran on this database before.
    let first = backend.try_acquire(&key, ttl).await.unwrap().unwrap();
    let base = first.token().get();
    assert!(backend.release(&first).await.unwrap());
    for _ in 0..3 {
        floor.cycle(key.as_str(), ttl).await.unwrap();
    }
    let lease = backend.try_acquire(&key, ttl).await.unwrap().unwrap();
    // Three floor grants before ours: the floor uses the driver's token.
    assert_eq!(lease.token().get(), base + 4);
    let err = floor.cycle(key.as_str(), ttl).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended, "{err}");
    // Still ours after the refused floor cycle.
    assert!(backend.release(&lease).await.unwrap());
    floor.cycle(key.as_str(), ttl).await.unwrap();
    let next = backend.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert_eq!(next.token().get(), base + 6);
    assert!(backend.release(&next).await.unwrap());
    // Bad inputs are typed errors.
    conformance::bench::assert_floor_refuses_bad_input(&floor, ttl, std::time::Duration::ZERO)
        .await;
}

/// Mutex waiter rows of `key` in the default table's waiters table
/// (counted through `backend`'s users' pool).
pub async fn waiter_rows(backend: &SqlBackend, key: &LockKey) -> i64 {
    let table = format!("{}_waiters", backend.config().table_name());
    if let Some(pool) = backend.pg_pool() {
        let sql = format!("SELECT COUNT(*) FROM \"{table}\" WHERE name = $1 AND shape = 'mutex'");
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(key.as_str())
            .fetch_one(pool)
            .await
            .expect("count waiters")
    } else if let Some(pool) = backend.mysql_pool() {
        let sql = format!("SELECT COUNT(*) FROM `{table}` WHERE name = ? AND shape = 'mutex'");
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(key.as_str().as_bytes())
            .fetch_one(pool)
            .await
            .expect("count waiters")
    } else {
        let pool = backend.sqlite_pool().expect("a pool");
        let sql = format!("SELECT COUNT(*) FROM \"{table}\" WHERE name = ?1 AND shape = 'mutex'");
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(key.as_str())
            .fetch_one(pool)
            .await
            .expect("count waiters")
    }
}

/// Waits (at most 10 s) until a mutex waiter row of `key` is in `rows`'
/// table: a fixed pause can be too short on a loaded machine.
pub async fn wait_for_waiter(rows: &SqlBackend, key: &LockKey) {
    let until = Instant::now() + Duration::from_secs(10);
    while waiter_rows(rows, key).await == 0 {
        assert!(Instant::now() < until, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Drives a waiting `acquire` of `dying` until its waiter row is in
/// `rows`' table (at most 10 s: on a loaded machine queueing can take
/// longer than any fixed pause, and a wait leaked before it queued would
/// leave nothing to check), then leaks it with `dying` itself: a waiter
/// whose process dies without withdrawing (its row stays until it
/// expires). `dying` must be a backend of its own, used for nothing else:
/// the leaked wait may be in the middle of a statement, holding that
/// backend's connection and, on SQLite, its writer turn for good, as a
/// dead process would hold them (its later calls would time out).
pub async fn leak_waiter(
    dying: Arc<dyn LockBackend>,
    rows: &SqlBackend,
    key: &LockKey,
    ttl: Duration,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut wait = Box::pin({
        let key = key.clone();
        async move { dying.acquire(&key, ttl, deadline).await }
    });
    tokio::select! {
        () = wait_for_waiter(rows, key) => {}
        result = &mut wait => match result {
            Ok(lease) => panic!("the leaked waiter was granted: {lease:?}"),
            Err(e) => panic!("the leaked waiter failed: {e}"),
        },
    }
    std::mem::forget(wait);
}
