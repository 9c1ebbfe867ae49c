//! The scheduler's task: its passes over the queue, the `renew_many`
//! batches in flight, its event loop, and what its end means for the
//! guards.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::task::Poll;

use tokio::runtime::Handle;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;

use super::sessions::{Watcher, watch_session};
use super::{IN_FLIGHT, NEVER, Registration, Scheduler, State, from_ns, to_ns};
use crate::backend::LockBackend;
use crate::error::LockError;
use crate::hold::LockState;
use crate::renew_many::{RENEW_BATCH, missing_result};
use crate::types::SessionState;

impl Scheduler {
    pub(super) fn spawn_task(self: &Arc<Self>, handle: &Handle) {
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
        st.admit_pending();
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
            let pending = std::mem::take(&mut st.pending);
            st.live -= pending.len();
            lost.extend(pending.into_iter().map(|p| p.shared));
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

type RenewManyFuture = Pin<Box<dyn Future<Output = Vec<Result<Instant, LockError>>> + Send>>;

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
            let span = tracing::debug_span!(
                "distlock.renew",
                backend = backend.name(),
                leases = leases.len(),
                failed = tracing::field::Empty,
            );
            let results =
                tracing::Instrument::instrument(backend.renew_many(&leases), span.clone()).await;
            if !span.is_disabled() {
                span.record("failed", results.iter().filter(|r| r.is_err()).count());
            }
            results
        });
        Self {
            members,
            min_deadline,
            call,
        }
    }
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
