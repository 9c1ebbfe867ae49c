//! Fenced writes to SQL tables (PostgreSQL, MySQL/MariaDB, SQLite) through
//! sqlx.
//!
//! The last accepted token of each resource is a row of a table
//! (`fences` by default: `resource`, `token`, `writes`). [`SqlFence::check`]
//! checks and advances it inside the caller's transaction: the row stays
//! locked until that transaction ends, so the write made in it and the
//! token it was made under commit together, and a racing writer with a
//! lower token waits for the commit and is then refused. A rollback undoes
//! both. [`SqlFence::begin`] starts such a transaction.
//!
//! Statements: PostgreSQL and SQLite check and advance in one upsert
//! (`INSERT .. ON CONFLICT .. DO UPDATE .. WHERE token <= new`); MySQL and
//! MariaDB in two (`INSERT .. ON DUPLICATE KEY UPDATE` to lock the row,
//! then `UPDATE .. WHERE token <= new`,
//! whose matched-rows count sqlx reports); a refusal reads the current
//! token once more. Tokens are stored as `BIGINT` (every token this family
//! hands out fits: the largest are a migration's, below 2^57).

use std::future::Future;
use std::pin::Pin;

use lock_core::FencingToken;
use sqlx::{
    AssertSqlSafe, Database, MySqlConnection, PgConnection, Pool, SqliteConnection, Transaction,
};

use crate::FenceError;

/// The default table name.
pub const DEFAULT_TABLE: &str = "fences";

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Fenced writes to one table of fences.
#[derive(Clone, Debug)]
pub struct SqlFence {
    table: String,
}

impl Default for SqlFence {
    fn default() -> Self {
        Self::new()
    }
}

impl SqlFence {
    /// Fences kept in the table `fences`.
    pub fn new() -> Self {
        Self {
            table: DEFAULT_TABLE.to_owned(),
        }
    }

    /// Fences kept in `table` (letters, digits and `_`, not starting with a
    /// digit, at most 63 characters; optionally `schema.table`).
    ///
    /// # Errors
    ///
    /// [`FenceError::InvalidArgument`] for any other name.
    pub fn with_table(table: &str) -> Result<Self, FenceError> {
        let ok = !table.is_empty()
            && table.split('.').count() <= 2
            && table.split('.').all(|part| {
                !part.is_empty()
                    && part.len() <= 63
                    && !part.starts_with(|c: char| c.is_ascii_digit())
                    && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
        if ok {
            Ok(Self {
                table: table.to_owned(),
            })
        } else {
            Err(FenceError::InvalidArgument(format!(
                "{table:?} is not a plain table name"
            )))
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the table if it does not exist.
    ///
    /// # Errors
    ///
    /// [`FenceError::Store`] with the database's error.
    ///
    /// # Cancel safety
    ///
    /// Safe: one `CREATE TABLE IF NOT EXISTS`.
    pub async fn create_table<C: FenceConnection>(&self, conn: &mut C) -> Result<(), FenceError> {
        conn.create(&self.table).await.map_err(FenceError::store)
    }

    /// Checks `token` against `resource`'s last accepted token and advances
    /// it, on `conn` (usually `&mut *tx`, a transaction of the caller's: the
    /// resource's row then stays locked until it commits or rolls back).
    ///
    /// # Errors
    ///
    /// [`FenceError::Stale`] when `token` is below the last accepted one
    /// (nothing was changed); [`FenceError::InvalidArgument`] for a token
    /// above `i64::MAX`; [`FenceError::Store`] with the database's error.
    ///
    /// # Cancel safety
    ///
    /// Cancelling leaves the advance in the caller's transaction, undone by
    /// its rollback; outside a transaction the advance may have landed.
    pub async fn check<C: FenceConnection>(
        &self,
        conn: &mut C,
        resource: &str,
        token: FencingToken,
    ) -> Result<(), FenceError> {
        let raw = i64::try_from(token.get()).map_err(|_| {
            FenceError::InvalidArgument(format!("token {token} does not fit a BIGINT"))
        })?;
        match conn
            .advance(&self.table, resource, raw)
            .await
            .map_err(FenceError::store)?
        {
            None => Ok(()),
            Some(current) => Err(FenceError::Stale {
                resource: resource.to_owned(),
                token: token.get(),
                current: u64::try_from(current).unwrap_or(0),
            }),
        }
    }

    /// Begins a transaction on `pool` and checks `token` in it: write in the
    /// returned transaction and commit; the write and the token's advance
    /// land together or not at all.
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check) (the transaction is rolled back).
    ///
    /// # Cancel safety
    ///
    /// Safe: a dropped transaction rolls back.
    pub async fn begin<DB>(
        &self,
        pool: &Pool<DB>,
        resource: &str,
        token: FencingToken,
    ) -> Result<Transaction<'static, DB>, FenceError>
    where
        DB: Database,
        DB::Connection: FenceConnection,
    {
        let mut tx = pool.begin().await.map_err(FenceError::store)?;
        self.check(&mut *tx, resource, token).await?;
        Ok(tx)
    }

    /// The last token `resource` accepted (`None` before any).
    ///
    /// # Errors
    ///
    /// [`FenceError::Store`] with the database's error.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    pub async fn current<C: FenceConnection>(
        &self,
        conn: &mut C,
        resource: &str,
    ) -> Result<Option<u64>, FenceError> {
        let current = conn
            .current(&self.table, resource)
            .await
            .map_err(FenceError::store)?;
        Ok(current.map(|t| u64::try_from(t).unwrap_or(0)))
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A connection of a database the fences speak (PostgreSQL, MySQL/MariaDB,
/// SQLite); `&mut *tx` of a transaction is one.
pub trait FenceConnection: sealed::Sealed + Send {
    #[doc(hidden)]
    fn create<'a>(&'a mut self, table: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>>;
    /// `None` when accepted, `Some(current)` when refused.
    #[doc(hidden)]
    fn advance<'a>(
        &'a mut self,
        table: &'a str,
        resource: &'a str,
        token: i64,
    ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>>;
    #[doc(hidden)]
    fn current<'a>(
        &'a mut self,
        table: &'a str,
        resource: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>>;
}

/// The [`FenceConnection`] of one database: its `CREATE TABLE` and
/// current-token texts, and `$advance`, an async fn that checks and
/// advances the token and answers the rows it accepted (0: refused).
macro_rules! fence_connection {
    ($conn:ty, create: $create:literal, advance: $advance:path, current: $current:literal) => {
        impl sealed::Sealed for $conn {}

        impl FenceConnection for $conn {
            fn create<'a>(&'a mut self, table: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>> {
                Box::pin(async move {
                    sqlx::query(AssertSqlSafe(format!($create, t = table)))
                        .execute(&mut *self)
                        .await?;
                    Ok(())
                })
            }

            fn advance<'a>(
                &'a mut self,
                table: &'a str,
                resource: &'a str,
                token: i64,
            ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>> {
                Box::pin(async move {
                    if $advance(&mut *self, table, resource, token).await? > 0 {
                        return Ok(None);
                    }
                    Ok(Some(self.current(table, resource).await?.unwrap_or(0)))
                })
            }

            fn current<'a>(
                &'a mut self,
                table: &'a str,
                resource: &'a str,
            ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>> {
                Box::pin(async move {
                    sqlx::query_scalar(AssertSqlSafe(format!($current, t = table)))
                        .bind(resource)
                        .fetch_optional(&mut *self)
                        .await
                })
            }
        }
    };
}

fence_connection!(
    PgConnection,
    create: "CREATE TABLE IF NOT EXISTS {t} (resource TEXT PRIMARY KEY, token BIGINT NOT NULL, writes BIGINT NOT NULL DEFAULT 0)",
    advance: pg_advance,
    current: "SELECT token FROM {t} WHERE resource = $1"
);

/// One upsert.
async fn pg_advance(
    conn: &mut PgConnection,
    table: &str,
    resource: &str,
    token: i64,
) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} AS f (resource, token, writes) VALUES ($1, $2, 1) \
         ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, writes = f.writes + 1 \
         WHERE f.token <= EXCLUDED.token"
    )))
    .bind(resource)
    .bind(token)
    .execute(conn)
    .await?
    .rows_affected())
}

