//! Session mode (`?mode=session`): the lock lives in a server session.
//!
//! PostgreSQL session-level advisory locks (`pg_try_advisory_lock`,
//! `pg_advisory_lock`, `pg_advisory_unlock`) and MySQL/MariaDB `GET_LOCK`
//! / `RELEASE_LOCK`, each with a fencing token taken in the same statement.
//! See the crate docs ("Session mode") for the trade-off.
//!
//! # One connection per held lock
//!
//! A grant pins the connection that took it until the lock is released on
//! that same connection, which then goes back to this backend's idle list.
//! A waiting acquire pins one too (the server does the waiting). So one
//! backend holds or waits for at most `pool_size` locks at a time (default
//! 10; more acquires wait for a connection until their deadline;
//! [`Capabilities::max_held`](lock_core::Capabilities::max_held) says so),
//! and the database needs one connection per held lock.
//!
//! # Lease = session
//!
//! The server frees a lock only when its session ends. This backend makes
//! the server end a silent session after the lease's TTL: PostgreSQL's
//! `idle_session_timeout` (14+, set in the grant statement, in
//! milliseconds rounded up, reset at release), MySQL/MariaDB's
//! `wait_timeout` (whole seconds rounded up, set when it changes). A
//! keep-alive ([`renew`](lock_core::LockBackendExt::renew)) is a query on the
//! pinned connection that also checks the session still holds the lock;
//! the lease's deadline is `sent_at + ttl - drift` from the send time of
//! the last confirmed keep-alive, while the server's idle timer starts
//! only when that query has run: the server never frees the lock before
//! the holder's deadline has passed (a partition included), and frees it
//! about `ttl` after the last keep-alive the server received. On
//! MySQL/MariaDB that holds for a TTL within the server's own TCP
//! keep-alive, a GLOBAL setting no session can change (see the crate's
//! caveats and `dialect::mysql`'s liveness rule).
//!
//! # Breaking a lock
//!
//! [`force_release`](lock_core::Admin::force_release) ends the
//! holder's server session, which frees that one lock: a session of this
//! backend holds at most one (see above). It ends only a session that
//! still holds the lock as the grant it read (PostgreSQL checks the pid,
//! the grant's published owner and token, and that the session holds no
//! other advisory lock, in the statement that terminates it); anything
//! else is refused.
//!
//! # Holder details and listing
//!
//! MySQL/MariaDB only, from the token row the grant writes anyway; none on
//! PostgreSQL (see `list.rs`'s module docs).

mod any;
pub(crate) mod conn;
mod grant;
mod list;
pub(crate) mod names;
pub(crate) mod sql;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::election::ElectionPage;
use lock_core::{
    Admin, Capabilities, ErrorKind, Facets, FencingToken, GcReport, GrantRequest, HolderInfo,
    Lease, ListQuery, Listing, LockBackend, LockError, LockInfo, LockKey, LockPage, LockShape,
    Operation, OwnerId, RENEW_CONCURRENCY, RandomKeys, SessionState, SharedPage, TtlModel,
    WaitStrategy, check_ttl, renew_concurrently, unsupported_shape, validity_deadline,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::time::{Instant, timeout, timeout_at};

pub use any::SqlAnyBackend;
use conn::{KillTarget, Killed, Opts, ServerKey, Session};
use list::holder_info;
use sql::SessionSql;

use crate::config::{SqlConfig, SqlDialect};
use crate::conn::SchemaRace;
use crate::error::map_sqlx;

/// The shortest TTL on PostgreSQL (`idle_session_timeout` has millisecond
/// precision).
pub const PG_SESSION_MIN_TTL: Duration = Duration::from_millis(10);

/// The shortest TTL on MySQL/MariaDB (`wait_timeout` counts whole seconds).
pub const MYSQL_SESSION_MIN_TTL: Duration = Duration::from_secs(1);

/// A lock service on server-session locks: PostgreSQL advisory locks or
/// MySQL/MariaDB `GET_LOCK`, with fencing tokens (see the crate docs,
/// "Session mode").
///
/// Cheap to clone: clones share the idle connections and the held locks.
/// A lease can be renewed and released only through the backend (or a
/// clone) that granted it: the lock lives in that backend's connection.
#[derive(Clone)]
pub struct SqlSessionBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: SqlConfig,
    opts: Opts,
    sql: SessionSql,
    name: &'static str,
    /// Connections not pinned by a lock, most recently used last.
    idle: Mutex<Vec<Session>>,
    /// One permit per connection in use (pinned by a lock or a call).
    in_use: Arc<Semaphore>,
    pool_size: usize,
    /// Held locks by owner id (random, this backend's own: hashed by
    /// folding).
    held: Mutex<HashMap<OwnerId, Arc<Held>, RandomKeys>>,
}

