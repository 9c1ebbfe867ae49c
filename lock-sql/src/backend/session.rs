//! [`SqlSessionBackend`], session mode (`?mode=session`): the lock lives in
//! a server session. Its components: the sessions
//! (`crate::connection::session`), the grants and the held locks
//! (`crate::grants::session`), the keep-alives (`crate::renewal::session`)
//! and the operating calls (`crate::admin::session`).
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
//! PostgreSQL (see `crate::admin::session`'s module docs).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::{
    Capabilities, ErrorKind, Facets, Lease, LockBackend, LockError, Operation, TtlModel,
    WaitStrategy,
};

use super::mutex_only_kernel;
use crate::admin::session::SessionAdmin;
use crate::config::{SqlConfig, SqlDialect};
use crate::connection::session::Sessions;
use crate::grants::session::{HeldLocks, SessionGrants};
use crate::renewal::session::SessionRenewal;

/// A lock service on server-session locks: PostgreSQL advisory locks or
/// MySQL/MariaDB `GET_LOCK`, with fencing tokens (see the crate docs,
/// "Session mode").
///
/// Cheap to clone: clones share the idle connections and the held locks.
/// A lease can be renewed and released only through the backend (or a
/// clone) that granted it: the lock lives in that backend's connection.
#[derive(Clone)]
pub struct SqlSessionBackend {
    inner: Arc<Parts>,
}

/// The components, each owning its concern, over one set of sessions.
struct Parts {
    sessions: Arc<Sessions>,
    held: Arc<HeldLocks>,
    grants: SessionGrants,
    renewal: SessionRenewal,
    admin: SessionAdmin,
}

impl fmt::Debug for SqlSessionBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlSessionBackend")
            .field("name", &self.inner.sessions.name)
            .field("config", &self.inner.sessions.config)
            .finish_non_exhaustive()
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
        crate::config::refuse_shedlock(&config, "SqlSessionBackend")?;
        if config.fair {
            // The server decides who gets a freed advisory lock / GET_LOCK
            // name; neither documents an order among waiting sessions.
            return Err(LockError::new(
                ErrorKind::Unsupported,
                Operation::Connect,
                "fair=true needs row mode: a server session lock (advisory lock, GET_LOCK) \
                 grants its waiters in no documented order",
            )
            .with_backend(crate::config::NAME));
        }
        let sessions = Sessions::open(config).await?;
        let held = Arc::new(HeldLocks::default());
        let parts = Parts {
            grants: SessionGrants::new(Arc::clone(&sessions), Arc::clone(&held)),
            renewal: SessionRenewal::new(Arc::clone(&sessions), Arc::clone(&held)),
            admin: SessionAdmin::new(Arc::clone(&sessions)),
            sessions,
            held,
        };
        Ok(Self {
            inner: Arc::new(parts),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SqlConfig {
        &self.inner.sessions.config
    }

    /// The dialect.
    pub fn dialect(&self) -> SqlDialect {
        self.inner.sessions.config.dialect
    }

    /// The quoted name of the token counter: the PostgreSQL sequence or
    /// the MySQL/MariaDB token table.
    pub fn token_counter(&self) -> &str {
        &self.inner.sessions.sql.counter
    }

    /// Locks held through this backend right now (each pins a connection).
    pub fn held_locks(&self) -> usize {
        self.inner.held.len()
    }

    /// The server-side session id (PostgreSQL backend pid, MySQL
    /// connection id) that holds `lease`, while this backend holds it:
    /// for operators (`pg_terminate_backend`, `KILL`) and fault tests.
    pub async fn session_id(&self, lease: &Lease) -> Option<i64> {
        let held = self.inner.held.find(lease)?;
        let slot = held.session.lock().await;
        slot.as_ref().map(|p| p.session.id)
    }

    /// Always an error: session mode holds a server session lock (an
    /// advisory lock, `GET_LOCK`) and no row with an owner and a token, so
    /// no statement of another connection can check, atomically with its
    /// write, that the lock is still held (`pg_locks` and `IS_USED_LOCK`
    /// take no lock that a release or a killed session would wait for).
    /// Guard such writes with the fencing token at the resource, or use
    /// row mode ([`SqlBackend::owner_predicate`](crate::SqlBackend::owner_predicate)).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`], always.
    pub fn owner_predicate(
        &self,
        lease: &Lease,
        _first_placeholder: usize,
    ) -> Result<crate::OwnerPredicate, LockError> {
        Err(crate::guarded::unsupported(
            lease,
            "session mode has no lease row to check in a statement: an ownership predicate \
             needs row mode (mode=row); guard the write with the fencing token instead",
        ))
    }
}

#[async_trait]
impl LockBackend for SqlSessionBackend {
    fn name(&self) -> &'static str {
        self.inner.sessions.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // PostgreSQL: one sequence for every key (nextval order is the
            // order of grants); MySQL/MariaDB: a counter row per key.
            fencing: self.inner.sessions.opts.dialect.session_fencing(),
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
            min_ttl: self.inner.sessions.min_ttl(),
            // MySQL/MariaDB: the token row the grant writes (module docs).
            holder_details: self.inner.sessions.opts.dialect.session_details(),
            shared_locks: false,
            semaphores: false,
            // A connection per held or waiting lock.
            max_held: Some(u32::try_from(self.inner.sessions.pool_size).unwrap_or(u32::MAX)),
        }
    }

    // Mutexes only (a server session lock has no shared kinds); one
    // keep-alive per lease, each on its own pinned session.
    mutex_only_kernel!();

    /// Elections are the default renewed mutex; holders are watched by
    /// polling. Listing on MySQL/MariaDB only (from the key's token row): a
    /// PostgreSQL advisory lock is known to the server by a 64-bit hash of
    /// its key alone, so there is nothing to list there; breaking a lock
    /// (ending its holder's session) works on both.
    fn facets(&self) -> Facets<'_> {
        let admin = &self.inner.admin;
        Facets {
            listing: match self.dialect() {
                SqlDialect::MySql => Some(admin),
                _ => None,
            },
            admin: Some(admin),
            ..Facets::default()
        }
    }
}
