//! The [`LockBackend`] implementation: one ZooKeeper session per backend,
//! Curator-style lock nodes, czxid fencing tokens.
//!
//! This file holds [`ZkBackend`], its shared state, the kernel's methods
//! and the facets it has (`Admin`, `Elections` in Curator's latch layout,
//! `Downgrade`, `HolderWatch`);
//! the child modules hold the parts: `session.rs` (opening the session, its
//! state signal, leader-view reads), `waiting.rs` (the lock node, the grant
//! and the waiting acquire), `cleanup.rs` (deleting nodes of attempts that
//! ended without the lock), `renew_many.rs` (batched renewals), `expiry.rs`
//! (local TTL enforcement), `shared.rs` (read-write locks and semaphores,
//! with their attempts in `shared_rw.rs` and `shared_sem.rs`),
//! `election.rs` (Curator's `LeaderLatch` layout). Errors are mapped in
//! `error.rs`, paths built in `paths.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::election::{ElectionPage, Leader};
use lock_core::{
    Admin, Capabilities, Downgrade, Elections, ErrorKind, Facets, FencingScope, GcReport,
    GrantRequest, HolderInfo, HolderWatch, Lease, LeaseKind, ListQuery, Listing, LockBackend,
    LockError, LockInfo, LockKey, LockPage, LockShape, Operation, OwnerId, SessionState,
    SharedPage, TtlModel, WaitStrategy, validity_deadline,
};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::error::{NAME, timed_resending};
use crate::paths::{self, mutex_owner_of};

// Child modules: they share the backend's private state.
// The session: opening it, its state signal, leader-view reads.
#[path = "session.rs"]
mod session;

// Acquiring: the lock node, the grant, the waiting acquire.
#[path = "waiting.rs"]
mod waiting;

// Deleting nodes of attempts that ended without the lock.
#[path = "cleanup.rs"]
mod cleanup;

// Batched renewals.
#[path = "renew_many.rs"]
mod renew_many;

// Local TTL enforcement: one expiry task per backend.
#[path = "expiry.rs"]
mod expiry;

// Read-write locks and semaphores (Curator's layouts).
#[path = "shared.rs"]
mod shared;

// Leader election (Curator's `LeaderLatch` layout).
#[path = "election.rs"]
mod election;

// Operating locks: holder look-up, list, force_release, gc.
#[path = "admin.rs"]
mod admin;

use session::{Session, synced};

/// How far past its deadline an acquire may run when the servers are slow
/// to answer (a normal wait ends at the deadline itself).
pub(super) const ACQUIRE_GRACE: Duration = Duration::from_millis(500);

/// The shortest TTL accepted. A ZooKeeper lease lives as long as its
/// session; the TTL only paces renewals and bounds the local validity, so
/// it needs room for a few round trips.
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// A lock service on a ZooKeeper ensemble.
///
/// One ZooKeeper session per backend, shared by every lock it takes; clones
/// share it. See the [crate docs](crate) for the recipe and its guarantees.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use lock_core::{LockBackend, LockBackendExt, LockKey};
/// use lock_zk::ZkBackend;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let backend = lock_zk::connect("zk://127.0.0.1:2181/myapp").await?;
/// let key = LockKey::new("nightly-report")?;
/// let lease = backend.try_acquire(&key, Duration::from_secs(10)).await?.expect("free");
/// println!("fencing token {}", lease.token());
/// backend.release(&lease).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let session = self.inner.current().map(|s| s.id);
        f.debug_struct("ZkBackend")
            .field("config", &self.inner.config)
            .field("session_id", &session)
            .finish()
    }
}

struct Inner {
    config: ZkConfig,
    current: Mutex<Option<Arc<Session>>>,
    connecting: tokio::sync::Mutex<()>,
    containers: AtomicBool,
    /// Local TTL enforcement: the granted nodes by owner id, each with when
    /// it must be deleted if not renewed (the lease's validity deadline
    /// comes before). Removed at release. See expiry.rs.
    expiries: Mutex<HashMap<u64, expiry::Tracked>>,
    /// The same for read, write and permit leases (locked after
    /// `expiries` when both are).
    shared: Mutex<HashMap<u64, expiry::SharedTracked>>,
    /// The attempt ids this backend hands out (and keys `expiries` by).
    owners: expiry::Owners,
    /// The deadlines' epoch.
    clock: expiry::Clock,
    /// The backend's one expiry task. Locked after `expiries` when both are.
    task: Mutex<expiry::ExpiryTask>,
    /// Attempts whose create had an unknown outcome: more than one node may
    /// carry their id, so cleanup sweeps the directory for it.
    uncertain: Mutex<HashSet<OwnerId>>,
    /// The escaped name of the last key directory `gc` examined: the next
    /// call goes on from there (see admin.rs).
    gc_cursor: Mutex<Option<String>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        lock(&self.task).stop();
    }
}

