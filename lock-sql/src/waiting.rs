//! Row mode's waiting grants of a mutex: tries paced by the release
//! notifications (PostgreSQL `LISTEN/NOTIFY`, this process's own releases
//! elsewhere) and a bounded re-check, letting the process's earlier waiters
//! go first (see `crate::connection::wake`); fair mode (`fair.rs`); and the
//! holder watch, woken by the same notifications.

mod fair;

use std::sync::Arc;
use std::time::Duration;

use lock_core::{
    ErrorKind, Lease, LockBackend, LockError, LockInfo, LockKey, Operation, WatchRequest, check_ttl,
};
use tokio::sync::broadcast::Receiver;
use tokio::time::Instant;

use crate::config::{MIN_TTL, NAME};
use crate::connection::table::Table;
use crate::connection::wake::{Wake, released_within, taken_within};
use crate::grants::Grants;
use crate::shared::Shared;

/// The error of a waiting grant that found the key held at its deadline.
fn still_held(key: &LockKey) -> LockError {
    LockError::new(
        ErrorKind::Contended,
        Operation::Acquire,
        "still held by another owner at the wait deadline",
    )
    .with_key(key)
    .with_backend(NAME)
}

/// Row mode's waiting mutex grants.
pub(crate) struct Waiting {
    inner: Arc<Table>,
    grants: Grants,
    /// The waiter queue fair mode shares with the shared kinds.
    shared: Shared,
}

impl Waiting {
    pub(crate) fn new(inner: Arc<Table>, grants: Grants, shared: Shared) -> Self {
        Self {
            inner,
            grants,
            shared,
        }
    }

    /// A mutex grant that waits until `deadline`.
    ///
    /// The first try is made here and the waiting, when it is refused, in
    /// a boxed future of its own: most acquires are granted at once, and
    /// their future then does not carry the waiting's state.
    pub(crate) async fn take_waiting(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        check_ttl(ttl, MIN_TTL, Operation::Acquire)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        if self.inner.config.fair {
            // Boxed: fair mode's future is large.
            return Box::pin(self.acquire_fair(key, ttl, deadline)).await;
        }
        // Waiters first (see `crate::connection::wake`): while clients of
        // this process wait for the key, a newcomer (typically the holder
        // that just released it) lets them go first instead of racing them
        // to the row.
        if self.inner.waits.has_waiters(key.as_str()) {
            return Box::pin(self.wait_for_grant(key, ttl, deadline, None)).await;
        }
        // Subscribed before trying, so a release between the refused try
        // and the wait is not missed.
        let wakes = self.inner.waits.subscribe();
        let tried = self
            .grants
            .try_marking(key, ttl, Operation::Acquire, None, None);
        if let Some(lease) = tried.await? {
            return Ok(lease);
        }
        if Instant::now() >= deadline {
            return Err(still_held(key));
        }
        Box::pin(self.wait_for_grant(key, ttl, deadline, Some(wakes))).await
    }

