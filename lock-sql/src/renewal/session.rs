//! Session mode's keep-alives: one query per session, however many locks
//! it holds, that keeps the session from the server's idle timeout and
//! checks that it still holds one of them (a live session keeps its
//! locks: only its own unlock or its end frees them).

use std::sync::Arc;

use lock_core::{
    ErrorKind, Lease, LockError, Operation, RENEW_CONCURRENCY, check_ttl, renew_concurrently,
    results_in_order, validity_deadline,
};
use tokio::time::{Instant, timeout};

use crate::connection::session::{Sessions, closed_session, is_broken};
use crate::grants::session::{Held, HeldLocks};

/// Session mode's renewals.
pub(crate) struct SessionRenewal {
    inner: Arc<Sessions>,
    held: Arc<HeldLocks>,
}

/// The leases of one session: each one's index in the batch, its server
/// lock's id and its grant.
type Group = Vec<(usize, u128, Held)>;

/// What a session's keep-alive found, for each lease on it.
enum Kept {
    /// Alive: every lease's deadline counts from this send time.
    Sent(Instant),
    /// The session ended (or lost a lock): every lock on it is lost.
    Lost(String),
    /// No answer within the operation timeout, or a statement error: the
    /// locks may still be held.
    Failed(ErrorKind, String),
}

impl SessionRenewal {
    pub(crate) fn new(inner: Arc<Sessions>, held: Arc<HeldLocks>) -> Self {
        Self { inner, held }
    }

    /// One keep-alive per session holding any of `leases`.
    pub(crate) async fn renew(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        let name = self.inner.name;
        let mut results: Vec<Option<Result<Instant, LockError>>> =
            std::iter::repeat_with(|| None).take(leases.len()).collect();
        // Sessions in first-seen order, with the leases on each.
        let mut groups: Vec<(Held, Group)> = Vec::new();
        for (index, lease) in leases.iter().enumerate() {
            let key = lease.key();
            if let Err(err) = check_ttl(lease.ttl(), self.inner.min_ttl(), Operation::Renew) {
                results[index] = Some(Err(err.with_key(key).with_backend(name)));
                continue;
            }
            let id = self.inner.server_key(key).id();
            let Some(held) = self.held.find(id, lease) else {
                results[index] = Some(Err(self.not_held(
                    lease,
                    "not held by this backend (released, lost, another owner, or granted elsewhere)",
                )));
                continue;
            };
            match groups
                .iter_mut()
                .find(|(first, _)| Arc::ptr_eq(&first.conn, &held.conn))
            {
                Some((_, group)) => group.push((index, id, held)),
                None => groups.push((held.clone(), vec![(index, id, held)])),
            }
        }
        // One representative lease per session, kept alive concurrently.
        let firsts: Vec<&Lease> = groups.iter().map(|(_, group)| leases[group[0].0]).collect();
        let mut kept = Vec::with_capacity(groups.len());
        let answers = renew_concurrently(&firsts, RENEW_CONCURRENCY, |lease| {
            let first = groups
                .iter()
                .find(|(_, g)| std::ptr::eq(leases[g[0].0], lease))
                .map(|(first, _)| first.clone());
            async move {
                match first {
                    Some(first) => self.keep_alive(lease, &first).await,
                    None => Err(self.not_held(lease, "not held")),
                }
            }
        })
        .await;
        for answer in answers {
            kept.push(match answer {
                Ok(sent_at) => Kept::Sent(sent_at),
                Err(e) if e.is_lost() || e.is_not_held() => Kept::Lost(e.message().to_owned()),
                Err(e) => Kept::Failed(e.kind(), e.message().to_owned()),
            });
        }
        for ((_, group), kept) in groups.into_iter().zip(kept) {
            for (index, id, held) in group {
                let lease = leases[index];
                results[index] = Some(match &kept {
                    Kept::Sent(sent_at) => Ok(validity_deadline(*sent_at, lease.ttl())),
                    Kept::Lost(reason) => {
                        self.held.forget(id, &held);
                        Err(
                            LockError::new(ErrorKind::LeaseLost, Operation::Renew, reason.clone())
                                .with_key(lease.key())
                                .with_backend(name),
                        )
                    }
                    Kept::Failed(kind, message) => {
                        Err(LockError::new(*kind, Operation::Renew, message.clone())
                            .with_key(lease.key())
                            .with_backend(name))
                    }
                });
            }
        }
        results_in_order(results, name)
    }

    fn not_held(&self, lease: &Lease, why: &str) -> LockError {
        LockError::new(ErrorKind::NotHeld, Operation::Renew, why.to_owned())
            .with_key(lease.key())
            .with_backend(self.inner.name)
    }

    /// The keep-alive of the session of `first`, the grant of `lease`: its
    /// send time, or why not.
    async fn keep_alive(&self, lease: &Lease, first: &Held) -> Result<Instant, LockError> {
        let key = lease.key();
        let server_key = self.inner.server_key(key);
        let name = self.inner.name;
        let lost = |why: String| {
            LockError::new(ErrorKind::LeaseLost, Operation::Renew, why)
                .with_key(key)
                .with_backend(name)
        };
        let op_timeout = self.inner.config.op_timeout;
        let used = self
            .inner
            .this(&first.conn, Instant::now() + op_timeout)
            .await
            .map_err(|e| e.with_key(key).with_backend(name))?;
        let Some(mut used) = used else {
            return Err(lost("the lock's session has ended".to_owned()));
        };
        let conn = Arc::clone(&used.conn);
        used.clean_orphans(&self.inner, |k| self.held.held_on(&conn, k.id()))
            .await;
        if used.session().is_none() {
            return Err(lost("the lock's session has ended".to_owned()));
        }
        let sent_at = Instant::now();
        // A dropped or timed-out keep-alive is finished in the background
        // (see `connection::session`, "Abandoned statements"): the session
        // (and its locks) lives on until the server's idle timeout.
        let inner = Arc::clone(&self.inner);
        let armed = used.armed_ttl();
        let statement = self.inner.finish(
            armed,
            used.run(closed_session, async move |session| {
                session.holds(&inner.sql, &server_key).await
            }),
        );
        let (mut used, confirmed) = match timeout(op_timeout, statement).await {
            Ok(finished) => finished,
            Err(_) => {
                return Err(LockError::new(
                    ErrorKind::Timeout,
                    Operation::Renew,
                    "the keep-alive was not confirmed within the operation timeout",
                )
                .with_key(key)
                .with_backend(name));
            }
        };
        match confirmed {
            Ok(true) => Ok(sent_at),
            Ok(false) => {
                // Not its lock any more, though alive: its state is not
                // what we recorded, so none of its locks is trusted.
                let why = "the session no longer holds the lock";
                used.close(why);
                Err(lost(why.to_owned()))
            }
            Err(e) if is_broken(&e) => {
                let reason = format!(
                    "the lock's session ended: {}",
                    self.inner.config.scrub(&e.to_string())
                );
                used.close(&reason);
                Err(lost(reason))
            }
            Err(e) => Err(self.inner.err(Operation::Renew, key, e)),
        }
    }
}
