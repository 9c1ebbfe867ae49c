//! The guard users hold: renews on its own task and says when the lock is lost.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use crate::backend::LockBackend;
use crate::error::{ErrorKind, LockError, Operation};
use crate::key::LockKey;
use crate::options::{RetryPolicy, saturating_add};
use crate::runtime::RenewalRuntime;
use crate::types::{FencingToken, Lease, OwnerId, SessionState, clock_drift};

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
///
/// Any value is safe to hand to [`LockGuard::new`] (durations up to
/// `Duration::MAX` saturate to "never" instead of overflowing); lock
/// requests additionally refuse nonsense with [`validate`](Self::validate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenewalPolicy {
    /// Renew at all. Without renewal the lock is lost at its deadline.
    pub enabled: bool,
    /// How much of the TTL may pass before a renewal is sent; `None` means
    /// a third of the TTL. Each renewal is scheduled from the lease's
    /// current validity deadline: at `deadline - (ttl - interval)`, i.e.
    /// `interval` after the request that set that deadline was sent (minus
    /// the drift allowance), and never earlier than now. A grant whose reply
    /// was slow is therefore renewed early, not `interval` after the reply.
    pub interval: Option<Duration>,
    /// Stop renewing once the lock has been held this long (it then expires
    /// with its TTL and the guard reports it lost).
    pub max_hold: Option<Duration>,
    /// Stop renewing after this many renewals.
    pub max_renewals: Option<u64>,
    /// Backoff between failed renewal attempts (bounded by the deadline).
    pub retry: RetryPolicy,
}

impl RenewalPolicy {
    /// Checks the policy against the TTL it will renew: an `interval` must
    /// be positive and shorter than the lease's validity (`ttl` minus the
    /// drift allowance, or the first renewal would come after the deadline),
    /// and the retry policy must pass [`RetryPolicy::validate`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] naming the field.
    pub fn validate(&self, ttl: Duration) -> Result<(), LockError> {
        if let Some(interval) = self.interval {
            let validity = ttl.saturating_sub(clock_drift(ttl));
            if interval.is_zero() || interval >= validity {
                return Err(LockError::invalid_argument(
                    Operation::Validate,
                    format!(
                        "renewal interval {interval:?} must be positive and shorter than the \
                         lease's validity of {validity:?} (TTL {ttl:?} minus drift)"
                    ),
                ));
            }
        }
        self.retry.validate()
    }
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
    /// Set before the renewal task is stopped on purpose (release, drop):
    /// any other end of that task means the lock can no longer be trusted.
    released: AtomicBool,
    /// Why the deadline will pass without renewal, once the watchdog knows
    /// (a cap reached, renewal disabled), so a `Lost` declared by a look at
    /// the state carries the same reason as one declared by the watchdog.
    expiry_reason: Mutex<Option<&'static str>>,
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

    /// The state, turned `Lost` first if the deadline passed while it still
    /// said otherwise (the renewal task may be starved, e.g. it shares a
    /// runtime the application is blocking).
    fn checked_state(&self) -> LockState {
        let state = self.state.borrow().clone();
        if state.is_terminal() || Instant::now() < self.lease().validity_deadline() {
            return state;
        }
        let hint = *self
            .expiry_reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let reason = match (hint, &state) {
            (Some(reason), _) => reason,
            (None, LockState::Suspect) => RENEWAL_FAILED,
            (None, _) => {
                "the lease's validity deadline passed with no renewal in time (a renewal still \
                 in flight, or a starved renewal task: is its runtime blocked?)"
            }
        };
        self.set_state(LockState::Lost(reason.to_owned()));
        self.state.borrow().clone()
    }

