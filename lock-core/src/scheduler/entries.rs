//! The registered guards' entries: slots, their timers, policies and caps,
//! what is due, and how a renewal's result moves an entry.

use tokio::time::Instant;

use super::timers::reserve_one;
use std::sync::Arc;
use std::time::Duration;

use super::{
    IN_FLIGHT, NEVER, NO_SESSION, POLICY_MASK, Pending, PolicySlot, Registration, SESSION_SUSPECT,
    Slot, State, duration_ns, interval_of, renewal_at, to_ns,
};
use crate::error::{ErrorKind, LockError};
use crate::hold::{HINT_HOLD_LIMIT, LockState, RenewalPolicy, Shared};
use crate::options::saturating_add;
use crate::telemetry::{HOLD_LIMIT, NOT_RENEWED, RENEWAL_FAILED};

impl State {
    pub(super) fn is_current(&self, registration: Registration) -> bool {
        self.slots
            .get(registration.slot as usize)
            .is_some_and(|s| s.generation == registration.generation && s.shared.is_some())
    }

    /// Where `shared`'s pending `registration` waits, if it still does
    /// (most recent last: a hot loop releases what it registered last).
    pub(super) fn pending_index(
        &self,
        registration: Registration,
        shared: &Arc<Shared>,
    ) -> Option<usize> {
        if registration != Registration::PENDING {
            return None;
        }
        self.pending
            .iter()
            .rposition(|p| Arc::ptr_eq(&p.shared, shared))
    }

    /// Puts every pending registration in the queue, as a registration
    /// straight into the queue would have (the task's pass, before it
    /// looks at its timers).
    pub(super) fn admit_pending(&mut self) {
        #[cfg(test)]
        if self.never_admit {
            return;
        }
        if self.pending.is_empty() {
            return;
        }
        let mut pending = std::mem::take(&mut self.pending);
        for entry in pending.drain(..) {
            self.admit(entry);
        }
        // The list keeps its room for the next registrations.
        self.pending = pending;
    }

    fn admit(&mut self, pending: Pending) {
        let Pending {
            shared,
            policy,
            due,
            hold_until,
        } = pending;
        let interval = interval_of(&policy, shared.original().ttl());
        let mut slot = self.slot_for(&shared, &policy, interval, due, hold_until);
        if self.apply_caps(&mut slot) {
            shared.set_hint(HINT_HOLD_LIMIT);
        }
        let timer = slot.due.min(shared.deadline_ns());
        // Counted as live since it was registered.
        self.live -= 1;
        let index = self.insert(slot);
        self.set_timer(index, timer);
        shared.set_admitted_slot(index);
    }

    /// A slot for `shared`, renewed by `policy` every `interval`, first due
    /// at `due`, held until `hold_until` at most (not in the table yet:
    /// see [`insert`](Self::insert)); the policy is counted in the policy
    /// table and its early-renewal window in `max_slack`.
    pub(super) fn slot_for(
        &mut self,
        shared: &Arc<Shared>,
        policy: &RenewalPolicy,
        interval: Duration,
        due: u64,
        hold_until: u64,
    ) -> Slot {
        let policy_index = self.policy_index(policy);
        self.max_slack = self.max_slack.max(duration_ns(interval / 4));
        Slot {
            shared: Some(shared.clone()),
            due,
            not_before: 0,
            hold_until,
            generation: 0,
            policy: policy_index,
            session: NO_SESSION,
            renewals: 0,
        }
    }

    pub(super) fn insert(&mut self, mut slot: Slot) -> u32 {
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

    pub(super) fn set_timer(&mut self, slot: u32, at: u64) {
        self.timers.set(slot, at);
    }

    pub(super) fn free_slot(&mut self, slot: u32) {
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

    /// Interned: guards share a few policies; a slot stores an index.
    pub(super) fn policy_index(&mut self, policy: &RenewalPolicy) -> u32 {
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

    pub(super) fn policy_of(&self, slot: &Slot) -> RenewalPolicy {
        self.policies
            .get(slot.policy_index())
            .map_or_else(RenewalPolicy::default, |p| p.policy)
    }

    /// Stops renewal once a cap is reached: the lease then runs out.
    /// Returns whether it did.
    pub(super) fn apply_caps(&self, slot: &mut Slot) -> bool {
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
    pub(super) fn apply_caps_at(&mut self, slot: u32) -> bool {
        let mut entry = std::mem::replace(&mut self.slots[slot as usize], Slot::vacant());
        let capped = self.apply_caps(&mut entry);
        self.slots[slot as usize] = entry;
        capped
    }

    pub(super) fn expiry_reason(&self, slot: &Slot) -> &'static str {
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
    pub(super) fn take_due(&mut self, now: u64) -> Vec<u32> {
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

    pub(super) fn eligible_early(&self, slot: u32, now: u64) -> bool {
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
    pub(super) fn expire_members(&mut self, members: &[(u32, u32)], now: u64) -> u64 {
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

    pub(super) fn apply_result(
        &mut self,
        slot: u32,
        result: Result<Instant, LockError>,
        now_at: Instant,
    ) {
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
        let key = shared.original().key();
        match &result {
            Ok(_) => {
                let margin = super::from_ns(shared.deadline_ns()).saturating_duration_since(now_at);
                crate::telemetry::renewal(shared.backend_name(), key, true, margin);
            }
            Err(_) => crate::telemetry::renewal(
                shared.backend_name(),
                key,
                false,
                std::time::Duration::ZERO,
            ),
        }
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
                entry.due = renewal_at(to_ns(new_deadline), ttl, interval, to_ns(now_at))
                    .max(to_ns(earliest));
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
