//! Waiting for a read, write or permit grant: the waiter row, the
//! read-only look between attempts, the wake-ups, and the withdrawal of a
//! dropped or timed-out wait.

use std::time::Duration;

use lock_core::{ErrorKind, Lease, LeaseKind, LockError, LockKey, Operation, OwnerId, check_ttl};
use tokio::time::Instant;

use super::{
    HolderRow, Outcome, Request, Shared, WaiterRow, amounts, grantable, read_state, waiter_ttl,
};
use crate::config::{MIN_TTL, NAME};
use crate::connection::wake::{Wake, released_within};
use crate::connection::{ConnSet, retry_once};
use crate::dialect::binds::Bind;
use crate::error::timed;

impl Shared {
    /// A waiting acquire's look before its next grant transaction, read
    /// only and outside any transaction (on SQLite without the writer
    /// turn): `false` when the transaction would only refuse again and its
    /// waiter row (`waiter`, live) needs no refresh yet. Anything else
    /// (grantable, our row gone, another limit, expired holders to clean
    /// up) is `true`: the transaction decides.
    async fn worth_trying(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        waiter: i64,
    ) -> Result<bool, LockError> {
        let operation = Operation::Acquire;
        let conns = &self.inner.conns;
        let statement = &self.inner.shared.state;
        let (name, shape) = (key.as_str(), kind.shape().as_str());
        let (holders, waiters) = timed(&self.inner.config, operation, Some(key), async {
            retry_once!(read, conns, |conn| read_state(conn, statement, name, shape))
        })
        .await?;
        let ours_live = waiters.iter().any(|w| w.id == waiter && w.live);
        if !ours_live || holders.iter().any(|h| !h.live) {
            return Ok(true);
        }
        let live: Vec<&HolderRow> = holders.iter().collect();
        let (_, limit) = amounts(kind);
        let others = waiters.iter().filter(|w| w.live && w.id != waiter);
        if matches!(kind, LeaseKind::Permits { .. })
            && (live.iter().any(|h| h.limit != limit) || others.clone().any(|w| w.limit != limit))
        {
            return Ok(true);
        }
        let earlier: Vec<&WaiterRow> = others.filter(|w| w.id < waiter).collect();
        Ok(grantable(kind, &live, &earlier))
    }

    /// `acquire_kind` for read, write and permits: queued in the waiters
    /// table from the first refusal until granted, the deadline, or drop.
    pub(crate) async fn acquire_share(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let operation = Operation::Acquire;
        self.kind_error(kind, key, operation)?;
        check_ttl(ttl, MIN_TTL, operation).map_err(|e| e.with_key(key).with_backend(NAME))?;
        let owner = OwnerId::random();
        let owner_hex = owner.to_hex();
        let request = Request::once(key, kind, &owner_hex, ttl);
        let mut pacing = self.pacing();
        let mut queued = Queued::new(self, key);
        // When our waiter row was last written (it lives `waiter_ttl` from
        // then).
        let mut refreshed_at = Instant::now();
        let mut look_first = false;
        loop {
            // Subscribe before the attempt, so a release between a refusal
            // and the wait is not missed.
            let mut wakes = self.inner.waits.subscribe();
            // While our row is fresh, a read-only look spares a write
            // transaction (and on SQLite the file's write lock) that would
            // only refuse again.
            let skip = match queued.id {
                Some(id) if look_first && refreshed_at.elapsed() < waiter_ttl(ttl) / 3 => {
                    !self.worth_trying(key, kind, id).await?
                }
                _ => false,
            };
            look_first = true;
            if skip {
                self.wait_for_wake(&mut wakes, key, ttl, deadline, &mut pacing.backoff)
                    .await;
                if Instant::now() >= deadline {
                    // One last decision at the deadline.
                    look_first = false;
                }
                continue;
            }
            let sent_at = Instant::now();
            match self.attempt(request.queued(queued.id), operation).await? {
                Outcome::Granted(token) => {
                    // The grant's transaction deleted our waiter row.
                    queued.id = None;
                    return self
                        .share_lease(key, kind, owner, token, ttl, sent_at)
                        .await;
                }
                Outcome::Queued(id) => {
                    queued.id = id;
                    refreshed_at = sent_at;
                }
                // Its holders kept renewing at their expiry: still queued.
                Outcome::Retry => {}
                Outcome::Mismatch(in_use) => {
                    queued.withdraw().await;
                    return Err(Self::mismatch(key, kind, in_use, operation));
                }
            }
            if Instant::now() >= deadline {
                queued.withdraw().await;
                return Err(LockError::new(
                    ErrorKind::Contended,
                    operation,
                    format!("cannot take {kind} before the wait deadline"),
                )
                .with_key(key)
                .with_backend(NAME));
            }
            self.pace(&mut pacing, &mut wakes, key, ttl, deadline).await;
        }
    }

