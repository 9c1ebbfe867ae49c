//! One renewal machinery per backend and runtime: a single task that keeps
//! every held guard's next renewal and deadline in one timer set, wakes at
//! the earliest, and renews all due leases in batches through
//! [`LockBackend::renew_many`].
//!
//! Guards register here when they are created and deregister when they are
//! released or dropped: no task is spawned per guard and none is aborted.
//! The rules are the ones a per-guard watchdog applied:
//!
//! - a renewal is due once `interval` of the TTL has passed since the
//!   request that set the current deadline was sent (see [`renewal_at`]);
//!   after a renewal the next one waits at least a quarter interval or half
//!   the time left (a backend that caps the deadline below a full TTL must
//!   not make renewal spin);
//! - to keep renewals of many guards in few round trips, a wake-up that
//!   renews anything also takes the leases that are due within a quarter of
//!   their interval (never before their minimum gap): guards renewed
//!   together stay together, so N guards cost about `N / RENEW_BATCH` calls
//!   per renewal period plus a few;
//! - a temporary error makes the guard `Suspect` and retries with backoff;
//!   `NotHeld`/`LeaseLost` make it `Lost` at once, as do errors retrying
//!   cannot fix;
//! - at its local deadline a guard is `Lost`, whether or not a renewal is in
//!   flight (the in-flight batch is dropped once none of its guards is left);
//! - hold limits and renewal caps stop renewing; the lease then runs out;
//! - session signals of session-based backends move every guard on that
//!   session;
//! - any end of the task other than the scheduler being dropped (a panic in
//!   a backend call, its runtime shutting down) makes every registered guard
//!   `Lost` at once; the next registration starts a fresh task.
//!
//! # Wake-ups
//!
//! The task usually runs on another thread than the guards' owners, so
//! waking it is a cross-thread wake-up. Registering and deregistering a
//! guard do not wake it unless it must act earlier than it planned:
//!
//! - the task publishes the instant it will wake next (`planned_wake`, under
//!   the state lock, after it has looked at its queue); a registration
//!   inserts its timers first and then reads that instant under the same
//!   lock, and notifies only when its first timer (renewal or deadline) is
//!   earlier. A notification sent between the task's look and its sleep is
//!   kept by the [`Notify`] as a permit, so none is missed;
//! - while guards have been registered in the last [`LINGER`], the task
//!   never plans to sleep longer than a coarse tick (the shortest first
//!   timer seen among recent registrations, at most [`MAX_TICK`]), also when
//!   its queue is empty: a hot acquire+release loop registers guards whose
//!   first timer lies beyond the next tick, and none of them wakes it. The
//!   tick only looks at the queue; it renews nothing that is not due;
//! - after [`LINGER`] without a registration the task sleeps until its next
//!   timer, or, with nothing registered, until notified: an idle process
//!   does not tick;
//! - deregistration (release, drop) never wakes it; a timer of a guard
//!   that is gone is simply no longer in the queue;
//! - a registration whose first timer is not earlier than the task's
//!   planned wake-up (and whose lease has no session) is not put in the
//!   queue at once: it is kept as pending, and the task admits every
//!   pending registration at the start of its next pass, which comes no
//!   later than that first timer (the renewal or the local deadline). A
//!   guard released before then only leaves the pending list: a hot
//!   acquire+release loop of long-TTL locks touches neither the queue nor
//!   the per-guard tables. Until admitted, a guard's state is kept as
//!   before (a look at it past the deadline reads `Lost`, see
//!   [`Shared::checked_state`]);
//! - a guard on a session the task does not watch yet wakes it to arm a
//!   watcher. A session whose last guard is gone keeps its slot and armed
//!   watcher (a few such idle sessions, [`IDLE_SESSIONS`]), so the next
//!   guard on the same connection's session finds it watched and wakes
//!   nothing; an idle session whose state moves is freed.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;

