//! Transaction-scoped locks: a lock taken inside a transaction the caller
//! owns (an sqlx [`Transaction`]), held until that transaction commits or
//! rolls back, and never released by a call of ours.
//!
//! This is the form of DistributedLock's (.NET)
//! `PostgresDistributedLock.AcquireWithTransaction` (`pg_advisory_xact_lock`)
//! carried to the three databases: the caller begins a transaction,
//! [`TransactionLocks::lock_in`] (or [`try_lock_in`](TransactionLocks::try_lock_in))
//! takes the key's lock in it and hands back a [`TransactionGuard`] that
//! borrows the transaction mutably. The caller does its work through the
//! guard (it dereferences to the [`Transaction`]), drops it and commits or
//! rolls back: the database ends the lock with the transaction. Since the
//! guard borrows the transaction, it cannot outlive it: using it after
//! `commit` or `rollback` (which take the transaction by value) does not
//! compile. There is no TTL, no renewal and no release call: the lock
//! lives exactly as long as the transaction, so a crashed holder's lock
//! ends when the server ends its connection.
//!
//! What a transaction lock excludes follows the URL's `mode`, so that it
//! and the backend [`crate::connect`] opens from the same URL exclude each
//! other on the same key ([`TransactionLockKind`]):
//!
//! | database, mode | what is held | token |
//! |---|---|---|
//! | PostgreSQL, `mode=session` | `pg_advisory_xact_lock` on session mode's key ([`crate::keys::pg_lock_key`]) | session mode's sequence (`<table>_session_useq`, one for every key), `nextval` in the granting statement; while the server run is not started (after a crash) the statement takes nothing and the run is started on a connection of its own |
//! | PostgreSQL, row mode | the same advisory key, and the lease row, written in the transaction (its row lock) | the row's counter, bumped by the granting statement |
//! | MySQL/MariaDB, row mode | the lease row, written in the transaction (InnoDB's row lock) | the row's counter, bumped by the granting statement |
//! | SQLite, row mode | the lease row, written in the transaction: the database file's write lock | the row's counter, bumped by the granting statement |
//!
//! MySQL/MariaDB session mode (`GET_LOCK`) has no transactional form
//! (`GET_LOCK` belongs to the connection, not the transaction), so
//! [`TransactionLocks::new`] refuses it.
//!
//! # The row in row mode
//!
//! The granting statement is row mode's own grant (the same upsert: it
//! takes a key only when its row is free, bumping the row's token) with an
//! expiry of "now": once the transaction commits, the row it wrote is
//! already expired, so the key is free; a rollback undoes the write. While
//! the transaction is open, the uncommitted write holds the row's lock,
//! and every other writer of that row waits for the transaction to end:
//! another transaction lock (which answers "held" at once, below) and row
//! mode's grants alike. So a row-mode grant of a key a transaction lock
//! holds waits for that transaction on the server, up to the backend's
//! operation timeout (`timeout`, 5 s by default), and answers
//! [`ErrorKind::Timeout`] past it (a `try_acquire` as much as an
//! `acquire`; SQLite: its busy timeout, then [`ErrorKind::Unavailable`]),
//! instead of "held" at once; row mode's `inspect` and `list`
//! do not show a transaction lock (the committed row is free), and its
//! waiters are not notified at the commit (they see the key free at
//! their next try, or their grant in flight goes through). Keep these
//! transactions well within the operation timeout. A row-mode lease that
//! is live refuses a transaction lock, which waits for it by polling
//! (PostgreSQL, MySQL/MariaDB) until its deadline. Transaction locks do
//! not join fair mode's queue (`fair=true`): they take a free key
//! whoever waits for it.
//!
//! # Per database
//!
//! - **PostgreSQL.** A try is one statement
//!   (`pg_try_advisory_xact_lock`, then the token or the row write). A
//!   wait takes the lock with `pg_advisory_xact_lock` under `lock_timeout`
//!   (the time left), inside a savepoint: a timeout (or a deadlock the
//!   server detects) rolls back to the savepoint, so the caller's
//!   transaction stays usable, and `lock_timeout` is set back to what it
//!   was. The try runs without a savepoint (one round trip): should it
//!   fail (the table or sequence missing because
//!   [`TransactionLocks::prepare`] never ran, a serialization failure),
//!   PostgreSQL aborts the caller's transaction, as after any failed
//!   statement. In row mode, the row is written with `clock_timestamp()`,
//!   not the transaction's `now()`, so a lease that expired after the
//!   transaction began counts as expired; the row write needs
//!   `READ COMMITTED` (the default) to see a row changed since the
//!   transaction's snapshot (`REPEATABLE READ` answers a serialization
//!   error instead). Every statement is sent unnamed (`persistent(false)`)
//!   or as simple queries, so nothing depends on a prepared statement
//!   surviving between transactions: it works behind PgBouncer's
//!   transaction pooling.
//! - **MySQL/MariaDB.** The row write runs with `innodb_lock_wait_timeout`
//!   0 (MariaDB's `SET STATEMENT ... FOR`; on MySQL, which has no such
//!   form and whose minimum is 1 s, the session value is set to 1 around
//!   it and put back; only MariaDB is tested): a row locked by another
//!   transaction answers "held" at once (ER_LOCK_WAIT_TIMEOUT rolls back
//!   only the statement, unless the server runs with
//!   `innodb_rollback_on_timeout`). A wait polls.
//!   A deadlock InnoDB detects rolls back the **whole transaction**
//!   ([`ErrorKind::WouldDeadlock`]).
//! - **SQLite.** The row write takes the database file's write lock, which
//!   the transaction then keeps: while it is open no other connection
//!   writes anything, so a transaction lock excludes every other lock of
//!   the file, not only its key. Begin the transaction with
//!   `BEGIN IMMEDIATE` (`pool.begin_with("BEGIN IMMEDIATE")`): a deferred
//!   transaction that has read cannot take the write lock once another
//!   connection wrote. A key held by a live row-mode lease refuses a wait
//!   at once (the holder could not release it while this transaction
//!   holds the write lock); waiting for another writer is SQLite's busy
//!   timeout, retried until the deadline.
//!
//! # Tokens
//!
//! A grant's fencing token is taken by the statement that takes the lock.
//! Tokens of committed grants strictly increase per key (row mode: one
//! counter per key, shared with row mode's leases) or across keys
//! (PostgreSQL session mode: one sequence, shared with session mode's
//! grants). A rolled-back grant's token is consumed on PostgreSQL session
//! mode (a sequence is never rolled back) but handed out again in row mode
//! (the bump rolls back with the transaction): in row mode, do not let a
//! token leave the transaction before it commits. Taking the same key
//! again in the same transaction is granted (the lock is the
//! transaction's) with a new token.

