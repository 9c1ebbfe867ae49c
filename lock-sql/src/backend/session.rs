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
//! # Many locks per connection
//!
//! A backend keeps a small set of server sessions (at most `pool_size`,
//! opened as concurrent calls need them) and each holds any number of
//! locks (see `crate::connection::session`): a thousand held locks can
//! live on one or two connections. Each lock records the session that
//! holds it; its release runs there (a server session lock is the
//! session's own). A waiting acquire first tries; when the key is held it
//! waits on the server on a session of its own that holds nothing (the
//! server hands the lock over the moment it is freed), or, when all
//! `pool_size` sessions hold locks, polls with tries. Server session
//! locks are re-entrant, so a backend never sends a second grant of a key
//! it holds: that grant waits locally for the release (`grants::session`).
//! [`Capabilities::max_held`](lock_core::Capabilities::max_held) says the
//! server's limit: PostgreSQL keeps advisory locks in its shared lock
//! table, sized `max_locks_per_transaction × (max_connections +
//! max_prepared_transactions)` for the whole server (6,400 with the
//! defaults; read at connect), shared with every other session, and a
//! grant past it fails with the server's "out of shared memory" error;
//! MySQL/MariaDB have no per-session limit on `GET_LOCK` locks (10.0.2+,
//! 5.7+): `None`.
//!
//! # Lease = session
//!
//! The server frees a lock only when its session ends. This backend makes
//! the server end a silent session after the longest TTL of the locks it
//! holds: PostgreSQL's `idle_session_timeout` (14+, set in the grant
//! statement, in milliseconds rounded up, reset when the session's last
//! lock is released), MySQL/MariaDB's `wait_timeout` (whole seconds rounded
//! up, raised when a longer TTL is granted). A keep-alive
//! ([`renew`](lock_core::LockBackendExt::renew)) is one query per session,
//! whatever the number of locks on it, that also checks the session still
//! holds one of them; a lease's deadline is `sent_at + ttl - drift` from
//! the send time of its session's last confirmed keep-alive, while the
//! server's idle timer starts only when that query has run: the server
//! never frees a lock before the holder's deadline has passed (a
//! partition included), and frees it about the longest TTL after the last
//! statement the server received on the session. On MySQL/MariaDB that
//! holds for a TTL within the server's own TCP keep-alive, a GLOBAL setting
//! no session can change (see the crate's caveats and `dialect::mysql`'s
//! liveness rule). When a session ends (killed, reset, timed out), every
//! lock on it is lost, and the guards of all of them are told: one lost
//! signal per session.
//!
//! # Breaking a lock
//!
//! [`force_release`](lock_core::Admin::force_release) ends the
//! holder's server session, which frees every lock on it: so it ends only
//! a session that holds this lock alone, as the grant it read (PostgreSQL
//! checks the pid, the grant's published owner and token, and that the
//! session holds no other advisory lock, in the statement that terminates
//! it; MySQL/MariaDB checks the key's holder row and that no other holder
//! row names a lock this session holds). A session holding other locks is
//! left alone (`Unsupported`).
//!
//! # Holder details and listing
//!
//! MySQL/MariaDB only, from the row the grant writes anyway (MariaDB 10.3+:
//! the `MEMORY` holder table; MySQL: the token row); none on PostgreSQL
//! (see `crate::admin::session`'s module docs).

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
/// Cheap to clone: clones share the sessions and the held locks.
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

    /// Opens one session, creates the token sequence (PostgreSQL:
    /// `UNLOGGED`, `CACHE 1 NO CYCLE`, with the durable run counter
    /// `<table>_session_runs`; MariaDB: see the crate docs) or token table
    /// (MySQL) if missing (unless `create_table=false`) and checks an
    /// existing sequence. The first session of a server run (after a
    /// crash) starts the run's tokens above every earlier run's, on a
    /// connection of its own, before its first grant.
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

    /// The quoted name of the token counter: the PostgreSQL sequence, the
    /// MariaDB run clock (the `MEMORY` row holding the run's epoch and
    /// `UUID_SHORT()` origin), or the MySQL token table.
    pub fn token_counter(&self) -> &str {
        &self.inner.sessions.sql.counter
    }

    /// Locks held through this backend right now.
    pub fn held_locks(&self) -> usize {
        self.inner.held.len()
    }

    /// Server sessions (connections) this backend has open now; at most
    /// `pool_size`, however many locks it holds.
    pub fn open_sessions(&self) -> usize {
        self.inner.sessions.open_sessions()
    }

    /// The server-side session id (PostgreSQL backend pid, MySQL
    /// connection id) that holds `lease`, while this backend holds it:
    /// for operators (`pg_terminate_backend`, `KILL`) and fault tests.
    pub fn session_id(&self, lease: &Lease) -> Option<i64> {
        let id = self.inner.sessions.server_key(lease.key()).id();
        let held = self.inner.held.find(id, lease)?;
        (!held.conn.is_dead()).then_some(held.conn.id)
    }

    /// For tests of this crate's safety checks only: `false` turns off the
    /// local table of held keys (see the crate docs, "Session mode"), so
    /// that two grants of one key through this backend can reach the
    /// server on one session, where a session lock is re-entrant and both
    /// succeed. Never turn it off in use.
    #[doc(hidden)]
    pub fn set_local_exclusion(&self, on: bool) {
        self.inner.held.set_exclusion(on);
    }

    /// For tests of this crate's safety checks only: `false` turns off the
    /// checks before a deferred publication (see the crate docs, "Lazy
    /// holder rows"): that the grant is still held (MariaDB's holder row,
    /// PostgreSQL's quiet grant) and, on PostgreSQL, that its session holds
    /// no other lock of ours, so that a publication can name a released
    /// grant, or one of several locks of a session. Never turn it off in
    /// use.
    #[doc(hidden)]
    pub fn set_publication_check(&self, on: bool) {
        self.inner.held.set_publication_check(on);
    }

    /// For tests of this crate's safety checks only: `false` turns off
    /// what keeps an abandoned statement from leaving its reply half read
    /// on a session that serves on (see "Abandoned
    /// statements" in docs/backends/sql.md): the statement is dropped
    /// where it stands and the session's next statement reads after it.
    /// Never turn it off in use.
    #[doc(hidden)]
    pub fn set_abandon_check(&self, on: bool) {
        self.inner.sessions.set_abandon_check(on);
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
            // PostgreSQL and MariaDB: one sequence for every key (nextval
            // order is the order of grants; MariaDB's raised per server
            // run); MySQL: a counter row per key.
            fencing: self.inner.sessions.sql.fencing,
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
            // MySQL/MariaDB: the holder row the grant writes (module docs).
            holder_details: self.inner.sessions.opts.dialect.session_details(),
            shared_locks: false,
            semaphores: false,
            // Many locks per session (see the module docs): the server's
            // shared lock table is the limit (PostgreSQL, an upper bound
            // shared with every other session), or memory (MySQL).
            max_held: self.inner.sessions.server_lock_limit(),
        }
    }

    // Mutexes only (a server session lock has no shared kinds); one
    // keep-alive per session, whatever the number of leases on it.
    mutex_only_kernel!();

    /// Elections are the default renewed mutex; holders are watched by
    /// polling. Listing on MySQL/MariaDB only (from the key's holder row): a
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