/// A held lock and its pinned session (whose channel its guard watches).
struct Held {
    key: LockKey,
    token: FencingToken,
    server_key: ServerKey,
    session: tokio::sync::Mutex<Option<Pinned>>,
}

/// A session checked out of the idle list, with its permit.
struct Pinned {
    session: Session,
    _permit: OwnedSemaphorePermit,
}

impl fmt::Debug for SqlSessionBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlSessionBackend")
            .field("name", &self.inner.name)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// Whether the connection itself broke (its session, and any lock it held,
/// is gone on the server).
fn is_broken(err: &sqlx::Error) -> bool {
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

impl SqlSessionBackend {
    /// Connects with a URL (see [`SqlConfig::from_url`]); `mode` is
    /// ignored (this is session mode).
    ///
    /// # Errors
    ///
    /// As [`SqlConfig::from_url`] and [`connect`](Self::connect).
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes whatever was opened.
    pub async fn connect_url(url: &str) -> Result<Self, LockError> {
        Self::connect(SqlConfig::from_url(url)?).await
    }

    /// Opens one session, creates the token sequence (PostgreSQL, `CACHE 1
    /// NO CYCLE`) or token table (MySQL) if missing (unless
    /// `create_table=false`) and checks an existing sequence.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] on SQLite, for a sequence with a cache or
    /// cycling, or a dialect whose feature is off;
    /// [`ErrorKind::Unsupported`] for `fair=true` (session locks have no
    /// fair order);
    /// [`ErrorKind::Unavailable`] / [`ErrorKind::Timeout`] when the
    /// database cannot be reached within the operation timeout;
    /// [`ErrorKind::Backend`] when creating the schema fails.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes the session it opened. A sequence
    /// or table created meanwhile stays (creation is idempotent).
    pub async fn connect(config: SqlConfig) -> Result<Self, LockError> {
        crate::shedlock::refuse_shedlock(&config, "SqlSessionBackend")?;
        if config.fair {
            // The server decides who gets a freed advisory lock / GET_LOCK
            // name; neither documents an order among waiting sessions.
            return Err(LockError::new(
                ErrorKind::Unsupported,
                Operation::Connect,
                "fair=true needs row mode: a server session lock (advisory lock, GET_LOCK) \
                 grants its waiters in no documented order",
            )
            .with_backend(crate::driver::NAME));
        }
        let opts = Opts::new(&config)?;
        let name = opts.dialect.session_name();
        let sql = SessionSql::new(opts.dialect, &config.table);
        let pool_size = usize::try_from(config.pool_size.unwrap_or(10)).unwrap_or(10);
        let backend = Self {
            inner: Arc::new(Inner {
                config,
                opts,
                sql,
                name,
                idle: Mutex::new(Vec::new()),
                in_use: Arc::new(Semaphore::new(pool_size)),
                pool_size,
                held: Mutex::new(HashMap::default()),
            }),
        };
        let budget = backend.inner.config.op_timeout.saturating_mul(2);
        let prepared = timeout(budget, backend.prepare())
            .await
            .unwrap_or_else(|_| {
                Err(LockError::new(
                    ErrorKind::Timeout,
                    Operation::Connect,
                    "the database did not answer within twice the operation timeout",
                ))
            });
        prepared.map_err(|e| e.with_backend(name))?;
        Ok(backend)
    }

    async fn prepare(&self) -> Result<(), LockError> {
        let config = &self.inner.config;
        let mut pinned = self.checkout(Instant::now() + config.op_timeout).await?;
        // Another client creating the same sequence or table at the same
        // moment: the loser tries again (see `SchemaRace`).
        let mut race = SchemaRace::within(config.op_timeout);
        let verdict = loop {
            match pinned
                .session
                .prepare_schema(&self.inner.sql, config.create_table)
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

    /// The configuration.
    pub fn config(&self) -> &SqlConfig {
        &self.inner.config
    }

    /// The dialect.
    pub fn dialect(&self) -> SqlDialect {
        self.inner.config.dialect
    }

    /// The quoted name of the token counter: the PostgreSQL sequence or
    /// the MySQL/MariaDB token table.
    pub fn token_counter(&self) -> &str {
        &self.inner.sql.counter
    }

    /// Locks held through this backend right now (each pins a connection).
    pub fn held_locks(&self) -> usize {
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// The server-side session id (PostgreSQL backend pid, MySQL
    /// connection id) that holds `lease`, while this backend holds it:
    /// for operators (`pg_terminate_backend`, `KILL`) and fault tests.
    pub async fn session_id(&self, lease: &Lease) -> Option<i64> {
        let held = self.find(lease)?;
        let slot = held.session.lock().await;
        slot.as_ref().map(|p| p.session.id)
    }

    fn min_ttl(&self) -> Duration {
        self.inner.opts.dialect.session_min_ttl()
    }

    fn err(&self, operation: Operation, key: &LockKey, err: sqlx::Error) -> LockError {
        map_sqlx(&self.inner.config, operation, err)
            .with_key(key)
            .with_backend(self.inner.name)
    }

    /// A session for one call: an idle one (dropping those the server may
    /// have ended for silence) or a new one, waiting for a free connection
    /// until `until`.
    async fn checkout(&self, until: Instant) -> Result<Pinned, LockError> {
        let closed = || LockError::new(ErrorKind::Unavailable, Operation::Connect, "closed");
        // A free permit is taken without arming a timer (a `Sleep` costs a
        // runtime handle and a timer entry even when it never waits). No
        // queue jumping: a permit released while acquires wait goes to the
        // first waiter, never back to the free count.
        let permit = match Arc::clone(&self.inner.in_use).try_acquire_owned() {
            Ok(permit) => permit,
            Err(TryAcquireError::Closed) => return Err(closed()),
            Err(TryAcquireError::NoPermits) => {
                timeout_at(until, Arc::clone(&self.inner.in_use).acquire_owned())
                    .await
                    .map_err(|_| {
                        LockError::new(
                            ErrorKind::Timeout,
                            Operation::Connect,
                            format!(
                                "all {} session connections of this backend are in use (each held \
                                 lock or waiting acquire pins one; raise pool_size)",
                                self.inner.pool_size
                            ),
                        )
                    })?
                    .map_err(|_| closed())?
            }
        };
        let reused = {
            let mut idle = self
                .inner
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
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

    async fn open_session(&self, until: Instant) -> Result<Session, LockError> {
        let config = &self.inner.config;
        let until = until.max(Instant::now() + config.op_timeout);
        match timeout_at(until, Session::open(&self.inner.opts, &self.inner.sql)).await {
            Ok(Ok(session)) => Ok(session),
            Ok(Err(e)) => Err(map_sqlx(config, Operation::Connect, e)),
            Err(_) => Err(LockError::new(
                ErrorKind::Timeout,
                Operation::Connect,
                "could not open a database session within the operation timeout",
            )),
        }
    }

    fn checkin(&self, pinned: Pinned) {
        let Pinned { mut session, .. } = pinned;
        // Read only under a server idle timer (`Session::maybe_expired`);
        // a PostgreSQL session has none while idle (reset at release).
        if session.wait_timeout.is_some() {
            session.idle_since = Instant::now();
        }
        let mut idle = self
            .inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.inner.pool_size {
            idle.push(session);
        }
    }

    fn find(&self, lease: &Lease) -> Option<Arc<Held>> {
        let held = self
            .inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        held.get(&lease.owner())
            .filter(|h| h.key == *lease.key() && h.token == lease.token())
            .cloned()
    }

    fn forget(&self, lease: &Lease) -> Option<Arc<Held>> {
        let mut held = self
            .inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // One lookup: the entry is removed only when it is this grant.
        match held.entry(lease.owner()) {
            Entry::Occupied(found)
                if found.get().key == *lease.key() && found.get().token == lease.token() =>
            {
                Some(found.remove())
            }
            _ => None,
        }
    }
}

#[async_trait]
impl LockBackend for SqlSessionBackend {
    fn name(&self) -> &'static str {
        self.inner.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // PostgreSQL: one sequence for every key (nextval order is the
            // order of grants); MySQL/MariaDB: a counter row per key.
            fencing: self.inner.opts.dialect.session_fencing(),
            // Sequences and rows are durable; see the crate docs for
            // asynchronous replicas.
            fencing_survives_failover: true,
            // The lock is the server session's: a restart ends the session
            // and frees it at once (the holder learns at its next
            // keep-alive). A negative control of the restart scenario.
            grants_survive_restart: false,
            // The server wakes the waiting session at the release.
            waiting: WaitStrategy::Notify,
            fifo: false,
            ttl_model: TtlModel::PerSession,
            linearizable: true,
            min_ttl: self.min_ttl(),
            // MySQL/MariaDB: the token row the grant writes (module docs).
            holder_details: self.inner.opts.dialect.session_details(),
            shared_locks: false,
            semaphores: false,
            // A connection per held or waiting lock.
            max_held: Some(u32::try_from(self.inner.pool_size).unwrap_or(u32::MAX)),
        }
    }

    /// Mutexes only: a server session lock has no shared kinds.
    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        request.mutex_only(self.inner.name)?;
        let GrantRequest {
            key, ttl, deadline, ..
        } = request;
        match deadline {
            None => self.try_take(key, ttl).await,
            Some(deadline) => self.take_waiting(key, ttl, deadline).await.map(Some),
        }
    }

    /// One keep-alive per lease, each on its own pinned session.
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        renew_concurrently(leases, RENEW_CONCURRENCY, |lease| self.renew_one(lease)).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(held) = self.forget(lease) else {
            return Ok(false);
        };
        // No signal on the session's channel: the session lives on (its
        // guard deregistered before releasing).
        let mut slot = held.session.lock().await;
        // Taken out: if this future is dropped, the connection is closed
        // with it and the server frees the lock.
        let Some(mut pinned) = slot.take() else {
            return Ok(false);
        };
        drop(slot);
        let released = timeout(
            self.inner.config.op_timeout,
            pinned.session.release(&self.inner.sql, &held.server_key),
        )
        .await;
        match released {
            Ok(Ok(true)) => {
                self.checkin(pinned);
                Ok(true)
            }
            // Not ours any more (someone ran pg_advisory_unlock_all?): the
            // session's state is unclear, close it.
            Ok(Ok(false)) => Ok(false),
            // The session is gone, and its lock with it.
            Ok(Err(e)) if is_broken(&e) => Ok(false),
            Ok(Err(e)) => Err(self.err(Operation::Release, lease.key(), e)),
            Err(_) => Err(LockError::new(
                ErrorKind::Timeout,
                Operation::Release,
                "the release did not answer within the operation timeout; its session was \
                 closed, so the server frees the lock when it notices (at the latest after the TTL)",
            )
            .with_key(lease.key())
            .with_backend(self.inner.name)),
        }
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        if shape != LockShape::Mutex {
            return Err(unsupported_shape(self.inner.name, key, shape));
        }
        Ok(lock_core::kind::mutex_holders(
            self.inspect_mutex(key).await?,
        ))
    }

    /// Elections are the default renewed mutex; holders are watched by
    /// polling. Listing on MySQL/MariaDB only (from the key's token row): a
    /// PostgreSQL advisory lock is known to the server by a 64-bit hash of
    /// its key alone, so there is nothing to list there; breaking a lock
    /// (ending its holder's session) works on both.
    fn facets(&self) -> Facets<'_> {
        Facets {
            listing: match self.dialect() {
                SqlDialect::MySql => Some(self),
                _ => None,
            },
            admin: Some(self),
            ..Facets::default()
        }
    }
}

#[async_trait]
impl Admin for SqlSessionBackend {
    /// Breaks the lock by ending the holder's server session
    /// (`pg_terminate_backend` / `KILL CONNECTION`): see the crate docs,
    /// "Operating locks". Returns the holder as [`inspect`](lock_core::LockBackendExt::inspect)
    /// reported it just before, or `None` when the key was free.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] when the holder is not a session-mode
    /// grant of this crate (another client's session, or on PostgreSQL a
    /// session that holds other advisory locks too): it is left alone;
    /// [`ErrorKind::Contended`] when the holder changed three times while
    /// it was read; [`ErrorKind::Timeout`] / [`ErrorKind::Unavailable`]
    /// as the other calls; [`ErrorKind::Backend`] without the privilege to
    /// end another session (PostgreSQL: the holder's role, a superuser or
    /// `pg_signal_backend`; MySQL/MariaDB: the same user, else
    /// `CONNECTION_ADMIN` / `CONNECTION ADMIN` or `SUPER`).
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes its session; the holder's session
    /// may or may not have been ended by then.
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.break_lock(key)
            .await
            .map_err(|e| e.with_key(key).with_backend(self.inner.name))
    }

    /// Collects nothing, by design: a session lock leaves nothing behind
    /// on the server, and the token counters (PostgreSQL's one sequence
    /// for every key, MySQL/MariaDB's row per key) are each key's only
    /// record of its last token, so none may be deleted (see `list.rs`'s
    /// module docs, "No `gc`"). Answers an empty report: nothing removed,
    /// nothing to run again for.
    ///
    /// # Errors
    ///
    /// None.
    ///
    /// # Cancel safety
    ///
    /// Safe: nothing is sent.
    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError> {
        let _ = older_than;
        tracing::debug!(
            backend = self.inner.name,
            "gc in session mode: nothing to collect (the token counters are each key's only \
             record of its last token)"
        );
        Ok(GcReport::default())
    }
}

