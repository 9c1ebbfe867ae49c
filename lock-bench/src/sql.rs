//! The SQL driver's raw floors (`lock_sql`), for benchmarks.
//!
//! [`SqlFloor`] opens **one bare sqlx connection** of its own and sends two
//! statements written here, by hand, with `sqlx::query` and hand-made
//! binds: none of the driver's code runs (not its connections, dialects,
//! statement texts or error retries; only its URL parsing, its connection
//! type's connect, and its mapping of sqlx errors to [`LockError`]). The statements are the ones the
//! driver's grant and release send, on the same lease table (created here,
//! as the driver creates it, when missing):
//!
//! 1. the grant (`INSERT .. ON CONFLICT`/`ON DUPLICATE KEY UPDATE`, see the
//!    crate docs): inserts the row or takes over an expired one, bumping
//!    the fencing token, the expiry on the database's clock; one round
//!    trip;
//! 2. the guarded release (`UPDATE .. WHERE name, owner, token match and
//!    the row has not expired`, with `pg_notify` on PostgreSQL): one round
//!    trip.
//!
//! Two round trips per cycle (after the connection's first use of each
//! statement, which sqlx prepares once). Nothing else: no retries, no
//! reconnection, no lease objects, no wake-ups. It exists so benchmarks
//! (`distlock-compare compare`, the `sql_bench` example) can report "ours /
//! floor" ratios. It is not a lock API: use [`SqlBackend`](lock_sql::SqlBackend).
//!
//! [`SqlPermitFloor`] is the same for one permit grant and release of a
//! semaphore (row mode's shared tables): six round trips per cycle (seven
//! on MySQL/MariaDB), see its docs. [`SessionFloor`] is session mode's
//! (advisory locks / `GET_LOCK`): two round trips per cycle.

mod bare;
mod permits;
mod raw;
mod session;

use std::time::Duration;

use crate::BoxFuture;
use async_trait::async_trait;
use conformance::floor::{FloorGrant, RawFloor};
use lock_core::{HolderDetails, LockError, Operation};
use lock_sql::sqlx::{self, Row};
use lock_sql::{SqlConfig, SqlDialect, SqlLayout, SqlMode};
use tokio::sync::Mutex;

use bare::{Bare, BareExt, Text, micros, quoted, sql, token_floor};

pub use permits::SqlPermitFloor;
pub use raw::{SqlRawLock, raw_lock_of_session_url};
pub use session::SessionFloor;

/// The driver's name, which the floors' errors carry.
const NAME: &str = "sql";

/// The floor of the backend a URL names: the session floor for
/// `mode=session`, none for `layout=shedlock` (see [`SqlFloor::connect`]),
/// the row floor otherwise.
///
/// # Errors
///
/// As [`SqlFloor::connect`] and [`SessionFloor::connect`].
pub fn floor(url: &str) -> BoxFuture<'_, Result<Option<Box<dyn RawFloor>>, LockError>> {
    Box::pin(async move {
        let config = SqlConfig::from_url(url)?;
        if config.table_layout() == SqlLayout::ShedLock {
            // No floor: benchmarks then show none, as for a driver without
            // one, instead of failing the row.
            return Ok(None);
        }
        let floor: Box<dyn RawFloor> = match config.lock_mode() {
            SqlMode::Session => Box::new(SessionFloor::connect(url).await?),
            _ => Box::new(SqlFloor::connect(url).await?),
        };
        Ok(Some(floor))
    })
}

/// One permit of a semaphore of 4, in row mode (session mode has no
/// semaphores: `Unsupported` before connecting).
async fn one_of_four(url: &str) -> Result<SqlPermitFloor, LockError> {
    SqlPermitFloor::connect(url, 1, 4).await
}

crate::floor_fn!(pub(crate) fn permit_floor = one_of_four);

/// The widest encoded holder details (the tables' `details` column).
const DETAILS_LEN: usize = lock_core::MAX_ENCODED_LEN;

/// The driver's grant and guarded release, by hand on one bare connection.
///
/// Serves one call at a time (calls from several tasks queue on the
/// connection): eight independent clients are eight floors.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use conformance::floor::RawFloor;
/// use lock_bench::sql::SqlFloor;
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
    conn: Mutex<Bare>,
    grant: Text,
    release: Text,
    channel: String,
}

