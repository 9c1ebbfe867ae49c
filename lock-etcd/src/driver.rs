//! The [`LockBackend`] implementation for etcd.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnResponse};
use lock_core::election::{ElectionPage, Leader};
use lock_core::{
    Admin, Capabilities, Downgrade, Elections, ErrorKind, Facets, FencingScope, GcReport,
    GrantRequest, HolderInfo, HolderWatch, Lease, LeaseKind, ListQuery, Listing, LockBackend,
    LockError, LockInfo, LockKey, LockPage, LockSets, LockShape, Operation, SharedPage, TtlModel,
    WaitStrategy, saturating_add, validity_deadline, with_timeout,
};
use tokio::time::Instant;

use crate::cleanup::clean_up_later;
use crate::config::EtcdConfig;
use crate::connect::connect_client;
use crate::error::{NAME, from_etcd, protocol_error, relabel};
use crate::keys::{self, guarded_delete, key_prefix};
use crate::session::{Session, revoke_in_background, ttl_secs};

// Acquiring: the create, the grant, the waiting acquire and its watches.
#[path = "waiting.rs"]
mod waiting;

// Read-write locks and semaphores.
#[path = "shared.rs"]
mod shared;

// Elections in the layout of etcd's `concurrency.Election`.
#[path = "election.rs"]
mod election;

// A set of keys in one transaction.
#[path = "multi.rs"]
mod multi;

// Renewing our own sessions' grants, one by one and in batches.
#[path = "renewal.rs"]
mod renewal;

// Holder details, force_release, gc.
#[path = "admin.rs"]
mod admin;

// list, list_shared, list_elections: one range read per page.
#[path = "listing.rs"]
mod listing;

// Revoking sessions of other TTLs once idle.
#[path = "retire.rs"]
mod retire;

/// The shortest TTL etcd leases have: one second (the server may raise it
/// further, to 1.5 election timeouts).
pub const MIN_TTL: Duration = Duration::from_secs(1);

