//! The state of one hold, shared by its guard and the renewal scheduler:
//! where the lock stands ([`LockState`]), how it is renewed
//! ([`RenewalPolicy`]), and the compact deadline both read and write.

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{LockError, Operation};
use crate::options::{FAR_FUTURE, RetryPolicy, saturating_add};
use crate::telemetry::{HOLD_LIMIT, NOT_RENEWED, RENEWAL_FAILED};
use crate::types::{Lease, clock_drift};

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
    /// Given back by [`LockGuard::release`](crate::LockGuard::release).
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
/// Any value is safe to hand to [`LockGuard::new`](crate::LockGuard::new) (durations up to
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
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) naming the field.
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

/// The guard's state as both the guard and its scheduler see it. Compact on
/// purpose (a client may hold 100,000): the lease is stored once, the
/// deadline and the state are atomics, and the watch channel and the loss
/// reason are only allocated when someone subscribes or the lock is lost.
pub(crate) struct Shared {
    /// The lease as granted; its deadline is the grant's, see `deadline`.
    lease: Lease,
    /// The current local validity deadline (compact, see `scheduler::to_ns`).
    deadline: AtomicU64,
    state: AtomicU8,
    /// Why the deadline will pass without renewal, once the scheduler knows
    /// (a cap reached, renewal disabled), so a `Lost` declared by a look at
    /// the state carries the same reason as one declared by the scheduler.
    hint: AtomicU8,
    signal: Mutex<Option<Box<Signal>>>,
    /// The scheduler slot this hold was admitted to from its scheduler's
    /// pending registrations (`u32::MAX` before; written and read under
    /// the scheduler's state lock; 4 bytes where the struct had padding).
    slot: AtomicU32,
    /// The backend's name, for the metrics' `backend` label (interned:
    /// one byte, where the struct had padding).
    backend: u8,
}

#[derive(Default)]
struct Signal {
    watch: Option<watch::Sender<LockState>>,
    lost: Option<String>,
    /// When the current `Suspect` spell began (kept only with the metrics
    /// on).
    suspect_since: Option<Instant>,
}

const HELD: u8 = 0;
const SUSPECT: u8 = 1;
const LOST: u8 = 2;
const RELEASED: u8 = 3;

pub(crate) const HINT_HOLD_LIMIT: u8 = 1;
pub(crate) const HINT_NOT_RENEWED: u8 = 2;

impl Shared {
    pub(crate) fn new(lease: Lease, backend: &'static str) -> Self {
        Self::interned(lease, crate::telemetry::intern(backend))
    }

    /// [`new`](Self::new) with the backend's name interned already.
    pub(crate) fn interned(lease: Lease, backend: u8) -> Self {
        Self {
            deadline: AtomicU64::new(to_ns(lease.validity_deadline())),
            lease,
            state: AtomicU8::new(HELD),
            hint: AtomicU8::new(0),
            signal: Mutex::new(None),
            slot: AtomicU32::new(u32::MAX),
            backend,
        }
    }

    /// The scheduler slot this hold was admitted to (`u32::MAX`: none);
    /// see [`Scheduler`](crate::scheduler::Scheduler)'s admission.
    pub(crate) fn admitted_slot(&self) -> u32 {
        self.slot.load(Ordering::Relaxed)
    }

    pub(crate) fn set_admitted_slot(&self, slot: u32) {
        self.slot.store(slot, Ordering::Relaxed);
    }

    /// When the grant was made: the request's send time, as the lease's
    /// first deadline was computed from it.
    pub(crate) fn granted_at(&self) -> Instant {
        let ttl = self.lease.ttl();
        let valid_for = ttl.saturating_sub(clock_drift(ttl));
        self.lease
            .validity_deadline()
            .checked_sub(valid_for)
            .unwrap_or_else(Instant::now)
    }

    /// The metrics of a move from state `current` to `next`.
    fn record_move(&self, current: u8, next: &LockState, signal: &mut Option<Box<Signal>>) {
        if !crate::telemetry::metrics_enabled() {
            return;
        }
        let backend = self.backend_name();
        let key = self.lease.key();
        let now = Instant::now();
        if current == SUSPECT
            && let Some(since) = signal.as_mut().and_then(|s| s.suspect_since.take())
        {
            crate::telemetry::suspect_ended(backend, key, now.saturating_duration_since(since));
        }
        let held = now.saturating_duration_since(self.granted_at());
        match next {
            LockState::Suspect => {
                signal.get_or_insert_with(Box::default).suspect_since = Some(now);
            }
            LockState::Lost(reason) => {
                crate::telemetry::hold_ended(backend, key, held, Some(reason))
            }
            LockState::Released => crate::telemetry::hold_ended(backend, key, held, None),
            LockState::Held => {}
        }
    }

    /// The lease as granted (its deadline field is the grant's).
    pub(crate) fn original(&self) -> &Lease {
        &self.lease
    }

