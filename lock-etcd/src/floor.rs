//! The raw floor of an acquire+release cycle, for benchmarks.
//!
//! [`EtcdFloor`] has an etcd client of its own (its own HTTP/2 connection:
//! one per endpoint of the URL, so one for a single-member URL), never the
//! driver's, and a lease of its own granted once at connect and kept alive
//! by a small task of its own (one keep-alive per TTL/3, nothing of the
//! driver's session machinery). A cycle is the driver's uncontended path,
//! two RPCs:
//!
//! 1. the create transaction of etcd's concurrency mutex: put
//!    `<prefix>/<key>/<lease hex>` with the lease if absent, and read the
//!    oldest entry under the key in the same revision (granted when it is
//!    ours; its create revision is the token);
//! 2. the guarded delete: delete the entry only if its create revision and
//!    owner value are still ours (the release).
//!
//! A key found held has our queued entry deleted again (a third RPC, not in
//! the uncontended cycle). The same transactions as the driver, on the
//! same layout, so the floor's entries exclude with the driver's (and
//! `etcdctl lock`'s) on the same key.
//!
//! It exists so benchmarks (`distlock compare`, this crate's `bench`
//! example) can report "ours / floor" ratios measured in one run. It is not
//! a lock API: use [`EtcdBackend`](crate::EtcdBackend) for that.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, KvClient};
use lock_core::floor::{FloorGrant, RawFloor};
use lock_core::{ErrorKind, LockError, LockKey, Operation, OwnerId, check_ttl, with_timeout};
use tokio::sync::Mutex;
use tokio::time::sleep;

use crate::config::EtcdConfig;
use crate::connect::connect_client;
use crate::driver::MIN_TTL;
use crate::error::{NAME, from_etcd, grant_refused, protocol_error};
use crate::keys::{
    Created, create_txn, entry_value, guarded_delete, key_prefix, mutex_value, parse_shared_value,
    plain_entry, shape_prefix, shared_delete,
};
use crate::session::ttl_secs;

/// Hand-issued create and guarded-delete transactions on a client and
/// lease of its own: the floor our acquire+release cycle is measured
/// against. Serves one call at a time (concurrent calls queue).
///
/// Dropping it stops the keep-alive and revokes the lease in the
/// background.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use lock_core::floor::RawFloor;
/// use lock_etcd::floor::EtcdFloor;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let floor = EtcdFloor::connect("etcd://127.0.0.1:2379/bench").await?;
/// assert_eq!(floor.round_trips_per_cycle(), 2);
/// floor.cycle("k", Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
pub struct EtcdFloor {
    client: Client,
    kv: Mutex<KvClient>,
    /// Normalized prefix, without a trailing separator.
    prefix: String,
    lease_id: i64,
    lease_hex: String,
    op_timeout: Duration,
    keeper: tokio::task::JoinHandle<()>,
}

impl fmt::Debug for EtcdFloor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdFloor")
            .field("prefix", &self.prefix)
            .field("lease", &self.lease_hex)
            .field("op_timeout", &self.op_timeout)
            .finish_non_exhaustive()
    }
}

impl Drop for EtcdFloor {
    fn drop(&mut self) {
        self.keeper.abort();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut leases = self.client.lease_client();
        let lease_id = self.lease_id;
        runtime.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(2), leases.revoke(lease_id)).await;
        });
    }
}