use crate::backend::LockBackend;
use crate::hold::{HINT_HOLD_LIMIT, HINT_NOT_RENEWED, LockState, RenewalPolicy, Shared};
pub(crate) use crate::hold::{NEVER, from_ns, to_ns};
use crate::options::{Backoff, saturating_add};
use crate::types::SessionState;
use timers::Timers;

mod entries;
mod sessions;
mod task;
#[cfg(test)]
mod tests;
mod timers;

/// How many `renew_many` calls one scheduler runs at once (more batches wait
/// for a turn, their deadlines still enforced).
const MAX_CALLS_IN_FLIGHT: usize = 4;

/// How long after the last registration the task keeps waking at least
/// once per tick (see the module docs, "Wake-ups").
const LINGER: Duration = Duration::from_secs(1);

/// The longest tick while registrations are recent.
const MAX_TICK: Duration = Duration::from_millis(100);

/// How many registrations wait as pending at most (module docs,
/// "Wake-ups"); more go straight into the queue. A release finds its
/// pending registration by a scan of the list, so a burst of grants
/// released in grant order stays linear, not quadratic.
const MAX_PENDING: usize = 64;

fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(NEVER)
}

/// When to renew a lease valid until `deadline`: once `interval` of its
/// `ttl` has passed since the request that set the deadline, i.e. at
/// `deadline - (ttl - interval)`, never earlier than `now`; all in compact
/// time ([`to_ns`]). Saturates.
fn renewal_at(deadline: u64, ttl: Duration, interval: Duration, now: u64) -> u64 {
    let at = match ttl.checked_sub(interval) {
        Some(ahead) => deadline.saturating_sub(duration_ns(ahead)),
        None => deadline.saturating_add(duration_ns(interval - ttl)),
    };
    at.max(now)
}

fn interval_of(policy: &RenewalPolicy, ttl: Duration) -> Duration {
    policy
        .interval
        .unwrap_or(ttl / 3)
        .max(Duration::from_millis(1))
}

/// Where a guard sits in its scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Registration {
    slot: u32,
    generation: u32,
}

impl Registration {
    /// Not registered (the guard started out lost).
    pub(crate) const NONE: Self = Self {
        slot: u32::MAX,
        generation: 0,
    };

    /// Released by [`LockGuard::release`](crate::LockGuard::release): its
    /// drop has nothing left to do (kept here rather than in a flag of its
    /// own, which would pad every guard by 8 bytes).
    pub(crate) const RELEASED: Self = Self {
        slot: u32::MAX,
        generation: u32::MAX,
    };

    /// A nested guard (see `reentry`): a view of another guard's grant,
    /// with nothing registered and nothing to release.
    pub(crate) const NESTED: Self = Self {
        slot: u32::MAX,
        generation: u32::MAX - 1,
    };

    /// Registered as pending (module docs, "Wake-ups"): found in the
    /// pending list by its hold, or, once admitted, in the slot its hold
    /// records ([`Shared::admitted_slot`]).
    pub(crate) const PENDING: Self = Self {
        slot: u32::MAX,
        generation: u32::MAX - 2,
    };
}

/// A registration the task has not admitted to the queue yet.
struct Pending {
    shared: Arc<Shared>,
    policy: RenewalPolicy,
    /// The first renewal, as the registration computed it.
    due: u64,
    hold_until: u64,
}

const NO_SESSION: u32 = u32::MAX;
/// Flags kept in the top bits of [`Slot::policy`].
const IN_FLIGHT: u32 = 1 << 31;
const SESSION_SUSPECT: u32 = 1 << 30;
const POLICY_MASK: u32 = SESSION_SUSPECT - 1;

/// One registered guard. Compact on purpose: a client may hold 100,000.
struct Slot {
    shared: Option<Arc<Shared>>,
    /// The next renewal, `NEVER` when renewal stopped (caps, disabled).
    due: u64,
    /// The earliest an early (batched) renewal may be sent.
    not_before: u64,
    hold_until: u64,
    generation: u32,
    /// Index into `policies`, plus the flags above.
    policy: u32,
    session: u32,
    renewals: u32,
}

