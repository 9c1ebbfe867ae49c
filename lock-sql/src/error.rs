//! Mapping sqlx errors onto [`LockError`] kinds, without passwords.

use futures_util::FutureExt;
use lock_core::{ErrorKind, LockError, LockKey, Operation};

use crate::config::NAME;
use crate::config::SqlConfig;

/// Why a database call failed, in sqlx's words (kept private: callers see
/// [`LockError`] with this as its source).
#[derive(Debug)]
struct SqlError(String);

impl std::fmt::Display for SqlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SqlError {}

/// Converts a sqlx error. The source is attached as text scrubbed of the
/// configured password.
pub(crate) fn map_sqlx(config: &SqlConfig, operation: Operation, err: sqlx::Error) -> LockError {
    let (kind, message) = match &err {
        sqlx::Error::PoolTimedOut => (
            ErrorKind::Timeout,
            "no database connection became available within the operation timeout",
        ),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => (ErrorKind::Unavailable, "cannot reach the database"),
        sqlx::Error::Protocol(_) => (ErrorKind::Unavailable, "the database connection broke"),
        sqlx::Error::Configuration(_) => (
            ErrorKind::Config,
            "the database driver rejected the configuration",
        ),
        sqlx::Error::Database(db) => {
            // SQLite's busy timeout ran out, server shutting down, too many
            // connections: temporary conditions.
            let code = db.code().unwrap_or_default();
            let temporary = matches!(
                code.as_ref(),
                "5" | "6" | "517" | "261" // SQLITE_BUSY, SQLITE_LOCKED and extended codes
                    | "57P01" | "57P02" | "57P03" | "53300" // PostgreSQL admin shutdown, cannot connect now, too many connections
                    | "08000" | "08003" | "08006" | "08S01" // connection failures
                    | "40001" | "40P01" // deadlock / serialization conflict: rolled back
            );
            if temporary {
                (
                    ErrorKind::Unavailable,
                    "the database is busy or shutting down",
                )
            } else {
                (ErrorKind::Backend, "the database returned an error")
            }
        }
        _ => (ErrorKind::Backend, "database call failed"),
    };
    LockError::new(kind, operation, message)
        .with_backend("sql")
        .with_source(SqlError(config.scrub(&err.to_string())))
}

/// `work`, the statements of one `operation`, within the operation timeout
/// of `config`, a sqlx error mapped by [`map_sqlx`]; either error names
/// `key` (when there is one) and the backend ([`NAME`]).
///
/// Cancel safety: that of `work` (dropped with it).
pub(crate) fn timed<T>(
    config: &SqlConfig,
    operation: Operation,
    key: Option<&LockKey>,
    work: impl Future<Output = Result<T, sqlx::Error>>,
) -> impl Future<Output = Result<T, LockError>> {
    // Tokio's timeout straight around the statement, its answer mapped in
    // place: an `async fn` keeps `work` as an argument beside the timeout it
    // was moved into (the statement's future, most of a kilobyte, twice in
    // every caller's future); through `with_timeout` and an async block
    // mapping its error, it was moved twice more per call.
    let timeout = config.op_timeout;
    tokio::time::timeout(timeout, work).map(move |answer| {
        let result = match answer {
            Ok(done) => done.map_err(|e| map_sqlx(config, operation, e)),
            Err(_) => Err(LockError::new(
                ErrorKind::Timeout,
                operation,
                format!("no answer within the operation timeout of {timeout:?}"),
            )),
        };
        result.map_err(|e| match key {
            Some(key) => e.with_key(key).with_backend(NAME),
            None => e.with_backend(NAME),
        })
    })
}

/// Whether `err` says the probed column does not exist.
pub(crate) fn is_missing_column(err: &sqlx::Error) -> bool {
    column_error(err, ["42703", "42S22"], "no such column")
}

/// Whether `err` says the column was added meanwhile (a concurrent connect).
pub(crate) fn is_duplicate_column(err: &sqlx::Error) -> bool {
    column_error(err, ["42701", "42S21"], "duplicate column")
}

/// Whether `err` is a database error with one of `codes` (PostgreSQL's
/// and MySQL's SQLSTATE) or whose message says `message` (SQLite's).
fn column_error(err: &sqlx::Error, codes: [&str; 2], message: &str) -> bool {
    match err {
        sqlx::Error::Database(db) => {
            db.code().is_some_and(|code| codes.contains(&code.as_ref()))
                || db.message().contains(message)
        }
        _ => false,
    }
}