    /// A waiting acquire's pacing: the configured poll backoff, the
    /// listener not started yet.
    pub(crate) fn pacing(&self) -> Pacing {
        Pacing {
            backoff: self.inner.config.poll.backoff(),
            notified: self.inner.dialect.notified(),
            started_listener: false,
        }
    }

    /// Between a refused attempt and the next: the first time on a
    /// notified backend, starts the listener and returns at once (releases
    /// before it ran were not heard: the caller attempts again);
    /// otherwise sleeps as [`wait_for_wake`](Self::wait_for_wake) does.
    pub(crate) async fn pace(
        &self,
        pacing: &mut Pacing,
        wakes: &mut tokio::sync::broadcast::Receiver<Wake>,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) {
        if pacing.notified && !pacing.started_listener {
            self.inner.ensure_listener().await;
            pacing.started_listener = true;
            return;
        }
        self.wait_for_wake(wakes, key, ttl, deadline, &mut pacing.backoff)
            .await;
    }

    /// Sleeps until a wake-up for `key` (a release, a downgrade, a
    /// withdrawal), the next poll or re-check, or `deadline`; attempts come
    /// at least every third of the waiter row's TTL ([`waiter_ttl`]), so
    /// the row stays live.
    async fn wait_for_wake(
        &self,
        wakes: &mut tokio::sync::broadcast::Receiver<Wake>,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
        backoff: &mut lock_core::Backoff,
    ) {
        let config = &self.inner.config;
        let delay = if self.inner.dialect.notified() {
            config.recheck
        } else {
            backoff.next_delay().unwrap_or(config.poll.max)
        };
        let delay =
            delay.min(waiter_ttl(ttl) / 3) + lock_core::random_delay(Duration::from_millis(2));
        let until = (Instant::now() + delay).min(deadline);
        if released_within(wakes, key, until).await {
            *backoff = config.poll.backoff();
        }
    }

    /// Deletes waiter row `id` and wakes the key's waiters (the ones behind
    /// it may go now).
    async fn withdraw(&self, key: &LockKey, id: i64) {
        let shared = &self.inner.shared;
        let _ = self
            .holder_statement(
                key,
                &shared.delete_waiter,
                &[Bind::Int(id)],
                false,
                Operation::Acquire,
            )
            .await;
        match &shared.notify {
            Some(notify) => {
                let binds = [Bind::Text(&self.inner.channel), Bind::Text(key.as_str())];
                let _ = self
                    .holder_statement(key, notify, &binds, true, Operation::Acquire)
                    .await;
            }
            None => self.inner.waits.released(key.as_str()),
        }
    }
}

/// How a waiting acquire paces its attempts ([`Shared::pace`]).
pub(crate) struct Pacing {
    /// The poll backoff (reset by a wake-up for the key).
    backoff: lock_core::Backoff,
    /// Whether releases notify through the database (PostgreSQL).
    notified: bool,
    /// Whether the notification listener was started.
    started_listener: bool,
}

/// A waiting acquire's row in the waiters table: withdrawn when the
/// acquire gives up, and in the background when it is dropped.
pub(crate) struct Queued {
    pub(crate) backend: Shared,
    pub(crate) key: LockKey,
    pub(crate) id: Option<i64>,
}

impl Queued {
    /// Not queued yet, for `key` on `backend`.
    pub(crate) fn new(backend: &Shared, key: &LockKey) -> Self {
        Self {
            backend: backend.clone(),
            key: key.clone(),
            id: None,
        }
    }

    pub(crate) async fn withdraw(&mut self) {
        if let Some(id) = self.id.take() {
            self.backend.withdraw(&self.key, id).await;
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        // Dropped mid-wait (cancelled): withdraw in the background; without
        // a runtime the row expires with its TTL.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (backend, key) = (self.backend.clone(), self.key.clone());
            runtime.spawn(async move { backend.withdraw(&key, id).await });
        }
    }
}