#[async_trait]
impl Listing for SqlSessionBackend {
    /// MySQL/MariaDB: one statement per page over the token rows, each
    /// listed while the connection of its last grant holds its lock (see
    /// the module docs, "Holder details and listing").
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] on PostgreSQL; `InvalidArgument` for a
    /// bad page size or cursor; `Timeout` / `Unavailable` / `Backend` as
    /// `inspect`.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only (a dropped call closes its connection).
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        self.list_tokens(query)
            .await
            .map_err(|e| e.with_backend(self.inner.name))
    }

    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        match shape {
            LockShape::Mutex => lock_core::list_mutex_shared(self, query).await,
            other => Err(self.unsupported_admin(&format!("listing {other} locks"))),
        }
    }

    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        lock_core::election::list_mutex_elections(self, query).await
    }
}

/// The mutex's calls, which [`LockBackend::grant`] and
/// [`LockBackend::renew_many`] reach.
impl SqlSessionBackend {
    async fn try_take(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.grant_session(key, ttl, None, Operation::TryAcquire)
            .await
    }

    async fn take_waiting(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        match self
            .grant_session(key, ttl, Some(deadline), Operation::Acquire)
            .await?
        {
            Some(lease) => Ok(lease),
            None => Err(LockError::new(
                ErrorKind::Contended,
                Operation::Acquire,
                "still held by another session at the wait deadline",
            )
            .with_key(key)
            .with_backend(self.inner.name)),
        }
    }

