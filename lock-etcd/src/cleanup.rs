//! Deleting entries nobody holds: a pending entry of an acquire that ended
//! without the lock (error, timeout, cancelled), and an entry whose lock's
//! own TTL ran out (the session's expiry task) or whose release failed.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use lock_core::{LockError, OwnerId};
use tokio::time::{Instant, sleep};

use crate::keys::{Created, guarded_delete};
use crate::session::Session;

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