use std::sync::OnceLock;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    ErrorKind, FencingToken, HolderDetails, LockError, LockKey, Operation, OwnerHex, OwnerId,
};
use sqlx::Transaction;
use tokio::time::Instant;

use crate::config::{NAME, SqlConfig, SqlDialect, SqlLayout, SqlMode};
use crate::error::map_sqlx;
use sealed::{Granted, TxGrantRequest};

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

/// What a transaction lock takes, and so what it excludes (chosen by the
/// URL's `mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransactionLockKind {
    /// PostgreSQL `pg_advisory_xact_lock` on session mode's advisory key,
    /// the token from session mode's sequence: excludes
    /// [`SqlSessionBackend`](crate::SqlSessionBackend)'s locks of the same
    /// table (`mode=session`).
    Advisory,
    /// The lease table's row of the key, written in the transaction:
    /// excludes row mode's leases ([`SqlBackend`](crate::SqlBackend)) of
    /// the same table. On PostgreSQL, also the advisory key of
    /// [`Advisory`](Self::Advisory).
    Row,
}

/// The statement texts of one config.
#[derive(Debug, Default)]
struct TxSql {
    /// Creates what the grants use (lease table and floor, or sequence).
    create: Vec<String>,
    /// One try.
    try_grant: String,
    /// PostgreSQL: the grant that waits under `lock_timeout`.
    wait_grant: String,
    /// PostgreSQL session mode: its statements, for the start of a server
    /// run (see `dialect::session::RunSql`).
    session: Option<crate::dialect::session::SessionSql>,
}

