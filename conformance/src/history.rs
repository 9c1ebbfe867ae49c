//! A history of what clients did and were told, on one monotonic clock, and
//! a checker that finds safety violations in it.
//!
//! Clients record `invoke` / `ok` / `fail` / `info` events. A holder's
//! *promised window* for a grant runs from the moment its acquire returned
//! until the earliest of: its validity deadline (moved by renewals), the
//! moment it started to release, and the moment it learnt the lock was
//! lost. A correct lock service never lets two promised windows on one key
//! overlap, never hands out a grant whose window is already over, and (with
//! fencing) tokens grow in grant order.
//!
//! Writes to the protected resource are recorded plainly (token, writer,
//! time): the recorder never judges them. The checker replays them against
//! the rule a fenced resource applies (accept only a token above the last
//! accepted one; a write without a token cannot be checked and goes
//! through) and reports every write that rule would let in although a write
//! of a *later* grant had already been accepted: a stale holder's write
//! reaching the resource, which is what fencing exists to prevent. The rule
//! replayed rejects a token *lower* than the last accepted one; an equal
//! token is the same holder writing again (two grants that share a token
//! are reported as duplicate tokens, and the older one's later write as a
//! stale write).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::{FencingToken, LeaseKind, LockKey};
use serde::Serialize;
use tokio::time::Instant;

/// What kind of event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A request was sent.
    Invoke,
    /// It succeeded.
    Ok,
    /// It failed (definitely had no effect).
    Fail,
    /// Its outcome is unknown, or a notification (lost signal).
    Info,
}

/// Which operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Acquire.
    Acquire,
    /// Renew.
    Renew,
    /// Release.
    Release,
    /// The holder was told the lock is lost.
    Lost,
    /// A fenced write to the protected resource.
    Write,
}

/// One event.
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    /// Time since the history started.
    pub at: Duration,
    /// Which client process / task.
    pub process: u64,
    /// Event kind.
    pub kind: EventKind,
    /// Operation.
    pub op: Op,
    /// Key.
    pub key: String,
    /// Fencing token involved, if any.
    pub token: Option<u64>,
    /// For acquire/renew `Ok`: the promised validity deadline.
    pub valid_until: Option<Duration>,
    /// For a grant that is not a mutex: its kind's code
    /// ([`LeaseKind::code`]: `r`, `w`, `p<count>-<limit>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
}

/// A thread-safe event log on one monotonic clock.
#[derive(Debug)]
pub struct History {
    start: Instant,
    events: Mutex<Vec<Event>>,
    next_process: AtomicU64,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    /// An empty history starting now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            events: Mutex::new(Vec::new()),
            next_process: AtomicU64::new(0),
        }
    }

    /// A recorder for a new process id.
    pub fn process(self: &Arc<Self>) -> Recorder {
        Recorder {
            history: self.clone(),
            process: self.next_process.fetch_add(1, Ordering::Relaxed),
        }
    }

    fn since(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.start)
    }

    fn push(&self, event: Event) {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
    }

    /// A copy of all events, in recording order.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Runs the checker over the events so far.
    pub fn check(&self) -> CheckReport {
        check(&self.events())
    }
}

/// Records events for one process.
#[derive(Clone, Debug)]
pub struct Recorder {
    history: Arc<History>,
    process: u64,
}

impl Recorder {
    /// The process id.
    pub fn id(&self) -> u64 {
        self.process
    }

    fn record(
        &self,
        kind: EventKind,
        op: Op,
        key: &LockKey,
        token: Option<FencingToken>,
        valid_until: Option<Instant>,
    ) {
        self.record_at(Instant::now(), kind, op, key, token, valid_until);
    }

    /// An operation is about to be sent.
    pub fn invoke(&self, op: Op, key: &LockKey, token: Option<FencingToken>) {
        self.record(EventKind::Invoke, op, key, token, None);
    }

