//! SQLite's transaction locks: row mode's grant in the caller's
//! transaction, which takes (and keeps) the database file's write lock.

use async_trait::async_trait;
use lock_core::{ErrorKind, LockError, LockKey};
use sqlx::{AssertSqlSafe, Row, SqliteConnection};

use super::{Granted, TransactionLocks, TxGrantRequest, code_of, sealed, token_of};
use crate::config::{NAME, SqlDialect};
use crate::dialect::unix_micros;

/// What one try did.
enum Tried {
    Granted(u64),
    /// A live lease holds the key's row.
    Leased,
    /// Another connection holds the file's write lock (past the busy
    /// timeout).
    Busy,
    /// `SQLITE_BUSY_SNAPSHOT`: the transaction read before another
    /// connection wrote, so it can never write (no retry helps).
    Stale,
}

/// SQLITE_BUSY and its extended codes but `SQLITE_BUSY_SNAPSHOT` (517),
/// and SQLITE_LOCKED.
fn is_busy(err: &sqlx::Error) -> bool {
    matches!(code_of(err).as_deref(), Some("5" | "6" | "261" | "262"))
}

impl TransactionLocks {
    async fn sqlite_try(
        &self,
        conn: &mut SqliteConnection,
        key: &LockKey,
        owner: &str,
        details: &str,
    ) -> Result<Tried, sqlx::Error> {
        let granted = sqlx::query(AssertSqlSafe(self.sql.try_grant.as_str()))
            .bind(key.as_str())
            .bind(owner)
            .bind(unix_micros())
            .bind(0_i64)
            .bind(details)
            .fetch_optional(&mut *conn)
            .await;
        match granted {
            Ok(Some(row)) => {
                Ok(token_of(row.try_get::<Option<i64>, _>(0)?)
                    .map_or(Tried::Leased, Tried::Granted))
            }
            Ok(None) => Ok(Tried::Leased),
            Err(err) if is_busy(&err) => Ok(Tried::Busy),
            Err(err) if code_of(&err).as_deref() == Some("517") => Ok(Tried::Stale),
            Err(err) => Err(err),
        }
    }
}

#[async_trait]
impl sealed::Driver for sqlx::Sqlite {
    const DIALECT: SqlDialect = SqlDialect::Sqlite;

    async fn grant(conn: &mut SqliteConnection, request: &mut TxGrantRequest<'_>) -> Granted {
        let (locks, key, operation) = (request.locks, request.key, request.operation);
        // The busy timeout is the connection's: the budget must cover it.
        let budget = locks.config.op_timeout + locks.config.busy_timeout;
        loop {
            let tried = locks.sqlite_try(conn, key, request.owner.as_str(), &request.details);
            match locks.bounded(operation, Some(key), budget, tried).await? {
                Tried::Granted(token) => return Ok(Some(token)),
                // This transaction now holds the file's write lock: the
                // lease's holder cannot release it before this
                // transaction ends, so waiting here is pointless.
                Tried::Leased if request.deadline.is_some() => {
                    return Err(locks.contended(
                        key,
                        "a live row-mode lease holds the key; its holder cannot release it while \
                         this transaction holds SQLite's write lock: retry in a new transaction",
                    ));
                }
                Tried::Leased => return Ok(None),
                Tried::Busy => {}
                Tried::Stale => {
                    return Err(LockError::new(
                        ErrorKind::Unavailable,
                        operation,
                        "the transaction read before another connection wrote, so SQLite will \
                         not let it write: begin it with BEGIN IMMEDIATE \
                         (pool.begin_with(\"BEGIN IMMEDIATE\"))",
                    )
                    .with_key(key)
                    .with_backend(NAME));
                }
            }
            if !request.pause().await {
                return Ok(None);
            }
        }
    }
}
