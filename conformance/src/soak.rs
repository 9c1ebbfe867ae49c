//! A randomized fault soak: clients take locks and update a counter under
//! them against one deployment while a nemesis injects faults on a random
//! schedule; the history checker judges the whole run.
//!
//! # What runs
//!
//! - **Workers** (4 by default) loop over a few keys: acquire through a
//!   guard (`client.lock(key).ttl(..).wait(..)`), a fenced read of the
//!   key's counter, a short hold, then a fenced write of `read + 1`, then
//!   release. A well-behaved worker checks that its guard still holds
//!   before it reads and before it writes. Every operation, renewal, lost
//!   signal and write is recorded in one [`History`].
//! - **The protected resource** is a counter per key that refuses a read
//!   or a write whose token is below the highest one it has seen, the way
//!   a store uses fencing tokens (`UPDATE .. WHERE last_token <= $token`).
//!   On a backend without fencing (capabilities) writes carry no token and
//!   are all applied. Lost increments are `applied writes - final value`.
//! - **The nemesis** runs two lanes from one seeded schedule: process and
//!   network faults one after another ([`FaultKind`]), and client freezes
//!   (a worker that stops acting while it holds its guard's token, for a
//!   time that may exceed the TTL, then writes with that token without
//!   looking again, as a process paused by a GC or SIGSTOP would; its
//!   guard does not renew during the freeze, since a paused process renews
//!   nothing either).
//!
//! # Replaying a run
//!
//! Everything random comes from one seed ([`SplitMix64`]): the fault
//! schedule (kinds, order, durations, targets, gaps) is a pure function of
//! the seed, the kinds that apply and the run's length ([`plan`]); each
//! worker draws its keys and hold times from its own stream derived from
//! the same seed. Timing (how fast servers answer) still differs between
//! runs, so a replay repeats the schedule exactly and the clients' choices
//! in the same order, not every interleaving.
//!
//! # Judging, and negative controls
//!
//! The verdict comes from [`history::check`](crate::history::check) over
//! the whole run (overlapping promised windows, grants past their
//! deadline, stale writes accepted, token regressions and duplicates where
//! the backend promises fencing) plus lost increments of the counter. Each
//! violation found is attributed to the fault kinds that were active
//! during it (for an overlap: from the first grant's start to the end of
//! the overlap; for a stale write or a lost increment: from the writer's
//! grant to its write; for a token regression: between the two grants).
//!
//! Some fault kinds are known to break some backends, decided from
//! [`Capabilities`] only ([`known_unsafe`]): server restarts, leader kills
//! and node kills where `fencing_survives_failover` is false (Redis without
//! persistence, an asynchronous replica promoted), client freezes, client
//! partitions and latency where there is no fencing (Redlock), member
//! partitions where the store is not linearizable. The nemesis still
//! injects them (a negative control must be able to show its violation),
//! and a violation during which one of them was active is reported as
//! *expected (negative control)* for that kind instead of failing the run.
//! A violation with no known-unsafe fault active, or none at all, fails
//! the run ([`SoakReport::fails_run`]). Stale writes are tied to their
//! writes by replaying the checker's rule on the recorded events;
//! every overlapping pair is listed by running the checker again with the
//! listed pairs' earlier windows taken out (it lists ten at a time). A
//! stale write the soak cannot tie to a write fails the run unless every
//! tied violation was expected (or the backend has no fencing and a
//! known-unsafe fault was injected).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    Capabilities, FencingToken, LockBackend, LockClient, LockError, LockGuard, LockKey, OwnerId,
};
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::harness::Target;
use crate::history::{CheckReport, Event, EventKind, History, Op, Recorder, Window, check};
use crate::process::HarnessError;
use crate::proxy::FaultProxy;
use crate::recording::RecordingBackend;

/// SplitMix64: a small, fast, seedable generator (Steele, Lea and Flood's
/// mixer). Not for cryptography: it makes soak runs replayable.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// An independent stream for `lane` derived from `seed` (the same
    /// `(seed, lane)` always gives the same stream).
    pub fn stream(seed: u64, lane: u64) -> Self {
        let mut mixer = Self::new(seed ^ lane.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        Self::new(mixer.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// An index into a slice of `len` items.
    pub fn index(&mut self, len: usize) -> usize {
        let n = u64::try_from(len).unwrap_or(u64::MAX);
        usize::try_from(self.below(n)).unwrap_or(0)
    }

    /// A duration in `[low, high]`, in whole milliseconds.
    pub fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let low_ms = u64::try_from(low.as_millis()).unwrap_or(u64::MAX);
        let high_ms = u64::try_from(high.as_millis()).unwrap_or(u64::MAX);
        if high_ms <= low_ms {
            return Duration::from_millis(low_ms);
        }
        Duration::from_millis(low_ms + self.below(high_ms - low_ms + 1))
    }
}

/// A seed from the OS's randomness, for runs not given one.
pub fn random_seed() -> u64 {
    #[allow(clippy::cast_possible_truncation)] // low bits of a random value
    let seed = OwnerId::random().as_u128() as u64;
    seed
}

/// What the nemesis injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FaultKind {
    /// A worker freezes while holding its token, then writes with it.
    ClientFreeze,
    /// Latency (± a quarter as jitter) on one worker's link, up to twice
    /// the TTL.
    ClientLatency,
    /// One worker's link holds all traffic (delivered on heal).
    ClientPartition,
    /// The server (every node) is frozen with SIGSTOP, then resumed.
    ServerPause,
    /// The server (every node) is killed with SIGKILL and started again.
    ServerRestart,
    /// The leader / primary is killed and another node takes over (an
    /// asynchronous replica is first made to lag behind for half the
    /// fault's duration); the killed node is started again after the
    /// fault's duration.
    LeaderKill,
    /// One node of a quorum deployment without a leader (Redlock) is killed,
    /// then started again.
    NodeKill,
    /// One member's peer links are cut (a partition of one member from the
    /// others).
    MemberPartition,
    /// The link between a worker and the single member it talks to is cut.
    MemberClientPartition,
}