    /// Acquire returned a grant valid until `deadline`.
    pub fn acquired(&self, key: &LockKey, token: FencingToken, deadline: Instant) {
        self.record(EventKind::Ok, Op::Acquire, key, Some(token), Some(deadline));
    }

    /// Acquire returned a grant of `kind` (a read or write share, permits)
    /// valid until `deadline`. The checker lets readers overlap readers and
    /// permits overlap permits up to their limit, and nothing else.
    pub fn acquired_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        token: FencingToken,
        deadline: Instant,
    ) {
        let h = &self.history;
        h.push(Event {
            at: h.since(Instant::now()),
            process: self.process,
            kind: EventKind::Ok,
            op: Op::Acquire,
            key: key.as_str().to_owned(),
            token: Some(token.get()),
            valid_until: Some(h.since(deadline)),
            grant: (kind != LeaseKind::Exclusive).then(|| kind.code()),
        });
    }

    /// Renew moved the grant's deadline.
    pub fn renewed(&self, key: &LockKey, token: FencingToken, deadline: Instant) {
        self.record(EventKind::Ok, Op::Renew, key, Some(token), Some(deadline));
    }

    /// Release finished (`held`: whether it was still ours).
    pub fn released(&self, key: &LockKey, token: FencingToken, held: bool) {
        let kind = if held { EventKind::Ok } else { EventKind::Fail };
        self.record(kind, Op::Release, key, Some(token), None);
    }

    /// An operation failed.
    pub fn failed(&self, op: Op, key: &LockKey, token: Option<FencingToken>) {
        self.record(EventKind::Fail, op, key, token, None);
    }

    /// The holder learnt the lock is lost.
    pub fn lost(&self, key: &LockKey, token: FencingToken) {
        self.record(EventKind::Info, Op::Lost, key, Some(token), None);
    }

    /// A write carrying `token` reached the protected resource (`None`: the
    /// writer had no fencing token to send). Recorded as it arrived, not
    /// judged: the checker decides what a fenced resource would have done.
    pub fn wrote(&self, key: &LockKey, token: Option<FencingToken>) {
        self.record(EventKind::Ok, Op::Write, key, token, None);
    }

    /// Records an event that happened at `at` (for events observed by
    /// another process and reported afterwards, e.g. writes that arrived
    /// at a resource server, or a grant seen from outside). The checker
    /// orders events by time, so they may be recorded late.
    pub fn record_at(
        &self,
        at: Instant,
        kind: EventKind,
        op: Op,
        key: &LockKey,
        token: Option<FencingToken>,
        valid_until: Option<Instant>,
    ) {
        let h = &self.history;
        h.push(Event {
            at: h.since(at),
            process: self.process,
            kind,
            op,
            key: key.as_str().to_owned(),
            token: token.map(FencingToken::get),
            valid_until: valid_until.map(|t| h.since(t)),
            grant: None,
        });
    }
}

/// A promised validity window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Window {
    /// Process.
    pub process: u64,
    /// Key.
    pub key: String,
    /// Token of the grant.
    pub token: Option<u64>,
    /// When acquire returned.
    pub start: Duration,
    /// When the promise ended.
    pub end: Duration,
    /// The grant's kind code, `None` for a mutex.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
}

impl Window {
    fn kind(&self) -> LeaseKind {
        self.grant
            .as_deref()
            .and_then(|code| LeaseKind::from_code(code).ok())
            .unwrap_or_default()
    }
}

