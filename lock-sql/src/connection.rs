//! The driver's own connections: bare sqlx connections kept on a small idle
//! list, instead of sqlx's pool.
//!
//! sqlx's pool pings every connection as it goes back to the pool
//! (`PoolConnection`'s return path, whatever `test_before_acquire` says), so
//! each lock statement through it cost two round trips. Here a connection
//! goes back as it is, and a broken one is found by the error of the
//! statement that used it ([`is_broken`]): it is dropped, together with
//! every idle connection opened before it broke (after a database restart
//! they are all dead), and the caller may run the statement once more on a
//! freshly opened connection where running it twice is safe (see the
//! driver's `retry_once!` and its grant recovery).
//!
//! A checkout dropped before [`Checkout::finish`] (its statement was
//! cancelled or timed out mid-flight) drops its connection: the protocol
//! state of a half-read reply is unknown, which is why sqlx pings there.

#[cfg(feature = "postgres")]
pub(crate) mod pooler;
pub(crate) mod session;
pub(crate) mod shedlock;
pub(crate) mod table;
pub(crate) mod wake;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use tokio::sync::{Mutex as AsyncMutex, MutexGuard as AsyncMutexGuard, Semaphore, SemaphorePermit};

/// One bare connection of the configured dialect.
#[derive(Debug)]
pub enum DbConn {
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgConnection),
    /// PostgreSQL through a pooler in transaction pooling
    /// (`pooler=transaction`): its statements run the pooler-safe way.
    #[cfg(feature = "postgres")]
    PostgresPooled(pooler::PooledPg),
    /// MySQL / MariaDB.
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlConnection),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqliteConnection),
}

/// How to open a [`DbConn`] (also what the users' sqlx pool is built from).
#[derive(Clone, Debug)]
pub enum DbOptions {
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::postgres::PgConnectOptions),
    /// PostgreSQL through a pooler in transaction pooling
    /// (`pooler=transaction`).
    #[cfg(feature = "postgres")]
    PostgresPooled(sqlx::postgres::PgConnectOptions),
    /// MySQL / MariaDB.
    #[cfg(feature = "mysql")]
    MySql(sqlx::mysql::MySqlConnectOptions),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::sqlite::SqliteConnectOptions),
}

impl DbOptions {
    /// Opens one connection.
    ///
    /// # Errors
    ///
    /// sqlx's, when the database cannot be reached or refuses the login.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future drops the half-open connection.
    pub async fn connect(&self) -> Result<DbConn, sqlx::Error> {
        use sqlx::Connection;
        // Each connect future boxed: they are kilobytes, and inline they
        // would make every future that may open a connection (a checkout,
        // so every statement's) that large, copied at every call.
        Ok(match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(o) => {
                DbConn::Postgres(Box::pin(sqlx::PgConnection::connect_with(o)).await?)
            }
            #[cfg(feature = "postgres")]
            Self::PostgresPooled(o) => DbConn::PostgresPooled(pooler::PooledPg::new(
                Box::pin(sqlx::PgConnection::connect_with(o)).await?,
            )),
            #[cfg(feature = "mysql")]
            Self::MySql(o) => {
                DbConn::MySql(Box::pin(sqlx::MySqlConnection::connect_with(o)).await?)
            }
            #[cfg(feature = "sqlite")]
            Self::Sqlite(o) => {
                DbConn::Sqlite(Box::pin(sqlx::SqliteConnection::connect_with(o)).await?)
            }
        })
    }

    /// The users' pool on these options, of `size` connections, opened
    /// lazily; a checkout waits at most `acquire` and is not pinged.
    pub(crate) fn lazy_pool(&self, size: u32, acquire: std::time::Duration) -> DbPool {
        fn options<DB: sqlx::Database>(
            size: u32,
            acquire: std::time::Duration,
        ) -> sqlx::pool::PoolOptions<DB> {
            sqlx::pool::PoolOptions::<DB>::new()
                .max_connections(size)
                .acquire_timeout(acquire)
                .test_before_acquire(false)
        }
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(o) | Self::PostgresPooled(o) => {
                DbPool::Postgres(options(size, acquire).connect_lazy_with(o.clone()))
            }
            #[cfg(feature = "mysql")]
            Self::MySql(o) => DbPool::MySql(options(size, acquire).connect_lazy_with(o.clone())),
            #[cfg(feature = "sqlite")]
            Self::Sqlite(o) => DbPool::Sqlite(options(size, acquire).connect_lazy_with(o.clone())),
        }
    }
}

