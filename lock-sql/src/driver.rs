//! The [`LockBackend`] implementation and its capabilities.

use std::fmt;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::election::ElectionPage;
use lock_core::{
    Admin, Capabilities, Downgrade, ErrorKind, Facets, FencingScope, FencingToken, GcReport,
    GrantRequest, HolderInfo, HolderWatch, Lease, LeaseKind, ListQuery, Listing, LockBackend,
    LockError, LockInfo, LockKey, LockPage, LockSets, LockShape, Operation, OwnerId, SharedPage,
    TtlModel, WaitStrategy, check_ttl, validity_deadline, with_timeout,
};
use tokio::time::Instant;

use crate::config::{SqlConfig, SqlDialect};
use crate::conn::retry_once;
use crate::conn::{ConnSet, DbOptions, DbPool, SchemaRace, pool_size};
use crate::dialect::{self, Dialect, token_of};
use crate::error::{map_sqlx, timed};
use crate::granted::Grant;
use crate::shared::sql::SharedSql;
use crate::sql::Statements;
#[cfg(feature = "postgres")]
use crate::wake::run_listener;
use crate::wake::{Waits, Wake, taken_within};

pub(crate) const NAME: &str = "sql";

/// The shortest TTL accepted: the database clocks have microsecond
/// precision, but a lease must outlive the clock-drift allowance and a
/// round trip to be of any use.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// A lock service on a SQL table: PostgreSQL, MySQL/MariaDB or SQLite.
///
/// Cheap to clone: clones share one set of connections. See the crate docs
/// for the table, the statements and the caveats.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lock_core::{LockBackend, LockBackendExt, LockKey};
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

pub(crate) struct Inner {
    pub(crate) config: SqlConfig,
    /// What differs between the databases.
    pub(crate) dialect: &'static dyn Dialect,
    /// The lock statements' connections.
    pub(crate) conns: ConnSet,
    /// The users' pool (same database, same options).
    pool: DbPool,
    pub(crate) statements: Statements,
    /// The fair grant (`fair=true`; see crate::fair).
    pub(crate) fair_grant: Arc<str>,
    /// The read-write locks' and semaphores' statements.
    pub(crate) shared: SharedSql,
    /// PostgreSQL's release notification channel.
    pub(crate) channel: String,
    /// Wake-ups and waiter counts, shared with the process's other clients
    /// of the same database and table.
    pub(crate) waits: Arc<Waits>,
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

