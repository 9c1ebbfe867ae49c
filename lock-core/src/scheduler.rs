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
//! - a guard on a session the task does not watch yet wakes it to arm a
//!   watcher. A session whose last guard is gone keeps its slot and armed
//!   watcher (a few such idle sessions, [`IDLE_SESSIONS`]), so the next
//!   guard on the same connection's session finds it watched and wakes
//!   nothing; an idle session whose state moves is freed.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::task::Poll;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;

use crate::backend::LockBackend;
use crate::error::{ErrorKind, LockError};
use crate::guard::{
    HINT_HOLD_LIMIT, HINT_NOT_RENEWED, HOLD_LIMIT, LockState, NOT_RENEWED, RENEWAL_FAILED,
    RenewalPolicy, Shared,
};
use crate::options::{Backoff, FAR_FUTURE, saturating_add};
use crate::renew_many::{RENEW_BATCH, missing_result};
use crate::types::SessionState;

mod timers;

use timers::{Timers, reserve_one};

/// How many `renew_many` calls one scheduler runs at once (more batches wait
/// for a turn, their deadlines still enforced).
const MAX_CALLS_IN_FLIGHT: usize = 4;

/// How long after the last registration the task keeps waking at least
/// once per tick (see the module docs, "Wake-ups").
const LINGER: Duration = Duration::from_secs(1);

/// The longest tick while registrations are recent.
const MAX_TICK: Duration = Duration::from_millis(100);

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

fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(NEVER)
}

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
                planned_wake: NEVER,
                max_slack: 0,
                live: 0,
                active_until: 0,
                recent_lead: NEVER,
                lead_since: 0,
                linger: duration_ns(LINGER),
                #[cfg(test)]
                never_notify: false,
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
            to_ns(renewal_at(lease.validity_deadline(), ttl, interval, now_at))
        } else {
            hint = Some(HINT_NOT_RENEWED);
            NEVER
        };
        let hold_until = policy
            .max_hold
            .map_or(NEVER, |max| to_ns(saturating_add(now_at, max)));
        let (registration, spawn, notify) = {
            let mut st = self.lock();
            let policy_index = st.policy_index(policy);
            st.max_slack = st.max_slack.max(duration_ns(interval / 4));
            let mut slot = Slot {
                shared: Some(shared.clone()),
                due,
                not_before: 0,
                hold_until,
                generation: 0,
                policy: policy_index,
                session: NO_SESSION,
                renewals: 0,
            };
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

    /// Stops renewing the guard at `registration` (release, drop). Never
    /// wakes the task: its timers leave the queue, and a wake-up planned
    /// for them finds nothing to do.
    pub(crate) fn deregister(&self, registration: Registration) {
        if registration.slot == u32::MAX {
            // NONE or RELEASED: nothing registered.
            return;
        }
        let mut st = self.lock();
        if st.is_current(registration) {
            st.free_slot(registration.slot);
        }
    }

    fn spawn_task(self: &Arc<Self>, handle: &Handle) {
        // Moved into the task before it first runs, so even a task dropped
        // unpolled (its runtime shutting down) says so.
        let supervisor = Supervisor {
            scheduler: Arc::downgrade(self),
            clean: false,
        };
        let weak = Arc::downgrade(self);
        let wake = self.wake.clone();
        drop(handle.spawn(async move {
            let mut supervisor = supervisor;
            run(weak, wake).await;
            supervisor.clean = true;
        }));
    }

    /// One pass of the task: expire, take what is due, launch batches, arm
    /// session watchers. Returns when to wake next.
    fn step(&self, batches: &mut Vec<Batch>, watchers: &mut Vec<Watcher>) -> u64 {
        self.wakeups.fetch_add(1, Ordering::Relaxed);
        let now = to_ns(Instant::now());
        let mut st = self.lock();
        batches.retain_mut(|batch| {
            if batch.min_deadline <= now {
                batch.min_deadline = st.expire_members(&batch.members, now);
            }
            batch.min_deadline != NEVER
        });
        let launch = st.take_due(now);
        for chunk in launch.chunks(RENEW_BATCH) {
            batches.push(Batch::start(
                self.backend.clone(),
                self.permits.clone(),
                chunk,
                &st,
            ));
        }
        if watchers.len() < st.sessions.len() {
            watchers.resize_with(st.sessions.len(), || None);
        }
        for (watcher, session) in watchers.iter_mut().zip(&mut st.sessions) {
            if watcher
                .as_ref()
                .is_some_and(|(generation, _)| *generation != session.generation)
            {
                *watcher = None;
            }
            // Idle sessions too (no user, kept for the next guard on the
            // same channel): a guard released before the task came round
            // leaves its session idle, and the next one must find it
            // watched.
            if watcher.is_none()
                && let Some(rx) = &session.rx
            {
                *watcher = Some((session.generation, watch_session(rx.clone())));
                session.watched = true;
            }
        }
        let next = st.timers.first().map_or(NEVER, |(at, _)| at).min(
            batches
                .iter()
                .map(|b| b.min_deadline)
                .min()
                .unwrap_or(NEVER),
        );
        // While registrations are recent, never plan further than a tick:
        // registrations then rarely need to wake the task (module docs).
        let next = if now < st.active_until {
            next.min(now.saturating_add(st.tick()))
        } else {
            next
        };
        // Published under the lock, after the queue was read: a
        // registration after this sees it and notifies if it is earlier.
        st.planned_wake = next;
        next
    }

    /// Applies a finished batch's results.
    fn complete(&self, batch: &Batch, results: Vec<Result<Instant, LockError>>) {
        let now_at = Instant::now();
        let mut st = self.lock();
        let mut results = results.into_iter();
        for &(slot, generation) in &batch.members {
            let result = results.next().unwrap_or_else(|| Err(missing_result()));
            let registration = Registration { slot, generation };
            if !st.is_current(registration) || !st.slots[slot as usize].flag(IN_FLIGHT) {
                continue;
            }
            st.slots[slot as usize].set_flag(IN_FLIGHT, false);
            st.apply_result(slot, result, now_at);
        }
    }

    /// A session's state moved (or its sender is gone: `open` false).
    fn session_changed(
        &self,
        index: usize,
        generation: u32,
        rx: watch::Receiver<SessionState>,
        open: bool,
    ) -> Watcher {
        let value = if open {
            rx.borrow().clone()
        } else {
            SessionState::Lost("session closed".to_owned())
        };
        let mut st = self.lock();
        let (Ok(session), Some(slot)) = (u32::try_from(index), st.sessions.get(index)) else {
            return None;
        };
        if slot.generation != generation {
            // The slot was freed (or reused for another channel) meanwhile.
            return None;
        }
        if slot.users == 0 {
            // An idle session moved: let it go (the next guard on it
            // registers a new slot, and the task arms a new watcher).
            #[allow(clippy::cast_possible_truncation)] // sessions are indexed by u32
            st.free_session(index as u32);
            return None;
        }
        let first = slot.first_user;
        let single = slot.users == 1
            && st
                .slots
                .get(first as usize)
                .is_some_and(|e| e.session == session && e.shared.is_some());
        let affected: Vec<u32> = if single {
            vec![first]
        } else {
            (0..st.slots.len())
                .filter(|&i| st.slots[i].session == session && st.slots[i].shared.is_some())
                .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
                .collect()
        };
        for slot in affected {
            let entry = &mut st.slots[slot as usize];
            let Some(shared) = entry.shared.clone() else {
                continue;
            };
            match &value {
                SessionState::Lost(reason) => {
                    shared.set_state(LockState::Lost(format!("backend session lost: {reason}")));
                    st.free_slot(slot);
                }
                SessionState::Suspect => {
                    entry.set_flag(SESSION_SUSPECT, true);
                    shared.set_state(LockState::Suspect);
                }
                SessionState::Alive => {
                    entry.set_flag(SESSION_SUSPECT, false);
                    shared.set_state(LockState::Held);
                }
            }
        }
        if open && st.sessions.get(index).is_some_and(|s| s.users > 0) {
            Some((generation, watch_session(rx)))
        } else {
            if let Some(slot) = st.sessions.get_mut(index) {
                slot.watched = false;
                if !open {
                    slot.rx = None;
                }
            }
            None
        }
    }

    /// The task ended other than by the scheduler's drop: every guard is lost.
    fn task_ended(&self, reason: &str) {
        let lost = {
            let mut st = self.lock();
            st.alive = false;
            st.planned_wake = NEVER;
            // The task's watchers end with it.
            for session in &mut st.sessions {
                session.watched = false;
            }
            let mut lost = Vec::with_capacity(st.live);
            for slot in 0..st.slots.len() {
                if let Some(shared) = st.slots[slot].shared.clone() {
                    lost.push(shared);
                    #[allow(clippy::cast_possible_truncation)] // slots are indexed by u32
                    st.free_slot(slot as u32);
                }
            }
            lost
        };
        for shared in lost {
            shared.set_state(LockState::Lost(reason.to_owned()));
        }
    }
}