/// Takes transaction-scoped locks: built once from the same URL or
/// [`SqlConfig`] as the backend whose locks they must exclude.
///
/// ```
/// use lock_core::LockKey;
/// use lock_sql::TransactionLocks;
/// use lock_sql::sqlx::SqlitePool;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let url = format!("sqlite://{}", dir.path().join("locks.db").display());
/// let locks = TransactionLocks::from_url(&url)?;
/// let pool = SqlitePool::connect(&format!("{url}?mode=rwc")).await?;
/// locks.prepare(&pool).await?;
///
/// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
/// let key = LockKey::new("invoices/42")?;
/// let mut guard = locks.lock_in(&mut tx, &key, std::time::Duration::from_secs(5)).await?;
/// let token = guard.token();
/// sqlx::query("SELECT 1").execute(guard.conn()).await?;
/// drop(guard);
/// tx.commit().await?; // the lock ends here
/// # let _ = token;
/// # Ok(()) }
/// ```
///
/// The guard cannot outlive its transaction:
///
/// ```compile_fail,E0505
/// # use lock_sql::TransactionLocks;
/// # async fn f(locks: TransactionLocks, pool: lock_sql::sqlx::SqlitePool, key: lock_core::LockKey)
/// # -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// let guard = locks.try_lock_in(&mut tx, &key).await?.unwrap();
/// tx.commit().await?;
/// let _ = guard.token(); // error: `tx` was moved while borrowed
/// # Ok(()) }
/// ```
pub struct TransactionLocks {
    config: SqlConfig,
    kind: TransactionLockKind,
    sql: TxSql,
    /// MySQL: whether the server is MariaDB (asked once).
    mariadb: OnceLock<bool>,
}