    /// The backend's name.
    pub(crate) fn backend_name(&self) -> &'static str {
        crate::telemetry::name_of(self.backend)
    }

    /// A copy of the lease with the current deadline.
    pub(crate) fn lease(&self) -> Lease {
        let mut lease = self.lease.clone();
        lease.set_validity_deadline(self.deadline());
        lease
    }

    pub(crate) fn deadline_ns(&self) -> u64 {
        self.deadline.load(Ordering::Acquire)
    }

    pub(crate) fn deadline(&self) -> Instant {
        from_ns(self.deadline_ns())
    }

    pub(crate) fn set_deadline(&self, deadline: Instant) {
        self.deadline.store(to_ns(deadline), Ordering::Release);
    }

    pub(crate) fn set_hint(&self, hint: u8) {
        self.hint.store(hint, Ordering::Release);
    }

    pub(crate) fn is_terminal(&self) -> bool {
        self.state.load(Ordering::Acquire) >= LOST
    }

    fn signal(&self) -> std::sync::MutexGuard<'_, Option<Box<Signal>>> {
        self.signal.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn state_with(&self, signal: &Option<Box<Signal>>) -> LockState {
        match self.state.load(Ordering::Acquire) {
            HELD => LockState::Held,
            SUSPECT => LockState::Suspect,
            LOST => LockState::Lost(
                signal
                    .as_ref()
                    .and_then(|s| s.lost.clone())
                    .unwrap_or_default(),
            ),
            _ => LockState::Released,
        }
    }

    pub(crate) fn state(&self) -> LockState {
        match self.state.load(Ordering::Acquire) {
            HELD => LockState::Held,
            SUSPECT => LockState::Suspect,
            _ => self.state_with(&self.signal()),
        }
    }

    /// A receiver of state changes (the channel is made on first use).
    pub(crate) fn subscribe(&self) -> watch::Receiver<LockState> {
        let mut signal = self.signal();
        let current = self.state_with(&signal);
        signal
            .get_or_insert_with(Box::default)
            .watch
            .get_or_insert_with(|| watch::channel(current).0)
            .subscribe()
    }

    /// The state, turned `Lost` first if the deadline passed while it still
    /// said otherwise (the scheduler may be starved, e.g. it shares a
    /// runtime the application is blocking).
    pub(crate) fn checked_state(&self) -> LockState {
        let code = self.state.load(Ordering::Acquire);
        if code >= LOST || Instant::now() < self.deadline() {
            return self.state();
        }
        let reason = match (self.hint.load(Ordering::Acquire), code) {
            (HINT_HOLD_LIMIT, _) => HOLD_LIMIT,
            (HINT_NOT_RENEWED, _) => NOT_RENEWED,
            (_, SUSPECT) => RENEWAL_FAILED,
            _ => {
                "the lease's validity deadline passed with no renewal in time (a renewal still \
                 in flight, or a starved renewal task: is its runtime blocked?)"
            }
        };
        self.set_state(LockState::Lost(reason.to_owned()));
        self.state()
    }

    pub(crate) fn is_held(&self) -> bool {
        !self.checked_state().is_terminal()
    }

    /// Moves the state, never out of a terminal state.
    pub(crate) fn set_state(&self, next: LockState) {
        let code = match &next {
            LockState::Held => HELD,
            LockState::Suspect => SUSPECT,
            LockState::Lost(_) => LOST,
            LockState::Released => RELEASED,
        };
        let current = self.state.load(Ordering::Acquire);
        if current >= LOST || current == code {
            return;
        }
        let mut signal = self.signal();
        let current = self.state.load(Ordering::Acquire);
        if current >= LOST || current == code {
            return;
        }
        if let LockState::Lost(reason) = &next {
            tracing::warn!(key = %self.lease.key(), backend = self.backend_name(), token = self.lease.token().get(), %reason, "lock lost");
            signal.get_or_insert_with(Box::default).lost = Some(reason.clone());
        }
        self.record_move(current, &next, &mut signal);
        self.state.store(code, Ordering::Release);
        if let Some(tx) = signal.as_ref().and_then(|s| s.watch.as_ref()) {
            tx.send_replace(next);
        }
    }
}

/// "No time": a timer that never fires.
pub(crate) const NEVER: u64 = u64::MAX;

/// The instant all compact times (`u64` nanoseconds) count from: a year
/// before first use, so that no deadline of any clock in the process
/// (Tokio's paused test clocks included) lies before it.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(|| {
        let now = Instant::now();
        [365 * 24 * 3600, 24 * 3600, 3600, 0]
            .iter()
            .find_map(|secs| now.checked_sub(Duration::from_secs(*secs)))
            .unwrap_or(now)
    })
}

/// An instant as nanoseconds since [`epoch`] (saturating at both ends).
pub(crate) fn to_ns(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(epoch()).as_nanos()).unwrap_or(NEVER)
}

/// The instant of a compact time.
pub(crate) fn from_ns(ns: u64) -> Instant {
    let epoch = epoch();
    epoch
        .checked_add(Duration::from_nanos(ns))
        .unwrap_or_else(|| saturating_add(epoch, FAR_FUTURE))
}
