//! Writes guarded by the store: data kept in the same ZooKeeper ensemble
//! as the lock is written in a `multi` whose first operation checks that
//! the lease's lock node still exists, so the write and the ownership
//! check are one atomic transaction and the data needs no fencing token.
//!
//! Why a node's existence is ownership: a mutex lease is granted when its
//! ephemeral sequential node is the lowest of its key's directory, and it
//! stays the lowest while it exists (later nodes get higher sequence
//! numbers). The node goes when the lease is released, when the backend
//! lets its TTL run out unrenewed, when its session expires, and when an
//! operator deletes it (`force_release`); a later grant of the key is
//! another node, whose name carries another owner id. So "the node exists"
//! is "the lease holds the key", in the ensemble's own order of writes. A
//! `multi` is a write: the leader orders it, so a follower that lags (or
//! is cut off from the leader) cannot answer the check from a stale copy.

use std::sync::Arc;

use lock_core::{ErrorKind, Lease, LeaseKind, LockError, LockKey, Operation};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::connection::{Connection, session_gone};
use crate::error::{CallError, NAME};
use crate::expiry::Expiry;
use crate::keys::{self, LATCH_DATA};

/// The operation errors of a guarded write report: lock-core has none of
/// its own for it, and its check reads whether the lease holds its key.
const OP: Operation = Operation::GuardedWrite;

/// What a guarded `multi`
/// ([`ZkBackend::guarded_multi`](crate::ZkBackend::guarded_multi)) came to.
#[derive(Debug, PartialEq, Eq)]
pub enum ZkGuardedOutcome {
    /// The lease held its lock when the ensemble applied the `multi`:
    /// every operation was applied, in the same transaction as the check.
    /// Their results, in the order they were added (the check's own
    /// result left out).
    Written(Vec<zk::MultiWriteResult>),
    /// The lease did not hold its lock (released, its TTL run out, its
    /// session expired, or taken from it): nothing was applied.
    Refused,
    /// The lease held its lock, but one of the caller's own operations
    /// failed (a version check, a create of a node that exists, ...):
    /// nothing was applied.
    OperationFailed {
        /// The failed operation, counting the caller's operations from 0.
        index: usize,
        /// What ZooKeeper answered for it.
        error: zk::Error,
    },
}

impl ZkGuardedOutcome {
    /// Whether the operations were applied.
    pub fn is_written(&self) -> bool {
        matches!(self, Self::Written(_))
    }

    /// Whether the write was refused because the lease did not hold its
    /// lock.
    pub fn is_refused(&self) -> bool {
        matches!(self, Self::Refused)
    }
}

/// The ownership check of one mutex lease, to add to a `multi` of any
/// ZooKeeper session: a check operation on the lease's lock node, which
/// fails (and fails the whole `multi`) once the node is gone. Made by
/// [`ZkBackend::owner_check`](crate::ZkBackend::owner_check).
///
/// The session that commits the `multi` need not be the one that holds the
/// lock (ZooKeeper accepts a check on any node), but it must see the same
/// paths and be allowed to read the node:
///
/// - its client is rooted at the backend's chroot ([`ZkConfig::chroot`](crate::ZkConfig::chroot):
///   connect to `host:port/chroot`), or prefixes [`path`](Self::path)
///   with it itself;
/// - with digest authentication on, lock nodes are readable by their
///   creator's identity only: the session authenticates as the same user.
///
/// The check sees the node only: a lease whose TTL has run out on its
/// holder's side passes it until the holder's backend has deleted the
/// node (a few milliseconds later when that backend is alive; when its
/// process died, until its session expires). Nobody else can hold the key
/// meanwhile. [`ZkBackend::guarded_multi`](crate::ZkBackend::guarded_multi)
/// also refuses such a lease before sending anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZkOwnerCheck {
    key: LockKey,
    path: String,
}

impl ZkOwnerCheck {
    /// The key of the lease.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The lease's lock node, inside the backend's chroot.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// A [`zk::CheckWriter`] on `client` whose first operation is this
    /// check: add the guarded operations to it and commit; tell a refusal
    /// with [`refused`](Self::refused).
    ///
    /// # Errors
    ///
    /// The client's, for a path it rejects (e.g. a chroot it cannot
    /// apply).
    pub fn check_writer<'a>(
        &self,
        client: &'a zk::Client,
    ) -> Result<zk::CheckWriter<'a>, zk::Error> {
        client.new_check_writer(&self.path, None)
    }

    /// Adds this check to `writer` (a `multi` the caller builds itself).
    /// Add it first: ZooKeeper reports the first operation that fails, so
    /// a check after an operation that fails is never reported. Tell a
    /// refusal with [`refused_at`](Self::refused_at) and the index the
    /// check was added at.
    ///
    /// # Errors
    ///
    /// As [`check_writer`](Self::check_writer).
    pub fn add_to(&self, writer: &mut zk::MultiWriter<'_>) -> Result<(), zk::Error> {
        writer.add_check_version(&self.path, -1)
    }

    /// Whether a [`zk::CheckWriter`]'s commit (from
    /// [`check_writer`](Self::check_writer)) failed because the lease did
    /// not hold its lock: its node was gone. Nothing was applied then.
    pub fn refused(error: &zk::CheckWriteError) -> bool {
        matches!(
            error,
            zk::CheckWriteError::CheckFailed {
                source: zk::Error::NoNode
            }
        )
    }

    /// Whether a [`zk::MultiWriter`]'s commit failed because the lease did
    /// not hold its lock, this check being the operation at `index` (see
    /// [`add_to`](Self::add_to)). Nothing was applied then.
    pub fn refused_at(error: &zk::MultiWriteError, index: usize) -> bool {
        matches!(
            error,
            zk::MultiWriteError::OperationFailed { index: failed, source: zk::Error::NoNode }
                if *failed == index
        )
    }
}

