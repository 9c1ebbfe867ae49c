//! The raw floor of one permit acquire+release (see the module docs of
//! `floor`).

use std::time::Duration;

use async_trait::async_trait;
use conformance::floor::{FloorGrant, RawFloor};
use lock_core::{ErrorKind, HolderDetails, LeaseKind, LockError, LockShape, Operation};
use lock_sql::sqlx::{self, Row};
use lock_sql::{SqlConfig, SqlDialect, SqlMode};
use tokio::sync::Mutex;

use super::bare::{Bare, BareExt, Text, micros, on_conn, quoted, sql};
use super::{DETAILS_LEN, NAME, lease_sql};

/// `count` of `limit` permits of a semaphore, by hand on one bare
/// connection: the floor a permit acquire+release of the driver is measured
/// against. The driver's tables, and statements written here with the same
/// text as the driver's, issued one after the other:
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
/// use conformance::floor::RawFloor;
/// use lock_bench::sql::SqlPermitFloor;
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
    conn: Mutex<Bare>,
    sql: PermitSql,
    channel: String,
    count: i64,
    limit: i64,
    code: String,
}

/// The statements of one permit cycle, as the driver's shared tables
/// spell them.
#[derive(Debug)]
pub(super) struct PermitSql {
    pub(super) begin: Text,
    pub(super) commit: Text,
    pub(super) rollback: Text,
    /// Binds name, shape, 1; returns `(token, epoch)` (PostgreSQL,
    /// SQLite).
    pub(super) bump: Text,
    /// MySQL: the bump returns nothing; this locks the row and reads it
    /// (binds name, shape).
    pub(super) read_bump: Option<Text>,
    /// Binds name, shape, name, shape: `(0 holder | 1 waiter, owner, kind,
    /// cnt, lim, token | id, live)`.
    pub(super) state: Text,
    /// Binds name, shape, owner, kind, count, limit, token, TTL µs,
    /// details.
    pub(super) insert: Text,
    /// Binds name, shape, owner, token, kind[, channel]: a row per delete
    /// on PostgreSQL (its notification), a count elsewhere.
    pub(super) release: Text,
}

