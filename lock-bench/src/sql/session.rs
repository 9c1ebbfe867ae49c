//! The raw floor of session mode ([`SqlSessionBackend`](lock_sql::SqlSessionBackend)):
//! its grant and release, by hand on one bare connection.
//!
//! [`SessionFloor`] opens one sqlx connection of its own (the driver's URL
//! parsing and connection type; none of its sessions, dialects, statement
//! texts or retries) and sends two statements written here:
//!
//! 1. the grant, one round trip, the token in its answer:
//!    - PostgreSQL: `pg_try_advisory_lock` and `nextval` of the token
//!      sequence in one `SELECT`, which also publishes the owner and token
//!      in `application_name` and arms `idle_session_timeout` and the
//!      keep-alive idle time (the TTL), as the driver's grant does;
//!    - MySQL/MariaDB: `INSERT .. SELECT .. WHERE GET_LOCK(name, 0) = 1 ON
//!      DUPLICATE KEY UPDATE` on the per-key token row, the token in the OK
//!      packet's `LAST_INSERT_ID`;
//! 2. the release, one round trip: `pg_advisory_unlock` (and the published
//!    settings reset) / `RELEASE_LOCK`.
//!
//! Two round trips per cycle. Unlike the backend, the floor never arms the
//! MySQL/MariaDB session's `wait_timeout` (one more statement whenever the
//! TTL's whole seconds change): its session lives only as long as a
//! benchmark.
//!
//! What the floor takes from the driver is data, not code on the path it
//! measures: the session profile (name, shortest TTL, and the connect
//! options with the session settings PostgreSQL gets in the startup
//! packet, no round trip), the key layout (`lock_sql::keys`: the floor
//! takes the same server lock as the driver for the same key) and the
//! TTL's conversion to `idle_session_timeout`.

use std::time::Duration;

use async_trait::async_trait;
use conformance::floor::{FloorGrant, RawFloor};
use lock_core::{LockError, LockKey, Operation};
use lock_sql::keys::{mysql_lock_name, pg_idle_timeout, pg_lock_key};
use lock_sql::sqlx::{self, Row};
use lock_sql::{SqlConfig, SqlDialect};
use tokio::sync::Mutex;

use super::bare::{self, Bare, BareExt, Label, Text, quoted, sql};

/// Session mode's grant and release, by hand on one bare connection.
///
/// Serves one call at a time; a session holds any number of keys at once
/// (each its own server lock), as one benchmark client needs.
#[derive(Debug)]
pub struct SessionFloor {
    label: Label,
    config: SqlConfig,
    conn: Mutex<Bare>,
    grant: Text,
    release: Text,
}

/// Session mode's `CREATE` of the token counter, its grant and its release
/// for `dialect` on validated table `table`; `None` on SQLite (no session
/// locks).
fn session_sql(dialect: SqlDialect, table: &str) -> Option<(Text, Text, Text)> {
    let (create, grant, release) = match dialect {
        SqlDialect::Postgres => {
            let seq = quoted(dialect, &format!("{table}_session_seq"));
            let publish = "CASE WHEN g.t IS NOT NULL THEN \
                 set_config('application_name', 'distlock ' || $2 || ' ' || g.t, false) \
                 || set_config('idle_session_timeout', $3, false) \
                 || set_config('tcp_keepalives_idle', ceil($3::numeric / 1000)::bigint::text, false) END";
            (
                format!("CREATE SEQUENCE IF NOT EXISTS {seq} AS BIGINT CACHE 1 NO CYCLE"),
                format!(
                    "SELECT g.t, {publish} FROM (SELECT CASE WHEN pg_try_advisory_lock($1) \
                     THEN nextval('{seq}') END AS t OFFSET 0) g"
                ),
                "SELECT pg_advisory_unlock($1), \
                 set_config('application_name', 'distlock', false), \
                 set_config('idle_session_timeout', '0', false), \
                 set_config('tcp_keepalives_idle', '5', false)"
                    .to_owned(),
            )
        }
        SqlDialect::MySql => {
            let tok = quoted(dialect, &format!("{table}_session_tokens"));
            (
                format!(
                    "CREATE TABLE IF NOT EXISTS {tok} (name VARBINARY(1024) NOT NULL PRIMARY KEY, \
                     token BIGINT NOT NULL, owner VARCHAR(64) NOT NULL, conn BIGINT NOT NULL, \
                     lock_name VARCHAR(64) NULL, details VARCHAR({}) NULL, \
                     details_token BIGINT NULL) ENGINE=InnoDB",
                    lock_core::MAX_ENCODED_LEN
                ),
                format!(
                    "INSERT INTO {tok} (name, token, owner, conn, lock_name, details, details_token) \
                     SELECT ?, LAST_INSERT_ID(1), ?, CONNECTION_ID(), ?, ?, 1 FROM DUAL \
                     WHERE GET_LOCK(?, ?) = 1 \
                     ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), \
                     owner = VALUES(owner), conn = VALUES(conn), lock_name = VALUES(lock_name), \
                     details = VALUES(details), details_token = token"
                ),
                "SELECT RELEASE_LOCK(?)".to_owned(),
            )
        }
        _ => return None,
    };
    Some((create.into(), grant.into(), release.into()))
}

