//! The session's expiry task: deletes each grant whose own deadline
//! passed without a renewal, reading the entries' names back from the
//! server first (the session keeps none).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::Client;
use lock_core::{LockError, Operation, SessionState};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};

use super::{ExpiredGrant, Session, Slot};

/// Deletes each grant of the session whose own deadline passed without a
/// renewal (the lease would keep it as long as the session lives). Sleeps
/// until the earliest deadline, or until woken by an earlier one, the
/// session's loss or its drop.
///
/// The session keeps no entry names, so the names of the expired grants
/// are read back first with one `LeaseTimeToLive` listing the session's
/// keys; should that fail, it is asked again [`EXPIRY_RETRY`] later (the
/// grants stay marked expired, their names unused, meanwhile).
pub(super) async fn expiry_loop(
    client: Client,
    session: Weak<Session>,
    wake: Arc<Notify>,
    op_timeout: Duration,
) {
    let mut pending: Vec<ExpiredGrant> = Vec::new();
    loop {
        let next = {
            let Some(s) = session.upgrade() else { return };
            if matches!(s.state(), SessionState::Lost(_)) {
                return;
            }
            let (expired, next) = s.take_expired(Instant::now());
            pending.extend(expired);
            if pending.is_empty() {
                next
            } else {
                match delete_expired(&client, &s, &mut pending, op_timeout).await {
                    Ok(()) => next,
                    Err(err) => {
                        tracing::debug!(lease = %s.lease_hex(), %err, "could not list the session's entries to delete expired grants");
                        let retry = Instant::now() + EXPIRY_RETRY;
                        Some(next.map_or(retry, |at| at.min(retry)))
                    }
                }
            }
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = sleep_until(at) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

/// How soon the expiry task asks again for the session's entry names
/// after that failed.
const EXPIRY_RETRY: Duration = Duration::from_millis(200);

/// Reads the names of the session's entries from the server and starts
/// the guarded delete of each `pending` grant's entry (an entry no longer
/// listed is gone already: its name is freed). Empties `pending` unless
/// the listing fails.
async fn delete_expired(
    client: &Client,
    session: &Arc<Session>,
    pending: &mut Vec<ExpiredGrant>,
    op_timeout: Duration,
) -> Result<(), LockError> {
    let Some(answer) = session
        .list_keys(client, op_timeout, Operation::Release)
        .await?
    else {
        // The lease, and every entry on it, is gone; the keep-alive
        // declares the session lost.
        pending.clear();
        return Ok(());
    };
    let wanted: HashSet<Slot> = pending.iter().map(|g| g.slot).collect();
    let mut names: HashMap<Slot, String> = HashMap::new();
    for key in answer.keys() {
        if let Ok(name) = std::str::from_utf8(key)
            && let Some(slot) = session.slot_of(name)
            && wanted.contains(&slot)
        {
            names.insert(slot, name.to_owned());
        }
    }
    for grant in pending.drain(..) {
        match names.remove(&grant.slot) {
            Some(entry) => {
                tracing::debug!(%entry, "lock TTL ran out without a renewal; deleting its entry");
                crate::connection::clean_up_later(
                    client,
                    session.clone(),
                    entry,
                    grant.owner,
                    grant.revision,
                );
            }
            None => session.free_slot(grant.slot, None),
        }
    }
    Ok(())
}
