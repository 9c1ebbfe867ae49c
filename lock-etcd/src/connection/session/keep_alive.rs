//! The session's keep-alive task: one lease keep-alive every TTL/3 on one
//! stream, the session's state and deadline moved by each answer, and the
//! revoke of a lease given up on.

use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use lock_core::{ErrorKind, LockError, Operation, SessionState, validity_deadline};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep, sleep_until};

use super::Session;
use crate::error::from_etcd;

/// Sends one keep-alive on the open stream (opening it if needed) and
/// returns the TTL the server answered with.
async fn one_keep_alive(
    client: &Client,
    stream: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    lease_id: i64,
) -> Result<i64, LockError> {
    let op = Operation::Renew;
    match stream {
        None => {
            // Opening the stream sends the first keep-alive and waits for its
            // answer (an error when the lease is gone).
            let opened = client
                .lease_client()
                .keep_alive(lease_id)
                .await
                .map_err(|e| from_etcd(op, e))?;
            *stream = Some(opened);
            Ok(i64::MAX)
        }
        Some((keeper, responses)) => {
            keeper.keep_alive().await.map_err(|e| from_etcd(op, e))?;
            match responses.message().await.map_err(|e| from_etcd(op, e))? {
                Some(response) => Ok(response.ttl()),
                None => Err(LockError::new(
                    ErrorKind::Unavailable,
                    op,
                    "keep-alive stream closed",
                )),
            }
        }
    }
}

/// Keeps the lease alive every TTL/3 until the session is dropped (`wake`
/// says so at once) or lost.
///
/// Each attempt is bounded by TTL/3 (and the operation timeout), so a hung
/// server turns the session `Suspect` well before the deadline; a stream
/// whose request timed out is dropped, so a late answer is never credited
/// to a newer request.
pub(super) async fn keep_alive_loop(
    client: Client,
    session: Weak<Session>,
    wake: Arc<Notify>,
    op_timeout: Duration,
) {
    let mut stream = None;
    let mut failures: u32 = 0;
    loop {
        let Some(s) = session.upgrade() else { return };
        let ttl = s.server_ttl;
        let interval = (ttl / 3).max(Duration::from_millis(100));
        let deadline = s.deadline();
        let lease_id = s.lease_id;
        drop(s);
        let sent_at = Instant::now();
        if sent_at >= deadline {
            if let Some(s) = session.upgrade() {
                s.lose("no keep-alive succeeded before the lease's local deadline");
                revoke_in_background(&client, lease_id, ttl);
            }
            return;
        }
        let budget = op_timeout.min(interval).min(deadline - sent_at);
        let outcome =
            tokio::time::timeout(budget, one_keep_alive(&client, &mut stream, lease_id)).await;
        let Some(s) = session.upgrade() else { return };
        match outcome {
            Ok(Ok(server_ttl)) if server_ttl > 0 => {
                let granted = u64::try_from(server_ttl)
                    .map(Duration::from_secs)
                    .unwrap_or(ttl)
                    .min(ttl);
                s.extend(validity_deadline(sent_at, granted));
                s.set_state(SessionState::Alive);
                failures = 0;
                drop(s);
                tokio::select! {
                    () = sleep_until(sent_at + interval) => {}
                    () = wake.notified() => {}
                }
            }
            Ok(Ok(_)) => {
                s.lose("the lease expired on the server (keep-alive answered TTL 0)");
                return;
            }
            Ok(Err(err)) if err.kind() == ErrorKind::LeaseLost => {
                s.lose(&format!("the lease is gone on the server: {err}"));
                return;
            }
            Ok(Err(err)) => {
                tracing::debug!(lease = %s.lease_hex(), %err, "keep-alive failed");
                stream = None;
                s.set_state(SessionState::Suspect);
                failures = failures.saturating_add(1);
                drop(s);
                let backoff = Duration::from_millis(25)
                    .saturating_mul(1 << failures.min(5))
                    .min(interval / 2);
                tokio::select! {
                    () = sleep(backoff.min(deadline.saturating_duration_since(Instant::now()))) => {}
                    () = wake.notified() => {}
                }
            }
            Err(_) => {
                tracing::debug!(lease = %s.lease_hex(), "keep-alive timed out");
                stream = None;
                s.set_state(SessionState::Suspect);
                failures = failures.saturating_add(1);
            }
        }
    }
}

/// Revokes a lease we gave up on, so that entries the server may still
/// keep (a lease outlives a leader change) vanish as soon as it is
/// reachable. Best effort, for a bounded time.
pub(crate) fn revoke_in_background(client: &Client, lease_id: i64, ttl: Duration) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let mut lease_client = client.lease_client();
    handle.spawn(async move {
        let give_up = Instant::now() + ttl.saturating_mul(3).max(Duration::from_secs(5));
        let mut delay = Duration::from_millis(50);
        while Instant::now() < give_up {
            match tokio::time::timeout(Duration::from_secs(1), lease_client.revoke(lease_id)).await
            {
                Ok(Ok(_)) => return,
                Ok(Err(err)) => {
                    if from_etcd(Operation::Release, err).kind() == ErrorKind::LeaseLost {
                        return;
                    }
                }
                Err(_) => {}
            }
            sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    });
}
