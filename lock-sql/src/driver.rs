//! The [`LockBackend`] implementation and its capabilities.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use lock_core::{
    Capabilities, ErrorKind, FencingScope, FencingToken, Lease, LockBackend, LockError, LockInfo,
    LockKey, Operation, OwnerId, TtlModel, WaitStrategy, check_ttl, validity_deadline,
    with_timeout,
};
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::config::{SqlConfig, SqlDialect};
use crate::error::map_sqlx;
use crate::sql::Statements;

pub(crate) const NAME: &str = "sql";

/// The shortest TTL accepted: the database clocks have microsecond
/// precision, but a lease must outlive the clock-drift allowance and a
/// round trip to be of any use.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// A notification that every waiter should re-check (the listener lost its
/// connection and may have missed releases).
const WAKE_ALL: &str = "";

/// A pool of the configured dialect.
#[derive(Clone, Debug)]
pub(crate) enum DbPool {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
}

/// A lock service on a SQL table: PostgreSQL, MySQL/MariaDB or SQLite.
///
/// Cheap to clone: clones share one connection pool. See the crate docs for
/// the table, the statements and the caveats.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lock_core::{LockBackend, LockKey};
/// use lock_sql::SqlBackend;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let backend = SqlBackend::connect_url("sqlite::memory:").await?;
/// let key = LockKey::new("reports")?;
/// let lease = backend.try_acquire(&key, Duration::from_secs(5)).await?.expect("free");
/// assert!(backend.try_acquire(&key, Duration::from_secs(5)).await?.is_none());
/// assert!(backend.release(&lease).await?);
/// let again = backend.try_acquire(&key, Duration::from_secs(5)).await?.expect("free again");
/// assert!(again.token() > lease.token());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqlBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: SqlConfig,
    pool: DbPool,
    statements: Statements,
    /// Keys released (by this backend, or by anyone on PostgreSQL through
    /// `LISTEN`); [`WAKE_ALL`] wakes every waiter.
    released: broadcast::Sender<Arc<str>>,
    /// The PostgreSQL listener task, started by the first waiter.
    listener: tokio::sync::OnceCell<()>,
    listener_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self
            .listener_task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

impl fmt::Debug for SqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl SqlBackend {
    /// Connects with a URL (see [`SqlConfig::from_url`]).
    ///
    /// # Errors
    ///
    /// As [`SqlConfig::from_url`] and [`connect`](Self::connect).
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes whatever was opened.
    pub async fn connect_url(url: &str) -> Result<Self, LockError> {
        Self::connect(SqlConfig::from_url(url)?).await
    }

    /// Opens the pool, checks the database answers and creates the lease
    /// table when it is missing (unless disabled).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for options the driver rejects or a dialect
    /// whose cargo feature is off; [`ErrorKind::Unavailable`] /
    /// [`ErrorKind::Timeout`] when the database cannot be reached within
    /// the operation timeout; [`ErrorKind::Backend`] when creating the table
    /// fails.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes whatever was opened. A table created
    /// meanwhile stays (creation is idempotent).
    pub async fn connect(config: SqlConfig) -> Result<Self, LockError> {
        let pool = open_pool(&config)?;
        let statements = Statements::new(config.dialect, &config.table);
        let (released, _) = broadcast::channel(1024);
        let backend = Self {
            inner: Arc::new(Inner {
                config,
                pool,
                statements,
                released,
                listener: tokio::sync::OnceCell::new(),
                listener_task: Mutex::new(None),
            }),
        };
        backend.prepare().await?;
        Ok(backend)
    }

    /// The configuration.
    pub fn config(&self) -> &SqlConfig {
        &self.inner.config
    }

    /// The dialect.
    pub fn dialect(&self) -> SqlDialect {
        self.inner.config.dialect
    }

    /// The PostgreSQL pool, to run your own (e.g. fenced) statements on.
    #[cfg(feature = "postgres")]
    pub fn pg_pool(&self) -> Option<&sqlx::PgPool> {
        #[allow(unreachable_patterns)] // with only this feature on
        match &self.inner.pool {
            DbPool::Postgres(pool) => Some(pool),
            _ => None,
        }
    }

    /// The MySQL/MariaDB pool, to run your own (e.g. fenced) statements on.
    #[cfg(feature = "mysql")]
    pub fn mysql_pool(&self) -> Option<&sqlx::MySqlPool> {
        #[allow(unreachable_patterns)] // with only this feature on
        match &self.inner.pool {
            DbPool::MySql(pool) => Some(pool),
            _ => None,
        }
    }