/// The ownership checks of leases, and `multi`s guarded by them on the
/// backend's own session.
#[derive(Clone)]
pub(crate) struct Guarded {
    conn: Arc<Connection>,
    expiry: Expiry,
}

impl Guarded {
    pub(crate) fn new(conn: Arc<Connection>, expiry: Expiry) -> Self {
        Self { conn, expiry }
    }

    /// See [`ZkBackend::owner_check`](crate::ZkBackend::owner_check).
    pub(crate) fn owner_check(&self, lease: &Lease) -> Result<ZkOwnerCheck, LockError> {
        Ok(ZkOwnerCheck {
            key: lease.key().clone(),
            path: self.node(lease)?.0,
        })
    }

    /// The lease's lock node (path, sequence), or why it has none that
    /// proves ownership.
    fn node(&self, lease: &Lease) -> Result<(String, u32), LockError> {
        let unsupported = |why: String| {
            Err(
                LockError::new(ErrorKind::Unsupported, Operation::Validate, why)
                    .with_key(lease.key())
                    .with_backend(NAME),
            )
        };
        if lease.kind() != LeaseKind::Exclusive {
            return unsupported(format!(
                "a guarded write needs a mutex lease, not a {} lease",
                lease.kind()
            ));
        }
        if lease.backend_data().starts_with(LATCH_DATA) {
            return unsupported(
                "a guarded write needs a mutex lease, not an election's leadership".to_owned(),
            );
        }
        match keys::lease_node(self.conn.config(), lease) {
            Some(node) => Ok((node.path, node.seq)),
            None => Err(LockError::invalid_argument(
                Operation::Validate,
                "the lease does not name a lock node of its key and owner under this \
                 backend's root (a lease of another backend or configuration)",
            )
            .with_key(lease.key())
            .with_backend(NAME)),
        }
    }

    /// See [`ZkBackend::guarded_multi`](crate::ZkBackend::guarded_multi).
    pub(crate) async fn guarded_multi<F>(
        &self,
        lease: &Lease,
        build: F,
    ) -> Result<ZkGuardedOutcome, LockError>
    where
        F: FnOnce(&mut zk::CheckWriter<'_>) -> Result<(), zk::Error>,
    {
        let (path, seq) = self.node(lease)?;
        // Already known lost here: its node is gone with its session, or
        // its TTL ran out unrenewed and the expiry task is deleting it.
        if session_gone(lease) {
            return Ok(ZkGuardedOutcome::Refused);
        }
        let session = self
            .conn
            .session(OP)
            .await
            .map_err(|e| e.with_key(lease.key()))?;
        let ours = lease
            .session()
            .is_some_and(|s| s.same_channel(&session.state));
        if ours && !self.expiry.tracked_until(lease, seq, Instant::now()) {
            return Ok(ZkGuardedOutcome::Refused);
        }
        let client_error =
            |err: zk::Error| CallError::Zk(err).into_lock_error(OP).with_key(lease.key());
        let mut writer = session
            .client
            .new_check_writer(&path, None)
            .map_err(client_error)?;
        build(&mut writer).map_err(client_error)?;
        // Not resent after a lost connection: the multi may have been
        // applied, and a second copy could apply it again.
        let timeout = self.conn.op_timeout();
        match tokio::time::timeout(timeout, writer.commit()).await {
            Err(_) => Err(CallError::TimedOut(timeout)
                .into_lock_error(OP)
                .with_key(lease.key())),
            Ok(Ok(results)) => Ok(ZkGuardedOutcome::Written(results)),
            Ok(Err(zk::CheckWriteError::CheckFailed {
                source: zk::Error::NoNode,
            })) => Ok(ZkGuardedOutcome::Refused),
            Ok(Err(zk::CheckWriteError::OperationFailed { index, source })) => {
                Ok(ZkGuardedOutcome::OperationFailed {
                    index,
                    error: source,
                })
            }
            Ok(Err(
                zk::CheckWriteError::CheckFailed { source }
                | zk::CheckWriteError::RequestFailed { source },
            )) => Err(client_error(source)),
        }
    }
}