/// The shared tables' `CREATE`s (as the driver's) and the cycle's
/// statements, for `dialect` on validated lease table `table`.
pub(super) fn permit_sql(dialect: SqlDialect, table: &str) -> (Vec<Text>, PermitSql) {
    let named = |suffix: &str| quoted(dialect, &format!("{table}{suffix}"));
    let last = table.rsplit('.').next().unwrap_or(table);
    let (keys, holders, waiters) = (named("_keys"), named("_holders"), named("_waiters"));
    let index = quoted(dialect, &format!("{last}_waiters_by_key"));
    // `p(n)`: the dialect's n-th placeholder.
    let live = |now: &str, int: &str, p: fn(usize) -> String| -> Text {
        let (p1, p2, p3, p4) = (p(1), p(2), p(3), p(4));
        let text = format!(
            "SELECT CAST(0 AS {int}), owner, kind, cnt, lim, token, \
             CAST(CASE WHEN expires_at > {now} THEN 1 ELSE 0 END AS {int}) \
             FROM {holders} WHERE name = {p1} AND shape = {p2} \
             UNION ALL \
             SELECT CAST(1 AS {int}), owner, kind, cnt, lim, id, \
             CAST(CASE WHEN expires_at > {now} THEN 1 ELSE 0 END AS {int}) \
             FROM {waiters} WHERE name = {p3} AND shape = {p4}"
        );
        text.into()
    };
    let columns = "(name, shape, owner, kind, cnt, lim, token, expires_at, details)";
    let (create, sql) = match dialect {
        SqlDialect::Postgres => (
            vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {keys} (name VARCHAR(1024) NOT NULL, \
                         shape VARCHAR(16) NOT NULL, token BIGINT NOT NULL, epoch BIGINT NOT NULL, \
                         PRIMARY KEY (name, shape))"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {holders} (name VARCHAR(1024) NOT NULL, \
                         shape VARCHAR(16) NOT NULL, owner VARCHAR(64) NOT NULL, \
                         kind VARCHAR(32) NOT NULL, cnt BIGINT NOT NULL, lim BIGINT NOT NULL, \
                         token BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, \
                         details VARCHAR({DETAILS_LEN}), PRIMARY KEY (name, shape, owner))"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {waiters} (id BIGSERIAL PRIMARY KEY, \
                         name VARCHAR(1024) NOT NULL, shape VARCHAR(16) NOT NULL, \
                         owner VARCHAR(64) NOT NULL, kind VARCHAR(32) NOT NULL, cnt BIGINT NOT NULL, \
                         lim BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL)"
                ),
                format!("CREATE INDEX IF NOT EXISTS {index} ON {waiters} (name, shape, id)"),
            ],
            PermitSql {
                begin: "BEGIN".into(),
                commit: "COMMIT".into(),
                rollback: "ROLLBACK".into(),
                bump: format!(
                    "INSERT INTO {keys} AS k (name, shape, token, epoch) VALUES ($1, $2, $3, 0) \
                         ON CONFLICT (name, shape) DO UPDATE SET token = k.token + excluded.token \
                         RETURNING token, epoch"
                )
                .into(),
                read_bump: None,
                state: live("now()", "BIGINT", |i| format!("${i}")),
                insert: format!(
                    "INSERT INTO {holders} {columns} VALUES ($1, $2, $3, $4, $5, $6, $7, \
                         now() + $8 * INTERVAL '1 microsecond', $9)"
                )
                .into(),
                release: format!(
                    "WITH changed AS (DELETE FROM {holders} WHERE name = $1 AND shape = $2 \
                         AND owner = $3 AND token = $4 AND kind = $5 AND expires_at > now() \
                         RETURNING name) SELECT pg_notify($6, name) FROM changed"
                )
                .into(),
            },
        ),
        SqlDialect::MySql => {
            let now = "UTC_TIMESTAMP(6)";
            (
                vec![
                    format!(
                        "CREATE TABLE IF NOT EXISTS {keys} (name VARBINARY(1024) NOT NULL, \
                         shape VARCHAR(16) NOT NULL, token BIGINT NOT NULL, epoch BIGINT NOT NULL, \
                         PRIMARY KEY (name, shape)) ENGINE=InnoDB"
                    ),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {holders} (name VARBINARY(1024) NOT NULL, \
                         shape VARCHAR(16) NOT NULL, owner VARCHAR(64) NOT NULL, \
                         kind VARCHAR(32) NOT NULL, cnt BIGINT NOT NULL, lim BIGINT NOT NULL, \
                         token BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, \
                         details VARCHAR({DETAILS_LEN}) NULL, PRIMARY KEY (name, shape, owner)) \
                         ENGINE=InnoDB"
                    ),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {waiters} (id BIGINT NOT NULL AUTO_INCREMENT \
                         PRIMARY KEY, name VARBINARY(1024) NOT NULL, shape VARCHAR(16) NOT NULL, \
                         owner VARCHAR(64) NOT NULL, kind VARCHAR(32) NOT NULL, cnt BIGINT NOT NULL, \
                         lim BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, \
                         INDEX {index} (name, shape, id)) ENGINE=InnoDB"
                    ),
                ],
                PermitSql {
                    begin: "BEGIN".into(),
                    commit: "COMMIT".into(),
                    rollback: "ROLLBACK".into(),
                    bump: format!(
                        "INSERT INTO {keys} (name, shape, token, epoch) VALUES (?, ?, ?, 0) \
                         ON DUPLICATE KEY UPDATE token = token + VALUES(token)"
                    )
                    .into(),
                    read_bump: Some(
                        format!(
                            "SELECT token, epoch FROM {keys} WHERE name = ? AND shape = ? FOR UPDATE"
                        )
                        .into(),
                    ),
                    state: live(now, "SIGNED", |_| "?".to_owned()),
                    insert: format!(
                        "INSERT INTO {holders} {columns} VALUES (?, ?, ?, ?, ?, ?, ?, \
                         {now} + INTERVAL ? MICROSECOND, ?)"
                    )
                    .into(),
                    release: format!(
                        "DELETE FROM {holders} WHERE name = ? AND shape = ? AND owner = ? \
                         AND token = ? AND kind = ? AND expires_at > {now}"
                    )
                    .into(),
                },
            )
        }
        // The shared tables' "now" is SQLite's own clock (the host's).
        // SQLite (the third of the driver's dialects).
        _ => {
            let now = "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)";
            let waiters_here = quoted(dialect, &format!("{last}_waiters"));
            let index_here = named("_waiters_by_key");
            (
                vec![
                    format!(
                        "CREATE TABLE IF NOT EXISTS {keys} (name TEXT NOT NULL, shape TEXT NOT NULL, \
                         token INTEGER NOT NULL, epoch INTEGER NOT NULL, PRIMARY KEY (name, shape)) \
                         WITHOUT ROWID"
                    ),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {holders} (name TEXT NOT NULL, shape TEXT NOT NULL, \
                         owner TEXT NOT NULL, kind TEXT NOT NULL, cnt INTEGER NOT NULL, \
                         lim INTEGER NOT NULL, token INTEGER NOT NULL, expires_at INTEGER NOT NULL, \
                         details TEXT, PRIMARY KEY (name, shape, owner)) WITHOUT ROWID"
                    ),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {waiters} (id INTEGER PRIMARY KEY AUTOINCREMENT, \
                         name TEXT NOT NULL, shape TEXT NOT NULL, owner TEXT NOT NULL, \
                         kind TEXT NOT NULL, cnt INTEGER NOT NULL, lim INTEGER NOT NULL, \
                         expires_at INTEGER NOT NULL)"
                    ),
                    format!(
                        "CREATE INDEX IF NOT EXISTS {index_here} ON {waiters_here} (name, shape, id)"
                    ),
                ],
                PermitSql {
                    begin: "BEGIN IMMEDIATE".into(),
                    commit: "COMMIT".into(),
                    rollback: "ROLLBACK".into(),
                    bump: format!(
                        "INSERT INTO {keys} AS k (name, shape, token, epoch) VALUES (?1, ?2, ?3, 0) \
                         ON CONFLICT (name, shape) DO UPDATE SET token = k.token + excluded.token \
                         RETURNING token, epoch"
                    )
                    .into(),
                    read_bump: None,
                    state: live(now, "BIGINT", |i| format!("?{i}")),
                    insert: format!(
                        "INSERT INTO {holders} {columns} VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, \
                         ({now} + ?8), ?9)"
                    )
                    .into(),
                    release: format!(
                        "DELETE FROM {holders} WHERE name = ?1 AND shape = ?2 AND owner = ?3 \
                         AND token = ?4 AND kind = ?5 AND expires_at > {now}"
                    )
                    .into(),
                },
            )
        }
    };
    (create.into_iter().map(Text::from).collect(), sql)
}

