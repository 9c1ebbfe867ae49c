//! Session mode's keep-alives: a query on each lease's pinned session
//! that also checks the session still holds the lock.

use std::sync::Arc;

use lock_core::{
    ErrorKind, Lease, LockError, Operation, RENEW_CONCURRENCY, SessionState, check_ttl,
    renew_concurrently, validity_deadline,
};
use tokio::time::{Instant, timeout};

use crate::connection::session::{Sessions, is_broken};
use crate::grants::session::HeldLocks;

/// Session mode's renewals.
pub(crate) struct SessionRenewal {
    inner: Arc<Sessions>,
    held: Arc<HeldLocks>,
}

impl SessionRenewal {
    pub(crate) fn new(inner: Arc<Sessions>, held: Arc<HeldLocks>) -> Self {
        Self { inner, held }
    }

    /// One keep-alive per lease, each on its own pinned session.
    pub(crate) async fn renew(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        renew_concurrently(leases, RENEW_CONCURRENCY, |lease| self.renew_one(lease)).await
    }

    async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        let key = lease.key();
        let name = self.inner.name;
        let not_held = |why: &str| {
            LockError::new(ErrorKind::NotHeld, Operation::Renew, why.to_owned())
                .with_key(key)
                .with_backend(name)
        };
        check_ttl(lease.ttl(), self.inner.min_ttl(), Operation::Renew)
            .map_err(|e| e.with_key(key).with_backend(name))?;
        let Some(held) = self.held.find(lease) else {
            return Err(not_held(
                "not held by this backend (released, lost, another owner, or granted elsewhere)",
            ));
        };
        let mut slot = held.session.lock().await;
        let Some(pinned) = slot.as_mut() else {
            drop(slot);
            self.held.forget(lease);
            return Err(not_held("the lock's session has ended"));
        };
        let sent_at = Instant::now();
        // A dropped or timed-out keep-alive leaves the connection pinned:
        // sqlx drains the late reply before the next statement, and the
        // session (and the lock) lives on until the server's idle timeout.
        let confirmed = timeout(
            self.inner.config.op_timeout,
            pinned.session.holds(&self.inner.sql, &held.server_key),
        )
        .await;
        match confirmed {
            Ok(Ok(true)) => Ok(validity_deadline(sent_at, lease.ttl())),
            Ok(Ok(false)) => {
                let _ = pinned.session.state.send(SessionState::Lost(
                    "the session no longer holds the lock".into(),
                ));
                *slot = None;
                drop(slot);
                self.held.forget(lease);
                Err(not_held("the session no longer holds the lock"))
            }
            Ok(Err(e)) if is_broken(&e) => {
                let reason = format!(
                    "the lock's session ended: {}",
                    self.inner.config.scrub(&e.to_string())
                );
                let _ = pinned
                    .session
                    .state
                    .send(SessionState::Lost(reason.clone()));
                *slot = None;
                drop(slot);
                self.held.forget(lease);
                Err(
                    LockError::new(ErrorKind::LeaseLost, Operation::Renew, reason)
                        .with_key(key)
                        .with_backend(name),
                )
            }
            Ok(Err(e)) => Err(self.inner.err(Operation::Renew, key, e)),
            Err(_) => Err(LockError::new(
                ErrorKind::Timeout,
                Operation::Renew,
                "the keep-alive was not confirmed within the operation timeout",
            )
            .with_key(key)
            .with_backend(name)),
        }
    }
}