impl EtcdFloor {
    /// Connects a client of its own like [`crate::connect`] (same URL
    /// syntax and options) and grants one lease of the URL's `ttl`, kept
    /// alive (every TTL/3) until the floor is dropped.
    ///
    /// # Errors
    ///
    /// As [`crate::connect`]: [`ErrorKind::Config`] for a bad URL or
    /// rejected credentials, [`ErrorKind::Unavailable`] /
    /// [`ErrorKind::Timeout`] when etcd cannot be reached or the lease
    /// cannot be granted in time.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave a granted lease behind; it expires with
    /// its TTL.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::open(&EtcdConfig::from_url(url)?).await
    }

    /// A floor with `backend`'s configuration (endpoints, credentials, TLS,
    /// prefix, TTL, timeouts) on a new client and lease of its own: the
    /// backend's connection is not shared.
    ///
    /// # Errors
    ///
    /// As [`EtcdFloor::connect`], less the URL errors.
    ///
    /// # Cancel safety
    ///
    /// As [`EtcdFloor::connect`].
    pub async fn from_backend(backend: &crate::EtcdBackend) -> Result<Self, LockError> {
        Self::open(backend.config()).await
    }

    async fn open(config: &EtcdConfig) -> Result<Self, LockError> {
        let op = Operation::Connect;
        let client = connect_client(config).await?;
        let ttl = i64::try_from(ttl_secs(config.ttl))
            .map_err(|_| LockError::invalid_argument(op, "TTL too large for an etcd lease"))?;
        let mut leases = client.lease_client();
        let grant = with_timeout(config.op_timeout, op, async {
            leases.grant(ttl, None).await.map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_backend(NAME))?;
        if let Some(err) = grant_refused(op, "the floor's lease grant", &grant) {
            return Err(err);
        }
        let interval = Duration::from_secs(u64::try_from(grant.ttl()).unwrap_or(1)) / 3;
        let keeper = tokio::spawn(keep_alive(client.clone(), grant.id(), interval));
        Ok(Self {
            kv: Mutex::new(client.kv_client()),
            client,
            prefix: config.prefix.trim_end_matches('/').to_owned(),
            lease_id: grant.id(),
            lease_hex: format!("{:x}", grant.id()),
            op_timeout: config.op_timeout,
            keeper,
        })
    }

    /// One acquire + one release of `key`: [`RawFloor::cycle`].
    ///
    /// # Errors
    ///
    /// As [`RawFloor::cycle`].
    ///
    /// # Cancel safety
    ///
    /// As [`RawFloor::try_grant`].
    pub async fn cycle(&self, key: &str, ttl: Duration) -> Result<(), LockError> {
        RawFloor::cycle(self, key, ttl).await
    }

    /// The release of a grant of this floor's: the guarded delete `delete`
    /// builds from the grant's entry, create revision and owner, sent only
    /// when the entry is under the prefix `key_prefix` gives for the
    /// grant's key (only an entry of this key is touched).
    async fn release_entry(
        &self,
        grant: &FloorGrant,
        key_prefix: impl FnOnce(&str, &LockKey) -> String,
        delete: impl FnOnce(&str, i64, OwnerId) -> etcd_client::Txn,
    ) -> Result<bool, LockError> {
        let op = Operation::Release;
        let key = LockKey::new(grant.key.as_str())?;
        let Some((owner, revision)) = grant_parts(grant) else {
            return Ok(false);
        };
        if !grant.handle.starts_with(&key_prefix(&self.prefix, &key)) {
            return Ok(false);
        }
        let response = self
            .txn(op, delete(&grant.handle, revision, owner))
            .await
            .map_err(|e| e.with_key(&key))?;
        Ok(response.succeeded())
    }

    /// One transaction, bounded by the operation timeout.
    async fn txn(
        &self,
        op: Operation,
        txn: etcd_client::Txn,
    ) -> Result<etcd_client::TxnResponse, LockError> {
        let mut kv = self.kv.lock().await;
        with_timeout(self.op_timeout, op, async {
            kv.txn(txn).await.map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_backend(NAME))
    }
}

/// Keeps the floor's lease alive: one keep-alive per `interval` on one
/// stream (reopened after a failure). Ends when the floor drops it.
async fn keep_alive(client: Client, lease_id: i64, interval: Duration) {
    let interval = interval.max(Duration::from_millis(100));
    let mut stream = None;
    loop {
        sleep(interval).await;
        if stream.is_none() {
            // Opening the stream sends the first keep-alive.
            stream = client.lease_client().keep_alive(lease_id).await.ok();
            continue;
        }
        let kept = match &mut stream {
            Some((keeper, responses)) => {
                keeper.keep_alive().await.is_ok()
                    && matches!(responses.message().await, Ok(Some(_)))
            }
            None => false,
        };
        if !kept {
            stream = None;
        }
    }
}

#[async_trait]
impl RawFloor for EtcdFloor {
    fn name(&self) -> &'static str {
        NAME
    }

    /// The create transaction and the guarded delete.
    fn round_trips_per_cycle(&self) -> u32 {
        2
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        let key = LockKey::new(key)?;
        let op = Operation::TryAcquire;
        check_ttl(ttl, MIN_TTL, op).map_err(|e| e.with_key(&key).with_backend(NAME))?;
        let key_prefix = key_prefix(&self.prefix, &key);
        let entry = plain_entry(&key_prefix, &self.lease_hex);
        let owner = OwnerId::random();
        let response = self
            .txn(
                op,
                create_txn(&key_prefix, &entry, self.lease_id, mutex_value(owner)),
            )
            .await
            .map_err(|e| e.with_key(&key))?;
        if !response.succeeded() {
            return Err(occupied(op, &key));
        }
        let created = Created::from_response(&response, owner);
        let Some(revision) = created.my_revision else {
            return Err(protocol_error(op, &key, "no revision for our entry"));
        };
        if created.owner_revision != Some(revision) {
            // An older entry holds the key: withdraw ours.
            self.txn(op, guarded_delete(&entry, revision, owner))
                .await
                .map_err(|e| e.with_key(&key))?;
            return Ok(None);
        }
        floor_grant(&key, owner, revision, entry, op).map(Some)
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        self.release_entry(grant, key_prefix, guarded_delete).await
    }
}

