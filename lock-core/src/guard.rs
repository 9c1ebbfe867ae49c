//! The guard users hold: renews on its own task and says when the lock is lost.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use crate::backend::LockBackend;
use crate::error::{ErrorKind, LockError, Operation};
use crate::key::LockKey;
use crate::options::RetryPolicy;
use crate::types::{FencingToken, Lease, OwnerId, SessionState};

/// Where a held lock stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockState {
    /// Held and renewed on time.
    Held,
    /// A renewal failed or the backend session is disconnected: the lock is
    /// still ours until its deadline, but may be lost. Retries continue.
    Suspect,
    /// No longer held (or no longer safe to act on): the reason says why.
    /// Fired no later than the local validity deadline, which comes before
    /// the server could give the key to anyone else.
    Lost(String),
    /// Given back by [`LockGuard::release`].
    Released,
}

impl LockState {
    /// `Lost` or `Released`: the lock must not be acted on.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Lost(_) | Self::Released)
    }
}

/// How the guard renews its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenewalPolicy {
    /// Renew at all. Without renewal the lock is lost at its deadline.
    pub enabled: bool,
    /// Time between renewals; `None` means a third of the TTL.
    pub interval: Option<Duration>,
    /// Stop renewing once the lock has been held this long (it then expires
    /// with its TTL and the guard reports it lost).
    pub max_hold: Option<Duration>,
    /// Stop renewing after this many renewals.
    pub max_renewals: Option<u64>,
    /// Backoff between failed renewal attempts (bounded by the deadline).
    pub retry: RetryPolicy,
}

impl Default for RenewalPolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: None,
            max_hold: None,
            max_renewals: None,
            retry: RetryPolicy {
                initial: Duration::from_millis(20),
                max: Duration::from_secs(1),
                multiplier: 2,
                max_attempts: None,
            },
        }
    }
}

struct Shared {
    lease: Mutex<Lease>,
    state: watch::Sender<LockState>,
}

impl Shared {
    fn lease(&self) -> Lease {
        self.lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_deadline(&self, deadline: Instant) {
        self.lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .set_validity_deadline(deadline);
    }

    /// Moves the state, never out of a terminal state.
    fn set_state(&self, next: LockState) {
        self.state.send_if_modified(|state| {
            if state.is_terminal() || *state == next {
                false
            } else {
                if let LockState::Lost(reason) = &next {
                    tracing::warn!(key = %self.lease().key(), %reason, "lock lost");
                }
                *state = next;
                true
            }
        });
    }
}

/// A held lock.
///
/// The guard renews its lease on its own task (about every TTL/3, see
/// [`RenewalPolicy`]), exposes the fencing token and the local validity
/// deadline, and reports [`LockState`] changes: `Held → Suspect → Lost`.
/// `Lost` fires no later than the local deadline when renewals keep failing,
/// and at once when the backend says the lease is gone.
///
/// Give it back with [`release`](Self::release). **Dropping** the guard stops
/// renewal and releases in the background on the current Tokio runtime: best
/// effort, with no way to observe failure (the lease then expires with its
/// TTL). Outside a runtime, drop only stops renewal.
pub struct LockGuard {
    backend: Arc<dyn LockBackend>,
    shared: Arc<Shared>,
    renewal: Option<JoinHandle<()>>,
    state_rx: watch::Receiver<LockState>,
    released: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("backend", &self.backend.name())
            .field("lease", &self.shared.lease())
            .field("state", &*self.state_rx.borrow())
            .finish()
    }
}

impl LockGuard {
    /// Wraps a fresh lease and starts its renewal task.
    ///
    /// Must be called within a Tokio runtime.
    pub fn new(backend: Arc<dyn LockBackend>, lease: Lease, policy: RenewalPolicy) -> Self {
        let (state_tx, state_rx) = watch::channel(LockState::Held);
        let shared = Arc::new(Shared {
            lease: Mutex::new(lease),
            state: state_tx,
        });
        let renewal = tokio::spawn(watchdog(backend.clone(), shared.clone(), policy));
        Self {
            backend,
            shared,
            renewal: Some(renewal),
            state_rx,
            released: false,
        }
    }

