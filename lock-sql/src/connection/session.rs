//! Session mode's connections: a small set of server sessions, each
//! holding any number of locks, with the lost signal of every lock it
//! holds; and one session, a bare sqlx connection with its server-side id
//! and the settings that make the server free its locks no earlier than
//! their holders' deadlines.
//!
//! # Which connection a call uses
//!
//! Every statement of a session runs under that session's async mutex
//! (a connection runs one statement at a time). A try, a release, a
//! keep-alive or an operator call takes the least-used live session that
//! is not blocked in a server-side wait, preferring one nobody is using
//! and, among those, one holding the fewest locks of ours (on PostgreSQL
//! a grant on a session holding nothing else is the quiet one, see
//! `grants::session`, "Published grants"), and among those, for a try,
//! the one whose last try was for the same key (a task cycling one key
//! keeps to one session, as it would with a connection of its own);
//! while every session is in use and fewer than `pool_size` are open, a
//! new one is opened. Locks therefore gather on few sessions when calls
//! come one at a time, and spread over up to `pool_size` when many run at
//! once. A waiting acquire that must wait on the server takes a session
//! that holds no lock and is not in use (or opens one), so that the wait
//! blocks nothing else; the lock it gets stays on that session, which
//! then serves like any other.
//!
//! # Losing a session
//!
//! A session found broken (a statement fails with a connection error, a
//! keep-alive finds it does not hold its lock) is closed and leaves the
//! set, and its channel says `Lost` to the guard of every lock it held.
//!
//! # Abandoned statements
//!
//! A statement's reply must never be left half read on a session that
//! serves on: sqlx's MySQL reader takes a packet's header and then awaits
//! its payload, so a statement dropped between the two leaves the rest of
//! that payload to be read as the next statement's reply (a panic, an
//! error, or a wrong answer). So a grant, a release, a keep-alive and an
//! `inspect` run as a [`Finish`]: it owns the session's use, and when its
//! caller stops waiting (the future dropped, or the operation timeout) it
//! is finished in the background, under the session's mutex, within the
//! operation timeout or the TTL the session's server idle timeout is
//! armed to, if longer (until then the server keeps a silent session and
//! its locks; a publication gets twice the operation timeout). Any other
//! statement abandoned mid-way (`list`, `force_release`), or one not
//! finished in that time, leaves its session marked in flight, and the
//! end of that use closes the session: its locks are lost, and their
//! guards told.
//!
//! Whether an abandoned grant took the lock is unknown to its caller: the
//! key is then recorded as an orphan of that session, and the next call on
//! the session first releases every orphan that no grant of ours holds
//! there (an unlock of a lock not held is harmless), so an abandoned grant
//! never leaves a lock behind, and never costs the session's other locks.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::{ErrorKind, LockError, LockKey, Operation, SessionState};
use tokio::sync::{OwnedMutexGuard, watch};
use tokio::time::{Instant, sleep, timeout, timeout_at};

use crate::config::{SqlConfig, SqlDialect};
use crate::connection::SchemaRace;
use crate::connection::{DbConn, DbOptions};
use crate::dialect::binds::fetch;
use crate::dialect::session::{
    Granted, OnSession, ServerKey, SessionGrant, SessionLock, SessionSql,
};
use crate::dialect::{SessionDialect, SessionHolder, SqlxResult, session_of};
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
    conn: DbConn,
    /// The database's session half.
    pub(crate) dialect: &'static dyn SessionDialect,
    /// The server's id of this session: PostgreSQL backend pid, MySQL
    /// connection id.
    pub(crate) id: i64,
    /// MySQL: the session's `wait_timeout` in seconds, once we set it.
    pub(crate) wait_timeout: Option<u64>,
    /// The TTL the session's idle timeout is armed to (PostgreSQL: set by a
    /// full grant, kept by the release; MySQL: the grants' TTLs, raised
    /// while it holds locks): at least the TTL of every lock it holds, so
    /// the server ends it no earlier than any of their deadlines.
    pub(crate) armed_ttl: Option<Duration>,
    /// When its last statement ended (read only under a server idle timer,
    /// see [`Session::maybe_expired`]).
    pub(crate) last_used: Instant,
    /// Opened for this call (a failure on it is not a stale pooled one).
    pub(crate) fresh: bool,
    /// PostgreSQL: its `application_name` may show something other than
    /// the idle marker (a grant, `distlock-multi`, a waiting owner): set
    /// before any statement that may publish, cleared by a release that
    /// resets it. While clear, a try on a session holding nothing else
    /// sends the quiet grant and its release the bare unlock (see
    /// `grants::session`, "Published grants").
    pub(crate) published: bool,
    /// What this session adds to its tokens (MariaDB's run epoch; 0 on
    /// PostgreSQL, whose sequence carries it), read before its first grant
    /// (see [`Session::grant`]): `Some` once the server run is started.
    run_base: Option<i64>,
    /// How it was opened (to start a server run on a connection of its
    /// own, see [`Session::read_run`]).
    opts: Opts,
    /// A statement was started on it and has not ended: when its use ends
    /// so, the statement was abandoned mid-way, and its reply's state on
    /// the connection is unknown (see "Abandoned statements").
    in_flight: bool,
}

/// A session of the set and what the set knows of it.
pub(crate) struct Conn {
    /// The server's id of the session (see [`Session::id`]).
    pub(crate) id: i64,
    /// The session, `None` once it was closed (found broken, or abandoned
    /// in an unknown state).
    session: Arc<tokio::sync::Mutex<Option<Session>>>,
    /// The lost signal of every lock on this session: `Lost` when the
    /// session ends; closed when it is dropped. One channel per session,
    /// watched once by the renewal scheduler however many locks it holds.
    pub(crate) state: watch::Sender<SessionState>,
    /// Locks of ours held on it (changed under its mutex).
    held: AtomicUsize,
    /// Set when it was closed.
    dead: AtomicBool,
    /// Keys whose grant or release was abandoned mid-statement here (see
    /// the module docs).
    orphans: Mutex<Vec<ServerKey>>,
    /// Set after a key is added to `orphans`, cleared before they are
    /// taken: a call on a session with none reads this flag and leaves
    /// the mutex alone.
    orphaned: AtomicBool,
}