impl SessionFloor {
    /// Opens one connection to `url` (same syntax as [`lock_sql::connect`];
    /// `mode` is ignored) and creates the token sequence or table if
    /// missing, as the driver does.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for a bad URL or
    /// a SQLite one (no session locks); the driver's kinds for a database
    /// that cannot be reached or refuses the setup.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes the connection. A sequence or
    /// table created meanwhile stays (creation is idempotent).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = SqlConfig::from_url(url)?;
        // The driver's session profile (its name, shortest TTL and connect
        // options with the session settings of the startup packet); a
        // SQLite URL is refused here, as the driver refuses it.
        let (options, name, min_ttl) = lock_sql::keys::session_connect_options(&config)?;
        let label = Label { name, min_ttl };
        let Some((create, grant, release)) = session_sql(config.dialect(), config.table_name())
        else {
            return Err(
                LockError::config("session mode has no SQLite floor").with_backend(label.name)
            );
        };
        let conn = Bare::open_with(&config, options, &[create]).await?;
        Ok(Self {
            label,
            conn: Mutex::new(conn),
            grant,
            release,
            config,
        })
    }

    /// The grant statement: the token when granted, `None` when held.
    async fn grant(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<i64>, sqlx::Error> {
        let namespace = self.config.table_name();
        Ok(match &mut *self.conn.lock().await {
            Bare::PostgresPooled(_) => return Err(super::bare::pooled()),
            Bare::Postgres(c) => {
                let q = sqlx::query(sql(&self.grant))
                    .bind(pg_lock_key(namespace, key))
                    .bind(owner)
                    .bind(pg_idle_timeout(ttl));
                q.fetch_one(c).await?.try_get::<Option<i64>, _>(0)?
            }
            Bare::MySql(c) => {
                let lock_name = mysql_lock_name(namespace, key);
                let q = sqlx::query(sql(&self.grant))
                    .bind(key.as_bytes())
                    .bind(owner)
                    .bind(lock_name.as_str())
                    .bind(lock_core::HolderDetails::encode_current())
                    .bind(lock_name.as_str())
                    .bind(0.0_f64);
                i64::try_from(q.execute(c).await?.last_insert_id()).ok()
            }
            Bare::Sqlite(_) => None,
        }
        .filter(|token| *token > 0))
    }

    /// The release statement: whether this session held the lock.
    async fn release_lock(&self, key: &str) -> Result<bool, sqlx::Error> {
        let namespace = self.config.table_name();
        Ok(match &mut *self.conn.lock().await {
            Bare::PostgresPooled(_) => return Err(super::bare::pooled()),
            Bare::Postgres(c) => {
                let q = sqlx::query(sql(&self.release)).bind(pg_lock_key(namespace, key));
                q.fetch_one(c).await?.try_get::<bool, _>(0)?
            }
            Bare::MySql(c) => {
                let q = sqlx::query(sql(&self.release)).bind(mysql_lock_name(namespace, key));
                q.fetch_one(c).await?.try_get::<Option<i64>, _>(0)? == Some(1)
            }
            Bare::Sqlite(_) => false,
        })
    }
}

#[async_trait]
impl RawFloor for SessionFloor {
    fn name(&self) -> &'static str {
        self.label.name
    }

    /// The grant and the release: one statement each.
    fn round_trips_per_cycle(&self) -> u32 {
        2
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        let (key, owner) = bare::grant_args(self.label, key, ttl)?;
        let grant = self.grant(key.as_str(), &owner, ttl);
        let token =
            bare::timed(&self.config, self.label, Operation::TryAcquire, &key, grant).await?;
        Ok(bare::granted(&key, owner, token))
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        let key = LockKey::new(&grant.key)?;
        let release = self.release_lock(key.as_str());
        bare::timed(&self.config, self.label, Operation::Release, &key, release).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The floor writes its own SQL; it must stay the text the driver
    /// sends, or the ratio compares two different exchanges.
    #[test]
    fn the_floors_text_is_the_drivers() {
        for dialect in [SqlDialect::Postgres, SqlDialect::MySql] {
            for table in ["locks", "app.locks"] {
                let ours = lock_sql::keys::statement_texts(dialect, table).expect("compiled in");
                let ours = ours.session.expect("session mode");
                let (create, grant, release) = session_sql(dialect, table).expect("session SQL");
                assert_eq!(&*create, ours[0], "{dialect} {table}");
                assert_eq!(&*grant, ours[1], "{dialect} {table}");
                assert_eq!(&*release, ours[2], "{dialect} {table}");
            }
        }
        assert!(session_sql(SqlDialect::Sqlite, "locks").is_none());
    }
}
