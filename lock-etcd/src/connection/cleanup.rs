//! Deleting entries nobody holds: a pending entry of an acquire that ended
//! without the lock (error, timeout, cancelled), and an entry whose lock's
//! own TTL ran out (the session's expiry task) or whose release failed.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use lock_core::{LockError, LockKey, Operation, OwnerId};
use tokio::time::{Instant, sleep};

use super::session::Session;
use crate::error::protocol_error;
use crate::keys::{Created, guarded_delete};

/// A create transaction in flight, owned so that whoever holds it (the
/// acquire, or the cleanup after the acquire was dropped) learns its outcome.
pub(crate) type CreateFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Created, LockError>> + Send>>;

/// An entry we created (or may have created) that nobody holds yet. If it
/// is dropped armed (error, timeout, cancelled acquire), the entry is
/// deleted in the background; `remove_now` does it inline.
pub(crate) struct PendingEntry<'a> {
    /// Cloned only when a cleanup has to run on its own.
    pub(crate) client: &'a Client,
    pub(crate) session: Arc<Session>,
    pub(crate) entry: String,
    pub(crate) owner: OwnerId,
    /// The create transaction while it runs.
    pub(crate) create: Option<CreateFuture>,
    /// Its create revision once known.
    pub(crate) revision: Option<i64>,
    pub(crate) armed: bool,
    pub(crate) op_timeout: Duration,
}

impl PendingEntry<'_> {
    /// Runs `create` from inside the pending entry and checks its answer:
    /// our entry's create revision (recorded here) and the oldest entry's
    /// under the key. If this future is dropped mid-flight, the entry's
    /// cleanup task takes the create over and still learns its outcome.
    /// (Polling it inline rather than on a task of its own saves a spawn, a
    /// join and a cross-thread wake-up per acquire.)
    pub(crate) async fn run_create(
        &mut self,
        create: CreateFuture,
        key: &LockKey,
        op: Operation,
    ) -> Result<(i64, Option<i64>), LockError> {
        let created = self.create.insert(create).as_mut().await;
        self.create = None;
        let created = created.map_err(|e| e.with_key(key))?;
        let Some(my_revision) = created.my_revision else {
            return Err(protocol_error(op, key, "no revision for our entry"));
        };
        if !created.ours {
            // Not written by this grant: delete it without a guard (the
            // name carries our lease id, so it is ours) and never reuse it.
            return Err(protocol_error(op, key, "our entry name was taken"));
        }
        self.revision = Some(my_revision);
        Ok((my_revision, created.owner_revision))
    }

    /// Deletes the entry now (guarded by its revision and owner); on
    /// failure leaves it to the background cleanup.
    pub(crate) async fn remove_now(mut self) {
        let Some(revision) = self.revision else {
            return;
        };
        let mut kv = self.client.kv_client();
        let result = tokio::time::timeout(
            self.op_timeout,
            kv.txn(guarded_delete(&self.entry, revision, self.owner)),
        )
        .await;
        if let Ok(Ok(_)) = result {
            self.session.free_entry(&self.entry);
            self.armed = false;
        }
    }
}

impl Drop for PendingEntry<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(cleanup(
                self.client.clone(),
                self.session.clone(),
                std::mem::take(&mut self.entry),
                self.owner,
                self.create.take(),
                self.revision,
            ));
        }
    }
}

/// [`cleanup`] on a task of its own of an entry created at `revision`
/// that nobody holds any more (its lock's TTL ran out, or its release or
/// downgrade failed).
pub(crate) fn clean_up_later(
    client: &Client,
    session: Arc<Session>,
    entry: String,
    owner: OwnerId,
    revision: i64,
) {
    tokio::spawn(cleanup(
        client.clone(),
        session,
        entry,
        owner,
        None,
        Some(revision),
    ));
}

/// Deletes an entry nobody holds, retrying while the session lives (the
/// entry goes with the lease otherwise).
///
/// If the create was still running, its outcome is awaited first. With a
/// known revision the delete is guarded and the name is freed afterwards.
/// With an unknown outcome (the create timed out), the name is never reused
/// by this session and the delete is repeated a few times over several
/// seconds, in case the create is applied after an earlier delete.
pub(crate) async fn cleanup(
    client: Client,
    session: Arc<Session>,
    entry: String,
    owner: OwnerId,
    create: Option<CreateFuture>,
    mut revision: Option<i64>,
) {
    if let Some(create) = create
        && let Ok(Ok(created)) = tokio::time::timeout(Duration::from_secs(10), create).await
        && created.ours
    {
        revision = created.my_revision;
    }
    let mut kv = client.kv_client();
    let give_up = Instant::now()
        + session
            .server_ttl()
            .saturating_mul(10)
            .max(Duration::from_secs(30));
    let mut delay = Duration::from_millis(20);
    // Delays before repeating an unguarded delete.
    let mut repeats = [
        Duration::from_millis(100),
        Duration::from_millis(500),
        Duration::from_secs(2),
        Duration::from_secs(5),
    ]
    .into_iter();
    while session.is_alive() && Instant::now() < give_up {
        let result = match revision {
            Some(revision) => tokio::time::timeout(
                Duration::from_secs(2),
                kv.txn(guarded_delete(&entry, revision, owner)),
            )
            .await
            .map(|r| r.map(|_| ())),
            None => tokio::time::timeout(Duration::from_secs(2), kv.delete(entry.as_str(), None))
                .await
                .map(|r| r.map(|_| ())),
        };
        match result {
            Ok(Ok(())) if revision.is_some() => {
                session.free_entry(&entry);
                return;
            }
            Ok(Ok(())) => match repeats.next() {
                Some(pause) => sleep(pause).await,
                None => return,
            },
            _ => {
                sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
    }
}
