//! One server session: a bare sqlx connection, its server-side id and the
//! settings that make the server free its locks no earlier than the
//! holder's deadline.

use std::time::Duration;

use lock_core::{LockError, SessionState};
use sqlx::{AssertSqlSafe, Connection, Row};
use tokio::sync::watch;
use tokio::time::Instant;

use super::names;
use super::sql::SessionSql;
use crate::config::{SqlConfig, SqlDialect};

/// How to open a session.
#[derive(Clone, Debug)]
pub(crate) enum Opts {
    #[cfg(feature = "postgres")]
    Pg(sqlx::postgres::PgConnectOptions),
    #[cfg(feature = "mysql")]
    My(sqlx::mysql::MySqlConnectOptions),
}

/// How often a PostgreSQL backend running a statement checks that its
/// client is still there (PostgreSQL 14+), so a dropped waiting acquire
/// ends on the server soon even if the background kill cannot run.
const PG_CLIENT_CHECK: &str = "250ms";

impl Opts {
    /// Parses the driver URL of `config` and adds the per-session settings
    /// that travel in the PostgreSQL startup packet (no round trip).
    pub(crate) fn new(config: &SqlConfig) -> Result<Self, LockError> {
        let bad = |e: sqlx::Error| {
            LockError::config(config.scrub(&format!(
                "the {} driver rejected {}: {e}",
                config.dialect,
                config.redacted_url()
            )))
        };
        match config.dialect {
            #[cfg(feature = "postgres")]
            SqlDialect::Postgres => {
                let options: sqlx::postgres::PgConnectOptions =
                    config.driver_url().parse().map_err(bad)?;
                Ok(Self::Pg(options.application_name("distlock").options([
                    ("client_connection_check_interval", PG_CLIENT_CHECK),
                    // A dead client host while a statement runs (idle
                    // sessions are ended by idle_session_timeout instead).
                    ("tcp_keepalives_idle", "5"),
                    ("tcp_keepalives_interval", "1"),
                    ("tcp_keepalives_count", "3"),
                    ("idle_session_timeout", "0"),
                ])))
            }
            #[cfg(feature = "mysql")]
            SqlDialect::MySql => Ok(Self::My(config.driver_url().parse().map_err(bad)?)),
            SqlDialect::Sqlite => Err(LockError::config(
                "mode=session needs a database server (PostgreSQL or MySQL/MariaDB)",
            )),
            #[allow(unreachable_patterns)] // with a dialect's feature off
            other => Err(LockError::config(format!(
                "lock-sql was built without its `{other}` feature"
            ))),
        }
    }
}

/// A bare connection of either dialect.
#[derive(Debug)]
pub(crate) enum Conn {
    #[cfg(feature = "postgres")]
    Pg(sqlx::PgConnection),
    #[cfg(feature = "mysql")]
    My(sqlx::MySqlConnection),
}

/// One open server session.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) conn: Conn,
    /// The server's id of this session: PostgreSQL backend pid, MySQL
    /// connection id (for the background kill of a dropped wait).
    pub(crate) id: i64,
    /// MySQL: the session's `wait_timeout` in seconds, once we set it.
    pub(crate) wait_timeout: Option<u64>,
    /// When it went back to the idle list.
    pub(crate) idle_since: Instant,
    /// Opened for this call (a failure on it is not a stale pooled one).
    pub(crate) fresh: bool,
    /// The session signal of the lock this session holds (`Lost` when it
    /// is found not to hold it any more or has ended; closed when the
    /// session is dropped). One channel per server session, not per
    /// grant: a session holds one lock at a time, and successive grants on
    /// it hand their guards the same channel, which the renewal scheduler
    /// then watches once instead of arming a watcher (a wake-up of its
    /// task) per grant. Nothing is sent at a release: the session lives on.
    pub(crate) state: watch::Sender<SessionState>,
}