impl std::fmt::Debug for TransactionLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionLocks")
            .field("dialect", &self.config.dialect)
            .field("table", &self.config.table)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl TransactionLocks {
    /// The transaction locks of `config`: its dialect, table and mode
    /// (row mode: [`TransactionLockKind::Row`]; PostgreSQL session mode:
    /// [`TransactionLockKind::Advisory`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] for MySQL/MariaDB session mode (`GET_LOCK`
    /// is not transactional) and ShedLock's layout; [`ErrorKind::Config`]
    /// for a dialect whose cargo feature is off.
    pub fn new(config: &SqlConfig) -> Result<Self, LockError> {
        let unsupported = |message: &str| {
            LockError::new(ErrorKind::Unsupported, Operation::Connect, message).with_backend(NAME)
        };
        if config.layout == SqlLayout::ShedLock {
            return Err(unsupported(
                "transaction locks need the lease layout (layout=shedlock has no token counter)",
            ));
        }
        let kind = match (config.dialect, config.mode) {
            (SqlDialect::Postgres, SqlMode::Session) => TransactionLockKind::Advisory,
            (_, SqlMode::Session) => {
                return Err(unsupported(
                    "MySQL/MariaDB session mode has no transaction-scoped form (GET_LOCK belongs \
                     to the connection): take transaction locks with a row-mode URL",
                ));
            }
            _ => TransactionLockKind::Row,
        };
        let sql = match config.dialect {
            #[cfg(feature = "postgres")]
            SqlDialect::Postgres => postgres::sql(kind, &config.table)?,
            // Row mode's grant: binds key (bytes), owner, TTL µs, details;
            // the token in `LAST_INSERT_ID`, 0 when held.
            #[cfg(feature = "mysql")]
            SqlDialect::MySql => row_sql(SqlDialect::MySql, &config.table)?,
            // Row mode's grant: binds key, owner, now µs, TTL µs, details;
            // `RETURNING token`.
            #[cfg(feature = "sqlite")]
            SqlDialect::Sqlite => row_sql(SqlDialect::Sqlite, &config.table)?,
            #[allow(unreachable_patterns)] // with every feature on
            other => {
                crate::dialect::of(other)?;
                TxSql::default()
            }
        };
        Ok(Self {
            config: config.clone(),
            kind,
            sql,
            mariadb: OnceLock::new(),
        })
    }

    /// [`new`](Self::new) of a parsed URL (see the crate docs).
    ///
    /// # Errors
    ///
    /// As [`SqlConfig::from_url`] and [`new`](Self::new).
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Self::new(&SqlConfig::from_url(url)?)
    }

    /// What these locks take and exclude.
    pub fn kind(&self) -> TransactionLockKind {
        self.kind
    }

    /// The database these locks are for: the `DB` of every call.
    pub fn dialect(&self) -> SqlDialect {
        self.config.dialect
    }

    /// Creates what the grants use, if missing (row mode: the lease table
    /// and its token floor, as [`SqlBackend`](crate::SqlBackend) does;
    /// PostgreSQL session mode: the token sequence, as
    /// [`SqlSessionBackend`](crate::SqlSessionBackend) does), on a
    /// connection of `pool`, outside any transaction of the caller's.
    /// Connecting either backend with `create_table=true` (the default)
    /// does the same.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] when `DB` is not [`dialect`](Self::dialect);
    /// [`ErrorKind::Timeout`] past the operation timeout; the database's
    /// error.
    ///
    /// # Cancel safety
    ///
    /// Each statement is idempotent: run it again.
    pub async fn prepare<DB: TxDatabase>(&self, pool: &sqlx::Pool<DB>) -> Result<(), LockError>
    where
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    {
        self.check::<DB>(Operation::Connect, None)?;
        let budget = self.config.op_timeout;
        let mut conn = self
            .bounded(Operation::Connect, None, budget, pool.acquire())
            .await?;
        for statement in &self.sql.create {
            let run = sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_string())).execute(&mut *conn);
            self.bounded(Operation::Connect, None, budget, run).await?;
        }
        Ok(())
    }

    /// One try: the key's lock in `tx`, or `None` when another
    /// transaction, session or live lease holds it.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] when `DB` is not [`dialect`](Self::dialect);
    /// [`ErrorKind::Timeout`] when the database did not answer within the
    /// operation timeout (the transaction's state is then unknown: roll it
    /// back); [`ErrorKind::WouldDeadlock`] for a deadlock the server broke
    /// (MySQL/MariaDB: the whole transaction was rolled back); the
    /// database's error.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped call may leave its statement running on
    /// the transaction's connection; roll the transaction back.
    pub async fn try_lock_in<'t, 'c, DB: TxDatabase>(
        &self,
        tx: &'t mut Transaction<'c, DB>,
        key: &LockKey,
    ) -> Result<Option<TransactionGuard<'t, 'c, DB>>, LockError> {
        self.check::<DB>(Operation::TryAcquire, Some(key))?;
        let mut request = TxGrantRequest::new(self, key, None);
        let granted = DB::grant(&mut **tx, &mut request).await?;
        Ok(granted.map(|token| TransactionGuard::new(tx, key, token)))
    }

    /// The key's lock in `tx`, waiting up to `wait` for it.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Contended`] when it is still held at the deadline (the
    /// caller's transaction is still usable: PostgreSQL's wait ran in a
    /// savepoint rolled back; SQLite answers it at once for a key a live
    /// row-mode lease holds); otherwise as [`try_lock_in`](Self::try_lock_in).
    ///
    /// # Cancel safety
    ///
    /// As [`try_lock_in`](Self::try_lock_in).
    pub async fn lock_in<'t, 'c, DB: TxDatabase>(
        &self,
        tx: &'t mut Transaction<'c, DB>,
        key: &LockKey,
        wait: Duration,
    ) -> Result<TransactionGuard<'t, 'c, DB>, LockError> {
        self.check::<DB>(Operation::Acquire, Some(key))?;
        let mut request = TxGrantRequest::new(self, key, Some(Instant::now() + wait));
        match DB::grant(&mut **tx, &mut request).await? {
            Some(token) => Ok(TransactionGuard::new(tx, key, token)),
            None => Err(self.contended(key, "still held at the wait deadline")),
        }
    }

    /// Refuses a `DB` of another dialect.
    fn check<DB: TxDatabase>(
        &self,
        operation: Operation,
        key: Option<&LockKey>,
    ) -> Result<(), LockError> {
        if DB::DIALECT == self.config.dialect {
            return Ok(());
        }
        let err = LockError::new(
            ErrorKind::InvalidArgument,
            operation,
            format!(
                "these transaction locks are for {}, the transaction is {}",
                self.config.dialect.as_str(),
                DB::DIALECT.as_str()
            ),
        )
        .with_backend(NAME);
        Err(match key {
            Some(key) => err.with_key(key),
            None => err,
        })
    }

    /// A Contended error of a wait on `key`.
    fn contended(&self, key: &LockKey, message: &str) -> LockError {
        LockError::new(ErrorKind::Contended, Operation::Acquire, message)
            .with_key(key)
            .with_backend(NAME)
    }

    /// A sqlx error of `operation` on `key`, mapped (a deadlock the server
    /// broke is [`ErrorKind::WouldDeadlock`]).
    fn failed(&self, operation: Operation, key: Option<&LockKey>, err: sqlx::Error) -> LockError {
        let deadlock = matches!(&err, sqlx::Error::Database(db) if is_deadlock(db.as_ref()));
        let mapped = if deadlock {
            LockError::new(
                ErrorKind::WouldDeadlock,
                operation,
                "the database broke a deadlock by failing this lock (on MySQL/MariaDB the whole \
                 transaction was rolled back)",
            )
            .with_backend(NAME)
        } else {
            map_sqlx(&self.config, operation, err).with_backend(NAME)
        };
        match key {
            Some(key) => mapped.with_key(key),
            None => mapped,
        }
    }

    /// `work` within `budget`, its sqlx error mapped.
    async fn bounded<T>(
        &self,
        operation: Operation,
        key: Option<&LockKey>,
        budget: Duration,
        work: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, LockError> {
        match tokio::time::timeout(budget, work).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.failed(operation, key, e)),
            Err(_) => {
                let err = LockError::new(
                    ErrorKind::Timeout,
                    operation,
                    "the database did not answer within the operation timeout; the \
                     transaction's state is unknown: roll it back",
                )
                .with_backend(NAME);
                Err(match key {
                    Some(key) => err.with_key(key),
                    None => err,
                })
            }
        }
    }
}

