//! The raw floor of one permit acquire+release: the semaphore recipe's
//! requests written by hand on the floor's one bare connection.
//!
//! A cycle on a semaphore with a free permit is what the driver's recipe
//! needs, seven requests in five round trips (the driver sends the same
//! ones, plus an early look at the limit before the mutex):
//!
//! 1. `create2` of the internal mutex's node `<sem>/locks/_c_<id>-lock-`,
//!    and in the same write
//! 2. `getChildren` of `<sem>/locks`: ours must be first (otherwise the
//!    node is deleted and the semaphore reported busy);
//! 3. `getData` of `<sem>/leases`: the limit our clients agreed on (a
//!    different one while leases exist is refused; an idle semaphore, or
//!    a missing directory, takes ours with a `setData`, outside the steady
//!    state);
//! 4. `create2` of the lease node `<sem>/leases/_c_<id>-lease-`; its
//!    `czxid` is the token; and in the same write
//! 5. `getChildren` of `<sem>/leases`: granted when there are at most
//!    `limit` (otherwise both nodes are deleted and the semaphore reported
//!    busy);
//! 6. `delete` of the mutex node;
//! 7. `delete` of the lease node (the release).
//!
//! Paths and names come from the driver's helpers, so the floor's permits
//! count against the driver's (and Curator's `InterProcessSemaphoreV2`'s)
//! on the same key.

use std::time::Duration;

use async_trait::async_trait;
use conformance::floor::{FloorGrant, RawFloor};
use lock_core::{ErrorKind, LockError, LockKey, Operation, OwnerId};

use lock_zk::keys::{LEASE_NAME, named_prefix, owner_of, sem_dir, split_node};

use super::wire::{Decoder, code, op};
use super::{NAME, ZkFloor, floor_grant, protocol, server_error, try_grant_key, wire_error};

/// How a refused create names a semaphore's node.
const SEM_NODE: &str = "a semaphore node";

/// One permit of a semaphore of `limit` per cycle, by hand on one bare
/// connection (a [`ZkFloor`]'s).
///
/// A cycle on a semaphore with a free permit is what the driver's recipe
/// needs, seven requests in five round trips (the driver sends the same
/// ones, plus an early look at the limit before the mutex):
///
/// 1. `create2` of the internal mutex's node `<sem>/locks/_c_<id>-lock-`,
///    and in the same write
/// 2. `getChildren` of `<sem>/locks`: ours must be first (otherwise the
///    node is deleted and the semaphore reported busy);
/// 3. `getData` of `<sem>/leases`: the limit our clients agreed on (a
///    different one while leases exist is refused; an idle semaphore, or
///    a missing directory, takes ours with a `setData`, outside the steady
///    state);
/// 4. `create2` of the lease node `<sem>/leases/_c_<id>-lease-`; its
///    `czxid` is the token; and in the same write
/// 5. `getChildren` of `<sem>/leases`: granted when there are at most
///    `limit` (otherwise both nodes are deleted and the semaphore reported
///    busy);
/// 6. `delete` of the mutex node;
/// 7. `delete` of the lease node (the release).
///
/// Paths and names are the driver's, so the floor's permits count against
/// the driver's (and Curator's `InterProcessSemaphoreV2`'s) on the same
/// key.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use conformance::floor::RawFloor;
/// use lock_bench::zk::ZkPermitFloor;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let floor = ZkPermitFloor::connect("zk://127.0.0.1:2181", 4).await?;
/// assert_eq!(floor.round_trips_per_cycle(), 7);
/// floor.cycle("bench/0", Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ZkPermitFloor {
    floor: ZkFloor,
    limit: u32,
}

impl ZkPermitFloor {
    /// Opens the floor's own session (see [`ZkFloor::connect`]) for
    /// permits of a semaphore of `limit`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for a limit of 0 or above
    /// [`lock_core::MAX_PERMITS`]; otherwise as [`ZkFloor::connect`].
    ///
    /// # Cancel safety
    ///
    /// As [`ZkFloor::connect`].
    pub async fn connect(url: &str, limit: u32) -> Result<Self, LockError> {
        lock_core::LeaseKind::permits(1, limit)?;
        Ok(Self {
            floor: ZkFloor::connect(url).await?,
            limit,
        })
    }

    /// The semaphore's limit.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// `getData` of `path`: its data and number of children; `None` when
    /// it does not exist.
    async fn data(
        &self,
        operation: Operation,
        path: &str,
    ) -> Result<Option<(Vec<u8>, i32)>, LockError> {
        let server_path = self.floor.server_path(path);
        let (err, body) = self
            .floor
            .request(operation, op::GET_DATA, |packet| {
                packet.string(&server_path).boolean(false);
            })
            .await?;
        match err {
            code::OK => {}
            code::NO_NODE => return Ok(None),
            err => return Err(server_error(operation, err, "reading the leases' limit")),
        }
        let mut decoder = Decoder::new(&body);
        let decoded = decoder.buffer().and_then(|data| {
            let data = data.to_vec();
            Ok((data, decoder.stat_num_children()?))
        });
        decoded.map(Some).map_err(|e| wire_error(operation, e))
    }

