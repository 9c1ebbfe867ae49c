//! `renew_many`: the leases of this backend's own session renewed with one
//! request per batch, not one per lock. A lock node is ephemeral: it lives
//! as long as the session, whose heartbeat the client sends anyway; what a
//! renewal must confirm is that the node still exists from the leader's
//! view. One `multi` of existence checks does that for the whole batch (a
//! multi is a write transaction, ordered by the leader, so a follower cut
//! off from it cannot answer it from a stale copy). When a check fails, the
//! multi names the first failing node: that lease is not held, the ones
//! before it were confirmed by the same transaction, and the rest are
//! checked again in another multi.
//!
//! Cost: a multi is a transaction, so every batch is one entry in the
//! ensemble's transaction log (about 100 kB per 1,000 checks, each renewal
//! period) and one zxid. The read-only alternative, a `sync` followed by
//! one pipelined existence check per node, was measured on
//! `tests/held_at_scale.rs`: 9.7 proxy round trips per period at 1,000
//! locks (multi: 3.0) and 44.7 at 10,000 (multi: 3.3; the bound is 22.7),
//! with 1,000 requests in flight per batch raising the client's heap from
//! 433 to 658 B per held lock at 10,000. The multi stays.
//!
//! Leases of other sessions (rebuilt from handles) go through `renew_one`.

use std::sync::Arc;

use lock_core::{ErrorKind, Lease, LockError, Operation, validity_deadline};
use tokio::time::Instant;
use zookeeper_client as zk;

use super::session::session_gone;
use super::{NodeRef, Session, ZkBackend};
use crate::error::{CallError, NAME};

/// The most checks in one multi.
const MAX_CHECKS: usize = 1_000;

impl ZkBackend {
    pub(super) async fn renew_batch(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        let op = Operation::Renew;
        let mut results: Vec<Option<Result<Instant, LockError>>> =
            std::iter::repeat_with(|| None).take(leases.len()).collect();
        let session: Arc<Session> = match self.session(op).await {
            Ok(session) => session,
            Err(err) => {
                return leases
                    .iter()
                    .map(|l| Err(copy(&err).with_key(l.key())))
                    .collect();
            }
        };
        let sent = Instant::now();
        // (index, path) of the leases this batch checks.
        let mut batch: Vec<(usize, NodeRef)> = Vec::with_capacity(leases.len());
        for (index, lease) in leases.iter().enumerate() {
            if lease.kind() != lock_core::LeaseKind::Exclusive {
                // Read, write and permit leases: one at a time.
                results[index] = Some(self.renew_shared(lease).await);
                continue;
            }
            let ours = lease
                .session()
                .is_some_and(|s| s.same_channel(&session.state));
            let Some(node) = self.lease_path(lease).filter(|_| ours) else {
                // Not of this session (or not a node of ours): `renew_one` says why.
                results[index] = Some(self.renew_one(lease).await);
                continue;
            };
            if session_gone(lease) {
                results[index] = Some(Err(not_held(
                    lease,
                    "the ZooKeeper session that held this lease is gone",
                )));
                continue;
            }
            // A lease this backend already gave up on is not revived.
            if !self.tracked_until(lease, node.seq, sent) {
                results[index] = Some(Err(not_held(
                    lease,
                    "the lease's TTL ran out before this renewal; its node is deleted",
                )));
                continue;
            }
            batch.push((index, node));
        }
        for chunk in batch.chunks(MAX_CHECKS) {
            let mut pending: &[(usize, NodeRef)] = chunk;
            while !pending.is_empty() {
                match self.check_all(&session.client, pending).await {
                    Ok(()) => {
                        for (index, node) in pending {
                            results[*index] =
                                Some(self.confirmed(leases[*index], node, &session, sent));
                        }
                        pending = &[];
                    }
                    Err(Failed::At(failed, zk::Error::NoNode)) => {
                        for (index, node) in &pending[..failed] {
                            results[*index] =
                                Some(self.confirmed(leases[*index], node, &session, sent));
                        }
                        let (index, _) = &pending[failed];
                        self.forget_expiry(leases[*index].owner());
                        results[*index] = Some(Err(not_held(
                            leases[*index],
                            "the lock node is gone (released, expired, or deleted)",
                        )));
                        pending = &pending[failed + 1..];
                    }
                    Err(failure) => {
                        let err = failure.into_lock_error();
                        for (index, _) in pending {
                            results[*index] = Some(Err(copy(&err).with_key(leases[*index].key())));
                        }
                        pending = &[];
                    }
                }
            }
        }
        lock_core::results_in_order(results, NAME)
    }

    /// One multi of existence checks for `pending`.
    async fn check_all(
        &self,
        client: &zk::Client,
        pending: &[(usize, NodeRef)],
    ) -> Result<(), Failed> {
        let mut writer = client.new_multi_writer();
        for (_, node) in pending {
            writer
                .add_check_version(node.path(), -1)
                .map_err(|e| Failed::Call(CallError::Zk(e)))?;
        }
        let timeout = self.op_timeout();
        match tokio::time::timeout(timeout, writer.commit()).await {
            Err(_) => Err(Failed::Call(CallError::TimedOut(timeout))),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(zk::MultiWriteError::OperationFailed { index, source }))
                if index < pending.len() =>
            {
                Err(Failed::At(index, source))
            }
            Ok(Err(err)) => Err(Failed::Call(CallError::Zk(zk::Error::from(err)))),
        }
    }

    /// A confirmed check: the new validity deadline, unless the node's TTL
    /// ran out while the check was in flight (the expiry task took it).
    fn confirmed(
        &self,
        lease: &Lease,
        node: &NodeRef,
        session: &Session,
        sent: Instant,
    ) -> Result<Instant, LockError> {
        let ttl = lease.ttl().min(session.timeout);
        if self.extend(lease, node.seq, sent, ttl) {
            Ok(validity_deadline(sent, ttl))
        } else {
            Err(not_held(
                lease,
                "the lease's TTL ran out before this renewal; its node is deleted",
            ))
        }
    }
}

enum Failed {
    At(usize, zk::Error),
    Call(CallError),
}

impl Failed {
    fn into_lock_error(self) -> LockError {
        match self {
            Self::At(_, err) => CallError::Zk(err).into_lock_error(Operation::Renew),
            Self::Call(err) => err.into_lock_error(Operation::Renew),
        }
    }
}

fn not_held(lease: &Lease, why: &str) -> LockError {
    LockError::new(ErrorKind::NotHeld, Operation::Renew, why.to_owned())
        .with_key(lease.key())
        .with_backend(NAME)
}

fn copy(err: &LockError) -> LockError {
    LockError::new(err.kind(), Operation::Renew, err.to_string()).with_backend(NAME)
}