impl Inner {
    fn current(&self) -> Option<Arc<Session>> {
        lock(&self.current).clone()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code path panics while holding these locks; recover anyway.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A lease's lock node (see `ZkBackend::lease_path`).
struct NodeRef {
    path: String,
    dir_len: usize,
    seq: u32,
}

impl NodeRef {
    fn path(&self) -> &str {
        &self.path
    }

    fn dir(&self) -> &str {
        &self.path[..self.dir_len]
    }
}

impl ZkBackend {
    /// Connects with `config`: opens the session (and creates the chroot
    /// node when missing).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for an invalid configuration;
    /// [`ErrorKind::Unavailable`] / [`ErrorKind::Timeout`] when no server
    /// answers within the connect timeout.
    ///
    /// # Cancel safety
    ///
    /// Safe: a dropped connect leaves nothing behind.
    pub async fn connect(config: ZkConfig) -> Result<Self, LockError> {
        config.validate()?;
        // The ZooKeeper client and our session watcher run as Tokio tasks.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(LockError::config(
                "lock-zk needs a Tokio runtime: connect from inside one",
            )
            .with_backend(NAME));
        }
        let backend = Self {
            inner: Arc::new(Inner {
                containers: AtomicBool::new(config.containers()),
                config,
                current: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                expiries: Mutex::new(HashMap::new()),
                shared: Mutex::new(HashMap::new()),
                clock: expiry::Clock::new(),
                owners: expiry::Owners::new(),
                task: Mutex::new(expiry::ExpiryTask::default()),
                uncertain: Mutex::new(HashSet::new()),
                gc_cursor: Mutex::new(None),
            }),
        };
        backend.session(Operation::Connect).await?;
        Ok(backend)
    }

    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        &self.inner.config
    }

    /// The id of the current ZooKeeper session, if one is open.
    pub fn session_id(&self) -> Option<i64> {
        self.inner.current().map(|s| s.id)
    }

    /// The negotiated timeout of the current session, if one is open.
    pub fn session_timeout(&self) -> Option<Duration> {
        self.inner.current().map(|s| s.timeout)
    }

    /// What the current session says: `Alive`, `Suspect` (disconnected)
    /// or `Lost` (expired or closed; the next call opens a new session).
    /// The same signal is attached to every lease this backend grants.
    pub fn session_state(&self) -> SessionState {
        self.inner.current().map_or_else(
            || SessionState::Lost("no session".to_owned()),
            |s| s.state.borrow().clone(),
        )
    }

    /// The ZooKeeper path of `key`'s lock directory (inside the chroot):
    /// `<root>/<escaped key>`, or the key itself in the path layout (see
    /// [`ZkLayout`](crate::ZkLayout)).
    pub fn key_path(&self, key: &LockKey) -> String {
        let config = &self.inner.config;
        paths::mutex_dir_of(config.root(), config.layout(), key.as_str())
    }

    /// [`Self::key_path`], refused with `InvalidArgument` when the path
    /// layout's key is not a valid lock path.
    pub(crate) fn checked_key_path(
        &self,
        key: &LockKey,
        operation: Operation,
    ) -> Result<String, LockError> {
        if paths::layout_of(self.inner.config.layout(), key.as_str()) == crate::ZkLayout::Path {
            paths::check_path_key(key).map_err(|why| {
                LockError::invalid_argument(operation, why)
                    .with_key(key)
                    .with_backend(NAME)
            })?;
        }
        Ok(self.key_path(key))
    }

    fn op_timeout(&self) -> Duration {
        self.inner.config.op_timeout()
    }

    fn acls(&self) -> zk::Acls<'static> {
        if self.inner.config.digest().is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }

    /// The lock node of `lease`: its key's directory, a name carrying the
    /// lease's owner id, and the sequence number the lease stores (its
    /// `backend_data`, the digits alone: the rest of the path follows from
    /// the key and the owner, so a held lease keeps a few bytes instead of
    /// the whole path). A full path (what earlier versions stored) is
    /// accepted when it is a lock node of the lease's key and owner.
    /// Anything else is not a lease of ours and is never acted on.
    fn lease_path(&self, lease: &Lease) -> Option<NodeRef> {
        let data = lease.backend_data();
        let root = self.inner.config.root();
        if let Some(latch) = data.strip_prefix(waiting::LATCH_DATA) {
            // An election's latch node (see election.rs), its name with the
            // details (`latch:<seq>;<details>`) or without (`latch:<seq>`,
            // an earlier version's).
            let election = lease.key().as_str().strip_prefix("election/")?;
            let (seq, details) = latch.split_once(';').unwrap_or((latch, ""));
            if seq.is_empty()
                || !seq.bytes().all(|b| b.is_ascii_digit())
                || !crate::latch_names::is_details_component(details)
            {
                return None;
            }
            let seq: u32 = seq.parse().ok()?;
            let dir = paths::latch_dir_of(root, election);
            let name = crate::latch_names::latch_name(details);
            return Some(NodeRef {
                dir_len: dir.len(),
                path: paths::named_node_path(&dir, lease.owner(), &name, seq),
                seq,
            });
        }
        if data.starts_with('/') {
            let (node_dir, name) = paths::split_node(data)?;
            let seq = u32::try_from(paths::mutex_sequence_of(name)?).ok()?;
            return (paths::is_mutex_dir(root, self.inner.config.layout(), lease.key(), node_dir)
                && mutex_owner_of(name) == Some(lease.owner()))
            .then(|| NodeRef {
                path: data.to_owned(),
                dir_len: node_dir.len(),
                seq,
            });
        }
        // A kazoo-named node (`nodes=kazoo`) says so in its data, so any
        // backend on the key's directory finds it whatever its own setting.
        let (nodes, data) = match data.strip_prefix(waiting::KAZOO_DATA) {
            Some(seq) => (crate::ZkNodeNames::Kazoo, seq),
            None => (crate::ZkNodeNames::Curator, data),
        };
        if data.is_empty() || !data.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let seq: u32 = data.parse().ok()?;
        let dir = self.key_path(lease.key());
        Some(NodeRef {
            dir_len: dir.len(),
            path: paths::mutex_node_path(&dir, lease.owner(), nodes, seq),
            seq,
        })
    }

    /// The ZooKeeper path of `lease`'s lock node (inside the chroot), or
    /// `None` when the lease is not a lock node of its key and owner.
    pub fn node_path(&self, lease: &Lease) -> Option<String> {
        self.lease_path(lease).map(|node| node.path)
    }

    /// Whether this backend tracks `lease`'s node and its TTL has not run
    /// out by `at`.
    fn tracked_until(&self, lease: &Lease, seq: u32, at: Instant) -> bool {
        let clock = self.inner.clock;
        self.tracked(lease.owner(), |node| {
            node.seq == seq && !clock.passed(node.due, at)
        })
        .unwrap_or(false)
    }

    /// Moves the deadline of `lease`'s node to `sent + ttl` after a
    /// confirmed renewal. `false` when the node is no longer tracked (its
    /// TTL ran out and the expiry task took it, or it was released), so the
    /// renewal must not be reported.
    fn extend(&self, lease: &Lease, seq: u32, sent: Instant, ttl: Duration) -> bool {
        let clock = self.inner.clock;
        self.tracked(lease.owner(), |node| {
            if node.seq != seq || clock.passed(node.due, sent) {
                return false;
            }
            if clock.passed(node.due, sent + ttl) {
                node.due = clock.deadline(sent + ttl);
            }
            true
        })
        .unwrap_or(false)
    }
}