    /// Opens a first connection, checks the database answers and creates
    /// the lease table when it is missing (unless disabled).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for options the driver rejects, a dialect
    /// whose cargo feature is off, or `mode=session` (that is
    /// [`SqlSessionBackend`](crate::SqlSessionBackend));
    /// [`ErrorKind::Unavailable`] / [`ErrorKind::Timeout`] when the database
    /// cannot be reached within the operation timeout;
    /// [`ErrorKind::Backend`] when creating the table fails.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes whatever was opened. A table created
    /// meanwhile stays (creation is idempotent).
    pub async fn connect(config: SqlConfig) -> Result<Self, LockError> {
        if config.lock_mode() == crate::SqlMode::Session {
            // Silently taking row locks for a URL that asks for session
            // locks would let two fleets believe they exclude each other.
            return Err(LockError::config(
                "mode=session is the session-lock backend: open it with lock_sql::connect \
                 or SqlSessionBackend, not SqlBackend",
            )
            .with_backend(NAME));
        }
        crate::shedlock::refuse_shedlock(&config, "SqlBackend")?;
        let dialect = dialect::of(config.dialect)?;
        let (options, pool) = dialect.open(&config)?;
        let mut statements = Statements::new(dialect, &config.table);
        let shared = SharedSql::new(dialect, &config.table);
        // The shared tables are created (and listed) with the lease table.
        statements.create.extend(shared.create.iter().cloned());
        // An in-memory SQLite database is private to this backend.
        let scope =
            (!config.is_memory()).then(|| format!("{}\n{}", config.driver_url(), config.table));
        let fair_grant = Arc::from(dialect.fair_grant_sql(
            &statements.quoted_table,
            &statements.quoted_floor,
            &shared.waiters_table,
        ));
        let backend = Self {
            inner: Arc::new(Inner {
                conns: ConnSet::new(options, pool_size(&config), dialect.single_writer()),
                dialect,
                pool,
                statements,
                fair_grant,
                shared,
                channel: crate::sql::pg_channel(&config.table),
                waits: Waits::shared(scope),
                config,
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

    /// A PostgreSQL pool on the same database, to run your own (e.g.
    /// fenced) statements on. The lock statements never use it: it opens
    /// its connections when you first use it, and as a sqlx pool it pings
    /// each connection as it returns (a second round trip per statement).
    #[cfg(feature = "postgres")]
    pub fn pg_pool(&self) -> Option<&sqlx::PgPool> {
        #[allow(unreachable_patterns)] // with only this feature on
        match &self.inner.pool {
            DbPool::Postgres(pool) => Some(pool),
            _ => None,
        }
    }

    /// A MySQL/MariaDB pool on the same database, to run your own (e.g.
    /// fenced) statements on; see [`pg_pool`](Self::pg_pool).
    #[cfg(feature = "mysql")]
    pub fn mysql_pool(&self) -> Option<&sqlx::MySqlPool> {
        #[allow(unreachable_patterns)] // with only this feature on
        match &self.inner.pool {
            DbPool::MySql(pool) => Some(pool),
            _ => None,
        }
    }

    /// A SQLite pool on the same database (an in-memory one included), to
    /// run your own (e.g. fenced) statements on; see
    /// [`pg_pool`](Self::pg_pool).
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

    /// Closes the connections and the pool: later calls fail with
    /// [`ErrorKind::Unavailable`].
    ///
    /// # Errors
    ///
    /// None today; kept fallible for future drivers.
    ///
    /// # Cancel safety
    ///
    /// Safe: new calls are refused once called; idle connections not yet
    /// closed are dropped with the backend.
    pub async fn close(&self) -> Result<(), LockError> {
        self.inner.conns.close().await;
        self.inner.pool.close().await;
        Ok(())
    }

    /// The backend's state (for the shared kinds, crate::shared).
    pub(crate) fn inspect_sql(&self) -> &Arc<str> {
        &self.inner.statements.inspect
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    /// What differs between the databases, for this backend's.
    pub(crate) fn inner_dialect(&self) -> &'static dyn Dialect {
        self.inner.dialect
    }

    /// How the backend opens connections (for [`crate::floor`]).
    pub(crate) fn connect_options(&self) -> &DbOptions {
        self.inner.conns.options()
    }

    pub(crate) fn err(&self, operation: Operation, key: &LockKey, err: sqlx::Error) -> LockError {
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
                let ping: Arc<str> = Arc::from("SELECT 1");
                let dialect = self.inner.dialect;
                return retry_once!(read, &self.inner.conns, |conn| dialect.plain(conn, &ping))
                    .map_err(|e| map_sqlx(config, Operation::Connect, e));
            }
            // Another client creating the same tables at the same moment:
            // the loser tries again (see `SchemaRace`).
            let mut race = SchemaRace::within(config.op_timeout);
            loop {
                match self.create_schema().await {
                    Err(err) if race.again(&err).await => {}
                    other => break other.map_err(|e| map_sqlx(config, Operation::Connect, e)),
                }
            }
        })
        .await
        .map_err(|e| e.with_backend(NAME))
    }

    async fn create_schema(&self) -> Result<(), sqlx::Error> {
        let dialect = self.inner.dialect;
        for statement in &self.inner.statements.create {
            retry_once!(&self.inner.conns, |conn| dialect.plain(conn, statement))?;
        }
        self.ensure_details_column().await
    }

    /// One grant of `key` to `owner`: `Some(token)` when granted, `None`
    /// when someone else holds it.
    ///
    /// When the connection breaks under the statement, its reply may have
    /// been lost after the grant committed. The grant then runs once more,
    /// with the same owner, on a fresh connection: it cannot grant twice (a
    /// row we hold is unexpired, so the statement leaves it alone), and
    /// when it finds the row held, one inspect on the same connection tells
    /// whether the holder is `owner`, in which case the first grant did
    /// commit and its token is ours. Without this the lost grant would hold
    /// the key for its whole TTL while its requester waited behind it.
    async fn grant_once(
        &self,
        key: &LockKey,
        owner: &str,
        ttl: Duration,
        ahead: Option<i64>,
    ) -> Result<Option<i64>, sqlx::Error> {
        let statements = &self.inner.statements;
        let grant = match ahead {
            Some(_) => &self.inner.fair_grant,
            None => &statements.grant,
        };
        let (conns, dialect) = (&self.inner.conns, self.inner.dialect);
        let mut checkout = conns.checkout(false).await?;
        // Boxed, as in `retry_once!`: statement futures are kilobytes.
        let result = Box::pin(dialect.grant(checkout.conn(), grant, key, owner, ttl, ahead)).await;
        if !checkout.finish(&result) {
            return result;
        }
        tracing::debug!(
            key = key.as_str(),
            "database connection broke under a grant; retrying on a fresh one"
        );
        let mut checkout = conns.checkout(true).await?;
        let result = Box::pin(async {
            let conn = checkout.conn();
            if let Some(token) = dialect.grant(conn, grant, key, owner, ttl, ahead).await? {
                return Ok(Some(token));
            }
            let holder = dialect.inspect(conn, &statements.inspect, key).await?;
            Ok(holder.and_then(|(holder, token, _, _)| {
                (holder.as_deref() == Some(owner)).then_some(token)
            }))
        })
        .await;
        checkout.finish(&result);
        result
    }

    /// One grant statement with its retries: `Some(token)` when the row was
    /// inserted or an expired one taken over, `None` when someone holds it.
    async fn grant_row(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
        ahead: Option<i64>,
    ) -> Result<Option<u64>, sqlx::Error> {
        let owner = owner.to_hex();
        // A statement that lost a deadlock or serialization conflict
        // (InnoDB's gap locks on concurrent first inserts of one key) was
        // rolled back and changed nothing: run it again.
        let mut attempts = 0;
        let token = loop {
            match self.grant_once(key, &owner, ttl, ahead).await {
                Err(sqlx::Error::Database(db))
                    if attempts < 5 && matches!(db.code().as_deref(), Some("40001" | "40P01")) =>
                {
                    attempts += 1;
                    tokio::time::sleep(lock_core::random_delay(Duration::from_millis(2))).await;
                }
                other => break other?,
            }
        };
        Ok(token.map(|t| u64::try_from(t).unwrap_or(0)))
    }

    pub(crate) async fn try_once(
        &self,
        key: &LockKey,
        ttl: Duration,
        operation: Operation,
        ahead: Option<i64>,
    ) -> Result<Option<Lease>, LockError> {
        let owner = OwnerId::random();
        let sent_at = Instant::now();
        let grant = self.grant_row(key, owner, ttl, ahead);
        let granted = timed(&self.inner.config, operation, Some(key), grant).await?;
        let Some(token) = granted else {
            return Ok(None);
        };
        let grant = Grant {
            key,
            owner,
            token: FencingToken::new(token),
            kind: LeaseKind::Exclusive,
            ttl,
            sent_at,
        };
        grant
            .lease_or_give_back(|stale| async move {
                let _ = self.release(&stale).await;
            })
            .await
            .map(Some)
    }

    /// Makes sure the PostgreSQL listener of this database and table runs
    /// in the process (no-op elsewhere). Failing to start it is not an
    /// error: waiters then rely on the bounded re-check.
    pub(crate) async fn ensure_listener(&self) {
        #[cfg(feature = "postgres")]
        if let DbOptions::Postgres(options) = self.connect_options() {
            let waits = &self.inner.waits;
            let _ = tokio::time::timeout(
                self.timeout(),
                waits.listener.get_or_try_init(|| async {
                    // A pool of its own, so the listening connection never
                    // takes a connection the lock statements need.
                    let pool = sqlx::pool::PoolOptions::<sqlx::Postgres>::new()
                        .max_connections(1)
                        .acquire_timeout(self.timeout())
                        .connect_lazy_with(options.clone());
                    let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
                    listener.listen(&self.inner.channel).await?;
                    let task = tokio::spawn(run_listener(listener, waits.sender()));
                    *waits
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
        let remaining = match self.inspect_mutex(key).await {
            Ok(Some(info)) => info.remaining_ttl.unwrap_or(cap),
            Ok(None) => Duration::ZERO,
            Err(_) => cap,
        };
        // A little jitter so that waiters do not all retry at once.
        remaining.min(cap) + lock_core::random_delay(Duration::from_millis(2))
    }
}

#[async_trait]
impl LockBackend for SqlBackend {
    fn name(&self) -> &'static str {
        self.inner.dialect.name()
    }

    // Every field is set today; `..minimal()` keeps a field added later
    // at its conservative default.
    #[allow(clippy::needless_update)]
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: FencingScope::PerKey,
            // The token is bumped in the same committed statement as the
            // grant, and a row `gc` deletes leaves its token in the floor
            // that a new row starts above: a restart of the database keeps
            // them (see the crate docs for asynchronous replicas).
            fencing_survives_failover: true,
            grants_survive_restart: true,
            waiting: if self.inner.dialect.notified() {
                WaitStrategy::Notify
            } else {
                WaitStrategy::Poll
            },
            // Fair mode queues mutex waiters by a database-assigned id.
            fifo: self.inner.config.fair,
            ttl_model: TtlModel::PerLease,
            // One primary orders every grant of a row.
            linearizable: true,
            min_ttl: MIN_TTL,
            // Table mode (crate::shared); session mode has neither.
            shared_locks: true,
            semaphores: true,
            // The `details` column, written by the grant (crate::admin).
            holder_details: true,
            ..Capabilities::minimal()
        }
    }

    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let GrantRequest {
            key,
            kind,
            ttl,
            deadline,
        } = request;
        match (kind, deadline) {
            (LeaseKind::Exclusive, None) => self.try_take(key, ttl).await,
            (LeaseKind::Exclusive, Some(deadline)) => {
                self.take_waiting(key, ttl, deadline).await.map(Some)
            }
            (kind, None) => self.try_share(key, kind, ttl).await,
            (kind, Some(deadline)) => self.acquire_share(key, kind, ttl, deadline).await.map(Some),
        }
    }

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        if leases.iter().any(|l| l.kind() != LeaseKind::Exclusive) {
            // Mutex leases in batches, the others one by one.
            let (mutexes, others): (Vec<usize>, Vec<usize>) =
                (0..leases.len()).partition(|&i| leases[i].kind() == LeaseKind::Exclusive);
            let batch: Vec<&Lease> = mutexes.iter().map(|&i| leases[i]).collect();
            let mut results: Vec<Option<Result<Instant, LockError>>> =
                std::iter::repeat_with(|| None).take(leases.len()).collect();
            for (i, result) in mutexes.into_iter().zip(self.renew_many(&batch).await) {
                results[i] = Some(result);
            }
            for i in others {
                results[i] = Some(self.renew_share(leases[i]).await);
            }
            return results.into_iter().flatten().collect();
        }
        // One UPDATE per batch of keys (see renew_many.rs).
        let inner = &self.inner;
        let table = &inner.statements.quoted_table;
        let batch = crate::renew_many::RowRenewal {
            backend: self,
            dialect: inner.dialect,
            conns: &inner.conns,
            config: &inner.config,
            table,
        };
        batch.renew(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        if lease.kind() != LeaseKind::Exclusive {
            return self.release_share(lease).await;
        }
        let key = lease.key();
        let statement = &self.inner.statements.release;
        let owner = lease.owner().to_hex();
        let token = token_of(lease);
        let channel = &self.inner.channel;
        let dialect = self.inner.dialect;
        let released = timed(&self.inner.config, Operation::Release, Some(key), async {
            retry_once!(&self.inner.conns, |conn| dialect
                .release(conn, statement, key, &owner, token, channel))
        })
        .await?;
        if released && !dialect.notified() {
            // Wake this process's waiters at once; other processes poll.
            // (PostgreSQL's NOTIFY reaches every waiter, ours included.)
            self.inner.waits.released(key.as_str());
        }
        Ok(released)
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        match shape {
            LockShape::ReadWrite | LockShape::Semaphore => self.share_holders(key, shape).await,
            _ => Ok(lock_core::kind::mutex_holders(
                self.inspect_mutex(key).await?,
            )),
        }
    }

    /// Elections are the default renewed mutex (no facet of their own):
    /// their observers wake as [`HolderWatch`] does for that mutex.
    fn facets(&self) -> Facets<'_> {
        Facets {
            listing: Some(self),
            admin: Some(self),
            lock_sets: Some(self),
            downgrade: Some(self),
            holder_watch: Some(self),
            ..Facets::default()
        }
    }
}

