//! Writes guarded by the store: data kept in the same etcd as the lock is
//! written in a transaction that also compares the lock's entry, as Go's
//! `concurrency.Mutex.IsOwner()` does, so the write and the ownership
//! check are one atomic step and the data needs no fencing token.
//!
//! The compares: the lease's entry still has the create revision it was
//! granted with (the lease's token; a deleted entry, or one created again
//! under the same name, has another, or none) and still holds the lease's
//! owner id in its value (the compares of the release's guarded delete).
//! A granted entry is the oldest under its key's prefix, and stays so while
//! it exists (later entries get later revisions), so "the entry exists,
//! unchanged" is "the lease holds the key" in etcd's own order of events.

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnResponse};
use lock_core::{ErrorKind, Lease, LeaseKind, LockError, Operation};

use crate::connection::Connection;
use crate::error::NAME;
use crate::grants::Grants;
use crate::keys::owner_compares;

/// What a guarded transaction
/// ([`EtcdBackend::guarded_txn`](crate::EtcdBackend::guarded_txn)) came to.
#[derive(Debug, Clone)]
pub enum EtcdGuardedOutcome {
    /// The lease held its lock at the commit: the operations ran, in the
    /// same revision as the check; their responses are in the
    /// transaction's answer.
    Written(TxnResponse),
    /// The lease no longer held its lock (released, taken over, expired):
    /// none of the operations ran.
    Refused,
}

impl EtcdGuardedOutcome {
    /// Whether the operations ran.
    pub fn is_written(&self) -> bool {
        matches!(self, Self::Written(_))
    }
}

/// The ownership compares of leases, and transactions guarded by them.
#[derive(Clone, Debug)]
pub(crate) struct Guarded {
    conn: Arc<Connection>,
    grants: Grants,
}

/// The operation every error of a guarded write reports: lock-core has
/// none of its own for it, and its first step reads who holds the key.
const OP: Operation = Operation::GuardedWrite;

impl Guarded {
    pub(crate) fn new(conn: Arc<Connection>, grants: Grants) -> Self {
        Self { conn, grants }
    }

    /// See [`EtcdBackend::owner_compares`](crate::EtcdBackend::owner_compares).
    pub(crate) async fn owner_compares(&self, lease: &Lease) -> Result<Vec<Compare>, LockError> {
        if lease.kind() != LeaseKind::Exclusive {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                OP,
                format!(
                    "a guarded write needs an exclusive lease (a mutex or an election's \
                     leadership), not a {} lease",
                    lease.kind()
                ),
            )
            .with_key(lease.key())
            .with_backend(NAME));
        }
        let Some((entry, revision, _)) = self.grants.resolve_lease(lease, OP).await? else {
            // No entry under the key was created at the lease's token (only
            // for a lease whose entry is named by a read: see
            // `resolve_lease`), and none can be later (revisions only
            // grow): a compare that fails for good, so that the caller's
            // transaction takes its `else` branch as for any lost lease.
            let key_prefix = self.conn.key_prefix(lease.key());
            let revision = i64::try_from(lease.token().get()).unwrap_or(i64::MAX);
            return Ok(vec![Compare::create_revision(
                key_prefix,
                CompareOp::Equal,
                revision,
            )]);
        };
        let mut compares = vec![Compare::create_revision(
            entry.as_str(),
            CompareOp::Equal,
            revision,
        )];
        compares.extend(owner_compares(&entry, lease.owner()));
        Ok(compares)
    }

    /// See [`EtcdBackend::guarded_txn`](crate::EtcdBackend::guarded_txn).
    pub(crate) async fn guarded_txn(
        &self,
        lease: &Lease,
        operations: Vec<TxnOp>,
    ) -> Result<EtcdGuardedOutcome, LockError> {
        let compares = self.owner_compares(lease).await?;
        let txn = Txn::new().when(compares).and_then(operations);
        let response = self
            .conn
            .txn(OP, txn)
            .await
            .map_err(|e| e.with_key(lease.key()))?;
        Ok(if response.succeeded() {
            EtcdGuardedOutcome::Written(response)
        } else {
            EtcdGuardedOutcome::Refused
        })
    }
}