impl State {
    fn is_current(&self, registration: Registration) -> bool {
        self.slots
            .get(registration.slot as usize)
            .is_some_and(|s| s.generation == registration.generation && s.shared.is_some())
    }

    fn insert(&mut self, mut slot: Slot) -> u32 {
        self.live += 1;
        if let Some(index) = self.free.pop() {
            let old = &mut self.slots[index as usize];
            slot.generation = old.generation;
            *old = slot;
            index
        } else {
            // More than u32::MAX guards cannot be held: memory runs out first.
            #[allow(clippy::cast_possible_truncation)]
            let index = self.slots.len() as u32;
            reserve_one(&mut self.slots);
            self.slots.push(slot);
            index
        }
    }

    fn set_timer(&mut self, slot: u32, at: u64) {
        self.timers.set(slot, at);
    }

    fn free_slot(&mut self, slot: u32) {
        self.set_timer(slot, NEVER);
        let entry = &mut self.slots[slot as usize];
        if entry.shared.take().is_none() {
            return;
        }
        entry.generation = entry.generation.wrapping_add(1);
        let policy = entry.policy_index();
        let session = entry.session;
        entry.policy = 0;
        entry.session = NO_SESSION;
        if let Some(p) = self.policies.get_mut(policy) {
            p.users = p.users.saturating_sub(1);
        }
        if let Some(s) = self.sessions.get_mut(session as usize) {
            s.users = s.users.saturating_sub(1);
            if s.users == 0 {
                self.idle_session(session);
            }
        }
        if !self.backoffs.is_empty() {
            self.backoffs.remove(&slot);
        }
        self.free.push(slot);
        self.live -= 1;
    }