#[async_trait]
impl Admin for SqlBackend {
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.force_release_row(key).await
    }

    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError> {
        self.gc_rows(older_than).await
    }
}

#[async_trait]
impl Listing for SqlBackend {
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        self.list_rows(query).await
    }

    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        self.list_shares(shape, query).await
    }

    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        lock_core::election::list_mutex_elections(self, query).await
    }
}

#[async_trait]
impl LockSets for SqlBackend {
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        self.try_all(keys, ttl).await
    }
}

#[async_trait]
impl Downgrade for SqlBackend {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.downgrade_share(lease).await
    }
}

#[async_trait]
impl HolderWatch for SqlBackend {
    async fn watch_holder(
        &self,
        key: &LockKey,
        seen: Option<&LockInfo>,
        poll: Duration,
        deadline: Instant,
    ) -> Result<Option<LockInfo>, LockError> {
        self.watch_row(key, seen, poll, deadline).await
    }
}

/// The mutex's calls, which [`LockBackend::grant`] and
/// [`LockBackend::renew_many`] reach.
impl SqlBackend {
    pub(crate) async fn try_take(
        &self,
        key: &LockKey,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(ttl, MIN_TTL, Operation::TryAcquire)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        // Fair: not while anyone waits (every live waiter is ahead).
        let ahead = self.inner.config.fair.then_some(i64::MAX);
        self.try_once(key, ttl, Operation::TryAcquire, ahead).await
    }

