//! The raw floor of one permit acquire+release (see the module docs of
//! `floor`).

use std::time::Duration;

use async_trait::async_trait;
use lock_core::floor::{FloorGrant, RawFloor};
use lock_core::{
    ErrorKind, LeaseKind, LockError, LockKey, LockShape, Operation, OwnerId, check_ttl,
    with_timeout,
};
use tokio::sync::Mutex;

use crate::config::SqlConfig;
use crate::conn::DbConn;
use crate::dialect::{self, Dialect, micros};
use crate::driver::{MIN_TTL, NAME};
use crate::error::map_sqlx;
use crate::shared::run::{Bind, execute, fetch};
use crate::shared::sql::SharedSql;
use crate::sql::{Statements, pg_channel};

/// `count` of `limit` permits of a semaphore, by hand on one bare
/// connection: the floor a permit acquire+release of the driver is measured
/// against. The driver's tables and statement texts, issued one after the
/// other:
///
/// 1. `BEGIN` (SQLite `BEGIN IMMEDIATE`);
/// 2. the key's counter row, created if missing, locked and bumped
///    (`INSERT .. ON CONFLICT DO UPDATE .. RETURNING`; MySQL/MariaDB
///    `INSERT .. ON DUPLICATE KEY UPDATE` then `SELECT .. FOR UPDATE`);
/// 3. the key's holders and waiters (one `SELECT .. UNION ALL ..`);
/// 4. the holder row (`INSERT`), when the live permits plus `count` fit
///    `limit` and nobody waits;
/// 5. `COMMIT`;
///
/// and the release: one guarded `DELETE` of the holder row (with
/// `pg_notify` on PostgreSQL). Six round trips per cycle (seven on
/// MySQL/MariaDB), after the connection's first use of each statement.
/// A key with expired holder rows, waiters or another limit is refused
/// (`None`) rather than decided: the floor measures the uncontended cycle.
/// Its permits count against the driver's on the same key and table.
///
/// Build it with [`connect`](Self::connect): a driver URL and the permits
/// per cycle (the descriptor's contract is 1 of 4).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lock_core::floor::RawFloor;
/// use lock_sql::floor::SqlPermitFloor;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let floor = SqlPermitFloor::connect("sqlite::memory:", 1, 4).await?;
/// assert_eq!(floor.round_trips_per_cycle(), 6);
/// floor.cycle("bench/sem", Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SqlPermitFloor {
    config: SqlConfig,
    dialect: &'static dyn Dialect,
    conn: Mutex<DbConn>,
    sql: SharedSql,
    channel: String,
    count: i64,
    limit: i64,
    code: String,
}