/// What the checker found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CheckReport {
    /// Grants seen.
    pub grants: usize,
    /// The most promised windows open at once on one key.
    pub max_concurrent_holders: usize,
    /// Pairs of overlapping promised windows (first few).
    pub overlaps: Vec<(Window, Window)>,
    /// How many overlapping pairs in all.
    pub overlap_count: usize,
    /// Grants whose token was lower than an earlier grant's on the same key.
    pub token_regressions: usize,
    /// Grants whose token equalled an earlier grant's on the same key.
    pub duplicate_tokens: usize,
    /// Grants handed out with their promised window already over (the
    /// validity deadline at or before the moment acquire returned).
    pub grants_past_deadline: usize,
    /// Writes that a token-checking resource would accept although a write
    /// of a later grant of the same key had already been accepted: a stale
    /// holder got through (no token, or a token that went backwards).
    pub stale_writes_accepted: usize,
    /// Writes a token-checking resource would reject (token below the last
    /// accepted one): expected from holders that lost their lock.
    pub writes_rejected: usize,
    /// Rejected writes of a grant newer than the one whose token refused
    /// them: a current holder's token was below an earlier holder's (token
    /// order disagreed with grant order). A write of an older grant refused
    /// by a newer grant's token is fencing at work, whether or not the
    /// older grant's promised window was still open (an upper bound of a
    /// paused holder's deadline overlaps the next grant when it cannot be
    /// aligned to a renewal; the overlap is judged on its own).
    pub current_holder_writes_rejected: usize,
    /// Writes made outside the writer's promised window (after it ended,
    /// or with no grant of the writer in the history).
    pub writes_outside_window: usize,
    /// The most read shares open at once on one key.
    pub max_concurrent_readers: usize,
    /// The most semaphore permits held at once on one key.
    pub max_permits_held: u64,
    /// Grants that took a semaphore past its limit.
    pub permits_over_limit: usize,
    /// Read grants whose token was not that of the latest write grant
    /// before them (0 when there was none).
    pub read_token_mismatches: usize,
}

impl CheckReport {
    /// No overlapping windows, no grant handed out past its deadline, and
    /// no stale write accepted.
    pub fn is_exclusive(&self) -> bool {
        self.overlap_count == 0
            && self.stale_writes_accepted == 0
            && self.grants_past_deadline == 0
            && self.permits_over_limit == 0
    }

    /// Exclusive, tokens grew strictly with every grant, and no current
    /// holder's write would have been rejected.
    pub fn is_safe_with_fencing(&self) -> bool {
        self.is_exclusive()
            && self.token_regressions == 0
            && self.duplicate_tokens == 0
            && self.current_holder_writes_rejected == 0
            && self.read_token_mismatches == 0
    }

    /// A one-line summary.
    pub fn summary(&self) -> String {
        let mut shared = String::new();
        if self.max_concurrent_readers > 0 || self.max_permits_held > 0 {
            shared = format!(
                "; max {} reader(s) at once, max {} permit(s) held, {} grant(s) over the limit, {} read token mismatch(es)",
                self.max_concurrent_readers,
                self.max_permits_held,
                self.permits_over_limit,
                self.read_token_mismatches
            );
        }
        let main = format!(
            "{} grants, max {} concurrent holder(s), {} overlapping window pair(s), {} grant(s) past their deadline, {} token regression(s), {} duplicate token(s), {} stale write(s) accepted, {} write(s) rejected ({} from current holders), {} write(s) outside the writer's window",
            self.grants,
            self.max_concurrent_holders,
            self.overlap_count,
            self.grants_past_deadline,
            self.token_regressions,
            self.duplicate_tokens,
            self.stale_writes_accepted,
            self.writes_rejected,
            self.current_holder_writes_rejected,
            self.writes_outside_window
        );
        main + &shared
    }
}

