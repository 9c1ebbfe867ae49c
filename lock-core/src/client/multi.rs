//! Multi-locks: several keys taken all or nothing, within one deadline,
//! behind one guard with one lost signal.
//!
//! Each key is a mutex of its own (so a multi-lock and a plain lock of one
//! of its keys exclude each other). The set is first asked for in one
//! atomic exchange where the backend has one
//! ([`LockBackendExt::try_acquire_all`](crate::LockBackendExt::try_acquire_all): one Lua script on keys of one Redis
//! slot, one etcd or SQL transaction), which is the whole cost on free
//! keys. When that is refused because a key is held (and the request
//! waits), or the backend has no such exchange, the keys are taken one
//! after another in one global order (sorted, duplicates removed), so two
//! clients locking overlapping sets never deadlock: whoever holds the
//! smallest contested key proceeds. All of it runs within the one
//! deadline. While a later key is waited for, the keys already granted are
//! renewed together, so none of them expires (and goes to someone else)
//! before the set is whole; a set with a key that ran out anyway is never
//! handed out. A set that is not taken whole leaves nothing behind: the
//! keys already granted are released, also when the acquire is cancelled
//! half way.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tracing::Instrument;

use crate::backend::LockBackend;
use crate::calls::LockBackendExt;
use crate::client::LockClient;
use crate::error::{ErrorKind, LockError, Operation};
use crate::guard::LockGuard;
use crate::hold::{LockState, RenewalPolicy};
use crate::key::LockKey;
use crate::options::{check_ttl, saturating_add};
use crate::types::{FencingToken, Lease};

/// The most keys one multi-lock may take.
pub const MAX_MULTI_KEYS: usize = 1024;

/// `keys` in the global order every multi-lock takes them in: sorted by
/// their text, duplicates removed.
pub fn lock_order(keys: &[LockKey]) -> Vec<LockKey> {
    let mut sorted = keys.to_vec();
    sorted.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    sorted.dedup();
    sorted
}

/// Releases leases when dropped unless disarmed: what a cancelled or
/// failed multi-acquire leaves is given back (in the background when
/// dropped half way).
struct Partial {
    backend: Arc<dyn LockBackend>,
    leases: Vec<Lease>,
}

impl Partial {
    /// Gives back every lease now (for a failure seen in the call).
    async fn release_all(&mut self) {
        for lease in std::mem::take(&mut self.leases) {
            if let Err(err) = self.backend.release(&lease).await {
                tracing::debug!(key = %lease.key(), %err, "releasing a partial multi-lock failed; the lease will expire");
            }
        }
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if self.leases.is_empty() {
            return;
        }
        let leases = std::mem::take(&mut self.leases);
        let backend = self.backend.clone();
        // Outside a runtime the leases expire with their TTL.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                for lease in leases {
                    let _ = backend.release(&lease).await;
                }
            });
        }
    }
}

/// A request for several keys at once, made by [`LockClient::lock_all`].
#[derive(Debug)]
#[must_use = "a lock request does nothing until acquired"]
pub struct MultiRequest<'a> {
    client: &'a LockClient,
    keys: Result<Vec<LockKey>, LockError>,
    ttl: Duration,
    wait: Duration,
    renewal: RenewalPolicy,
}

impl<'a> MultiRequest<'a> {
    pub(crate) fn new<I, K>(client: &'a LockClient, keys: I) -> Self
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        let keys = keys
            .into_iter()
            .map(|k| LockKey::new(k.as_ref()))
            .collect::<Result<Vec<_>, _>>();
        let defaults = client.defaults();
        Self {
            client,
            keys,
            ttl: defaults.ttl,
            wait: defaults.wait,
            renewal: defaults.renewal,
        }
    }

    lease_setters!();