/// Refuses session mode behind a pooler in transaction or statement
/// pooling (PostgreSQL; see `pooler::refuse_transaction_pooling`).
///
/// # Errors
///
/// As `pooler::refuse_transaction_pooling`.
pub(crate) async fn refuse_transaction_pooling(
    config: &crate::config::SqlConfig,
    budget: std::time::Duration,
) -> Result<(), lock_core::LockError> {
    #[cfg(feature = "postgres")]
    return pooler::refuse_transaction_pooling(config, budget).await;
    #[cfg(not(feature = "postgres"))]
    {
        let _ = (config, budget);
        Ok(())
    }
}

/// The same body for every connection type (each arm is typed by its own
/// connection): for statements that bind the same values on every
/// database.
macro_rules! on_conn {
    ($conn:expr, |$c:ident| $body:expr) => {
        match $conn {
            #[cfg(feature = "postgres")]
            $crate::connection::DbConn::Postgres($c) => $body,
            // Named statements, as on a direct connection: the callers a
            // pooled connection reaches take it aside first (the binds'
            // runners, `pooler::pg_fetch_all`); the ShedLock layout
            // refuses `pooler=transaction`.
            #[cfg(feature = "postgres")]
            $crate::connection::DbConn::PostgresPooled(pooled) => {
                let $c = &mut pooled.conn;
                $body
            }
            #[cfg(feature = "mysql")]
            $crate::connection::DbConn::MySql($c) => $body,
            #[cfg(feature = "sqlite")]
            $crate::connection::DbConn::Sqlite($c) => $body,
        }
    };
}
pub(crate) use on_conn;

impl DbConn {
    /// Says goodbye to the server (best effort).
    async fn close(self) {
        use sqlx::Connection;
        let _ = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(c) => c.close().await,
            #[cfg(feature = "postgres")]
            Self::PostgresPooled(p) => p.conn.close().await,
            #[cfg(feature = "mysql")]
            Self::MySql(c) => c.close().await,
            #[cfg(feature = "sqlite")]
            Self::Sqlite(c) => c.close().await,
        };
    }
}

/// Whether `err` means the connection it came from is unusable: the
/// socket failed or closed (`Io`: reset, EOF), TLS or the wire protocol
/// broke, SQLite's worker thread died, or the server said it is ending the
/// session (PostgreSQL class 08 connection exceptions and 57P01..57P03
/// shutdowns/terminations, which come as FATAL before the server closes;
/// MySQL/MariaDB 1927 "connection was killed", 1053 server shutdown, 4031
/// idle disconnect).
///
/// Not broken: statement errors (constraint, syntax, deadlock/serialization
/// rollbacks, SQLite busy), after which the connection is fine.
pub(crate) fn is_broken(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            #[cfg(feature = "mysql")]
            if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                return matches!(my.number(), 1053 | 1927 | 4031);
            }
            #[cfg(feature = "postgres")]
            if db
                .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .is_some()
            {
                let code = db.code().unwrap_or_default();
                return code.starts_with("08")
                    || matches!(code.as_ref(), "57P01" | "57P02" | "57P03");
            }
            false
        }
        _ => false,
    }
}

/// Schema set-up that lost a race with another client setting up the same
/// schema at the same moment, which trying again resolves: concurrent
/// `CREATE .. IF NOT EXISTS` colliding in PostgreSQL's catalog (unique
/// violation, 42P07), or processes opening a new SQLite file together,
/// which find it locked by another one's WAL switch or table creation
/// without SQLite's busy handler waiting (a lock upgrade it refuses rather
/// than risk a deadlock: SQLITE_BUSY, SQLITE_LOCKED and their extended
/// codes).
///
/// ```text
/// let mut race = SchemaRace::within(budget);
/// let done = loop {
///     match create().await {
///         Err(err) if race.again(&err).await => {}
///         other => break other,
///     }
/// };
/// ```
pub(crate) struct SchemaRace {
    until: tokio::time::Instant,
    pause: std::time::Duration,
}

impl SchemaRace {
    /// Retries allowed for `budget` from now.
    pub(crate) fn within(budget: std::time::Duration) -> Self {
        Self {
            until: tokio::time::Instant::now() + budget,
            pause: std::time::Duration::from_millis(10),
        }
    }

    /// Whether to try again after `err`: `true` (after a pause, 10 ms
    /// doubling up to 200 ms) when it is such a race and the budget allows
    /// one more pause.
    pub(crate) async fn again(&mut self, err: &sqlx::Error) -> bool {
        let race = matches!(
            err,
            sqlx::Error::Database(db) if db.is_unique_violation()
                || matches!(db.code().as_deref(), Some("42P07" | "5" | "6" | "261" | "517"))
        );
        if !race || tokio::time::Instant::now() + self.pause >= self.until {
            return false;
        }
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(std::time::Duration::from_millis(200));
        true
    }
}