/// Checks a history (see the module docs for what a window is). Events are
/// taken in time order (recording order among equal times).
pub fn check(events: &[Event]) -> CheckReport {
    let mut sorted = events.to_vec();
    sorted.sort_by_key(|e| e.at);
    let events = &sorted[..];
    let mut report = CheckReport::default();
    // Windows, keyed by (process, key, token): built from acquire ok, moved
    // by renew ok, cut by release invoke and lost info.
    let mut windows: Vec<Window> = Vec::new();
    let mut open: HashMap<(u64, String, Option<u64>), usize> = HashMap::new();
    for event in events {
        let id = (event.process, event.key.clone(), event.token);
        match (event.op, event.kind) {
            (Op::Acquire, EventKind::Ok) => {
                report.grants += 1;
                let end = event.valid_until.unwrap_or(event.at);
                if end <= event.at {
                    report.grants_past_deadline += 1;
                }
                open.insert(id, windows.len());
                windows.push(Window {
                    process: event.process,
                    key: event.key.clone(),
                    token: event.token,
                    start: event.at,
                    end,
                    grant: event.grant.clone(),
                });
            }
            (Op::Renew, EventKind::Ok) => {
                if let (Some(&i), Some(until)) = (open.get(&id), event.valid_until) {
                    // A renewal only counts if it came before the window
                    // closed; a late one cannot reopen a lapsed promise.
                    if event.at <= windows[i].end {
                        windows[i].end = windows[i].end.max(until);
                    }
                }
            }
            (Op::Release, EventKind::Invoke) | (Op::Lost, _) => {
                if let Some(i) = open.remove(&id) {
                    windows[i].end = windows[i].end.min(event.at);
                }
            }
            _ => {}
        }
    }

    let mut by_key: HashMap<&str, Vec<&Window>> = HashMap::new();
    for w in &windows {
        by_key.entry(w.key.as_str()).or_default().push(w);
    }
    for list in by_key.values_mut() {
        list.sort_by_key(|w| w.start);
        // Sweep for concurrency and overlapping pairs: readers may overlap
        // readers and permits permits (up to their limit), nothing else.
        let mut active: Vec<&Window> = Vec::new();
        for w in list.iter() {
            active.retain(|a| a.end > w.start);
            let kind = w.kind();
            for a in &active {
                if kind.compatible_with(a.kind()) {
                    continue;
                }
                report.overlap_count += 1;
                if report.overlaps.len() < 10 {
                    report.overlaps.push(((*a).clone(), (*w).clone()));
                }
            }
            active.push(w);
            report.max_concurrent_holders = report.max_concurrent_holders.max(active.len());
            let readers = active
                .iter()
                .filter(|a| a.kind() == LeaseKind::Read)
                .count();
            report.max_concurrent_readers = report.max_concurrent_readers.max(readers);
            if let LeaseKind::Permits { limit, .. } = kind {
                let held: u64 = active
                    .iter()
                    .map(|a| match a.kind() {
                        LeaseKind::Permits { count, .. } => u64::from(count),
                        _ => 0,
                    })
                    .sum();
                report.max_permits_held = report.max_permits_held.max(held);
                if held > u64::from(limit) {
                    report.permits_over_limit += 1;
                }
            }
        }
        check_tokens(list, &mut report);
    }

    judge_writes(events, &windows, &mut report);
    report
}

/// Tokens in grant order. Mutex and write grants must strictly grow; a
/// read grant must carry the token of the latest write grant before it
/// (0 when there was none). Permit grants are concurrent by design, so the
/// order in which their acquires returned says nothing about the order
/// they were granted in: their tokens need only be distinct.
fn check_tokens(list: &[&Window], report: &mut CheckReport) {
    let mut highest: Option<u64> = None;
    let mut epoch: u64 = 0;
    let mut permit_tokens = std::collections::HashSet::new();
    for w in list {
        let Some(token) = w.token else { continue };
        match w.kind() {
            LeaseKind::Read => {
                if token != epoch {
                    report.read_token_mismatches += 1;
                }
            }
            LeaseKind::Permits { .. } => {
                if !permit_tokens.insert(token) {
                    report.duplicate_tokens += 1;
                }
            }
            kind => {
                match highest {
                    Some(h) if token < h => report.token_regressions += 1,
                    Some(h) if token == h => report.duplicate_tokens += 1,
                    _ => {}
                }
                highest = Some(highest.map_or(token, |h| h.max(token)));
                if kind == LeaseKind::Write {
                    epoch = token;
                }
            }
        }
    }
}

