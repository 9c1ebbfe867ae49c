//! The etcd floor: the raw floor of an acquire+release cycle, for
//! benchmarks.
//!
//! [`EtcdFloor`] speaks etcd's gRPC API **by hand on one bare HTTP/2
//! connection of its own** (the `h2` crate over a tokio `TcpStream`, the
//! protobuf messages encoded and decoded in `etcd/wire.rs`): none of the
//! driver's code runs, and not its `etcd-client` client, tonic channel or
//! generated messages either. It grants one lease at connect and keeps it
//! alive on one `LeaseKeepAlive` stream (one keep-alive per TTL/3). A cycle
//! is the driver's uncontended path, two RPCs:
//!
//! 1. the create transaction of etcd's concurrency mutex: put
//!    `<prefix>/<key>/<lease hex>` with the lease if absent, and read the
//!    oldest entry under the key in the same revision (granted when it is
//!    ours; its create revision is the token);
//! 2. the guarded delete: delete the entry only if its create revision and
//!    owner value are still ours (the release).
//!
//! A key found held has our queued entry deleted again (a third RPC, not in
//! the uncontended cycle). The same transactions as the driver's (written
//! again here), on the same layout ([`lock_etcd::keys`], the one module the
//! floor shares with the driver), so the floor's entries exclude with the
//! driver's (and `etcdctl lock`'s) on the same key. It talks to the URL's
//! first endpoint, in plain HTTP/2 (no TLS), with the URL's credentials
//! if any.
//!
//! It exists so benchmarks (`distlock-compare compare`, the `etcd_bench`
//! example) can report "ours / floor" ratios measured in one run. It is not
//! a lock API: use [`EtcdBackend`](lock_etcd::EtcdBackend) for that.

mod crate_alone;
mod wire;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use conformance::floor::{FloorGrant, RawFloor};
use lock_core::{ErrorKind, LockError, LockKey, Operation, OwnerId, check_ttl, with_timeout};

use lock_etcd::keys::{
    entry_value, key_prefix, mutex_value, parse_shared_value, plain_entry, shape_prefix,
    shared_owner_part,
};
use lock_etcd::{EtcdConfig, MIN_TTL};
use wire::{Cmp, Compare, Op, TxnReply, Wire};

pub use crate_alone::EtcdCrateAlone;

/// The backend's name, as the driver's errors carry it.
const NAME: &str = "etcd";

crate::floor_fn!(pub(crate) fn floor = EtcdFloor::connect);
crate::floor_fn!(pub(crate) fn permit_floor = one_of_four);

/// One permit of a semaphore of 4 per cycle (the permit floor's contract).
async fn one_of_four(url: &str) -> Result<EtcdPermitFloor, LockError> {
    EtcdPermitFloor::connect(url, 1, 4).await
}

/// A lease's TTL in whole seconds as etcd grants it: rounded up, at least 1
/// (as the driver's sessions).
fn ttl_secs(ttl: Duration) -> u64 {
    let secs = ttl.as_secs();
    let secs = if ttl.subsec_nanos() > 0 {
        secs.saturating_add(1)
    } else {
        secs
    };
    secs.max(1)
}

/// An answer the floor cannot read, as the driver reports one.
fn protocol_error(op: Operation, key: &LockKey, why: &str) -> LockError {
    LockError::new(
        ErrorKind::Backend,
        op,
        format!("unexpected etcd answer: {why}"),
    )
    .with_key(key)
    .with_backend(NAME)
}

/// Hand-issued create and guarded-delete transactions on a bare HTTP/2
/// connection and a lease of its own: the floor our acquire+release cycle
/// is measured against. Calls from several tasks share the connection
/// (HTTP/2 streams); eight independent clients are eight floors.
///
/// Dropping it stops the keep-alive and revokes the lease in the
/// background.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use conformance::floor::RawFloor;
/// use lock_bench::etcd::EtcdFloor;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let floor = EtcdFloor::connect("etcd://127.0.0.1:2379/bench").await?;
/// assert_eq!(floor.round_trips_per_cycle(), 2);
/// floor.cycle("k", Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
pub struct EtcdFloor {
    wire: Wire,
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
        let wire = self.wire.clone();
        let mut revoke = Vec::new();
        wire::put_int(&mut revoke, 1, self.lease_id);
        runtime.spawn(async move {
            let path = "/etcdserverpb.Lease/LeaseRevoke";
            let call = wire.unary(path, revoke, Operation::Release);
            let _ = tokio::time::timeout(Duration::from_secs(2), call).await;
        });
    }
}

