//! [`EtcdBackend`]: the components of one backend, and the kernel
//! ([`LockBackend`]) and facets delegating to them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, Compare, TxnOp};
use lock_core::{
    Capabilities, Facets, FencingScope, GrantRequest, HolderInfo, Lease, LeaseKind, LockBackend,
    LockError, LockKey, LockShape, Operation, TtlModel, WaitStrategy,
};
use tokio::time::Instant;

use crate::admin::Admin;
use crate::config::{EtcdConfig, MIN_TTL};
use crate::connection::{Connection, ttl_secs};
use crate::elections::Elections;
use crate::error::NAME;
use crate::grants::Grants;
use crate::guarded::{EtcdGuardedOutcome, Guarded};
use crate::renewal::Renewal;
use crate::sets::Sets;
use crate::shared::Shared;
use crate::waiting::{Waiting, bounded_wait};

/// A lock service on etcd: leases, revisions as fencing tokens, FIFO waits.
///
/// See the [crate docs](crate) for the layout and the TTL model. Clones
/// share the connection and the sessions. Create it with
/// [`EtcdBackend::connect`] (or [`crate::connect`] from a URL).
#[derive(Clone)]
pub struct EtcdBackend {
    parts: Arc<Parts>,
}

/// What one backend is made of.
struct Parts {
    conn: Arc<Connection>,
    grants: Grants,
    waiting: Waiting,
    renewal: Renewal,
    shared: Shared,
    sets: Sets,
    elections: Elections,
    admin: Admin,
    guarded: Guarded,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("connection", &self.parts.conn)
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Connects to the cluster and grants the default session's lease.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for an invalid
    /// configuration or rejected credentials,
    /// [`ErrorKind::Unavailable`](lock_core::ErrorKind::Unavailable) /
    /// [`ErrorKind::Timeout`](lock_core::ErrorKind::Timeout) when no
    /// endpoint answers within the timeouts.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave a granted lease behind; it expires with
    /// its TTL.
    pub async fn connect(config: EtcdConfig) -> Result<Self, LockError> {
        let conn = Connection::open(config).await?;
        let grants = Grants::new(conn.clone());
        let waiting = Waiting::new(conn.clone(), grants.clone());
        let shared = Shared::new(conn.clone(), grants.clone(), waiting.clone());
        let elections = Elections::new(conn.clone(), grants.clone(), waiting.clone());
        let parts = Parts {
            guarded: Guarded::new(conn.clone(), grants.clone()),
            renewal: Renewal::new(conn.clone(), grants.clone()),
            sets: Sets::new(conn.clone(), grants.clone()),
            admin: Admin::new(
                conn.clone(),
                grants.clone(),
                waiting.clone(),
                shared.clone(),
                elections.clone(),
            ),
            conn,
            grants,
            waiting,
            shared,
            elections,
        };
        Ok(Self {
            parts: Arc::new(parts),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.parts.conn.config
    }

    /// The underlying etcd client (for diagnostics and tests).
    pub fn client(&self) -> &Client {
        &self.parts.conn.client
    }

    /// The prefix under which `key`'s entries live, ending with the
    /// separator: `<prefix>/<escaped key>/`. `etcdctl lock` on the same
    /// name without the trailing `/` takes the same lock.
    pub fn key_prefix(&self, key: &LockKey) -> String {
        self.parts.conn.key_prefix(key)
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
        self.parts.conn.session_leases(ttl_secs(ttl))
    }

    /// The compares that hold while `lease` holds its lock, for the
    /// caller's own [`Txn::when`](etcd_client::Txn::when): writes of data
    /// in this etcd, guarded by the lock without a fencing token.
    ///
    /// As Go's `concurrency.Mutex.IsOwner()`: the lease's entry still
    /// exists with the create revision it was granted with (the lease's
    /// token) and the lease's owner id in its value. A transaction with
    /// them in its `when` runs its success branch only if, at its commit,
    /// the lease still holds the key in etcd's order of events; a lease
    /// that was released, taken over (`force_release`, `etcdctl del`) or
    /// has expired (its entry deleted when its TTL ran out unrenewed, or
    /// with its session) fails them, and the transaction runs its failure
    /// branch instead. Concatenate them with your own compares (a
    /// transaction takes one `when`), and count them (2 or 3) against
    /// etcd's `--max-txn-ops`.
    ///
    /// What they do not promise: they look at etcd, not at the lease's
    /// local validity deadline (an entry that outlives its TTL by the
    /// moment its deletion takes still passes; nobody else can hold the
    /// key meanwhile), and they guard only what is in the same
    /// transaction (data elsewhere needs the fencing token). Do not write
    /// under the lock's own prefix in such a transaction.
    ///
    /// For exclusive leases (a mutex, a member of a multi-lock, an
    /// election's leadership). Cheap: no round trip for a lease of this
    /// backend's live session; one read for a lease whose entry must be
    /// looked up (its session replaced, or granted by another process).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`](lock_core::ErrorKind::Unsupported) for a
    /// read, write or semaphore lease;
    /// [`ErrorKind::InvalidArgument`](lock_core::ErrorKind::InvalidArgument)
    /// for a lease this driver did not grant; the read's errors
    /// (`Timeout`, `Unavailable`) when the entry must be looked up. These
    /// errors report [`Operation::GuardedWrite`].
    ///
    /// # Cancel safety
    ///
    /// Safe: it writes nothing.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(backend: lock_etcd::EtcdBackend, lease: lock_core::Lease)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// use lock_etcd::etcd_client::{Txn, TxnOp};
    ///
    /// let txn = Txn::new()
    ///     .when(backend.owner_compares(&lease).await?)
    ///     .and_then([TxnOp::put("reports/nightly", "done", None)]);
    /// let answer = backend.client().kv_client().txn(txn).await?;
    /// if !answer.succeeded() {
    ///     println!("the lock was lost: nothing written");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn owner_compares(&self, lease: &Lease) -> Result<Vec<Compare>, LockError> {
        self.parts.guarded.owner_compares(lease).await
    }

    /// Runs `operations` in one transaction guarded by
    /// [`owner_compares`](Self::owner_compares) of `lease`, on this
    /// backend's client with its per-call timeout: they run only if the
    /// lease still holds its lock at the commit, and the answer says which
    /// ([`EtcdGuardedOutcome::Refused`] is not an error). What it promises
    /// and what not: see [`owner_compares`](Self::owner_compares).
    ///
    /// # Errors
    ///
    /// As [`owner_compares`](Self::owner_compares); and the transaction's
    /// errors: `Timeout` (the outcome is unknown: the operations may have
    /// run), `Unavailable`, `Backend` (e.g. etcd refusing the operations:
    /// a key put twice, more than `--max-txn-ops`). These errors report
    /// [`Operation::GuardedWrite`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future once the transaction is sent leaves its outcome
    /// unknown: it ran whole or not at all, and only if the lease held.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(backend: lock_etcd::EtcdBackend, lease: lock_core::Lease)
    /// # -> Result<(), lock_core::LockError> {
    /// use lock_etcd::etcd_client::TxnOp;
    ///
    /// let put = TxnOp::put("reports/nightly", "done", None);
    /// if !backend.guarded_txn(&lease, [put]).await?.is_written() {
    ///     println!("the lock was lost: nothing written");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn guarded_txn(
        &self,
        lease: &Lease,
        operations: impl Into<Vec<TxnOp>>,
    ) -> Result<EtcdGuardedOutcome, LockError> {
        self.parts
            .guarded
            .guarded_txn(lease, operations.into())
            .await
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
        self.parts.conn.close().await
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
        let parts = &self.parts;
        // Every arm but the mutex's is boxed: async_trait copies this
        // future into a box of its own at every call, and inline the shared
        // shapes' futures made it 14.5 KB for each mutex grant too.
        match (kind, deadline) {
            (LeaseKind::Exclusive, None) => Box::pin(parts.grants.try_take(key, ttl)).await,
            (LeaseKind::Exclusive, Some(deadline)) => parts
                .waiting
                .take_waiting(key, ttl, deadline)
                .await
                .map(Some),
            (kind, None) => {
                Box::pin(
                    parts
                        .shared
                        .acquire_shared(key, kind, ttl, None, Operation::TryAcquire),
                )
                .await
            }
            (kind, Some(deadline)) => {
                // Bounded like the mutex's wait; dropping `acquire_shared`
                // is cancel-safe.
                let attempt =
                    parts
                        .shared
                        .acquire_shared(key, kind, ttl, Some(deadline), Operation::Acquire);
                Box::pin(bounded_wait(key, deadline, attempt))
                    .await
                    .map(Some)
            }
        }
    }

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        self.parts.renewal.renew_batch(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        if lease.kind() == LeaseKind::Exclusive {
            self.parts.grants.release(lease).await
        } else {
            // Boxed: rare, and inline it would enlarge every release.
            Box::pin(self.parts.shared.release_shared(lease)).await
        }
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        match shape {
            LockShape::ReadWrite | LockShape::Semaphore => {
                self.parts.shared.shared_holders(key, shape).await
            }
            _ => Ok(lock_core::kind::mutex_holders(
                self.parts.grants.inspect_mutex(key).await?,
            )),
        }
    }

    fn facets(&self) -> Facets<'_> {
        let parts = &*self.parts;
        Facets {
            listing: Some(&parts.admin),
            admin: Some(&parts.admin),
            elections: Some(&parts.elections),
            lock_sets: Some(&parts.sets),
            downgrade: Some(&parts.shared),
            holder_watch: Some(&parts.admin),
        }
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