impl Conn {
    /// Whether the session was closed (its locks are gone).
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Locks of ours held on it.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Marks it closed (its user's drop closes the socket).
    pub(crate) fn mark_dead(&self) {
        self.dead.store(true, Ordering::Release);
        self.held.store(0, Ordering::Release);
    }

    /// A grant or release of `key` was abandoned mid-statement.
    pub(crate) fn orphan(&self, key: ServerKey) {
        self.orphans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(key);
        self.orphaned.store(true, Ordering::Release);
    }
}

/// One slot of the set.
struct Slot {
    conn: Arc<Conn>,
    /// Calls using (or queued on) this session.
    users: usize,
    /// A server-side wait runs on it: nothing else may queue behind it.
    waiting: bool,
    /// Its locks of ours when its last use ended (exact while `users` is
    /// 0: they change only under a use). A pick reads this, not the
    /// session's own counter, so that it does not read every session's
    /// line, which the calls on them write, from under the pool's mutex.
    held: usize,
    /// The server lock its last try was for: a try of that key prefers
    /// this session among equally free ones, so that a task cycling one
    /// key keeps to one session, as a connection of its own would (with
    /// many tasks sharing a backend, a session passed from task to task
    /// moved its connection's state between CPUs at every call).
    last_key: Option<u128>,
}

/// The set's sessions and the ones being opened.
struct Pool {
    slots: Vec<Slot>,
    opening: usize,
    /// Whether a use that ends with a statement in flight closes its
    /// session (see "Abandoned statements"); off only in this crate's
    /// tests of that check.
    abandon_check: bool,
}

impl Default for Pool {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            opening: 0,
            abandon_check: true,
        }
    }
}

impl Pool {
    fn total(&self) -> usize {
        self.slots.len() + self.opening
    }

    fn slot(&mut self, conn: &Arc<Conn>) -> Option<&mut Slot> {
        self.slots.iter_mut().find(|s| Arc::ptr_eq(&s.conn, conn))
    }
}

/// Session mode's connections: the database's session half, the
/// statements, and the set of sessions (at most `pool_size`).
pub(crate) struct Sessions {
    pub(crate) config: SqlConfig,
    pub(crate) opts: Opts,
    pub(crate) sql: SessionSql,
    /// `sql` with the release that leaves the session's settings alone,
    /// for a session that keeps other locks (see [`Sessions::release_sql`]).
    kept_sql: SessionSql,
    /// PostgreSQL: `sql` with the grant that leaves the session's idle
    /// timeout and keep-alive as armed, and the release that keeps them
    /// (see [`Session::grant`]); `None` elsewhere.
    lean_sql: Option<SessionSql>,
    /// PostgreSQL: `sql` with the quiet grant (the lock and its token,
    /// nothing published) and the bare unlock, for a session whose
    /// `application_name` is the idle marker (see [`Session::published`]);
    /// `None` elsewhere.
    quiet_sql: Option<SessionSql>,
    /// The backend's name (`postgres-session`, `mysql-session`).
    pub(crate) name: &'static str,
    pool: Arc<Mutex<Pool>>,
    pub(crate) pool_size: usize,
    /// PostgreSQL: the size of the server's shared lock table, read at
    /// connect (see [`Sessions::server_lock_limit`]).
    lock_table: std::sync::OnceLock<u32>,
    /// Whether an abandoned statement is finished in the background (see
    /// [`Finish`]); off only in this crate's tests of that check, together
    /// with the pool's `abandon_check`.
    finish_abandoned: AtomicBool,
}

/// PostgreSQL's shared lock table, which holds every session's advisory
/// locks: `max_locks_per_transaction × (max_connections +
/// max_prepared_transactions)` slots for the whole server.
const PG_LOCK_TABLE: &str = "SELECT CAST(current_setting('max_locks_per_transaction')::bigint \
     * (current_setting('max_connections')::bigint \
        + current_setting('max_prepared_transactions')::bigint) AS BIGINT)";

/// A session in use by one call: its mutex held, counted as a user of its
/// slot until dropped.
pub(crate) struct ConnUse {
    pub(crate) conn: Arc<Conn>,
    guard: OwnedMutexGuard<Option<Session>>,
    pool: Arc<Mutex<Pool>>,
}

impl Drop for ConnUse {
    fn drop(&mut self) {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        if pool.abandon_check
            && !self.conn.is_dead()
            && self.guard.as_ref().is_some_and(Session::in_flight)
        {
            // A statement abandoned mid-way: its reply may be half read,
            // and sqlx's MySQL reader does not recover from that (the
            // next statement would read the rest as its own reply).
            self.conn.mark_dead();
            self.conn.state.send_replace(SessionState::Lost(
                "a statement on the lock's session was abandoned mid-way (its caller stopped \
                 waiting), so the session was closed"
                    .to_owned(),
            ));
        }
        if self.conn.is_dead() {
            *self.guard = None;
        } else if let Some(session) = self.guard.as_mut() {
            session.last_used = Instant::now();
        }
        if self.conn.is_dead() {
            pool.slots.retain(|s| !Arc::ptr_eq(&s.conn, &self.conn));
        } else if let Some(slot) = pool.slot(&self.conn) {
            slot.users = slot.users.saturating_sub(1);
            slot.waiting = false;
            slot.held = self.conn.held();
        }
    }
}