    pub(crate) async fn take_waiting(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        check_ttl(ttl, MIN_TTL, Operation::Acquire)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        if self.inner.config.fair {
            // Boxed: fair mode's future is large (see `ensure_listener` below).
            return Box::pin(self.acquire_fair(key, ttl, deadline)).await;
        }
        let notified = self.inner.dialect.notified();
        let waits = &self.inner.waits;
        let poll = self.inner.config.poll;
        let mut backoff = poll.backoff();
        let mut started_listener = false;
        // Waiters first (see `crate::wake`): while clients of this process
        // wait for the key, a newcomer (typically the holder that just
        // released it) lets them go first instead of racing them to the row.
        let mut behind_waiters = waits.has_waiters(key.as_str());
        let mut waiting = None;
        loop {
            // Subscribe before trying, so a release between the failed try
            // and the wait is not missed.
            let mut wakes = waits.subscribe();
            let let_waiters_go = behind_waiters;
            behind_waiters = false;
            // Until one of them takes the key (then no try: wait for its
            // release like them), or one initial poll interval.
            let taken = let_waiters_go
                && taken_within(
                    &mut wakes,
                    key,
                    (Instant::now() + poll.initial).min(deadline),
                )
                .await;
            if !let_waiters_go || !taken {
                if let Some(lease) = self.try_once(key, ttl, Operation::Acquire, None).await? {
                    if waiting.is_some() {
                        waits.taken(key.as_str());
                    }
                    return Ok(lease);
                }
                if Instant::now() >= deadline {
                    return Err(LockError::new(
                        ErrorKind::Contended,
                        Operation::Acquire,
                        "still held by another owner at the wait deadline",
                    )
                    .with_key(key)
                    .with_backend(NAME));
                }
            }
            // Counted as waiting from the first failed try on.
            waiting.get_or_insert_with(|| waits.wait_for(key.as_str()));
            let delay = if notified {
                if !started_listener {
                    // Boxed: starting the listener is a rare path with a
                    // large future, which would make every acquire's large.
                    Box::pin(self.ensure_listener()).await;
                    started_listener = true;
                    // Releases before the listener ran were not heard.
                    if !taken {
                        continue;
                    }
                }
                Box::pin(self.recheck_delay(key)).await
            } else {
                backoff.next_delay().unwrap_or(poll.max)
            };
            let wake_at = (Instant::now() + delay).min(deadline);
            let sleep = tokio::time::sleep_until(wake_at);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    () = &mut sleep => break,
                    wake = wakes.recv() => match wake {
                        Ok(Wake::Released(released)) if &*released == key.as_str() => {
                            // Activity on the key: poll from short again.
                            backoff = poll.backoff();
                            break;
                        }
                        Ok(Wake::All) => break,
                        Ok(Wake::Released(_) | Wake::Taken(_)) => {}
                        // Lagged or closed: re-check rather than miss one.
                        Err(_) => break,
                    },
                }
            }
        }
    }

    pub(crate) async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        if lease.kind() != LeaseKind::Exclusive {
            return self.renew_share(lease).await;
        }
        let key = lease.key();
        let ttl = lease.ttl();
        check_ttl(ttl, MIN_TTL, Operation::Renew)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        let statement = &self.inner.statements.renew;
        let owner = lease.owner().to_hex();
        let token = token_of(lease);
        let dialect = self.inner.dialect;
        let sent_at = Instant::now();
        let renewed = timed(&self.inner.config, Operation::Renew, Some(key), async {
            retry_once!(&self.inner.conns, |conn| dialect
                .renew(conn, statement, key, &owner, token, ttl))
        })
        .await?;
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
}
