//! Each lock statement with its binds, on one connection: one round trip
//! each (after the connection's first use of a statement, which sqlx
//! prepares and caches).

use std::sync::Arc;
use std::time::Duration;

use lock_core::LockKey;
use sqlx::AssertSqlSafe;
#[allow(unused_imports)] // unused when only the MySQL dialect is compiled in
use sqlx::Row;

use crate::conn::DbConn;
use crate::driver::micros;
#[allow(unused_imports)] // used by the SQLite dialect only
use crate::driver::unix_micros;

fn sql(statement: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(statement))
}

/// The grant: `Some(token)` when the row was inserted or an expired one
/// taken over, `None` when someone holds it.
pub(crate) async fn grant(
    conn: &mut DbConn,
    statement: &Arc<str>,
    key: &LockKey,
    owner: &str,
    ttl: Duration,
) -> Result<Option<i64>, sqlx::Error> {
    let ttl_us = micros(ttl);
    Ok(match conn {
        #[cfg(feature = "postgres")]
        DbConn::Postgres(c) => sqlx::query(sql(statement))
            .bind(key.as_str())
            .bind(owner)
            .bind(ttl_us)
            .fetch_optional(c)
            .await?
            .map(|row| row.try_get::<i64, _>(0))
            .transpose()?,
        #[cfg(feature = "mysql")]
        DbConn::MySql(c) => {
            let done = sqlx::query(sql(statement))
                .bind(key.as_str().as_bytes())
                .bind(owner)
                .bind(ttl_us)
                .execute(c)
                .await?;
            // LAST_INSERT_ID(expr): the new token, or 0 when held.
            match done.last_insert_id() {
                0 => None,
                token => Some(i64::try_from(token).unwrap_or(i64::MAX)),
            }
        }
        #[cfg(feature = "sqlite")]
        DbConn::Sqlite(c) => sqlx::query(sql(statement))
            .bind(key.as_str())
            .bind(owner)
            .bind(unix_micros())
            .bind(ttl_us)
            .fetch_optional(c)
            .await?
            .map(|row| row.try_get::<i64, _>(0))
            .transpose()?,
    })
}

/// The guarded release: whether it matched our row (PostgreSQL notifies
/// `channel` in the same statement).
pub(crate) async fn release(
    conn: &mut DbConn,
    statement: &Arc<str>,
    key: &LockKey,
    owner: &str,
    token: i64,
    channel: &str,
) -> Result<bool, sqlx::Error> {
    let _ = channel;
    Ok(match conn {
        #[cfg(feature = "postgres")]
        DbConn::Postgres(c) => sqlx::query(sql(statement))
            .bind(key.as_str())
            .bind(owner)
            .bind(token)
            .bind(channel)
            .fetch_optional(c)
            .await?
            .is_some(),
        #[cfg(feature = "mysql")]
        DbConn::MySql(c) => {
            sqlx::query(sql(statement))
                .bind(key.as_str().as_bytes())
                .bind(owner)
                .bind(token)
                .execute(c)
                .await?
                .rows_affected()
                == 1
        }
        #[cfg(feature = "sqlite")]
        DbConn::Sqlite(c) => {
            sqlx::query(sql(statement))
                .bind(key.as_str())
                .bind(owner)
                .bind(token)
                .bind(unix_micros())
                .execute(c)
                .await?
                .rows_affected()
                == 1
        }
    })
}

/// The renewal: rows matched (1 when still ours and unexpired).
pub(crate) async fn renew(
    conn: &mut DbConn,
    statement: &Arc<str>,
    key: &LockKey,
    owner: &str,
    token: i64,
    ttl: Duration,
) -> Result<u64, sqlx::Error> {
    let ttl_us = micros(ttl);
    Ok(match conn {
        #[cfg(feature = "postgres")]
        DbConn::Postgres(c) => sqlx::query(sql(statement))
            .bind(key.as_str())
            .bind(owner)
            .bind(token)
            .bind(ttl_us)
            .execute(c)
            .await?
            .rows_affected(),
        // CLIENT_FOUND_ROWS: matched rows, and the WHERE clause is the
        // ownership check.
        #[cfg(feature = "mysql")]
        DbConn::MySql(c) => sqlx::query(sql(statement))
            .bind(ttl_us)
            .bind(key.as_str().as_bytes())
            .bind(owner)
            .bind(token)
            .execute(c)
            .await?
            .rows_affected(),
        #[cfg(feature = "sqlite")]
        DbConn::Sqlite(c) => sqlx::query(sql(statement))
            .bind(key.as_str())
            .bind(owner)
            .bind(token)
            .bind(unix_micros())
            .bind(ttl_us)
            .execute(c)
            .await?
            .rows_affected(),
    })
}

/// The current unexpired holder: (owner, token, remaining µs).
pub(crate) type Holder = (Option<String>, i64, i64);

/// Reads the current unexpired holder of `key`.
pub(crate) async fn inspect(
    conn: &mut DbConn,
    statement: &Arc<str>,
    key: &LockKey,
) -> Result<Option<Holder>, sqlx::Error> {
    let row = match conn {
        #[cfg(feature = "postgres")]
        DbConn::Postgres(c) => sqlx::query(sql(statement))
            .bind(key.as_str())
            .fetch_optional(c)
            .await?
            .map(|row| Ok::<_, sqlx::Error>((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))),
        #[cfg(feature = "mysql")]
        DbConn::MySql(c) => sqlx::query(sql(statement))
            .bind(key.as_str().as_bytes())
            .fetch_optional(c)
            .await?
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))),
        #[cfg(feature = "sqlite")]
        DbConn::Sqlite(c) => sqlx::query(sql(statement))
            .bind(key.as_str())
            .bind(unix_micros())
            .fetch_optional(c)
            .await?
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))),
    };
    row.transpose()
}

/// Runs one statement without binds (schema creation, `SELECT 1`).
pub(crate) async fn plain(conn: &mut DbConn, statement: &Arc<str>) -> Result<(), sqlx::Error> {
    match conn {
        #[cfg(feature = "postgres")]
        DbConn::Postgres(c) => sqlx::query(sql(statement)).execute(c).await.map(drop),
        #[cfg(feature = "mysql")]
        DbConn::MySql(c) => sqlx::query(sql(statement)).execute(c).await.map(drop),
        #[cfg(feature = "sqlite")]
        DbConn::Sqlite(c) => sqlx::query(sql(statement)).execute(c).await.map(drop),
    }
}