#[async_trait]
impl LockBackend for ZkBackend {
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
        // Each path boxed (see `take_waiting`): this future stays small
        // whichever path it takes.
        match (kind, deadline) {
            (LeaseKind::Exclusive, None) => self.try_take(key, ttl).await,
            (LeaseKind::Exclusive, Some(deadline)) => {
                self.take_waiting(key, ttl, deadline).await.map(Some)
            }
            (kind, None) => {
                Box::pin(self.acquire_shared(key, kind, ttl, None, Operation::TryAcquire)).await
            }
            (kind, Some(deadline)) => Box::pin(self.acquire_shared_until(key, kind, ttl, deadline))
                .await
                .map(Some),
        }
    }

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        // One multi of existence checks per batch (see renew_many.rs).
        self.renew_batch(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        if lease.kind() != LeaseKind::Exclusive {
            return self.release_shared(lease).await;
        }
        // A lease whose node does not carry its owner id is not ours to act
        // on: another owner's node is never touched.
        let Some(node) = self.lease_path(lease) else {
            return Ok(false);
        };
        let (path, dir) = (node.path(), node.dir());
        let session = self
            .session(Operation::Release)
            .await
            .map_err(|e| e.with_key(lease.key()))?;
        let deleted =
            match timed_resending(self.op_timeout(), || session.client.delete(path, None)).await {
                Ok(()) => true,
                Err(err) if err.is(&zk::Error::NoNode) => false,
                Err(err) => {
                    // The local expiry stays armed: it deletes the node later.
                    return Err(err
                        .into_lock_error(Operation::Release)
                        .with_key(lease.key()));
                }
            };
        self.forget_expiry(lease.owner());
        self.sweep_uncertain(&session.client, dir, lease.owner(), false)
            .await;
        self.remove_empty_dir(&session.client, dir).await;
        Ok(deleted)
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
            downgrade: Some(self),
            holder_watch: Some(self),
            ..Facets::default()
        }
    }
}

