//! Node cleanup: deleting an attempt's node when it ends without the lock
//! (at once, or in the background when the attempt is dropped), nodes of a
//! create whose reply was lost, and empty key directories without
//! container nodes.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{OwnerId, RetryPolicy};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::connection::{Connection, Session, lock};
use crate::error::timed;
use crate::keys::mutex_owner_of;

/// How long a background cleanup keeps trying to delete a node.
const CLEANUP_PATIENCE: Duration = Duration::from_secs(60);

const CLEANUP_RETRY: RetryPolicy = RetryPolicy {
    initial: Duration::from_millis(50),
    max: Duration::from_secs(2),
    multiplier: 2,
    max_attempts: None,
};

/// Deletes a waiting (or just-created) node when an attempt ends early:
/// timeout, error, or the future being dropped. Armed before the create is
/// sent: if the attempt is dropped while the create is in flight, the node
/// is found by the attempt id (requests of one session are answered in
/// order, so the lookup sees the create). Borrows what it needs and clones
/// it only when it fires.
pub(crate) struct NodeCleanup<'a> {
    pub(crate) cleanup: &'a Cleanup,
    pub(crate) client: &'a zk::Client,
    pub(crate) dir: &'a str,
    pub(crate) owner: OwnerId,
    pub(crate) armed: bool,
    pub(crate) path: Option<String>,
}

impl NodeCleanup<'_> {
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for NodeCleanup<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let cleanup = self.cleanup.clone();
        let client = self.client.clone();
        let dir = self.dir.to_owned();
        let owner = self.owner;
        let path = self.path.take();
        runtime.spawn(async move {
            match path {
                Some(path) => cleanup.delete_node(&client, &path, &dir, owner).await,
                None => {
                    cleanup.mark_uncertain(owner);
                    cleanup.sweep_uncertain(&client, &dir, owner, true).await;
                }
            }
        });
    }
}

/// Deleting the nodes of attempts that ended without the lock. Clones
/// share the set of uncertain attempts.
#[derive(Clone)]
pub(crate) struct Cleanup {
    conn: Arc<Connection>,
    /// Attempts whose create had an unknown outcome: more than one node may
    /// carry their id, so cleanup sweeps the directory for it.
    uncertain: Arc<Mutex<HashSet<OwnerId>>>,
}

impl Cleanup {
    pub(crate) fn new(conn: Arc<Connection>) -> Self {
        Self {
            conn,
            uncertain: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    pub(crate) fn conn(&self) -> &Arc<Connection> {
        &self.conn
    }

    /// `owner`'s create had an unknown outcome: its directory is swept
    /// for its nodes when its attempt ends.
    pub(crate) fn mark_uncertain(&self, owner: OwnerId) {
        lock(&self.uncertain).insert(owner);
    }

    fn op_timeout(&self) -> Duration {
        self.conn.op_timeout()
    }

    /// Deletes a node of ours and, if its attempt had a lost create reply,
    /// any other node carrying the same attempt id. Best effort.
    ///
    /// Retried through disconnections: a waiting node left behind by a
    /// live session would block the key for as long as the session lives.
    pub(crate) async fn delete_node(
        &self,
        client: &zk::Client,
        path: &str,
        dir: &str,
        owner: OwnerId,
    ) {
        let give_up = Instant::now() + CLEANUP_PATIENCE;
        let mut backoff = CLEANUP_RETRY.backoff();
        loop {
            match timed(self.op_timeout(), client.delete(path, None)).await {
                Ok(()) => break,
                Err(err) if err.is(&zk::Error::NoNode) => break,
                // The node went with the session.
                Err(err) if err.ends_session() => return,
                Err(err) if Instant::now() < give_up => {
                    tracing::debug!(%path, ?err, "deleting a lock node failed; retrying");
                    let delay = backoff.next_delay().unwrap_or(Duration::from_secs(1));
                    tokio::time::sleep(delay).await;
                }
                Err(err) => {
                    tracing::warn!(%path, ?err, "could not delete a lock node; it stays until its session ends");
                    return;
                }
            }
        }
        self.sweep_uncertain(client, dir, owner, true).await;
        self.remove_empty_dir(client, dir).await;
    }

    /// Deletes every node of `dir` carrying `owner`'s id, if that attempt
    /// had a create with an unknown outcome. `patient`: keep retrying
    /// through disconnections (background cleanups only).
    pub(crate) async fn sweep_uncertain(
        &self,
        client: &zk::Client,
        dir: &str,
        owner: OwnerId,
        patient: bool,
    ) {
        {
            let mut uncertain = lock(&self.uncertain);
            // Almost always empty: no hashing then.
            if uncertain.is_empty() || !uncertain.remove(&owner) {
                return;
            }
        }
        // Boxed: rare, and inline its futures would enlarge every
        // release's future.
        Box::pin(self.sweep_owner(client, dir, owner, patient)).await;
    }

    /// [`Self::sweep_uncertain`] of `owner`, known uncertain: lists `dir`
    /// and deletes the owner's nodes there.
    async fn sweep_owner(&self, client: &zk::Client, dir: &str, owner: OwnerId, patient: bool) {
        let give_up = Instant::now() + CLEANUP_PATIENCE;
        let mut backoff = CLEANUP_RETRY.backoff();
        let children = loop {
            match timed(self.op_timeout(), client.list_children(dir)).await {
                Ok(children) => break children,
                Err(err) if err.is(&zk::Error::NoNode) || err.ends_session() => return,
                Err(_) if patient && Instant::now() < give_up => {
                    let delay = backoff.next_delay().unwrap_or(Duration::from_secs(1));
                    tokio::time::sleep(delay).await;
                }
                Err(err) => {
                    tracing::warn!(%dir, ?err, "could not look for nodes of a lost create reply");
                    return;
                }
            }
        };
        for name in children.iter().filter(|n| mutex_owner_of(n) == Some(owner)) {
            let path = format!("{dir}/{name}");
            if patient {
                Box::pin(self.delete_node(client, &path, dir, owner)).await;
            } else {
                let _ = timed(self.op_timeout(), client.delete(&path, None)).await;
            }
        }
    }

    /// Without container nodes, removes the key directory once empty. A
    /// non-empty directory (waiters) is refused by the server, and a waiter
    /// that finds it gone re-creates it, so this never breaks a waiter.
    ///
    /// A read-write lock's directory is kept: its data is the write epoch
    /// readers carry.
    pub(crate) async fn remove_empty_dir(&self, client: &zk::Client, dir: &str) {
        if !self.conn.containers()
            && !crate::keys::is_rw_dir(self.conn.config().root(), dir)
            && !self.conn.is_foreign_dir(dir)
        {
            // Boxed: only on servers without containers.
            let _ = Box::pin(timed(self.op_timeout(), client.delete(dir, None))).await;
        }
    }

    /// Deletes our node at the end of an attempt that did not get the lock,
    /// with one bounded request; if that fails the cleanup stays armed and
    /// retries in the background when it is dropped.
    pub(crate) async fn withdraw(&self, session: &Session, cleanup: &mut NodeCleanup<'_>) {
        let Some(path) = cleanup.path.clone() else {
            return;
        };
        match timed(self.op_timeout(), session.client.delete(&path, None)).await {
            Err(err) if !err.is(&zk::Error::NoNode) && !err.ends_session() => {}
            _ => {
                cleanup.disarm();
                self.sweep_uncertain(&session.client, cleanup.dir, cleanup.owner, false)
                    .await;
                self.remove_empty_dir(&session.client, cleanup.dir).await;
            }
        }
    }
}