/// At most `size` bare connections, idle ones kept for reuse (last in,
/// first out, so a quiet client keeps using one warm connection).
///
/// On SQLite the statements that write also take turns in the process
/// ([`ConnSet::checkout`] waits for the writer turn, first come first
/// served): the database has one writer, and writers of several
/// connections that find its lock taken sleep and poll in SQLite's busy
/// handler (sleeps of up to 100 ms), where a large statement (a renewal
/// batch) can lose the race to a stream of small grants for seconds, until
/// it times out and its leases are renewed again (issue #13: 100,000 held
/// locks renewed 3.5 times a period, a guard lost). Taking turns here, the
/// busy handler only waits for other processes.
#[derive(Debug)]
pub(crate) struct ConnSet {
    options: DbOptions,
    idle: Mutex<Vec<Idle>>,
    permits: Semaphore,
    /// The writer turn (SQLite only).
    writer: Option<AsyncMutex<()>>,
    /// Bumped when a connection is found broken: idle connections opened
    /// before are dropped instead of reused.
    epoch: AtomicU64,
}

#[derive(Debug)]
struct Idle {
    epoch: u64,
    conn: DbConn,
}

/// A connection taken from a [`ConnSet`] for one statement.
#[derive(Debug)]
pub(crate) struct Checkout<'a> {
    set: &'a ConnSet,
    conn: Option<Idle>,
    _permit: SemaphorePermit<'a>,
    /// Held until the statement is done (dropped after the connection).
    _writer: Option<AsyncMutexGuard<'a, ()>>,
}

impl ConnSet {
    /// `single_writer`: the writing statements take turns (SQLite).
    pub(crate) fn new(options: DbOptions, size: u32, single_writer: bool) -> Self {
        Self {
            writer: single_writer.then(|| AsyncMutex::new(())),
            options,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(usize::try_from(size.max(1)).unwrap_or(1)),
            epoch: AtomicU64::new(0),
        }
    }

    /// How connections are opened.
    pub(crate) fn options(&self) -> &DbOptions {
        &self.options
    }

    /// A connection for a statement that may write: an idle one unless
    /// `fresh`, else a newly opened one. Waits while `size` connections are
    /// checked out, and on SQLite for the writer turn (callers bound the
    /// wait with their operation timeout).
    ///
    /// When nothing has to wait (an idle connection, a free permit and
    /// writer turn: the usual case) the checkout is taken at once, without
    /// the futures of the semaphore and the lock; the waiting (and opening)
    /// is a boxed future of its own, so that every statement's future does
    /// not carry its state (callgrind of sql_parts' SqlBackend side: the
    /// waiting grant's boxed future above the allocator's 1,032-byte
    /// per-thread cache, each one taking its slow path).
    pub(crate) async fn checkout(&self, fresh: bool) -> Result<Checkout<'_>, sqlx::Error> {
        match self.checkout_now(fresh, true) {
            Some(checkout) => Ok(checkout),
            None => Box::pin(self.checkout_waiting(fresh, true)).await,
        }
    }

    /// A connection for a statement that only reads (no writer turn).
    pub(crate) async fn checkout_reader(&self, fresh: bool) -> Result<Checkout<'_>, sqlx::Error> {
        match self.checkout_now(fresh, false) {
            Some(checkout) => Ok(checkout),
            None => Box::pin(self.checkout_waiting(fresh, false)).await,
        }
    }

    /// The checkout when it needs no wait: not `fresh`, the writer turn
    /// free (when `writes` on SQLite), a permit free and an idle
    /// connection. As fair as waiting: tokio's semaphore and lock hand a
    /// release to a queued waiter before counting it free.
    pub(crate) fn checkout_now(&self, fresh: bool, writes: bool) -> Option<Checkout<'_>> {
        if fresh {
            return None;
        }
        let writer = match &self.writer {
            Some(turn) if writes => Some(turn.try_lock().ok()?),
            _ => None,
        };
        let permit = self.permits.try_acquire().ok()?;
        let conn = self.pop_idle()?;
        Some(Checkout {
            set: self,
            conn: Some(conn),
            _permit: permit,
            _writer: writer,
        })
    }

    /// The checkout that waits: for the writer turn (when `writes` on
    /// SQLite), for a permit, then opens a connection when none is idle
    /// or `fresh`.
    pub(crate) async fn checkout_waiting(
        &self,
        fresh: bool,
        writes: bool,
    ) -> Result<Checkout<'_>, sqlx::Error> {
        let writer = match &self.writer {
            Some(turn) if writes => Some(turn.lock().await),
            _ => None,
        };
        self.checkout_with(fresh, writer).await
    }

    async fn checkout_with<'a>(
        &'a self,
        fresh: bool,
        writer: Option<AsyncMutexGuard<'a, ()>>,
    ) -> Result<Checkout<'a>, sqlx::Error> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        let reused = if fresh { None } else { self.pop_idle() };
        let conn = match reused {
            Some(idle) => idle,
            None => {
                let epoch = self.epoch.load(Ordering::Acquire);
                Idle {
                    epoch,
                    conn: self.options.connect().await?,
                }
            }
        };
        Ok(Checkout {
            set: self,
            conn: Some(conn),
            _permit: permit,
            _writer: writer,
        })
    }

    fn pop_idle(&self) -> Option<Idle> {
        let epoch = self.epoch.load(Ordering::Acquire);
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        // Older than the last breakage: probably dead too (dropped here,
        // outside any await). Looked for first: there rarely are any.
        if idle.iter().any(|c| c.epoch < epoch) {
            idle.retain(|c| c.epoch >= epoch);
        }
        idle.pop()
    }

    /// Refuses further checkouts and closes the idle connections.
    pub(crate) async fn close(&self) {
        self.permits.close();
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(PoisonError::into_inner));
        for c in idle {
            c.conn.close().await;
        }
    }
}

