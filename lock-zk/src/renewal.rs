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

use lock_core::{
    ErrorKind, Lease, LeaseKind, LockError, Operation, SessionState, validity_deadline,
};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::connection::{Connection, Session, session_gone, synced};
use crate::error::{CallError, NAME};
use crate::expiry::Expiry;
use crate::keys::{self, NodeRef};
use crate::shared::SharedLocks;

/// The most checks in one multi.
const MAX_CHECKS: usize = 1_000;

/// Renewals: one multi of existence checks per batch of mutex leases,
/// read, write and permit leases one at a time.
#[derive(Clone)]
pub(crate) struct Renewal {
    conn: Arc<Connection>,
    expiry: Expiry,
    shared: SharedLocks,
}

impl Renewal {
    pub(crate) fn new(conn: Arc<Connection>, expiry: Expiry, shared: SharedLocks) -> Self {
        Self {
            conn,
            expiry,
            shared,
        }
    }

    pub(crate) async fn renew_batch(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        let op = Operation::Renew;
        let mut results: Vec<Option<Result<Instant, LockError>>> =
            std::iter::repeat_with(|| None).take(leases.len()).collect();
        let session: Arc<Session> = match self.conn.session(op).await {
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
                results[index] = Some(self.shared.renew_shared(lease).await);
                continue;
            }
            let ours = lease
                .session()
                .is_some_and(|s| s.same_channel(&session.state));
            let Some(node) = keys::lease_node(self.conn.config(), lease).filter(|_| ours) else {
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
            if !self.expiry.tracked_until(lease, node.seq, sent) {
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
                        self.expiry.nodes().forget(leases[*index].owner());
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

    /// Renews one mutex lease, confirming its node from the leader's view
    /// (`sync` + node check): the path of a lease that `renew_batch` does
    /// not check in its multi (another session's, or not a node of ours).
    pub(crate) async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        if lease.kind() != LeaseKind::Exclusive {
            return self.shared.renew_shared(lease).await;
        }
        let not_held = |why: &str| {
            LockError::new(ErrorKind::NotHeld, Operation::Renew, why.to_owned())
                .with_key(lease.key())
                .with_backend(NAME)
        };
        let Some(node) = keys::lease_node(self.conn.config(), lease) else {
            return Err(not_held(
                "the lease does not name a lock node of its key and owner",
            ));
        };
        if lease
            .session()
            .is_some_and(|s| matches!(*s.borrow(), SessionState::Lost(_)))
        {
            return Err(not_held(
                "the ZooKeeper session that held this lease is gone",
            ));
        }
        let session = self
            .conn
            .session(Operation::Renew)
            .await
            .map_err(|e| e.with_key(lease.key()))?;
        let sent = Instant::now();
        // A lease this backend already gave up on (its TTL ran out without a
        // renewal: the node is being deleted) is not revived. Every node
        // granted on this session is tracked until released or expired.
        let ours = lease
            .session()
            .is_some_and(|s| s.same_channel(&session.state));
        if ours && !self.expiry.tracked_until(lease, node.seq, sent) {
            return Err(not_held(
                "the lease's TTL ran out before this renewal; its node is deleted",
            ));
        }
        // Confirm the node from the leader's view: a follower cut off from
        // the leader would still show it after the leader expired our
        // session and granted the key to someone else (see `synced`).
        match synced(
            session.client.sync(node.dir()),
            self.conn.op_timeout(),
            session.client.check_stat(node.path()),
        )
        .await
        {
            Ok(None) => {
                self.expiry.nodes().forget(lease.owner());
                Err(not_held(
                    "the lock node is gone (released, expired, or deleted)",
                ))
            }
            Ok(Some(stat)) if u64::try_from(stat.czxid).ok() != Some(lease.token().get()) => {
                Err(not_held("the lock node was re-created: not this grant"))
            }
            Ok(Some(stat)) if stat.ephemeral_owner != session.id => Err(LockError::new(
                ErrorKind::Unsupported,
                Operation::Renew,
                "the lock node belongs to another ZooKeeper session: it lives as long as that \
                 session and can be released, but not renewed, from here",
            )
            .with_key(lease.key())
            .with_backend(NAME)),
            Ok(Some(_)) => {
                let ttl = lease.ttl().min(session.timeout);
                // Our session's node, no longer tracked: its TTL ran out
                // while the check was in flight (the delete is on its way).
                if !self.expiry.extend(lease, node.seq, sent, ttl) {
                    return Err(not_held(
                        "the lease's TTL ran out before this renewal; its node is deleted",
                    ));
                }
                Ok(validity_deadline(sent, ttl))
            }
            Err(err) => Err(err.into_lock_error(Operation::Renew).with_key(lease.key())),
        }
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
        let timeout = self.conn.op_timeout();
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
        if self.expiry.extend(lease, node.seq, sent, ttl) {
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