impl FaultKind {
    /// Every kind, in report order.
    pub const ALL: &'static [FaultKind] = &[
        Self::ClientFreeze,
        Self::ClientLatency,
        Self::ClientPartition,
        Self::ServerPause,
        Self::ServerRestart,
        Self::LeaderKill,
        Self::NodeKill,
        Self::MemberPartition,
        Self::MemberClientPartition,
    ];

    /// The name used in reports and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClientFreeze => "client_freeze",
            Self::ClientLatency => "client_latency",
            Self::ClientPartition => "client_partition",
            Self::ServerPause => "server_pause",
            Self::ServerRestart => "server_restart",
            Self::LeaderKill => "leader_kill",
            Self::NodeKill => "node_kill",
            Self::MemberPartition => "member_partition",
            Self::MemberClientPartition => "member_client_partition",
        }
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why `kind` is a known unsafe case for a backend with `caps`, or `None`
/// when the backend promises safety under it. Decided from capabilities
/// only, never from a backend's name.
pub fn known_unsafe(kind: FaultKind, caps: &Capabilities) -> Option<&'static str> {
    match kind {
        FaultKind::ServerRestart | FaultKind::LeaderKill | FaultKind::NodeKill
            if !caps.fencing_survives_failover =>
        {
            Some(
                "fencing_survives_failover = false: a restart or failover can lose grants and tokens",
            )
        }
        FaultKind::ServerRestart | FaultKind::LeaderKill | FaultKind::NodeKill
            if !caps.grants_survive_restart =>
        {
            Some("grants_survive_restart = false: a restart or failover frees held locks at once")
        }
        FaultKind::ClientFreeze | FaultKind::ClientPartition | FaultKind::ClientLatency
            if !caps.has_fencing() =>
        {
            Some("fencing = none: a paused holder's late write cannot be refused")
        }
        FaultKind::MemberPartition | FaultKind::MemberClientPartition if !caps.linearizable => {
            Some("linearizable = false: a partitioned member may grant on its own")
        }
        _ => None,
    }
}

/// Faults on the members of a clustered deployment: peer-link partitions
/// and clients attached to a single member. Implemented by
/// [`DeployedTarget`](crate::deploy::DeployedTarget) for the deployments
/// started with peer proxies.
#[async_trait]
pub trait MemberFaults: Send + Sync {
    /// How many members can be partitioned from the others (0: none).
    ///
    /// # Cancel safety
    ///
    /// Safe: it only looks.
    async fn partitionable_members(&self) -> usize;

    /// How many members a single-member client can be attached to.
    ///
    /// # Cancel safety
    ///
    /// Safe: it only looks.
    async fn members(&self) -> usize;

    /// Cuts member `index` off from the other members.
    ///
    /// # Errors
    ///
    /// When the fault cannot be injected.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: call [`heal_member`](Self::heal_member) afterwards.
    async fn partition_member(&self, index: usize) -> Result<bool, HarnessError>;

    /// Undoes [`partition_member`](Self::partition_member).
    ///
    /// # Errors
    ///
    /// When the fault cannot be removed.
    ///
    /// # Cancel safety
    ///
    /// Safe to call again.
    async fn heal_member(&self, index: usize) -> Result<(), HarnessError>;

    /// A client whose only endpoint is a fault proxy in front of member
    /// `index`, with that proxy; `None` when the deployment has no members.
    ///
    /// # Errors
    ///
    /// When the proxy or the client cannot be set up.
    ///
    /// # Cancel safety
    ///
    /// Safe: a dropped call leaves at most an unused proxy behind.
    async fn member_client(
        &self,
        index: usize,
    ) -> Result<Option<(Arc<dyn LockBackend>, FaultProxy)>, HarnessError>;
}

/// Settings of a soak run.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// How long clients run (the last fault may end a little later).
    pub duration: Duration,
    /// The seed of everything random.
    pub seed: u64,
    /// Concurrent workers (each its own client).
    pub workers: usize,
    /// Keys they compete for.
    pub keys: usize,
    /// Lease TTL (raised to the backend's minimum).
    pub ttl: Duration,
    /// Restrict the nemesis to these kinds (`None`: every kind that
    /// applies to the target).
    pub kinds: Option<Vec<FaultKind>>,
}

impl SoakConfig {
    /// Defaults for a run of `duration` with `seed`.
    pub fn new(duration: Duration, seed: u64) -> Self {
        Self {
            duration,
            seed,
            workers: 4,
            keys: 2,
            ttl: Duration::from_secs(1),
            kinds: None,
        }
    }
}

/// One planned fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedFault {
    /// Pause before it, after the previous fault of its lane ended.
    pub gap: Duration,
    /// What.
    pub kind: FaultKind,
    /// How long it stays (for restarts: how long the node stays down,
    /// where that can be chosen).
    pub duration: Duration,
    /// Which worker / member (taken modulo the number there are).
    pub target: u64,
}

/// The nemesis's schedule: two lanes, each played in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Schedule {
    /// Process and network faults, one after another.
    pub faults: Vec<PlannedFault>,
    /// Client freezes.
    pub freezes: Vec<PlannedFault>,
}

/// The schedule for `seed`: a pure function of its arguments. The first
/// faults of the lane are every kind of `kinds` once, in a random order
/// (so a short run still sees each), then random draws. Enough is planned
/// to fill `duration` even if every fault took no time at all.
pub fn plan(seed: u64, kinds: &[FaultKind], duration: Duration, ttl: Duration) -> Schedule {
    let mut rng = SplitMix64::stream(seed, 0);
    let lane: Vec<FaultKind> = kinds
        .iter()
        .copied()
        .filter(|k| *k != FaultKind::ClientFreeze)
        .collect();
    let mut faults = Vec::new();
    let mut planned = Duration::ZERO;
    let mut first: Vec<FaultKind> = lane.clone();
    // Fisher-Yates.
    for i in (1..first.len()).rev() {
        let j = rng.index(i + 1);
        first.swap(i, j);
    }
    let mut first = first.into_iter();
    while !lane.is_empty() && planned < duration {
        let kind = match first.next() {
            Some(kind) => kind,
            None => lane[rng.index(lane.len())],
        };
        let gap = rng.between(ttl / 4, ttl * 3 / 2);
        let length = rng.between(ttl / 2, ttl * 3);
        planned += gap + length;
        faults.push(PlannedFault {
            gap,
            kind,
            duration: length,
            target: rng.next_u64(),
        });
    }
    let mut freezes = Vec::new();
    if kinds.contains(&FaultKind::ClientFreeze) {
        let mut rng = SplitMix64::stream(seed, 1);
        let mut planned = Duration::ZERO;
        while planned < duration {
            let gap = rng.between(ttl / 2, ttl * 2);
            let length = rng.between(ttl / 2, ttl * 3);
            planned += gap + length;
            freezes.push(PlannedFault {
                gap,
                kind: FaultKind::ClientFreeze,
                duration: length,
                target: rng.next_u64(),
            });
        }
    }
    Schedule { faults, freezes }
}

