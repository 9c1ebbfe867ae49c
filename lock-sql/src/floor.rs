//! The raw floor of an acquire+release cycle, for benchmarks.
//!
//! [`SqlFloor::cycle`] issues exactly the two statements of the driver's
//! uncontended path, by hand on the same kind of sqlx pool: the grant
//! (`INSERT .. ON CONFLICT`/`ON DUPLICATE KEY UPDATE`, see the crate docs)
//! and the guarded release (`UPDATE .. WHERE name, owner, token match and
//! the row has not expired`, with `pg_notify` on PostgreSQL). That is two
//! round trips per cycle, the same as [`SqlBackend`]'s `try_acquire` +
//! `release`, without the driver's bookkeeping (lease objects, validity
//! deadlines, retries of statements that lost a deadlock, local wake-ups).
//!
//! It exists so benchmarks (`distlock compare`, this crate's `bench`
//! example) can report "ours / floor" ratios measured in one run. It is not
//! a lock API: use [`SqlBackend`] for that.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{ErrorKind, LockError, LockKey, Operation, OwnerId, check_ttl, with_timeout};
use sqlx::AssertSqlSafe;
#[allow(unused_imports)] // unused when only the MySQL dialect is compiled in
use sqlx::Row;

#[allow(unused_imports)] // used by the SQLite dialect only
use crate::driver::unix_micros;
use crate::driver::{DbPool, MIN_TTL, NAME, SqlBackend, micros};
use crate::error::map_sqlx;

/// Hand-issued grant + release statements on a [`SqlBackend`]'s pool: the
/// floor our acquire+release cycle is measured against.
///
/// Cheap to clone (clones share the pool).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lock_sql::floor::SqlFloor;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let floor = SqlFloor::connect("sqlite::memory:").await?;
/// floor.cycle("bench/0", Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct SqlFloor {
    backend: SqlBackend,
    /// PostgreSQL's release notification channel, computed once.
    channel: Arc<str>,
}