impl SqlPermitFloor {
    /// Opens one connection to the database named by `url` (the driver's
    /// URL syntax and options) and creates the driver's tables on it if
    /// needed; each cycle takes `count` of `limit` permits.
    ///
    /// # Errors
    ///
    /// As [`SqlBackend::connect_url`](crate::SqlBackend::connect_url);
    /// `InvalidArgument` for bad counts ([`LeaseKind::permits`]);
    /// `Unsupported` for a `mode=session` URL (no semaphores there).
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes whatever was opened. Tables created
    /// meanwhile stay (creation is idempotent).
    pub async fn connect(url: &str, count: u32, limit: u32) -> Result<Self, LockError> {
        let kind = LeaseKind::permits(count, limit).map_err(|e| e.with_backend(NAME))?;
        let config = SqlConfig::from_url(url)?;
        if config.lock_mode() == crate::SqlMode::Session {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                Operation::Connect,
                "session mode has no semaphores (row mode's tables only)",
            )
            .with_backend(NAME));
        }
        let dialect = dialect::of(config.dialect)?;
        let options = dialect.connect_options(&config)?;
        let sql = SharedSql::new(dialect, &config.table);
        let err = |e| map_sqlx(&config, Operation::Connect, e).with_backend(NAME);
        let mut conn = with_timeout(config.op_timeout, Operation::Connect, async {
            options.connect().await.map_err(err)
        })
        .await?;
        if config.create_table {
            let lease_table = Statements::new(dialect, &config.table).create;
            for create in lease_table.iter().chain(&sql.create) {
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
            sql,
            count: i64::from(count),
            limit: i64::from(limit),
            code: kind.code(),
            config,
        })
    }

    /// The grant transaction: `Some(token)` when granted.
    async fn grant(
        &self,
        conn: &mut DbConn,
        key: &LockKey,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<i64>, sqlx::Error> {
        let (name, shape) = (key.as_str(), LockShape::Semaphore.as_str());
        let by_key = [Bind::Text(name), Bind::Text(shape)];
        let sql = &self.sql;
        execute(conn, &sql.begin, &[]).await?;
        let mut token = None;
        for (i, statement) in sql.lock_key.iter().enumerate() {
            let first = [by_key[0], by_key[1], Bind::Int(1)];
            let binds: &[Bind<'_>] = if i == 0 { &first } else { &by_key };
            if i + 1 == sql.lock_key.len() {
                token = fetch(conn, statement, binds, "ii")
                    .await?
                    .first()
                    .map(|r| r[0].int());
            } else {
                execute(conn, statement, binds).await?;
            }
        }
        let rows = fetch(
            conn,
            &sql.state,
            &[by_key[0], by_key[1], by_key[0], by_key[1]],
            "ittiiii",
        )
        .await?;
        let held: i64 = rows
            .iter()
            .filter(|r| r[0].int() == 0)
            .map(|r| r[3].int())
            .sum();
        let fits = rows
            .iter()
            .all(|r| r[0].int() == 0 && r[6].int() == 1 && r[4].int() == self.limit)
            && held + self.count <= self.limit;
        let granted = match token {
            Some(token) if fits => {
                // The driver's insert: the holder's details included.
                let details = lock_core::HolderDetails::encode_current();
                let binds = [
                    by_key[0],
                    by_key[1],
                    Bind::Text(owner),
                    Bind::Text(&self.code),
                    Bind::Int(self.count),
                    Bind::Int(self.limit),
                    Bind::Int(token),
                    Bind::Int(micros(ttl)),
                    Bind::Text(&details),
                ];
                execute(conn, &sql.insert_holder, &binds).await?;
                Some(token)
            }
            _ => None,
        };
        execute(conn, &sql.commit, &[]).await?;
        Ok(granted)
    }
}

#[async_trait]
impl RawFloor for SqlPermitFloor {
    fn name(&self) -> &'static str {
        self.dialect.name()
    }

    /// BEGIN, the key row (MySQL: 2), the state, the holder, COMMIT; the
    /// release.
    fn round_trips_per_cycle(&self) -> u32 {
        let lock = u32::try_from(self.sql.lock_key.len()).unwrap_or(1);
        5 + lock
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        let key = LockKey::new(key)?;
        let operation = Operation::TryAcquire;
        check_ttl(ttl, MIN_TTL, operation).map_err(|e| e.with_key(&key).with_backend(NAME))?;
        let owner = OwnerId::random().to_hex();
        let token = with_timeout(self.config.op_timeout, operation, async {
            let mut conn = self.conn.lock().await;
            let result = self.grant(&mut conn, &key, &owner, ttl).await;
            if result.is_err() {
                let _ = execute(&mut conn, &self.sql.rollback, &[]).await;
            }
            result.map_err(|e| map_sqlx(&self.config, operation, e).with_key(&key))
        })
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
        let operation = Operation::Release;
        let token = i64::try_from(grant.token).map_err(|_| {
            LockError::new(
                ErrorKind::InvalidArgument,
                operation,
                "a SQL token fits in a BIGINT",
            )
            .with_key(&key)
            .with_backend(NAME)
        })?;
        let sql = &self.sql;
        let mut binds = vec![
            Bind::Text(key.as_str()),
            Bind::Text(LockShape::Semaphore.as_str()),
            Bind::Text(&grant.owner),
            Bind::Int(token),
            Bind::Text(&self.code),
        ];
        if sql.notifies {
            binds.push(Bind::Text(&self.channel));
        }
        with_timeout(self.config.op_timeout, operation, async {
            let mut conn = self.conn.lock().await;
            let changed = if sql.notifies {
                fetch(&mut conn, &sql.release, &binds, "")
                    .await
                    .map(|rows| rows.len() as u64)
            } else {
                execute(&mut conn, &sql.release, &binds).await
            };
            changed
                .map(|n| n == 1)
                .map_err(|e| map_sqlx(&self.config, operation, e).with_key(&key))
        })
        .await
        .map_err(|e| e.with_key(&key).with_backend(NAME))
    }
}
