//! Writes guarded by the lock's own table: for data in the same database
//! as the lease table, the ownership check goes into the caller's own
//! statement or transaction, and the resource needs no fencing token.

use lock_core::{ErrorKind, Lease, LeaseKind, LockError, Operation};

use crate::config::NAME;
use crate::connection::table::Table;

/// A SQL condition that is true only while a mutex lease holds its lock:
/// the lease's row in the lease table has the lease's owner and token and
/// has not expired by the database's clock. Made by
/// [`SqlBackend::owner_predicate`](crate::SqlBackend::owner_predicate)
/// from the lease a guard holds (`guard.lease()`).
///
/// Two ways to use it:
///
/// - **In the write itself**: add [`sql`](Self::sql) to your statement's
///   `WHERE` clause, then bind your own parameters followed by
///   [`bind`](Self::bind). The check and the write are one statement: a
///   lease that no longer holds its lock (released, expired, taken over)
///   changes no row, so `rows_affected() == 0` is the refusal (MySQL
///   counts *changed* rows: there make the write always change its row,
///   a counter column for instance, or a rewrite of the same value reads
///   as a refusal).
/// - **In your transaction**: run [`check_sql`](Self::check_sql) (with
///   [`bind`](Self::bind)) first; one row back means the lease holds its
///   lock, none that it does not (roll back). On PostgreSQL and
///   MySQL/MariaDB the check reads the lease row with a shared lock
///   (`FOR SHARE` / `LOCK IN SHARE MODE`) that lasts until your commit, so
///   nobody can take the lock over, release it or renew it before your
///   writes commit, even if the lease expires meanwhile: keep the
///   transaction short. On SQLite start the transaction with
///   `BEGIN IMMEDIATE` (sqlx: `pool.begin_with("BEGIN IMMEDIATE")`): it
///   takes the database's write lock first, so no grant commits between
///   the check and your writes (a deferred transaction would fail with
///   `SQLITE_BUSY` instead of being wrong).
///
/// What it promises: a write that commits was checked, in the same
/// statement or transaction, against the lease row as the database had it
/// then. What it does not: the data must live in the same database (and,
/// for the transaction form, the same transaction); a write to anything
/// else is not guarded; and on SQLite "now" is the host's clock (at
/// millisecond precision), as for the locks themselves.
///
/// For mutex leases of row mode only: read-write and semaphore leases
/// have no row in the lease table, session mode has no row at all, and
/// ShedLock's layout is not offered; asking for those is an
/// [`ErrorKind::Unsupported`] error, never a predicate that matches
/// nothing.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lock_core::{LockBackend, LockBackendExt, LockKey};
/// use lock_sql::{SqlBackend, sqlx};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = SqlBackend::connect_url("sqlite::memory:").await?;
/// let pool = backend.sqlite_pool().expect("sqlite").clone();
/// sqlx::query("CREATE TABLE counter (id INTEGER PRIMARY KEY, v INTEGER)").execute(&pool).await?;
/// sqlx::query("INSERT INTO counter VALUES (1, 0)").execute(&pool).await?;
///
/// let key = LockKey::new("counter")?;
/// let lease = backend.try_acquire(&key, Duration::from_secs(5)).await?.expect("free");
/// // The predicate's placeholders follow the statement's own `?1`.
/// let owner = backend.owner_predicate(&lease, 2)?;
/// let sql = format!("UPDATE counter SET v = v + ?1 WHERE id = 1 AND {}", owner.sql());
/// let done = owner
///     .bind(sqlx::query(sqlx::AssertSqlSafe(sql.clone())).bind(1_i64))
///     .execute(&pool)
///     .await?;
/// assert_eq!(done.rows_affected(), 1);
///
/// backend.release(&lease).await?;
/// let late = owner
///     .bind(sqlx::query(sqlx::AssertSqlSafe(sql)).bind(1_i64))
///     .execute(&pool)
///     .await?;
/// assert_eq!(late.rows_affected(), 0, "a released lease writes nothing");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct OwnerPredicate {
    predicate: String,
    check: String,
    key: String,
    owner: String,
    token: i64,
}

impl OwnerPredicate {
    /// The SQL condition, with three placeholders (key, owner, token)
    /// numbered from the `first_placeholder` given to
    /// [`SqlBackend::owner_predicate`](crate::SqlBackend::owner_predicate)
    /// on PostgreSQL (`$n`) and SQLite (`?n`), positional `?` on MySQL.
    pub fn sql(&self) -> &str {
        &self.predicate
    }

    /// A whole statement for the transaction form: it returns one row
    /// while the lease holds its lock and none otherwise. Its placeholders
    /// are the three of [`bind`](Self::bind), numbered from 1 whatever
    /// `first_placeholder` was. Outside a transaction its shared lock ends
    /// with the statement: use [`sql`](Self::sql) in the write instead.
    pub fn check_sql(&self) -> &str {
        &self.check
    }

    /// Binds the predicate's three parameters (key, owner, token) to
    /// `query`, after whatever it already has.
    pub fn bind<'q, DB>(
        &self,
        query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>,
    ) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>
    where
        DB: sqlx::Database,
        String: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        i64: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    {
        query
            .bind(self.key.clone())
            .bind(self.owner.clone())
            .bind(self.token)
    }

    /// The lease's fencing token as the database stores it.
    pub fn token(&self) -> i64 {
        self.token
    }
}

impl OwnerPredicate {
    /// The predicate of `lease` on `table`, whose placeholders start at
    /// `first_placeholder`.
    pub(crate) fn new(
        table: &Table,
        lease: &Lease,
        first_placeholder: usize,
    ) -> Result<Self, LockError> {
        if lease.kind() != LeaseKind::Exclusive {
            return Err(unsupported(
                lease,
                format!(
                    "an ownership predicate needs a mutex lease: a {:?} lease has no row in \
                     the lease table (use its fencing token at the resource)",
                    lease.kind()
                ),
            ));
        }
        if first_placeholder == 0 {
            return Err(LockError::invalid_argument(
                Operation::GuardedWrite,
                "placeholders are numbered from 1: first_placeholder must be at least 1",
            )
            .with_backend(NAME));
        }
        let token = i64::try_from(lease.token().get()).map_err(|_| {
            LockError::invalid_argument(
                Operation::GuardedWrite,
                "the lease's token does not fit the table's BIGINT: not a lease of this table",
            )
            .with_key(lease.key())
            .with_backend(NAME)
        })?;
        let t = table.quoted_table();
        Ok(Self {
            predicate: table.dialect.owner_predicate(t, first_placeholder),
            check: table.dialect.owner_check_sql(t),
            key: lease.key().as_str().to_owned(),
            owner: lease.owner().to_hex(),
            token,
        })
    }
}

/// The error of a lease or mode without a lease row to check.
pub(crate) fn unsupported(lease: &Lease, why: impl Into<String>) -> LockError {
    LockError::new(ErrorKind::Unsupported, Operation::GuardedWrite, why)
        .with_key(lease.key())
        .with_backend(NAME)
}