    /// The SQLite pool, to run your own (e.g. fenced) statements on.
    #[cfg(feature = "sqlite")]
    pub fn sqlite_pool(&self) -> Option<&sqlx::SqlitePool> {
        #[allow(unreachable_patterns)] // with only this feature on
        match &self.inner.pool {
            DbPool::Sqlite(pool) => Some(pool),
            _ => None,
        }
    }

    /// The lease table's name, quoted for this dialect.
    pub fn quoted_table(&self) -> &str {
        &self.inner.statements.quoted_table
    }

    /// The schema this backend creates, for teams that create it themselves
    /// (then connect with `create_table=false`).
    pub fn schema_sql(&self) -> Vec<String> {
        self.inner
            .statements
            .create
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// Closes the pool: later calls fail with [`ErrorKind::Unavailable`].
    ///
    /// # Errors
    ///
    /// None today; kept fallible for future drivers.
    ///
    /// # Cancel safety
    ///
    /// Safe: the pool is closed either way once called.
    pub async fn close(&self) -> Result<(), LockError> {
        if let Some(task) = self
            .inner
            .listener_task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
        match &self.inner.pool {
            #[cfg(feature = "postgres")]
            DbPool::Postgres(pool) => pool.close().await,
            #[cfg(feature = "mysql")]
            DbPool::MySql(pool) => pool.close().await,
            #[cfg(feature = "sqlite")]
            DbPool::Sqlite(pool) => pool.close().await,
        }
        Ok(())
    }

    /// The pool the statements run on (for [`crate::floor`]).
    pub(crate) fn pool(&self) -> &DbPool {
        &self.inner.pool
    }

    /// The dialect's statements for this table (for [`crate::floor`]).
    pub(crate) fn statements(&self) -> &Statements {
        &self.inner.statements
    }

    fn err(&self, operation: Operation, key: &LockKey, err: sqlx::Error) -> LockError {
        map_sqlx(&self.inner.config, operation, err).with_key(key)
    }

    fn timeout(&self) -> Duration {
        self.inner.config.op_timeout
    }

    /// Checks the database answers and creates the table.
    async fn prepare(&self) -> Result<(), LockError> {
        let config = &self.inner.config;
        let budget = config.op_timeout.saturating_mul(2);
        with_timeout(budget, Operation::Connect, async {
            if !config.create_table {
                return self.ping().await;
            }
            // Concurrent `CREATE TABLE IF NOT EXISTS` can race on
            // PostgreSQL's catalog (unique violation); the loser retries
            // and then finds the table.
            let mut last = None;
            for _ in 0..3 {
                match self.create_schema().await {
                    Ok(()) => return Ok(()),
                    Err(err) => {
                        let temporary = matches!(
                            &err,
                            sqlx::Error::Database(db) if db.is_unique_violation()
                                || db.code().as_deref() == Some("42P07")
                        );
                        last = Some(map_sqlx(config, Operation::Connect, err));
                        if !temporary {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            Err(last.unwrap_or_else(|| LockError::config("could not create the lease table")))
        })
        .await
        .map_err(|e| e.with_backend(NAME))
    }

    async fn ping(&self) -> Result<(), LockError> {
        let config = &self.inner.config;
        let result = match &self.inner.pool {
            #[cfg(feature = "postgres")]
            DbPool::Postgres(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop),
            #[cfg(feature = "mysql")]
            DbPool::MySql(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop),
            #[cfg(feature = "sqlite")]
            DbPool::Sqlite(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop),
        };
        result.map_err(|e| map_sqlx(config, Operation::Connect, e))
    }

    async fn create_schema(&self) -> Result<(), sqlx::Error> {
        for statement in &self.inner.statements.create {
            let sql = AssertSqlSafe(Arc::clone(statement));
            match &self.inner.pool {
                #[cfg(feature = "postgres")]
                DbPool::Postgres(pool) => sqlx::query(sql).execute(pool).await.map(drop)?,
                #[cfg(feature = "mysql")]
                DbPool::MySql(pool) => sqlx::query(sql).execute(pool).await.map(drop)?,
                #[cfg(feature = "sqlite")]
                DbPool::Sqlite(pool) => sqlx::query(sql).execute(pool).await.map(drop)?,
            }
        }
        Ok(())
    }

    /// One grant statement: `Some(token)` when the row was inserted or an
    /// expired one taken over, `None` when someone holds it.
    async fn grant(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
    ) -> Result<Option<u64>, sqlx::Error> {
        let sql = AssertSqlSafe(Arc::clone(&self.inner.statements.grant));
        let owner = owner.to_hex();
        let ttl_us = micros(ttl);
        let token: Option<i64> = match &self.inner.pool {
            #[cfg(feature = "postgres")]
            DbPool::Postgres(pool) => sqlx::query(sql)
                .bind(key.as_str())
                .bind(owner)
                .bind(ttl_us)
                .fetch_optional(pool)
                .await?
                .map(|row| row.try_get::<i64, _>(0))
                .transpose()?,
            #[cfg(feature = "mysql")]
            DbPool::MySql(pool) => {
                let done = sqlx::query(sql)
                    .bind(key.as_str().as_bytes())
                    .bind(owner)
                    .bind(ttl_us)
                    .execute(pool)
                    .await?;
                // LAST_INSERT_ID(expr): the new token, or 0 when held.
                match done.last_insert_id() {
                    0 => None,
                    token => Some(i64::try_from(token).unwrap_or(i64::MAX)),
                }
            }
            #[cfg(feature = "sqlite")]
            DbPool::Sqlite(pool) => sqlx::query(sql)
                .bind(key.as_str())
                .bind(owner)
                .bind(unix_micros())
                .bind(ttl_us)
                .fetch_optional(pool)
                .await?
                .map(|row| row.try_get::<i64, _>(0))
                .transpose()?,
        };
        Ok(token.map(|t| u64::try_from(t).unwrap_or(0)))
    }

    async fn try_once(
        &self,
        key: &LockKey,
        ttl: Duration,
        operation: Operation,
    ) -> Result<Option<Lease>, LockError> {
        let owner = OwnerId::random();
        let sent_at = Instant::now();
        let granted = with_timeout(self.timeout(), operation, async {
            // A statement that lost a deadlock or serialization conflict
            // (InnoDB's gap locks on concurrent first inserts of one key)
            // was rolled back and changed nothing: run it again.
            let mut attempts = 0;
            loop {
                match self.grant(key, owner, ttl).await {
                    Err(sqlx::Error::Database(db))
                        if attempts < 5
                            && matches!(db.code().as_deref(), Some("40001" | "40P01")) =>
                    {
                        attempts += 1;
                        tokio::time::sleep(lock_core::random_delay(Duration::from_millis(2))).await;
                    }
                    other => break other.map_err(|e| self.err(operation, key, e)),
                }
            }
        })
        .await
        .map_err(|e| e.with_key(key).with_backend(NAME))?;
        let Some(token) = granted else {
            return Ok(None);
        };
        match Lease::granted(
            key.clone(),
            owner,
            FencingToken::new(token),
            ttl,
            sent_at,
            String::new(),
        ) {
            Ok(lease) => Ok(Some(lease)),
            Err(err) => {
                // Too late to be of use: give it back rather than let it
                // block others until its TTL.
                let stale = Lease::from_parts(
                    key.clone(),
                    owner,
                    FencingToken::new(token),
                    ttl,
                    sent_at,
                    String::new(),
                );
                let _ = self.release(&stale).await;
                Err(err.with_backend(NAME))
            }
        }
    }

    /// Makes sure the PostgreSQL listener runs (no-op elsewhere). Failing to
    /// start it is not an error: waiters then rely on the bounded re-check.
    async fn ensure_listener(&self) {
        #[cfg(feature = "postgres")]
        if let DbPool::Postgres(_) = &self.inner.pool {
            let _ = tokio::time::timeout(
                self.timeout(),
                self.inner.listener.get_or_try_init(|| async {
                    let channel = crate::sql::pg_channel(&self.inner.config.table);
                    // A pool of its own, so the listening connection never
                    // takes a slot the lock statements need.
                    let options: sqlx::postgres::PgConnectOptions =
                        self.inner.config.driver_url().parse()?;
                    let pool = sqlx::pool::PoolOptions::<sqlx::Postgres>::new()
                        .max_connections(1)
                        .acquire_timeout(self.timeout())
                        .connect_lazy_with(options);
                    let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
                    listener.listen(&channel).await?;
                    let sender = self.inner.released.clone();
                    let task = tokio::spawn(run_listener(listener, sender));
                    *self
                        .inner
                        .listener_task
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Some(task);
                    Ok::<(), sqlx::Error>(())
                }),
            )
            .await;
        }
    }

    /// How long to sleep before re-trying, for a notified waiter: until the
    /// holder's expiry (read from the database clock), at most `recheck`.
    async fn recheck_delay(&self, key: &LockKey) -> Duration {
        let cap = self.inner.config.recheck;
        let remaining = match self.inspect(key).await {
            Ok(Some(info)) => info.remaining_ttl.unwrap_or(cap),
            Ok(None) => Duration::ZERO,
            Err(_) => cap,
        };
        // A little jitter so that waiters do not all retry at once.
        remaining.min(cap) + lock_core::random_delay(Duration::from_millis(2))
    }
}

#[cfg(feature = "postgres")]
async fn run_listener(
    mut listener: sqlx::postgres::PgListener,
    sender: broadcast::Sender<Arc<str>>,
) {
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => {
                let _ = sender.send(Arc::from(notification.payload()));
            }
            Ok(None) => {
                // Reconnected: releases may have been missed meanwhile.
                let _ = sender.send(Arc::from(WAKE_ALL));
            }
            Err(_) => {
                let _ = sender.send(Arc::from(WAKE_ALL));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn open_pool(config: &SqlConfig) -> Result<DbPool, LockError> {
    use sqlx::pool::PoolOptions;
    let bad_option = |e: sqlx::Error| {
        LockError::config(config.scrub(&format!(
            "the {} driver rejected {}: {e}",
            config.dialect,
            config.redacted_url()
        )))
        .with_backend(NAME)
    };
    #[allow(unused_variables)] // used only when a dialect's feature is off
    let disabled = || -> Result<DbPool, LockError> {
        Err(LockError::config(format!(
            "lock-sql was built without its `{}` feature",
            config.dialect
        ))
        .with_backend(NAME))
    };
    let size = config.pool_size;
    let timeout = config.op_timeout;
    // `test_before_acquire(false)`: no extra ping per operation. A dead
    // connection then fails one call (Unavailable, temporary) and is
    // dropped from the pool.
    match config.dialect {
        SqlDialect::Postgres => {
            #[cfg(feature = "postgres")]
            {
                let options: sqlx::postgres::PgConnectOptions =
                    config.driver_url().parse().map_err(bad_option)?;
                let pool = PoolOptions::<sqlx::Postgres>::new()
                    .max_connections(size.unwrap_or(10))
                    .acquire_timeout(timeout)
                    .test_before_acquire(false)
                    .connect_lazy_with(options);
                Ok(DbPool::Postgres(pool))
            }
            #[cfg(not(feature = "postgres"))]
            disabled()
        }
        SqlDialect::MySql => {
            #[cfg(feature = "mysql")]
            {
                let options: sqlx::mysql::MySqlConnectOptions =
                    config.driver_url().parse().map_err(bad_option)?;
                let pool = PoolOptions::<sqlx::MySql>::new()
                    .max_connections(size.unwrap_or(10))
                    .acquire_timeout(timeout)
                    .test_before_acquire(false)
                    .connect_lazy_with(options);
                Ok(DbPool::MySql(pool))
            }
            #[cfg(not(feature = "mysql"))]
            disabled()
        }
        SqlDialect::Sqlite => {
            #[cfg(feature = "sqlite")]
            {
                use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
                let memory = config.is_memory();
                let mut options: SqliteConnectOptions =
                    config.driver_url().parse().map_err(bad_option)?;
                options = options.busy_timeout(config.busy_timeout);
                if !memory {
                    // WAL: readers never block the writer, and several
                    // processes share the file; NORMAL sync is durable
                    // across process crashes (not power loss).
                    options = options
                        .journal_mode(SqliteJournalMode::Wal)
                        .synchronous(SqliteSynchronous::Normal);
                }
                // An in-memory database is private to its connections:
                // one connection keeps every caller on the same one.
                let default_size = if memory { 1 } else { 4 };
                let pool = PoolOptions::<sqlx::Sqlite>::new()
                    .max_connections(size.unwrap_or(default_size))
                    .acquire_timeout(timeout.max(config.busy_timeout))
                    .test_before_acquire(false)
                    .connect_lazy_with(options);
                Ok(DbPool::Sqlite(pool))
            }
            #[cfg(not(feature = "sqlite"))]
            disabled()
        }
    }
}

/// Microseconds in `d`, saturating.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// The host's wall clock in microseconds since the Unix epoch (SQLite's
/// "database clock").
pub(crate) fn unix_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, micros)
}

fn token_param(lease: &Lease) -> i64 {
    i64::try_from(lease.token().get()).unwrap_or(i64::MAX)
}

#[async_trait]
impl LockBackend for SqlBackend {
    fn name(&self) -> &'static str {
        match self.inner.config.dialect {
            SqlDialect::Postgres => "postgres",
            SqlDialect::MySql => "mysql",
            SqlDialect::Sqlite => "sqlite",
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: FencingScope::PerKey,
            // Rows are never deleted and the token is bumped in the same
            // committed statement as the grant: a restart of the database
            // keeps it (see the crate docs for asynchronous replicas).
            fencing_survives_failover: true,
            waiting: if self.inner.config.dialect == SqlDialect::Postgres {
                WaitStrategy::Notify
            } else {
                WaitStrategy::Poll
            },
            fifo: false,
            ttl_model: TtlModel::PerLease,
            // One primary orders every grant of a row.
            linearizable: true,
            min_ttl: MIN_TTL,
            shared_locks: false,
            semaphores: false,
        }
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        check_ttl(ttl, MIN_TTL, Operation::TryAcquire)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        self.try_once(key, ttl, Operation::TryAcquire).await
    }

    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        check_ttl(ttl, MIN_TTL, Operation::Acquire)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        let notified = self.inner.config.dialect == SqlDialect::Postgres;
        let mut backoff = self.inner.config.poll.backoff();
        let mut started_listener = false;
        loop {
            // Subscribe before trying, so a release between the failed try
            // and the wait is not missed.
            let mut releases = self.inner.released.subscribe();
            if let Some(lease) = self.try_once(key, ttl, Operation::Acquire).await? {
                return Ok(lease);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(LockError::new(
                    ErrorKind::Contended,
                    Operation::Acquire,
                    "still held by another owner at the wait deadline",
                )
                .with_key(key)
                .with_backend(NAME));
            }
            let delay = if notified {
                if !started_listener {
                    self.ensure_listener().await;
                    started_listener = true;
                    // Releases before the listener ran were not heard.
                    continue;
                }
                self.recheck_delay(key).await
            } else {
                backoff.next_delay().unwrap_or(self.inner.config.poll.max)
            };
            let wake_at = (Instant::now() + delay).min(deadline);
            let sleep = tokio::time::sleep_until(wake_at);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    () = &mut sleep => break,
                    message = releases.recv() => match message {
                        Ok(released) if &*released == key.as_str() || released.is_empty() => break,
                        Ok(_) => {}
                        // Lagged or closed: re-check rather than miss one.
                        Err(_) => break,
                    },
                }
            }
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        let key = lease.key();
        let ttl = lease.ttl();
        check_ttl(ttl, MIN_TTL, Operation::Renew)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        let sql = AssertSqlSafe(Arc::clone(&self.inner.statements.renew));
        let owner = lease.owner().to_hex();
        let token = token_param(lease);
        let ttl_us = micros(ttl);
        let sent_at = Instant::now();
        let renewed = with_timeout(self.timeout(), Operation::Renew, async {
            let affected = match &self.inner.pool {
                #[cfg(feature = "postgres")]
                DbPool::Postgres(pool) => sqlx::query(sql)
                    .bind(key.as_str())
                    .bind(owner)
                    .bind(token)
                    .bind(ttl_us)
                    .execute(pool)
                    .await
                    .map(|r| r.rows_affected()),
                #[cfg(feature = "mysql")]
                DbPool::MySql(pool) => sqlx::query(sql)
                    .bind(ttl_us)
                    .bind(key.as_str().as_bytes())
                    .bind(owner)
                    .bind(token)
                    .execute(pool)
                    .await
                    // CLIENT_FOUND_ROWS: matched rows, and the WHERE clause
                    // is the ownership check.
                    .map(|r| r.rows_affected()),
                #[cfg(feature = "sqlite")]
                DbPool::Sqlite(pool) => sqlx::query(sql)
                    .bind(key.as_str())
                    .bind(owner)
                    .bind(token)
                    .bind(unix_micros())
                    .bind(ttl_us)
                    .execute(pool)
                    .await
                    .map(|r| r.rows_affected()),
            };
            affected.map_err(|e| self.err(Operation::Renew, key, e))
        })
        .await
        .map_err(|e| e.with_key(key).with_backend(NAME))?;
        if renewed == 1 {
            Ok(validity_deadline(sent_at, ttl))
        } else {
            Err(LockError::new(
                ErrorKind::NotHeld,
                Operation::Renew,
                "the lease expired, was released, or belongs to someone else",
            )
            .with_key(key)
            .with_backend(NAME))
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let key = lease.key();
        let sql = AssertSqlSafe(Arc::clone(&self.inner.statements.release));
        let owner = lease.owner().to_hex();
        let token = token_param(lease);
        let released = with_timeout(self.timeout(), Operation::Release, async {
            let released = match &self.inner.pool {
                #[cfg(feature = "postgres")]
                DbPool::Postgres(pool) => sqlx::query(sql)
                    .bind(key.as_str())
                    .bind(owner)
                    .bind(token)
                    .bind(crate::sql::pg_channel(&self.inner.config.table))
                    .fetch_optional(pool)
                    .await
                    .map(|row| row.is_some()),
                #[cfg(feature = "mysql")]
                DbPool::MySql(pool) => sqlx::query(sql)
                    .bind(key.as_str().as_bytes())
                    .bind(owner)
                    .bind(token)
                    .execute(pool)
                    .await
                    .map(|r| r.rows_affected() == 1),
                #[cfg(feature = "sqlite")]
                DbPool::Sqlite(pool) => sqlx::query(sql)
                    .bind(key.as_str())
                    .bind(owner)
                    .bind(token)
                    .bind(unix_micros())
                    .execute(pool)
                    .await
                    .map(|r| r.rows_affected() == 1),
            };
            released.map_err(|e| self.err(Operation::Release, key, e))
        })
        .await
        .map_err(|e| e.with_key(key).with_backend(NAME))?;
        if released && self.inner.config.dialect != SqlDialect::Postgres {
            // Wake this process's waiters at once; other processes poll.
            // (PostgreSQL's NOTIFY reaches every waiter, ours included.)
            let _ = self.inner.released.send(Arc::from(key.as_str()));
        }
        Ok(released)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let sql = AssertSqlSafe(Arc::clone(&self.inner.statements.inspect));
        let row = with_timeout(self.timeout(), Operation::Inspect, async {
            let row: Result<Option<(Option<String>, i64, i64)>, sqlx::Error> = async {
                match &self.inner.pool {
                    #[cfg(feature = "postgres")]
                    DbPool::Postgres(pool) => match sqlx::query(sql)
                        .bind(key.as_str())
                        .fetch_optional(pool)
                        .await
                    {
                        Ok(Some(row)) => {
                            Ok(Some((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
                        }
                        Ok(None) => Ok(None),
                        Err(e) => Err(e),
                    },
                    #[cfg(feature = "mysql")]
                    DbPool::MySql(pool) => match sqlx::query(sql)
                        .bind(key.as_str().as_bytes())
                        .fetch_optional(pool)
                        .await
                    {
                        Ok(Some(row)) => {
                            Ok(Some((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
                        }
                        Ok(None) => Ok(None),
                        Err(e) => Err(e),
                    },
                    #[cfg(feature = "sqlite")]
                    DbPool::Sqlite(pool) => match sqlx::query(sql)
                        .bind(key.as_str())
                        .bind(unix_micros())
                        .fetch_optional(pool)
                        .await
                    {
                        Ok(Some(row)) => {
                            Ok(Some((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
                        }
                        Ok(None) => Ok(None),
                        Err(e) => Err(e),
                    },
                }
            }
            .await;
            row.map_err(|e| self.err(Operation::Inspect, key, e))
        })
        .await
        .map_err(|e| e.with_key(key).with_backend(NAME))?;
        Ok(row.map(|(owner, token, remaining_us)| LockInfo {
            key: key.clone(),
            holder: owner.unwrap_or_default(),
            token: u64::try_from(token).ok().map(FencingToken::new),
            remaining_ttl: Some(Duration::from_micros(
                u64::try_from(remaining_us).unwrap_or(0),
            )),
        }))
    }
}