    /// The key.
    pub fn key(&self) -> LockKey {
        self.shared.lease().key().clone()
    }

    /// The fencing token of this grant: pass it to the protected resource.
    pub fn token(&self) -> FencingToken {
        self.shared.lease().token()
    }

    /// The owner id of this grant.
    pub fn owner(&self) -> OwnerId {
        self.shared.lease().owner()
    }

    /// The current local validity deadline (moves forward with renewals).
    pub fn validity_deadline(&self) -> Instant {
        self.shared.lease().validity_deadline()
    }

    /// A copy of the current lease (for handles and diagnostics).
    pub fn lease(&self) -> Lease {
        self.shared.lease()
    }

    /// The current state.
    pub fn state(&self) -> LockState {
        self.state_rx.borrow().clone()
    }

    /// Whether the lock is held and safe to act on right now: not lost and
    /// before its local deadline.
    pub fn is_held(&self) -> bool {
        !self.state_rx.borrow().is_terminal() && Instant::now() < self.validity_deadline()
    }

    /// A receiver of state changes, for callers that want to react
    /// themselves.
    pub fn subscribe(&self) -> watch::Receiver<LockState> {
        self.state_rx.clone()
    }

    /// Resolves when the lock is lost (or released), with the reason.
    ///
    /// # Cancel safety
    ///
    /// Safe: it only watches.
    pub async fn lost(&self) -> String {
        wait_terminal(self.state_rx.clone()).await
    }

    /// Runs `work` while the lock is held, and cancels it (drops it) as soon
    /// as the lock is lost.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LeaseLost`] when the lock was lost before `work` finished;
    /// `work` has then been dropped.
    ///
    /// # Cancel safety
    ///
    /// Dropping this future drops `work`; the lock stays held.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, LockError> {
        let rx = self.state_rx.clone();
        tokio::select! {
            biased;
            reason = wait_terminal(rx) => Err(self.lost_error(reason)),
            out = work => Ok(out),
        }
    }

    fn lost_error(&self, reason: String) -> LockError {
        LockError::new(ErrorKind::LeaseLost, Operation::Renew, reason)
            .with_key(self.shared.lease().key())
            .with_backend(self.backend.name())
    }

    /// Stops renewal and gives the lock back.
    ///
    /// Returns `Ok(true)` when we still held it, `Ok(false)` when it had
    /// already been lost or taken over (nothing of anyone else's was touched).
    ///
    /// # Errors
    ///
    /// The backend's release errors (timeout, unavailable); the lease then
    /// expires with its TTL.
    ///
    /// # Cancel safety
    ///
    /// Dropping this future after it started leaves the release in an
    /// unknown state; the lease expires with its TTL either way.
    pub async fn release(mut self) -> Result<bool, LockError> {
        self.released = true;
        if let Some(task) = self.renewal.take() {
            task.abort();
        }
        let lease = self.shared.lease();
        let result = self.backend.release(&lease).await;
        self.shared.set_state(LockState::Released);
        result
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(task) = self.renewal.take() {
            task.abort();
        }
        if self.released {
            return;
        }
        let lease = self.shared.lease();
        self.shared.set_state(LockState::Released);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let backend = self.backend.clone();
            handle.spawn(async move {
                if let Err(err) = backend.release(&lease).await {
                    tracing::debug!(key = %lease.key(), %err, "background release failed; the lease will expire");
                }
            });
        }
    }
}

async fn wait_terminal(mut rx: watch::Receiver<LockState>) -> String {
    loop {
        match &*rx.borrow_and_update() {
            LockState::Lost(reason) => return reason.clone(),
            LockState::Released => return "released".to_owned(),
            _ => {}
        }
        if rx.changed().await.is_err() {
            // The guard is gone: treat as released.
            return "guard dropped".to_owned();
        }
    }
}