    async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        let key = lease.key();
        let name = self.inner.name;
        let not_held = |why: &str| {
            LockError::new(ErrorKind::NotHeld, Operation::Renew, why.to_owned())
                .with_key(key)
                .with_backend(name)
        };
        check_ttl(lease.ttl(), self.min_ttl(), Operation::Renew)
            .map_err(|e| e.with_key(key).with_backend(name))?;
        let Some(held) = self.find(lease) else {
            return Err(not_held(
                "not held by this backend (released, lost, another owner, or granted elsewhere)",
            ));
        };
        let mut slot = held.session.lock().await;
        let Some(pinned) = slot.as_mut() else {
            drop(slot);
            self.forget(lease);
            return Err(not_held("the lock's session has ended"));
        };
        let sent_at = Instant::now();
        // A dropped or timed-out keep-alive leaves the connection pinned:
        // sqlx drains the late reply before the next statement, and the
        // session (and the lock) lives on until the server's idle timeout.
        let confirmed = timeout(
            self.inner.config.op_timeout,
            pinned.session.holds(&self.inner.sql, &held.server_key),
        )
        .await;
        match confirmed {
            Ok(Ok(true)) => Ok(validity_deadline(sent_at, lease.ttl())),
            Ok(Ok(false)) => {
                let _ = pinned.session.state.send(SessionState::Lost(
                    "the session no longer holds the lock".into(),
                ));
                *slot = None;
                drop(slot);
                self.forget(lease);
                Err(not_held("the session no longer holds the lock"))
            }
            Ok(Err(e)) if is_broken(&e) => {
                let reason = format!(
                    "the lock's session ended: {}",
                    self.inner.config.scrub(&e.to_string())
                );
                let _ = pinned
                    .session
                    .state
                    .send(SessionState::Lost(reason.clone()));
                *slot = None;
                drop(slot);
                self.forget(lease);
                Err(
                    LockError::new(ErrorKind::LeaseLost, Operation::Renew, reason)
                        .with_key(key)
                        .with_backend(name),
                )
            }
            Ok(Err(e)) => Err(self.err(Operation::Renew, key, e)),
            Err(_) => Err(LockError::new(
                ErrorKind::Timeout,
                Operation::Renew,
                "the keep-alive was not confirmed within the operation timeout",
            )
            .with_key(key)
            .with_backend(name)),
        }
    }

    async fn inspect_mutex(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let op_timeout = self.inner.config.op_timeout;
        let mut pinned = self
            .checkout(Instant::now() + op_timeout)
            .await
            .map_err(|e| e.with_key(key).with_backend(self.inner.name))?;
        let server_key = ServerKey::of(
            self.inner.config.dialect,
            &self.inner.config.table,
            key.as_str(),
        );
        let found = timeout(
            op_timeout,
            pinned
                .session
                .inspect(&self.inner.sql, key.as_str().as_bytes(), &server_key),
        )
        .await;
        let found = match found {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => return Err(self.err(Operation::Inspect, key, e)),
            Err(_) => {
                return Err(LockError::new(
                    ErrorKind::Timeout,
                    Operation::Inspect,
                    "inspect did not answer within the operation timeout",
                )
                .with_key(key)
                .with_backend(self.inner.name));
            }
        };
        self.checkin(pinned);
        Ok(found.map(|holder| holder_info(key.clone(), holder)))
    }
}