/// The lease table's `CREATE` (as the driver's), its grant and its release
/// for `dialect` on validated table `table`.
fn lease_sql(dialect: SqlDialect, table: &str) -> ([Text; 2], Text, Text) {
    let t = quoted(dialect, table);
    let (first, create_floor) = token_floor(dialect, table);
    let (create, grant, release) = match dialect {
        SqlDialect::Postgres => (
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (name VARCHAR(1024) PRIMARY KEY, \
                 owner VARCHAR(64), token BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, \
                 details VARCHAR({DETAILS_LEN}), waiters_until TIMESTAMPTZ)"
            ),
            format!(
                "INSERT INTO {t} AS l (name, owner, token, expires_at, details) \
                 VALUES ($1, $2, {first}, now() + $3 * INTERVAL '1 microsecond', $4) \
                 ON CONFLICT (name) DO UPDATE \
                 SET owner = excluded.owner, token = l.token + 1, expires_at = excluded.expires_at, \
                 details = excluded.details \
                 WHERE l.expires_at <= now() \
                 RETURNING token"
            ),
            format!(
                "WITH r AS (UPDATE {t} SET owner = NULL, details = NULL, expires_at = now() \
                 WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > now() \
                 RETURNING name, waiters_until) \
                 SELECT CASE WHEN waiters_until > now() THEN pg_notify($4, name) END FROM r"
            ),
        ),
        SqlDialect::MySql => (
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (name VARBINARY(1024) NOT NULL PRIMARY KEY, \
                 owner VARCHAR(64) NULL, token BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, \
                 details VARCHAR({DETAILS_LEN}) NULL) ENGINE=InnoDB"
            ),
            // LAST_INSERT_ID(expr): the new token, or 0 when held.
            format!(
                "INSERT INTO {t} (name, owner, token, expires_at, details) \
                 VALUES (?, ?, LAST_INSERT_ID({first}), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?) \
                 ON DUPLICATE KEY UPDATE \
                 token = IF(expires_at <= UTC_TIMESTAMP(6), LAST_INSERT_ID(token + 1), token + LAST_INSERT_ID(0)), \
                 owner = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(owner), owner), \
                 details = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(details), details), \
                 expires_at = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(expires_at), expires_at)"
            ),
            format!(
                "UPDATE {t} SET owner = NULL, details = NULL, expires_at = UTC_TIMESTAMP(6) \
                 WHERE name = ? AND owner = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)"
            ),
        ),
        // SQLite's "now" is the host clock, bound by each statement.
        // SQLite (the third of the driver's dialects).
        _ => (
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (name TEXT NOT NULL PRIMARY KEY, owner TEXT, \
                 token INTEGER NOT NULL, expires_at INTEGER NOT NULL, details TEXT) WITHOUT ROWID"
            ),
            format!(
                "INSERT INTO {t} AS l (name, owner, token, expires_at, details) \
                 VALUES (?1, ?2, {first}, ?3 + ?4, ?5) \
                 ON CONFLICT (name) DO UPDATE \
                 SET owner = excluded.owner, token = l.token + 1, expires_at = excluded.expires_at, \
                 details = excluded.details \
                 WHERE l.expires_at <= ?3 \
                 RETURNING token"
            ),
            format!(
                "UPDATE {t} SET owner = NULL, details = NULL, expires_at = ?4 \
                 WHERE name = ?1 AND owner = ?2 AND token = ?3 AND expires_at > ?4"
            ),
        ),
    };
    ([create.into(), create_floor], grant.into(), release.into())
}