impl ConnUse {
    /// The session, `None` when it was closed.
    pub(crate) fn session(&mut self) -> Option<&mut Session> {
        self.guard.as_mut()
    }

    /// Runs `statement` on the session (`closed()` when it was closed) and
    /// gives the use back with the answer: the body of a [`Finish`], which
    /// owns the use so that it can run to its end.
    pub(crate) async fn run<T>(
        mut self,
        closed: impl FnOnce() -> T,
        statement: impl AsyncFnOnce(&mut Session) -> T,
    ) -> (Self, T) {
        let answer = match self.session() {
            Some(session) => statement(session).await,
            None => closed(),
        };
        (self, answer)
    }

    /// Closes the session (its socket with it) and tells the guard of every
    /// lock it held that it is lost.
    pub(crate) fn close(&mut self, reason: &str) {
        self.conn.mark_dead();
        *self.guard = None;
        self.conn
            .state
            .send_replace(SessionState::Lost(reason.to_owned()));
    }

    /// The TTL the session's server idle timeout is armed to, if any (see
    /// [`Session::armed_ttl`]).
    pub(crate) fn armed_ttl(&self) -> Option<Duration> {
        self.guard.as_ref().and_then(|session| session.armed_ttl)
    }

    /// One more lock of ours on this session.
    pub(crate) fn add_held(&self) {
        self.conn.held.fetch_add(1, Ordering::AcqRel);
    }

    /// One lock fewer; the number left.
    pub(crate) fn remove_held(&self) -> usize {
        let left = self.conn.held.load(Ordering::Acquire).saturating_sub(1);
        self.conn.held.store(left, Ordering::Release);
        left
    }

    /// Releases the orphans of this session that no grant of ours holds
    /// (see the module docs); `held_here` tells whether a key is held by a
    /// grant of ours on this session. Closes the session when it fails.
    pub(crate) async fn clean_orphans(
        &mut self,
        sessions: &Sessions,
        held_here: impl Fn(&ServerKey) -> bool,
    ) {
        if !self.conn.orphaned.load(Ordering::Acquire)
            || !self.conn.orphaned.swap(false, Ordering::AcqRel)
        {
            return;
        }
        let orphans = std::mem::take(
            &mut *self
                .conn
                .orphans
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for key in orphans {
            if held_here(&key) {
                continue;
            }
            let left = self.conn.held();
            let Some(session) = self.session() else {
                return;
            };
            let sql = sessions.release_sql(left);
            let released = timeout(sessions.config.op_timeout, session.release(sql, &key)).await;
            if !matches!(released, Ok(Ok(_))) {
                self.close("an abandoned grant could not be undone on the lock's session");
                return;
            }
        }
    }
}

/// A statement future that owns its session's use ([`ConnUse`]) and runs
/// to its end: dropped before then (its caller stopped waiting, or timed
/// out), it is finished in the background, within `limit` more, so that
/// a reply is never left half read and the session keeps its other
/// locks (see "Abandoned statements"). Past `limit`, or with no runtime
/// to finish it on, it is dropped mid-way, and the use's drop closes the
/// session.
pub(crate) struct Finish<F: Future + Send + 'static> {
    run: Option<std::pin::Pin<Box<F>>>,
    /// `None`: dropped where it stands (the check's broken variant).
    limit: Option<Duration>,
}

impl<F> Future for Finish<F>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let Some(run) = self.run.as_mut() else {
            // Polled after it finished: `timeout` and `.await` never do.
            return std::task::Poll::Pending;
        };
        let out = std::task::ready!(run.as_mut().poll(cx));
        self.run = None;
        std::task::Poll::Ready(out)
    }
}

impl<F: Future + Send + 'static> Drop for Finish<F> {
    fn drop(&mut self) {
        let (Some(run), Some(limit)) = (self.run.take(), self.limit) else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = timeout(limit, run).await;
            });
        }
    }
}

