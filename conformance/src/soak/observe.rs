//! What the soak observes besides the history: the fenced counter per key,
//! the journal of writes, and the pairs the checker lists.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::{FencingToken, LockBackend, LockGuard, LockKey};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::fencing::FenceOutcome;
use crate::history::{Event, EventKind, History, Op, Recorder, Window, check};
use crate::recording::RecordingBackend;

#[derive(Debug, Default)]
pub(super) struct Register {
    pub(super) value: u64,
    pub(super) last_token: Option<u64>,
    /// The latest applied writes: (value after, writer's grant time,
    /// writer's process), to date a lost increment from the earliest grant
    /// involved and name every writer involved.
    pub(super) recent: std::collections::VecDeque<(u64, Duration, u64)>,
    /// The highest token the real fenced store accepted for this key.
    pub(super) store_last: Option<u64>,
}

/// Applied writes remembered per key.
pub(super) const RECENT_WRITES: usize = 64;

/// A write applied over a read that was no longer current, or (from
/// [`stale_writes`]) a write of an older grant that got in after a newer
/// grant's write.
#[derive(Debug, Clone)]
pub(super) struct LostIncrement {
    pub(super) grant_at: Duration,
    pub(super) write_at: Duration,
    pub(super) lost: u64,
    pub(super) key: String,
    /// The history's process of the writer (of a lost increment: the one
    /// whose write overwrote the others).
    pub(super) writer: u64,
    /// For a lost increment: the processes whose increments were
    /// overwritten. Any of them, or the writer, may be the late one (a
    /// frozen client's write that got in inside another's tenure is
    /// overwritten by that holder's own write).
    pub(super) overwritten: Vec<u64>,
    /// For a stale write: the start of the newer grant whose write got in
    /// first (the stale writer's lease was over, or should have been, by
    /// then).
    pub(super) newer_grant_at: Option<Duration>,
}

#[derive(Debug, Default)]
pub(super) struct ResourceState {
    pub(super) registers: HashMap<String, Register>,
    pub(super) applied: u64,
    pub(super) writes: usize,
    pub(super) writes_refused: usize,
    pub(super) reads_refused: usize,
    pub(super) lost: Vec<LostIncrement>,
    /// The real fenced store's side (`SoakConfig::fence_store`).
    pub(super) store: StoreCounts,
}

/// What the real fenced store answered, beside the resource's own rule.
#[derive(Debug, Default)]
pub(super) struct StoreCounts {
    pub(super) writes: usize,
    pub(super) refused: usize,
    pub(super) errors: usize,
    /// Accepted by the store although the rule says stale.
    pub(super) accepted_stale: usize,
    /// Refused by the store although the rule admits it.
    pub(super) refused_admitted: usize,
}

/// A counter per key that checks tokens on every access (when `fenced`).
#[derive(Debug)]
pub(super) struct Resource {
    pub(super) fenced: bool,
    pub(super) state: Mutex<ResourceState>,
}

impl Resource {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, ResourceState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn admits(&self, reg: &Register, token: FencingToken) -> bool {
        !self.fenced || reg.last_token.is_none_or(|last| token.get() >= last)
    }

    /// The value, or `None` when the token is below one already seen.
    pub(super) fn read(&self, key: &LockKey, token: FencingToken) -> Option<u64> {
        let mut state = self.lock();
        let reg = state.registers.entry(key.as_str().to_owned()).or_default();
        if !self.admits(reg, token) {
            state.reads_refused += 1;
            return None;
        }
        if self.fenced {
            reg.last_token = Some(token.get());
        }
        Some(reg.value)
    }