    /// A session's last guard is gone: keep its slot and watcher for the
    /// next guard on the same channel (see `IDLE_SESSIONS`), freeing the
    /// oldest idle ones beyond the limit.
    fn idle_session(&mut self, session: u32) {
        if self.sessions[session as usize].rx.is_none() {
            // Its channel closed: nothing to reuse.
            self.free_session(session);
            return;
        }
        self.idle_sessions.push(session);
        while self.idle_sessions.len() > self.idle_limit {
            let oldest = self.idle_sessions[0];
            self.free_session(oldest);
        }
    }

    /// Gives a session slot back (its watcher, if any, is dropped by the
    /// task at its next pass: the generation no longer matches).
    fn free_session(&mut self, session: u32) {
        let Some(s) = self.sessions.get_mut(session as usize) else {
            return;
        };
        s.rx = None;
        s.users = 0;
        s.watched = false;
        s.generation = s.generation.wrapping_add(1);
        self.free_sessions.push(session);
        self.recent_sessions.retain(|&r| r != session);
        self.idle_sessions.retain(|&r| r != session);
    }

    /// Interned: guards share a few policies; a slot stores an index.
    fn policy_index(&mut self, policy: &RenewalPolicy) -> u32 {
        // The hold limit is kept per slot as an instant.
        let policy = RenewalPolicy {
            max_hold: None,
            ..*policy
        };
        let found = self
            .policies
            .iter()
            .position(|p| p.policy == policy)
            .or_else(|| self.policies.iter().position(|p| p.users == 0));
        let index = match found {
            Some(index) => {
                let slot = &mut self.policies[index];
                if slot.users == 0 {
                    slot.policy = policy;
                }
                index
            }
            None => {
                self.policies.push(PolicySlot { policy, users: 0 });
                self.policies.len() - 1
            }
        };
        self.policies[index].users += 1;
        u32::try_from(index).unwrap_or(POLICY_MASK) & POLICY_MASK
    }

    fn session_index(&mut self, rx: &watch::Receiver<SessionState>, user: u32) -> u32 {
        let found = self
            .recent_sessions
            .iter()
            .rev()
            .take(SESSION_SEARCH)
            .copied()
            .find(|&i| {
                self.sessions[i as usize]
                    .rx
                    .as_ref()
                    .is_some_and(|r| r.same_channel(rx))
            });
        if let Some(index) = found {
            let slot = &mut self.sessions[index as usize];
            if slot.users == 0 {
                // An idle session, watched still: back in use.
                slot.first_user = user;
                self.idle_sessions.retain(|&r| r != index);
            }
            self.sessions[index as usize].users += 1;
            return index;
        }
        let index = match self.free_sessions.pop() {
            Some(index) => {
                let slot = &mut self.sessions[index as usize];
                slot.rx = Some(rx.clone());
                slot.users = 1;
                slot.first_user = user;
                slot.watched = false;
                index
            }
            None => {
                self.sessions.push(SessionSlot {
                    rx: Some(rx.clone()),
                    users: 1,
                    first_user: user,
                    generation: 0,
                    watched: false,
                });
                u32::try_from(self.sessions.len() - 1).unwrap_or(NO_SESSION)
            }
        };
        self.recent_sessions.push(index);
        if self.recent_sessions.len() > SESSION_SEARCH * 4 {
            let excess = self.recent_sessions.len() - SESSION_SEARCH;
            self.recent_sessions.drain(..excess);
        }
        index
    }

    fn policy_of(&self, slot: &Slot) -> RenewalPolicy {
        self.policies
            .get(slot.policy_index())
            .map_or_else(RenewalPolicy::default, |p| p.policy)
    }

    /// Stops renewal once a cap is reached: the lease then runs out.
    /// Returns whether it did.
    fn apply_caps(&self, slot: &mut Slot) -> bool {
        if slot.due == NEVER {
            return false;
        }
        let policy = self.policy_of(slot);
        let by_count = policy
            .max_renewals
            .is_some_and(|max| u64::from(slot.renewals) >= max);
        if by_count || slot.due >= slot.hold_until {
            tracing::debug!(
                renewals = slot.renewals,
                "renewal cap reached; the lease will run out"
            );
            slot.due = NEVER;
            return true;
        }
        false
    }

    /// [`apply_caps`](Self::apply_caps) on a registered slot.
    fn apply_caps_at(&mut self, slot: u32) -> bool {
        let mut entry = std::mem::replace(&mut self.slots[slot as usize], Slot::vacant());
        let capped = self.apply_caps(&mut entry);
        self.slots[slot as usize] = entry;
        capped
    }

