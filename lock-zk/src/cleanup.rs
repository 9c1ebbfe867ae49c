//! Node cleanup: deleting an attempt's node when it ends without the lock
//! (at once, or in the background when the attempt is dropped), nodes of a
//! create whose reply was lost, and empty key directories without
//! container nodes.

use std::sync::atomic::Ordering;
use std::time::Duration;

use lock_core::{OwnerId, RetryPolicy};
use tokio::time::Instant;
use zookeeper_client as zk;

use super::session::Session;
use super::{ZkBackend, lock};
use crate::error::timed;
use crate::paths::mutex_owner_of;

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
pub(super) struct NodeCleanup<'a> {
    pub(super) backend: &'a ZkBackend,
    pub(super) client: &'a zk::Client,
    pub(super) dir: &'a str,
    pub(super) owner: OwnerId,
    pub(super) armed: bool,
    pub(super) path: Option<String>,
}

impl NodeCleanup<'_> {
    pub(super) fn disarm(&mut self) {
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
        let backend = self.backend.clone();
        let client = self.client.clone();
        let dir = self.dir.to_owned();
        let owner = self.owner;
        let path = self.path.take();
        runtime.spawn(async move {
            match path {
                Some(path) => backend.delete_node(&client, &path, &dir, owner).await,
                None => {
                    lock(&backend.inner.uncertain).insert(owner);
                    backend.sweep_uncertain(&client, &dir, owner, true).await;
                }
            }
        });
    }
}

impl ZkBackend {
    /// Deletes a node of ours and, if its attempt had a lost create reply,
    /// any other node carrying the same attempt id. Best effort.
    ///
    /// Retried through disconnections: a waiting node left behind by a
    /// live session would block the key for as long as the session lives.
    pub(super) async fn delete_node(
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
    pub(super) async fn sweep_uncertain(
        &self,
        client: &zk::Client,
        dir: &str,
        owner: OwnerId,
        patient: bool,
    ) {
        {
            let mut uncertain = lock(&self.inner.uncertain);
            // Almost always empty: no hashing then.
            if uncertain.is_empty() || !uncertain.remove(&owner) {
                return;
            }
        }
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
    pub(super) async fn remove_empty_dir(&self, client: &zk::Client, dir: &str) {
        if !self.inner.containers.load(Ordering::Relaxed)
            && !crate::paths::is_rw_dir(self.inner.config.root(), dir)
            && !self.is_foreign_dir(dir)
        {
            let _ = timed(self.op_timeout(), client.delete(dir, None)).await;
        }
    }

    /// Whether `dir` is a path-layout lock directory outside the root
    /// (another library's path): never removed, never a container.
    pub(super) fn is_foreign_dir(&self, dir: &str) -> bool {
        let config = &self.inner.config;
        config.layout() == crate::ZkLayout::Path
            && !dir
                .strip_prefix(config.root())
                .is_some_and(|rest| rest.starts_with('/'))
    }

    /// Deletes our node at the end of an attempt that did not get the lock,
    /// with one bounded request; if that fails the cleanup stays armed and
    /// retries in the background when it is dropped.
    pub(super) async fn withdraw(&self, session: &Session, cleanup: &mut NodeCleanup<'_>) {
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