impl SqlFloor {
    /// Opens one connection to the database named by `url` (the driver's
    /// URL syntax and options; `pool_size` is ignored) and creates the
    /// lease table on it if needed, exactly as the driver does.
    ///
    /// # Errors
    ///
    /// As [`SqlBackend::connect_url`](lock_sql::SqlBackend::connect_url);
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for
    /// `layout=shedlock` (no floor: the driver's descriptor reports none
    /// for it).
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes whatever was opened. A table created
    /// meanwhile stays (creation is idempotent).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = SqlConfig::from_url(url)?;
        if config.table_layout() == SqlLayout::ShedLock {
            // The floor is the lease table's two statements; ShedLock's
            // exchange is another one (its upsert plus the token side
            // table), which no hand-written floor reproduces here.
            return Err(LockError::config(
                "layout=shedlock has no benchmark floor: the floor runs the lease table's \
                 grant and release, which the ShedLock table does not have",
            )
            .with_backend(NAME));
        }
        let (create, grant, release) = lease_sql(config.dialect(), config.table_name());
        let conn = Bare::open(&config, &create).await?;
        Ok(Self {
            channel: format!("distlock_{}", config.table_name().replace('.', "_")),
            conn: Mutex::new(conn),
            grant,
            release,
            config,
        })
    }

    /// One grant and its release of `key`: [`RawFloor::cycle`].
    ///
    /// # Errors
    ///
    /// [`InvalidArgument`](lock_core::ErrorKind::InvalidArgument) for a
    /// key or TTL the driver would refuse;
    /// [`Contended`](lock_core::ErrorKind::Contended) when someone holds
    /// `key` (the floor never waits);
    /// [`NotHeld`](lock_core::ErrorKind::NotHeld) when the release matched
    /// no row; the driver's kinds (`Unavailable`, `Timeout`, `Backend`) for
    /// database failures.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the grant committed leaves the row held
    /// until `ttl` passes.
    pub async fn cycle(&self, key: &str, ttl: Duration) -> Result<(), LockError> {
        RawFloor::cycle(self, key, ttl).await
    }

    /// The grant statement: `Some(token)` when granted, `None` when held.
    async fn grant(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<i64>, sqlx::Error> {
        let details = HolderDetails::encode_current();
        let row = match &mut *self.conn.lock().await {
            Bare::PostgresPooled(_) => return Err(bare::pooled()),
            Bare::Postgres(c) => {
                let q = sqlx::query(sql(&self.grant))
                    .bind(key)
                    .bind(owner)
                    .bind(micros(ttl))
                    .bind(details);
                q.fetch_optional(c).await?.map(|row| row.try_get(0))
            }
            Bare::MySql(c) => {
                let q = sqlx::query(sql(&self.grant))
                    .bind(key.as_bytes())
                    .bind(owner);
                let done = q.bind(micros(ttl)).bind(details).execute(c).await?;
                return Ok(match done.last_insert_id() {
                    0 => None,
                    token => Some(i64::try_from(token).unwrap_or(i64::MAX)),
                });
            }
            Bare::Sqlite(c) => {
                let q = sqlx::query(sql(&self.grant)).bind(key).bind(owner);
                let q = q.bind(bare::unix_micros()).bind(micros(ttl)).bind(details);
                q.fetch_optional(c).await?.map(|row| row.try_get(0))
            }
        };
        row.transpose()
    }

    /// The guarded release statement: whether it matched our row.
    async fn release_row(&self, key: &str, owner: &str, token: i64) -> Result<bool, sqlx::Error> {
        Ok(match &mut *self.conn.lock().await {
            Bare::PostgresPooled(_) => return Err(bare::pooled()),
            Bare::Postgres(c) => {
                let q = sqlx::query(sql(&self.release))
                    .bind(key)
                    .bind(owner)
                    .bind(token)
                    .bind(&self.channel);
                q.fetch_optional(c).await?.is_some()
            }
            Bare::MySql(c) => {
                let q = sqlx::query(sql(&self.release)).bind(key.as_bytes());
                q.bind(owner).bind(token).execute(c).await?.rows_affected() == 1
            }
            Bare::Sqlite(c) => {
                let q = sqlx::query(sql(&self.release)).bind(key).bind(owner);
                let q = q.bind(token).bind(bare::unix_micros());
                q.execute(c).await?.rows_affected() == 1
            }
        })
    }
}

#[async_trait]
impl RawFloor for SqlFloor {
    fn name(&self) -> &'static str {
        self.config.dialect().as_str()
    }

    /// The grant and the release: one statement each.
    fn round_trips_per_cycle(&self) -> u32 {
        2
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        let (key, owner) = bare::grant_args(bare::ROW, key, ttl)?;
        let grant = self.grant(key.as_str(), &owner, ttl);
        let token =
            bare::timed(&self.config, bare::ROW, Operation::TryAcquire, &key, grant).await?;
        Ok(bare::granted(&key, owner, token))
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        let (key, token) = bare::release_args(grant)?;
        let release = self.release_row(key.as_str(), &grant.owner, token);
        bare::timed(&self.config, bare::ROW, Operation::Release, &key, release).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The floor writes its own SQL; it must stay the text the driver sends
    /// (same tables, same grant and release), or the ratio compares two
    /// different exchanges.
    #[test]
    fn the_floors_text_is_the_drivers() {
        let texts = |v: &[Text]| v.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        for dialect in [SqlDialect::Postgres, SqlDialect::MySql, SqlDialect::Sqlite] {
            for table in ["locks", "app.locks"] {
                let ours = lock_sql::keys::statement_texts(dialect, table).expect("compiled in");
                let (create, grant, release) = lease_sql(dialect, table);
                assert_eq!(texts(&create), ours.create, "{dialect} {table}");
                assert_eq!(&*grant, ours.grant, "{dialect} {table}");
                assert_eq!(&*release, ours.release, "{dialect} {table}");
                let (create, permits) = permits::permit_sql(dialect, table);
                assert_eq!(texts(&create), ours.shared_create, "{dialect} {table}");
                let bump: Vec<Text> = [Some(&permits.bump), permits.read_bump.as_ref()]
                    .into_iter()
                    .flatten()
                    .cloned()
                    .collect();
                assert_eq!(texts(&bump), ours.shared_lock_key, "{dialect} {table}");
                let transaction = [&permits.begin, &permits.commit, &permits.rollback];
                assert_eq!(
                    transaction.map(|t| t.to_string()),
                    ours.shared_transaction,
                    "{dialect}"
                );
                assert_eq!(&*permits.state, ours.shared_state, "{dialect} {table}");
                assert_eq!(
                    &*permits.insert, ours.shared_insert_holder,
                    "{dialect} {table}"
                );
                assert_eq!(&*permits.release, ours.shared_release, "{dialect} {table}");
            }
        }
    }
}
