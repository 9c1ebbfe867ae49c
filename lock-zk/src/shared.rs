//! Read-write locks and semaphores, in the layouts of Curator's
//! `InterProcessReadWriteLock` and `InterProcessSemaphoreV2` (see the crate
//! docs for the layout and what each token promises).
//!
//! - **Read-write lock** of key K: `<root>/.rwlock/<escaped K>` holds
//!   `EPHEMERAL_SEQUENTIAL` nodes `_c_<id>-__READ__<seq>` and
//!   `_c_<id>-__WRIT__<seq>`, sorted on the digits after the name. A writer
//!   holds when its node is the first of all; a reader when no write node
//!   comes before it. A waiting writer watches the node just before it, a
//!   waiting reader the first write node (both as Curator does). The
//!   directory's data is the token of the last write grant (the epoch
//!   readers carry).
//! - **Semaphore** of key K: `<root>/.semaphore/<escaped K>/locks` is a
//!   mutex (the mutex recipe), held while acquiring;
//!   `<root>/.semaphore/<escaped K>/leases` holds `_c_<id>-lease-<seq>`
//!   nodes. Holding the mutex, the acquirer creates its lease nodes and
//!   waits (still holding it) until the directory has at most `limit`
//!   children. The `leases` directory's data is the limit our clients use.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    ErrorKind, HolderInfo, Lease, LeaseKind, LockError, LockKey, LockShape, Operation, check_ttl,
    validity_deadline,
};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::config::MIN_TTL;
use crate::connection::{Session, session_gone, synced};
use crate::error::{CallError, NAME, timed, timed_resending};
use crate::grants::GrantParts;
use crate::keys::{self, LEASE_NAME, READ_NAME, WRITE_NAME};
use crate::waiting::{AttemptError, bounded_wait};

// Listing the holders of read-write locks and semaphores.
pub(crate) mod list;
// What the shapes share: lease nodes, pending nodes, the shared create.
mod nodes;
// The read-write lock's attempt.
mod rw;
// The semaphore's attempt.
mod sem;

use list::SharedListing;
use nodes::{LEASES, SharedNodes, error};
use rw::RwLocks;
use sem::Semaphores;

/// Read-write locks and semaphores: acquire, renew, release, downgrade,
/// holders.
#[derive(Clone)]
pub(crate) struct SharedLocks {
    parts: GrantParts,
    rw: RwLocks,
    sem: Semaphores,
    list: SharedListing,
}

impl SharedLocks {
    pub(crate) fn new(parts: GrantParts) -> Self {
        Self {
            rw: RwLocks::new(parts.clone()),
            sem: Semaphores::new(parts.clone()),
            list: SharedListing::new(parts.conn.clone(), parts.expiry.clone()),
            parts,
        }
    }

    /// The connection's session, to act on `lease` with: `NotHeld` when
    /// the session that held it is gone.
    async fn live_session(&self, lease: &Lease, op: Operation) -> Result<Arc<Session>, LockError> {
        let key = lease.key();
        if session_gone(lease) {
            return Err(error(
                ErrorKind::NotHeld,
                op,
                key,
                "the ZooKeeper session that held this lease is gone".to_owned(),
            ));
        }
        self.parts
            .conn
            .session(op)
            .await
            .map_err(|e| e.with_key(key))
    }

    /// The listing of read-write locks and semaphores.
    pub(crate) fn listing(&self) -> &SharedListing {
        &self.list
    }

    /// The holders of `key`'s read-write lock or semaphore.
    pub(crate) async fn holders(
        &self,
        key: &LockKey,
        shape: LockShape,
    ) -> Result<Vec<HolderInfo>, LockError> {
        self.list.shared_holders(key, shape).await
    }