impl Slot {
    fn vacant() -> Self {
        Self {
            shared: None,
            due: NEVER,
            not_before: 0,
            hold_until: NEVER,
            generation: 0,
            policy: 0,
            session: NO_SESSION,
            renewals: 0,
        }
    }

    fn policy_index(&self) -> usize {
        (self.policy & POLICY_MASK) as usize
    }

    fn flag(&self, flag: u32) -> bool {
        self.policy & flag != 0
    }

    fn set_flag(&mut self, flag: u32, on: bool) {
        if on {
            self.policy |= flag;
        } else {
            self.policy &= !flag;
        }
    }
}

struct PolicySlot {
    policy: RenewalPolicy,
    users: u32,
}

struct SessionSlot {
    rx: Option<watch::Receiver<SessionState>>,
    users: u32,
    /// The slot that registered first: backends with a channel per grant
    /// (etcd) have one user per session, found without a scan.
    first_user: u32,
    /// Bumped when the slot is reused for another channel.
    generation: u32,
    /// The task has a watcher armed on this slot's channel (set by the task
    /// under the state lock): a registration on a watched session need not
    /// wake the task.
    watched: bool,
}

/// How many of the most recent sessions a registration compares its
/// channel with: one shared session is found at once, and a channel per
/// grant costs no scan over all of them.
const SESSION_SEARCH: usize = 8;

/// How many sessions without a registered guard keep their slot and their
/// armed watcher. Session backends hand every grant of one connection the
/// same channel: a hot acquire+release loop takes the session's only guard
/// down to zero users and back up every cycle, and freeing the slot at zero
/// made each registration a new session, and so a wake-up of the task (to
/// arm a watcher) per cycle. Idle sessions beyond this are freed, oldest
/// first (a backend with a channel per grant leaves one idle session per
/// released grant).
const IDLE_SESSIONS: usize = SESSION_SEARCH;

struct State {
    /// Where the task runs (replaced when a dead task is restarted).
    handle: Option<Handle>,
    alive: bool,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Each slot's next timer (renewal or deadline); none while in flight.
    timers: Timers,
    /// The retry backoff of the slots whose renewals fail (only those).
    backoffs: HashMap<u32, Backoff>,
    policies: Vec<PolicySlot>,
    sessions: Vec<SessionSlot>,
    free_sessions: Vec<u32>,
    /// Live sessions, most recent last (at most `SESSION_SEARCH` searched).
    recent_sessions: Vec<u32>,
    /// Sessions with no user that keep their slot and watcher, oldest first
    /// (at most `idle_limit`).
    idle_sessions: Vec<u32>,
    /// `IDLE_SESSIONS`; a test knob (0: the previous behaviour, a session
    /// slot freed with its last user).
    idle_limit: usize,
    /// Registrations the task admits to the queue at its next pass.
    pending: Vec<Pending>,
    /// How many may wait as pending, `MAX_PENDING`; a test knob (no limit:
    /// the deliberately broken variant).
    pending_limit: usize,
    /// When the task means to wake next: a registration due earlier wakes it.
    planned_wake: u64,
    /// The widest early-renewal window of any registered guard.
    max_slack: u64,
    live: usize,
    /// Until when the task ticks at least every `tick()` (`LINGER` after
    /// the last registration).
    active_until: u64,
    /// The shortest time from registration to first timer seen since
    /// `lead_since` (the window restarts every `LINGER`).
    recent_lead: u64,
    lead_since: u64,
    /// Test knob: the length of `LINGER`.
    linger: u64,
    /// Test knob, a deliberately broken variant: registrations never
    /// notify the task.
    #[cfg(test)]
    never_notify: bool,
    /// Test knob, a deliberately broken variant: pending registrations
    /// are never admitted to the queue.
    #[cfg(test)]
    never_admit: bool,
}

impl State {
    /// The longest the task may sleep while registrations are recent.
    fn tick(&self) -> u64 {
        self.recent_lead
            .clamp(duration_ns(Duration::from_millis(1)), duration_ns(MAX_TICK))
    }