/// The answer of a statement whose session was closed before it ran (for
/// [`ConnUse::run`]): a broken connection.
pub(crate) fn closed_session<T>() -> SqlxResult<T> {
    Err(sqlx::Error::Protocol("the session closed".into()))
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

/// What a pick found.
enum Pick {
    Use(Arc<Conn>),
    Open,
    Full,
}

impl Sessions {
    /// Opens one session, creates the token sequence (PostgreSQL, `CACHE 1
    /// NO CYCLE`) or token table (MySQL) if missing (unless
    /// `create_table=false`) and checks an existing sequence.
    pub(crate) async fn open(config: SqlConfig) -> Result<Arc<Self>, LockError> {
        let opts = Opts::new(&config)?;
        let name = opts.dialect.session_name();
        let budget = config.op_timeout.saturating_mul(2);
        crate::connection::refuse_transaction_pooling(&config, budget)
            .await
            .map_err(|e| e.with_backend(name))?;
        let (sql, first) = match timeout(budget, Self::statements(&config, &opts)).await {
            Ok(found) => found.map_err(|e| e.with_backend(name))?,
            Err(_) => {
                return Err(LockError::new(
                    ErrorKind::Timeout,
                    Operation::Connect,
                    "the database did not answer within twice the operation timeout",
                )
                .with_backend(name));
            }
        };
        let mut kept_sql = sql.clone();
        kept_sql.release = kept_release(config.dialect, &sql.release);
        let lean_sql = (config.dialect == SqlDialect::Postgres).then(|| {
            let mut lean = sql.clone();
            lean.grant = pg_lean_grant(&sql.counter);
            #[cfg(feature = "postgres")]
            {
                lean.wait = crate::dialect::postgres::pg_lean_wait(&sql.counter);
            }
            lean.release = PG_LEAN_RELEASE.to_owned();
            lean
        });
        let quiet_sql = (config.dialect == SqlDialect::Postgres).then(|| {
            let mut quiet = sql.clone();
            quiet.grant = pg_quiet_grant(&sql.counter);
            quiet.release = PG_QUIET_RELEASE.to_owned();
            quiet
        });
        let pool_size = usize::try_from(config.pool_size.unwrap_or(10))
            .unwrap_or(10)
            .max(1);
        let sessions = Arc::new(Self {
            config,
            opts,
            sql,
            kept_sql,
            lean_sql,
            quiet_sql,
            name,
            pool: Arc::new(Mutex::new(Pool::default())),
            pool_size,
            lock_table: std::sync::OnceLock::new(),
            finish_abandoned: AtomicBool::new(true),
        });
        if let Some(first) = first {
            drop(sessions.insert_slot(first, false));
        }
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

    /// The session statements for this server: on MySQL/MariaDB the
    /// server's version is read on a first session (returned, for the
    /// set): MariaDB 10.3 and later take tokens from a sequence (see
    /// `dialect::mysql`, "Session tokens on MariaDB"), MySQL keeps the
    /// token row per key.
    async fn statements(
        config: &SqlConfig,
        opts: &Opts,
    ) -> Result<(SessionSql, Option<Session>), LockError> {
        let sql = SessionSql::new(opts.dialect, &config.table);
        if config.dialect != SqlDialect::MySql {
            return Ok((sql, None));
        }
        let failed = |e| map_sqlx(config, Operation::Connect, e);
        let mut session = Session::open(opts, &sql).await.map_err(failed)?;
        let rows = fetch(&mut session.conn, &Arc::from("SELECT VERSION()"), &[], "t")
            .await
            .map_err(failed)?;
        let version = rows.first().map(|row| row[0].text()).unwrap_or_default();
        #[cfg(feature = "mysql")]
        let sql = if crate::dialect::mysql::has_run_clock(version) {
            let sql = crate::dialect::mysql::mariadb_session_sql(&config.table);
            // The run's token base now, not in the first grant's time
            // (unless the tables are still to be created).
            match session.read_run(&sql).await {
                Ok(base) => session.run_base = Some(base),
                Err(e) if crate::dialect::mysql::is_missing_table(&e) => {}
                Err(e) => return Err(failed(e)),
            }
            sql
        } else {
            sql
        };
        Ok((sql, Some(session)))
    }

    async fn prepare(&self) -> Result<(), LockError> {
        let config = &self.config;
        let mut used = self.any(Instant::now() + config.op_timeout).await?;
        // Another client creating the same sequence or table at the same
        // moment: the loser tries again (see `SchemaRace`).
        let mut race = SchemaRace::within(config.op_timeout);
        let verdict = loop {
            let Some(session) = used.session() else {
                return Err(LockError::new(
                    ErrorKind::Unavailable,
                    Operation::Connect,
                    "the session closed",
                ));
            };
            let (dialect, on) = session.on(&self.sql);
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
        if config.dialect == SqlDialect::Postgres
            && let Some(session) = used.session()
        {
            let rows = fetch(&mut session.conn, &Arc::from(PG_LOCK_TABLE), &[], "i")
                .await
                .map_err(|e| map_sqlx(config, Operation::Connect, e))?;
            if let Some(slots) = rows.first().map(|row| row[0].int()) {
                let _ = self
                    .lock_table
                    .set(u32::try_from(slots.max(0)).unwrap_or(u32::MAX));
            }
        }
        Ok(())
    }

    /// The most locks the server can hold for all its sessions together
    /// (PostgreSQL's shared lock table, read at connect; a grant past it
    /// fails with "out of shared memory"); `None` where no such limit
    /// exists (MySQL/MariaDB `GET_LOCK`: memory alone).
    pub(crate) fn server_lock_limit(&self) -> Option<u32> {
        self.lock_table.get().copied()
    }

    pub(crate) fn min_ttl(&self) -> Duration {
        self.opts.dialect.session_min_ttl()
    }

    pub(crate) fn err(&self, operation: Operation, key: &LockKey, err: sqlx::Error) -> LockError {
        map_sqlx(&self.config, operation, err)
            .with_key(key)
            .with_backend(self.name)
    }

    /// The statements for a release that leaves `left` locks of ours on
    /// the session: with none left, the release also resets the session's
    /// published grant (PostgreSQL, when it may show one: see
    /// [`Session::release`]); with some left, only the lock goes (and
    /// PostgreSQL publishes `distlock-multi`).
    pub(crate) fn release_sql(&self, left: usize) -> ReleaseSql<'_> {
        match &self.lean_sql {
            _ if left > 0 => ReleaseSql {
                sql: &self.kept_sql,
                quiet: None,
                keeps: true,
            },
            Some(lean) => ReleaseSql {
                sql: lean,
                quiet: self.quiet_sql.as_ref(),
                keeps: false,
            },
            None => ReleaseSql {
                sql: &self.sql,
                quiet: None,
                keeps: false,
            },
        }
    }

    /// The statements a grant chooses from: the full ones, and on
    /// PostgreSQL the lean and quiet ones (see [`Session::grant`]).
    pub(crate) fn grant_sql(&self) -> GrantSql<'_> {
        GrantSql {
            full: &self.sql,
            lean: self.lean_sql.as_ref(),
            quiet: self.quiet_sql.as_ref(),
        }
    }

    /// How many sessions are open now.
    pub(crate) fn open_sessions(&self) -> usize {
        self.pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .slots
            .len()
    }

    /// A session for one call (a try, an operator call): the least-used one
    /// not blocked in a server-side wait, a new one while all are in use
    /// and fewer than `pool_size` are open, waiting for one until `until`.
    pub(crate) async fn any(&self, until: Instant) -> Result<ConnUse, LockError> {
        self.any_for(until, None).await
    }

    /// As [`Sessions::any`], for a try of server lock `key` (its
    /// [`ServerKey::id`]): among equally used sessions holding equally
    /// many locks, the one whose last try was for `key`.
    pub(crate) async fn any_for(
        &self,
        until: Instant,
        key: Option<u128>,
    ) -> Result<ConnUse, LockError> {
        loop {
            let picked = self.pick(until, false, |pool, room| {
                let least = pool
                    .slots
                    .iter_mut()
                    .filter(|s| !s.waiting)
                    .min_by_key(|s| (s.users, s.held, key.is_none() || s.last_key != key));
                match least {
                    Some(slot) if slot.users == 0 || !room => {
                        slot.users += 1;
                        if key.is_some() {
                            slot.last_key = key;
                        }
                        Pick::Use(Arc::clone(&slot.conn))
                    }
                    _ if room => Pick::Open,
                    _ => Pick::Full,
                }
            });
            if let Some(used) = picked.await? {
                return Ok(used);
            }
            // Every session is blocked in a server-side wait.
            if Instant::now() >= until {
                return Err(self.full());
            }
            sleep(Duration::from_millis(5)).await;
        }
    }

    /// A session for a server-side wait: one that holds no lock and that
    /// nobody uses, or a new one while fewer than `pool_size` are open;
    /// `None` when there is none (the caller polls instead).
    pub(crate) async fn for_wait(&self, until: Instant) -> Result<Option<ConnUse>, LockError> {
        self.pick(until, true, |pool, room| {
            let empty = pool
                .slots
                .iter_mut()
                .find(|s| !s.waiting && s.users == 0 && s.held == 0);
            match empty {
                Some(slot) => {
                    slot.users += 1;
                    slot.waiting = true;
                    Pick::Use(Arc::clone(&slot.conn))
                }
                None if room => Pick::Open,
                None => Pick::Full,
            }
        })
        .await
    }

    /// The session `choose` picks (under the pool's mutex; `room`: fewer
    /// than `pool_size` are open; a closed one it picks is dropped from
    /// the set and the pick made again), locked for
    /// one call until `until` (picked again when it expired meanwhile), or
    /// a new one when it answers [`Pick::Open`] (`waiting`: for a
    /// server-side wait); `None` for [`Pick::Full`].
    async fn pick(
        &self,
        until: Instant,
        waiting: bool,
        choose: impl Fn(&mut Pool, bool) -> Pick,
    ) -> Result<Option<ConnUse>, LockError> {
        loop {
            let pick = {
                let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
                let pick = loop {
                    let room = pool.total() < self.pool_size;
                    match choose(&mut pool, room) {
                        // Closed by a call still using it (whose end drops
                        // it from the set): not one to queue behind.
                        Pick::Use(conn) if conn.is_dead() => {
                            pool.slots.retain(|s| !s.conn.is_dead());
                        }
                        pick => break pick,
                    }
                };
                if matches!(pick, Pick::Open) {
                    pool.opening += 1;
                }
                pick
            };
            match pick {
                Pick::Use(conn) => {
                    let used = self.lock(conn, until).await?;
                    if let Some(used) = self.unless_expired(used) {
                        return Ok(Some(used));
                    }
                }
                Pick::Open => return self.open_slot(until, waiting).await.map(Some),
                Pick::Full => return Ok(None),
            }
        }
    }

    /// `conn` for one call (a release, a keep-alive of its locks), waiting
    /// for its mutex until `until`; `None` when it was closed.
    pub(crate) async fn this(
        &self,
        conn: &Arc<Conn>,
        until: Instant,
    ) -> Result<Option<ConnUse>, LockError> {
        {
            let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
            match pool.slot(conn) {
                Some(slot) if !conn.is_dead() => slot.users += 1,
                _ => return Ok(None),
            }
        }
        let mut used = self.lock(Arc::clone(conn), until).await?;
        Ok(used.session().is_some().then_some(used))
    }

    /// Takes `conn`'s mutex (counted as a user already) until `until`.
    async fn lock(&self, conn: Arc<Conn>, until: Instant) -> Result<ConnUse, LockError> {
        let mutex = Arc::clone(&conn.session);
        let guard = match mutex.try_lock_owned() {
            Ok(guard) => Ok(guard),
            Err(_) => timeout_at(until, Arc::clone(&conn.session).lock_owned()).await,
        };
        // Counted as a user from here (the drop uncounts it).
        let pool = Arc::clone(&self.pool);
        match guard {
            Ok(guard) => Ok(ConnUse { conn, guard, pool }),
            Err(_) => {
                let mut pool = pool.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(slot) = pool.slot(&conn) {
                    slot.users = slot.users.saturating_sub(1);
                }
                Err(LockError::new(
                    ErrorKind::Timeout,
                    Operation::Connect,
                    "the lock's session stayed busy until the operation timeout",
                ))
            }
        }
    }

    /// `used`, unless it is an idle session the server may have ended for
    /// silence (then closed, and `None`).
    fn unless_expired(&self, mut used: ConnUse) -> Option<ConnUse> {
        let expired = used.conn.held() == 0 && used.session().is_none_or(|s| s.maybe_expired());
        if expired {
            used.close("idle too long");
            return None;
        }
        Some(used)
    }

    /// Opens a session into the set (a slot counted in `opening`), in use
    /// by the caller (for a server-side wait when `waiting`).
    async fn open_slot(&self, until: Instant, waiting: bool) -> Result<ConnUse, LockError> {
        let opened = self.open_session(until).await;
        {
            let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
            pool.opening = pool.opening.saturating_sub(1);
        }
        self.insert_slot(opened?, waiting)
    }

    /// Puts an open session into the set, in use by the caller (for a
    /// server-side wait when `waiting`).
    fn insert_slot(&self, session: Session, waiting: bool) -> Result<ConnUse, LockError> {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        let conn = Arc::new(Conn {
            id: session.id,
            session: Arc::new(tokio::sync::Mutex::new(None)),
            state: watch::channel(SessionState::Alive).0,
            held: AtomicUsize::new(0),
            dead: AtomicBool::new(false),
            orphans: Mutex::new(Vec::new()),
            orphaned: AtomicBool::new(false),
        });
        let mut guard = Arc::clone(&conn.session)
            .try_lock_owned()
            .map_err(|_| LockError::new(ErrorKind::Backend, Operation::Connect, "new session"))?;
        *guard = Some(session);
        pool.slots.push(Slot {
            conn: Arc::clone(&conn),
            users: 1,
            waiting,
            held: 0,
            last_key: None,
        });
        Ok(ConnUse {
            conn,
            guard,
            pool: Arc::clone(&self.pool),
        })
    }

    fn full(&self) -> LockError {
        LockError::new(
            ErrorKind::Timeout,
            Operation::Connect,
            format!(
                "all {} session connections of this backend are blocked in server-side waits \
                 (raise pool_size)",
                self.pool_size
            ),
        )
    }

    /// Opens a session outside the set (for a background kill, which must
    /// not wait behind the set's calls), within `until` or the operation
    /// timeout, whichever is later.
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

    /// MariaDB, whose holder rows are written lazily (see
    /// `grants::session`, "Lazy holder rows"), and PostgreSQL, whose quiet
    /// grants are published lazily ("Published grants"): how long after a
    /// grant it is published at the latest, scheduling allowing; `None`
    /// where every grant publishes itself (MySQL's token rows).
    /// For tests of this crate's safety checks only: `false` drops an
    /// abandoned statement where it stands and lets its session serve on
    /// (the broken variant of "Abandoned statements").
    pub(crate) fn set_abandon_check(&self, on: bool) {
        self.finish_abandoned.store(on, Ordering::Release);
        self.pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .abandon_check = on;
    }

    /// `statement` (which owns the session's use), run to its end even
    /// when its caller stops waiting (see [`Finish`]): given the operation
    /// timeout, or `armed` (the TTL the session's server idle timeout is
    /// armed to, [`ConnUse::armed_ttl`]) if longer, since until then the
    /// server keeps the session and its locks through a silent link.
    pub(crate) fn finish<F>(&self, armed: Option<Duration>, statement: F) -> Finish<F>
    where
        F: Future + Send + 'static,
        F::Output: Send,
    {
        let limit = self.config.op_timeout.max(armed.unwrap_or_default());
        Finish {
            run: Some(Box::pin(statement)),
            limit: self
                .finish_abandoned
                .load(Ordering::Acquire)
                .then_some(limit),
        }
    }

    pub(crate) fn publication_lag(&self) -> Option<Duration> {
        (self.sql.maria.is_some() || self.quiet_sql.is_some())
            .then(|| self.config.publish_delay + PUBLISH_MARGIN)
    }

    /// `key` as this database's server lock sees it.
    pub(crate) fn server_key(&self, key: &LockKey) -> ServerKey {
        ServerKey::of(self.config.dialect, &self.config.table, key.as_str())
    }
}

/// How much longer than the publication delay a holder row may take (the
/// publication's task wakes, takes the session, writes).
const PUBLISH_MARGIN: Duration = Duration::from_millis(50);

/// The statements a grant chooses from (see [`Session::grant`]).
#[derive(Clone, Copy)]
pub(crate) struct GrantSql<'a> {
    /// Arms the session's idle timeout for the TTL and publishes the grant.
    pub(crate) full: &'a SessionSql,
    /// PostgreSQL: publishes the grant, the settings left as armed.
    pub(crate) lean: Option<&'a SessionSql>,
    /// PostgreSQL: the lock and its token only.
    pub(crate) quiet: Option<&'a SessionSql>,
}

