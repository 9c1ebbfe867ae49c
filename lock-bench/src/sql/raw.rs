//! The raw server lock under session mode: the bare advisory-lock /
//! `GET_LOCK` exchange, no fencing token, by hand on one bare connection.
//!
//! [`SqlRawLock`] is what an application that takes the database's own
//! lock by hand sends for a waiting acquire and a release (the `Raw` side
//! of the `session_parts` probe, written once here for
//! `distlock-compare compare`):
//!
//! - PostgreSQL: `SELECT pg_try_advisory_lock($1)`, and when it answers
//!   false the blocking `SELECT pg_advisory_lock($1)`; then `SELECT
//!   pg_advisory_unlock($1)`;
//! - MySQL/MariaDB: `SELECT GET_LOCK(?, 0)`, and when it answers 0 the
//!   blocking `SELECT GET_LOCK(?, 60)`; then `SELECT RELEASE_LOCK(?)`.
//!
//! Two round trips per uncontended cycle, as session mode's floor
//! ([`SessionFloor`](super::SessionFloor)), whose grant also takes the
//! fencing token in the same statement: the floor's rate over this one's
//! is what the token costs. The lock is the server lock the driver takes
//! for the same key (`lock_sql::keys`' mapping), so it excludes with the
//! driver's session mode on the same key. Nothing of the driver runs but
//! its URL parsing, its connect options and its key mapping.
//!
//! Not a lock API: no token, no TTL (the lock lives as long as the
//! connection), no reconnection.

use async_trait::async_trait;
use conformance::bench::Contender;
use lock_core::{LockError, LockKey, Operation};
use lock_sql::keys::{DbConn, mysql_lock_name, pg_lock_key};
use lock_sql::sqlx;
use lock_sql::{SqlConfig, SqlDialect};
use tokio::sync::Mutex;

use super::bare::{self, Bare, BareExt, Label};

/// How long the blocking MySQL/MariaDB `GET_LOCK` waits, in seconds, when
/// the try finds the key held (the whole cycle is also bounded by the
/// URL's operation timeout, as the floors' statements are).
const WAIT_SECS: i32 = 60;

/// The raw server lock's acquire (try, then blocking) and release, by hand
/// on one bare connection; see the module docs.
///
/// Serves one cycle at a time (concurrent cycles queue on the
/// connection): eight independent clients are eight of these.
#[derive(Debug)]
pub struct SqlRawLock {
    label: Label,
    config: SqlConfig,
    conn: Mutex<Bare>,
}

impl SqlRawLock {
    /// Opens one bare connection to the database `url` names (same syntax
    /// as [`lock_sql::connect`]; `mode` and the table options are read only
    /// for the key mapping: nothing is created).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for a bad URL or a SQLite one (no server
    /// locks); the driver's kinds for a database that cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes the connection being opened.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = SqlConfig::from_url(url)?;
        let (_, name, min_ttl) = lock_sql::keys::session_connect_options(&config)?;
        let label = Label { name, min_ttl };
        if config.dialect() == SqlDialect::Sqlite {
            return Err(LockError::config("SQLite has no server lock").with_backend(name));
        }
        let options = lock_sql::keys::connect_options(&config)?;
        let conn = Bare::open_with(&config, options, &[]).await?;
        Ok(Self {
            label,
            config,
            conn: Mutex::new(conn),
        })
    }

    /// The exchange on the connection: try, blocking when held, release.
    async fn exchange(&self, key: &LockKey) -> Result<(), sqlx::Error> {
        let namespace = self.config.table_name();
        match &mut *self.conn.lock().await {
            DbConn::Postgres(c) => {
                let k = pg_lock_key(namespace, key.as_str());
                let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                    .bind(k)
                    .fetch_one(&mut *c)
                    .await?;
                if !got {
                    sqlx::query("SELECT pg_advisory_lock($1)")
                        .bind(k)
                        .execute(&mut *c)
                        .await?;
                }
                let released: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
                    .bind(k)
                    .fetch_one(&mut *c)
                    .await?;
                if !released {
                    return Err(not_held());
                }
            }
            DbConn::MySql(c) => {
                let name = mysql_lock_name(namespace, key.as_str());
                let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                    .bind(name.as_str())
                    .fetch_one(&mut *c)
                    .await?;
                if got != Some(1) {
                    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
                        .bind(name.as_str())
                        .bind(WAIT_SECS)
                        .fetch_one(&mut *c)
                        .await?;
                    if got != Some(1) {
                        return Err(sqlx::Error::Protocol(format!(
                            "GET_LOCK waited {WAIT_SECS} s in vain"
                        )));
                    }
                }
                let released: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                    .bind(name.as_str())
                    .fetch_one(&mut *c)
                    .await?;
                if released != Some(1) {
                    return Err(not_held());
                }
            }
            DbConn::PostgresPooled(_) => return Err(bare::pooled()),
            DbConn::Sqlite(_) => {
                return Err(sqlx::Error::Protocol("SQLite has no server lock".into()));
            }
        }
        Ok(())
    }
}

/// A release the server said was not ours: only a broken connection (it
/// dropped its locks) can cause it here.
fn not_held() -> sqlx::Error {
    sqlx::Error::Protocol("the server lock was not held at release".into())
}

#[async_trait]
impl Contender for SqlRawLock {
    /// One waiting acquire and release of `key`'s server lock.
    async fn cycle(&self, key: &str) -> Result<(), LockError> {
        let key = LockKey::new(key)?;
        let exchange = self.exchange(&key);
        bare::timed(&self.config, self.label, Operation::Acquire, &key, exchange).await
    }
}

/// The raw server lock of a session-mode URL (`mode=session`), one bare
/// connection: `Ok(None)` for a URL of any other mode (row mode's lock is
/// a row, not a server lock).
///
/// # Errors
///
/// As [`SqlRawLock::connect`].
///
/// # Cancel safety
///
/// As [`SqlRawLock::connect`].
pub async fn raw_lock_of_session_url(url: &str) -> Result<Option<SqlRawLock>, LockError> {
    if SqlConfig::from_url(url)?.lock_mode() != lock_sql::SqlMode::Session {
        return Ok(None);
    }
    SqlRawLock::connect(url).await.map(Some)
}