#[async_trait]
impl Admin for ZkBackend {
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.break_holder(key).await
    }

    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError> {
        self.collect_empty_dirs(older_than).await
    }
}

#[async_trait]
impl Listing for ZkBackend {
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        self.list_page(query).await
    }

    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        match shape {
            LockShape::Mutex => lock_core::list_mutex_shared(self, query).await,
            _ => self.list_shared_page(shape, query).await,
        }
    }

    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        // The latch directories (see election.rs), not the generic
        // election's mutexes.
        self.list_latches(query).await
    }
}

/// Curator's `LeaderLatch` layout (see election.rs).
#[async_trait]
impl Elections for ZkBackend {
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.campaign_latch(election, ttl, deadline).await
    }

    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        self.latch_leader(election).await
    }

    async fn watch_leader(
        &self,
        election: &LockKey,
        seen: Option<&Leader>,
        _poll: Duration,
        deadline: Instant,
    ) -> Result<Option<Leader>, LockError> {
        // A ZooKeeper watch, never polling (see election.rs).
        self.watch_latch_leader(election, seen, deadline).await
    }
}

#[async_trait]
impl Downgrade for ZkBackend {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.downgrade_write(lease).await
    }
}

#[async_trait]
impl HolderWatch for ZkBackend {
    async fn watch_holder(
        &self,
        key: &LockKey,
        seen: Option<&LockInfo>,
        _poll: Duration,
        deadline: Instant,
    ) -> Result<Option<LockInfo>, LockError> {
        // A ZooKeeper watch, never polling (see admin.rs).
        self.watch_holder_in(key, seen, deadline).await
    }
}

/// The mutex's calls, which [`LockBackend::grant`], `renew_many` and
/// `holders` reach.
impl ZkBackend {
    /// Tries once to take the mutex `key`.
    async fn try_take(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        // Boxed (see `take_waiting`).
        Box::pin(self.lock_key(key, ttl, None, Operation::TryAcquire)).await
    }

    /// Takes the mutex `key`, waiting until `deadline`.
    async fn take_waiting(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        // Requests have their own timeouts, but a wait must also end near
        // its deadline when the servers stop answering.
        waiting::bounded_wait(
            key,
            deadline,
            (
                "wait deadline",
                "still held by another owner at the wait deadline",
            ),
            // Boxed: the attempt's future is some kilobytes (the client's
            // request futures live in it), and the caller's future, which
            // async_trait moves into a box of its own, would otherwise
            // hold it inline: a profile showed that move as the largest
            // cost of a cycle on the client (about 10,000 of 78,000
            // instructions).
            Box::pin(self.lock_key(key, ttl, Some(deadline), Operation::Acquire)),
        )
        .await
    }

