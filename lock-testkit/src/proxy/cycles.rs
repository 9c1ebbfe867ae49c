//! Round trips per cycle: what a repeated operation costs on the wire,
//! counted by the [`FaultProxy`]s between its clients and their servers.

use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::FaultProxy;

/// How [`count_cycles`] counts.
#[derive(Clone, Copy, Debug)]
pub struct CyclePlan {
    /// Cycles run first and not counted (connections, sessions, key
    /// directories, scripts loaded).
    pub warm_up: usize,
    /// Cycles counted.
    pub cycles: u64,
    /// How long after the warm-up and after the counted cycles to keep
    /// counting: what a cycle defers (a cleanup at its lease's TTL)
    /// belongs to it.
    pub tail: Duration,
    /// Whether to count the clients' background too (pings, keep-alives)
    /// over an idle stretch as long as the counted one, to subtract it.
    pub idle: bool,
}

impl CyclePlan {
    /// `cycles` counted after `warm_up`, no tail, no idle stretch.
    pub fn new(warm_up: usize, cycles: u64) -> Self {
        Self {
            warm_up,
            cycles,
            tail: Duration::ZERO,
            idle: false,
        }
    }

    /// With a `tail` after the warm-up and after the counted cycles.
    pub fn with_tail(self, tail: Duration) -> Self {
        Self { tail, ..self }
    }

    /// With the background counted over an idle stretch and subtracted.
    pub fn with_idle(self) -> Self {
        Self { idle: true, ..self }
    }
}

/// What one proxy counted (see [`count_cycles`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CycleCount {
    /// Cycles counted.
    pub cycles: u64,
    /// Request/response turns while they ran (and their tail).
    pub turns: u64,
    /// Turns over the idle stretch (0 when not asked for).
    pub idle_turns: u64,
}

impl CycleCount {
    /// Turns per cycle, the background subtracted.
    pub fn per_cycle(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let per = self.turns.saturating_sub(self.idle_turns) as f64 / self.cycles.max(1) as f64;
        per
    }

    /// [`per_cycle`](Self::per_cycle) rounded to the nearest whole number.
    pub fn rounded(&self) -> u64 {
        (self.turns.saturating_sub(self.idle_turns) + self.cycles / 2) / self.cycles.max(1)
    }

    /// Exactly `expected` per cycle after rounding, or why not.
    ///
    /// # Errors
    ///
    /// The count per cycle and what was counted, when it rounds to
    /// anything else.
    pub fn check(&self, expected: u64) -> Result<(), String> {
        let per_cycle = self.per_cycle();
        #[allow(clippy::cast_precision_loss)]
        let off = (per_cycle - expected as f64).abs();
        if off < 0.5 {
            Ok(())
        } else {
            Err(format!(
                "{per_cycle:.2} round trips per cycle, expected {expected} ({self:?})"
            ))
        }
    }
}

/// Runs `cycle` as `how` says and counts each proxy's turns: each proxy
/// must be between one client and its server with nothing else on it.
/// Replies still in flight after the warm-up land before counting starts.
pub async fn count_cycles(
    proxies: &[&FaultProxy],
    how: CyclePlan,
    mut cycle: impl AsyncFnMut(),
) -> Vec<CycleCount> {
    for _ in 0..how.warm_up {
        cycle().await;
    }
    sleep(how.tail.max(Duration::from_millis(20))).await;
    for proxy in proxies {
        proxy.reset_counters();
    }
    let started = Instant::now();
    for _ in 0..how.cycles {
        cycle().await;
    }
    sleep(how.tail).await;
    let took = started.elapsed();
    let turns: Vec<u64> = proxies.iter().map(|p| p.round_trips()).collect();
    let mut idle = vec![0; proxies.len()];
    if how.idle {
        for proxy in proxies {
            proxy.reset_counters();
        }
        sleep(took).await;
        idle = proxies.iter().map(|p| p.round_trips()).collect();
    }
    turns
        .into_iter()
        .zip(idle)
        .map(|(turns, idle_turns)| CycleCount {
            cycles: how.cycles,
            turns,
            idle_turns,
        })
        .collect()
}

impl FaultProxy {
    /// [`count_cycles`] through this proxy alone.
    pub async fn count_cycles(&self, how: CyclePlan, cycle: impl AsyncFnMut()) -> CycleCount {
        count_cycles(&[self], how, cycle).await[0]
    }
}