/// The statements a release chooses from (see [`Session::release`]).
#[derive(Clone, Copy)]
pub(crate) struct ReleaseSql<'a> {
    /// The release that resets what the session published (or, when
    /// `keeps`, publishes `distlock-multi`).
    pub(crate) sql: &'a SessionSql,
    /// PostgreSQL, the session's last lock: the bare unlock, for a
    /// session that published nothing.
    pub(crate) quiet: Option<&'a SessionSql>,
    /// The session keeps other locks of ours.
    pub(crate) keeps: bool,
}

/// PostgreSQL's lean grant: the lock and its token, and the grant
/// published, on a session whose idle timeout and TCP keep-alive are armed
/// for the lease already (`$3`, the TTL, is bound and unused).
pub(crate) fn pg_lean_grant(seq: &str) -> String {
    format!(
        "SELECT g.t, CASE WHEN g.t IS NOT NULL AND $3::text IS NOT NULL THEN \
         set_config('application_name', 'distlock ' || $2 || ' ' || g.t, false) END \
         FROM (SELECT CASE WHEN pg_try_advisory_lock($1) THEN nextval('{seq}') END AS t OFFSET 0) g"
    )
}

/// PostgreSQL's quiet grant: the lock and its token, nothing published,
/// on a session armed for the lease already that holds no other lock and
/// shows the idle marker; the grant is published later if still held (see
/// `grants::session`, "Published grants"). `$2` (the owner) and `$3` (the
/// TTL) are bound and unused: a one-time filter, evaluated before the lock.
pub(crate) fn pg_quiet_grant(seq: &str) -> String {
    format!(
        "SELECT CASE WHEN pg_try_advisory_lock($1) THEN nextval('{seq}') END \
         WHERE $2::text IS NOT NULL AND $3::text IS NOT NULL"
    )
}

