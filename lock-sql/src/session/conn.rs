//! One server session: a bare sqlx connection, its server-side id and the
//! settings that make the server free its locks no earlier than the
//! holder's deadline.

use std::time::Duration;

use lock_core::{LockError, SessionState};
use tokio::sync::watch;
use tokio::time::Instant;

use super::names;
use super::sql::SessionSql;
use crate::config::{SqlConfig, SqlDialect};
use crate::conn::{DbConn, DbOptions};
use crate::dialect::{SessionDialect, SessionHolder, session_of};
use crate::shared::run::fetch;

/// How to open a session: the database's session half and its connect
/// options (with the per-session settings).
#[derive(Clone, Debug)]
pub(crate) struct Opts {
    pub(crate) dialect: &'static dyn SessionDialect,
    options: DbOptions,
}

impl Opts {
    /// Parses the driver URL of `config` and adds the per-session settings
    /// that travel in the PostgreSQL startup packet (no round trip).
    pub(crate) fn new(config: &SqlConfig) -> Result<Self, LockError> {
        let dialect = session_of(config.dialect)?;
        Ok(Self {
            dialect,
            options: dialect.session_options(config)?,
        })
    }
}

/// One open server session.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) conn: DbConn,
    /// The database's session half.
    pub(crate) dialect: &'static dyn SessionDialect,
    /// The server's id of this session: PostgreSQL backend pid, MySQL
    /// connection id (for the background kill of a dropped wait).
    pub(crate) id: i64,
    /// MySQL: the session's `wait_timeout` in seconds, once we set it.
    pub(crate) wait_timeout: Option<u64>,
    /// When it went back to the idle list (kept only while `wait_timeout`
    /// is set: nothing else reads it).
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
    /// `key`'s name on `dialect` only; the other database's fields stay
    /// empty (`0`, `""`): each [`SessionDialect`] reads only its own. The
    /// `GET_LOCK` name a PostgreSQL grant does not need cost a `format!`
    /// and an allocation per grant (about 1,300 instructions), the
    /// advisory-lock hash a MySQL grant does not need about 260.
    pub(crate) fn of(dialect: SqlDialect, namespace: &str, key: &str) -> Self {
        match dialect {
            SqlDialect::Postgres => {
                let pg = names::pg_lock_key(namespace, key);
                Self {
                    pg,
                    pg_halves: names::pg_lock_halves(pg),
                    mysql: String::new(),
                }
            }
            SqlDialect::MySql | SqlDialect::Sqlite => Self {
                pg: 0,
                pg_halves: (0, 0),
                mysql: names::mysql_lock_name(namespace, key),
            },
        }
    }
}

/// `ttl` in whole milliseconds, rounded up from the nanosecond
/// (PostgreSQL's `idle_session_timeout`): the server never ends the
/// session earlier.
pub(crate) fn pg_idle_timeout(ttl: Duration) -> String {
    let ms = ttl.as_nanos().div_ceil(1_000_000).max(1);
    ms.to_string()
}

/// `ttl` in whole seconds, rounded up from the nanosecond (MySQL's
/// `wait_timeout`; rounded from the millisecond, a TTL of 1.0005 s got 1 s).
pub(crate) fn mysql_wait_timeout(ttl: Duration) -> u64 {
    let secs = ttl.as_nanos().div_ceil(1_000_000_000).max(1);
    u64::try_from(secs).unwrap_or(u64::MAX).min(31_536_000)
}

/// What a grant statement returned.
pub(crate) enum Granted {
    /// The lock and this token.
    Token(u64),
    /// Someone else holds it (at the end of the wait, for a wait).
    Held,
}

/// What `force_release`'s conditional kill did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Killed {
    /// The holder's session was ended.
    Ended,
    /// Not held any more as the grant read before (nothing ended).
    Changed,
    /// Spared: the session holds this many other locks (PostgreSQL).
    HoldsOthers(i64),
}

/// The grant `force_release` ends: session `victim`, holding the lock of
/// `server_key` (key `key`) as grant `owner`/`token` when `inspect` read it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KillTarget<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) server_key: &'a ServerKey,
    pub(crate) victim: i64,
    pub(crate) owner: &'a str,
    pub(crate) token: u64,
}