/// Whether a database error is a deadlock the server broke (PostgreSQL
/// 40P01, MySQL/MariaDB 1213, whose SQLSTATE sqlx may report as 40001).
fn is_deadlock(db: &dyn sqlx::error::DatabaseError) -> bool {
    matches!(db.code().as_deref(), Some("40P01" | "1213"))
        || (db.code().as_deref() == Some("40001")
            && db.message().to_ascii_lowercase().contains("deadlock"))
}

/// A transaction-scoped lock, held until its transaction ends. It borrows
/// the transaction mutably: do the transaction's work through it
/// ([`conn`](Self::conn), or the transaction it dereferences to), drop it,
/// then commit or roll back. Dropping it releases nothing.
#[must_use = "the lock is the transaction's: do the work through the guard, then commit"]
pub struct TransactionGuard<'t, 'c, DB: sqlx::Database> {
    tx: &'t mut Transaction<'c, DB>,
    key: LockKey,
    token: FencingToken,
}

impl<'t, 'c, DB: sqlx::Database> TransactionGuard<'t, 'c, DB> {
    fn new(tx: &'t mut Transaction<'c, DB>, key: &LockKey, token: u64) -> Self {
        Self {
            tx,
            key: key.clone(),
            token: FencingToken::new(token),
        }
    }

