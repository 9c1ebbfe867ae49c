//! Waiting grants: the mutex's waiting acquire (a first try without the
//! notification machinery, then subscribe and re-try on every release and
//! at the holder's expiry), and the fair (FIFO) mutex of `fair=true`
//! (`fair.rs`); the loop itself is `retry.rs`.

pub(crate) mod fair;
pub(crate) mod retry;

use std::time::Duration;

use lock_core::{Lease, LockError, LockKey, Operation};
use tokio::time::Instant;

use crate::grants::attempt::Attempt;
use crate::grants::{Grants, check_ttl};
use retry::{Found, attempt_timeout, found, next_try};

/// The mutex's waiting acquires, and the fair mutex's tries.
#[derive(Clone)]
pub(crate) struct Waiting {
    grants: Grants,
}

impl Waiting {
    pub(crate) fn new(grants: Grants) -> Self {
        Self { grants }
    }

    /// A single try of the fair mutex: granted only when the key is free
    /// and nobody waits for it. One round trip.
    pub(crate) async fn try_fair(
        &self,
        key: &LockKey,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(ttl, Operation::TryAcquire, key)?;
        fair::try_acquire(&self.grants, key, ttl).await
    }

    /// A waiting acquire of the mutex (fair or not, as configured), until
    /// `deadline`.
    pub(crate) async fn take(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let op = Operation::Acquire;
        check_ttl(ttl, op, key)?;
        let servers = self.grants.servers();
        if servers.config.fair {
            // Boxed: its future is larger than the unfair one's, which
            // would carry its size (see `wait_for_release`).
            return Box::pin(fair::acquire(&self.grants, key, ttl, deadline)).await;
        }
        let config = &servers.config;
        // The backoff after errors, made on the first error (it seeds itself
        // from the OS generator: nothing to pay on the common path).
        let mut errors = None;
        // First try without the notification machinery: on a free key (the
        // common case) the waiting acquire costs what a single try costs,
        // one round trip, with no SUBSCRIBE before it nor UNSUBSCRIBE after.
        let first = self
            .grants
            .attempt(key, ttl, op, attempt_timeout(config, deadline))
            .await;
        if let Found::Granted(lease) = found(config, key, first, deadline, &mut errors)? {
            return Ok(lease);
        }
        // Boxed: the contended path (subscribing, the re-tries) is a large
        // future, kept out of the size of every waiting acquire's future
        // (copied whole into the box of `LockBackend::grant`).
        Box::pin(self.wait_for_release(key, ttl, deadline, errors)).await
    }

    /// The rest of [`take`](Self::take) after a first try found `key`
    /// held: subscribe to the release channel, then try again at once
    /// (the loop's first attempt), after the subscription is confirmed, so
    /// a release between the first try and the subscription is not
    /// missed; then on every release and at the holder's expiry.
    async fn wait_for_release(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
        mut errors: Option<lock_core::Backoff>,
    ) -> Result<Lease, LockError> {
        let op = Operation::Acquire;
        let servers = self.grants.servers();
        let config = &servers.config;
        let names = servers.keys.mutex(key, op)?;
        let watch = servers.notifier.watch(&names.channel, deadline).await;
        loop {
            // Registered before the attempt so a release in between wakes us.
            let notified = watch.notify().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let attempt: Result<Attempt, LockError> = self
                .grants
                .attempt(key, ttl, op, attempt_timeout(config, deadline))
                .await;
            let wait = match found(config, key, attempt, deadline, &mut errors)? {
                Found::Granted(lease) => return Ok(lease),
                Found::Wait(wait) => wait,
            };
            next_try(notified.as_mut(), wait, deadline, key).await?;
        }
    }
}