/// A fault as it was injected.
#[derive(Clone, Debug, Serialize)]
pub struct InjectedFault {
    /// What.
    pub kind: FaultKind,
    /// Worker or member index.
    pub target: usize,
    /// When it started (on the history's clock; ms in JSON).
    #[serde(rename = "start_ms", serialize_with = "as_ms")]
    pub start: Duration,
    /// When it was healed (ms in JSON).
    #[serde(rename = "end_ms", serialize_with = "as_ms")]
    pub end: Duration,
}

fn as_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(ms(*d))
}

/// Figures of one fault kind.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FaultStats {
    /// How many times it was injected.
    pub injected: usize,
    /// Time it was active, in all.
    pub active_ms: u64,
    /// Grants observed while it was active.
    pub grants: usize,
    /// Failed acquires and renewals observed while it was active.
    pub errors: usize,
    /// Lost signals observed while it was active.
    pub lost: usize,
    /// Violations during which it was active.
    pub violations: usize,
    /// Of those, violations reported as expected (a known unsafe case for
    /// this backend: see `known_unsafe`).
    pub expected_violations: usize,
    /// Why this kind is a known unsafe case for this backend, if it is.
    pub known_unsafe: Option<String>,
}

/// One violation found, with the faults active during it.
#[derive(Clone, Debug, Serialize)]
pub struct Violation {
    /// `overlap`, `stale_write`, `lost_update`, `token_regression`,
    /// `duplicate_token`, `grant_past_deadline`, or `unattributed`.
    pub what: String,
    /// Interval it covers, on the history's clock (ms).
    pub from_ms: u64,
    /// End of that interval (ms).
    pub to_ms: u64,
    /// Fault kinds active during it.
    pub faults: Vec<FaultKind>,
    /// Whether one of them is a known unsafe case for this backend.
    pub expected: bool,
    /// Details.
    pub detail: String,
}

/// How many violations of one kind, and how many of them expected.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ViolationCount {
    /// All of them.
    pub total: usize,
    /// In a known unsafe case (negative control).
    pub expected: usize,
}

/// Violations listed in a report (all are counted).
const MAX_LISTED: usize = 100;

/// The outcome of a soak run.
#[derive(Clone, Debug, Serialize)]
pub struct SoakReport {
    /// Target name.
    pub backend: String,
    /// The seed (`--seed` replays the schedule).
    pub seed: u64,
    /// How long clients ran (s).
    pub duration_s: f64,
    /// Workers.
    pub workers: usize,
    /// Keys.
    pub keys: usize,
    /// TTL (ms).
    pub ttl_ms: u64,
    /// Whether the resource checked tokens (the backend has fencing).
    pub fenced: bool,
    /// How the client-link faults reach the workers: `tcp proxy` or
    /// `in-process link`.
    pub client_links: String,
    /// Fault kinds the nemesis drew from.
    pub kinds: Vec<FaultKind>,
    /// Kinds that do not apply to this target, and why.
    pub not_applicable: BTreeMap<String, String>,
    /// Per fault kind.
    pub faults: BTreeMap<String, FaultStats>,
    /// Every injected fault, in order.
    pub injected: Vec<InjectedFault>,
    /// Grants in all.
    pub grants: usize,
    /// Failed acquires and renewals in all.
    pub errors: usize,
    /// Lost signals in all.
    pub lost_signals: usize,
    /// Writes that reached the resource.
    pub writes: usize,
    /// Of those, refused by the resource (token below one it had seen).
    pub writes_refused: usize,
    /// Reads refused by the resource.
    pub reads_refused: usize,
    /// Increments lost: applied writes minus the counters' final values.
    pub lost_increments: u64,
    /// The history checker's findings.
    pub check: CheckReport,
    /// Violations, attributed to fault kinds (the unexpected ones first;
    /// at most 100 listed).
    pub violations: Vec<Violation>,
    /// Violations per kind of violation (all of them).
    pub violation_counts: BTreeMap<String, ViolationCount>,
    /// Violations that fail the run.
    pub unexpected_violations: usize,
    /// Violations in known unsafe cases (negative controls).
    pub expected_violations: usize,
    /// Faults the nemesis could not inject or heal.
    pub nemesis_errors: Vec<String>,
    /// `safe`, `expected violations only (negative control)`, or
    /// `VIOLATION`.
    pub verdict: String,
}

impl SoakReport {
    /// Whether the run found a violation the backend promises to avoid.
    pub fn fails_run(&self) -> bool {
        self.unexpected_violations > 0
    }

    /// The per-kind table, for terminals.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "soak {}: seed {} | {:.0} s | {} workers on {} keys | ttl {} ms | {} grants, {} errors, {} lost signals, {} writes ({} refused), {} lost increments",
            self.backend,
            self.seed,
            self.duration_s,
            self.workers,
            self.keys,
            self.ttl_ms,
            self.grants,
            self.errors,
            self.lost_signals,
            self.writes,
            self.writes_refused,
            self.lost_increments
        );
        let _ = writeln!(
            out,
            "  {:<24} {:>8} {:>10} {:>7} {:>7} {:>6} {:>10} {:>9}",
            "fault", "injected", "active s", "grants", "errors", "lost", "violations", "expected"
        );
        for (name, s) in &self.faults {
            #[allow(clippy::cast_precision_loss)] // display only
            let active = s.active_ms as f64 / 1000.0;
            let _ = writeln!(
                out,
                "  {:<24} {:>8} {:>10.1} {:>7} {:>7} {:>6} {:>10} {:>9}{}",
                name,
                s.injected,
                active,
                s.grants,
                s.errors,
                s.lost,
                s.violations,
                s.expected_violations,
                if s.known_unsafe.is_some() {
                    "  (negative control)"
                } else {
                    ""
                }
            );
        }
        for (name, why) in &self.not_applicable {
            let _ = writeln!(out, "  {name:<24} not applicable: {why}");
        }
        let _ = writeln!(out, "  checker: {}", self.check.summary());
        for (what, c) in &self.violation_counts {
            let _ = writeln!(
                out,
                "  {what}: {} ({} expected as negative control)",
                c.total, c.expected
            );
        }
        for v in self.violations.iter().take(5) {
            let faults: Vec<&str> = v.faults.iter().map(|k| k.as_str()).collect();
            let _ = writeln!(
                out,
                "  {} {} at {}..{} ms during [{}]: {}",
                if v.expected { "expected" } else { "VIOLATION" },
                v.what,
                v.from_ms,
                v.to_ms,
                faults.join(", "),
                v.detail
            );
        }
        for e in self.nemesis_errors.iter().take(5) {
            let _ = writeln!(out, "  nemesis error: {e}");
        }
        let _ = writeln!(out, "  verdict: {}", self.verdict);
        out
    }
}