    /// The locked key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The grant's fencing token (see the module docs for how tokens
    /// order).
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The transaction, for statements inside it.
    pub fn transaction(&mut self) -> &mut Transaction<'c, DB> {
        self.tx
    }

    /// The transaction's connection, the executor of the caller's
    /// statements (`query.execute(guard.conn())`).
    pub fn conn(&mut self) -> &mut DB::Connection {
        self.tx
    }
}

impl<'c, DB: sqlx::Database> std::ops::Deref for TransactionGuard<'_, 'c, DB> {
    type Target = Transaction<'c, DB>;
    fn deref(&self) -> &Self::Target {
        self.tx
    }
}

impl<DB: sqlx::Database> std::ops::DerefMut for TransactionGuard<'_, '_, DB> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.tx
    }
}

impl<DB: sqlx::Database> std::fmt::Debug for TransactionGuard<'_, '_, DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionGuard")
            .field("key", &self.key)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// A database transaction locks work on: `sqlx::Postgres`,
/// `sqlx::MySql`, `sqlx::Sqlite` (each with its cargo feature). Sealed.
pub trait TxDatabase: sqlx::Database + sealed::Driver {}

impl<DB: sqlx::Database + sealed::Driver> TxDatabase for DB {}

mod sealed {
    use super::{
        Duration, HolderDetails, Instant, LockError, LockKey, Operation, OwnerHex, OwnerId,
        TransactionLocks, async_trait,
    };
    use crate::config::SqlDialect;

    /// A grant's token, or `None` when the key is still held.
    pub(super) type Granted = Result<Option<u64>, LockError>;

    /// The per-database grant (not nameable outside the crate).
    #[async_trait]
    pub trait Driver: sqlx::Database {
        /// The dialect of this database.
        const DIALECT: SqlDialect;

        /// The request's try (no deadline) or wait until its deadline: the
        /// token, or `None` when still held.
        async fn grant(conn: &mut Self::Connection, request: &mut TxGrantRequest<'_>) -> Granted;
    }

    /// One grant of a transaction lock, as every database's grant takes it:
    /// the key, a fresh owner, the holder details, and for a wait its
    /// deadline and the polling step.
    pub struct TxGrantRequest<'k> {
        pub locks: &'k TransactionLocks,
        pub key: &'k LockKey,
        pub owner: OwnerHex,
        pub details: String,
        /// `None` for a try.
        pub deadline: Option<Instant>,
        pub operation: Operation,
        step: Duration,
    }

    impl<'k> TxGrantRequest<'k> {
        pub fn new(
            locks: &'k TransactionLocks,
            key: &'k LockKey,
            deadline: Option<Instant>,
        ) -> Self {
            Self {
                locks,
                key,
                owner: OwnerId::random().hex(),
                details: HolderDetails::encode_current(),
                deadline,
                operation: match deadline {
                    None => Operation::TryAcquire,
                    Some(_) => Operation::Acquire,
                },
                step: Duration::from_millis(10),
            }
        }

        /// Sleeps before the next poll, doubling the step up to 250 ms and
        /// never past the deadline: `false` for a try or at the deadline.
        pub async fn pause(&mut self) -> bool {
            let Some(deadline) = self.deadline else {
                return false;
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            tokio::time::sleep(self.step.min(left)).await;
            self.step = (self.step * 2).min(Duration::from_millis(250));
            true
        }
    }
}

/// Row mode's own statements on `table` (validated) for `dialect`: its
/// table's `CREATE`s and its grant, which the caller's transaction runs
/// with an expiry of now (TTL 0), so the row lock is the lock.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
fn row_sql(dialect: SqlDialect, table: &str) -> Result<TxSql, LockError> {
    let statements = crate::keys::Statements::new(crate::dialect::of(dialect)?, table);
    Ok(TxSql {
        create: statements.create.iter().map(|s| s.to_string()).collect(),
        try_grant: statements.grant.to_string(),
        wait_grant: String::new(),
        session: None,
    })
}

/// A statement's token: `None` when none or not positive.
fn token_of(raw: Option<i64>) -> Option<u64> {
    raw.and_then(|t| u64::try_from(t).ok()).filter(|t| *t > 0)
}

/// A database error's code, if it is one.
fn code_of(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}