/// A key as the server's lock sees it.
#[derive(Clone, Debug)]
pub(crate) struct ServerKey {
    /// PostgreSQL advisory-lock key.
    pub(crate) pg: i64,
    /// Its `pg_locks` halves (classid, objid).
    pub(crate) pg_halves: (i64, i64),
    /// MySQL `GET_LOCK` name.
    pub(crate) mysql: String,
}

impl ServerKey {
    pub(crate) fn new(namespace: &str, key: &str) -> Self {
        let pg = names::pg_lock_key(namespace, key);
        Self {
            pg,
            pg_halves: names::pg_lock_halves(pg),
            mysql: names::mysql_lock_name(namespace, key),
        }
    }
}

/// `ttl` in whole milliseconds, rounded up (PostgreSQL's
/// `idle_session_timeout`): the server never ends the session earlier.
pub(crate) fn pg_idle_timeout(ttl: Duration) -> String {
    let ms = ttl.as_micros().div_ceil(1000).max(1);
    ms.to_string()
}

/// `ttl` in whole seconds, rounded up (MySQL's `wait_timeout`).
pub(crate) fn mysql_wait_timeout(ttl: Duration) -> u64 {
    let secs = ttl.as_millis().div_ceil(1000).max(1);
    u64::try_from(secs).unwrap_or(u64::MAX).min(31_536_000)
}

/// What a grant statement returned.
pub(crate) enum Granted {
    /// The lock and this token.
    Token(u64),
    /// Someone else holds it (at the end of the wait, for a wait).
    Held,
}

fn token_of(raw: Option<i64>) -> Granted {
    match raw.and_then(|t| u64::try_from(t).ok()) {
        Some(t) if t > 0 => Granted::Token(t),
        _ => Granted::Held,
    }
}

impl Session {
    /// Opens a session and reads its server-side id (one round trip after
    /// the handshake).
    pub(crate) async fn open(opts: &Opts, sql: &SessionSql) -> Result<Self, sqlx::Error> {
        let (conn, id) = match opts {
            #[cfg(feature = "postgres")]
            Opts::Pg(options) => {
                let mut conn = sqlx::PgConnection::connect_with(options).await?;
                let id: i64 = sqlx::query_scalar(sql.session_id)
                    .fetch_one(&mut conn)
                    .await?;
                (Conn::Pg(conn), id)
            }
            #[cfg(feature = "mysql")]
            Opts::My(options) => {
                let mut conn = sqlx::MySqlConnection::connect_with(options).await?;
                let id: i64 = sqlx::query_scalar(sql.session_id)
                    .fetch_one(&mut conn)
                    .await?;
                (Conn::My(conn), id)
            }
        };
        Ok(Self {
            conn,
            id,
            wait_timeout: None,
            idle_since: Instant::now(),
            fresh: true,
            state: watch::channel(SessionState::Alive).0,
        })
    }

    /// Whether an idle session may already have been ended by the server's
    /// idle timeout (MySQL `wait_timeout`; PostgreSQL sessions are reset to
    /// no idle timeout at release).
    pub(crate) fn maybe_expired(&self, now: Instant) -> bool {
        self.wait_timeout.is_some_and(|secs| {
            now.saturating_duration_since(self.idle_since) + Duration::from_millis(500)
                >= Duration::from_secs(secs)
        })
    }

    /// Makes the server end this session after `ttl` of silence, no
    /// earlier. PostgreSQL does it inside the grant statement; MySQL needs
    /// a `SET` (one round trip, only when the value changes).
    async fn arm_idle_timeout(&mut self, ttl: Duration) -> Result<(), sqlx::Error> {
        #[cfg(feature = "mysql")]
        if let Conn::My(conn) = &mut self.conn {
            let secs = mysql_wait_timeout(ttl);
            if self.wait_timeout != Some(secs) {
                sqlx::query("SET SESSION wait_timeout = ?")
                    .bind(secs)
                    .execute(&mut *conn)
                    .await?;
                self.wait_timeout = Some(secs);
            }
        }
        let _ = ttl;
        Ok(())
    }