    /// The waiting of [`take_waiting`](Self::take_waiting): after a refused
    /// first try when `refused` holds the wake-ups subscribed before it;
    /// else (others of the process wait for the key) letting them go first.
    async fn wait_for_grant(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
        mut refused: Option<Receiver<Wake>>,
    ) -> Result<Lease, LockError> {
        let notified = self.inner.dialect.notified();
        let waits = &self.inner.waits;
        let poll = self.inner.config.poll;
        let mut backoff = poll.backoff();
        let mut started_listener = false;
        let mut behind_waiters = refused.is_none();
        let mut waiting = None;
        let mark_for = self.mark_for();
        loop {
            let (mut wakes, taken) = match refused.take() {
                Some(wakes) => (wakes, false),
                None => {
                    // Subscribe before trying, so a release between the
                    // failed try and the wait is not missed.
                    let mut wakes = waits.subscribe();
                    let let_waiters_go = behind_waiters;
                    behind_waiters = false;
                    // Until one of them takes the key (then no try: wait for
                    // its release like them), or one initial poll interval.
                    let taken = let_waiters_go
                        && taken_within(
                            &mut wakes,
                            key,
                            (Instant::now() + poll.initial).min(deadline),
                        )
                        .await;
                    if !let_waiters_go || !taken {
                        // After the first refusal, a try that marks the row
                        // waited for, so its release notifies (PostgreSQL).
                        let mark = (notified && waiting.is_some()).then_some(mark_for);
                        let tried =
                            self.grants
                                .try_marking(key, ttl, Operation::Acquire, None, mark);
                        if let Some(lease) = tried.await? {
                            if waiting.is_some() {
                                waits.taken(key.as_str());
                            }
                            return Ok(lease);
                        }
                        if Instant::now() >= deadline {
                            return Err(still_held(key));
                        }
                    }
                    (wakes, taken)
                }
            };
            // Counted as waiting from the first failed try on.
            waiting.get_or_insert_with(|| waits.wait_for(key.as_str()));
            let delay = if notified {
                if !started_listener {
                    // Boxed: starting the listener is a rare path with a
                    // large future, which would make every wait's large.
                    Box::pin(self.inner.ensure_listener()).await;
                    started_listener = true;
                    // Releases before the listener ran were not heard.
                    if !taken {
                        continue;
                    }
                }
                Box::pin(self.recheck_delay(key)).await
            } else {
                backoff.next_delay().unwrap_or(poll.max)
            };
            let wake_at = (Instant::now() + delay).min(deadline);
            if released_within(&mut wakes, key, wake_at).await {
                // Activity on the key: poll from short again.
                backoff = poll.backoff();
            }
        }
    }

    /// How long a waiter's mark lasts: past its next try, which comes
    /// within a re-check interval (and an operation's time) of the last.
    pub(super) fn mark_for(&self) -> Duration {
        let config = &self.inner.config;
        config.recheck.saturating_mul(2) + config.op_timeout
    }

    /// How long to sleep before re-trying, for a notified waiter: until the
    /// holder's expiry (read from the database clock), at most `recheck`.
    async fn recheck_delay(&self, key: &LockKey) -> Duration {
        let cap = self.inner.config.recheck;
        let remaining = match self.grants.inspect(key).await {
            Ok(Some(info)) => info.remaining_ttl.unwrap_or(cap),
            Ok(None) => Duration::ZERO,
            Err(_) => cap,
        };
        // A little jitter so that waiters do not all retry at once.
        remaining.min(cap) + lock_core::random_delay(Duration::from_millis(2))
    }

    /// `watch_holder` of `backend` (this table's): while the key is held,
    /// each read is preceded by a subscription to the process's release
    /// wake-ups (fed by PostgreSQL's `NOTIFY` from every process, and by
    /// this process's own releases on every database), so a release wakes
    /// the watch at once; `request.poll` still bounds each wait (an expiry, a grant
    /// of a free key and, on MariaDB/SQLite, another process's release are
    /// only seen by reading).
    pub(crate) async fn watch_holder<B: LockBackend>(
        &self,
        backend: &B,
        request: WatchRequest<'_, LockInfo>,
    ) -> Result<Option<LockInfo>, LockError> {
        if request.seen.is_none() {
            return lock_core::poll_holder(backend, request).await;
        }
        // Marked waited for, like a waiting acquire's row, so that the
        // release notifies; again before each wait, for as long as it may
        // last.
        let mark_for = request
            .poll
            .min(Duration::from_secs(3600))
            .max(self.mark_for());
        if self.inner.dialect.notified() {
            self.inner.ensure_listener().await;
            self.grants.mark_waited(request.key, mark_for).await;
        }
        lock_core::watch_holder_with(backend, request, || {
            // Subscribed before the read so a release in between wakes us.
            let mut wakes = self.inner.waits.subscribe();
            async move {
                self.grants.mark_waited(request.key, mark_for).await;
                loop {
                    match wakes.recv().await {
                        Ok(Wake::Released(released)) if &*released == request.key.as_str() => {
                            return;
                        }
                        Ok(Wake::All) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            }
        })
        .await
    }
}