// ---------------------------------------------------------------------
// The protected resource.

#[derive(Debug, Default)]
struct Register {
    value: u64,
    last_token: Option<u64>,
    /// The latest applied writes: (value after, writer's grant time), to
    /// date a lost increment from the earliest grant involved.
    recent: std::collections::VecDeque<(u64, Duration)>,
}

/// Applied writes remembered per key.
const RECENT_WRITES: usize = 64;

/// A write applied over a read that was no longer current.
#[derive(Debug, Clone)]
struct LostIncrement {
    grant_at: Duration,
    write_at: Duration,
    lost: u64,
    key: String,
}

#[derive(Debug, Default)]
struct ResourceState {
    registers: HashMap<String, Register>,
    applied: u64,
    writes: usize,
    writes_refused: usize,
    reads_refused: usize,
    lost: Vec<LostIncrement>,
}

/// A counter per key that checks tokens on every access (when `fenced`).
#[derive(Debug)]
struct Resource {
    fenced: bool,
    state: Mutex<ResourceState>,
}

impl Resource {
    fn lock(&self) -> std::sync::MutexGuard<'_, ResourceState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn admits(&self, reg: &Register, token: FencingToken) -> bool {
        !self.fenced || reg.last_token.is_none_or(|last| token.get() >= last)
    }

    /// The value, or `None` when the token is below one already seen.
    fn read(&self, key: &LockKey, token: FencingToken) -> Option<u64> {
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
    /// arrived, before judging it).
    fn write(
        &self,
        journal: &Journal,
        key: &LockKey,
        token: FencingToken,
        read: u64,
        grant_at: Duration,
    ) {
        let mut state = self.lock();
        let sent = self.fenced.then_some(token);
        journal.wrote(key, sent);
        state.writes += 1;
        let reg = state.registers.entry(key.as_str().to_owned()).or_default();
        if !self.admits(reg, token) {
            state.writes_refused += 1;
            return;
        }
        let lost = reg.value.saturating_sub(read);
        // The overwritten increments' writers may have been granted before
        // this writer (e.g. across a restart that reset the tokens): the
        // lost update spans from the earliest of those grants.
        let earliest = reg
            .recent
            .iter()
            .rev()
            .take_while(|(after, _)| *after > read)
            .map(|(_, at)| *at)
            .fold(grant_at, Duration::min);
        reg.value = read + 1;
        reg.recent.push_back((reg.value, grant_at));
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
            });
        }
    }
}

// ---------------------------------------------------------------------
// Where the soak touches the history API (kept in one place).

/// One worker's recorder plus the run's clock.
#[derive(Clone, Debug)]
struct Journal {
    recorder: Recorder,
    clock: Instant,
}

impl Journal {
    fn now(&self) -> Duration {
        self.clock.elapsed()
    }

    fn wrote(&self, key: &LockKey, token: Option<FencingToken>) {
        self.recorder.wrote(key, token);
    }

    /// The worker's backend, recording acquires, renewals and releases.
    fn backend(&self, inner: Arc<dyn LockBackend>) -> Arc<dyn LockBackend> {
        Arc::new(RecordingBackend::new(inner, self.recorder.clone()))
    }

    /// Records the guard's lost signal when it comes.
    fn watch_lost(&self, guard: &LockGuard) -> JoinHandle<()> {
        crate::recording::record_lost(guard, &self.recorder)
    }
}

/// Grants, errors and lost signals on the history's clock, from its events.
struct Observed {
    grants: Vec<Duration>,
    errors: Vec<Duration>,
    lost: Vec<Duration>,
    /// (key, time, token) of every grant, in grant order.
    tokens: Vec<(String, Duration, u64)>,
}