/// Replays the recorded writes against a token-checking resource and judges
/// each one by the grant it came from (the writer's latest grant of the key
/// that started before the write).
fn judge_writes(events: &[Event], windows: &[Window], report: &mut CheckReport) {
    let mut by_writer: HashMap<(u64, &str), Vec<&Window>> = HashMap::new();
    for w in windows {
        by_writer
            .entry((w.process, w.key.as_str()))
            .or_default()
            .push(w);
    }
    #[derive(Default)]
    struct KeyState {
        last_token: Option<u64>,
        /// Start of the grant whose write set `last_token`.
        last_token_grant: Option<Duration>,
        /// Start of the latest grant whose write was accepted.
        newest_grant: Option<Duration>,
    }
    let mut keys: HashMap<&str, KeyState> = HashMap::new();
    for event in events
        .iter()
        .filter(|e| e.op == Op::Write && e.kind == EventKind::Ok)
    {
        let grant = by_writer
            .get(&(event.process, event.key.as_str()))
            .and_then(|list| {
                list.iter()
                    .filter(|w| w.start <= event.at)
                    .max_by_key(|w| w.start)
            });
        let inside = grant.is_some_and(|w| event.at <= w.end);
        if !inside {
            report.writes_outside_window += 1;
        }
        let state = keys.entry(event.key.as_str()).or_default();
        let accepted = match (event.token, state.last_token) {
            // No token: a resource has nothing to check.
            (None, _) | (Some(_), None) => true,
            (Some(token), Some(last)) => token >= last,
        };
        if !accepted {
            report.writes_rejected += 1;
            let refused_by_older = match (grant, state.last_token_grant) {
                (Some(w), Some(refusing)) => w.start > refusing,
                _ => false,
            };
            if refused_by_older {
                report.current_holder_writes_rejected += 1;
            }
            continue;
        }
        if let Some(token) = event.token
            && state.last_token.is_none_or(|last| token >= last)
        {
            state.last_token = Some(token);
            state.last_token_grant = grant.map(|w| w.start);
        }
        if let Some(w) = grant {
            match state.newest_grant {
                Some(newest) if w.start < newest => report.stale_writes_accepted += 1,
                _ => state.newest_grant = Some(w.start),
            }
        }
    }
}

/// A protected resource that accepts a write only if its token is greater
/// than the last accepted one, the way a real resource uses fencing tokens
/// (`UPDATE ... WHERE last_token < $token`).
///
/// Its own verdicts only drive its value (for lost-update checks) and its
/// counters; the history gets a plain record of each write (token, writer,
/// time) and the checker judges the order independently, from the grants.
#[derive(Debug, Default)]
pub struct FencedResource {
    state: Mutex<FencedState>,
}

#[derive(Debug, Default)]
struct FencedState {
    last_token: Option<u64>,
    value: u64,
    accepted: u64,
    rejected: u64,
}

impl FencedResource {
    /// A new resource with value 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies `update` to the value if `token` is newer than every token
    /// accepted so far; returns whether it was accepted, and records it.
    pub fn write(
        &self,
        recorder: &Recorder,
        key: &LockKey,
        token: FencingToken,
        update: impl FnOnce(&mut u64),
    ) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let accepted = state.last_token.is_none_or(|last| token.get() > last);
        if accepted {
            state.last_token = Some(token.get());
            update(&mut state.value);
            state.accepted += 1;
        } else {
            state.rejected += 1;
        }
        // Recorded under the resource's lock, so history order is arrival
        // order.
        recorder.wrote(key, Some(token));
        accepted
    }

    /// The current value.
    pub fn value(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .value
    }

    /// How many writes were rejected as stale.
    pub fn rejected(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .rejected
    }

    /// How many writes were accepted.
    pub fn accepted(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .accepted
    }
}

#[cfg(test)]
mod tests;