/// PostgreSQL's release of a session's last lock when the session
/// published nothing (see [`Session::published`]): the unlock alone.
pub(crate) const PG_QUIET_RELEASE: &str = "SELECT pg_advisory_unlock($1)";

/// PostgreSQL's release of a session's last lock that keeps its idle
/// timeout and keep-alive armed (the next grant then needs no setting):
/// the session is then treated as ending after that timeout of silence
/// (see [`Session::maybe_expired`]).
pub(crate) const PG_LEAN_RELEASE: &str =
    "SELECT pg_advisory_unlock($1), set_config('application_name', 'distlock', false)";

/// The release of a session that keeps other locks of ours: the lock
/// alone. PostgreSQL's full release also resets the published grant and
/// the idle timeout, which the remaining locks still need; it publishes
/// `distlock-multi` instead, so that `inspect` never shows the grant of
/// another lock of the session (see `grants::session`, "Published
/// grants"). MySQL's release is the lock alone already.
pub(crate) fn kept_release(dialect: SqlDialect, full: &str) -> String {
    match dialect {
        SqlDialect::Postgres => {
            "SELECT pg_advisory_unlock($1), set_config('application_name', 'distlock-multi', false)"
                .to_owned()
        }
        SqlDialect::MySql | SqlDialect::Sqlite => full.to_owned(),
    }
}

