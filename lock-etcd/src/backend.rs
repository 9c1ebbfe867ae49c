//! [`EtcdBackend`]: the components of one backend, and the kernel
//! ([`LockBackend`]) and facets delegating to them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::Client;
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
        match (kind, deadline) {
            (LeaseKind::Exclusive, None) => parts.grants.try_take(key, ttl).await,
            (LeaseKind::Exclusive, Some(deadline)) => parts
                .waiting
                .take_waiting(key, ttl, deadline)
                .await
                .map(Some),
            (kind, None) => {
                parts
                    .shared
                    .acquire_shared(key, kind, ttl, None, Operation::TryAcquire)
                    .await
            }
            (kind, Some(deadline)) => {
                // Bounded like the mutex's wait; dropping `acquire_shared`
                // is cancel-safe.
                let attempt =
                    parts
                        .shared
                        .acquire_shared(key, kind, ttl, Some(deadline), Operation::Acquire);
                bounded_wait(key, deadline, attempt).await.map(Some)
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
            self.parts.shared.release_shared(lease).await
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
