//! One server session: a bare sqlx connection, its server-side id and the
//! settings that make the server free its locks no earlier than the
//! holder's deadline.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::{ErrorKind, LockError, LockKey, Operation, SessionState};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError, watch};
use tokio::time::{Instant, timeout, timeout_at};

use crate::config::SqlConfig;
use crate::connection::SchemaRace;
use crate::connection::{DbConn, DbOptions};
use crate::dialect::binds::fetch;
use crate::dialect::session::{Granted, OnSession, ServerKey, SessionGrant, SessionSql};
use crate::dialect::{SessionDialect, SqlxResult, session_of};
use crate::error::map_sqlx;

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

/// Session mode's connections: the database's session half, the
/// statements, and the idle sessions not pinned by a lock, with one permit
/// per connection in use (pinned by a lock or a call).
pub(crate) struct Sessions {
    pub(crate) config: SqlConfig,
    pub(crate) opts: Opts,
    pub(crate) sql: SessionSql,
    /// The backend's name (`postgres-session`, `mysql-session`).
    pub(crate) name: &'static str,
    /// Connections not pinned by a lock, most recently used last.
    idle: Mutex<Vec<Session>>,
    /// One permit per connection in use (pinned by a lock or a call).
    in_use: Arc<Semaphore>,
    pub(crate) pool_size: usize,
}

/// A session checked out of the idle list, with its permit.
pub(crate) struct Pinned {
    pub(crate) session: Session,
    _permit: OwnedSemaphorePermit,
}

/// Whether the connection itself broke (its session, and any lock it held,
/// is gone on the server).
pub(crate) fn is_broken(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => matches!(
            db.code().as_deref(),
            // PostgreSQL: terminated by an administrator, idle-session
            // timeout; MySQL/MariaDB: connection killed, inactivity.
            Some("57P01" | "57P05" | "08006" | "08003" | "70100" | "1927" | "4031")
        ),
        _ => false,
    }
}

impl Sessions {
    /// Opens one session, creates the token sequence (PostgreSQL, `CACHE 1
    /// NO CYCLE`) or token table (MySQL) if missing (unless
    /// `create_table=false`) and checks an existing sequence.
    pub(crate) async fn open(config: SqlConfig) -> Result<Arc<Self>, LockError> {
        let opts = Opts::new(&config)?;
        let name = opts.dialect.session_name();
        let sql = SessionSql::new(opts.dialect, &config.table);
        let pool_size = usize::try_from(config.pool_size.unwrap_or(10)).unwrap_or(10);
        let sessions = Arc::new(Self {
            config,
            opts,
            sql,
            name,
            idle: Mutex::new(Vec::new()),
            in_use: Arc::new(Semaphore::new(pool_size)),
            pool_size,
        });
        let budget = sessions.config.op_timeout.saturating_mul(2);
        let prepared = timeout(budget, sessions.prepare())
            .await
            .unwrap_or_else(|_| {
                Err(LockError::new(
                    ErrorKind::Timeout,
                    Operation::Connect,
                    "the database did not answer within twice the operation timeout",
                ))
            });
        prepared.map_err(|e| e.with_backend(name))?;
        Ok(sessions)
    }

    async fn prepare(&self) -> Result<(), LockError> {
        let config = &self.config;
        let mut pinned = self.checkout(Instant::now() + config.op_timeout).await?;
        // Another client creating the same sequence or table at the same
        // moment: the loser tries again (see `SchemaRace`).
        let mut race = SchemaRace::within(config.op_timeout);
        let verdict = loop {
            let (dialect, on) = pinned.session.on(&self.sql);
            match dialect
                .prepare_session_schema(on, config.create_table)
                .await
            {
                Err(err) if race.again(&err).await => {}
                other => break other.map_err(|e| map_sqlx(config, Operation::Connect, e))?,
            }
        };
        if let Some(problem) = verdict {
            return Err(LockError::config(problem));
        }
        self.checkin(pinned);
        Ok(())
    }

    pub(crate) fn min_ttl(&self) -> Duration {
        self.opts.dialect.session_min_ttl()
    }

    pub(crate) fn err(&self, operation: Operation, key: &LockKey, err: sqlx::Error) -> LockError {
        map_sqlx(&self.config, operation, err)
            .with_key(key)
            .with_backend(self.name)
    }