/// A grant statement's token: `Held` when none (or not positive).
pub(crate) fn token_of(raw: Option<i64>) -> Granted {
    match raw.and_then(|t| u64::try_from(t).ok()) {
        Some(t) if t > 0 => Granted::Token(t),
        _ => Granted::Held,
    }
}

impl Session {
    /// Opens a session and reads its server-side id (one round trip after
    /// the handshake).
    pub(crate) async fn open(opts: &Opts, sql: &SessionSql) -> Result<Self, sqlx::Error> {
        let mut conn = opts.options.connect().await?;
        let id = fetch(&mut conn, &sql.session_id, &[], "i")
            .await?
            .first()
            .map(|row| row[0].int())
            .ok_or_else(|| sqlx::Error::Protocol("no session id".into()))?;
        Ok(Self {
            conn,
            dialect: opts.dialect,
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
    pub(crate) fn maybe_expired(&self) -> bool {
        self.wait_timeout.is_some_and(|secs| {
            self.idle_since.elapsed() + Duration::from_millis(500) >= Duration::from_secs(secs)
        })
    }

    /// One grant statement: a try when `wait` is `None`, else a wait of up
    /// to that long on the server. The token comes back in the same
    /// statement. First makes the server end this session after `ttl` of
    /// silence, no earlier (PostgreSQL does it inside the grant statement;
    /// MySQL needs a `SET`, one round trip, only when the value changes).
    pub(crate) async fn grant(
        &mut self,
        sql: &SessionSql,
        key: &[u8],
        server_key: &ServerKey,
        owner: &str,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Granted, sqlx::Error> {
        if let Some(secs) = self.dialect.idle_timeout_secs(ttl)
            && self.wait_timeout != Some(secs)
        {
            self.dialect.arm_idle_timeout(&mut self.conn, secs).await?;
            self.wait_timeout = Some(secs);
        }
        self.dialect
            .session_grant(&mut self.conn, sql, key, server_key, owner, ttl, wait)
            .await
    }

    /// Releases the lock; `true` when this session held it.
    pub(crate) async fn release(
        &mut self,
        sql: &SessionSql,
        server_key: &ServerKey,
    ) -> Result<bool, sqlx::Error> {
        self.dialect
            .session_release(&mut self.conn, sql, server_key)
            .await
    }

    /// The keep-alive: a cheap query that also tells whether this session
    /// still holds the lock.
    pub(crate) async fn holds(
        &mut self,
        sql: &SessionSql,
        server_key: &ServerKey,
    ) -> Result<bool, sqlx::Error> {
        self.dialect
            .session_holds(&mut self.conn, sql, server_key)
            .await
    }

    /// Who holds the lock: `(server session id, owner hex, token)`; owner
    /// and token only when the holder is one of ours.
    pub(crate) async fn inspect(
        &mut self,
        sql: &SessionSql,
        key: &[u8],
        server_key: &ServerKey,
    ) -> Result<Option<SessionHolder>, sqlx::Error> {
        self.dialect
            .session_inspect(&mut self.conn, sql, key, server_key)
            .await
    }

    /// Ends the session of a dropped waiting acquire on the server from
    /// this one (`pg_terminate_backend` / `KILL`): any lock it holds is
    /// freed. `owner` is the waiting acquire's owner, which identifies the
    /// session where the server can reuse ids (see
    /// [`SessionDialect::kill_session`]).
    pub(crate) async fn kill(&mut self, victim: i64, owner: &str) -> Result<(), sqlx::Error> {
        self.dialect
            .kill_session(&mut self.conn, victim, owner)
            .await
    }

    /// `force_release`: ends the target's session if it still holds the
    /// lock as that grant (see [`SessionDialect::kill_holder`]).
    pub(crate) async fn kill_holder(
        &mut self,
        sql: &SessionSql,
        target: KillTarget<'_>,
        wait: Duration,
    ) -> Result<Killed, sqlx::Error> {
        self.dialect
            .kill_holder(&mut self.conn, sql, target, wait)
            .await
    }

    /// Creates the token sequence / table and checks a PostgreSQL sequence
    /// hands out strictly increasing values across sessions (no per-session
    /// cache, no cycling).
    pub(crate) async fn prepare_schema(
        &mut self,
        sql: &SessionSql,
        create: bool,
    ) -> Result<Option<String>, sqlx::Error> {
        self.dialect
            .prepare_session_schema(&mut self.conn, sql, create)
            .await
    }
}
