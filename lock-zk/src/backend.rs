//! [`ZkBackend`]: the backend owning its components, the kernel's calls
//! delegated to them, and the facets it has. Every concern lives in a
//! component of its own: `connection.rs` (the session), `waiting.rs` (the
//! key's queue of nodes), `grants.rs` (the mutex), `shared.rs` (read-write
//! locks and semaphores), `renewal.rs`, `expiry.rs` (local TTL
//! enforcement), `cleanup.rs`, `elections.rs` (Curator's `LeaderLatch`
//! layout), `admin.rs` (force release, gc, listings, holder watch).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    Capabilities, Facets, FencingScope, GrantRequest, HolderInfo, Lease, LeaseKind, LockBackend,
    LockError, LockKey, LockShape, Operation, SessionState, TtlModel, WaitStrategy,
};
use tokio::time::Instant;

use crate::admin::Admin;
use crate::cleanup::Cleanup;
use crate::config::{MIN_TTL, ZkConfig};
use crate::connection::Connection;
use crate::elections::Elections;
use crate::error::NAME;
use crate::expiry::Expiry;
use crate::grants::{GrantParts, Grants};
use crate::guarded::{Guarded, ZkGuardedOutcome, ZkOwnerCheck};
use crate::keys;
use crate::renewal::Renewal;
use crate::shared::SharedLocks;
use crate::waiting::Waiting;

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
    inner: Arc<Components>,
}

/// What a backend is made of; clones of the backend share it.
struct Components {
    conn: Arc<Connection>,
    grants: Grants,
    shared: SharedLocks,
    renewal: Renewal,
    elections: Elections,
    admin: Admin,
    guarded: Guarded,
}

impl Components {
    fn new(config: ZkConfig) -> Self {
        let conn = Arc::new(Connection::new(config));
        let cleanup = Cleanup::new(conn.clone());
        let expiry = Expiry::new(cleanup.clone());
        let waiting = Waiting::new(conn.clone(), expiry.clone(), cleanup.clone());
        let parts = GrantParts {
            conn: conn.clone(),
            expiry: expiry.clone(),
            cleanup: cleanup.clone(),
            waiting: waiting.clone(),
        };
        let grants = Grants::new(parts.clone());
        let shared = SharedLocks::new(parts);
        let renewal = Renewal::new(conn.clone(), expiry.clone(), shared.clone());
        let elections = Elections::new(conn.clone(), expiry.clone(), waiting);
        let guarded = Guarded::new(conn.clone(), expiry.clone());
        let admin = Admin::new(
            (conn.clone(), cleanup),
            grants.clone(),
            shared.listing().clone(),
            elections.clone(),
        );
        Self {
            conn,
            grants,
            shared,
            renewal,
            elections,
            admin,
            guarded,
        }
    }
}

impl std::fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let session = self.inner.conn.current().map(|s| s.id);
        f.debug_struct("ZkBackend")
            .field("config", self.inner.conn.config())
            .field("session_id", &session)
            .finish()
    }
}