/// A lock service on etcd: leases, revisions as fencing tokens, FIFO waits.
///
/// See the [crate docs](crate) for the layout and the TTL model. Clones
/// share the connection and the sessions. Create it with
/// [`EtcdBackend::connect`] (or [`crate::connect`] from a URL).
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: EtcdConfig,
    /// Normalized prefix, without a trailing separator.
    prefix: String,
    /// The sessions of each server TTL (in whole seconds): usually one;
    /// another is started when those alive have no room left (see
    /// [`crate::session::LISTING_BUDGET`]).
    sessions: Mutex<HashMap<u64, Vec<Arc<Session>>>>,
    /// Serializes session creation so concurrent acquires grant one lease.
    creating: tokio::sync::Mutex<()>,
    /// The keys each session's lease had at its last listing, shared by the
    /// renewal batches of one round (see `renewal.rs`).
    attached: tokio::sync::Mutex<HashMap<i64, renewal::Attached>>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sessions: Vec<String> = lock(&self.inner.sessions)
            .values()
            .flatten()
            .map(|s| format!("{s:?}"))
            .collect();
        f.debug_struct("EtcdBackend")
            .field("config", &self.inner.config)
            .field("sessions", &sessions)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl EtcdBackend {
    /// Connects to the cluster and grants the default session's lease.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for an invalid configuration or rejected
    /// credentials, [`ErrorKind::Unavailable`] / [`ErrorKind::Timeout`] when
    /// no endpoint answers within the timeouts.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave a granted lease behind; it expires with
    /// its TTL.
    pub async fn connect(config: EtcdConfig) -> Result<Self, LockError> {
        let client = connect_client(&config).await?;
        let prefix = config.prefix.trim_end_matches('/').to_owned();
        let backend = Self {
            inner: Arc::new(Inner {
                client,
                prefix,
                sessions: Mutex::new(HashMap::new()),
                creating: tokio::sync::Mutex::new(()),
                attached: tokio::sync::Mutex::default(),
                config,
            }),
        };
        let ttl = backend.inner.config.ttl;
        backend
            .session_for(ttl, Operation::Connect)
            .await
            .map_err(|e| e.with_backend(NAME))?;
        backend.retire_idle_sessions();
        Ok(backend)
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The underlying etcd client (for diagnostics and tests).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The prefix under which `key`'s entries live, ending with the
    /// separator: `<prefix>/<escaped key>/`. `etcdctl lock` on the same
    /// name without the trailing `/` takes the same lock.
    pub fn key_prefix(&self, key: &LockKey) -> String {
        key_prefix(&self.inner.prefix, key)
    }

    /// The lease id (hex, as in entry names) of the session used for `ttl`,
    /// if it exists and is alive (the first of them, when the locks held
    /// with this TTL fill more than one: see [`Self::session_leases`]).
    pub fn session_lease(&self, ttl: Duration) -> Option<String> {
        self.session_leases(ttl).into_iter().next()
    }

    /// The lease ids (hex) of every live session used for `ttl`, oldest
    /// first. A session takes new grants until its key listing, which
    /// every renewal round reads, reaches 2 MiB (some 44,000 locks with
    /// 20-byte keys); then another session is started.
    pub fn session_leases(&self, ttl: Duration) -> Vec<String> {
        let secs = ttl_secs(ttl);
        lock(&self.inner.sessions)
            .get(&secs)
            .into_iter()
            .flatten()
            .filter(|s| s.is_alive())
            .map(|s| s.lease_hex())
            .collect()
    }

    /// Revokes every session lease: every lock held through this backend is
    /// released at once (their guards report them lost). Later acquires start
    /// new sessions.
    ///
    /// # Errors
    ///
    /// The first revoke that failed (timeout, unavailable); such a lease
    /// expires with its TTL.
    ///
    /// # Cancel safety
    ///
    /// Safe: leases not yet revoked expire with their TTL.
    pub async fn close(&self) -> Result<(), LockError> {
        let sessions: Vec<Arc<Session>> = lock(&self.inner.sessions)
            .drain()
            .flat_map(|(_, s)| s)
            .collect();
        let mut first_error = None;
        for session in sessions {
            session.lose("the backend was closed");
            let mut lease_client = self.inner.client.lease_client();
            let result = with_timeout(self.inner.config.op_timeout, Operation::Release, async {
                lease_client
                    .revoke(session.lease_id())
                    .await
                    .map_err(|e| from_etcd(Operation::Release, e))
            })
            .await;
            match result {
                Ok(_) => {}
                Err(err) if err.kind() == ErrorKind::LeaseLost => {}
                Err(err) => {
                    revoke_in_background(
                        &self.inner.client,
                        session.lease_id(),
                        session.server_ttl(),
                    );
                    first_error.get_or_insert(err);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The first live session for `ttl` with room for a grant, if any.
    fn session_with_room(&self, secs: u64) -> Option<Arc<Session>> {
        lock(&self.inner.sessions)
            .get(&secs)?
            .iter()
            .find(|s| s.is_alive() && s.has_room())
            .cloned()
    }

    /// A live session for `ttl` with room for a grant, granting a new lease
    /// if there is none. Sessions of `ttl` no longer alive are dropped (and
    /// declared lost) then.
    async fn session_for(&self, ttl: Duration, op: Operation) -> Result<Arc<Session>, LockError> {
        let secs = ttl_secs(ttl);
        if let Some(s) = self.session_with_room(secs) {
            return Ok(s);
        }
        // Boxed: starting a session (a lease grant and a keep-alive stream)
        // is rare, and its futures inline would make every acquire's
        // future (which async_trait boxes and copies) tens of kilobytes.
        Box::pin(self.start_session(secs, op)).await
    }

    /// [`Self::session_for`]'s slow path: a new session for `secs`.
    async fn start_session(&self, secs: u64, op: Operation) -> Result<Arc<Session>, LockError> {
        let _creating = self.inner.creating.lock().await;
        if let Some(s) = self.session_with_room(secs) {
            return Ok(s);
        }
        let ttl_i64 = i64::try_from(secs)
            .map_err(|_| LockError::invalid_argument(op, "TTL too large for an etcd lease"))?;
        let root = if self.inner.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.inner.prefix)
        };
        let session = Session::start(
            &self.inner.client,
            &root,
            ttl_i64,
            self.inner.config.op_timeout,
        )
        .await
        .map_err(|e| relabel(e, op))?;
        let mut sessions = lock(&self.inner.sessions);
        let of_ttl = sessions.entry(secs).or_default();
        of_ttl.retain(|old| {
            let alive = old.is_alive();
            if !alive {
                old.lose("replaced by a new session");
            }
            alive
        });
        of_ttl.push(session.clone());
        Ok(session)
    }

    /// The session that handed out `owner` ([`Session::owns`]).
    fn session_owning(&self, owner: lock_core::OwnerId) -> Option<Arc<Session>> {
        lock(&self.inner.sessions)
            .values()
            .flatten()
            .find(|s| s.owns(owner))
            .cloned()
    }

    fn session_by_lease(&self, lease_id: i64) -> Option<Arc<Session>> {
        lock(&self.inner.sessions)
            .values()
            .flatten()
            .find(|s| s.lease_id() == lease_id)
            .cloned()
    }

    async fn txn(&self, op: Operation, txn: Txn) -> Result<TxnResponse, LockError> {
        let mut kv = self.inner.client.kv_client();
        with_timeout(self.inner.config.op_timeout, op, async {
            kv.txn(txn).await.map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_backend(NAME))
    }

    /// Sends a release's guarded `delete` of `entry` (created at its
    /// revision) and returns whether it deleted it. On success the session
    /// frees the entry's name; on failure, if `clean_up_on_failure`, a task
    /// of its own keeps deleting the entry while the session lives.
    async fn delete_released(
        &self,
        op: Operation,
        delete: Txn,
        lease: &Lease,
        (entry, revision): (String, i64),
        session: Option<Arc<Session>>,
        clean_up_on_failure: bool,
    ) -> Result<bool, LockError> {
        match self.txn(op, delete).await {
            Ok(response) => {
                let released = response.succeeded();
                if released && let Some(session) = &session {
                    session.free_entry(&entry);
                }
                Ok(released)
            }
            Err(err) => {
                if clean_up_on_failure && let Some(session) = session {
                    clean_up_later(&self.inner.client, session, entry, lease.owner(), revision);
                }
                Err(err.with_key(lease.key()))
            }
        }
    }

    /// Checks a lease's entry against the key it claims, and returns
    /// (entry, revision, lease id): see [`keys::entry_of_lease`].
    fn parse_lease(&self, lease: &Lease, op: Operation) -> Result<(String, i64, i64), LockError> {
        let bad = |why: &str| {
            LockError::invalid_argument(op, format!("not an etcd lease of this backend: {why}"))
                .with_key(lease.key())
                .with_backend(NAME)
        };
        let (key_prefix, data) = match lease.backend_data().strip_prefix(keys::ELECTION_DATA) {
            Some(leaf) => (
                self.election_prefix_of(lease.key())
                    .ok_or_else(|| bad("an election lease not keyed on election/<name>"))?,
                leaf,
            ),
            None => (self.key_prefix(lease.key()), lease.backend_data()),
        };
        let (entry, lease_id) = keys::entry_of_lease(key_prefix, data).map_err(bad)?;
        let revision = i64::try_from(lease.token().get()).map_err(|_| bad("token"))?;
        Ok((entry, revision, lease_id))
    }

    /// The time an entry has left: its own deadline for a grant of this
    /// backend, else an upper bound from its etcd lease (`None` when that
    /// cannot be read, or for an entry without a lease).
    async fn remaining_ttl(&self, entry: &str, lease_id: i64, op: Operation) -> Option<Duration> {
        let own_due = self.session_by_lease(lease_id).and_then(|s| s.due(entry));
        if let Some(due) = own_due {
            // Held through this backend: it deletes the entry at `due`.
            return Some(due.saturating_duration_since(Instant::now()));
        }
        self.lease_ttl(lease_id, op).await
    }

    /// An upper bound of the time left to an entry of another backend on
    /// `lease_id` (as `inspect` reports it; `None` when it cannot be read,
    /// or for an entry without a lease).
    pub(crate) async fn lease_ttl(&self, lease_id: i64, op: Operation) -> Option<Duration> {
        if lease_id == 0 {
            return None;
        }
        let mut lease_client = self.inner.client.lease_client();
        let ttl = with_timeout(self.inner.config.op_timeout, op, async {
            lease_client
                .time_to_live(lease_id, None)
                .await
                .map_err(|e| from_etcd(op, e))
        })
        .await
        .ok()?;
        // Another backend deletes the entry at its own deadline, which etcd
        // cannot show: at most the lock's TTL after its last renewal, and the
        // lease's granted TTL is that TTL rounded up. A crashed holder's
        // entry goes with the lease, within the same bound. So the granted
        // TTL is an upper bound of the time left; the lease's remaining TTL
        // is not.
        u64::try_from(ttl.granted_ttl())
            .ok()
            .filter(|_| ttl.ttl() > 0)
            .map(|granted| {
                Duration::from_secs(granted)
                    .max(Duration::from_secs(u64::try_from(ttl.ttl()).unwrap_or(0)))
            })
    }

    /// Runs a waiting acquire, bounded by its deadline plus a short grace:
    /// a request that hangs (most members down) must not hold the caller
    /// past its wait. Dropping `attempt` must be cancel-safe (the acquires
    /// clean a create in flight up in the background).
    async fn bounded_wait(
        key: &LockKey,
        deadline: Instant,
        attempt: impl std::future::Future<Output = Result<Option<Lease>, LockError>>,
    ) -> Result<Lease, LockError> {
        let grace = Duration::from_millis(250);
        // Saturating: a deadline near the end of time must not overflow.
        match tokio::time::timeout_at(saturating_add(deadline, grace), attempt).await {
            Ok(Ok(Some(lease))) => Ok(lease),
            Ok(Ok(None)) => Err(protocol_error(Operation::Acquire, key, "no grant")),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(LockError::new(
                ErrorKind::Timeout,
                Operation::Acquire,
                "etcd did not answer before the wait deadline",
            )
            .with_key(key)
            .with_backend(NAME)),
        }
    }

    /// Where a lease's entry is: (entry, revision, lease id), or `None` when
    /// its entry is gone from the server.
    ///
    /// A lease on its session's plain entry (`<key prefix><lease hex>`, the
    /// common case) carries no entry name at all: its owner id names the
    /// session that handed it out ([`Session::owns`]). If that session is
    /// no longer this backend's (replaced, or the lease comes from another
    /// process), the entry is read by its create revision (the lease's
    /// token) under the key's prefix: one more round trip, on that path
    /// only.
    async fn resolve_lease(
        &self,
        lease: &Lease,
        op: Operation,
    ) -> Result<Option<(String, i64, i64)>, LockError> {
        if lease.kind() != LeaseKind::Exclusive {
            return self.parse_shared_lease(lease, op).map(Some);
        }
        if !lease.backend_data().is_empty() {
            return self.parse_lease(lease, op).map(Some);
        }
        let revision = i64::try_from(lease.token().get()).map_err(|_| {
            LockError::invalid_argument(op, "not an etcd lease of this backend: token")
                .with_key(lease.key())
                .with_backend(NAME)
        })?;
        let mut entry = self.key_prefix(lease.key());
        if let Some(session) = self.session_owning(lease.owner()) {
            entry.push_str(session.hex());
            return Ok(Some((entry, revision, session.lease_id())));
        }
        let mut kv = self.inner.client.kv_client();
        let response = with_timeout(self.inner.config.op_timeout, op, async {
            kv.get(entry.as_str(), Some(keys::created_at(revision)))
                .await
                .map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_key(lease.key()).with_backend(NAME))?;
        Ok(response.kvs().first().map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                revision,
                kv.lease(),
            )
        }))
    }
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        capabilities()
    }

    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let GrantRequest {
            key,
            kind,
            ttl,
            deadline,
        } = request;
        match (kind, deadline) {
            (LeaseKind::Exclusive, None) => self.try_take(key, ttl).await,
            (LeaseKind::Exclusive, Some(deadline)) => {
                self.take_waiting(key, ttl, deadline).await.map(Some)
            }
            (kind, None) => {
                self.acquire_shared(key, kind, ttl, None, Operation::TryAcquire)
                    .await
            }
            (kind, Some(deadline)) => {
                // Bounded like the mutex's wait; dropping `acquire_shared`
                // is cancel-safe.
                let attempt =
                    self.acquire_shared(key, kind, ttl, Some(deadline), Operation::Acquire);
                Self::bounded_wait(key, deadline, attempt).await.map(Some)
            }
        }
    }

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        self.renew_batch(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        if lease.kind() != LeaseKind::Exclusive {
            return self.release_shared(lease).await;
        }
        let op = Operation::Release;
        let Some((entry, revision, lease_id)) = self.resolve_lease(lease, op).await? else {
            return Ok(false);
        };
        let session = self.session_by_lease(lease_id);
        if let Some(session) = &session {
            session.unmark_held(&entry, revision, lease.owner());
        }
        let delete = guarded_delete(&entry, revision, lease.owner());
        // Our session would keep the entry alive: on failure keep trying.
        self.delete_released(op, delete, lease, (entry, revision), session, true)
            .await
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        match shape {
            LockShape::ReadWrite | LockShape::Semaphore => self.shared_holders(key, shape).await,
            _ => Ok(lock_core::kind::mutex_holders(
                self.inspect_mutex(key).await?,
            )),
        }
    }

    fn facets(&self) -> Facets<'_> {
        Facets {
            listing: Some(self),
            admin: Some(self),
            elections: Some(self),
            lock_sets: Some(self),
            downgrade: Some(self),
            holder_watch: Some(self),
        }
    }
}