impl Checkout<'_> {
    /// The connection.
    pub(crate) fn conn(&mut self) -> &mut DbConn {
        &mut self
            .conn
            .as_mut()
            .expect("a checkout holds its connection until finished")
            .conn
    }

    /// Hands the connection back after its statement returned `result`, or
    /// drops it when `result` shows it broke (with every idle connection
    /// opened before it). Returns whether it broke.
    pub(crate) fn finish<T>(mut self, result: &Result<T, sqlx::Error>) -> bool {
        let broken = result.as_ref().err().is_some_and(is_broken);
        let Some(conn) = self.conn.take() else {
            return broken;
        };
        if broken {
            // Connections opened from now on carry the new epoch.
            self.set.epoch.fetch_max(conn.epoch + 1, Ordering::AcqRel);
        } else if !self.set.permits.is_closed() {
            self.set
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(conn);
        }
        broken
    }
}

/// A sqlx pool of the configured dialect, for the users' own statements
/// (fenced writes): never used by the lock statements, and opened lazily.
#[derive(Clone, Debug)]
pub(crate) enum DbPool {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
}

impl DbPool {
    /// Closes the pool.
    pub(crate) async fn close(&self) {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => pool.close().await,
            #[cfg(feature = "mysql")]
            Self::MySql(pool) => pool.close().await,
            #[cfg(feature = "sqlite")]
            Self::Sqlite(pool) => pool.close().await,
        }
    }
}

/// Runs `$statement` (an expression of `$conn: &mut DbConn`) on one of the
/// backend's connections; when that connection turns out broken (see
/// [`crate::connection::is_broken`]), runs it once more on a freshly opened one.
/// Only for statements that may run twice: renew and inspect are
/// idempotent, and a release that did commit before its reply was lost
/// matches nothing the second time (it reports `false`, and the lock is
/// free either way). Grants recover differently (`grant_once`).
/// `retry_once!(read, ...)` is for statements that only read (see
/// [`ConnSet::checkout_reader`]); `|conn, fresh|` also names whether this
/// is the second run, on the fresh connection.
macro_rules! retry_once {
    ($conns:expr, |$conn:ident| $statement:expr) => {
        retry_once!(@ checkout, $conns, |$conn, _fresh| $statement)
    };
    ($conns:expr, |$conn:ident, $fresh:ident| $statement:expr) => {
        retry_once!(@ checkout, $conns, |$conn, $fresh| $statement)
    };
    (read, $conns:expr, |$conn:ident| $statement:expr) => {
        retry_once!(@ checkout_reader, $conns, |$conn, _fresh| $statement)
    };
    (@ $checkout:ident, $conns:expr, |$conn:ident, $fresh:ident| $statement:expr) => {{
        let conns: &ConnSet = $conns;
        let mut fresh = false;
        loop {
            let mut checkout = match conns.$checkout(fresh).await {
                Ok(checkout) => checkout,
                Err(err) => break Err(err),
            };
            let result = {
                let $fresh = fresh;
                let $conn = checkout.conn();
                // Boxed: a statement's future (a query and its arguments for
                // each database the crate is built with) is kilobytes, and
                // inline it would make every caller's future that large,
                // copied at every call.
                Box::pin($statement).await
            };
            if checkout.finish(&result) && !fresh {
                tracing::debug!("database connection broke; retrying on a fresh one");
                fresh = true;
                continue;
            }
            break result;
        }
    }};
}
pub(crate) use retry_once;
