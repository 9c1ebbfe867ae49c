//! The read-write lock's acquisition attempt (Curator's
//! `InterProcessReadWriteLock` predicates; see `shared.rs`).

use std::sync::Arc;
use std::time::Duration;

use lock_core::{ErrorKind, Lease, LeaseKind, LockKey, Operation};
use tokio::time::Instant;
use zookeeper_client as zk;

use super::nodes::{
    Pending, create_sequential, epoch_of, error, rw_blocker, seq_u32, sorted_rw_nodes,
};
use crate::connection::{Session, synced};
use crate::error::{CallError, timed};
use crate::grants::GrantParts;
use crate::keys::{self, READ_NAME, WRITE_NAME};
use crate::waiting::{self, AttemptError, granted, to_token};

/// Read-write locks in Curator's `InterProcessReadWriteLock` layout: one
/// acquisition attempt.
#[derive(Clone)]
pub(crate) struct RwLocks {
    parts: GrantParts,
}

impl RwLocks {
    pub(crate) fn new(parts: GrantParts) -> Self {
        Self { parts }
    }

    /// One read or write acquisition with a fresh attempt id on `session`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn rw_attempt(
        &self,
        session: &Arc<Session>,
        key: &LockKey,
        dir: &str,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Option<Instant>,
        operation: Operation,
    ) -> Result<Option<Lease>, AttemptError> {
        let write = kind == LeaseKind::Write;
        let epoch_path = keys::rw_epoch_path(self.parts.conn.config().root(), key);
        let owner = self.parts.expiry.next_owner();
        let name = if write { WRITE_NAME } else { READ_NAME };
        let mut pending = Pending::new(&self.parts.cleanup, &session.client);
        // Armed before the create: a future dropped while it is in flight
        // has its node found by the attempt id.
        pending.sweeps.push((dir.to_owned(), owner));
        let prefix = keys::named_prefix(dir, owner, name);
        let created_at = Instant::now();
        // The holder details ride in the create (no extra request), after
        // the owner hex, as in a mutex node (Curator never reads this data).
        let data = keys::mutex_node_data(owner);
        let client = &session.client;
        // The children and the directory's data (the write epoch a reader
        // carries), the three requests made when this is called and sent
        // back to back: right behind our create (no round trip of their
        // own), and after a wait behind a `sync` (the leader's view, see
        // `synced`). The epoch is the greater of the epoch node's and the
        // directory's data (where versions before the epoch node kept it),
        // both read in the same exchange.
        let read = || {
            let children = client.list_children(dir);
            let in_dir = client.get_data(dir);
            let stored = client.get_data(&epoch_path);
            async move {
                let children = children.await?;
                let epoch = epoch_in(in_dir.await)?.max(epoch_in(stored.await)?);
                Ok::<_, zk::Error>((children, epoch))
            }
        };
        let (path, czxid, seq, first_read) = match create_sequential(
            (&self.parts.conn, &self.parts.waiting),
            session,
            dir,
            &prefix,
            data.as_bytes(),
            operation,
            key,
            read,
        )
        .await
        {
            Ok(created) => created,
            Err(err) => {
                // Left armed: the sweep runs in the background.
                return Err(err);
            }
        };
        pending.sweeps.clear();
        pending.nodes.push((dir.to_owned(), path.clone(), owner));
        let node_name = path[dir.len() + 1..].to_owned();
        let mut after_create = Some((created_at, first_read));
        let timeout = self.parts.conn.op_timeout();
        loop {
            let (sent, listed) = match after_create.take() {
                Some((sent, first_read)) => (sent, timed(timeout, first_read).await),
                None => {
                    let sent = Instant::now();
                    (sent, synced(client.sync(dir), timeout, read()).await)
                }
            };
            let (children, epoch) = match listed {
                Ok(listed) => listed,
                Err(err) => return Err(waiting::fail(session, err, operation, key)),
            };
            let nodes = sorted_rw_nodes(children);
            let Some(index) = nodes.iter().position(|n| n.name == node_name) else {
                if session.is_lost() {
                    return Err(AttemptError::SessionLost);
                }
                pending.disarm();
                return Err(AttemptError::Lock(error(
                    ErrorKind::LeaseLost,
                    operation,
                    key,
                    format!("our lock node {path} was deleted while we waited"),
                )));
            };
            let Some(blocker) = rw_blocker(&nodes, index).map(str::to_owned) else {
                if session.is_lost() {
                    return Err(AttemptError::SessionLost);
                }
                let token = if write {
                    let token = to_token(czxid, operation, key)?;
                    // The epoch readers carry from now on; set before the
                    // grant is handed out, so every read granted after
                    // this writer releases reads it.
                    if let Err(err) = self.store_epoch(client, dir, &epoch_path, token).await {
                        return Err(waiting::fail(session, err, operation, key));
                    }
                    token
                } else {
                    epoch
                };
                let ttl = ttl.min(session.timeout);
                let seq = seq_u32(seq, operation, key)?;
                let lease = granted(key, owner, token, (ttl, sent), format!("{seq};{czxid}"))?
                    .with_kind(kind)
                    .with_session(session.state.clone());
                pending.disarm();
                self.parts
                    .expiry
                    .schedule_shared(owner, vec![path], sent + ttl);
                return Ok(Some(lease));
            };
            let Some(deadline) = deadline else {
                pending.withdraw().await;
                return Ok(None);
            };
            let watched = timed(
                timeout,
                client.check_and_watch_stat(&format!("{dir}/{blocker}")),
            )
            .await;
            let Some(watcher) = waiting::watcher_if_present(session, watched, operation, key)?
            else {
                continue;
            };
            let why = "still held by another owner at the wait deadline";
            pending
                .wait_watched(session, watcher, deadline, (operation, key, why))
                .await?;
        }
    }

    /// Stores a write grant's `token` as the key's epoch: in the epoch node
    /// (persistent; see [`keys::rw_epoch_path`]) and in the directory's
    /// data (what earlier versions read). One exchange: the node's create
    /// (refused once it exists) and its `setData` go together, in that
    /// order, with the directory's; only the very first write under a root
    /// also creates the epoch nodes' parent, and sends them again.
    async fn store_epoch(
        &self,
        client: &zk::Client,
        dir: &str,
        epoch_path: &str,
        token: u64,
    ) -> Result<(), CallError> {
        let value = token.to_string();
        let timeout = self.parts.conn.op_timeout();
        let options = zk::CreateMode::Persistent.with_acls(self.parts.conn.acls());
        let parent = &epoch_path[..epoch_path.rfind('/').unwrap_or(0)];
        let mut parent_made = false;
        loop {
            let in_dir = timed(timeout, client.set_data(dir, value.as_bytes(), None));
            let created = timed(
                timeout,
                client.create(epoch_path, value.as_bytes(), &options),
            );
            let stored = timed(timeout, client.set_data(epoch_path, value.as_bytes(), None));
            let (in_dir, created, stored) = tokio::join!(in_dir, created, stored);
            in_dir?;
            match created {
                Ok(_) => {}
                Err(err) if err.is(&zk::Error::NodeExists) => {}
                Err(err) if err.is(&zk::Error::NoNode) && !parent_made => {
                    timed(timeout, client.mkdir(parent, &options)).await?;
                    parent_made = true;
                    continue;
                }
                Err(err) => return Err(err),
            }
            return stored.map(drop);
        }
    }
}

/// The epoch in a `getData` answer: 0 where the node does not exist.
fn epoch_in(read: Result<(Vec<u8>, zk::Stat), zk::Error>) -> Result<u64, zk::Error> {
    match read {
        Ok((data, _)) => Ok(epoch_of(&data)),
        Err(zk::Error::NoNode) => Ok(0),
        Err(err) => Err(err),
    }
}
