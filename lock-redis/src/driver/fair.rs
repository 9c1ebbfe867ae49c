//! The fair (FIFO) mutex (`fair=true`; one server, Sentinel, Cluster): a
//! try and a waiting acquire through the fair script of
//! `fair_scripts.rs`. The lease is a plain mutex lease (same lock key,
//! same counter), so renew / renew_many / release / inspect are the
//! mutex's.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{FencingToken, Lease, LockError, LockKey, Operation, OwnerId};
use tokio::time::Instant;

use super::attempt::{Attempt, Found, next_try};
use super::{Inner, RedisBackend};
use crate::error::NAME;
use crate::fair_scripts::{FAIR, FairNames};
use crate::scripts::{NodeGrant, parse_grant, pttl, ttl_ms};

/// Removes every trace of a fair acquire that did not end with a lease
/// (its queue entry, a grant whose answer was lost) unless disarmed, in
/// the background when dropped armed (a cancelled waiter, a deadline, an
/// error), so the next waiter does not wait out our entry lease.
struct Withdraw {
    inner: Arc<Inner>,
    names: FairNames,
    owner: String,
    armed: bool,
}

impl Withdraw {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let inner = self.inner.clone();
            let names = self.names.clone();
            let owner = std::mem::take(&mut self.owner);
            handle.spawn(async move {
                let _ = abandon(&inner, &names, &owner).await;
            });
        }
    }
}

async fn abandon(inner: &Inner, names: &FairNames, owner: &str) -> Result<redis::Value, LockError> {
    inner.nodes[0]
        .run(
            Operation::Release,
            inner.config.operation_timeout,
            move |mut conn| async move {
                conn.eval(
                    &FAIR.abandon,
                    &[&names.mutex.lock, &names.queue, &names.queue_expiry],
                    &[owner, &names.mutex.channel],
                )
                .await
            },
        )
        .await
}

impl RedisBackend {
    fn fair_names(&self, key: &LockKey) -> FairNames {
        FairNames::new(&self.inner.config.prefix, key)
    }

    fn fair_withdraw(&self, names: &FairNames, owner: OwnerId) -> Withdraw {
        Withdraw {
            inner: self.inner.clone(),
            names: names.clone(),
            owner: owner.to_hex(),
            armed: true,
        }
    }

    /// One fair acquire script call. `wait`: join the queue (or refresh our
    /// entry) with an entry lease that long when refused; `None` for a try.
    /// The same `owner` is sent by every attempt of one waiting acquire (it
    /// is the queue entry's id).
    #[allow(clippy::too_many_arguments)]
    async fn fair_attempt(
        &self,
        key: &LockKey,
        ttl: Duration,
        owner: OwnerId,
        names: &FairNames,
        wait: Option<Duration>,
        op: Operation,
        timeout: Duration,
    ) -> Result<Attempt, LockError> {
        let owner_hex = owner.to_hex();
        let ttl_text = ttl_ms(ttl);
        let wait_text = wait.map_or_else(|| "0".to_owned(), ttl_ms);
        let details = lock_core::HolderDetails::encode_current();
        let args = [
            owner_hex.as_str(),
            ttl_text.as_str(),
            wait_text.as_str(),
            names.mutex.channel.as_str(),
            details.as_str(),
        ];
        let mut keys = names.acquire_keys().to_vec();
        keys.extend(self.inner.floor.key_for(&names.mutex.counter));
        let keys = &keys;
        let sent_at = Instant::now();
        let value = self.inner.nodes[0]
            .run(op, timeout, |mut conn| async move {
                conn.eval(&FAIR.acquire, keys, &args).await
            })
            .await
            .map_err(|e| e.with_key(key))?;
        match parse_grant(&value).map_err(|e| e.with_key(key))? {
            NodeGrant::Granted(token) => {
                if self.inner.config.wait_replicas > 0
                    && let Err(err) = self.wait_replicas(op, timeout).await
                {
                    let _ = abandon(&self.inner, names, &owner_hex).await;
                    return Err(err.with_key(key));
                }
                let lease = Lease::granted(
                    key.clone(),
                    owner,
                    FencingToken::new(token),
                    ttl,
                    sent_at,
                    String::new(),
                )
                .map_err(|e| e.with_backend(NAME))?;
                Ok(Attempt::Granted(lease))
            }
            // -1: a foreign holder without TTL: re-check at the interval.
            NodeGrant::Held(-1) => Ok(Attempt::Held {
                retry_in: None,
                split: false,
            }),
            NodeGrant::Held(ms) => Ok(Attempt::Held {
                retry_in: Some(pttl(ms).unwrap_or(Duration::ZERO)),
                split: false,
            }),
        }
    }