    /// Writes `read + 1`; records the write in the history (always, as it
    /// arrived, before judging it). `store`: what the real fenced store
    /// answered for the same write, made just before under the key's turn;
    /// its verdict is compared with the rule's.
    pub(super) fn write(
        &self,
        journal: &Journal,
        key: &LockKey,
        token: FencingToken,
        read: u64,
        grant_at: Duration,
        store: Option<Result<FenceOutcome, String>>,
    ) {
        let mut state = self.lock();
        let sent = self.fenced.then_some(token);
        journal.wrote(key, sent);
        state.writes += 1;
        let reg = state.registers.entry(key.as_str().to_owned()).or_default();
        let admitted = self.admits(reg, token);
        if let Some(answer) = store {
            // The store sees writes only (the resource's rule also counts
            // the tokens of reads): it is judged against the highest token
            // it accepted before, its writes of a key being in the same
            // order as here (they take turns).
            let below = reg.store_last.is_some_and(|last| token.get() < last);
            let counts = &mut state.store;
            counts.writes += 1;
            match answer {
                Ok(FenceOutcome::Accepted) => {
                    counts.accepted_stale += usize::from(below);
                    let reg = state.registers.entry(key.as_str().to_owned()).or_default();
                    reg.store_last = reg.store_last.max(Some(token.get()));
                }
                Ok(FenceOutcome::Refused { .. }) => {
                    counts.refused += 1;
                    counts.refused_admitted += usize::from(!below);
                }
                Err(_) => counts.errors += 1,
            }
        }
        if !admitted {
            state.writes_refused += 1;
            return;
        }
        let reg = state.registers.entry(key.as_str().to_owned()).or_default();
        let lost = reg.value.saturating_sub(read);
        // The overwritten increments' writers may have been granted before
        // this writer (e.g. across a restart that reset the tokens): the
        // lost update spans from the earliest of those grants.
        let overwritten: Vec<(Duration, u64)> = reg
            .recent
            .iter()
            .rev()
            .take_while(|(after, _, _)| *after > read)
            .map(|(_, at, writer)| (*at, *writer))
            .collect();
        let earliest = overwritten
            .iter()
            .map(|(at, _)| *at)
            .fold(grant_at, Duration::min);
        let mut overwritten: Vec<u64> = overwritten.into_iter().map(|(_, w)| w).collect();
        overwritten.sort_unstable();
        overwritten.dedup();
        let writer = journal.recorder.id();
        reg.value = read + 1;
        reg.recent.push_back((reg.value, grant_at, writer));
        if reg.recent.len() > RECENT_WRITES {
            reg.recent.pop_front();
        }
        if self.fenced {
            reg.last_token = Some(token.get());
        }
        state.applied += 1;
        if lost > 0 {
            state.lost.push(LostIncrement {
                grant_at: earliest,
                write_at: journal.now(),
                lost,
                key: key.as_str().to_owned(),
                writer,
                overwritten,
                newer_grant_at: None,
            });
        }
    }
}

// ---------------------------------------------------------------------
// Where the soak touches the history API (kept in one place).

/// One worker's recorder plus the run's clock.
#[derive(Clone, Debug)]
pub(super) struct Journal {
    pub(super) recorder: Recorder,
    pub(super) clock: Instant,
}

impl Journal {
    pub(super) fn now(&self) -> Duration {
        self.clock.elapsed()
    }

    pub(super) fn wrote(&self, key: &LockKey, token: Option<FencingToken>) {
        self.recorder.wrote(key, token);
    }

    /// The worker's backend, recording acquires, renewals and releases.
    pub(super) fn backend(&self, inner: Arc<dyn LockBackend>) -> Arc<dyn LockBackend> {
        Arc::new(RecordingBackend::new(inner, self.recorder.clone()))
    }

    /// Records the guard's lost signal when it comes.
    pub(super) fn watch_lost(&self, guard: &LockGuard) -> JoinHandle<()> {
        crate::recording::record_lost(guard, &self.recorder)
    }
}

/// Grants, errors and lost signals on the history's clock, from its events.
pub(super) struct Observed {
    pub(super) grants: Vec<Duration>,
    pub(super) errors: Vec<Duration>,
    pub(super) lost: Vec<Duration>,
    /// (key, time, token) of every grant, in grant order.
    pub(super) tokens: Vec<(String, Duration, u64)>,
}