    fn expiry_reason(&self, slot: &Slot) -> &'static str {
        if !self.policy_of(slot).enabled {
            NOT_RENEWED
        } else if slot.due == NEVER {
            HOLD_LIMIT
        } else {
            RENEWAL_FAILED
        }
    }

    /// Pops every timer that has fired: deadlines make guards lost,
    /// renewals are returned to be sent, with the leases due soon enough
    /// to ride along.
    fn take_due(&mut self, now: u64) -> Vec<u32> {
        let mut launch = Vec::new();
        while let Some((at, slot)) = self.timers.first() {
            if at > now {
                break;
            }
            self.set_timer(slot, NEVER);
            let entry = &self.slots[slot as usize];
            let Some(shared) = entry.shared.clone() else {
                continue;
            };
            let due = entry.due;
            if shared.is_terminal() {
                self.free_slot(slot);
            } else if shared.deadline_ns() <= now {
                let reason = self.expiry_reason(&self.slots[slot as usize]);
                shared.set_state(LockState::Lost(reason.to_owned()));
                self.free_slot(slot);
            } else if due <= now {
                self.slots[slot as usize].set_flag(IN_FLIGHT, true);
                launch.push(slot);
            } else {
                self.set_timer(slot, due.min(shared.deadline_ns()));
            }
        }
        if launch.is_empty() || self.max_slack == 0 {
            return launch;
        }
        let upper = now.saturating_add(self.max_slack);
        // Every timer at or before `now` was popped above.
        for (_, slot) in self.timers.until(upper) {
            if self.eligible_early(slot, now) {
                self.set_timer(slot, NEVER);
                self.slots[slot as usize].set_flag(IN_FLIGHT, true);
                launch.push(slot);
            }
        }
        launch
    }

    fn eligible_early(&self, slot: u32, now: u64) -> bool {
        let entry = &self.slots[slot as usize];
        let Some(shared) = &entry.shared else {
            return false;
        };
        if entry.due == NEVER || entry.not_before > now || shared.is_terminal() {
            return false;
        }
        let slack = duration_ns(interval_of(&self.policy_of(entry), shared.original().ttl()) / 4);
        entry.due.saturating_sub(slack) <= now && shared.deadline_ns() > now
    }

    /// In-flight guards whose deadline passed are lost; returns the
    /// earliest deadline of those still waiting, `NEVER` if none is left.
    fn expire_members(&mut self, members: &[(u32, u32)], now: u64) -> u64 {
        let mut earliest = NEVER;
        for &(slot, generation) in members {
            if !self.is_current(Registration { slot, generation }) {
                continue;
            }
            let entry = &self.slots[slot as usize];
            let Some(shared) = entry.shared.clone() else {
                continue;
            };
            let deadline = shared.deadline_ns();
            if shared.is_terminal() {
                self.free_slot(slot);
            } else if deadline <= now {
                shared.set_state(LockState::Lost(RENEWAL_FAILED.to_owned()));
                self.free_slot(slot);
            } else {
                earliest = earliest.min(deadline);
            }
        }
        earliest
    }

    fn apply_result(&mut self, slot: u32, result: Result<Instant, LockError>, now_at: Instant) {
        let entry = &self.slots[slot as usize];
        let Some(shared) = entry.shared.clone() else {
            return;
        };
        if shared.is_terminal() {
            self.free_slot(slot);
            return;
        }
        let policy = self.policy_of(entry);
        let ttl = shared.original().ttl();
        let interval = interval_of(&policy, ttl);
        let entry = &mut self.slots[slot as usize];
        match result {
            Ok(new_deadline) => {
                entry.renewals = entry.renewals.saturating_add(1);
                if !self.backoffs.is_empty() {
                    self.backoffs.remove(&slot);
                }
                shared.set_deadline(new_deadline);
                if !entry.flag(SESSION_SUSPECT) {
                    shared.set_state(LockState::Held);
                }
                // A backend may cap the deadline below a full TTL (etcd: the
                // session lease's own deadline until the next keep-alive):
                // the schedule would then ask for a renewal at once, again
                // and again. Leave a gap: a quarter of the interval, or half
                // the time left.
                let gap = (interval / 4).min(new_deadline.saturating_duration_since(now_at) / 2);
                let earliest = saturating_add(now_at, gap);
                entry.due = to_ns(renewal_at(new_deadline, ttl, interval, now_at).max(earliest));
                entry.not_before = to_ns(earliest);
            }
            Err(err) if matches!(err.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost) => {
                shared.set_state(LockState::Lost(format!("renewal refused: {err}")));
                self.free_slot(slot);
                return;
            }
            Err(err)
                if matches!(
                    err.kind(),
                    ErrorKind::InvalidArgument | ErrorKind::Config | ErrorKind::Unsupported
                ) =>
            {
                // Retrying cannot help: the lease cannot be renewed at all.
                shared.set_state(LockState::Lost(format!("renewal impossible: {err}")));
                self.free_slot(slot);
                return;
            }
            Err(err) => {
                tracing::debug!(key = %shared.original().key(), %err, "renewal failed; retrying");
                shared.set_state(LockState::Suspect);
                let delay = self
                    .backoffs
                    .entry(slot)
                    .or_insert_with(|| policy.retry.backoff())
                    .next_delay()
                    .unwrap_or(interval);
                entry.due = to_ns(saturating_add(now_at, delay));
                entry.not_before = to_ns(saturating_add(now_at, delay / 2));
            }
        }
        if self.apply_caps_at(slot) {
            shared.set_hint(HINT_HOLD_LIMIT);
        }
        let at = self.slots[slot as usize].due.min(shared.deadline_ns());
        self.set_timer(slot, at);
    }
}