/// Every overlapping pair of promised windows, from the checker (which
/// lists only its first few): after each pass the earlier window of every
/// listed pair is taken out of the history and the checker runs again,
/// until it lists all it counts. Each pair's attribution interval starts
/// at its earlier window's start, so the pairs of a removed window not
/// listed yet (later, overlapping the same window) are judged by the same
/// faults as the listed ones. Returns the pairs and whether the passes
/// ran out before everything was listed.
fn all_overlaps(events: &[Event]) -> (Vec<(Window, Window)>, bool) {
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
fn stale_writes(events: &[Event]) -> Vec<LostIncrement> {
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

fn observed(history: &History) -> Observed {
    let mut out = Observed {
        grants: Vec::new(),
        errors: Vec::new(),
        lost: Vec::new(),
        tokens: Vec::new(),
    };
    for e in history.events() {
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

struct Worker {
    index: usize,
    client: LockClient,
    journal: Journal,
    rng: SplitMix64,
    /// A freeze the nemesis asked for: applied at the next hold.
    freeze: Arc<Mutex<Option<Duration>>>,
    reach: Reach,
    /// The target's URL the client was made for.
    url: Option<String>,
}

/// How a worker reaches the backend (and so how it reconnects when a
/// failover moved the primary: clients made from then on talk to the new
/// one, as [`Target::fail_over`] says).
#[derive(Clone)]
enum Reach {
    /// A plain client of the target.
    Direct,
    /// Through the target's TCP fault proxy (this link slot).
    Proxy(Link),
    /// Through an in-process link (this slot).
    InProcess(Link),
    /// Through a proxy in front of one member: never moves.
    Member,
}

/// A worker's fault link, replaced when the worker reconnects.
type Link = Arc<Mutex<FaultProxy>>;

fn with_link<T>(link: &Link, f: impl FnOnce(&FaultProxy) -> T) -> T {
    f(&link.lock().unwrap_or_else(PoisonError::into_inner))
}

/// A client for `reach`, replacing the link's proxy where it has one.
async fn connect(target: &dyn Target, reach: &Reach) -> Result<Arc<dyn LockBackend>, LockError> {
    match reach {
        Reach::Direct | Reach::Member => target.client().await,
        Reach::Proxy(link) => match target.proxied_client().await {
            Ok(Some((client, proxy))) => {
                *link.lock().unwrap_or_else(PoisonError::into_inner) = proxy;
                Ok(client)
            }
            Ok(None) | Err(_) => Err(LockError::config("no proxied client")),
        },
        Reach::InProcess(link) => {
            let (client, proxy) =
                FaultProxy::in_process(target.client().await?, Duration::from_secs(1));
            *link.lock().unwrap_or_else(PoisonError::into_inner) = proxy;
            Ok(client)
        }
    }
}

struct Shared {
    target: Arc<dyn Target>,
    keys: Vec<LockKey>,
    ttl: Duration,
    end: Instant,
    resource: Resource,
    injected: Mutex<Vec<InjectedFault>>,
    stop: AtomicBool,
}

impl Shared {
    fn push_fault(&self, fault: InjectedFault) {
        self.injected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(fault);
    }
}

async fn work(mut w: Worker, shared: Arc<Shared>) {
    let ttl = shared.ttl;
    while Instant::now() < shared.end && !shared.stop.load(Ordering::Relaxed) {
        let url = shared.target.url();
        if url != w.url && !matches!(w.reach, Reach::Member) {
            // A failover moved the primary.
            if let Ok(backend) = connect(&*shared.target, &w.reach).await {
                w.client = LockClient::from_arc(w.journal.backend(backend));
                w.url = url;
            }
        }
        let key = shared.keys[w.rng.index(shared.keys.len())].clone();
        let hold = w.rng.between(Duration::ZERO, ttl / 4);
        let backoff = w
            .rng
            .between(Duration::from_millis(5), Duration::from_millis(60));
        let freeze = w
            .freeze
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let mut request = w.client.lock(key.as_str()).ttl(ttl).wait(ttl * 2);
        if freeze.is_some() {
            // A paused process renews nothing.
            request = request.no_renewal();
        }
        // The acquire is bounded by its wait and the backend's timeouts;
        // this outer bound only keeps a wedged client from stalling the run.
        let guard = match tokio::time::timeout(ttl * 2 + Duration::from_secs(10), request.acquire())
            .await
        {
            Ok(Ok(guard)) => guard,
            Ok(Err(_)) | Err(_) => {
                if let Some(d) = freeze {
                    // Not holding: keep the freeze for the next grant.
                    *w.freeze.lock().unwrap_or_else(PoisonError::into_inner) = Some(d);
                }
                tokio::time::sleep(backoff).await;
                continue;
            }
        };
        let grant_at = w.journal.now();
        let watcher = w.journal.watch_lost(&guard);
        let token = guard.token();
        let read = if guard.is_held() {
            shared.resource.read(&key, token)
        } else {
            None
        };
        if read.is_none()
            && let Some(d) = freeze
        {
            // Not used: keep it for the next grant.
            *w.freeze.lock().unwrap_or_else(PoisonError::into_inner) = Some(d);
        }
        if let Some(read) = read {
            match freeze {
                Some(d) => {
                    let start = w.journal.now();
                    tokio::time::sleep(d).await;
                    shared.push_fault(InjectedFault {
                        kind: FaultKind::ClientFreeze,
                        target: w.index,
                        start,
                        end: w.journal.now(),
                    });
                    // Wakes and writes with the token it holds, without
                    // looking at the guard: what a paused process does.
                    shared
                        .resource
                        .write(&w.journal, &key, token, read, grant_at);
                }
                None => {
                    tokio::time::sleep(hold).await;
                    if guard.is_held() {
                        shared
                            .resource
                            .write(&w.journal, &key, token, read, grant_at);
                    }
                }
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), guard.release()).await;
        watcher.abort();
    }
}

// ---------------------------------------------------------------------
// The nemesis.

struct Links {
    /// Worker links with faults (tcp proxies or in-process links).
    workers: Vec<(usize, Link)>,
    /// The single-member worker's link.
    member: Option<(usize, FaultProxy)>,
}

struct Nemesis {
    target: Arc<dyn Target>,
    members: Option<Arc<dyn MemberFaults>>,
    links: Links,
    partitionable: usize,
    ttl: Duration,
    errors: Mutex<Vec<String>>,
}

impl Nemesis {
    fn error(&self, what: &str, e: &dyn std::fmt::Display) {
        self.errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(format!("{what}: {e}"));
    }

    /// Injects one fault; returns the target index and whether it was
    /// injected, after healing it.
    async fn inject(&self, fault: &PlannedFault, clock: Instant) -> Option<InjectedFault> {
        let since = |t: Instant| t.saturating_duration_since(clock);
        let start = Instant::now();
        let pick = |n: usize| {
            let n = u64::try_from(n.max(1)).unwrap_or(1);
            usize::try_from(fault.target % n).unwrap_or(0)
        };
        let target = match fault.kind {
            FaultKind::ClientLatency | FaultKind::ClientPartition => {
                let (index, link) = self.links.workers.get(pick(self.links.workers.len()))?;
                if fault.kind == FaultKind::ClientLatency {
                    let latency = (fault.duration * 2 / 3).min(self.ttl * 2);
                    with_link(link, |l| l.set_latency(latency, latency / 4));
                    tokio::time::sleep(fault.duration).await;
                    with_link(link, |l| l.set_latency(Duration::ZERO, Duration::ZERO));
                } else {
                    with_link(link, FaultProxy::partition);
                    tokio::time::sleep(fault.duration).await;
                    with_link(link, FaultProxy::heal);
                }
                *index
            }
            FaultKind::MemberClientPartition => {
                let (index, link) = self.links.member.as_ref()?;
                link.partition();
                tokio::time::sleep(fault.duration).await;
                link.heal();
                *index
            }
            FaultKind::MemberPartition => {
                let members = self.members.as_ref()?;
                let index = pick(self.partitionable);
                match members.partition_member(index).await {
                    Ok(true) => {}
                    Ok(false) => return None,
                    Err(e) => {
                        self.error("member partition", &e);
                        return None;
                    }
                }
                tokio::time::sleep(fault.duration).await;
                if let Err(e) = members.heal_member(index).await {
                    self.error("member heal", &e);
                }
                index
            }
            FaultKind::ServerPause => {
                match self.target.make_unreachable().await {
                    Ok(true) => {}
                    Ok(false) => return None,
                    Err(e) => {
                        self.error("server pause", &e);
                        let _ = self.target.heal().await;
                        return None;
                    }
                }
                tokio::time::sleep(fault.duration).await;
                if let Err(e) = self.target.heal().await {
                    self.error("server resume", &e);
                }
                0
            }
            FaultKind::ServerRestart => {
                match self.target.kill_and_restart_server().await {
                    Ok(true) => {}
                    Ok(false) => return None,
                    Err(e) => {
                        self.error("server restart", &e);
                        return None;
                    }
                }
                0
            }
            FaultKind::LeaderKill | FaultKind::NodeKill => {
                let done = if fault.kind == FaultKind::LeaderKill {
                    // Where replication is asynchronous, let the replica
                    // lag first (writes acknowledged by the primary only),
                    // as it does under load.
                    if matches!(self.target.hold_replication().await, Ok(true)) {
                        tokio::time::sleep(fault.duration / 2).await;
                    }
                    self.target.fail_over().await
                } else {
                    self.target.stop_nodes(1).await.map(|t| t.is_some())
                };
                match done {
                    Ok(true) => {}
                    Ok(false) => return None,
                    Err(e) => {
                        self.error(fault.kind.as_str(), &e);
                        if let Err(e) = self.target.restart_nodes().await {
                            self.error("restart nodes", &e);
                        }
                        return None;
                    }
                }
                tokio::time::sleep(fault.duration).await;
                if let Err(e) = self.target.restart_nodes().await {
                    self.error("restart nodes", &e);
                }
                0
            }
            FaultKind::ClientFreeze => return None,
        };
        Some(InjectedFault {
            kind: fault.kind,
            target,
            start: since(start),
            end: since(Instant::now()),
        })
    }
}

/// Which kinds apply to this target, by trying each once before the run
/// (those probe injections are not counted), and why the others do not.
async fn applicable(
    target: &Arc<dyn Target>,
    members: Option<&Arc<dyn MemberFaults>>,
    errors: &mut Vec<String>,
) -> (Vec<FaultKind>, BTreeMap<String, String>) {
    let mut kinds = vec![
        FaultKind::ClientFreeze,
        FaultKind::ClientLatency,
        FaultKind::ClientPartition,
    ];
    let mut not = BTreeMap::new();
    let mut note = |k: FaultKind, why: &str| {
        not.insert(k.as_str().to_owned(), why.to_owned());
    };
    match target.make_unreachable().await {
        Ok(true) => {
            if let Err(e) = target.heal().await {
                errors.push(format!("probe heal: {e}"));
            }
            kinds.push(FaultKind::ServerPause);
        }
        Ok(false) => note(FaultKind::ServerPause, "the target cannot pause its server"),
        Err(e) => note(FaultKind::ServerPause, &format!("probe failed: {e}")),
    }
    match target.kill_and_restart_server().await {
        Ok(true) => kinds.push(FaultKind::ServerRestart),
        Ok(false) => note(
            FaultKind::ServerRestart,
            "no server process to restart (embedded or external)",
        ),
        Err(e) => note(FaultKind::ServerRestart, &format!("probe failed: {e}")),
    }
    match target.fail_over().await {
        Ok(true) => {
            if let Err(e) = target.restart_nodes().await {
                errors.push(format!("probe restart nodes: {e}"));
            }
            kinds.push(FaultKind::LeaderKill);
        }
        Ok(false) => note(FaultKind::LeaderKill, "no leader or primary to kill"),
        Err(e) => {
            let _ = target.restart_nodes().await;
            note(FaultKind::LeaderKill, &format!("probe failed: {e}"));
        }
    }
    if target.cluster_size().is_some() && !kinds.contains(&FaultKind::LeaderKill) {
        kinds.push(FaultKind::NodeKill);
    } else {
        note(
            FaultKind::NodeKill,
            if target.cluster_size().is_some() {
                "covered by leader_kill (the leader is the node killed first)"
            } else {
                "not a quorum deployment"
            },
        );
    }
    match members {
        Some(m) => {
            if m.partitionable_members().await > 1 {
                kinds.push(FaultKind::MemberPartition);
            } else {
                note(
                    FaultKind::MemberPartition,
                    "the deployment has no peer proxies",
                );
            }
            if m.members().await > 1 {
                kinds.push(FaultKind::MemberClientPartition);
            } else {
                note(
                    FaultKind::MemberClientPartition,
                    "not a multi-member deployment",
                );
            }
        }
        None => {
            note(FaultKind::MemberPartition, "not a multi-member deployment");
            note(
                FaultKind::MemberClientPartition,
                "not a multi-member deployment",
            );
        }
    }
    (kinds, not)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs a soak against `target` (with `members` for peer-link and
/// single-member faults on clustered deployments).
///
/// # Errors
///
/// When no client can be made at all (the report is otherwise always
/// produced: faults that cannot be injected are listed in it).
///
/// # Cancel safety
///
/// Not cancel safe: a dropped run may leave a fault injected (a paused
/// server, a partitioned member).
pub async fn run_soak(
    target: Arc<dyn Target>,
    members: Option<Arc<dyn MemberFaults>>,
    config: &SoakConfig,
) -> Result<SoakReport, LockError> {
    let probe = target.client().await?;
    let caps = probe.capabilities();
    drop(probe);
    let ttl = config.ttl.max(caps.min_ttl);
    let mut nemesis_errors = Vec::new();
    let (mut kinds, mut not_applicable) =
        applicable(&target, members.as_ref(), &mut nemesis_errors).await;
    if let Some(only) = &config.kinds {
        for k in kinds.iter().filter(|k| !only.contains(k)) {
            not_applicable.insert(
                k.as_str().to_owned(),
                "excluded by the run's settings".into(),
            );
        }
        kinds.retain(|k| only.contains(k));
    }
    let schedule = plan(config.seed, &kinds, config.duration, ttl);

    let history = Arc::new(History::new());
    let clock = Instant::now();
    let run = &OwnerId::random().to_hex()[..8];
    let keys: Vec<LockKey> = (0..config.keys.max(1))
        .map(|i| LockKey::new(format!("soak-{run}/k{i}")))
        .collect::<Result<_, _>>()?;

    // Clients: the first two workers behind fault links, the last one
    // (on a multi-member deployment) attached to a single member.
    let workers = config.workers.max(2);
    let mut links = Links {
        workers: Vec::new(),
        member: None,
    };
    let mut clients = Vec::new();
    let mut client_links = "none".to_owned();
    let url = target.url();
    for i in 0..workers {
        let mut backend = None;
        let mut reach = Reach::Direct;
        if i == workers - 1
            && let Some(m) = &members
            && m.members().await > 1
        {
            let member = usize::try_from(config.seed % 3).unwrap_or(0) % m.members().await;
            match m.member_client(member).await {
                Ok(Some((client, proxy))) => {
                    links.member = Some((i, proxy));
                    backend = Some(client);
                    reach = Reach::Member;
                }
                Ok(None) => {}
                Err(e) => nemesis_errors.push(format!("member client: {e}")),
            }
        }
        if backend.is_none() && i < 2 {
            match target.proxied_client().await {
                Ok(Some((client, proxy))) => {
                    client_links = "tcp proxy".into();
                    let link = Arc::new(Mutex::new(proxy));
                    links.workers.push((i, link.clone()));
                    reach = Reach::Proxy(link);
                    backend = Some(client);
                }
                Ok(None) | Err(_) => {
                    let inner = target.client().await?;
                    let (client, proxy) = FaultProxy::in_process(inner, Duration::from_secs(1));
                    client_links = "in-process link".into();
                    let link = Arc::new(Mutex::new(proxy));
                    links.workers.push((i, link.clone()));
                    reach = Reach::InProcess(link);
                    backend = Some(client);
                }
            }
        }
        let backend = match backend {
            Some(b) => b,
            None => target.client().await?,
        };
        clients.push((backend, reach));
    }

    let shared = Arc::new(Shared {
        target: target.clone(),
        keys,
        ttl,
        end: Instant::now() + config.duration,
        resource: Resource {
            fenced: caps.has_fencing(),
            state: Mutex::new(ResourceState::default()),
        },
        injected: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
    });
    let mut freeze_slots = Vec::new();
    let mut tasks = Vec::new();
    for (i, (backend, reach)) in clients.into_iter().enumerate() {
        let journal = Journal {
            recorder: history.process(),
            clock,
        };
        let slot = Arc::new(Mutex::new(None));
        freeze_slots.push(slot.clone());
        let worker = Worker {
            index: i,
            client: LockClient::from_arc(journal.backend(backend)),
            journal,
            rng: SplitMix64::stream(config.seed, 100 + u64::try_from(i).unwrap_or(0)),
            freeze: slot,
            reach,
            url: url.clone(),
        };
        tasks.push(tokio::spawn(work(worker, shared.clone())));
    }

    let nemesis = Arc::new(Nemesis {
        target: target.clone(),
        members: members.clone(),
        links,
        partitionable: match &members {
            Some(m) => m.partitionable_members().await,
            None => 0,
        },
        ttl,
        errors: Mutex::new(nemesis_errors),
    });
    let lane = {
        let (nemesis, shared, faults) = (nemesis.clone(), shared.clone(), schedule.faults.clone());
        tokio::spawn(async move {
            for fault in &faults {
                tokio::time::sleep(fault.gap).await;
                if Instant::now() >= shared.end {
                    break;
                }
                if let Some(done) = nemesis.inject(fault, clock).await {
                    shared.push_fault(done);
                }
            }
        })
    };
    let freezes = {
        let (shared, plan) = (shared.clone(), schedule.freezes.clone());
        tokio::spawn(async move {
            for fault in &plan {
                tokio::time::sleep(fault.gap).await;
                if Instant::now() >= shared.end {
                    break;
                }
                let n = u64::try_from(freeze_slots.len().max(1)).unwrap_or(1);
                let w = usize::try_from(fault.target % n).unwrap_or(0);
                *freeze_slots[w]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(fault.duration);
                // The freeze itself runs inside the worker; wait about as
                // long before the next one.
                tokio::time::sleep(fault.duration).await;
            }
        })
    };
    let _ = lane.await;
    let _ = freezes.await;
    // Clients run the whole duration, whatever the lanes planned.
    tokio::time::sleep_until(shared.end).await;
    shared.stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = tokio::time::timeout(ttl * 6 + Duration::from_secs(30), task).await;
    }
    // Leave the deployment healthy.
    if let Some(m) = &members {
        for i in 0..nemesis.partitionable {
            let _ = m.heal_member(i).await;
        }
    }
    let _ = target.heal().await;
    let _ = target.restart_nodes().await;

    let elapsed = clock.elapsed();
    let injected = std::mem::take(
        &mut *shared
            .injected
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    let nemesis_errors = std::mem::take(
        &mut *nemesis
            .errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    let check = history.check();
    let resource = shared.resource.lock();
    let final_total: u64 = resource.registers.values().map(|r| r.value).sum();
    let lost_increments = resource.applied.saturating_sub(final_total);
    let obs = observed(&history);
    let judged = Judged {
        caps: &caps,
        injected: &injected,
    };
    let events = history.events();
    let stale = stale_writes(&events);
    let violations = judged.violations(&check, &obs, &events, &resource.lost, &stale);
    let mut faults: BTreeMap<String, FaultStats> = BTreeMap::new();
    for &k in &kinds {
        faults.insert(
            k.as_str().to_owned(),
            FaultStats {
                known_unsafe: known_unsafe(k, &caps).map(str::to_owned),
                ..FaultStats::default()
            },
        );
    }
    for f in &injected {
        let s = faults.entry(f.kind.as_str().to_owned()).or_default();
        s.injected += 1;
        s.active_ms += ms(f.end.saturating_sub(f.start));
        let during = |t: &&Duration| **t >= f.start && **t <= f.end;
        s.grants += obs.grants.iter().filter(during).count();
        s.errors += obs.errors.iter().filter(during).count();
        s.lost += obs.lost.iter().filter(during).count();
    }
    for v in &violations {
        for k in &v.faults {
            let s = faults.entry(k.as_str().to_owned()).or_default();
            s.violations += 1;
            if v.expected && known_unsafe(*k, &caps).is_some() {
                s.expected_violations += 1;
            }
        }
    }
    let unexpected = violations.iter().filter(|v| !v.expected).count();
    let expected = violations.len() - unexpected;
    let mut violation_counts: BTreeMap<String, ViolationCount> = BTreeMap::new();
    for v in &violations {
        let c = violation_counts.entry(v.what.clone()).or_default();
        c.total += 1;
        c.expected += usize::from(v.expected);
    }
    // The unexpected ones first, then as many expected ones as fit.
    let mut violations = violations;
    violations.sort_by_key(|v| v.expected);
    violations.truncate(MAX_LISTED);
    let verdict = if unexpected > 0 {
        "VIOLATION".to_owned()
    } else if expected > 0 {
        "expected violations only (negative control)".to_owned()
    } else {
        "safe".to_owned()
    };
    Ok(SoakReport {
        backend: target.name(),
        seed: config.seed,
        duration_s: elapsed.as_secs_f64(),
        workers,
        keys: shared.keys.len(),
        ttl_ms: ms(ttl),
        fenced: caps.has_fencing(),
        client_links,
        kinds,
        not_applicable,
        faults,
        injected,
        grants: obs.grants.len(),
        errors: obs.errors.len(),
        lost_signals: obs.lost.len(),
        writes: resource.writes,
        writes_refused: resource.writes_refused,
        reads_refused: resource.reads_refused,
        lost_increments,
        check,
        violations,
        violation_counts,
        unexpected_violations: unexpected,
        expected_violations: expected,
        nemesis_errors,
        verdict,
    })
}

/// Attribution of violations to the faults active during them.
struct Judged<'a> {
    caps: &'a Capabilities,
    injected: &'a [InjectedFault],
}

impl Judged<'_> {
    fn during(&self, from: Duration, to: Duration) -> Vec<FaultKind> {
        let mut kinds: Vec<FaultKind> = self
            .injected
            .iter()
            .filter(|f| f.start <= to && f.end >= from)
            .map(|f| f.kind)
            .collect();
        kinds.sort();
        kinds.dedup();
        kinds
    }

    fn violation(&self, what: &str, from: Duration, to: Duration, detail: String) -> Violation {
        let faults = self.during(from, to);
        let expected = faults.iter().any(|k| known_unsafe(*k, self.caps).is_some());
        Violation {
            what: what.to_owned(),
            from_ms: ms(from),
            to_ms: ms(to),
            faults,
            expected,
            detail,
        }
    }

    fn violations(
        &self,
        check: &CheckReport,
        obs: &Observed,
        events: &[Event],
        lost: &[LostIncrement],
        stale: &[LostIncrement],
    ) -> Vec<Violation> {
        let caps = self.caps;
        let mut out = Vec::new();
        let (overlaps, incomplete) = all_overlaps(events);
        for (a, b) in &overlaps {
            out.push(self.violation(
                "overlap",
                a.start,
                a.end.min(b.end),
                format!(
                    "key {}: process {} (token {:?}) and process {} (token {:?})",
                    a.key, a.process, a.token, b.process, b.token
                ),
            ));
        }
        if incomplete {
            out.push(Violation {
                what: "overlap".into(),
                from_ms: 0,
                to_ms: 0,
                faults: Vec::new(),
                expected: false,
                detail: format!(
                    "{} overlapping pairs counted, {} attributed before giving up",
                    check.overlap_count,
                    overlaps.len()
                ),
            });
        }
        for l in lost {
            out.push(self.violation(
                "lost_update",
                l.grant_at,
                l.write_at,
                format!("key {}: {} increment(s) overwritten", l.key, l.lost),
            ));
        }
        for l in stale {
            out.push(self.violation(
                "stale_write",
                l.grant_at,
                l.write_at,
                format!(
                    "key {}: a write from the grant at {} ms got in after a later grant's write",
                    l.key,
                    ms(l.grant_at)
                ),
            ));
        }
        if caps.has_fencing() {
            // Each step down between consecutive grants of a key is one
            // event (after a reset every later grant is below the old
            // highest, which the checker counts; one event per reset is
            // enough to judge it, and every step down is seen).
            let mut previous: HashMap<&str, (u64, Duration)> = HashMap::new();
            for (key, at, token) in &obs.tokens {
                if let Some(&(p, p_at)) = previous.get(key.as_str())
                    && *token <= p
                {
                    let what = if *token == p {
                        "duplicate_token"
                    } else {
                        "token_regression"
                    };
                    out.push(self.violation(
                        what,
                        p_at,
                        *at,
                        format!("key {key}: token {token} after {p}"),
                    ));
                }
                previous.insert(key.as_str(), (*token, *at));
            }
        }
        // The checker's counts the soak cannot tie to events: any of them
        // fails the run, unless every event-level violation was expected
        // and there is at least one (then they are the same fault's work).
        let tied_expected = !out.is_empty() && out.iter().all(|v| v.expected);
        for (what, count) in [
            (
                "stale_write",
                check.stale_writes_accepted.saturating_sub(stale.len()),
            ),
            ("grant_past_deadline", check.grants_past_deadline),
        ] {
            if count > 0 {
                let expected = what == "stale_write" && (tied_expected || self.stale_expected());
                out.push(Violation {
                    what: what.into(),
                    from_ms: 0,
                    to_ms: 0,
                    faults: Vec::new(),
                    expected,
                    detail: format!("{count} found by the history checker"),
                });
            }
        }
        out
    }

    /// Stale writes are expected when the backend has no fencing and the
    /// nemesis froze clients (the only way a late write gets in then).
    fn stale_expected(&self) -> bool {
        !self.caps.has_fencing()
            && self
                .injected
                .iter()
                .any(|f| known_unsafe(f.kind, self.caps).is_some())
    }
}