impl Session {
    /// Opens a session and reads its server-side id (one round trip after
    /// the handshake).
    pub(crate) async fn open(opts: &Opts, sql: &SessionSql) -> Result<Self, sqlx::Error> {
        let mut conn = opts.options.connect().await?;
        // Whether the server run is started (its token base) in the same
        // round trip (see `RunSql`); the run's objects missing (the first
        // connect creates them after this session opens): read before the
        // first grant; the run not started: started now.
        let mut run_base = None;
        let run_id = match &sql.run {
            Some(run) => match fetch(&mut conn, &run.open_id, &[], "ii").await {
                Ok(rows) => {
                    let row = rows.first();
                    if let Some(crate::dialect::binds::Value::Int(base)) = row.map(|r| &r[1]) {
                        run_base = *base;
                    }
                    row.map(|row| row[0].int())
                }
                Err(e) if opts.dialect.is_missing_relation(&e) => None,
                Err(e) => return Err(e),
            },
            None => None,
        };
        let id = match run_id {
            Some(id) => id,
            None => fetch(&mut conn, &sql.session_id, &[], "i")
                .await?
                .first()
                .map(|row| row[0].int())
                .ok_or_else(|| sqlx::Error::Protocol("no session id".into()))?,
        };
        let mut session = Self {
            conn,
            dialect: opts.dialect,
            id,
            wait_timeout: None,
            armed_ttl: None,
            last_used: Instant::now(),
            fresh: true,
            published: false,
            run_base,
            opts: opts.clone(),
            in_flight: false,
        };
        if run_id.is_some() && run_base.is_none() {
            session.run_base = Some(session.read_run(sql).await?);
        }
        Ok(session)
    }

    /// Reads [`Session::run_base`] (one round trip); when the server's
    /// current run has not been started (after a crash, see `RunSql`),
    /// starts it on a connection opened for that alone, then reads again.
    async fn read_run(&mut self, sql: &SessionSql) -> SqlxResult<i64> {
        let (dialect, on) = self.on(sql);
        if let Some(base) = dialect.session_run(on).await? {
            return Ok(base);
        }
        let mut starter = self.opts.options.connect().await?;
        let on = OnSession {
            conn: &mut starter,
            sql,
            run_base: 0,
        };
        self.dialect.start_run(on).await?;
        drop(starter);
        let (dialect, on) = self.on(sql);
        dialect
            .session_run(on)
            .await?
            .ok_or_else(|| sqlx::Error::Protocol("the server run's tokens were not started".into()))
    }

    /// Whether a session that holds nothing may already have been ended by
    /// the server's idle timeout (MySQL `wait_timeout`; PostgreSQL
    /// `idle_session_timeout`, which stays armed after the last release).
    pub(crate) fn maybe_expired(&self) -> bool {
        let limit = match self.wait_timeout {
            Some(secs) => Some(Duration::from_secs(secs)),
            None => self.armed_ttl,
        };
        limit.is_some_and(|limit| self.last_used.elapsed() + Duration::from_millis(500) >= limit)
    }