fence_connection!(
    SqliteConnection,
    create: "CREATE TABLE IF NOT EXISTS {t} (resource TEXT PRIMARY KEY, token INTEGER NOT NULL, writes INTEGER NOT NULL DEFAULT 0)",
    advance: sqlite_advance,
    current: "SELECT token FROM {t} WHERE resource = ?1"
);

/// One upsert.
async fn sqlite_advance(
    conn: &mut SqliteConnection,
    table: &str,
    resource: &str,
    token: i64,
) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (resource, token, writes) VALUES (?1, ?2, 1) \
         ON CONFLICT (resource) DO UPDATE SET token = excluded.token, writes = {table}.writes + 1 \
         WHERE {table}.token <= excluded.token"
    )))
    .bind(resource)
    .bind(token)
    .execute(conn)
    .await?
    .rows_affected())
}

fence_connection!(
    MySqlConnection,
    create: "CREATE TABLE IF NOT EXISTS {t} (resource VARCHAR(255) NOT NULL PRIMARY KEY, token BIGINT NOT NULL, writes BIGINT NOT NULL DEFAULT 0)",
    advance: mysql_advance,
    current: "SELECT token FROM {t} WHERE resource = ?"
);

/// Two statements: `ON DUPLICATE KEY UPDATE` alone cannot tell "refused"
/// from "unchanged" under the found-rows count sqlx asks for; `UPDATE`'s
/// matched rows can. The first statement makes the row exist and takes its
/// exclusive lock (`INSERT IGNORE` would take a shared one, and two writers
/// upgrading theirs deadlock).
async fn mysql_advance(
    conn: &mut MySqlConnection,
    table: &str,
    resource: &str,
    token: i64,
) -> Result<u64, sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (resource, token, writes) VALUES (?, 0, 0) \
         ON DUPLICATE KEY UPDATE writes = writes"
    )))
    .bind(resource)
    .execute(&mut *conn)
    .await?;
    Ok(sqlx::query(AssertSqlSafe(format!(
        "UPDATE {table} SET token = ?, writes = writes + 1 WHERE resource = ? AND token <= ?"
    )))
    .bind(token)
    .bind(resource)
    .bind(token)
    .execute(conn)
    .await?
    .rows_affected())
}