    /// Notes a registration at `now` whose first timer is at `timer`.
    fn note_registration(&mut self, now: u64, timer: u64) {
        let lead = timer.saturating_sub(now);
        if now.saturating_sub(self.lead_since) >= self.linger {
            self.lead_since = now;
            self.recent_lead = lead;
        } else {
            self.recent_lead = self.recent_lead.min(lead);
        }
        self.active_until = now.saturating_add(self.linger);
    }
}

/// The renewal scheduler of one backend on one runtime.
pub(crate) struct Scheduler {
    backend: Arc<dyn LockBackend>,
    /// The backend's name, interned for its holds' metrics labels.
    backend_tag: u8,
    runtime: Option<tokio::runtime::Id>,
    state: Mutex<State>,
    wake: Arc<Notify>,
    /// `renew_many` calls in flight at once.
    permits: Arc<Semaphore>,
    /// Passes of the task (each wake-up, for whatever reason).
    wakeups: AtomicU64,
    /// Notifications sent to the task by registrations.
    notifications: AtomicU64,
}

impl fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("RenewalScheduler")
            .field("backend", &self.backend.name())
            .field("held", &st.live)
            .field("running", &st.alive)
            .finish()
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        // The task holds only a weak reference: let it see it is gone.
        self.wake.notify_one();
    }
}

fn thin_ptr(backend: &Arc<dyn LockBackend>) -> *const () {
    Arc::as_ptr(backend).cast::<()>()
}

impl Scheduler {
    /// A scheduler of its own for `backend` on `handle` (`None`: no runtime,
    /// nothing can be registered).
    pub(crate) fn new(backend: Arc<dyn LockBackend>, handle: Option<Handle>) -> Arc<Self> {
        Arc::new(Self {
            backend_tag: crate::telemetry::intern(backend.name()),
            backend,
            runtime: handle.as_ref().map(Handle::id),
            state: Mutex::new(State {
                handle,
                alive: false,
                slots: Vec::new(),
                free: Vec::new(),
                timers: Timers::default(),
                backoffs: HashMap::new(),
                policies: Vec::new(),
                sessions: Vec::new(),
                free_sessions: Vec::new(),
                recent_sessions: Vec::new(),
                idle_sessions: Vec::new(),
                idle_limit: IDLE_SESSIONS,
                pending: Vec::new(),
                pending_limit: MAX_PENDING,
                planned_wake: NEVER,
                max_slack: 0,
                live: 0,
                active_until: 0,
                recent_lead: NEVER,
                lead_since: 0,
                linger: duration_ns(LINGER),
                #[cfg(test)]
                never_notify: false,
                #[cfg(test)]
                never_admit: false,
            }),
            wake: Arc::new(Notify::new()),
            permits: Arc::new(Semaphore::new(MAX_CALLS_IN_FLIGHT)),
            wakeups: AtomicU64::new(0),
            notifications: AtomicU64::new(0),
        })
    }

    /// The process-wide scheduler of `backend` on the runtime of `handle`,
    /// shared by every client and guard of that backend there.
    pub(crate) fn shared_for(backend: &Arc<dyn LockBackend>, handle: &Handle) -> Arc<Self> {
        static ALL: Mutex<Vec<Weak<Scheduler>>> = Mutex::new(Vec::new());
        let id = handle.id();
        let mut all = ALL.lock().unwrap_or_else(PoisonError::into_inner);
        let mut found = None;
        all.retain(|weak| match weak.upgrade() {
            Some(scheduler) => {
                if found.is_none()
                    && scheduler.runtime == Some(id)
                    && std::ptr::eq(thin_ptr(&scheduler.backend), thin_ptr(backend))
                {
                    found = Some(scheduler);
                }
                true
            }
            None => false,
        });
        if let Some(scheduler) = found {
            return scheduler;
        }
        let scheduler = Self::new(backend.clone(), Some(handle.clone()));
        all.push(Arc::downgrade(&scheduler));
        scheduler
    }