    /// One grant statement: a try when `wait` is `None`, else a wait of up
    /// to that long on the server. The token comes back in the same
    /// statement.
    pub(crate) async fn grant(
        &mut self,
        sql: &SessionSql,
        key: &[u8],
        server_key: &ServerKey,
        owner: &str,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Granted, sqlx::Error> {
        self.arm_idle_timeout(ttl).await?;
        match &mut self.conn {
            #[cfg(feature = "postgres")]
            Conn::Pg(conn) => {
                let statement = match wait {
                    None => &sql.grant,
                    Some(_) => &sql.wait,
                };
                let mut query = sqlx::query(AssertSqlSafe(statement.as_str()))
                    .bind(server_key.pg)
                    .bind(owner)
                    .bind(pg_idle_timeout(ttl));
                if let Some(wait) = wait {
                    // lock_timeout = 0 would mean "wait forever".
                    let ms = wait.as_millis().max(1);
                    query = query.bind(ms.to_string());
                }
                match query.fetch_one(&mut *conn).await {
                    Ok(row) => Ok(token_of(row.try_get::<Option<i64>, _>(0)?)),
                    // lock_not_available: lock_timeout ran out.
                    Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03") => {
                        Ok(Granted::Held)
                    }
                    Err(e) => Err(e),
                }
            }
            #[cfg(feature = "mysql")]
            Conn::My(conn) => {
                // GET_LOCK(name, 0) tries; a positive timeout waits.
                let seconds = wait.map_or(0.0, |w| w.as_secs_f64().max(0.001));
                let done = sqlx::query(AssertSqlSafe(sql.grant.as_str()))
                    .bind(key)
                    .bind(owner)
                    .bind(server_key.mysql.as_str())
                    .bind(seconds)
                    .execute(&mut *conn)
                    .await?;
                Ok(token_of(i64::try_from(done.last_insert_id()).ok()))
            }
        }
    }