    /// A session for one call: an idle one (dropping those the server may
    /// have ended for silence) or a new one, waiting for a free connection
    /// until `until`.
    pub(crate) async fn checkout(&self, until: Instant) -> Result<Pinned, LockError> {
        let closed = || LockError::new(ErrorKind::Unavailable, Operation::Connect, "closed");
        // A free permit is taken without arming a timer (a `Sleep` costs a
        // runtime handle and a timer entry even when it never waits). No
        // queue jumping: a permit released while acquires wait goes to the
        // first waiter, never back to the free count.
        let permit = match Arc::clone(&self.in_use).try_acquire_owned() {
            Ok(permit) => permit,
            Err(TryAcquireError::Closed) => return Err(closed()),
            Err(TryAcquireError::NoPermits) => {
                timeout_at(until, Arc::clone(&self.in_use).acquire_owned())
                    .await
                    .map_err(|_| {
                        LockError::new(
                            ErrorKind::Timeout,
                            Operation::Connect,
                            format!(
                                "all {} session connections of this backend are in use (each held \
                                 lock or waiting acquire pins one; raise pool_size)",
                                self.pool_size
                            ),
                        )
                    })?
                    .map_err(|_| closed())?
            }
        };
        let reused = {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                match idle.pop() {
                    Some(session) if session.maybe_expired() => drop(session),
                    other => break other,
                }
            }
        };
        let session = match reused {
            Some(mut session) => {
                session.fresh = false;
                session
            }
            None => self.open_session(until).await?,
        };
        Ok(Pinned {
            session,
            _permit: permit,
        })
    }

    pub(crate) async fn open_session(&self, until: Instant) -> Result<Session, LockError> {
        let config = &self.config;
        let until = until.max(Instant::now() + config.op_timeout);
        match timeout_at(until, Session::open(&self.opts, &self.sql)).await {
            Ok(Ok(session)) => Ok(session),
            Ok(Err(e)) => Err(map_sqlx(config, Operation::Connect, e)),
            Err(_) => Err(LockError::new(
                ErrorKind::Timeout,
                Operation::Connect,
                "could not open a database session within the operation timeout",
            )),
        }
    }

    pub(crate) fn checkin(&self, pinned: Pinned) {
        let Pinned { mut session, .. } = pinned;
        // Read only under a server idle timer (`Session::maybe_expired`);
        // a PostgreSQL session has none while idle (reset at release).
        if session.wait_timeout.is_some() {
            session.idle_since = Instant::now();
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.pool_size {
            idle.push(session);
        }
    }

    /// `key` as this database's server lock sees it.
    pub(crate) fn server_key(&self, key: &LockKey) -> ServerKey {
        ServerKey::of(self.config.dialect, &self.config.table, key.as_str())
    }

    /// An idle session outside the permits (for a background kill, which
    /// must not wait behind held locks).
    pub(crate) fn take_idle(&self) -> Option<Session> {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
    }

    /// Puts a session used outside the permits back on the idle list.
    pub(crate) fn put_idle(&self, mut session: Session) {
        session.idle_since = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.pool_size {
            idle.push(session);
        }
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

    /// Where this session's statements run, with the backend's `sql`, and
    /// the dialect that runs them.
    pub(crate) fn on<'a>(
        &'a mut self,
        sql: &'a SessionSql,
    ) -> (&'static dyn SessionDialect, OnSession<'a>) {
        let conn = &mut self.conn;
        (self.dialect, OnSession { conn, sql })
    }

    /// One grant statement (see [`SessionGrant`]); the token comes back in
    /// the same statement. First makes the server end this session after
    /// the TTL of silence, no earlier (PostgreSQL does it inside the grant
    /// statement; MySQL needs a `SET`, one round trip, only when the value
    /// changes).
    pub(crate) async fn grant(
        &mut self,
        sql: &SessionSql,
        grant: &SessionGrant<'_>,
    ) -> SqlxResult<Granted> {
        if let Some(secs) = self.dialect.idle_timeout_secs(grant.ttl)
            && self.wait_timeout != Some(secs)
        {
            self.dialect.arm_idle_timeout(&mut self.conn, secs).await?;
            self.wait_timeout = Some(secs);
        }
        let (dialect, on) = self.on(sql);
        dialect.session_grant(on, grant).await
    }

    /// Releases the lock; `true` when this session held it.
    pub(crate) async fn release(&mut self, sql: &SessionSql, key: &ServerKey) -> SqlxResult<bool> {
        let (dialect, on) = self.on(sql);
        dialect.session_release(on, key).await
    }

    /// The keep-alive: a cheap query that also tells whether this session
    /// still holds the lock.
    pub(crate) async fn holds(&mut self, sql: &SessionSql, key: &ServerKey) -> SqlxResult<bool> {
        let (dialect, on) = self.on(sql);
        dialect.session_holds(on, key).await
    }

    /// Ends the session of a dropped waiting acquire on the server from
    /// this one (`pg_terminate_backend` / `KILL`): any lock it holds is
    /// freed. `owner` is the waiting acquire's owner, which identifies the
    /// session where the server can reuse ids (see
    /// [`SessionDialect::kill_session`]).
    pub(crate) async fn kill(&mut self, victim: i64, owner: &str) -> SqlxResult<()> {
        self.dialect
            .kill_session(&mut self.conn, victim, owner)
            .await
    }
}