/// The renewal task: renews every `interval`, retries with backoff on
/// temporary errors, and declares the lock lost at the local deadline at the
/// latest.
async fn watchdog(backend: Arc<dyn LockBackend>, shared: Arc<Shared>, policy: RenewalPolicy) {
    let start = Instant::now();
    let first = shared.lease();
    let interval = policy
        .interval
        .unwrap_or(first.ttl() / 3)
        .max(Duration::from_millis(1));
    let mut session = first.session().cloned();
    let mut renewals: u64 = 0;
    let mut backoff = policy.retry.backoff();
    let mut next_renewal = Some(start + interval).filter(|_| policy.enabled);
    let mut session_suspect = false;
    if let Some(rx) = &mut session {
        match rx.borrow_and_update().clone() {
            SessionState::Lost(reason) => {
                shared.set_state(LockState::Lost(format!("backend session lost: {reason}")));
                return;
            }
            SessionState::Suspect => {
                session_suspect = true;
                shared.set_state(LockState::Suspect);
            }
            SessionState::Alive => {}
        }
    }

    loop {
        let deadline = shared.lease().validity_deadline();
        // Stop renewing once a cap is reached: the lease then runs out.
        if let Some(at) = next_renewal {
            let capped_by_count = policy.max_renewals.is_some_and(|max| renewals >= max);
            let capped_by_hold = policy.max_hold.is_some_and(|max| at >= start + max);
            if capped_by_count || capped_by_hold {
                tracing::debug!(key = %first.key(), renewals, "renewal cap reached; the lease will run out");
                next_renewal = None;
            }
        }
        tokio::select! {
            biased;
            () = sleep_until(deadline) => {
                let reason = if next_renewal.is_none() && policy.enabled {
                    "the hold limit was reached and the lease ran out"
                } else if !policy.enabled {
                    "the lease ran out (renewal disabled)"
                } else {
                    "the lease's validity deadline passed before a renewal succeeded"
                };
                shared.set_state(LockState::Lost(reason.to_owned()));
                return;
            }
            changed = session_changed(&mut session) => {
                match changed {
                    SessionState::Lost(reason) => {
                        shared.set_state(LockState::Lost(format!("backend session lost: {reason}")));
                        return;
                    }
                    SessionState::Suspect => {
                        session_suspect = true;
                        shared.set_state(LockState::Suspect);
                    }
                    SessionState::Alive => {
                        session_suspect = false;
                        shared.set_state(LockState::Held);
                    }
                }
            }
            () = sleep_until_opt(next_renewal) => {
                let lease = shared.lease();
                let result = tokio::select! {
                    biased;
                    () = sleep_until(deadline) => continue,
                    result = backend.renew(&lease) => result,
                };
                match result {
                    Ok(new_deadline) => {
                        renewals += 1;
                        backoff = policy.retry.backoff();
                        shared.set_deadline(new_deadline);
                        if !session_suspect {
                            shared.set_state(LockState::Held);
                        }
                        next_renewal = Some(Instant::now() + interval);
                    }
                    Err(err) if matches!(err.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost) => {
                        shared.set_state(LockState::Lost(format!("renewal refused: {err}")));
                        return;
                    }
                    Err(err) => {
                        tracing::debug!(key = %lease.key(), %err, "renewal failed; retrying");
                        shared.set_state(LockState::Suspect);
                        let delay = backoff.next_delay().unwrap_or(interval);
                        next_renewal = Some(Instant::now() + delay);
                    }
                }
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn session_changed(session: &mut Option<watch::Receiver<SessionState>>) -> SessionState {
    match session {
        Some(rx) => match rx.changed().await {
            Ok(()) => rx.borrow_and_update().clone(),
            // The backend dropped its session sender: the session is over.
            Err(_) => SessionState::Lost("session closed".to_owned()),
        },
        None => std::future::pending().await,
    }
}