    /// Where this session's statements run, with the backend's `sql`, and
    /// the dialect that runs them.
    ///
    /// Marks a statement started: the caller calls [`Session::settled`]
    /// when it ended (answered or failed); a use of the session that ends
    /// before then closes it (see "Abandoned statements").
    pub(crate) fn on<'a>(
        &'a mut self,
        sql: &'a SessionSql,
    ) -> (&'static dyn SessionDialect, OnSession<'a>) {
        self.in_flight = true;
        let conn = &mut self.conn;
        let run_base = self.run_base.unwrap_or(0);
        (
            self.dialect,
            OnSession {
                conn,
                sql,
                run_base,
            },
        )
    }

    /// The connection, for a statement of the caller's own: marked started
    /// as by [`Session::on`].
    pub(crate) fn conn_for_statement(&mut self) -> &mut DbConn {
        self.in_flight = true;
        &mut self.conn
    }

    /// The statement started by [`Session::on`] or
    /// [`Session::conn_for_statement`] ended (answered, or failed with an
    /// error): `answer`, when it is not the operation timeout's. A
    /// statement stopped by the timeout stays started, so the session's use
    /// closes it.
    pub(crate) fn settled<T>(
        &mut self,
        answer: Result<T, tokio::time::error::Elapsed>,
    ) -> Result<T, tokio::time::error::Elapsed> {
        if answer.is_ok() {
            self.in_flight = false;
        }
        answer
    }

    /// Whether a statement was started and has not ended.
    pub(crate) fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// One grant statement (see [`SessionGrant`]); the token comes back in
    /// the same statement. First makes the server end this session after
    /// the longest TTL of the locks it holds of silence, no earlier
    /// (PostgreSQL does it inside the grant statement, which is sent that
    /// TTL; MySQL needs a `SET`, one round trip, only when the value
    /// grows). `holds_others`: the session holds other locks of ours, so
    /// their TTLs count too.
    ///
    /// PostgreSQL: a try on an armed session that holds no other lock and
    /// published nothing sends the quiet grant, which leaves
    /// [`Session::published`] clear (the caller publishes the grant later if
    /// it is still held); any other grant may publish and sets it.
    pub(crate) async fn grant(
        &mut self,
        sql: GrantSql<'_>,
        grant: &SessionGrant<'_>,
        holds_others: bool,
    ) -> SqlxResult<Granted> {
        self.in_flight = true;
        let granted = self.grant_statements(sql, grant, holds_others).await;
        self.in_flight = false;
        granted
    }

    /// [`Session::grant`]'s statements.
    async fn grant_statements(
        &mut self,
        GrantSql {
            full: sql,
            lean,
            quiet,
        }: GrantSql<'_>,
        grant: &SessionGrant<'_>,
        holds_others: bool,
    ) -> SqlxResult<Granted> {
        let ttl = match self.armed_ttl {
            Some(armed) if holds_others => armed.max(grant.ttl),
            _ => grant.ttl,
        };
        if sql.run.is_some() && self.run_base.is_none() {
            self.run_base = Some(self.read_run(sql).await?);
        }
        if let Some(secs) = self.dialect.idle_timeout_secs(ttl)
            && self.wait_timeout.is_none_or(|armed| armed < secs)
        {
            self.dialect.arm_idle_timeout(&mut self.conn, secs).await?;
            self.wait_timeout = Some(secs);
        }
        // PostgreSQL: a grant on a session armed for this TTL already (and
        // for at most twice it, so the server still frees a silent
        // session's locks soon after their deadline) sets no timeout.
        let lean = lean.filter(|_| self.armed_ttl.is_some_and(|a| a >= ttl && a <= ttl * 2));
        let quiet = quiet
            .filter(|_| lean.is_some() && grant.wait.is_none() && !holds_others && !self.published);
        if quiet.is_none() {
            self.published = true;
        }
        let (dialect, on) = self.on(quiet.or(lean).unwrap_or(sql));
        let granted = dialect
            .session_grant(on, &SessionGrant { ttl, ..*grant })
            .await?;
        if lean.is_none() && matches!(granted, Granted::Token(_)) {
            self.armed_ttl = Some(ttl);
        }
        Ok(granted)
    }

    /// Releases the lock; `true` when this session held it. PostgreSQL:
    /// the bare unlock when the session published nothing, else the
    /// release that resets `application_name` (or, keeping other locks,
    /// publishes `distlock-multi`).
    pub(crate) async fn release(
        &mut self,
        sql: ReleaseSql<'_>,
        key: &ServerKey,
    ) -> SqlxResult<bool> {
        let quiet = sql.quiet.filter(|_| !self.published);
        if sql.keeps {
            self.published = true;
        }
        let (dialect, on) = self.on(quiet.unwrap_or(sql.sql));
        let released = dialect.session_release(on, key).await;
        self.in_flight = false;
        let released = released?;
        if !sql.keeps {
            // Reset (or never published): the idle marker.
            self.published = false;
        }
        Ok(released)
    }

    /// Writes a grant's holder row (see [`SessionDialect::session_publish`]).
    pub(crate) async fn publish(
        &mut self,
        sql: &SessionSql,
        publication: &crate::dialect::session::Publication<'_>,
    ) -> SqlxResult<bool> {
        // PostgreSQL: `application_name` shows it from now on.
        self.published = true;
        let (dialect, on) = self.on(sql);
        let published = dialect.session_publish(on, publication).await;
        self.in_flight = false;
        published
    }

    /// Deletes the holder row a publication wrote (see
    /// [`SessionDialect::session_withdraw`]).
    pub(crate) async fn withdraw(
        &mut self,
        sql: &SessionSql,
        key: &[u8],
        token: u64,
    ) -> SqlxResult<()> {
        let (dialect, on) = self.on(sql);
        let withdrawn = dialect.session_withdraw(on, key, token).await;
        self.in_flight = false;
        withdrawn
    }

    /// The keep-alive: a cheap query that also tells whether this session
    /// still holds the lock.
    pub(crate) async fn holds(&mut self, sql: &SessionSql, key: &ServerKey) -> SqlxResult<bool> {
        let (dialect, on) = self.on(sql);
        let holds = dialect.session_holds(on, key).await;
        self.in_flight = false;
        holds
    }

    /// The holder of `lock` as the server reports it (see
    /// [`SessionDialect::session_inspect`]).
    pub(crate) async fn inspect(
        &mut self,
        sql: &SessionSql,
        lock: SessionLock<'_>,
    ) -> SqlxResult<Option<SessionHolder>> {
        let (dialect, on) = self.on(sql);
        let found = dialect.session_inspect(on, lock).await;
        self.in_flight = false;
        found
    }

    /// Ends the session of a dropped waiting acquire on the server from
    /// this one (`pg_terminate_backend` / `KILL`): any lock it holds is
    /// freed. `owner` is the waiting acquire's owner, which identifies the
    /// session where the server can reuse ids (see
    /// [`SessionDialect::kill_session`]).
    pub(crate) async fn kill(&mut self, victim: i64, owner: &str) -> SqlxResult<()> {
        self.in_flight = true;
        let killed = self
            .dialect
            .kill_session(&mut self.conn, victim, owner)
            .await;
        self.in_flight = false;
        killed
    }
}