    fn set_expiry_reason(&self, reason: &'static str) {
        *self
            .expiry_reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(reason);
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
/// The renewal task runs on a [`RenewalRuntime`]: by default a dedicated
/// thread, so that an application blocking its own runtime does not starve
/// it (see [`RenewalRuntime`] for what that does and does not cover with
/// network backends). Whatever runtime it runs on, any end of that task
/// other than [`release`](Self::release) or drop (a panic in the backend,
/// its runtime shutting down) turns the state `Lost` at once, and the
/// state reads `Lost` as soon as the deadline has passed, even if the
/// renewal task has not run since.
///
/// Give it back with [`release`](Self::release). **Dropping** the guard stops
/// renewal and releases in the background on the current Tokio runtime (or,
/// outside one, on the dedicated renewal runtime if the guard renews there):
/// best effort, with no way to observe failure (the lease then expires with
/// its TTL). Otherwise drop only stops renewal.
pub struct LockGuard {
    backend: Arc<dyn LockBackend>,
    shared: Arc<Shared>,
    renewal: Option<JoinHandle<()>>,
    /// Where a drop outside any runtime can still release (the dedicated
    /// renewal runtime, when the watchdog runs there).
    fallback: Option<Handle>,
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
    /// Wraps a fresh lease and starts its renewal task on the default
    /// [`RenewalRuntime`] (the dedicated renewal thread).
    ///
    /// Works inside or outside a Tokio runtime.
    pub fn new(backend: Arc<dyn LockBackend>, lease: Lease, policy: RenewalPolicy) -> Self {
        Self::with_runtime(backend, lease, policy, &RenewalRuntime::default())
    }

    /// Wraps a fresh lease and starts its renewal task on `runtime`.
    ///
    /// Should no runtime be available at all (`current` outside a runtime
    /// and the dedicated thread unable to start), the guard cannot renew
    /// and starts out `Lost`.
    pub fn with_runtime(
        backend: Arc<dyn LockBackend>,
        lease: Lease,
        policy: RenewalPolicy,
        runtime: &RenewalRuntime,
    ) -> Self {
        let (state_tx, state_rx) = watch::channel(LockState::Held);
        let shared = Arc::new(Shared {
            lease: Mutex::new(lease),
            state: state_tx,
            released: AtomicBool::new(false),
            expiry_reason: Mutex::new(None),
        });
        let renewal = match runtime.handle() {
            Some(handle) => {
                // Moved into the task's future before it first runs, so even
                // a task dropped unpolled (its runtime shutting down) says so.
                let supervisor = LostUnlessReleased(shared.clone());
                let task = watchdog(backend.clone(), shared.clone(), policy);
                Some(handle.spawn(async move {
                    let _supervisor = supervisor;
                    task.await;
                }))
            }
            None => {
                shared.set_state(LockState::Lost(
                    "cannot renew: no Tokio runtime to run the renewal task on".to_owned(),
                ));
                None
            }
        };
        let fallback = runtime.is_dedicated().then(|| runtime.handle()).flatten();
        Self {
            backend,
            shared,
            renewal,
            fallback,
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

    /// The current state. Once the local validity deadline has passed it is
    /// `Lost`, even if the renewal task has not had a chance to say so.
    pub fn state(&self) -> LockState {
        self.shared.checked_state()
    }

    /// Whether the lock is held and safe to act on right now: not lost and
    /// before its local deadline.
    pub fn is_held(&self) -> bool {
        !self.shared.checked_state().is_terminal()
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
        wait_terminal(&self.shared, self.state_rx.clone()).await
    }

    /// Runs `work` while the lock is held, and cancels it (drops it) as soon
    /// as the lock is lost, or its local deadline passes: `work` is not
    /// polled again after that, even if the renewal task has been starved.
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
            reason = wait_terminal(&self.shared, rx) => Err(self.lost_error(reason)),
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
        self.shared.released.store(true, Ordering::SeqCst);
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
        self.shared.released.store(true, Ordering::SeqCst);
        if let Some(task) = self.renewal.take() {
            task.abort();
        }
        if self.released {
            return;
        }
        let lease = self.shared.lease();
        self.shared.set_state(LockState::Released);
        if let Some(handle) = Handle::try_current().ok().or_else(|| self.fallback.clone()) {
            let backend = self.backend.clone();
            handle.spawn(async move {
                if let Err(err) = backend.release(&lease).await {
                    tracing::debug!(key = %lease.key(), %err, "background release failed; the lease will expire");
                }
            });
        }
    }
}

/// Resolves at the first terminal state, or when the local deadline passes
/// (which it then records as `Lost`): a starved renewal task cannot keep a
/// waiter believing in an expired lease.
async fn wait_terminal(shared: &Shared, mut rx: watch::Receiver<LockState>) -> String {
    loop {
        rx.borrow_and_update();
        match shared.checked_state() {
            LockState::Lost(reason) => return reason,
            LockState::Released => return "released".to_owned(),
            _ => {}
        }
        // Timers need a Tokio runtime; elsewhere only the watch is awaited
        // (the renewal task still fires `Lost` at the deadline).
        let deadline = Handle::try_current()
            .is_ok()
            .then(|| shared.lease().validity_deadline());
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    // The guard is gone: treat as released.
                    return "guard dropped".to_owned();
                }
            }
            // Renewals move the deadline without a state change: re-read it.
            () = sleep_until_opt(deadline) => {}
        }
    }
}

/// Lives inside the renewal task: if the task ends in any way other than a
/// deliberate stop (a panic unwinding through it, its runtime shutting down
/// and dropping it), the lock is declared lost rather than left `Held` with
/// nobody renewing it.
struct LostUnlessReleased(Arc<Shared>);

