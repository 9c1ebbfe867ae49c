//! The faults in force on a [`FaultProxy`](crate::proxy::FaultProxy)'s
//! connections and on the calls of its in-process counterpart, a
//! [`FaultLink`](crate::link::FaultLink): how traffic flows, the latency
//! and jitter each chunk or call waits, and the generation that cuts every
//! open connection. The proxy sets them; its connections and the link
//! watch them.

use std::time::Duration;

/// How traffic flows right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Forwarded (after the configured latency).
    Pass,
    /// Held: nothing is read or forwarded until healed; then it flows on.
    Partition,
    /// Read and thrown away; connections open during a blackhole are closed
    /// when it ends.
    Blackhole,
}

/// The faults in force: one value, sent on a watch channel to every
/// connection (or link call) of one proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FaultState {
    pub(crate) flow: Flow,
    pub(crate) latency: Duration,
    pub(crate) jitter: Duration,
    /// Bumped to cut every open connection.
    pub(crate) generation: u64,
    /// Replies torn in two: the first `.0` bytes of each chunk the server
    /// sends are delivered, the rest `.1` later (see
    /// `FaultProxy::tear_replies`).
    pub(crate) torn: Option<(usize, Duration)>,
}

impl FaultState {
    /// No fault: traffic passes at once, nothing cut yet.
    pub(crate) const PASSING: Self = Self {
        flow: Flow::Pass,
        latency: Duration::ZERO,
        jitter: Duration::ZERO,
        generation: 0,
        torn: None,
    };
}

/// The wait of one chunk or leg: `latency` plus a uniform draw from
/// `[-jitter, +jitter]` (xorshift on `rng`, never below zero).
pub(crate) fn delay_for(latency: Duration, jitter: Duration, rng: &mut u64) -> Duration {
    if jitter.is_zero() {
        return latency;
    }
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    let span = u64::try_from(jitter.as_nanos())
        .unwrap_or(u64::MAX)
        .saturating_mul(2);
    let offset = Duration::from_nanos(*rng % span.max(1));
    (latency + offset).saturating_sub(jitter)
}