#[async_trait]
impl Admin for EtcdBackend {
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.break_lock(key).await
    }

    /// Nothing to collect: etcd keeps no state of a released key (its
    /// entries go with the release, and tokens are the store's global
    /// revisions, which never go back). See the crate docs.
    async fn gc(&self, _older_than: Duration) -> Result<GcReport, LockError> {
        Ok(self.collect_garbage())
    }
}

#[async_trait]
impl Listing for EtcdBackend {
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        self.list_locks(query).await
    }

    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        self.list_shared_locks(shape, query).await
    }

    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        self.list_led_elections(query).await
    }
}

/// Elections in the layout of etcd's `concurrency.Election` (`etcdctl elect`
/// sees the same leader).
#[async_trait]
impl Elections for EtcdBackend {
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.campaign_entry(election, ttl, deadline).await
    }

    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        self.election_leader(election).await
    }

    async fn watch_leader(
        &self,
        election: &LockKey,
        seen: Option<&Leader>,
        _poll: Duration,
        deadline: Instant,
    ) -> Result<Option<Leader>, LockError> {
        self.watch_election(election, seen, deadline).await
    }
}

#[async_trait]
impl LockSets for EtcdBackend {
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        self.acquire_set(keys, ttl).await
    }
}

#[async_trait]
impl Downgrade for EtcdBackend {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.downgrade_shared(lease).await
    }
}

