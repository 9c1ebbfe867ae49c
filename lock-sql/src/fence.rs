//! Fenced writes for data that lives in the same database as the lease
//! table.

use lock_core::Lease;

use crate::connection::table::Table;

/// A condition that is true only while a lease is still current: its row
/// has the lease's owner and token and has not expired by the database's
/// clock. Add it to your own statement's `WHERE` clause so the write and
/// the check are one atomic statement:
///
/// ```text
/// UPDATE accounts SET balance = $1 WHERE id = $2 AND <fence.predicate()>
/// ```
///
/// then bind your own parameters followed by [`SqlFence::bind`]. A write
/// whose lease was lost (expired, released, taken over) changes no row.
///
/// For mutex leases only: the predicate reads the lease table, where read,
/// write and permit leases have no row (they live in the `_holders` table),
/// so a fence of one of those matches nothing and its write changes no row.
///
/// On PostgreSQL and MySQL/MariaDB the predicate reads the lease row with a
/// shared lock (`FOR SHARE` / `LOCK IN SHARE MODE`), so a take-over cannot
/// commit between the check and your write; SQLite serializes writers
/// anyway. On SQLite "now" is the host clock at millisecond precision.
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
/// let fence = backend.fence(&lease, 2);
/// let sql = format!("UPDATE counter SET v = v + ?1 WHERE id = 1 AND {}", fence.predicate());
/// let done = fence
///     .bind(sqlx::query(sqlx::AssertSqlSafe(sql.clone())).bind(1_i64))
///     .execute(&pool)
///     .await?;
/// assert_eq!(done.rows_affected(), 1);
///
/// backend.release(&lease).await?;
/// let late = fence
///     .bind(sqlx::query(sqlx::AssertSqlSafe(sql)).bind(1_i64))
///     .execute(&pool)
///     .await?;
/// assert_eq!(late.rows_affected(), 0, "a released lease writes nothing");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct SqlFence {
    predicate: String,
    key: String,
    owner: String,
    token: i64,
}

impl SqlFence {
    /// The SQL condition, with three placeholders (key, owner, token)
    /// numbered from the `first_param` given to [`SqlBackend::fence`](crate::SqlBackend::fence) on
    /// PostgreSQL (`$n`) and SQLite (`?n`), positional `?` on MySQL.
    pub fn predicate(&self) -> &str {
        &self.predicate
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

impl SqlFence {
    /// The fence of `lease` on `table`, whose placeholders start at
    /// `first_param`.
    pub(crate) fn new(table: &Table, lease: &Lease, first_param: usize) -> Self {
        let t = table.quoted_table();
        let n = first_param.max(1);
        let predicate = table.dialect.fence_predicate(t, n);
        Self {
            predicate,
            key: lease.key().as_str().to_owned(),
            owner: lease.owner().to_hex(),
            token: i64::try_from(lease.token().get()).unwrap_or(i64::MAX),
        }
    }
}