/// Every overlapping pair of promised windows, from the checker (which
/// lists only its first few): after each pass the earlier window of every
/// listed pair is taken out of the history and the checker runs again,
/// until it lists all it counts. Each pair's attribution interval starts
/// at its earlier window's start, so the pairs of a removed window not
/// listed yet (later, overlapping the same window) are judged by the same
/// faults as the listed ones. Returns the pairs and whether the passes
/// ran out before everything was listed.
pub(super) fn all_overlaps(events: &[Event]) -> (Vec<(Window, Window)>, bool) {
    const MAX_PASSES: usize = 2000;
    let mut events: Vec<Event> = events.to_vec();
    let mut pairs = Vec::new();
    for _ in 0..MAX_PASSES {
        let report = check(&events);
        if report.overlaps.is_empty() {
            return (pairs, false);
        }
        let complete = report.overlap_count <= report.overlaps.len();
        let earlier: Vec<Window> = report.overlaps.iter().map(|(a, _)| a.clone()).collect();
        pairs.extend(report.overlaps);
        if complete {
            return (pairs, false);
        }
        events.retain(|e| {
            !(e.op == Op::Acquire
                && e.kind == EventKind::Ok
                && earlier.iter().any(|w| {
                    w.process == e.process
                        && w.key == e.key
                        && w.token == e.token
                        && w.start == e.at
                }))
        });
    }
    (pairs, true)
}

/// The writes the checker counts as stale, each with its writer's grant:
/// the checker's rule (a token-checking resource accepts a write without a
/// token, or with a token above the last accepted one; it is stale when a
/// write of a later grant of the key was accepted before it) replayed on
/// the recorded events, with grants dated as the checker dates them (the
/// writer's latest grant of the key that started before the write).
pub(super) fn stale_writes(events: &[Event]) -> Vec<LostIncrement> {
    let mut grants: HashMap<(u64, &str), Vec<Duration>> = HashMap::new();
    let mut keys: HashMap<&str, (Option<u64>, Option<Duration>)> = HashMap::new();
    let mut out = Vec::new();
    for e in events {
        match (e.op, e.kind) {
            (Op::Acquire, EventKind::Ok) => {
                grants
                    .entry((e.process, e.key.as_str()))
                    .or_default()
                    .push(e.at);
            }
            (Op::Write, EventKind::Ok) => {
                let grant = grants
                    .get(&(e.process, e.key.as_str()))
                    .and_then(|list| list.iter().rev().find(|at| **at <= e.at).copied());
                let (last, newest) = keys.entry(e.key.as_str()).or_default();
                let accepted = match (e.token, *last) {
                    (None, _) | (Some(_), None) => true,
                    (Some(t), Some(l)) => t > l,
                };
                if !accepted {
                    continue;
                }
                if let Some(t) = e.token {
                    *last = Some(last.map_or(t, |l| l.max(t)));
                }
                if let Some(g) = grant {
                    match *newest {
                        Some(n) if g < n => out.push(LostIncrement {
                            grant_at: g,
                            write_at: e.at,
                            lost: 0,
                            key: e.key.clone(),
                            writer: e.process,
                            overwritten: Vec::new(),
                            newer_grant_at: Some(n),
                        }),
                        _ => *newest = Some(g),
                    }
                }
            }
            _ => {}
        }
    }
    out
}

pub(super) fn observed(history: &History) -> Observed {
    observed_in(&history.events())
}

/// [`observed`] of a list of events.
pub(super) fn observed_in(events: &[Event]) -> Observed {
    let mut out = Observed {
        grants: Vec::new(),
        errors: Vec::new(),
        lost: Vec::new(),
        tokens: Vec::new(),
    };
    for e in events {
        match (e.op, e.kind) {
            (Op::Acquire, EventKind::Ok) => {
                out.grants.push(e.at);
                if let Some(t) = e.token {
                    out.tokens.push((e.key.clone(), e.at, t));
                }
            }
            (Op::Acquire | Op::Renew, EventKind::Fail) => out.errors.push(e.at),
            (Op::Lost, _) => out.lost.push(e.at),
            _ => {}
        }
    }
    out
}

// ---------------------------------------------------------------------
// Workers.
