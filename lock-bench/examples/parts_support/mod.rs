//! What the per-backend "parts" probes (`redis_parts`, `sql_parts`) share:
//! one client, one connection per side, a warm-up round, then interleaved
//! rounds (the side order rotates every round, so every side sees the same
//! machine load); per side p50, p99 and mean wall time, CPU per cycle of
//! this process and of the server, and, with `RTT_US`, round trips per
//! cycle counted by the side's own fault proxy; then the ratios issue #39
//! asks for (ours over the client crate alone, the crate alone over the
//! hand floor) with their spread over the rounds.

use std::time::Duration;

use conformance::bench::LatencyStats;
use conformance::proxy::FaultProxy;
use tokio::time::Instant;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Measured rounds after the warm-up.
const ROUNDS: usize = 10;

/// Cycles per side in the warm-up round (connections, prepared statements,
/// script caches, rows, allocator), not counted.
const WARMUP: usize = 300;

/// Cycles per side over all rounds: the first argument, default 2000.
pub(crate) fn cycles() -> usize {
    std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(2000)
}

/// The round-trip time to inject (`RTT_US`, microseconds; unset or 0:
/// none, every side connects straight to the server).
pub(crate) fn rtt() -> Option<Duration> {
    std::env::var("RTT_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|us| *us > 0)
        .map(Duration::from_micros)
}

/// `ONLY=<side>`: run that side alone (for a profiler).
fn only() -> Option<usize> {
    std::env::var("ONLY").ok().and_then(|v| v.parse().ok())
}

/// With `rtt`, one fault proxy per side in front of the server on loopback
/// `port`, adding half of `rtt` each way (a side's round trips are then
/// its own proxy's); without, none.
///
/// # Errors
///
/// When a proxy cannot listen.
pub(crate) async fn proxies(
    port: u16,
    sides: usize,
    rtt: Option<Duration>,
) -> Result<Vec<FaultProxy>, BoxError> {
    let Some(rtt) = rtt else {
        return Ok(Vec::new());
    };
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut proxies = Vec::with_capacity(sides);
    for _ in 0..sides {
        let proxy = FaultProxy::start(upstream).await?;
        proxy.set_latency(rtt / 2, Duration::ZERO);
        proxies.push(proxy);
    }
    Ok(proxies)
}

/// The loopback port side `side` connects to: its proxy's, or the
/// server's `port` when there are none.
pub(crate) fn port_of(proxies: &[FaultProxy], side: usize, port: u16) -> u16 {
    proxies.get(side).map_or(port, FaultProxy::port)
}

/// What [`interleaved`] measured, per side.
pub(crate) struct Measured {
    names: Vec<&'static str>,
    stats: Vec<LatencyStats>,
    /// Each measured round's p50 (µs), per side.
    round_p50: Vec<Vec<f64>>,
    /// (client, server) CPU per cycle, µs.
    cpu: Vec<(f64, f64)>,
    /// Round trips per cycle, with proxies.
    round_trips: Vec<Option<f64>>,
}

/// Runs `cycle(side)` for every side of `names`: a warm-up round, then
/// [`ROUNDS`] rounds of `cycles / ROUNDS` cycles per side, one after
/// another, the order rotating each round. `server` is the server's
/// process (its CPU is read, with its children's, around each turn);
/// `proxies` the sides' proxies (empty without `RTT_US`).
///
/// # Errors
///
/// The first error a cycle returns.
pub(crate) async fn interleaved(
    names: &[&'static str],
    cycles: usize,
    server: Option<u32>,
    proxies: &[FaultProxy],
    mut cycle: impl AsyncFnMut(usize) -> Result<(), BoxError>,
) -> Result<Measured, BoxError> {
    let sides = names.len();
    let only = only();
    let per = (cycles / ROUNDS).max(1);
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(per * ROUNDS); sides];
    let mut round_p50 = vec![Vec::with_capacity(ROUNDS); sides];
    let mut walls = vec![Duration::ZERO; sides];
    let mut cpu = vec![(0u64, 0u64); sides];
    for round in 0..=ROUNDS {
        if round == 1 {
            // The warm-up's connects and script loads are not the cycle's.
            for proxy in proxies {
                proxy.reset_counters();
            }
        }
        for turn in 0..sides {
            let side = (turn + round) % sides;
            if only.is_some_and(|o| o != side) {
                continue;
            }
            let count = if round == 0 { WARMUP } else { per };
            let mut this_round = Vec::with_capacity(count);
            let (client_before, server_before) = (
                conformance::cpu::self_cpu_ns(),
                conformance::cpu::process_tree_cpu_ns(server),
            );
            let started = Instant::now();
            for _ in 0..count {
                let at = Instant::now();
                cycle(side).await?;
                this_round.push(at.elapsed());
            }
            if round == 0 {
                continue;
            }
            walls[side] += started.elapsed();
            cpu[side].0 += conformance::cpu::self_cpu_ns() - client_before;
            cpu[side].1 += conformance::cpu::process_tree_cpu_ns(server) - server_before;
            round_p50[side]
                .push(LatencyStats::from_samples(this_round.clone(), Duration::ZERO).p50_us);
            samples[side].extend(this_round);
        }
    }
    let measured = (per * ROUNDS) as f64;
    Ok(Measured {
        names: names.to_vec(),
        stats: samples
            .into_iter()
            .zip(&walls)
            .map(|(s, w)| LatencyStats::from_samples(s, *w))
            .collect(),
        round_p50,
        cpu: cpu
            .iter()
            .map(|(c, s)| (*c as f64 / 1e3 / measured, *s as f64 / 1e3 / measured))
            .collect(),
        round_trips: (0..sides)
            .map(|side| proxies.get(side).map(|p| p.round_trips() as f64 / measured))
            .collect(),
    })
}

impl Measured {
    /// Prints one line per side, then the ratio of side `over` to side
    /// `under` for each `(over, under)` pair: of the p50s and the means over
    /// the whole run, and the lowest, median and highest of the per-round
    /// p50 ratios (the spread within this run).
    pub(crate) fn print(&self, ratios: &[(usize, usize)]) {
        for (side, name) in self.names.iter().enumerate() {
            let s = &self.stats[side];
            if s.samples == 0 {
                continue;
            }
            let (client, server) = self.cpu[side];
            let trips = self.round_trips[side]
                .map(|t| format!("  {t:.2} round trips"))
                .unwrap_or_default();
            println!(
                "  {name:<28} p50 {:>8.1} us  p99 {:>8.1} us  mean {:>8.1} us  cpu client {client:>6.1} us  server {server:>6.1} us{trips}",
                s.p50_us, s.p99_us, s.mean_us,
            );
        }
        for &(over, under) in ratios {
            let (o, u) = (&self.stats[over], &self.stats[under]);
            if o.samples == 0 || u.samples == 0 {
                continue;
            }
            let mut per_round: Vec<f64> = self.round_p50[over]
                .iter()
                .zip(&self.round_p50[under])
                .map(|(o, u)| o / u)
                .collect();
            per_round.sort_by(f64::total_cmp);
            println!(
                "  {} / {}: p50 {:.3}x  mean {:.3}x  (per round p50: min {:.3} median {:.3} max {:.3})",
                self.names[over],
                self.names[under],
                o.p50_us / u.p50_us,
                o.mean_us / u.mean_us,
                per_round[0],
                per_round[per_round.len() / 2],
                per_round[per_round.len() - 1],
            );
        }
    }
}

/// The TTL and wait every side's cycle uses.
pub(crate) const TTL: Duration = Duration::from_secs(30);
/// How long a waiting acquire may wait.
pub(crate) const WAIT: Duration = Duration::from_secs(60);

/// The backend's own acquire + release on `key` (no `LockClient`, guard or
/// renewal scheduler).
pub(crate) async fn direct_cycle(
    backend: &dyn lock_core::LockBackend,
    key: &lock_core::LockKey,
) -> Result<(), BoxError> {
    use lock_core::LockBackendExt;
    let lease = backend.acquire(key, TTL, Instant::now() + WAIT).await?;
    assert!(backend.release(&lease).await?, "still ours");
    Ok(())
}

/// Ours as users write it: a waiting acquire, then release.
pub(crate) async fn ours_cycle(client: &lock_core::LockClient) -> Result<(), BoxError> {
    let guard = client
        .lock("parts-ours")
        .ttl(TTL)
        .wait(WAIT)
        .acquire()
        .await?;
    guard.release().await?;
    Ok(())
}
