//! The semaphore's acquisition attempt and its lease nodes (Curator's
//! `InterProcessSemaphoreV2`; see `shared.rs`).

use std::sync::Arc;
use std::time::Duration;

use lock_core::{ErrorKind, Lease, LeaseKind, LockKey, Operation};
use tokio::time::Instant;
use zookeeper_client as zk;

use super::nodes::{
    LEASES, LOCKS, Pending, TRY_MUTEX_WAIT, create_sequential, error, limit_of, seq_u32,
};
use crate::connection::{Session, synced};
use crate::error::{CallError, timed};
use crate::grants::GrantParts;
use crate::keys::{self, LEASE_NAME, sequence_named};
use crate::waiting::{self, AttemptError, Queue, Recipe, granted, to_token};

/// Semaphores in Curator's `InterProcessSemaphoreV2` layout: one
/// acquisition attempt.
#[derive(Clone)]
pub(crate) struct Semaphores {
    parts: GrantParts,
}

impl Semaphores {
    pub(crate) fn new(parts: GrantParts) -> Self {
        Self { parts }
    }

    /// `count` lease nodes at `prefix`, created in one transaction (all or
    /// none). Returns their paths and the first one's `czxid` (a multi's
    /// creates answer without a stat: it is read once).
    #[allow(clippy::too_many_arguments)]
    async fn create_leases(
        &self,
        session: &Session,
        leases: &str,
        prefix: &str,
        count: u32,
        data: &str,
        operation: Operation,
        key: &LockKey,
    ) -> Result<(Vec<String>, i64), AttemptError> {
        let timeout = self.parts.conn.op_timeout();
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.parts.conn.acls());
        let mut missing_dir = 0;
        let created = loop {
            let mut writer = session.client.new_multi_writer();
            for _ in 0..count {
                writer
                    .add_create(prefix, data.as_bytes(), &options)
                    .map_err(|e| waiting::fail(session, CallError::Zk(e), operation, key))?;
            }
            let err = match tokio::time::timeout(timeout, writer.commit()).await {
                Ok(Ok(results)) => break results,
                Err(_) => CallError::TimedOut(timeout),
                Ok(Err(err)) => CallError::Zk(zk::Error::from(err)),
            };
            // The directory may have been removed (a container) since the
            // limit was read.
            if err.is(&zk::Error::NoNode) && missing_dir < 3 {
                missing_dir += 1;
                self.parts
                    .waiting
                    .ensure_dir(session, leases, operation, key)
                    .await?;
                continue;
            }
            return Err(waiting::fail(session, err, operation, key));
        };
        let paths: Vec<String> = created
            .into_iter()
            .filter_map(|r| match r {
                zk::MultiWriteResult::Create { path, .. } => Some(path),
                _ => None,
            })
            .collect();
        let Some(first) = paths.first() else {
            return Err(AttemptError::Lock(error(
                ErrorKind::Backend,
                operation,
                key,
                "the lease nodes' create returned nothing",
            )));
        };
        match timed(timeout, session.client.check_stat(first)).await {
            Ok(Some(stat)) => Ok((paths, stat.czxid)),
            Ok(None) => Err(AttemptError::Lock(error(
                ErrorKind::LeaseLost,
                operation,
                key,
                format!("our lease node {first} was deleted at once"),
            ))),
            Err(err) => Err(waiting::fail(session, err, operation, key)),
        }
    }

    /// One permit acquisition: the internal mutex, the limit check, the
    /// lease nodes, the wait for room (holding the mutex, as Curator does).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn sem_attempt(
        &self,
        session: &Arc<Session>,
        key: &LockKey,
        base: &str,
        (count, limit): (u32, u32),
        ttl: Duration,
        deadline: Option<Instant>,
        operation: Operation,
    ) -> Result<Option<Lease>, AttemptError> {
        let leases = format!("{base}/{LEASES}");
        let locks = format!("{base}/{LOCKS}");
        let timeout = self.parts.conn.op_timeout();
        let mismatch = |theirs: u32| {
            AttemptError::Lock(error(
                ErrorKind::InvalidArgument,
                operation,
                key,
                format!("this semaphore is in use with a limit of {theirs} permits, not {limit}"),
            ))
        };
        // An early look, without the mutex: a different limit in use, or
        // (for a try) no room or a waiter ahead.
        match timed(timeout, session.client.get_data(&leases)).await {
            Ok((data, stat)) if stat.num_children > 0 => {
                if let Some(theirs) = limit_of(&data).filter(|l| *l != limit) {
                    return Err(mismatch(theirs));
                }
                let used = u64::try_from(stat.num_children).unwrap_or(0);
                if deadline.is_none() && used + u64::from(count) > u64::from(limit) {
                    return Ok(None);
                }
            }
            Ok(_) => {}
            Err(err) if err.is(&zk::Error::NoNode) => {}
            Err(err) => return Err(waiting::fail(session, err, operation, key)),
        }
        // The internal mutex (Curator's `<path>/locks`), FIFO.
        let mutex_deadline = deadline.unwrap_or_else(|| Instant::now() + TRY_MUTEX_WAIT);
        let queue = Queue {
            key,
            dir: &locks,
            ttl,
            deadline: Some(mutex_deadline),
            operation,
            track: false,
            recipe: Recipe::Mutex,
        };
        let mutex = match self.parts.waiting.lock_in_recipe(queue).await {
            Ok(Some(mutex)) => mutex,
            Ok(None) => return Ok(None),
            Err(err) if err.kind() == ErrorKind::Contended && deadline.is_none() => {
                return Ok(None);
            }
            Err(err) => return Err(AttemptError::Lock(err)),
        };
        // The mutex may have been granted on a newer session (the one this
        // attempt began on was lost): go on with the session that holds it.
        let session = &self
            .parts
            .conn
            .session(operation)
            .await
            .map_err(AttemptError::Lock)?;
        let mut pending = Pending::new(&self.parts.cleanup, &session.client);
        let mutex_path = mutex
            .backend_data()
            .parse::<u32>()
            .ok()
            .map(|seq| keys::node_path(&locks, mutex.owner(), seq));
        if let Some(path) = &mutex_path {
            pending
                .nodes
                .push((locks.clone(), path.clone(), mutex.owner()));
        }
        if !mutex
            .session()
            .is_some_and(|s| s.same_channel(&session.state))
        {
            // Its session is lost already, and the mutex node with it.
            pending.disarm();
            return Err(AttemptError::SessionLost);
        }
        // Under the mutex: the authoritative limit check.
        let (data, stat) = match timed(timeout, session.client.get_data(&leases)).await {
            Ok(found) => found,
            Err(err) if err.is(&zk::Error::NoNode) => {
                self.parts
                    .waiting
                    .ensure_dir(session, &leases, operation, key)
                    .await?;
                match timed(timeout, session.client.get_data(&leases)).await {
                    Ok(found) => found,
                    Err(err) => return Err(waiting::fail(session, err, operation, key)),
                }
            }
            Err(err) => return Err(waiting::fail(session, err, operation, key)),
        };
        let stored = limit_of(&data);
        if let Some(theirs) = stored.filter(|l| stat.num_children > 0 && *l != limit) {
            pending.withdraw().await;
            return Err(mismatch(theirs));
        }
        if stored != Some(limit) {
            // Idle (or never set by our clients): our limit takes effect.
            if let Err(err) = timed(
                timeout,
                session
                    .client
                    .set_data(&leases, limit.to_string().as_bytes(), None),
            )
            .await
            {
                return Err(waiting::fail(session, err, operation, key));
            }
        }
        // Our lease nodes: one create (whose reply carries the czxid), or
        // several at once in one transaction.
        let owner = self.parts.expiry.next_owner();
        pending.sweeps.push((leases.clone(), owner));
        let prefix = keys::named_prefix(&leases, owner, LEASE_NAME);
        // Each lease node's data: the owner hex and the holder details, as
        // a mutex node's (Curator hands a lease's data to its user and
        // never reads it; the limit is the `leases` directory's data).
        let node_data = keys::mutex_node_data(owner);
        let created_at = Instant::now();
        // One permit: the list of the leases is sent right behind the
        // lease's create (no round trip of its own), unwatched (a grant
        // would leave a watch armed).
        let (ours, first_czxid, mut first_list) = if count == 1 {
            let (path, czxid, _, listed) = create_sequential(
                (&self.parts.conn, &self.parts.waiting),
                session,
                &leases,
                &prefix,
                node_data.as_bytes(),
                operation,
                key,
                || timed(timeout, session.client.list_children(&leases)),
            )
            .await?;
            (vec![path], czxid, Some(listed))
        } else {
            let (ours, czxid) = self
                .create_leases(session, &leases, &prefix, count, &node_data, operation, key)
                .await?;
            (ours, czxid, None)
        };
        pending.sweeps.clear();
        for path in &ours {
            pending.nodes.push((leases.clone(), path.clone(), owner));
        }
        let mut seqs = Vec::with_capacity(ours.len());
        for path in &ours {
            let name = &path[leases.len() + 1..];
            let seq = sequence_named(name, LEASE_NAME).unwrap_or(-1);
            seqs.push(seq_u32(seq, operation, key)?);
        }
        let names: Vec<&str> = ours.iter().map(|p| &p[leases.len() + 1..]).collect();
        let mut first = true;
        loop {
            let client = &session.client;
            let mut sent = Instant::now();
            // The first look sets no watch: a grant would leave it armed
            // (its event would come at some later change). A wait looks
            // again with a watch, behind a `sync`.
            let listed = if first {
                first = false;
                let listed = match first_list.take() {
                    Some(listed) => {
                        // Sent with the create: the grant dates from it.
                        sent = created_at;
                        listed.await
                    }
                    None => timed(timeout, client.list_children(&leases)).await,
                };
                listed.map(|children| (children, None))
            } else {
                synced(
                    client.sync(&leases),
                    timeout,
                    client.list_and_watch_children(&leases),
                )
                .await
                .map(|(children, watcher)| (children, Some(watcher)))
            };
            let (children, watcher) = match listed {
                Ok(listed) => listed,
                Err(err) => return Err(waiting::fail(session, err, operation, key)),
            };
            if !names.iter().all(|n| children.iter().any(|c| c == n)) {
                if session.is_lost() {
                    return Err(AttemptError::SessionLost);
                }
                pending.withdraw().await;
                return Err(AttemptError::Lock(error(
                    ErrorKind::LeaseLost,
                    operation,
                    key,
                    format!("our lease nodes in {leases} were deleted while we waited"),
                )));
            }
            let room = children.len() <= usize::try_from(limit).unwrap_or(usize::MAX);
            if room {
                if session.is_lost() {
                    return Err(AttemptError::SessionLost);
                }
                let token = to_token(first_czxid, operation, key)?;
                let ttl = ttl.min(session.timeout);
                let data = format!(
                    "{};{first_czxid}",
                    seqs.iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                );
                let lease = granted(key, owner, token, (ttl, sent), data)?
                    .with_kind(LeaseKind::Permits { count, limit })
                    .with_session(session.state.clone());
                self.parts
                    .expiry
                    .schedule_shared(owner, ours.clone(), sent + ttl);
                // Only the mutex is left to delete.
                pending.nodes.retain(|(dir, _, _)| *dir == locks);
                pending.withdraw().await;
                return Ok(Some(lease));
            }
            let Some(deadline) = deadline else {
                pending.withdraw().await;
                return Ok(None);
            };
            let Some(watcher) = watcher else {
                // Look again, with a watch.
                continue;
            };
            let why = "no permits free at the wait deadline";
            pending
                .wait_watched(session, watcher, deadline, (operation, key, why))
                .await?;
        }
    }
}
