//! Undoing grants whose outcome was not seen (a timeout, a cancelled
//! future, a grant that expired on arrival or that too few replicas took),
//! and withdrawing a one-server acquire's traces (its waiting entry).

use std::sync::Arc;
use std::time::Duration;

use lock_core::{Lease, LockError, Operation};
use redis::Value;

use crate::connection::{Lane, ScriptCall, Servers};
use crate::grants::attempt::Attempt;
use crate::keys::names::{KeyNames, ReleaseKeys};
use crate::keys::replies::as_int;

/// Compare-and-delete of `owner`'s grant under `names` on every node, on
/// each node's connection of `lane`: `(released, not_held, errors)`. The
/// undo of a grant whose answer was not seen passes the grant's lane
/// ([`Servers::undo_lane`]), so that each node processes it after the grant.
pub(crate) async fn release_everywhere(
    servers: &Servers,
    names: ReleaseKeys<'_>,
    owner: &str,
    timeout: Duration,
    lane: Lane,
) -> (usize, usize, Vec<LockError>) {
    let mut released = 0;
    let mut not_held = 0;
    let mut errors = Vec::new();
    let (keys, args) = ([names.lock, names.holder], [owner, names.channel]);
    // Built once for every node.
    let call = &ScriptCall::new(&servers.scripts.release, &keys, &args);
    servers
        .each_node(
            |node| {
                node.run_request_on(
                    lane,
                    Operation::Release,
                    timeout,
                    move |mut conn| async move { conn.eval_call(call).await },
                )
            },
            |result| match result.and_then(|v| as_int(&v, Operation::Release)) {
                Ok(1) => released += 1,
                Ok(_) => not_held += 1,
                Err(err) => errors.push(err),
            },
        )
        .await;
    (released, not_held, errors)
}

/// The cleanup of a guard dropped armed, in the background on the current
/// runtime: `cleanup` runs on clones of the servers and of `names`, with
/// `owner`. Without a runtime nothing is spawned and the traces expire
/// with their TTL.
pub(crate) fn in_background<N, F>(
    servers: &Arc<Servers>,
    names: &N,
    owner: String,
    cleanup: impl FnOnce(Arc<Servers>, N, String) -> F,
) where
    N: Clone,
    F: Future<Output = ()> + Send + 'static,
{
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(cleanup(servers.clone(), names.clone(), owner));
    }
}

/// Releases a grant whose outcome we could not see (timeout, cancelled
/// future, expired on arrival, WAIT not satisfied) unless disarmed.
pub(crate) struct PendingGrant<'a> {
    pub(crate) servers: &'a Arc<Servers>,
    pub(crate) names: &'a KeyNames,
    pub(crate) owner: &'a str,
    pub(crate) armed: bool,
}

impl PendingGrant<'_> {
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for PendingGrant<'_> {
    fn drop(&mut self) {
        if self.armed {
            let owner = self.owner.to_owned();
            in_background(
                self.servers,
                self.names,
                owner,
                |servers, names, owner| async move {
                    let timeout = servers.timeout();
                    let lane = servers.undo_lane(Lane::of(&owner));
                    let _ =
                        release_everywhere(&servers, names.release_keys(), &owner, timeout, lane)
                            .await;
                },
            );
        }
    }
}

/// The Redis names under which a one-server acquire leaves traces (its
/// waiting entry, a grant whose answer was lost), and their removal.
pub(crate) trait Traces: Clone + Send + Sync + 'static {
    /// Removes every trace of `owner` under these names (and publishes, so
    /// a waiter behind it goes on at once), on the connection of `owner`'s
    /// grants ([`Servers::undo_lane`] of [`Lane::of`] `owner`): processed
    /// after every attempt the acquire sent.
    fn abandon(
        &self,
        servers: &Servers,
        owner: &str,
    ) -> impl Future<Output = Result<Value, LockError>> + Send;
}

/// Removes every trace of an acquire that did not end with a lease,
/// unless disarmed: at once on `withdraw`, in the background when dropped
/// armed (a cancelled waiter, a deadline, an error), so the next waiter does
/// not wait out our entry lease.
pub(crate) struct Withdraw<N: Traces> {
    pub(crate) servers: Arc<Servers>,
    pub(crate) names: N,
    pub(crate) owner: String,
    pub(crate) armed: bool,
}

impl<N: Traces> Withdraw<N> {
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }

    pub(crate) async fn withdraw(mut self) {
        self.armed = false;
        let _ = self.names.abandon(&self.servers, &self.owner).await;
    }

    /// A single try's answer: once a grant or a refusal is seen there is
    /// nothing to withdraw (the guard is disarmed), nor after an error
    /// `wrote_nothing` recognises; after any other error the answer may
    /// have hidden a grant, and the guard withdraws in the background.
    pub(crate) fn settle_try(
        self,
        attempt: Result<Attempt, LockError>,
        wrote_nothing: impl FnOnce(&LockError) -> bool,
    ) -> Result<Option<Lease>, LockError> {
        match attempt {
            Ok(Attempt::Granted(lease)) => {
                self.disarm();
                Ok(Some(lease))
            }
            Ok(Attempt::Held { .. }) => {
                self.disarm();
                Ok(None)
            }
            Err(err) if wrote_nothing(&err) => {
                self.disarm();
                Err(err)
            }
            Err(err) => Err(err),
        }
    }
}

impl<N: Traces> Drop for Withdraw<N> {
    fn drop(&mut self) {
        if self.armed {
            let owner = std::mem::take(&mut self.owner);
            in_background(
                &self.servers,
                &self.names,
                owner,
                |servers, names, owner| async move {
                    let _ = names.abandon(&servers, &owner).await;
                },
            );
        }
    }
}