    /// The nodes of a read, write or permit lease. Its data is
    /// `<seq>[,<seq>...];<czxid of the first node>`.
    fn shared_nodes(&self, lease: &Lease) -> Option<SharedNodes> {
        let root = self.parts.conn.config().root();
        let (seqs, czxid) = lease.backend_data().split_once(';')?;
        let czxid: i64 = czxid.parse().ok()?;
        let seqs: Vec<u32> = seqs
            .split(',')
            .map(|s| {
                if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                    None
                } else {
                    s.parse().ok()
                }
            })
            .collect::<Option<_>>()?;
        let (dir, name) = match lease.kind() {
            LeaseKind::Read => (keys::rw_dir(root, lease.key()), READ_NAME),
            LeaseKind::Write => (keys::rw_dir(root, lease.key()), WRITE_NAME),
            LeaseKind::Permits { count, .. } => {
                if usize::try_from(count).ok()? != seqs.len() {
                    return None;
                }
                (
                    format!("{}/{LEASES}", keys::sem_dir(root, lease.key())),
                    LEASE_NAME,
                )
            }
            _ => return None,
        };
        if seqs.is_empty() || (lease.kind().shape() == LockShape::ReadWrite && seqs.len() != 1) {
            return None;
        }
        let paths = seqs
            .iter()
            .map(|seq| keys::named_node_path(&dir, lease.owner(), name, *seq))
            .collect();
        Some(SharedNodes { dir, paths, czxid })
    }

    /// `try_acquire_kind` / `acquire_kind` for read, write and permit
    /// grants: attempts on the live session, retried on a new one as the
    /// mutex's are.
    pub(crate) async fn acquire_shared(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Option<Instant>,
        operation: Operation,
    ) -> Result<Option<Lease>, LockError> {
        kind.validate(operation)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        check_ttl(ttl, MIN_TTL, operation).map_err(|e| e.with_key(key).with_backend(NAME))?;
        let root = self.parts.conn.config().root();
        self.parts
            .waiting
            .retry_attempts(
                key,
                deadline,
                operation,
                "shared acquire attempt",
                move |session| async move {
                    match kind {
                        LeaseKind::Read | LeaseKind::Write => {
                            let dir = keys::rw_dir(root, key);
                            self.rw
                                .rw_attempt(&session, key, &dir, kind, ttl, deadline, operation)
                                .await
                        }
                        LeaseKind::Permits { count, limit } => {
                            let base = keys::sem_dir(root, key);
                            self.sem
                                .sem_attempt(
                                    &session,
                                    key,
                                    &base,
                                    (count, limit),
                                    ttl,
                                    deadline,
                                    operation,
                                )
                                .await
                        }
                        _ => Err(AttemptError::Lock(error(
                            ErrorKind::InvalidArgument,
                            operation,
                            key,
                            format!("{kind} is not a shared kind"),
                        ))),
                    }
                },
            )
            .await
    }

    /// `acquire_kind` for shared kinds: bounded past the deadline like the
    /// mutex's `acquire`, `Contended` at the deadline.
    pub(crate) async fn acquire_shared_until(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let attempt = self.acquire_shared(key, kind, ttl, Some(deadline), Operation::Acquire);
        let why = "still held by another owner at the wait deadline";
        bounded_wait(key, deadline, ("wait deadline", why), attempt).await
    }

    /// `renew` of a read, write or permit lease: its nodes still exist
    /// (from the leader's view), with the grant's `czxid`, on this
    /// backend's session, and its TTL has not run out.
    pub(crate) async fn renew_shared(&self, lease: &Lease) -> Result<Instant, LockError> {
        let op = Operation::Renew;
        let key = lease.key();
        let not_held = |why: &str| error(ErrorKind::NotHeld, op, key, why.to_owned());
        let Some(nodes) = self.shared_nodes(lease) else {
            return Err(not_held(
                "the lease does not name nodes of its key and owner",
            ));
        };
        let session = self.live_session(lease, op).await?;
        let sent = Instant::now();
        let ours = lease
            .session()
            .is_some_and(|s| s.same_channel(&session.state));
        let clock = self.parts.expiry.clock();
        if ours
            && !self
                .parts
                .expiry
                .shared()
                .tracked(lease.owner(), |t| !clock.passed(t.due, sent))
                .unwrap_or(false)
        {
            return Err(not_held(
                "the lease's TTL ran out before this renewal; its nodes are deleted",
            ));
        }
        let client = &session.client;
        let read = async {
            let calls: Vec<_> = nodes.paths.iter().map(|p| client.check_stat(p)).collect();
            let mut stats = Vec::with_capacity(calls.len());
            for call in calls {
                stats.push(call.await?);
            }
            Ok::<_, zk::Error>(stats)
        };
        let stats = synced(client.sync(&nodes.dir), self.parts.conn.op_timeout(), read)
            .await
            .map_err(|err| err.into_lock_error(op).with_key(key))?;
        if stats.iter().any(Option::is_none) {
            self.parts.expiry.shared().forget(lease.owner());
            return Err(not_held(
                "the lease's node is gone (released, expired, or deleted)",
            ));
        }
        let stats: Vec<zk::Stat> = stats.into_iter().flatten().collect();
        if stats[0].czxid != nodes.czxid {
            return Err(not_held("the lease's node was re-created: not this grant"));
        }
        if stats.iter().any(|s| s.ephemeral_owner != session.id) {
            return Err(error(
                ErrorKind::Unsupported,
                op,
                key,
                "the lease's nodes belong to another ZooKeeper session: they live as long as \
                 that session and can be released, but not renewed, from here",
            ));
        }
        let ttl = lease.ttl().min(session.timeout);
        let extended = self
            .parts
            .expiry
            .shared()
            .tracked(lease.owner(), |t| {
                if clock.passed(t.due, sent) {
                    return false;
                }
                if clock.passed(t.due, sent + ttl) {
                    t.due = clock.deadline(sent + ttl);
                }
                true
            })
            .unwrap_or(false);
        if !extended {
            return Err(not_held(
                "the lease's TTL ran out before this renewal; its nodes are deleted",
            ));
        }
        Ok(validity_deadline(sent, ttl))
    }

    /// `release` of a read, write or permit lease: deletes its nodes.
    pub(crate) async fn release_shared(&self, lease: &Lease) -> Result<bool, LockError> {
        let op = Operation::Release;
        let Some(nodes) = self.shared_nodes(lease) else {
            return Ok(false);
        };
        let session = self
            .parts
            .conn
            .session(op)
            .await
            .map_err(|e| e.with_key(lease.key()))?;
        let calls: Vec<_> = nodes
            .paths
            .iter()
            .map(|p| {
                timed_resending(self.parts.conn.op_timeout(), || {
                    session.client.delete(p, None)
                })
            })
            .collect();
        let mut deleted = false;
        let mut failure = None;
        for call in calls {
            match call.await {
                Ok(()) => deleted = true,
                Err(err) if err.is(&zk::Error::NoNode) => {}
                Err(err) => failure = Some(err),
            }
        }
        if let Some(err) = failure {
            // The local expiry stays armed: it deletes the rest later.
            return Err(err.into_lock_error(op).with_key(lease.key()));
        }
        self.parts.expiry.shared().forget(lease.owner());
        self.parts
            .cleanup
            .remove_empty_dir(&session.client, &nodes.dir)
            .await;
        Ok(deleted)
    }

    /// `downgrade`: one transaction creates a read node named with the
    /// write node's sequence number (so it sorts where the write node was,
    /// before every waiter, as Curator 5.5+ names a read lock taken by the
    /// write lock's owner) and deletes the write node. No writer can come
    /// between: the read node exists before the write node goes.
    pub(crate) async fn downgrade_write(&self, lease: &Lease) -> Result<Lease, LockError> {
        let op = Operation::Downgrade;
        let key = lease.key();
        let not_held = |why: &str| error(ErrorKind::NotHeld, op, key, why.to_owned());
        if lease.kind() != LeaseKind::Write {
            return Err(not_held("only a write lease can be downgraded"));
        }
        let Some(nodes) = self.shared_nodes(lease) else {
            return Err(not_held("the lease does not name a write node of its key"));
        };
        let session = self.live_session(lease, op).await?;
        if !lease
            .session()
            .is_some_and(|s| s.same_channel(&session.state))
        {
            return Err(not_held(
                "the write lease is not of this backend's current session",
            ));
        }
        let sent = Instant::now();
        let clock = self.parts.expiry.clock();
        if !self
            .parts
            .expiry
            .shared()
            .tracked(lease.owner(), |t| !clock.passed(t.due, sent))
            .unwrap_or(false)
        {
            return Err(not_held("the write lease's TTL ran out"));
        }
        let write_path = &nodes.paths[0];
        let seq = lease
            .backend_data()
            .split_once(';')
            .and_then(|(s, _)| s.parse::<u32>().ok())
            .ok_or_else(|| not_held("bad lease data"))?;
        let owner = self.parts.expiry.next_owner();
        let read_path = keys::named_node_path(&nodes.dir, owner, READ_NAME, seq);
        let ttl = lease.ttl().min(session.timeout);
        // Tracked before the transaction is sent: if its outcome is
        // unknown, the read node is still deleted at its TTL.
        self.parts
            .expiry
            .schedule_shared(owner, vec![read_path.clone()], sent + ttl);
        let options = zk::CreateMode::Ephemeral.with_acls(self.parts.conn.acls());
        let mut writer = session.client.new_multi_writer();
        let data = keys::mutex_node_data(owner);
        let added = writer
            .add_create(&read_path, data.as_bytes(), &options)
            .and_then(|()| writer.add_delete(write_path, None));
        if let Err(err) = added {
            self.parts.expiry.shared().forget(owner);
            return Err(CallError::Zk(err).into_lock_error(op).with_key(key));
        }
        let timeout = self.parts.conn.op_timeout();
        let results = match tokio::time::timeout(timeout, writer.commit()).await {
            Err(_) => {
                return Err(CallError::TimedOut(timeout)
                    .into_lock_error(op)
                    .with_key(key));
            }
            Ok(Err(zk::MultiWriteError::OperationFailed {
                source: zk::Error::NoNode,
                ..
            })) => {
                self.parts.expiry.shared().forget(owner);
                return Err(not_held("the write node is gone"));
            }
            Ok(Err(err)) => {
                let err = CallError::Zk(zk::Error::from(err));
                if !err.outcome_unknown() {
                    self.parts.expiry.shared().forget(owner);
                }
                return Err(err.into_lock_error(op).with_key(key));
            }
            Ok(Ok(results)) => results,
        };
        drop(results);
        self.parts.expiry.shared().forget(lease.owner());
        // A multi's create answers without a stat: read the node's czxid
        // (renewals confirm it).
        let czxid = match timed(timeout, session.client.check_stat(&read_path)).await {
            Ok(Some(stat)) => stat.czxid,
            Ok(None) => {
                self.parts.expiry.shared().forget(owner);
                return Err(not_held("the read node vanished right after the downgrade"));
            }
            Err(err) => return Err(err.into_lock_error(op).with_key(key)),
        };
        let read = Lease::granted(
            key.clone(),
            owner,
            lease.token(),
            ttl,
            sent,
            format!("{seq};{czxid}"),
        )
        .map_err(|e| e.with_backend(NAME))?
        .with_kind(LeaseKind::Read)
        .with_session(session.state.clone());
        Ok(read)
    }
}

#[async_trait]
impl lock_core::Downgrade for SharedLocks {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.downgrade_write(lease).await
    }
}