/// The floor of one permit acquire+release on a semaphore of the driver's
/// layout (`<prefix>/<key>%sem/<lease hex>`, see the crate docs): an
/// [`EtcdFloor`]'s client and lease, two RPCs per uncontended cycle:
///
/// 1. create our entry (value `p<count>-<limit> <owner hex>`, with the
///    lease) if absent and read every entry under the semaphore's prefix in
///    the same revision: granted when the older entries' counts plus ours
///    fit in the limit (the token is that revision);
/// 2. delete our entry if its create revision and value are still ours.
///
/// A semaphore found full has our entry deleted again (a third RPC); an
/// older entry with another limit gives `InvalidArgument` (after the same
/// delete). Build it with [`EtcdPermitFloor::connect`] or
/// [`EtcdPermitFloor::from_backend`] and the number of permits per cycle
/// and the semaphore's limit.
#[derive(Debug)]
pub struct EtcdPermitFloor {
    floor: EtcdFloor,
    count: u32,
    limit: u32,
}

impl EtcdPermitFloor {
    /// An [`EtcdFloor::connect`] that takes `count` of `limit` permits per
    /// cycle.
    ///
    /// # Errors
    ///
    /// As [`EtcdFloor::connect`]; `InvalidArgument` for bad counts
    /// ([`lock_core::LeaseKind::permits`]).
    ///
    /// # Cancel safety
    ///
    /// As [`EtcdFloor::connect`].
    pub async fn connect(url: &str, count: u32, limit: u32) -> Result<Self, LockError> {
        lock_core::LeaseKind::permits(count, limit)?;
        Ok(Self {
            floor: EtcdFloor::connect(url).await?,
            count,
            limit,
        })
    }

    /// An [`EtcdFloor::from_backend`] that takes `count` of `limit` permits
    /// per cycle.
    ///
    /// # Errors
    ///
    /// As [`EtcdPermitFloor::connect`], less the URL errors.
    ///
    /// # Cancel safety
    ///
    /// As [`EtcdFloor::connect`].
    pub async fn from_backend(
        backend: &crate::EtcdBackend,
        count: u32,
        limit: u32,
    ) -> Result<Self, LockError> {
        lock_core::LeaseKind::permits(count, limit)?;
        Ok(Self {
            floor: EtcdFloor::from_backend(backend).await?,
            count,
            limit,
        })
    }

    fn kind(&self) -> lock_core::LeaseKind {
        lock_core::LeaseKind::Permits {
            count: self.count,
            limit: self.limit,
        }
    }
}