    /// `setData` of `path` (any version).
    async fn set_data(
        &self,
        operation: Operation,
        path: &str,
        data: &[u8],
    ) -> Result<(), LockError> {
        let server_path = self.floor.server_path(path);
        let (err, _) = self
            .floor
            .request(operation, op::SET_DATA, |packet| {
                packet.string(&server_path).buffer(data).int(-1);
            })
            .await?;
        if err == code::OK {
            Ok(())
        } else {
            Err(server_error(operation, err, "storing the leases' limit"))
        }
    }
}

#[async_trait]
impl RawFloor for ZkPermitFloor {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Mutex create2 with getChildren behind it, getData, lease create2 and
    /// getChildren behind it, mutex delete, lease delete.
    fn round_trips_per_cycle(&self) -> u32 {
        5
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        let key = try_grant_key(key, ttl)?;
        let op = Operation::TryAcquire;
        let base = sem_dir(&self.floor.shared.root, &key);
        let (locks, leases) = (format!("{base}/locks"), format!("{base}/leases"));
        let owner = OwnerId::random();
        let with_key = |e: LockError| e.with_key(&key);
        // 1, 2: the internal mutex, its create and list in one write; it
        // must be first (one gone before the list is not).
        let (mutex, _, first) = self
            .floor
            .lock_node(op, &locks, owner, SEM_NODE)
            .await
            .map_err(with_key)?;
        if first != Some(true) {
            self.floor.delete(op, &mutex).await.map_err(with_key)?;
            return Ok(None);
        }
        let result = self.under_mutex(op, &leases, owner).await;
        // 6: the mutex goes whatever happened under it.
        let released = self.floor.delete(op, &mutex).await;
        let grant = result.map_err(with_key)?;
        released.map_err(with_key)?;
        Ok(grant.map(|(path, token)| floor_grant(&key, owner, token, path)))
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        let op = Operation::Release;
        let key = LockKey::new(grant.key.as_str())?;
        let leases = format!("{}/leases", sem_dir(&self.floor.shared.root, &key));
        // Only a lease node of this key carrying the grant's owner.
        let ours = split_node(&grant.handle).is_some_and(|(dir, name)| {
            dir == leases && owner_of(name).map(OwnerId::to_hex).as_deref() == Some(&grant.owner)
        });
        if !ours {
            return Ok(false);
        }
        self.floor
            .delete(op, &grant.handle)
            .await
            .map_err(|e| e.with_key(&key))
    }
}

impl ZkPermitFloor {
    /// Steps 3 to 5, holding the mutex: the lease node's path and token,
    /// or `None` when no permit is free.
    async fn under_mutex(
        &self,
        op: Operation,
        leases: &str,
        owner: OwnerId,
    ) -> Result<Option<(String, u64)>, LockError> {
        let limit = self.limit;
        let stored = self.data(op, leases).await?;
        let agreed = stored
            .as_ref()
            .and_then(|(data, _)| std::str::from_utf8(data).ok()?.trim().parse::<u32>().ok());
        match &stored {
            Some((_, children)) if *children > 0 && agreed.is_some_and(|l| l != limit) => {
                return Err(LockError::new(
                    ErrorKind::InvalidArgument,
                    op,
                    format!(
                        "this semaphore is in use with a limit of {} permits, not {limit}",
                        agreed.unwrap_or_default()
                    ),
                )
                .with_backend(NAME));
            }
            _ if agreed == Some(limit) => {}
            None => {
                self.floor.ensure_dir(leases, op).await?;
                self.set_data(op, leases, limit.to_string().as_bytes())
                    .await?;
            }
            Some(_) => {
                self.set_data(op, leases, limit.to_string().as_bytes())
                    .await?;
            }
        }
        let (lease, czxid, children) = self
            .floor
            .create_listed(
                op,
                leases,
                (&named_prefix(leases, owner, LEASE_NAME), owner),
                SEM_NODE,
            )
            .await?;
        let name = &lease[leases.len() + 1..];
        if !children.iter().any(|c| c == name) {
            return Err(LockError::new(
                ErrorKind::LeaseLost,
                op,
                "the floor's lease node was gone before the list",
            )
            .with_backend(NAME));
        }
        if children.len() > usize::try_from(limit).unwrap_or(usize::MAX) {
            self.floor.delete(op, &lease).await?;
            return Ok(None);
        }
        let token =
            u64::try_from(czxid).map_err(|_| protocol(op, format!("negative czxid {czxid}")))?;
        Ok(Some((lease, token)))
    }
}