impl SqlPermitFloor {
    /// Opens one connection to the database named by `url` (the driver's
    /// URL syntax and options) and creates the driver's tables on it if
    /// needed; each cycle takes `count` of `limit` permits.
    ///
    /// # Errors
    ///
    /// As [`SqlBackend::connect_url`](lock_sql::SqlBackend::connect_url);
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
        if config.lock_mode() == SqlMode::Session {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                Operation::Connect,
                "session mode has no semaphores (row mode's tables only)",
            )
            .with_backend(NAME));
        }
        let (lease_table, _, _) = lease_sql(config.dialect(), config.table_name());
        let (shared, sql) = permit_sql(config.dialect(), config.table_name());
        let create: Vec<Text> = lease_table.into_iter().chain(shared).collect();
        let conn = Bare::open(&config, &create).await?;
        Ok(Self {
            channel: format!("distlock_{}", config.table_name().replace('.', "_")),
            conn: Mutex::new(conn),
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
        conn: &mut Bare,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<i64>, sqlx::Error> {
        let (s, shape) = (&self.sql, LockShape::Semaphore.as_str());
        let details = HolderDetails::encode_current();
        conn.run(&s.begin).await?;
        on_conn!(conn, |c| {
            let bump = sqlx::query(sql(&s.bump)).bind(name).bind(shape).bind(1_i64);
            let row = match &s.read_bump {
                None => bump.fetch_optional(&mut *c).await?,
                Some(read) => {
                    bump.execute(&mut *c).await?;
                    let read = sqlx::query(sql(read)).bind(name).bind(shape);
                    read.fetch_optional(&mut *c).await?
                }
            };
            let token: Option<i64> = row.map(|r| r.try_get(0)).transpose()?;
            let state = sqlx::query(sql(&s.state))
                .bind(name)
                .bind(shape)
                .bind(name)
                .bind(shape);
            let (mut held, mut fits) = (0_i64, true);
            for r in state.fetch_all(&mut *c).await? {
                let (waiter, cnt, lim, live): (i64, i64, i64, i64) =
                    (r.try_get(0)?, r.try_get(3)?, r.try_get(4)?, r.try_get(6)?);
                fits &= waiter == 0 && live == 1 && lim == self.limit;
                held += if waiter == 0 { cnt } else { 0 };
            }
            let granted = match token {
                Some(token) if fits && held + self.count <= self.limit => {
                    sqlx::query(sql(&s.insert))
                        .bind(name)
                        .bind(shape)
                        .bind(owner)
                        .bind(&self.code)
                        .bind(self.count)
                        .bind(self.limit)
                        .bind(token)
                        .bind(micros(ttl))
                        .bind(details)
                        .execute(&mut *c)
                        .await?;
                    Some(token)
                }
                _ => None,
            };
            sqlx::query(sql(&s.commit)).execute(&mut *c).await?;
            Ok(granted)
        })
    }

    /// The guarded delete of our holder row: whether it matched.
    async fn release_row(&self, name: &str, owner: &str, token: i64) -> Result<bool, sqlx::Error> {
        let shape = LockShape::Semaphore.as_str();
        let mut conn = self.conn.lock().await;
        Ok(match &mut *conn {
            Bare::Postgres(c) => {
                let q = sqlx::query(sql(&self.sql.release)).bind(name).bind(shape);
                let q = q
                    .bind(owner)
                    .bind(token)
                    .bind(&self.code)
                    .bind(&self.channel);
                q.fetch_all(c).await?.len() == 1
            }
            Bare::PostgresPooled(_) => return Err(super::bare::pooled()),
            Bare::MySql(c) => {
                let q = sqlx::query(sql(&self.sql.release)).bind(name).bind(shape);
                let q = q.bind(owner).bind(token).bind(&self.code);
                q.execute(c).await?.rows_affected() == 1
            }
            Bare::Sqlite(c) => {
                let q = sqlx::query(sql(&self.sql.release)).bind(name).bind(shape);
                let q = q.bind(owner).bind(token).bind(&self.code);
                q.execute(c).await?.rows_affected() == 1
            }
        })
    }
}

#[async_trait]
impl RawFloor for SqlPermitFloor {
    fn name(&self) -> &'static str {
        self.config.dialect().as_str()
    }

    /// BEGIN, the key row (MySQL: 2), the state, the holder, COMMIT; the
    /// release.
    fn round_trips_per_cycle(&self) -> u32 {
        if self.sql.read_bump.is_some() { 7 } else { 6 }
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        let (key, owner) = super::bare::grant_args(super::bare::ROW, key, ttl)?;
        let grant = async {
            let mut conn = self.conn.lock().await;
            let result = self.grant(&mut conn, key.as_str(), &owner, ttl).await;
            if result.is_err() {
                let _ = conn.run(&self.sql.rollback).await;
            }
            result
        };
        let token = super::bare::timed(
            &self.config,
            super::bare::ROW,
            Operation::TryAcquire,
            &key,
            grant,
        )
        .await?;
        Ok(super::bare::granted(&key, owner, token))
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        let (key, token) = super::bare::release_args(grant)?;
        let release = self.release_row(key.as_str(), &grant.owner, token);
        super::bare::timed(
            &self.config,
            super::bare::ROW,
            Operation::Release,
            &key,
            release,
        )
        .await
    }
}