impl SqlSessionBackend {
    /// `force_release`: reads the holder as `inspect` does, then ends its
    /// server session only if it still holds the lock as that grant (and,
    /// on PostgreSQL, holds no other advisory lock), and waits (up to the
    /// operation timeout) for the server to free it. A holder that changed
    /// in between is read again (three times at most).
    async fn break_lock(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let op_timeout = self.inner.config.op_timeout;
        let server_key = ServerKey::of(
            self.inner.config.dialect,
            &self.inner.config.table,
            key.as_str(),
        );
        let key_bytes = key.as_str().as_bytes();
        let sql = &self.inner.sql;
        let timed_out = || {
            LockError::new(
                ErrorKind::Timeout,
                Operation::Inspect,
                "force_release did not answer within the operation timeout",
            )
        };
        let mut pinned = self.checkout(Instant::now() + op_timeout).await?;
        for _ in 0..3 {
            let found = timeout(
                op_timeout,
                pinned.session.inspect(sql, key_bytes, &server_key),
            )
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| self.err(Operation::Inspect, key, e))?;
            let Some(holder) = found else {
                self.checkin(pinned);
                return Ok(None);
            };
            let victim = holder.session;
            let (Some(owner), Some(token)) = (holder.owner.clone(), holder.token) else {
                self.checkin(pinned);
                return Err(LockError::new(
                    ErrorKind::Unsupported,
                    Operation::Inspect,
                    format!(
                        "{key} is held by server session {victim}, which is not a distlock \
                         session-mode grant: ending it could break that client's other locks \
                         and transactions, so it is left alone (end it yourself if you must)"
                    ),
                ));
            };
            let ended = timeout(
                op_timeout.saturating_mul(2),
                pinned.session.kill_holder(
                    sql,
                    KillTarget {
                        key: key_bytes,
                        server_key: &server_key,
                        victim,
                        owner: &owner,
                        token,
                    },
                    op_timeout,
                ),
            )
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| self.err(Operation::Inspect, key, e))?;
            match ended {
                Killed::Ended => {
                    self.checkin(pinned);
                    return Ok(Some(holder_info(key.clone(), holder)));
                }
                Killed::HoldsOthers(others) => {
                    self.checkin(pinned);
                    return Err(LockError::new(
                        ErrorKind::Unsupported,
                        Operation::Inspect,
                        format!(
                            "{key} is held by server session {victim}, which also holds {others} \
                             other advisory lock(s) (not one of this crate's session-mode \
                             backends, which hold one lock per session): ending it would break \
                             those too, so it is left alone"
                        ),
                    ));
                }
                Killed::Changed => {}
            }
        }
        self.checkin(pinned);
        Err(LockError::new(
            ErrorKind::Contended,
            Operation::Inspect,
            "the holder changed three times while force_release read it",
        ))
    }

    fn unsupported_admin(&self, what: &str) -> LockError {
        LockError::new(
            ErrorKind::Unsupported,
            Operation::Inspect,
            format!("{} does not support {what}", self.inner.name),
        )
        .with_backend(self.inner.name)
    }
}