    /// Takes every key or none, within the request's wait.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for a bad key or TTL, no keys, or more
    /// than [`MAX_MULTI_KEYS`]; [`ErrorKind::Contended`] when the set could
    /// not be had in time; [`ErrorKind::LeaseLost`] when a key already
    /// granted was lost, or ran out because its renewals failed, while a
    /// later key was waited for; backend errors. In every error case no key
    /// of the set is left held by this request.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future releases whatever it had taken (in the
    /// background) and withdraws the pending request.
    pub async fn acquire(self) -> Result<MultiGuard, LockError> {
        let backend = self.client.backend().name();
        let span = tracing::debug_span!(
            "distlock.lock_all",
            backend,
            keys = tracing::field::Empty,
            ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX),
            wait_ms = u64::try_from(self.wait.as_millis()).unwrap_or(u64::MAX),
            tokens = tracing::field::Empty,
            owner = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        if let (false, Ok(keys)) = (span.is_disabled(), &self.keys) {
            let keys: Vec<&str> = keys.iter().map(LockKey::as_str).collect();
            span.record("keys", tracing::field::display(keys.join(",")));
        }
        let result = self.take().instrument(span.clone()).await;
        if !span.is_disabled() {
            match &result {
                Ok(set) => {
                    let tokens: Vec<String> = set
                        .guards
                        .iter()
                        .map(|g| g.token().get().to_string())
                        .collect();
                    span.record("tokens", tracing::field::display(tokens.join(",")));
                    if let Some(first) = set.guards.first() {
                        span.record("owner", tracing::field::display(first.owner().to_hex()));
                    }
                    span.record("outcome", "granted");
                }
                Err(e) => {
                    span.record("outcome", tracing::field::display(e.kind()));
                }
            }
        }
        result
    }

    /// [`acquire`](Self::acquire) without its span.
    async fn take(self) -> Result<MultiGuard, LockError> {
        let backend = self.client.backend().clone();
        let keys = self.keys?;
        if keys.is_empty() || keys.len() > MAX_MULTI_KEYS {
            return Err(LockError::invalid_argument(
                Operation::Validate,
                format!(
                    "a multi-lock takes 1 to {MAX_MULTI_KEYS} keys, got {}",
                    keys.len()
                ),
            )
            .with_backend(backend.name()));
        }
        check_ttl(self.ttl, backend.capabilities().min_ttl, Operation::Acquire)
            .map_err(|e| e.with_backend(backend.name()))?;
        self.renewal
            .validate(self.ttl)
            .map_err(|e| e.with_backend(backend.name()))?;
        let deadline = saturating_add(Instant::now(), self.wait);
        let mut partial = Partial {
            backend: backend.clone(),
            leases: Vec::with_capacity(keys.len()),
        };
        let ordered = lock_order(&keys);
        match backend.try_acquire_all(&ordered, self.ttl).await {
            Ok(Some(leases)) => {
                partial.leases = leases;
                return Ok(guard_set(self.client, &self.renewal, &mut partial));
            }
            Ok(None) if self.wait.is_zero() => {
                return Err(LockError::new(
                    ErrorKind::Contended,
                    Operation::TryAcquire,
                    "a key of the set is held by another owner",
                )
                .with_key(&ordered[0])
                .with_backend(backend.name()));
            }
            Ok(None) => {}
            Err(err) if err.kind() == ErrorKind::Unsupported => {}
            Err(err) => return Err(err),
        }
        for key in ordered {
            let granted = if self.wait.is_zero() {
                backend.try_acquire(&key, self.ttl).await.and_then(|found| {
                    found.ok_or_else(|| {
                        LockError::new(
                            ErrorKind::Contended,
                            Operation::TryAcquire,
                            "a key of the set is held by another owner",
                        )
                        .with_key(&key)
                        .with_backend(backend.name())
                    })
                })
            } else {
                let wait = backend.acquire(&key, self.ttl, deadline);
                keeping_held(
                    &*backend,
                    &key,
                    self.ttl,
                    &self.renewal,
                    &mut partial.leases,
                    wait,
                )
                .await
            };
            match granted {
                Ok(lease) => partial.leases.push(lease),
                Err(err) => {
                    partial.release_all().await;
                    return Err(err);
                }
            }
        }
        // A key taken first may have run out while a later one was
        // granted (its renewals failing): such a set is never handed out.
        if let Some(lapsed) = partial
            .leases
            .iter()
            .find(|l| l.validity_deadline() <= Instant::now())
        {
            let err = LockError::new(
                ErrorKind::LeaseLost,
                Operation::Acquire,
                "a key of the set ran out (its renewals failed) before the last key was granted",
            )
            .with_key(lapsed.key())
            .with_backend(backend.name());
            partial.release_all().await;
            return Err(err);
        }
        Ok(guard_set(self.client, &self.renewal, &mut partial))
    }