#[async_trait]
impl RawFloor for EtcdPermitFloor {
    fn name(&self) -> &'static str {
        NAME
    }

    /// The create-and-read transaction and the guarded delete.
    fn round_trips_per_cycle(&self) -> u32 {
        2
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        use etcd_client::{
            Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
            TxnOpResponse,
        };
        let key = LockKey::new(key)?;
        let op = Operation::TryAcquire;
        check_ttl(ttl, MIN_TTL, op).map_err(|e| e.with_key(&key).with_backend(NAME))?;
        let prefix = shape_prefix(&self.floor.prefix, &key, lock_core::LockShape::Semaphore);
        let entry = plain_entry(&prefix, &self.floor.lease_hex);
        let owner = OwnerId::random();
        let value = entry_value(self.kind(), owner);
        let txn = Txn::new()
            .when([Compare::create_revision(
                entry.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::put(
                    entry.as_str(),
                    value.as_str(),
                    Some(PutOptions::new().with_lease(self.floor.lease_id)),
                ),
                TxnOp::get(
                    prefix.as_str(),
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_sort(SortTarget::Create, SortOrder::Ascend),
                    ),
                ),
            ]);
        let response = self
            .floor
            .txn(op, txn)
            .await
            .map_err(|e| e.with_key(&key))?;
        if !response.succeeded() {
            return Err(occupied(op, &key));
        }
        let revision = response.header().map_or(0, |h| h.revision());
        let mut taken: u64 = 0;
        let mut other_limit = None;
        if let Some(TxnOpResponse::Get(get)) = response.op_responses().get(1) {
            for kv in get.kvs().iter().filter(|kv| kv.key() != entry.as_bytes()) {
                match parse_shared_value(kv.value()).map(|v| v.kind) {
                    Some(lock_core::LeaseKind::Permits { count, limit }) if limit == self.limit => {
                        taken += u64::from(count);
                    }
                    Some(lock_core::LeaseKind::Permits { limit, .. }) => {
                        other_limit = Some(limit);
                    }
                    _ => taken += u64::from(self.limit),
                }
            }
        }
        if other_limit.is_some() || taken + u64::from(self.count) > u64::from(self.limit) {
            self.floor
                .txn(op, shared_delete(&entry, revision, self.kind(), owner))
                .await
                .map_err(|e| e.with_key(&key))?;
            if let Some(limit) = other_limit {
                return Err(LockError::invalid_argument(
                    op,
                    format!(
                        "the semaphore's holders use {limit} permits, not {}",
                        self.limit
                    ),
                )
                .with_key(&key)
                .with_backend(NAME));
            }
            return Ok(None);
        }
        floor_grant(&key, owner, revision, entry, op).map(Some)
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        self.floor
            .release_entry(
                grant,
                |prefix, key| shape_prefix(prefix, key, lock_core::LockShape::Semaphore),
                |entry, revision, owner| shared_delete(entry, revision, self.kind(), owner),
            )
            .await
    }
}

/// `Contended`: the create found the floor's own entry under `key`
/// (concurrent calls on one key).
fn occupied(op: Operation, key: &LockKey) -> LockError {
    LockError::new(
        ErrorKind::Contended,
        op,
        "the floor already has an entry under this key (concurrent calls on one key)",
    )
    .with_key(key)
    .with_backend(NAME)
}

/// The grant of our entry `entry` (created at `revision`) on `key`.
fn floor_grant(
    key: &LockKey,
    owner: OwnerId,
    revision: i64,
    entry: String,
    op: Operation,
) -> Result<FloorGrant, LockError> {
    let token =
        u64::try_from(revision).map_err(|_| protocol_error(op, key, "negative create revision"))?;
    Ok(FloorGrant {
        key: key.as_str().to_owned(),
        owner: owner.to_hex(),
        token,
        handle: entry,
    })
}

/// A grant's owner and entry revision; `None` for a grant no floor handed
/// out (released as not held).
fn grant_parts(grant: &FloorGrant) -> Option<(OwnerId, i64)> {
    Some((
        OwnerId::from_hex(&grant.owner).ok()?,
        i64::try_from(grant.token).ok()?,
    ))
}
