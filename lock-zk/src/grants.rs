//! The mutex's grants: a single try, a waiting grant (both through the
//! key's queue, `waiting.rs`), the release, and who holds a key.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{ErrorKind, FencingToken, Lease, LockError, LockInfo, LockKey, Operation, OwnerId};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::cleanup::Cleanup;
use crate::connection::{Connection, Session};
use crate::error::{CallError, NAME, timed, timed_resending};
use crate::expiry::Expiry;
use crate::keys::{self, kazoo_owner_of, owner_of};
use crate::waiting::{self, Waiting};

/// How many times a look-up starts over when the holder it found went away
/// before it could be read.
pub(crate) const LOOKS: usize = 5;

/// The holder a look-up found: its node's path and what `inspect` reports.
pub(crate) struct Found {
    pub(crate) path: String,
    pub(crate) info: LockInfo,
}

/// What the grants of every recipe (the mutex, the read-write lock, the
/// semaphore) run on: the connection, the expiry and cleanup services and
/// the key queues.
#[derive(Clone)]
pub(crate) struct GrantParts {
    pub(crate) conn: Arc<Connection>,
    pub(crate) expiry: Expiry,
    pub(crate) cleanup: Cleanup,
    pub(crate) waiting: Waiting,
}

/// The mutex: grants, release, holder look-ups.
#[derive(Clone)]
pub(crate) struct Grants {
    parts: GrantParts,
}

impl Grants {
    pub(crate) fn new(parts: GrantParts) -> Self {
        Self { parts }
    }

    /// Tries once to take the mutex `key`.
    pub(crate) async fn try_take(
        &self,
        key: &LockKey,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        // Boxed (see `take_waiting`).
        Box::pin(
            self.parts
                .waiting
                .lock_key(key, ttl, None, Operation::TryAcquire),
        )
        .await
    }

    /// Takes the mutex `key`, waiting until `deadline`.
    pub(crate) async fn take_waiting(
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
            Box::pin(
                self.parts
                    .waiting
                    .lock_key(key, ttl, Some(deadline), Operation::Acquire),
            ),
        )
        .await
    }

    /// Releases the mutex lease `lease`: deletes its node.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        // A lease whose node does not carry its owner id is not ours to act
        // on: another owner's node is never touched.
        let Some(node) = keys::lease_node(self.parts.conn.config(), lease) else {
            return Ok(false);
        };
        let (path, dir) = (node.path(), node.dir());
        let session = self
            .parts
            .conn
            .session(Operation::Release)
            .await
            .map_err(|e| e.with_key(lease.key()))?;
        let deleted = match timed_resending(self.parts.conn.op_timeout(), || {
            session.client.delete(path, None)
        })
        .await
        {
            Ok(()) => true,
            Err(err) if err.is(&zk::Error::NoNode) => false,
            Err(err) => {
                // The local expiry stays armed: it deletes the node later.
                return Err(err
                    .into_lock_error(Operation::Release)
                    .with_key(lease.key()));
            }
        };
        self.parts.expiry.nodes().forget(lease.owner());
        self.parts
            .cleanup
            .sweep_uncertain(&session.client, dir, lease.owner(), false)
            .await;
        self.parts
            .cleanup
            .remove_empty_dir(&session.client, dir)
            .await;
        Ok(deleted)
    }

    /// Who holds the mutex `key`, as of the leader's last commit.
    pub(crate) async fn inspect_mutex(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let session = self
            .parts
            .conn
            .session(Operation::Inspect)
            .await
            .map_err(|e| e.with_key(key))?;
        let dir = self.parts.conn.checked_key_path(key, Operation::Inspect)?;
        // A `sync` first, queued before the reads (the client sends a
        // request when the call is made, the server answers a session's
        // requests in order): a follower otherwise answers from before
        // another client's release or grant that the leader has already
        // committed, and an operator reads a lock freed a moment ago as
        // held. Then one list and one `getData` (the holder details are the
        // node's data, read with its `czxid`).
        let sync = timed(self.parts.conn.op_timeout(), session.client.sync(&dir));
        let (synced, found) = tokio::join!(
            sync,
            self.holder_in(&session, key, &dir, Operation::Inspect)
        );
        match synced {
            Ok(()) | Err(CallError::Zk(zk::Error::NoNode)) => {}
            Err(err) => return Err(err.into_lock_error(Operation::Inspect).with_key(key)),
        }
        Ok(found?.map(|found| found.info))
    }

    /// The holder of `key`'s mutex directory `dir`: the lowest contender,
    /// its `czxid` and its data (the holder details) read with one
    /// `getData`. `None` when nobody holds.
    pub(crate) async fn holder_in(
        &self,
        session: &Session,
        key: &LockKey,
        dir: &str,
        operation: Operation,
    ) -> Result<Option<Found>, LockError> {
        let fail = |err: CallError| err.into_lock_error(operation).with_key(key);
        // The holder may release between the list and the read: look again.
        for _ in 0..LOOKS {
            let children = match timed(
                self.parts.conn.op_timeout(),
                session.client.list_children(dir),
            )
            .await
            {
                Ok(children) => children,
                Err(err) if err.is(&zk::Error::NoNode) => return Ok(None),
                Err(err) => return Err(fail(err)),
            };
            let Some((seq, name)) = keys::sorted_mutex_contenders(children).into_iter().next()
            else {
                return Ok(None);
            };
            let path = format!("{dir}/{name}");
            match timed(self.parts.conn.op_timeout(), session.client.get_data(&path)).await {
                Ok((data, stat)) => {
                    let info = self.holder_info(key, seq, name, &data, &stat);
                    return Ok(Some(Found { path, info }));
                }
                Err(err) if err.is(&zk::Error::NoNode) => continue,
                Err(err) => return Err(fail(err)),
            }
        }
        Err(LockError::new(
            ErrorKind::Unavailable,
            operation,
            "the holder kept changing while we looked",
        )
        .with_key(key)
        .with_backend(NAME))
    }

    /// What `inspect` reports of the contender `name` (sequence `seq`)
    /// with data `data` and stat `stat`.
    pub(crate) fn holder_info(
        &self,
        key: &LockKey,
        seq: i64,
        name: String,
        data: &[u8],
        stat: &zk::Stat,
    ) -> LockInfo {
        // The holder may be a kazoo lock: its node name is the holder, or
        // with `nodes=kazoo` (where ours have kazoo's names too) the 32-hex
        // id in it, as for ours.
        let owner = match self.parts.conn.config().node_names() {
            crate::ZkNodeNames::Curator => owner_of(&name),
            crate::ZkNodeNames::Kazoo => owner_of(&name).or_else(|| kazoo_owner_of(&name)),
        };
        let seq = u32::try_from(seq).ok();
        let remaining_ttl = owner.and_then(|owner| self.parts.expiry.remaining(owner, seq));
        LockInfo {
            details: keys::details_of_data(data),
            key: key.clone(),
            holder: owner.map_or(name, OwnerId::to_hex),
            token: u64::try_from(stat.czxid).ok().map(FencingToken::new),
            remaining_ttl,
        }
    }
}
