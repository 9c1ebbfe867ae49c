//! The seeded fault schedule: the random stream, the fault kinds, which
//! kinds are known to break which backends, and the plan.

use std::time::Duration;

use lock_core::{Capabilities, OwnerId};
use serde::Serialize;

/// SplitMix64: a small, fast, seedable generator (Steele, Lea and Flood's
/// mixer). Not for cryptography: it makes soak runs replayable.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    pub(super) state: u64,
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
    /// One worker's link holds all traffic (delivered on heal); in a
    /// kernel-partition soak, its host is isolated (packets dropped).
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
    /// others): in the peer proxies, or in the kernel in a
    /// kernel-partition soak (where on Redis Sentinel the member cut is
    /// the master, from its replica and the sentinels).
    MemberPartition,
    /// The link between a worker and the single member it talks to is cut
    /// (its proxy, or in the kernel in a kernel-partition soak).
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
            Some(
                "linearizable = false: a partitioned member may grant on its own, or its peers fail over \
                 without it (a Sentinel master cut from its replica and sentinels)",
            )
        }
        _ => None,
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