impl ZkBackend {
    /// Connects with `config`: opens the session (and creates the chroot
    /// node when missing).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for an invalid
    /// configuration; [`ErrorKind::Unavailable`](lock_core::ErrorKind::Unavailable)
    /// or [`ErrorKind::Timeout`](lock_core::ErrorKind::Timeout) when no
    /// server answers within the connect timeout.
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
            inner: Arc::new(Components::new(config)),
        };
        backend.inner.conn.session(Operation::Connect).await?;
        Ok(backend)
    }

    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        self.inner.conn.config()
    }

    /// The id of the current ZooKeeper session, if one is open.
    pub fn session_id(&self) -> Option<i64> {
        self.inner.conn.current().map(|s| s.id)
    }

    /// The negotiated timeout of the current session, if one is open.
    pub fn session_timeout(&self) -> Option<Duration> {
        self.inner.conn.current().map(|s| s.timeout)
    }

    /// What the current session says: `Alive`, `Suspect` (disconnected)
    /// or `Lost` (expired or closed; the next call opens a new session).
    /// The same signal is attached to every lease this backend grants.
    pub fn session_state(&self) -> SessionState {
        self.inner.conn.current().map_or_else(
            || SessionState::Lost("no session".to_owned()),
            |s| s.state.borrow().clone(),
        )
    }

    /// The ZooKeeper path of `key`'s lock directory (inside the chroot):
    /// `<root>/<escaped key>`, or the key itself in the path layout (see
    /// [`ZkLayout`](crate::ZkLayout)).
    pub fn key_path(&self, key: &LockKey) -> String {
        self.inner.conn.key_path(key)
    }

    /// The ZooKeeper path of `lease`'s lock node (inside the chroot), or
    /// `None` when the lease is not a lock node of its key and owner.
    pub fn node_path(&self, lease: &Lease) -> Option<String> {
        keys::lease_node(self.inner.conn.config(), lease).map(|node| node.path)
    }

    /// The ownership check of a mutex `lease`, to add to a ZooKeeper
    /// `multi` of any session (the backend's own through
    /// [`guarded_multi`](Self::guarded_multi), or the application's own
    /// client): the `multi` is applied only while the lease holds its
    /// lock, atomically with that check. See [`ZkOwnerCheck`] for what it
    /// promises and what the committing session needs.
    ///
    /// Sends nothing.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`](lock_core::ErrorKind::Unsupported) for a
    /// read, write or permit lease or an election's leadership (mutex
    /// leases only);
    /// [`ErrorKind::InvalidArgument`](lock_core::ErrorKind::InvalidArgument)
    /// for a lease that names no lock node of this backend's root and
    /// layout (another backend's).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use lock_zk::{ZkOwnerCheck, zookeeper_client as zk};
    ///
    /// # async fn run(backend: lock_zk::ZkBackend, guard: lock_core::LockGuard,
    /// #     client: zk::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// // `client`: the application's own session, rooted at the same chroot.
    /// let check = backend.owner_check(&guard.lease())?;
    /// let mut writer = check.check_writer(&client)?;
    /// writer.add_set_data("/app/config", b"v2", None)?;
    /// match writer.commit().await {
    ///     Ok(_) => println!("written under the lock"),
    ///     Err(err) if ZkOwnerCheck::refused(&err) => println!("lock lost: nothing written"),
    ///     Err(err) => return Err(err.into()),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn owner_check(&self, lease: &Lease) -> Result<ZkOwnerCheck, LockError> {
        self.inner.guarded.owner_check(lease)
    }

    /// Runs the operations `build` adds, in one `multi` on this backend's
    /// session whose first operation checks that the mutex `lease` holds
    /// its lock ([`owner_check`](Self::owner_check)): all of them are
    /// applied, atomically with the check, only while the lease's lock
    /// node exists. Before sending, a lease this backend already knows lost
    /// (its session gone, its TTL run out unrenewed) is refused.
    ///
    /// [`ZkGuardedOutcome::Refused`] says the lease did not hold its lock
    /// and nothing was applied; [`ZkGuardedOutcome::OperationFailed`] that
    /// one of the operations `build` added failed (nothing was applied).
    ///
    /// # Errors
    ///
    /// As [`owner_check`](Self::owner_check); the error `build` returns
    /// (a path the client rejects:
    /// [`ErrorKind::InvalidArgument`](lock_core::ErrorKind::InvalidArgument));
    /// [`ErrorKind::Timeout`](lock_core::ErrorKind::Timeout) (no answer
    /// within the operation timeout) and
    /// [`ErrorKind::Unavailable`](lock_core::ErrorKind::Unavailable) (the
    /// connection broke with the request in flight, or no session): the
    /// `multi` may or may not have been applied, and is not sent again;
    /// [`ErrorKind::Backend`](lock_core::ErrorKind::Backend) for any other
    /// answer of ZooKeeper (e.g. `NoAuth` on the lock node).
    ///
    /// # Cancel safety
    ///
    /// Dropped before the `multi` is sent (while a session opens), nothing
    /// is written; dropped after, the `multi` may still be applied (all of
    /// it or none, never a part).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use lock_zk::ZkGuardedOutcome;
    ///
    /// # async fn run(backend: lock_zk::ZkBackend, guard: lock_core::LockGuard)
    /// #     -> Result<(), lock_core::LockError> {
    /// let outcome = backend
    ///     .guarded_multi(&guard.lease(), |multi| {
    ///         multi.add_set_data("/app/config", b"v2", None)
    ///     })
    ///     .await?;
    /// match outcome {
    ///     ZkGuardedOutcome::Written(_) => println!("written under the lock"),
    ///     ZkGuardedOutcome::Refused => println!("lock lost: nothing written"),
    ///     ZkGuardedOutcome::OperationFailed { index, error } => {
    ///         println!("operation {index} failed: {error}; nothing written")
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn guarded_multi<F>(
        &self,
        lease: &Lease,
        build: F,
    ) -> Result<ZkGuardedOutcome, LockError>
    where
        F: FnOnce(&mut zookeeper_client::CheckWriter<'_>) -> Result<(), zookeeper_client::Error>,
    {
        self.inner.guarded.guarded_multi(lease, build).await
    }

    /// The directory of `key`'s read-write lock (inside the chroot): point
    /// Curator's `InterProcessReadWriteLock` there to share it.
    pub fn rwlock_path(&self, key: &LockKey) -> String {
        keys::rw_dir(self.inner.conn.config().root(), key)
    }

    /// The path of `key`'s semaphore (inside the chroot): point Curator's
    /// `InterProcessSemaphoreV2` there (with the same limit) to share it.
    pub fn semaphore_path(&self, key: &LockKey) -> String {
        keys::sem_dir(self.inner.conn.config().root(), key)
    }

    /// The ZooKeeper path (inside the chroot) of the election `election`'s
    /// latch directory: `<root>/.election/<escaped name>`. A Curator
    /// `LeaderLatch` on `<chroot>` + this path is a candidate of the same
    /// election.
    pub fn latch_path(&self, election: &LockKey) -> String {
        keys::latch_dir(self.inner.conn.config().root(), election)
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
        let (grants, shared) = (&self.inner.grants, &self.inner.shared);
        // Each path boxed (see `Grants::take_waiting`): this future stays
        // small whichever path it takes.
        match (kind, deadline) {
            (LeaseKind::Exclusive, None) => grants.try_take(key, ttl).await,
            (LeaseKind::Exclusive, Some(deadline)) => {
                grants.take_waiting(key, ttl, deadline).await.map(Some)
            }
            (kind, None) => {
                Box::pin(shared.acquire_shared(key, kind, ttl, None, Operation::TryAcquire)).await
            }
            (kind, Some(deadline)) => {
                Box::pin(shared.acquire_shared_until(key, kind, ttl, deadline))
                    .await
                    .map(Some)
            }
        }
    }

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        // One multi of existence checks per batch (see renewal.rs).
        self.inner.renewal.renew_batch(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        if lease.kind() == LeaseKind::Exclusive {
            self.inner.grants.release(lease).await
        } else {
            self.inner.shared.release_shared(lease).await
        }
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        match shape {
            LockShape::ReadWrite | LockShape::Semaphore => {
                self.inner.shared.holders(key, shape).await
            }
            _ => Ok(lock_core::kind::mutex_holders(
                self.inner.grants.inspect_mutex(key).await?,
            )),
        }
    }

    fn facets(&self) -> Facets<'_> {
        Facets {
            listing: Some(&self.inner.admin),
            admin: Some(&self.inner.admin),
            elections: Some(&self.inner.elections),
            downgrade: Some(&self.inner.shared),
            holder_watch: Some(&self.inner.admin),
            ..Facets::default()
        }
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

    use lock_core::ErrorKind;

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