impl SqlFloor {
    /// Connects like [`crate::connect`] (same URL syntax and options) and
    /// creates the lease table if needed, exactly as the driver does.
    ///
    /// # Errors
    ///
    /// As [`SqlBackend::connect_url`].
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes whatever was opened. A table created
    /// meanwhile stays (creation is idempotent).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Ok(Self::from_backend(&SqlBackend::connect_url(url).await?))
    }

    /// The floor on an existing backend's pool (and table), so ours and the
    /// floor share connections.
    pub fn from_backend(backend: &SqlBackend) -> Self {
        Self {
            backend: backend.clone(),
            channel: Arc::from(crate::sql::pg_channel(backend.config().table_name())),
        }
    }

    /// The backend whose pool and table this floor uses.
    pub fn backend(&self) -> &SqlBackend {
        &self.backend
    }

    /// One grant + one release of `key` by hand: the grant statement (must
    /// insert the row or take over an expired one) and the guarded release
    /// statement, each bounded by the configured operation timeout.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for a key or TTL the driver would
    /// refuse; [`ErrorKind::Contended`] when someone holds `key` (the floor
    /// never waits); [`ErrorKind::NotHeld`] when the release matched no row
    /// (the TTL ran out mid-cycle, or another client took the row); the
    /// driver's kinds (`Unavailable`, `Timeout`, `Backend`) for database
    /// failures.
    ///
    /// # Cancel safety
    ///
    /// Not a lock API: dropping the future after the grant committed leaves
    /// the row held until `ttl` passes (later cycles on `key` fail with
    /// `Contended` until then). Nothing else is left behind.
    pub async fn cycle(&self, key: &str, ttl: Duration) -> Result<(), LockError> {
        let key = LockKey::new(key)?;
        check_ttl(ttl, MIN_TTL, Operation::TryAcquire)
            .map_err(|e| e.with_key(&key).with_backend(NAME))?;
        let owner = OwnerId::random().to_hex();
        let timeout = self.backend.config().timeout();
        let token = with_timeout(
            timeout,
            Operation::TryAcquire,
            self.grant(&key, &owner, ttl),
        )
        .await
        .map_err(|e| e.with_key(&key).with_backend(NAME))?
        .ok_or_else(|| {
            LockError::new(
                ErrorKind::Contended,
                Operation::TryAcquire,
                "the floor's key is held by another owner",
            )
            .with_key(&key)
            .with_backend(NAME)
        })?;
        let released = with_timeout(
            timeout,
            Operation::Release,
            self.release(&key, &owner, token),
        )
        .await
        .map_err(|e| e.with_key(&key).with_backend(NAME))?;
        if released {
            Ok(())
        } else {
            Err(LockError::new(
                ErrorKind::NotHeld,
                Operation::Release,
                "the floor's release matched no row (expired or taken over)",
            )
            .with_key(&key)
            .with_backend(NAME))
        }
    }

    /// The grant statement: `Some(token)` when granted, `None` when held.
    async fn grant(
        &self,
        key: &LockKey,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<i64>, LockError> {
        let sql = AssertSqlSafe(Arc::clone(&self.backend.statements().grant));
        let ttl_us = micros(ttl);
        let err = |e| map_sqlx(self.backend.config(), Operation::TryAcquire, e);
        let token = match self.backend.pool() {
            #[cfg(feature = "postgres")]
            DbPool::Postgres(pool) => sqlx::query(sql)
                .bind(key.as_str())
                .bind(owner)
                .bind(ttl_us)
                .fetch_optional(pool)
                .await
                .map_err(err)?
                .map(|row| row.try_get::<i64, _>(0))
                .transpose()
                .map_err(err)?,
            #[cfg(feature = "mysql")]
            DbPool::MySql(pool) => {
                let done = sqlx::query(sql)
                    .bind(key.as_str().as_bytes())
                    .bind(owner)
                    .bind(ttl_us)
                    .execute(pool)
                    .await
                    .map_err(err)?;
                // LAST_INSERT_ID(expr): the new token, or 0 when held.
                match done.last_insert_id() {
                    0 => None,
                    token => Some(i64::try_from(token).unwrap_or(i64::MAX)),
                }
            }
            #[cfg(feature = "sqlite")]
            DbPool::Sqlite(pool) => sqlx::query(sql)
                .bind(key.as_str())
                .bind(owner)
                .bind(unix_micros())
                .bind(ttl_us)
                .fetch_optional(pool)
                .await
                .map_err(err)?
                .map(|row| row.try_get::<i64, _>(0))
                .transpose()
                .map_err(err)?,
        };
        Ok(token)
    }

    /// The guarded release statement: whether it matched our row.
    async fn release(&self, key: &LockKey, owner: &str, token: i64) -> Result<bool, LockError> {
        let sql = AssertSqlSafe(Arc::clone(&self.backend.statements().release));
        let err = |e| map_sqlx(self.backend.config(), Operation::Release, e);
        let released = match self.backend.pool() {
            #[cfg(feature = "postgres")]
            DbPool::Postgres(pool) => sqlx::query(sql)
                .bind(key.as_str())
                .bind(owner)
                .bind(token)
                .bind(&*self.channel)
                .fetch_optional(pool)
                .await
                .map_err(err)?
                .is_some(),
            #[cfg(feature = "mysql")]
            DbPool::MySql(pool) => {
                sqlx::query(sql)
                    .bind(key.as_str().as_bytes())
                    .bind(owner)
                    .bind(token)
                    .execute(pool)
                    .await
                    .map_err(err)?
                    .rows_affected()
                    == 1
            }
            #[cfg(feature = "sqlite")]
            DbPool::Sqlite(pool) => {
                sqlx::query(sql)
                    .bind(key.as_str())
                    .bind(owner)
                    .bind(token)
                    .bind(unix_micros())
                    .execute(pool)
                    .await
                    .map_err(err)?
                    .rows_affected()
                    == 1
            }
        };
        Ok(released)
    }
}