impl Drop for LostUnlessReleased {
    fn drop(&mut self) {
        if self.0.released.load(Ordering::SeqCst) {
            return;
        }
        let reason = if std::thread::panicking() {
            "the renewal task panicked"
        } else {
            "the renewal task stopped (its runtime shut down)"
        };
        self.0.set_state(LockState::Lost(reason.to_owned()));
    }
}

const RENEWAL_FAILED: &str = "the lease's validity deadline passed before a renewal succeeded";
const HOLD_LIMIT: &str = "the hold limit was reached and the lease ran out";
const NOT_RENEWED: &str = "the lease ran out (renewal disabled)";

/// When to renew a lease valid until `deadline`: once `interval` of its
/// `ttl` has passed since the request that set the deadline, i.e. at
/// `deadline - (ttl - interval)`, never earlier than `now`. Saturates.
fn renewal_at(deadline: Instant, ttl: Duration, interval: Duration, now: Instant) -> Instant {
    let at = match ttl.checked_sub(interval) {
        Some(ahead) => deadline.checked_sub(ahead).unwrap_or(now),
        None => saturating_add(deadline, interval - ttl),
    };
    at.max(now)
}

/// The renewal task: renews every `interval`, retries with backoff on
/// temporary errors, and declares the lock lost at the local deadline at the
/// latest.
async fn watchdog(backend: Arc<dyn LockBackend>, shared: Arc<Shared>, policy: RenewalPolicy) {
    let start = Instant::now();
    let first = shared.lease();
    let ttl = first.ttl();
    let interval = policy
        .interval
        .unwrap_or(ttl / 3)
        .max(Duration::from_millis(1));
    let hold_until = policy.max_hold.map(|max| saturating_add(start, max));
    let mut session = first.session().cloned();
    let mut renewals: u64 = 0;
    let mut backoff = policy.retry.backoff();
    let mut next_renewal = Some(renewal_at(first.validity_deadline(), ttl, interval, start))
        .filter(|_| policy.enabled);
    if !policy.enabled {
        shared.set_expiry_reason(NOT_RENEWED);
    }
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
        // Someone else (a look at the state past the deadline) already
        // declared the lock lost: nothing left to renew.
        if shared.state.borrow().is_terminal() {
            return;
        }
        let deadline = shared.lease().validity_deadline();
        // Stop renewing once a cap is reached: the lease then runs out.
        if let Some(at) = next_renewal {
            let capped_by_count = policy.max_renewals.is_some_and(|max| renewals >= max);
            let capped_by_hold = hold_until.is_some_and(|until| at >= until);
            if capped_by_count || capped_by_hold {
                tracing::debug!(key = %first.key(), renewals, "renewal cap reached; the lease will run out");
                shared.set_expiry_reason(HOLD_LIMIT);
                next_renewal = None;
            }
        }
        tokio::select! {
            biased;
            () = sleep_until(deadline) => {
                let reason = if next_renewal.is_none() && policy.enabled {
                    HOLD_LIMIT
                } else if !policy.enabled {
                    NOT_RENEWED
                } else {
                    RENEWAL_FAILED
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
                        renewals = renewals.saturating_add(1);
                        backoff = policy.retry.backoff();
                        shared.set_deadline(new_deadline);
                        if !session_suspect {
                            shared.set_state(LockState::Held);
                        }
                        let now = Instant::now();
                        // A backend may cap the deadline below a full TTL
                        // (etcd: the session lease's own deadline until the
                        // next keep-alive): the schedule would then ask for
                        // a renewal at once, again and again. Leave a gap:
                        // a quarter of the interval, or half the time left.
                        let gap = (interval / 4).min(new_deadline.saturating_duration_since(now) / 2);
                        next_renewal = Some(
                            renewal_at(new_deadline, ttl, interval, now).max(saturating_add(now, gap)),
                        );
                    }
                    Err(err) if matches!(err.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost) => {
                        shared.set_state(LockState::Lost(format!("renewal refused: {err}")));
                        return;
                    }
                    Err(err) if matches!(
                        err.kind(),
                        ErrorKind::InvalidArgument | ErrorKind::Config | ErrorKind::Unsupported
                    ) => {
                        // Retrying cannot help: the lease cannot be renewed at all.
                        shared.set_state(LockState::Lost(format!("renewal impossible: {err}")));
                        return;
                    }
                    Err(err) => {
                        tracing::debug!(key = %lease.key(), %err, "renewal failed; retrying");
                        shared.set_state(LockState::Suspect);
                        let delay = backoff.next_delay().unwrap_or(interval);
                        next_renewal = Some(saturating_add(Instant::now(), delay));
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