impl EtcdFloor {
    /// Connects a client of its own like [`lock_etcd::connect`] (same URL
    /// syntax and options) and grants one lease of the URL's `ttl`, kept
    /// alive (every TTL/3) until the floor is dropped.
    ///
    /// # Errors
    ///
    /// As [`lock_etcd::connect`]: [`ErrorKind::Config`] for a bad URL or
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
    pub async fn from_backend(backend: &lock_etcd::EtcdBackend) -> Result<Self, LockError> {
        Self::open(backend.config()).await
    }

    async fn open(config: &EtcdConfig) -> Result<Self, LockError> {
        let op = Operation::Connect;
        if config.tls.is_some() {
            return Err(LockError::config(
                "the etcd floor speaks plain HTTP/2 by hand: no TLS (compare against a \
                 plaintext member)",
            )
            .with_backend(NAME));
        }
        let Some(endpoint) = config.endpoints.first() else {
            return Err(LockError::config("no etcd endpoint").with_backend(NAME));
        };
        let ttl = i64::try_from(ttl_secs(config.ttl))
            .map_err(|_| LockError::invalid_argument(op, "TTL too large for an etcd lease"))?;
        let (wire, lease_id, granted) = with_timeout(config.connect_timeout, op, async {
            let mut wire = Wire::connect(endpoint, op).await?;
            if let (Some(user), Some(password)) = (&config.user, &config.password) {
                wire.authenticate(user, password, op).await?;
            }
            // LeaseGrant { TTL = 1 } -> { ID = 2, TTL = 3, error = 4 }.
            let mut request = Vec::new();
            wire::put_int(&mut request, 1, ttl);
            let reply = wire
                .unary("/etcdserverpb.Lease/LeaseGrant", request, op)
                .await?;
            let error = wire::bytes_field(&reply, 4)
                .map(|e| String::from_utf8_lossy(e).into_owned())
                .unwrap_or_default();
            let id = wire::int_field(&reply, 2);
            if id == 0 || !error.is_empty() {
                return Err(LockError::new(
                    ErrorKind::Unavailable,
                    op,
                    format!("the floor's lease grant was refused: {error}"),
                )
                .with_backend(NAME));
            }
            Ok((wire, id, wire::int_field(&reply, 3)))
        })
        .await
        .map_err(|e| e.with_backend(NAME))?;
        let interval = Duration::from_secs(u64::try_from(granted).unwrap_or(1)) / 3;
        let keeper = tokio::spawn(wire.clone().keep_alive(lease_id, interval));
        Ok(Self {
            wire,
            prefix: config.prefix.trim_end_matches('/').to_owned(),
            lease_id,
            lease_hex: format!("{lease_id:x}"),
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

    /// The release of a grant of this floor's: the guarded delete of the
    /// grant's entry (its create revision, and a value that starts with
    /// `owner_part` and a space), sent only when the entry is under the
    /// prefix `key_prefix` gives for the grant's key (only an entry of this
    /// key is touched).
    async fn release_entry(
        &self,
        grant: &FloorGrant,
        key_prefix: impl FnOnce(&str, &LockKey) -> String,
        owner_part: impl FnOnce(OwnerId) -> String,
    ) -> Result<bool, LockError> {
        let op = Operation::Release;
        let key = LockKey::new(grant.key.as_str())?;
        let Some((owner, revision)) = grant_parts(grant) else {
            return Ok(false);
        };
        if !grant.handle.starts_with(&key_prefix(&self.prefix, &key)) {
            return Ok(false);
        }
        let reply = self
            .delete(op, &grant.handle, revision, &owner_part(owner))
            .await
            .map_err(|e| e.with_key(&key))?;
        Ok(reply.succeeded)
    }

    /// The guarded delete of `entry`: only while it has this create
    /// revision and its value is `<owner part> ...` (above the owner part,
    /// below the owner part followed by `!`), as the driver's release.
    async fn delete(
        &self,
        op: Operation,
        entry: &str,
        revision: i64,
        owner_part: &str,
    ) -> Result<TxnReply, LockError> {
        let above = format!("{owner_part}!");
        let request = wire::txn(
            &[
                Compare::CreateRevision(entry, Cmp::Equal, revision),
                Compare::Value(entry, Cmp::Greater, owner_part.as_bytes()),
                Compare::Value(entry, Cmp::Less, above.as_bytes()),
            ],
            &[Op::Delete(entry)],
            &[],
        );
        self.txn(op, request).await
    }

    /// The driver's create transaction under `prefix`: put `value` at this
    /// floor's entry there (with the lease) if it is absent, and list the
    /// entries under `prefix` in the same revision, oldest first (at most
    /// `limit`; 0: all). `read_on_failure`: the transaction's failure branch
    /// reads our entry and the same listing, as the driver's mutex create
    /// does. `Contended` when the entry exists (concurrent calls on one
    /// key).
    async fn create(
        &self,
        key: &LockKey,
        prefix: &str,
        value: &str,
        limit: i64,
        read_on_failure: bool,
    ) -> Result<CreatedEntry, LockError> {
        let op = Operation::TryAcquire;
        let entry = plain_entry(prefix, &self.lease_hex);
        let failure = [Op::Get(&entry), Op::Oldest(prefix, limit)];
        let request = wire::txn(
            &[Compare::CreateRevision(&entry, Cmp::Equal, 0)],
            &[
                Op::Put(&entry, value.as_bytes(), self.lease_id),
                Op::Oldest(prefix, limit),
            ],
            if read_on_failure { &failure } else { &[] },
        );
        let reply = self.txn(op, request).await.map_err(|e| e.with_key(key))?;
        if !reply.succeeded {
            return Err(occupied(op, key));
        }
        if reply.revision <= 0 {
            return Err(protocol_error(op, key, "no revision for our entry"));
        }
        Ok(CreatedEntry {
            revision: reply.revision,
            listed: reply.ranges.into_iter().nth(1).unwrap_or_default(),
            entry,
        })
    }

    /// One transaction, bounded by the operation timeout.
    async fn txn(&self, op: Operation, request: Vec<u8>) -> Result<TxnReply, LockError> {
        with_timeout(self.op_timeout, op, async {
            let reply = self.wire.unary("/etcdserverpb.KV/Txn", request, op).await?;
            Ok(wire::txn_reply(&reply))
        })
        .await
        .map_err(|e| e.with_backend(NAME))
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
        let op = Operation::TryAcquire;
        let key = checked_key(key, ttl, op)?;
        let owner = OwnerId::random();
        // The driver's mutex: the oldest entry under the key holds it (and
        // the driver reads the same on failure).
        let created = self
            .create(
                &key,
                &key_prefix(&self.prefix, &key),
                &mutex_value(owner),
                1,
                true,
            )
            .await?;
        let (entry, revision) = (created.entry, created.revision);
        if created.listed.first().map(|kv| kv.create_revision) != Some(revision) {
            // An older entry holds the key: withdraw ours.
            self.delete(op, &entry, revision, &owner.to_hex())
                .await
                .map_err(|e| e.with_key(&key))?;
            return Ok(None);
        }
        floor_grant(&key, owner, revision, entry, op).map(Some)
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        self.release_entry(grant, key_prefix, |owner| owner.to_hex())
            .await
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
        backend: &lock_etcd::EtcdBackend,
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
        let op = Operation::TryAcquire;
        let key = checked_key(key, ttl, op)?;
        let owner = OwnerId::random();
        // Every entry under the semaphore counts.
        let prefix = shape_prefix(&self.floor.prefix, &key, lock_core::LockShape::Semaphore);
        let created = self
            .floor
            .create(&key, &prefix, &entry_value(self.kind(), owner), 0, false)
            .await?;
        let (entry, revision) = (created.entry, created.revision);
        let mut taken: u64 = 0;
        let mut other_limit = None;
        for kv in created
            .listed
            .iter()
            .filter(|kv| kv.key != entry.as_bytes())
        {
            match parse_shared_value(&kv.value).map(|v| v.kind) {
                Some(lock_core::LeaseKind::Permits { count, limit }) if limit == self.limit => {
                    taken += u64::from(count);
                }
                Some(lock_core::LeaseKind::Permits { limit, .. }) => {
                    other_limit = Some(limit);
                }
                _ => taken += u64::from(self.limit),
            }
        }
        if other_limit.is_some() || taken + u64::from(self.count) > u64::from(self.limit) {
            let part = shared_owner_part(self.kind(), owner);
            self.floor
                .delete(op, &entry, revision, &part)
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
                |owner| shared_owner_part(self.kind(), owner),
            )
            .await
    }
}

/// What [`EtcdFloor::create`] made: our entry, its create revision, and the
/// entries listed under the prefix in that revision.
struct CreatedEntry {
    entry: String,
    revision: i64,
    listed: Vec<wire::Kv>,
}

/// `key` as a lock key, with a TTL the driver takes.
fn checked_key(key: &str, ttl: Duration, op: Operation) -> Result<LockKey, LockError> {
    let key = LockKey::new(key)?;
    check_ttl(ttl, MIN_TTL, op).map_err(|e| e.with_key(&key).with_backend(NAME))?;
    Ok(key)
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