    /// Releases the lock; `true` when this session held it.
    pub(crate) async fn release(
        &mut self,
        sql: &SessionSql,
        server_key: &ServerKey,
    ) -> Result<bool, sqlx::Error> {
        match &mut self.conn {
            #[cfg(feature = "postgres")]
            Conn::Pg(conn) => {
                let row = sqlx::query(AssertSqlSafe(sql.release.as_str()))
                    .bind(server_key.pg)
                    .fetch_one(&mut *conn)
                    .await?;
                row.try_get::<bool, _>(0)
            }
            #[cfg(feature = "mysql")]
            Conn::My(conn) => {
                let released: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql.release.as_str()))
                    .bind(server_key.mysql.as_str())
                    .fetch_one(&mut *conn)
                    .await?;
                Ok(released == Some(1))
            }
        }
    }

    /// The keep-alive: a cheap query that also tells whether this session
    /// still holds the lock.
    pub(crate) async fn holds(
        &mut self,
        sql: &SessionSql,
        server_key: &ServerKey,
    ) -> Result<bool, sqlx::Error> {
        match &mut self.conn {
            #[cfg(feature = "postgres")]
            Conn::Pg(conn) => {
                sqlx::query_scalar::<_, bool>(AssertSqlSafe(sql.holds.as_str()))
                    .bind(server_key.pg_halves.0)
                    .bind(server_key.pg_halves.1)
                    .fetch_one(&mut *conn)
                    .await
            }
            #[cfg(feature = "mysql")]
            Conn::My(conn) => {
                let held: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql.holds.as_str()))
                    .bind(server_key.mysql.as_str())
                    .fetch_one(&mut *conn)
                    .await?;
                Ok(held == Some(1))
            }
        }
    }

    /// Who holds the lock: `(server session id, owner hex, token)`; owner
    /// and token only when the holder is one of ours.
    pub(crate) async fn inspect(
        &mut self,
        sql: &SessionSql,
        key: &[u8],
        server_key: &ServerKey,
    ) -> Result<Option<(i64, Option<String>, Option<u64>)>, sqlx::Error> {
        match &mut self.conn {
            #[cfg(feature = "postgres")]
            Conn::Pg(conn) => {
                let _ = key;
                let row = sqlx::query(AssertSqlSafe(sql.inspect.as_str()))
                    .bind(server_key.pg_halves.0)
                    .bind(server_key.pg_halves.1)
                    .fetch_optional(&mut *conn)
                    .await?;
                let Some(row) = row else { return Ok(None) };
                let pid: i32 = row.try_get(0)?;
                let app: Option<String> = row.try_get(1)?;
                // `distlock <owner hex> <token>` while one of ours holds it.
                let ours = app.as_deref().and_then(|a| {
                    let mut parts = a.strip_prefix("distlock ")?.split(' ');
                    let owner = parts.next()?.to_owned();
                    let token = parts.next()?.parse::<u64>().ok()?;
                    Some((owner, token))
                });
                Ok(Some(match ours {
                    Some((owner, token)) => (i64::from(pid), Some(owner), Some(token)),
                    None => (i64::from(pid), None, None),
                }))
            }
            #[cfg(feature = "mysql")]
            Conn::My(conn) => {
                let row = sqlx::query(AssertSqlSafe(sql.inspect.as_str()))
                    .bind(server_key.mysql.as_str())
                    .bind(key)
                    .fetch_one(&mut *conn)
                    .await?;
                let Some(holder) = row.try_get::<Option<i64>, _>(0)? else {
                    return Ok(None);
                };
                let token: Option<i64> = row.try_get(1)?;
                let owner: Option<String> = row.try_get(2)?;
                let conn_id: Option<i64> = row.try_get(3)?;
                // The token row names the session of the last grant: it is
                // the holder's only if that session holds the lock now.
                if conn_id == Some(holder) {
                    Ok(Some((
                        holder,
                        owner,
                        token.and_then(|t| u64::try_from(t).ok()),
                    )))
                } else {
                    Ok(Some((holder, None, None)))
                }
            }
        }
    }

    /// Ends a session on the server from this one (`pg_terminate_backend`
    /// / `KILL`): any lock it holds is freed.
    pub(crate) async fn kill(&mut self, victim: i64) -> Result<(), sqlx::Error> {
        match &mut self.conn {
            #[cfg(feature = "postgres")]
            Conn::Pg(conn) => sqlx::query("SELECT pg_terminate_backend($1::int)")
                .bind(victim)
                .execute(&mut *conn)
                .await
                .map(drop),
            // KILL takes no placeholder; the id is our own integer.
            #[cfg(feature = "mysql")]
            Conn::My(conn) => sqlx::query(AssertSqlSafe(format!("KILL {victim}")))
                .execute(&mut *conn)
                .await
                .map(drop),
        }
    }

    /// Creates the token sequence / table and checks a PostgreSQL sequence
    /// hands out strictly increasing values across sessions (no per-session
    /// cache, no cycling).
    pub(crate) async fn prepare_schema(
        &mut self,
        sql: &SessionSql,
        create: bool,
    ) -> Result<Option<String>, sqlx::Error> {
        match &mut self.conn {
            #[cfg(feature = "postgres")]
            Conn::Pg(conn) => {
                if create {
                    sqlx::query(AssertSqlSafe(sql.create.as_str()))
                        .execute(&mut *conn)
                        .await?;
                }
                let row = sqlx::query(AssertSqlSafe(sql.check.as_str()))
                    .bind(sql.counter.as_str())
                    .fetch_one(&mut *conn)
                    .await?;
                let cache: i64 = row.try_get(0)?;
                let cycle: bool = row.try_get(1)?;
                if cache != 1 || cycle {
                    return Ok(Some(format!(
                        "the token sequence {} must have CACHE 1 and NO CYCLE (has cache {cache}, cycle {cycle}): \
                         a per-session cache hands out tokens out of order",
                        sql.counter
                    )));
                }
                Ok(None)
            }
            #[cfg(feature = "mysql")]
            Conn::My(conn) => {
                if create {
                    sqlx::query(AssertSqlSafe(sql.create.as_str()))
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(None)
            }
        }
    }
}