#[async_trait]
impl HolderWatch for EtcdBackend {
    async fn watch_holder(
        &self,
        key: &LockKey,
        seen: Option<&LockInfo>,
        _poll: Duration,
        deadline: Instant,
    ) -> Result<Option<LockInfo>, LockError> {
        self.watch_holder_of(key, seen, deadline).await
    }
}

/// The mutex's calls, which [`LockBackend::grant`], `renew_many` and the
/// facets reach.
impl EtcdBackend {
    async fn try_take(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.acquire_inner(key, ttl, None, Operation::TryAcquire)
            .await
    }

    async fn take_waiting(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let attempt = self.acquire_inner(key, ttl, Some(deadline), Operation::Acquire);
        Self::bounded_wait(key, deadline, attempt).await
    }

    async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        let op = Operation::Renew;
        let not_held = |why: &str| {
            LockError::new(ErrorKind::NotHeld, op, why.to_owned())
                .with_key(lease.key())
                .with_backend(NAME)
        };
        let Some((entry, revision, lease_id)) = self.resolve_lease(lease, op).await? else {
            return Err(not_held("the entry is gone"));
        };
        if let Some(session) = self.session_by_lease(lease_id) {
            // Our own session keeps the etcd lease alive, and this backend
            // deletes the entry at the grant's own deadline: renewing moves
            // that deadline, once the entry is seen still there (one
            // request: it may have been force-released).
            let grant = renewal::LocalGrant {
                entry,
                revision,
                session,
            };
            return self.renew_own(lease, grant).await;
        }
        // A lease of another process (rebuilt from a handle): refresh its
        // etcd lease once and check the entry is still the same one.
        let sent_at = Instant::now();
        let mut lease_client = self.inner.client.lease_client();
        let kept = with_timeout(self.inner.config.op_timeout, op, async {
            lease_client
                .keep_alive(lease_id)
                .await
                .map_err(|e| from_etcd(op, e))
        })
        .await;
        match kept {
            Ok(_) => {}
            Err(err) if err.kind() == ErrorKind::LeaseLost => {
                return Err(not_held("the etcd lease is gone"));
            }
            Err(err) => return Err(err.with_key(lease.key())),
        }
        let granted = with_timeout(self.inner.config.op_timeout, op, async {
            lease_client
                .time_to_live(lease_id, None)
                .await
                .map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_key(lease.key()))?;
        let mut compares = vec![Compare::create_revision(
            entry.as_str(),
            CompareOp::Equal,
            revision,
        )];
        if lease.kind() == LeaseKind::Exclusive {
            compares.extend(keys::owner_compares(&entry, lease.owner()));
        } else {
            compares.extend(keys::shared_owner_compares(
                &entry,
                lease.kind(),
                lease.owner(),
            ));
        }
        let txn = Txn::new().when(compares);
        if !self
            .txn(op, txn)
            .await
            .map_err(|e| e.with_key(lease.key()))?
            .succeeded()
        {
            return Err(not_held("the entry is gone or was re-created"));
        }
        let server_ttl = u64::try_from(granted.granted_ttl())
            .map(Duration::from_secs)
            .unwrap_or(Duration::ZERO);
        let deadline = validity_deadline(sent_at, lease.ttl().min(server_ttl));
        if deadline <= Instant::now() {
            return Err(not_held("the etcd lease has no time left"));
        }
        Ok(deadline)
    }

