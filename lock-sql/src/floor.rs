//! The raw floor of an acquire+release cycle, for benchmarks.
//!
//! [`SqlFloor`] opens **one bare sqlx connection** of its own (never the
//! driver's connections or any pool), creates the lease table as the driver
//! does when it is missing, and issues the driver's two statements by hand
//! on that connection, with the same SQL text and the same binds:
//!
//! 1. the grant (`INSERT .. ON CONFLICT`/`ON DUPLICATE KEY UPDATE`, see the
//!    crate docs): one round trip;
//! 2. the guarded release (`UPDATE .. WHERE name, owner, token match and
//!    the row has not expired`, with `pg_notify` on PostgreSQL): one round
//!    trip.
//!
//! Two round trips per cycle (after the connection's first use of each
//! statement, which sqlx prepares once). Nothing else: no retries, no
//! reconnection, no lease objects, no wake-ups. It exists so benchmarks
//! (`distlock compare`, this crate's `bench` example) can report "ours /
//! floor" ratios. It is not a lock API: use [`SqlBackend`](crate::SqlBackend).
//!
//! [`SqlPermitFloor`] is the same for one permit grant and release of a
//! semaphore (row mode's shared tables): six round trips per cycle (seven
//! on MySQL/MariaDB), see its docs.

mod permits;

use std::time::Duration;

use async_trait::async_trait;
use lock_core::floor::{FloorGrant, RawFloor};
use lock_core::{ErrorKind, LockError, LockKey, Operation, OwnerId, check_ttl, with_timeout};
use tokio::sync::Mutex;

use crate::config::SqlConfig;
use crate::conn::DbConn;
use crate::dialect::{self, Dialect};
use crate::driver::{MIN_TTL, NAME};
use crate::error::map_sqlx;
use crate::sql::{Statements, pg_channel};

pub use permits::SqlPermitFloor;

/// The driver's grant and guarded release, by hand on one bare connection.
///
/// Serves one call at a time (calls from several tasks queue on the
/// connection): eight independent clients are eight floors.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lock_core::floor::RawFloor;
/// use lock_sql::floor::SqlFloor;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let floor = SqlFloor::connect("sqlite::memory:").await?;
/// assert_eq!(floor.round_trips_per_cycle(), 2);
/// let grant = floor.try_grant("bench/0", Duration::from_secs(10)).await?.expect("free");
/// assert!(floor.release(&grant).await?);
/// floor.cycle("bench/0", Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SqlFloor {
    config: SqlConfig,
    dialect: &'static dyn Dialect,
    conn: Mutex<DbConn>,
    statements: Statements,
    channel: String,
}

impl SqlFloor {
    /// Opens one connection to the database named by `url` (the driver's
    /// URL syntax and options; `pool_size` is ignored) and creates the
    /// lease table on it if needed, exactly as the driver does.
    ///
    /// # Errors
    ///
    /// As [`SqlBackend::connect_url`](crate::SqlBackend::connect_url);
    /// [`ErrorKind::Config`] for `layout=shedlock` (no floor: the
    /// driver's descriptor reports none for it).
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes whatever was opened. A table created
    /// meanwhile stays (creation is idempotent).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = SqlConfig::from_url(url)?;
        if config.layout == crate::SqlLayout::ShedLock {
            // The floor is the lease table's two statements; ShedLock's
            // exchange is another one (its upsert plus the token side
            // table), which no hand-written floor reproduces here.
            return Err(LockError::config(
                "layout=shedlock has no benchmark floor: the floor runs the lease table's \
                 grant and release, which the ShedLock table does not have",
            )
            .with_backend(NAME));
        }
        let dialect = dialect::of(config.dialect)?;
        let options = dialect.connect_options(&config)?;
        let statements = Statements::new(dialect, &config.table);
        let err = |e| map_sqlx(&config, Operation::Connect, e).with_backend(NAME);
        let mut conn = with_timeout(config.op_timeout, Operation::Connect, async {
            options.connect().await.map_err(err)
        })
        .await?;
        if config.create_table {
            for create in &statements.create {
                with_timeout(config.op_timeout, Operation::Connect, async {
                    dialect.plain(&mut conn, create).await.map_err(err)
                })
                .await?;
            }
        }
        Ok(Self {
            channel: pg_channel(&config.table),
            conn: Mutex::new(conn),
            dialect,
            statements,
            config,
        })
    }

    /// One grant and its release of `key`: [`RawFloor::cycle`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for a key or TTL the driver would
    /// refuse; [`ErrorKind::Contended`] when someone holds `key` (the floor
    /// never waits); [`ErrorKind::NotHeld`] when the release matched no row;
    /// the driver's kinds (`Unavailable`, `Timeout`, `Backend`) for database
    /// failures.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the grant committed leaves the row held
    /// until `ttl` passes.
    pub async fn cycle(&self, key: &str, ttl: Duration) -> Result<(), LockError> {
        RawFloor::cycle(self, key, ttl).await
    }

    fn failed(&self, operation: Operation, key: &LockKey) -> impl Fn(sqlx::Error) -> LockError {
        move |e| {
            map_sqlx(&self.config, operation, e)
                .with_key(key)
                .with_backend(NAME)
        }
    }

    /// The grant statement: `Some(token)` when granted, `None` when held.
    async fn grant(
        &self,
        key: &LockKey,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<i64>, LockError> {
        let mut conn = self.conn.lock().await;
        self.dialect
            .grant(&mut conn, &self.statements.grant, key, owner, ttl, None)
            .await
            .map_err(self.failed(Operation::TryAcquire, key))
    }

    /// The guarded release statement: whether it matched our row.
    async fn release_row(&self, key: &LockKey, owner: &str, token: i64) -> Result<bool, LockError> {
        let mut conn = self.conn.lock().await;
        self.dialect
            .release(
                &mut conn,
                &self.statements.release,
                key,
                owner,
                token,
                &self.channel,
            )
            .await
            .map_err(self.failed(Operation::Release, key))
    }
}

#[async_trait]
impl RawFloor for SqlFloor {
    fn name(&self) -> &'static str {
        self.dialect.name()
    }

    /// The grant and the release: one statement each.
    fn round_trips_per_cycle(&self) -> u32 {
        2
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        let key = LockKey::new(key)?;
        check_ttl(ttl, MIN_TTL, Operation::TryAcquire)
            .map_err(|e| e.with_key(&key).with_backend(NAME))?;
        let owner = OwnerId::random().to_hex();
        let token = with_timeout(
            self.config.op_timeout,
            Operation::TryAcquire,
            self.grant(&key, &owner, ttl),
        )
        .await
        .map_err(|e| e.with_key(&key).with_backend(NAME))?;
        Ok(token.map(|token| FloorGrant {
            key: key.as_str().to_owned(),
            owner,
            token: u64::try_from(token).unwrap_or(0),
            handle: String::new(),
        }))
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        let key = LockKey::new(&grant.key)?;
        let token = i64::try_from(grant.token).map_err(|_| {
            LockError::new(
                ErrorKind::InvalidArgument,
                Operation::Release,
                "a SQL token fits in a BIGINT",
            )
            .with_key(&key)
            .with_backend(NAME)
        })?;
        with_timeout(
            self.config.op_timeout,
            Operation::Release,
            self.release_row(&key, &grant.owner, token),
        )
        .await
        .map_err(|e| e.with_key(&key).with_backend(NAME))
    }
}