    /// Tries once; `Ok(None)` when a key of the set is held.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), but never `Contended`.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(self) -> Result<Option<MultiGuard>, LockError> {
        match self.wait(Duration::ZERO).acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(err) if err.is_contended() => Ok(None),
            Err(err) => Err(err),
        }
    }
}

/// Waits for `wait` (the waiting acquire of `key`, the next key of a set)
/// while keeping `held` (the keys of the set already granted) alive: they
/// are renewed together ([`LockBackend::renew_many`]) on the schedule a
/// guard would use, so none expires on the server while a later key is
/// still held by someone else. Fails with [`ErrorKind::LeaseLost`] (and
/// drops `wait`, which withdraws the request) when a held key is no longer
/// ours or runs out because its renewals kept failing.
///
/// The keys are renewed even under [`MultiRequest::no_renewal`]: the set
/// is not granted until it is whole, and that policy is about the guard.
async fn keeping_held(
    backend: &dyn LockBackend,
    key: &LockKey,
    ttl: Duration,
    renewal: &RenewalPolicy,
    held: &mut [Lease],
    wait: impl Future<Output = Result<Lease, LockError>>,
) -> Result<Lease, LockError> {
    if held.is_empty() {
        return wait.await;
    }
    let lost = |held: &Lease, why: String| {
        LockError::new(ErrorKind::LeaseLost, Operation::Acquire, why)
            .with_key(held.key())
            .with_backend(backend.name())
    };
    // As a guard schedules it: `interval` after the request that set the
    // earliest deadline was sent.
    let interval = renewal.interval.unwrap_or(ttl / 3);
    let lead = ttl.saturating_sub(interval);
    let retry = (interval / 4).max(Duration::from_millis(5));
    let earliest = |held: &[Lease]| {
        held.iter()
            .map(Lease::validity_deadline)
            .min()
            .unwrap_or_else(Instant::now)
    };
    let mut next_renewal = earliest(held)
        .checked_sub(lead)
        .unwrap_or_else(Instant::now);
    tokio::pin!(wait);
    loop {
        let expires = earliest(held);
        let ran_out = |held: &[Lease]| {
            let lapsed = held
                .iter()
                .find(|l| l.validity_deadline() <= expires)
                .unwrap_or(&held[0]);
            lost(
                lapsed,
                format!(
                    "{} ran out (its renewals failed) while the multi-lock waited for {key}",
                    lapsed.key()
                ),
            )
        };
        tokio::select! {
            biased;
            granted = &mut wait => return granted,
            () = sleep_until(expires) => return Err(ran_out(held)),
            () = sleep_until(next_renewal) => {}
        }
        let renewed = {
            let refs: Vec<&Lease> = held.iter().collect();
            tokio::select! {
                biased;
                granted = &mut wait => return granted,
                renewed = backend.renew_many(&refs) => renewed,
                () = sleep_until(expires) => return Err(ran_out(held)),
            }
        };
        let mut all_renewed = true;
        for (lease, result) in held.iter_mut().zip(renewed) {
            match result {
                Ok(until) => lease.set_validity_deadline(until),
                Err(e) if matches!(e.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost) => {
                    let why = format!(
                        "{} was lost while the multi-lock waited for {key}: {}",
                        lease.key(),
                        e.message()
                    );
                    return Err(lost(lease, why).with_source(e));
                }
                Err(e) => {
                    tracing::debug!(key = %lease.key(), %e, "renewing a partial multi-lock failed; retrying");
                    all_renewed = false;
                }
            }
        }
        next_renewal = if all_renewed {
            earliest(held)
                .checked_sub(lead)
                .unwrap_or_else(Instant::now)
        } else {
            Instant::now() + retry
        };
    }
}