    /// `try_acquire` in fair mode: granted only when the key is free and
    /// nobody waits for it. One round trip.
    pub(super) async fn try_acquire_fair(
        &self,
        key: &LockKey,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        let op = Operation::TryAcquire;
        let names = self.fair_names(key);
        let owner = OwnerId::random();
        // Armed until the answer is seen: a lost answer may hide a grant.
        let guard = self.fair_withdraw(&names, owner);
        let timeout = self.inner.config.operation_timeout;
        match self
            .fair_attempt(key, ttl, owner, &names, None, op, timeout)
            .await?
        {
            Attempt::Granted(lease) => {
                guard.disarm();
                Ok(Some(lease))
            }
            Attempt::Held { .. } => {
                guard.disarm();
                Ok(None)
            }
        }
    }

    /// `acquire` in fair mode: one try that also joins the queue when
    /// refused (on a free key with no waiters that try is the whole
    /// acquire, one round trip); then subscribe to the release channel and
    /// re-try on every notification, when the blocker's TTL (or the queue
    /// head's entry lease) ends, and at least every third of our own entry
    /// lease, which each attempt refreshes. The entry is withdrawn (in the
    /// background) when the acquire ends without a lease: at the deadline,
    /// on an error, or when the future is dropped.
    pub(super) async fn acquire_fair(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let names = self.fair_names(key);
        let owner = OwnerId::random();
        let guard = self.fair_withdraw(&names, owner);
        let result = self.wait_fair(key, ttl, deadline, owner, &names).await;
        if result.is_ok() {
            guard.disarm();
        }
        // Otherwise the guard withdraws our entry in the background (and
        // publishes, so the waiter behind us goes on at once): the caller
        // gets its `Contended` at the deadline, not one round trip later.
        result
    }

    async fn wait_fair(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
        owner: OwnerId,
        names: &FairNames,
    ) -> Result<Lease, LockError> {
        let op = Operation::Acquire;
        let entry = self.fair_entry_lease(ttl);
        let mut errors = None;
        let first = self
            .fair_attempt(
                key,
                ttl,
                owner,
                names,
                Some(entry),
                op,
                self.attempt_timeout(deadline),
            )
            .await;
        if let Found::Granted(lease) = self.found(key, first, deadline, &mut errors)? {
            return Ok(lease);
        }
        let watch = self
            .inner
            .notifier
            .watch(&names.mutex.channel, deadline)
            .await;
        let refresh = entry / 3;
        loop {
            // Registered before the attempt so a release in between wakes us.
            let notified = watch.notify().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let attempt = self
                .fair_attempt(
                    key,
                    ttl,
                    owner,
                    names,
                    Some(entry),
                    op,
                    self.attempt_timeout(deadline),
                )
                .await;
            let wait = match self.found(key, attempt, deadline, &mut errors)? {
                Found::Granted(lease) => return Ok(lease),
                Found::Wait(wait) => wait.min(refresh),
            };
            next_try(notified.as_mut(), wait, deadline, key).await?;
        }
    }

    /// How long a waiter's queue entry lives without a refresh: at most the
    /// lease's TTL and three re-check intervals (1.5 s by default), at
    /// least 30 ms. A waiter that died stops holding up the queue after it.
    pub(super) fn fair_entry_lease(&self, ttl: Duration) -> Duration {
        ttl.min(self.inner.config.recheck * 3)
            .max(Duration::from_millis(30))
    }
}