    /// The runtime this scheduler renews on.
    pub(crate) fn runtime_id(&self) -> Option<tokio::runtime::Id> {
        self.runtime
    }

    pub(crate) fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.backend
    }

    /// The hold of a fresh `lease` of this scheduler's backend.
    pub(crate) fn hold(&self, lease: crate::types::Lease) -> Shared {
        Shared::interned(lease, self.backend_tag)
    }

    /// The runtime handle renewals run on, if any.
    pub(crate) fn handle(&self) -> Option<Handle> {
        self.lock().handle.clone()
    }

    /// Nothing registered and no task: safe to forget.
    pub(crate) fn is_idle(&self) -> bool {
        let st = self.lock();
        st.live == 0 && !st.alive
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No code path panics while holding the lock; recover anyway.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts renewing `shared`'s lease by `policy` on `handle`'s runtime.
    /// Returns [`Registration::NONE`] when the guard is lost already (its
    /// session is gone).
    pub(crate) fn register(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        policy: &RenewalPolicy,
        handle: &Handle,
    ) -> Registration {
        let now_at = Instant::now();
        let lease = shared.original();
        if lease.session().is_none()
            && let Some(registration) = self.register_pending(shared, policy, now_at)
        {
            return registration;
        }
        let ttl = lease.ttl();
        let interval = interval_of(policy, ttl);
        let mut session_suspect = false;
        if let Some(rx) = lease.session() {
            let current = match rx.has_changed() {
                Err(_) => SessionState::Lost("session closed".to_owned()),
                Ok(_) => rx.borrow().clone(),
            };
            match current {
                SessionState::Lost(reason) => {
                    shared.set_state(LockState::Lost(format!("backend session lost: {reason}")));
                    return Registration::NONE;
                }
                SessionState::Suspect => session_suspect = true,
                SessionState::Alive => {}
            }
        }
        let deadline = shared.deadline_ns();
        let mut hint = None;
        let due = if policy.enabled {
            renewal_at(
                to_ns(lease.validity_deadline()),
                ttl,
                interval,
                to_ns(now_at),
            )
        } else {
            hint = Some(HINT_NOT_RENEWED);
            NEVER
        };
        let hold_until = policy
            .max_hold
            .map_or(NEVER, |max| to_ns(saturating_add(now_at, max)));
        let (registration, spawn, notify) = {
            let mut st = self.lock();
            let mut slot = st.slot_for(shared, policy, interval, due, hold_until);
            slot.set_flag(SESSION_SUSPECT, session_suspect);
            if st.apply_caps(&mut slot) {
                hint = Some(HINT_HOLD_LIMIT);
            }
            let timer = slot.due.min(deadline);
            let index = st.insert(slot);
            // A session the task does not watch yet: wake it to arm a watcher.
            let mut new_session = false;
            if let Some(rx) = lease.session() {
                let session = st.session_index(rx, index);
                new_session = !st.sessions[session as usize].watched;
                st.slots[index as usize].session = session;
            }
            // Published in the queue before `planned_wake` is read, both
            // under the lock the task holds while it looks at its queue and
            // publishes `planned_wake`: either the task sees this timer, or
            // this registration sees the instant the task will sleep until.
            st.set_timer(index, timer);
            st.note_registration(to_ns(now_at), timer);
            let spawn = !st.alive;
            if spawn {
                st.alive = true;
                st.handle = Some(handle.clone());
            }
            let notify = !spawn && (timer < st.planned_wake || new_session);
            #[cfg(test)]
            let notify = notify && !st.never_notify;
            let generation = st.slots[index as usize].generation;
            (
                Registration {
                    slot: index,
                    generation,
                },
                spawn,
                notify,
            )
        };
        if session_suspect {
            shared.set_state(LockState::Suspect);
        }
        if let Some(hint) = hint {
            shared.set_hint(hint);
        }
        if spawn {
            self.spawn_task(handle);
        } else if notify {
            self.notifications.fetch_add(1, Ordering::Relaxed);
            // Kept as a permit if the task is not waiting yet.
            self.wake.notify_one();
        }
        registration
    }

    /// The pending registration of `shared` (module docs, "Wake-ups"),
    /// when the task runs and plans to wake no later than the guard's
    /// first timer; `None`: register it in the queue now.
    fn register_pending(
        &self,
        shared: &Arc<Shared>,
        policy: &RenewalPolicy,
        now_at: Instant,
    ) -> Option<Registration> {
        let now = to_ns(now_at);
        let deadline = shared.deadline_ns();
        let due = if policy.enabled {
            let ttl = shared.original().ttl();
            renewal_at(deadline, ttl, interval_of(policy, ttl), now)
        } else {
            NEVER
        };
        // Caps only ever stop renewal: the first timer is no earlier.
        let timer = due.min(deadline);
        let hold_until = policy
            .max_hold
            .map_or(NEVER, |max| to_ns(saturating_add(now_at, max)));
        let mut st = self.lock();
        if !st.alive || timer < st.planned_wake || st.pending.len() >= st.pending_limit {
            return None;
        }
        st.note_registration(now, timer);
        st.live += 1;
        st.pending.push(Pending {
            shared: shared.clone(),
            policy: *policy,
            due,
            hold_until,
        });
        drop(st);
        if !policy.enabled {
            shared.set_hint(HINT_NOT_RENEWED);
        }
        Some(Registration::PENDING)
    }

    /// Where `shared`'s `registration` sits now: a pending registration
    /// admitted since is found in the slot its hold records.
    fn current(st: &State, registration: Registration, shared: &Arc<Shared>) -> Registration {
        if registration != Registration::PENDING {
            return registration;
        }
        let slot = shared.admitted_slot();
        match st.slots.get(slot as usize) {
            Some(entry)
                if entry
                    .shared
                    .as_ref()
                    .is_some_and(|s| Arc::ptr_eq(s, shared)) =>
            {
                Registration {
                    slot,
                    generation: entry.generation,
                }
            }
            _ => Registration::NONE,
        }
    }

    /// The policy `registration` (of `shared`) renews by, with what is
    /// left of its hold limit as `max_hold` (for a guard that swaps its
    /// lease, e.g. on a downgrade). `None` once it is no longer registered.
    pub(crate) fn policy_for(
        &self,
        registration: Registration,
        shared: &Arc<Shared>,
    ) -> Option<RenewalPolicy> {
        let st = self.lock();
        let (mut policy, hold_until) = match st.pending_index(registration, shared) {
            Some(index) => {
                let pending = &st.pending[index];
                (pending.policy, pending.hold_until)
            }
            None => {
                let registration = Self::current(&st, registration, shared);
                if !st.is_current(registration) {
                    return None;
                }
                let slot = &st.slots[registration.slot as usize];
                (st.policy_of(slot), slot.hold_until)
            }
        };
        policy.max_hold = (hold_until != NEVER)
            .then(|| from_ns(hold_until).saturating_duration_since(Instant::now()));
        Some(policy)
    }

    /// Stops renewing the guard at `registration` (release, drop) whose
    /// hold is `shared`. Never wakes the task: a pending registration
    /// leaves the pending list, a registered one's timers leave the queue,
    /// and a wake-up planned for them finds nothing to do.
    pub(crate) fn deregister(&self, registration: Registration, shared: &Arc<Shared>) {
        if registration.slot == u32::MAX && registration != Registration::PENDING {
            // NONE, RELEASED or NESTED: nothing registered.
            return;
        }
        let mut st = self.lock();
        if let Some(index) = st.pending_index(registration, shared) {
            let pending = st.pending.swap_remove(index);
            st.live -= 1;
            drop(st);
            drop(pending);
            return;
        }
        let registration = Self::current(&st, registration, shared);
        if st.is_current(registration) {
            st.free_slot(registration.slot);
        }
    }
}
