//! The figures every driver's benchmark example prints, measured the way
//! `distlock-compare compare` measures them: ours and the floor interleaved round
//! by round (the order swapped every round) so that machine load hits both
//! alike, each client on a connection of its own.

use std::sync::Arc;
use std::time::Duration;

use lock_core::LockError;

use super::{
    Contender, Handoffs, LatencyStats, handoffs, interleaved_latency, interleaved_throughput, ratio,
};

/// How long and under which names [`standard_figures`] runs.
#[derive(Clone, Debug)]
pub struct StandardRun {
    /// Prefixed to every key (unique per run, so runs do not meet).
    pub tag: String,
    /// 1-client cycles per side; the 8 clients run half as many each.
    pub cycles: usize,
    /// Interleaved rounds (each side once per round).
    pub rounds: usize,
    /// How long each side's 4 clients contend on one key.
    pub handoff_window: Duration,
}

impl StandardRun {
    /// `cycles` 1-client cycles in 10 rounds, 3 s of handoffs a side.
    pub fn new(cycles: usize) -> Self {
        Self {
            tag: lock_core::OwnerId::random().to_hex()[..6].to_owned(),
            cycles,
            rounds: 10,
            handoff_window: Duration::from_secs(3),
        }
    }
}

/// Ours against the floor (each pair `(ours, floor)`).
#[derive(Clone, Debug)]
pub struct StandardFigures {
    /// 1 client on one key: per-cycle latency.
    pub one_client: (LatencyStats, LatencyStats),
    /// 8 independent clients on 8 keys: throughput.
    pub eight_clients: (LatencyStats, LatencyStats),
    /// 4 independent clients on one key: handoffs.
    pub handoffs: (Handoffs, Handoffs),
}

/// Clients in the throughput run.
const CLIENTS: usize = 8;
/// Clients contending on one key in the handoff run.
const HANDOFF_CLIENTS: usize = 4;

/// Measures [`StandardFigures`] with `ours` and `floors`, 8 independent
/// clients each (the first also runs the 1-client figure), after a
/// warm-up of 200 cycles on the first client and 20 on every client.
///
/// # Errors
///
/// The first cycle error; [`lock_core::ErrorKind::InvalidArgument`] when
/// either side has fewer than 8 clients.
///
/// # Cancel safety
///
/// Not a lock API: a dropped run may leave keys held until their TTL.
pub async fn standard_figures(
    ours: &[Arc<dyn Contender>],
    floors: &[Arc<dyn Contender>],
    run: &StandardRun,
) -> Result<StandardFigures, LockError> {
    if ours.len() < CLIENTS || floors.len() < CLIENTS {
        return Err(LockError::invalid_argument(
            lock_core::Operation::Acquire,
            format!("the standard figures need {CLIENTS} clients a side"),
        ));
    }
    let tag = &run.tag;
    let keys = (format!("{tag}/seq"), format!("{tag}/floor-seq"));
    for _ in 0..200 {
        ours[0].cycle(&keys.0).await?;
        floors[0].cycle(&keys.1).await?;
    }
    let one_client = interleaved_latency(
        &*ours[0],
        &*floors[0],
        (&keys.0, &keys.1),
        run.cycles,
        run.rounds,
    )
    .await?;
    let prefixes = (format!("{tag}/par"), format!("{tag}/floor-par"));
    // Every client's key exists before measuring.
    interleaved_throughput(ours, floors, (&prefixes.0, &prefixes.1), 20, 1).await?;
    let eight_clients = interleaved_throughput(
        &ours[..CLIENTS],
        &floors[..CLIENTS],
        (&prefixes.0, &prefixes.1),
        (run.cycles / 2).max(100),
        run.rounds,
    )
    .await?;
    let floor = handoffs(
        &floors[..HANDOFF_CLIENTS],
        &format!("{tag}/floor-handoff"),
        run.handoff_window,
    )
    .await?;
    let mine = handoffs(
        &ours[..HANDOFF_CLIENTS],
        &format!("{tag}/handoff"),
        run.handoff_window,
    )
    .await?;
    Ok(StandardFigures {
        one_client,
        eight_clients,
        handoffs: (mine, floor),
    })
}

impl StandardFigures {
    /// Prints the three figures under `title`, ours as `ours_label` and the
    /// floor as `floor_label`, with ours over the floor.
    pub fn print(&self, title: &str, ours_label: &str, floor_label: &str) {
        let row = |label: &str, s: &LatencyStats| {
            println!(
                "  {label:<40} p50 {:>8.1} us  p99 {:>8.1} us  {:>9.0} cycles/s  ({} samples)",
                s.p50_us, s.p99_us, s.per_sec, s.samples
            );
        };
        let (ours, floor) = &self.one_client;
        println!("\n{title}: 1 client, acquire (wait) + release on one key:");
        row(floor_label, floor);
        row(ours_label, ours);
        println!(
            "  ours / floor: p50 {:.3}x  p99 {:.3}x  throughput {:.3}x",
            ratio(ours.p50_us, floor.p50_us),
            ratio(ours.p99_us, floor.p99_us),
            ratio(ours.per_sec, floor.per_sec)
        );
        let (ours, floor) = &self.eight_clients;
        println!("{title}: {CLIENTS} independent clients on {CLIENTS} keys:");
        row(floor_label, floor);
        row(ours_label, ours);
        println!(
            "  ours / floor: throughput {:.3}x",
            ratio(ours.per_sec, floor.per_sec)
        );
        let (ours, floor) = &self.handoffs;
        println!("{title}: {HANDOFF_CLIENTS} independent clients on one key:");
        for (label, h) in [(floor_label, floor), (ours_label, ours)] {
            println!(
                "  {label:<40} {:>8.0} handoffs/s  per client {:?}  busiest / least busy {:.2}x",
                h.per_sec,
                h.per_client,
                h.spread()
            );
        }
        println!(
            "  ours / floor: handoffs {:.3}x",
            ratio(ours.per_sec, floor.per_sec)
        );
    }
}