    async fn inspect_mutex(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        Ok(self
            .read_holder(key, Operation::Inspect)
            .await?
            .map(|holder| holder.info))
    }
}

/// What the etcd backend guarantees.
pub fn capabilities() -> Capabilities {
    Capabilities {
        fencing: FencingScope::Global,
        fencing_survives_failover: true,
        grants_survive_restart: true,
        waiting: WaitStrategy::Notify,
        fifo: true,
        // Each lock is deleted when its own TTL runs out without a renewal
        // (by the backend that holds it; by the session lease's expiry, one
        // TTL rounded up to whole seconds, if that process is gone).
        ttl_model: TtlModel::PerLease,
        linearizable: true,
        min_ttl: MIN_TTL,
        shared_locks: true,
        semaphores: true,
        // Every mutex entry's value carries them (see the crate docs).
        holder_details: true,
        max_held: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use conformance::process::end_of_time;

    /// Issue 37: a waiting acquire's bound is its deadline plus a grace;
    /// a deadline closer to the end of time than that grace must not
    /// overflow (`Instant + Duration` panics).
    #[tokio::test]
    async fn a_wait_with_a_deadline_near_the_end_of_time_does_not_panic() {
        let key = LockKey::new("far").unwrap();
        let deadline = end_of_time() - Duration::from_millis(100);
        let lease = Lease::granted(
            key.clone(),
            lock_core::OwnerId::random(),
            lock_core::FencingToken::new(1),
            Duration::from_secs(5),
            Instant::now(),
            String::new(),
        )
        .unwrap();
        let granted = EtcdBackend::bounded_wait(&key, deadline, async { Ok(Some(lease)) }).await;
        assert!(granted.is_ok(), "{granted:?}");
    }
}