    /// Renews one mutex lease, confirming its node from the leader's view
    /// (`sync` + node check): the path of a lease that `renew_batch` does
    /// not check in its multi (another session's, or not a node of ours).
    async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        if lease.kind() != LeaseKind::Exclusive {
            return self.renew_shared(lease).await;
        }
        let not_held = |why: &str| {
            LockError::new(ErrorKind::NotHeld, Operation::Renew, why.to_owned())
                .with_key(lease.key())
                .with_backend(NAME)
        };
        let Some(node) = self.lease_path(lease) else {
            return Err(not_held(
                "the lease does not name a lock node of its key and owner",
            ));
        };
        if lease
            .session()
            .is_some_and(|s| matches!(*s.borrow(), SessionState::Lost(_)))
        {
            return Err(not_held(
                "the ZooKeeper session that held this lease is gone",
            ));
        }
        let session = self
            .session(Operation::Renew)
            .await
            .map_err(|e| e.with_key(lease.key()))?;
        let sent = Instant::now();
        // A lease this backend already gave up on (its TTL ran out without a
        // renewal: the node is being deleted) is not revived. Every node
        // granted on this session is tracked until released or expired.
        let ours = lease
            .session()
            .is_some_and(|s| s.same_channel(&session.state));
        if ours && !self.tracked_until(lease, node.seq, sent) {
            return Err(not_held(
                "the lease's TTL ran out before this renewal; its node is deleted",
            ));
        }
        // Confirm the node from the leader's view: a follower cut off from
        // the leader would still show it after the leader expired our
        // session and granted the key to someone else (see `synced`).
        match synced(
            session.client.sync(node.dir()),
            self.op_timeout(),
            session.client.check_stat(node.path()),
        )
        .await
        {
            Ok(None) => {
                self.forget_expiry(lease.owner());
                Err(not_held(
                    "the lock node is gone (released, expired, or deleted)",
                ))
            }
            Ok(Some(stat)) if u64::try_from(stat.czxid).ok() != Some(lease.token().get()) => {
                Err(not_held("the lock node was re-created: not this grant"))
            }
            Ok(Some(stat)) if stat.ephemeral_owner != session.id => Err(LockError::new(
                ErrorKind::Unsupported,
                Operation::Renew,
                "the lock node belongs to another ZooKeeper session: it lives as long as that \
                 session and can be released, but not renewed, from here",
            )
            .with_key(lease.key())
            .with_backend(NAME)),
            Ok(Some(_)) => {
                let ttl = lease.ttl().min(session.timeout);
                // Our session's node, no longer tracked: its TTL ran out
                // while the check was in flight (the delete is on its way).
                if !self.extend(lease, node.seq, sent, ttl) {
                    return Err(not_held(
                        "the lease's TTL ran out before this renewal; its node is deleted",
                    ));
                }
                Ok(validity_deadline(sent, ttl))
            }
            Err(err) => Err(err.into_lock_error(Operation::Renew).with_key(lease.key())),
        }
    }

    /// Who holds the mutex `key`, without a `sync`.
    async fn inspect_mutex(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let session = self
            .session(Operation::Inspect)
            .await
            .map_err(|e| e.with_key(key))?;
        let dir = self.checked_key_path(key, Operation::Inspect)?;
        // One list and one `getData` (the holder details are the node's
        // data, read with its `czxid`), no `sync`: it decides nothing.
        Ok(self
            .holder_in(&session, key, &dir, Operation::Inspect)
            .await?
            .map(|found| found.info))
    }
}

/// What the ZooKeeper backend guarantees (the same for every URL).
// Every field is set today; the update keeps a field lock-core adds later
// at its conservative default.
#[allow(clippy::needless_update)]
pub fn capabilities() -> Capabilities {
    Capabilities {
        // czxid: strictly increasing per key (grants follow creation
        // order within a directory), and zxids survive leader changes.
        fencing: FencingScope::PerKey,
        fencing_survives_failover: true,
        // Sessions and their ephemeral nodes are in the snapshot and
        // the transaction log, and resume after a restart.
        grants_survive_restart: true,
        waiting: WaitStrategy::Notify,
        fifo: true,
        ttl_model: TtlModel::PerSession,
        linearizable: true,
        min_ttl: MIN_TTL,
        // Curator's InterProcessReadWriteLock and InterProcessSemaphoreV2
        // layouts (see the crate docs).
        shared_locks: true,
        semaphores: true,
        // `<owner hex>\n<details>` in every mutex node we create.
        holder_details: true,
        ..Capabilities::minimal()
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    use super::*;

    #[test]
    fn connecting_outside_a_runtime_is_a_typed_error() {
        let config = ZkConfig::new(["127.0.0.1:1"]);
        let mut connect = std::pin::pin!(ZkBackend::connect(config));
        let mut cx = Context::from_waker(Waker::noop());
        match connect.as_mut().poll(&mut cx) {
            Poll::Ready(Err(err)) => assert_eq!(err.kind(), ErrorKind::Config, "{err}"),
            other => panic!(
                "expected a config error at once, got {:?}",
                other.map(|r| r.map(|_| ()))
            ),
        }
    }
}
