//! The read-write lock's acquisition attempt (Curator's
//! `InterProcessReadWriteLock` predicates; see `shared.rs`).

use std::sync::Arc;
use std::time::Duration;

use lock_core::{ErrorKind, Lease, LeaseKind, LockKey, Operation};
use tokio::time::Instant;
use zookeeper_client as zk;

use super::super::ZkBackend;
use super::super::session::{Session, synced};
use super::super::waiting::AttemptError;
use super::*;
use crate::error::timed;
use crate::paths::{self, READ_NAME, WRITE_NAME};

impl ZkBackend {
    /// One read or write acquisition with a fresh attempt id on `session`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn rw_attempt(
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
        let owner = self.inner.owners.next();
        let name = if write { WRITE_NAME } else { READ_NAME };
        let mut pending = Pending::new(self, &session.client);
        // Armed before the create: a future dropped while it is in flight
        // has its node found by the attempt id.
        pending.sweeps.push((dir.to_owned(), owner));
        let prefix = paths::named_prefix(dir, owner, name);
        let created_at = Instant::now();
        // The holder details ride in the create (no extra request), after
        // the owner hex, as in a mutex node (Curator never reads this data).
        let data = paths::mutex_node_data(owner);
        let (path, czxid, seq) = match self
            .create_sequential(session, dir, &prefix, data.as_bytes(), operation, key)
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
        let mut after_create = Some(created_at);
        let timeout = self.op_timeout();
        loop {
            let client = &session.client;
            // The children and the directory's data (the write epoch a
            // reader carries), sent back to back. After a wait, behind a
            // `sync` (the leader's view, see `synced`).
            let read = async {
                let children = client.list_children(dir);
                let data = client.get_data(dir);
                let children = children.await?;
                let data = data.await.map(|(data, _)| data).unwrap_or_default();
                Ok::<_, zk::Error>((children, data))
            };
            let (sent, listed) = match after_create.take() {
                Some(sent) => (sent, timed(timeout, read).await),
                None => {
                    let sent = Instant::now();
                    (sent, synced(client.sync(dir), timeout, read).await)
                }
            };
            let (children, data) = match listed {
                Ok(listed) => listed,
                Err(err) => return Err(Self::fail(session, err, operation, key)),
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
                    if let Err(err) = timed(
                        timeout,
                        client.set_data(dir, token.to_string().as_bytes(), None),
                    )
                    .await
                    {
                        return Err(Self::fail(session, err, operation, key));
                    }
                    token
                } else {
                    epoch_of(&data)
                };
                let ttl = ttl.min(session.timeout);
                let seq = seq_u32(seq, operation, key)?;
                let lease = granted(key, owner, token, (ttl, sent), format!("{seq};{czxid}"))?
                    .with_kind(kind)
                    .with_session(session.state.clone());
                pending.disarm();
                self.schedule_shared(owner, vec![path], sent + ttl);
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
            let Some(watcher) = Self::watcher_if_present(session, watched, operation, key)? else {
                continue;
            };
            let why = "still held by another owner at the wait deadline";
            wait_watched(
                session,
                watcher,
                deadline,
                &mut pending,
                (operation, key, why),
            )
            .await?;
        }
    }
}