/// The guard of a whole granted set (renewal starts for every key).
fn guard_set(client: &LockClient, renewal: &RenewalPolicy, partial: &mut Partial) -> MultiGuard {
    let guards = std::mem::take(&mut partial.leases)
        .into_iter()
        .map(|lease| client.guard_for(lease, renewal))
        .collect();
    MultiGuard { guards }
}

/// Several held locks behind one guard: renewed together, one state (the
/// worst of its keys'), one lost signal (the first key lost), one release.
#[derive(Debug)]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The keys, in lock order.
    pub fn keys(&self) -> Vec<LockKey> {
        self.guards.iter().map(LockGuard::key).collect()
    }

    /// Each key's fencing token, in lock order.
    pub fn tokens(&self) -> Vec<(LockKey, FencingToken)> {
        self.guards.iter().map(|g| (g.key(), g.token())).collect()
    }

    /// Each key's guard, in lock order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The worst state of any key: `Lost` if one is lost, else `Suspect`
    /// if one is suspect, else `Held` (`Released` once released).
    pub fn state(&self) -> LockState {
        let mut worst = LockState::Held;
        for guard in &self.guards {
            match guard.state() {
                lost @ LockState::Lost(_) => return lost,
                LockState::Released => worst = LockState::Released,
                LockState::Suspect if worst == LockState::Held => worst = LockState::Suspect,
                _ => {}
            }
        }
        worst
    }

    /// Whether every key is held and safe to act on right now.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Resolves when any key is lost (or released), with its reason.
    ///
    /// # Cancel safety
    ///
    /// Safe: it only watches.
    pub async fn lost(&self) -> String {
        let waits: Vec<_> = self
            .guards
            .iter()
            .map(|g| Box::pin(async move { format!("{}: {}", g.key(), g.lost().await) }))
            .collect();
        if waits.is_empty() {
            return "no keys".to_owned();
        }
        first_of(waits).await
    }

    /// Runs `work` while every key is held, and drops it as soon as one is
    /// lost.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LeaseLost`] when a key was lost before `work` finished.
    ///
    /// # Cancel safety
    ///
    /// Dropping this future drops `work`; the locks stay held.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, LockError> {
        tokio::select! {
            biased;
            reason = self.lost() => Err(LockError::new(ErrorKind::LeaseLost, Operation::Renew, reason)),
            out = work => Ok(out),
        }
    }

    /// Releases every key (in reverse lock order). Returns `Ok(true)` when
    /// every key was still ours.
    ///
    /// # Errors
    ///
    /// The first release error; the other keys are still released, and a
    /// key whose release failed expires with its TTL.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after it started leaves the remaining keys to
    /// the guards' drop (released in the background).
    pub async fn release(mut self) -> Result<bool, LockError> {
        let mut all_held = true;
        let mut first_err = None;
        while let Some(guard) = self.guards.pop() {
            match guard.release().await {
                Ok(held) => all_held &= held,
                Err(err) => {
                    first_err.get_or_insert(err);
                }
            }
        }
        match first_err {
            Some(err) => Err(err),
            None => Ok(all_held),
        }
    }
}

/// The output of whichever future finishes first.
async fn first_of<F: Future + Unpin>(mut futures: Vec<F>) -> F::Output {
    std::future::poll_fn(|cx| {
        for fut in &mut futures {
            if let std::task::Poll::Ready(out) = std::pin::Pin::new(fut).poll(cx) {
                return std::task::Poll::Ready(out);
            }
        }
        std::task::Poll::Pending
    })
    .await
}