type RenewManyFuture = Pin<Box<dyn Future<Output = Vec<Result<Instant, LockError>>> + Send>>;
type WatchFuture =
    Pin<Box<dyn Future<Output = (watch::Receiver<SessionState>, bool)> + Send + 'static>>;
/// A session watcher and the generation of the slot it watches.
type Watcher = Option<(u32, WatchFuture)>;

/// One `renew_many` call in flight.
struct Batch {
    members: Vec<(u32, u32)>,
    /// The earliest deadline among members still waiting for it.
    min_deadline: u64,
    call: RenewManyFuture,
}

impl Batch {
    fn start(
        backend: Arc<dyn LockBackend>,
        permits: Arc<Semaphore>,
        slots: &[u32],
        st: &State,
    ) -> Self {
        let mut members = Vec::with_capacity(slots.len());
        let mut held = Vec::with_capacity(slots.len());
        let mut min_deadline = NEVER;
        for &slot in slots {
            let entry = &st.slots[slot as usize];
            if let Some(shared) = &entry.shared {
                members.push((slot, entry.generation));
                min_deadline = min_deadline.min(shared.deadline_ns());
                held.push(shared.clone());
            }
        }
        let call = Box::pin(async move {
            // Batches beyond the first few wait here, their guards' deadlines
            // still watched: what a backend buffers per call stays bounded.
            let _permit = permits.acquire_owned().await;
            let leases: Vec<&crate::types::Lease> = held.iter().map(|s| s.original()).collect();
            backend.renew_many(&leases).await
        });
        Self {
            members,
            min_deadline,
            call,
        }
    }
}

fn watch_session(rx: watch::Receiver<SessionState>) -> WatchFuture {
    Box::pin(async move {
        let mut rx = rx;
        let open = rx.changed().await.is_ok();
        (rx, open)
    })
}

enum Event {
    Wake,
    Timer,
    Batch(usize, Vec<Result<Instant, LockError>>),
    Session(usize, watch::Receiver<SessionState>, bool),
}

/// The scheduler's task: runs until the scheduler is dropped.
async fn run(weak: Weak<Scheduler>, wake: Arc<Notify>) {
    let mut batches: Vec<Batch> = Vec::new();
    let mut watchers: Vec<Watcher> = Vec::new();
    loop {
        let next_wake = {
            let Some(scheduler) = weak.upgrade() else {
                return;
            };
            scheduler.step(&mut batches, &mut watchers)
        };
        match wait_event(&wake, next_wake, &mut batches, &mut watchers).await {
            Event::Wake | Event::Timer => {}
            Event::Batch(index, results) => {
                let batch = batches.swap_remove(index);
                let Some(scheduler) = weak.upgrade() else {
                    return;
                };
                scheduler.complete(&batch, results);
            }
            Event::Session(index, rx, open) => {
                let generation = watchers[index].take().map_or(0, |(g, _)| g);
                let Some(scheduler) = weak.upgrade() else {
                    return;
                };
                watchers[index] = scheduler.session_changed(index, generation, rx, open);
            }
        }
    }
}

async fn wait_event(
    wake: &Notify,
    next_wake: u64,
    batches: &mut [Batch],
    watchers: &mut [Watcher],
) -> Event {
    let notified = wake.notified();
    let sleep = (next_wake != NEVER).then(|| tokio::time::sleep_until(from_ns(next_wake)));
    tokio::pin!(notified);
    tokio::pin!(sleep);
    std::future::poll_fn(|cx| {
        if notified.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Event::Wake);
        }
        for (index, batch) in batches.iter_mut().enumerate() {
            if let Poll::Ready(results) = batch.call.as_mut().poll(cx) {
                return Poll::Ready(Event::Batch(index, results));
            }
        }
        for (index, watcher) in watchers.iter_mut().enumerate() {
            if let Some((_, future)) = watcher
                && let Poll::Ready((rx, open)) = future.as_mut().poll(cx)
            {
                return Poll::Ready(Event::Session(index, rx, open));
            }
        }
        if let Some(sleep) = sleep.as_mut().as_pin_mut()
            && sleep.poll(cx).is_ready()
        {
            return Poll::Ready(Event::Timer);
        }
        Poll::Pending
    })
    .await
}

/// Lives inside the task: if it ends in any way other than the scheduler
/// being dropped (a panic unwinding through it, its runtime shutting down
/// and dropping it), every registered guard is declared lost rather than
/// left `Held` with nobody renewing it.
struct Supervisor {
    scheduler: Weak<Scheduler>,
    clean: bool,
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if self.clean {
            return;
        }
        let Some(scheduler) = self.scheduler.upgrade() else {
            return;
        };
        let reason = if std::thread::panicking() {
            "the renewal task panicked"
        } else {
            "the renewal task stopped (its runtime shut down)"
        };
        scheduler.task_ended(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LockClient, LockGuard, MemoryBackend, RenewalRuntime};

    const CYCLES: u64 = 1_000;

    /// Taken by the tests that time renewals or count wake-ups on the
    /// renewal thread: one at a time, so that none's load (a thousand
    /// wake-ups, a 30 ms lock renewed every 10 ms) lands in another's
    /// measuring window on a small machine.
    static TIMING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// A fresh memory backend, a client over it, and the scheduler that
    /// client's guards register with: on the dedicated renewal thread, or
    /// with `here`, on the test's own (current-thread) runtime.
    fn setup_on(here: bool) -> (LockClient, Arc<Scheduler>) {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let runtime = if here {
            RenewalRuntime::current()
        } else {
            RenewalRuntime::dedicated()
        };
        let scheduler = Scheduler::shared_for(&backend, &runtime.handle().unwrap());
        let client = LockClient::from_arc(backend).with_renewal_runtime(runtime);
        (client, scheduler)
    }

    fn setup() -> (LockClient, Arc<Scheduler>) {
        setup_on(false)
    }

    /// `CYCLES` acquire+release cycles of 10 s-TTL locks, each followed by
    /// a pause in which the scheduler's task gets to run (a network round
    /// trip would leave one): a yield on a current-thread runtime (the task
    /// then runs between every two cycles, deterministically), or a short
    /// sleep of the test's thread with the task on the renewal thread.
    /// Returns the task's wake-ups and the notifications sent to it during
    /// the loop.
    async fn hot_loop(client: &LockClient, scheduler: &Scheduler, yields: bool) -> (u64, u64) {
        let cycle = || async {
            let guard = client
                .lock("hot")
                .ttl(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap();
            assert!(guard.release().await.unwrap());
            if yields {
                tokio::task::yield_now().await;
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        };
        // The first cycle starts the task.
        cycle().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let wakeups = scheduler.wakeups.load(Ordering::Relaxed);
        let notifications = scheduler.notifications.load(Ordering::Relaxed);
        for _ in 0..CYCLES {
            cycle().await;
        }
        (
            scheduler.wakeups.load(Ordering::Relaxed) - wakeups,
            scheduler.notifications.load(Ordering::Relaxed) - notifications,
        )
    }

    /// Few wake-ups: at most one per tick (100 ms) while the loop runs,
    /// plus a few, and far below one per cycle.
    fn assert_few(wakeups: u64, notifications: u64, elapsed: Duration) {
        let ticks = u64::try_from(elapsed.as_millis() / 100).unwrap_or(u64::MAX);
        assert!(
            wakeups <= ticks + 5 && wakeups < CYCLES / 20,
            "{wakeups} wake-ups in {CYCLES} cycles ({elapsed:?})"
        );
        // No notification: each guard's first timer lies beyond the tick.
        assert!(
            notifications <= 2,
            "{notifications} notifications in {CYCLES} cycles"
        );
    }

    /// What each held lock costs in lock-core's own structures (issue #13:
    /// at most 400 bytes a held lock with a driver's share on top). Before
    /// the diet: a slot of 64 bytes, a guard of 32, the guard's shared state
    /// of 144 (a `u128` owner aligned leases to 16 bytes).
    #[test]
    fn per_lock_structures_stay_small() {
        use std::mem::size_of;
        assert_eq!(size_of::<Slot>(), 48);
        assert_eq!(size_of::<LockGuard>(), 24);
        assert_eq!(size_of::<crate::OwnerId>(), 16);
        assert_eq!(std::mem::align_of::<crate::Lease>(), 8);
        assert!(
            size_of::<crate::Lease>() <= 104,
            "{}",
            size_of::<crate::Lease>()
        );
        assert!(size_of::<Shared>() <= 136, "{}", size_of::<Shared>());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_hot_acquire_release_loop_rarely_wakes_the_scheduler() {
        let (client, scheduler) = setup_on(true);
        let started = Instant::now();
        let (wakeups, notifications) = hot_loop(&client, &scheduler, true).await;
        let elapsed = started.elapsed();
        println!(
            "{CYCLES} cycles in {elapsed:?}: {wakeups} wake-ups, {notifications} notifications"
        );
        assert_few(wakeups, notifications, elapsed);

        // The behaviour before ticks (a linger of zero): the task goes to
        // an unbounded sleep whenever it finds its queue empty, and the
        // next registration wakes it: here once per cycle.
        let (client, scheduler) = setup_on(true);
        scheduler.lock().linger = 0;
        let (wakeups, notifications) = hot_loop(&client, &scheduler, true).await;
        println!("without ticks: {wakeups} wake-ups, {notifications} notifications");
        assert!(
            notifications >= CYCLES * 9 / 10 && wakeups >= CYCLES * 9 / 10,
            "without ticks: {wakeups} wake-ups, {notifications} notifications"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hot_loop_rarely_wakes_the_dedicated_renewal_thread() {
        let _timing = TIMING.lock().await;
        let (client, scheduler) = setup();
        let started = Instant::now();
        let (wakeups, notifications) = hot_loop(&client, &scheduler, false).await;
        let elapsed = started.elapsed();
        println!(
            "{CYCLES} cycles in {elapsed:?}: {wakeups} wake-ups, {notifications} notifications"
        );
        assert_few(wakeups, notifications, elapsed);
    }

    /// The memory backend with every grant attached to one session
    /// channel, as a session backend (SQL session mode, ZooKeeper) hands
    /// out the channel of the connection the lock lives in.
    #[derive(Debug)]
    struct OneSession {
        inner: MemoryBackend,
        session: std::sync::Mutex<watch::Sender<SessionState>>,
    }

    impl OneSession {
        fn subscribe(&self) -> watch::Receiver<SessionState> {
            self.session.lock().unwrap().subscribe()
        }

        /// Grants from now on live on a new session (the old one stays open).
        fn new_session(&self) -> watch::Sender<SessionState> {
            let (tx, _) = watch::channel(SessionState::Alive);
            std::mem::replace(&mut *self.session.lock().unwrap(), tx)
        }
    }

    #[async_trait::async_trait]
    impl LockBackend for OneSession {
        fn name(&self) -> &'static str {
            "one-session"
        }
        fn capabilities(&self) -> crate::Capabilities {
            self.inner.capabilities()
        }
        async fn try_acquire(
            &self,
            key: &crate::LockKey,
            ttl: Duration,
        ) -> Result<Option<crate::Lease>, LockError> {
            let lease = self.inner.try_acquire(key, ttl).await?;
            Ok(lease.map(|l| l.with_session(self.subscribe())))
        }
        async fn acquire(
            &self,
            key: &crate::LockKey,
            ttl: Duration,
            deadline: Instant,
        ) -> Result<crate::Lease, LockError> {
            let lease = self.inner.acquire(key, ttl, deadline).await?;
            Ok(lease.with_session(self.subscribe()))
        }
        async fn renew(&self, lease: &crate::Lease) -> Result<Instant, LockError> {
            self.inner.renew(lease).await
        }
        async fn release(&self, lease: &crate::Lease) -> Result<bool, LockError> {
            self.inner.release(lease).await
        }
        async fn inspect(
            &self,
            key: &crate::LockKey,
        ) -> Result<Option<crate::LockInfo>, LockError> {
            self.inner.inspect(key).await
        }
    }

    /// A renewal thread of the test's own (a current-thread runtime),
    /// stopped when the sender is dropped: the process-wide dedicated
    /// thread is shared by every test, whose load would blur timings here
    /// (and this test's wake-ups theirs).
    fn own_renewal_thread() -> (RenewalRuntime, tokio::sync::oneshot::Sender<()>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let _ = runtime.block_on(stopped);
        });
        (RenewalRuntime::from_handle(handle), stop)
    }

    /// A client over a [`OneSession`] backend renewing on a thread of its
    /// own, its scheduler and backend, and the thread's stop.
    fn session_setup(
        idle_limit: usize,
    ) -> (
        LockClient,
        Arc<Scheduler>,
        Arc<OneSession>,
        tokio::sync::oneshot::Sender<()>,
    ) {
        let (session, _) = watch::channel(SessionState::Alive);
        let one = Arc::new(OneSession {
            inner: MemoryBackend::new(),
            session: std::sync::Mutex::new(session),
        });
        let backend: Arc<dyn LockBackend> = one.clone();
        let (runtime, stop) = own_renewal_thread();
        let scheduler = Scheduler::shared_for(&backend, &runtime.handle().unwrap());
        scheduler.lock().idle_limit = idle_limit;
        let client = LockClient::from_arc(backend).with_renewal_runtime(runtime);
        (client, scheduler, one, stop)
    }

    /// Every guard of a hot loop lives on the same session channel: the
    /// session's slot and watcher outlive its last guard, so registering the
    /// next one does not wake the task. With idle sessions freed at once
    /// (the previous behaviour) each cycle's guard was a new session and
    /// woke the task to arm a watcher.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hot_loop_on_one_session_rarely_wakes_the_renewal_thread() {
        let _timing = TIMING.lock().await;
        let (client, scheduler, _one, _stop) = session_setup(IDLE_SESSIONS);
        let started = Instant::now();
        let (wakeups, notifications) = hot_loop(&client, &scheduler, false).await;
        let elapsed = started.elapsed();
        println!(
            "one session, {CYCLES} cycles in {elapsed:?}: {wakeups} wake-ups, {notifications} notifications"
        );
        assert_few(wakeups, notifications, elapsed);

        let (client, scheduler, _one, _stop) = session_setup(0);
        let (wakeups, notifications) = hot_loop(&client, &scheduler, false).await;
        println!("idle sessions freed: {wakeups} wake-ups, {notifications} notifications");
        assert!(
            notifications >= CYCLES * 9 / 10,
            "idle sessions freed: {notifications} notifications in {CYCLES} cycles"
        );
    }

    /// Lets the task go to a long sleep (linger over, nothing registered),
    /// then makes registrations never notify it (the
    /// deliberately broken variant), takes a guard on the session, ends the
    /// session, and returns how long the guard took to read `Lost` (`None`:
    /// not within 500 ms). Only a watcher the task armed before can tell it.
    async fn lost_unnotified(
        client: &LockClient,
        scheduler: &Scheduler,
        one: &OneSession,
    ) -> Option<Duration> {
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(
            from_ns(scheduler.lock().planned_wake) > Instant::now() + Duration::from_secs(2),
            "the task should sleep long now"
        );
        scheduler.lock().never_notify = true;
        let guard = client
            .lock("on-session")
            .ttl(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        let ended = Instant::now();
        one.session
            .lock()
            .unwrap()
            .send_replace(SessionState::Lost("connection closed".to_owned()));
        while ended.elapsed() < Duration::from_millis(500) {
            if matches!(guard.state(), crate::LockState::Lost(_)) {
                return Some(ended.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        None
    }

    /// A guard on a session kept idle (its watcher armed for an earlier
    /// guard, now released) turns `Lost` at once when the session ends,
    /// without its registration waking the task. Controls: with idle
    /// sessions freed (the previous behaviour) or on a session no guard
    /// used before (a new connection's), the same unnotified registration
    /// is not told: there the registration's notification is what arms the
    /// watcher.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_guard_on_a_reused_idle_session_sees_the_session_end_at_once() {
        let _timing = TIMING.lock().await;
        for (idle_limit, same_session, expect_seen) in [
            (IDLE_SESSIONS, true, true),
            (0, true, false),
            (IDLE_SESSIONS, false, false),
        ] {
            let (client, scheduler, one, _stop) = session_setup(idle_limit);
            scheduler.lock().linger = duration_ns(Duration::from_millis(50));
            let first = client
                .lock("on-session")
                .ttl(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap();
            // The task armed a watcher on the session (it runs on the
            // shared renewal thread, which other tests keep busy).
            settle_until(|| scheduler.lock().sessions.iter().any(|s| s.watched)).await;
            assert!(first.release().await.unwrap());
            let _old = (!same_session).then(|| one.new_session());
            let lost = lost_unnotified(&client, &scheduler, &one).await;
            let case = format!("idle limit {idle_limit}, same session {same_session}");
            if expect_seen {
                // At once: the task woke on the session's change (the guard's
                // 10 s TTL is far away); margin for a busy renewal thread.
                assert!(
                    lost.is_some_and(|d| d < Duration::from_millis(250)),
                    "{case}: lost after {lost:?}"
                );
            } else {
                assert_eq!(lost, None, "{case}: the guard saw the session end");
            }
        }
    }

    async fn settle_until(what: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(5);
        while !what() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(what(), "condition not reached");
    }

    /// Holds a 10 s-TTL lock, lets registrations grow old (past the linger,
    /// so the task sleeps until that lock's renewal, seconds away), then
    /// takes a 30 ms-TTL lock and watches it for 300 ms. Returns whether it
    /// was held throughout, with its renewals.
    async fn short_ttl_after_a_long_sleep(never_notify: bool) -> (bool, u32) {
        let (client, scheduler) = setup();
        scheduler.lock().linger = duration_ns(Duration::from_millis(50));
        let long = client
            .lock("long")
            .ttl(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        // Past the linger and one more tick: the task plans its next
        // wake-up at the long lock's renewal.
        tokio::time::sleep(Duration::from_millis(250)).await;
        let planned = scheduler.lock().planned_wake;
        assert!(
            from_ns(planned) > Instant::now() + Duration::from_secs(2),
            "the task should sleep long now"
        );
        scheduler.lock().never_notify = never_notify;
        let short = client
            .lock("short")
            .ttl(Duration::from_millis(30))
            .acquire()
            .await
            .unwrap();
        let mut renewals = 0;
        let mut deadline = short.validity_deadline();
        let until = Instant::now() + Duration::from_millis(300);
        let mut held = true;
        while Instant::now() < until {
            if !short.is_held() {
                held = false;
                break;
            }
            let now = short.validity_deadline();
            if now > deadline {
                renewals += 1;
                deadline = now;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(short);
        assert!(long.release().await.unwrap());
        (held, renewals)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_ttl_lock_registered_while_the_scheduler_sleeps_long_is_renewed() {
        let _timing = TIMING.lock().await;
        let (held, renewals) = short_ttl_after_a_long_sleep(false).await;
        assert!(held, "the 30 ms lock was lost ({renewals} renewals)");
        assert!(
            renewals >= 5,
            "only {renewals} renewals in 300 ms of a 30 ms lock"
        );

        // Control: a registration that does not notify the sleeping task
        // (the deliberately broken variant) loses the short lock.
        let (held, renewals) = short_ttl_after_a_long_sleep(true).await;
        assert!(
            !held,
            "without notification the 30 ms lock was still held ({renewals})"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_ttl_lock_registered_between_ticks_is_renewed_and_idle_stops_ticking() {
        let _timing = TIMING.lock().await;
        let (client, scheduler) = setup();
        scheduler.lock().linger = duration_ns(Duration::from_millis(100));
        let long = client
            .lock("long")
            .ttl(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The task ticks (at most 100 ms); the 30 ms lock's first renewal
        // is due before the next tick.
        let short = client
            .lock("short")
            .ttl(Duration::from_millis(30))
            .acquire()
            .await
            .unwrap();
        let first = short.validity_deadline();
        settle_until(|| short.validity_deadline() > first + Duration::from_millis(60)).await;
        assert!(short.is_held());
        assert!(short.release().await.unwrap());
        assert!(long.release().await.unwrap());

        // Nothing registered and the linger over: the task sleeps until
        // notified, it does not tick.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let wakeups = scheduler.wakeups.load(Ordering::Relaxed);
        assert_eq!(scheduler.lock().planned_wake, NEVER);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(scheduler.wakeups.load(Ordering::Relaxed), wakeups);
        // And the next registration wakes it (it must arm the timers).
        let again: LockGuard = client
            .lock("long")
            .ttl(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        settle_until(|| scheduler.wakeups.load(Ordering::Relaxed) > wakeups).await;
        assert!(again.release().await.unwrap());
    }
}
