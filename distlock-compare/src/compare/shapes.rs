//! The two ways a service runs 8 lockers in one process, as users build
//! them, each against 8 hand-written floor connections in the same
//! process:
//!
//! - **8 clients**: `distlock::connect(url)` eight times, one task per
//!   client;
//! - **1 client / 8 tasks**: one `distlock::connect(url)` shared by eight
//!   tasks.
//!
//! Every task loops on a key of its own: `lock(key).ttl(30 s).wait(60 s)
//! .acquire()`, then `release()`, for a fixed window. The three sides (8
//! clients, 1 client, the floors) run one after another in each round, the
//! order rotated every round, on this process's multi-thread runtime; each
//! round gives a ratio per shape (ours over the floor of the same round) and
//! the report takes the median round.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::bench::{self, Contender, Ours};
use conformance::cpu::median;
use lock_core::LockError;
use serde::Serialize;
use tokio::time::Instant;

use super::BenchFigures;
use super::figures::CLIENTS;

/// The TTL every shape's grants ask for (the floors' too).
pub(super) const SHAPE_TTL: Duration = Duration::from_secs(30);

/// How many rounds and how long each side of a round runs.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct ShapePlan {
    pub(crate) rounds: usize,
    pub(crate) window_ms: u64,
}

impl ShapePlan {
    /// 6 rounds of 0.4 s a side quick, 10 of 0.5 s by default, 20 of 1 s
    /// with `--full` (three sides a round: 7 s, 15 s, 60 s).
    pub(super) fn of(full: bool, quick: bool) -> Self {
        match (full, quick) {
            (true, _) => Self {
                rounds: 20,
                window_ms: 1000,
            },
            (false, false) => Self {
                rounds: 10,
                window_ms: 500,
            },
            (false, true) => Self {
                rounds: 6,
                window_ms: 400,
            },
        }
    }

    fn window(self) -> Duration {
        Duration::from_millis(self.window_ms)
    }
}

/// One round's rates, cycles per second.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct ShapeRound {
    /// 8 clients, one task each.
    pub(crate) clients: f64,
    /// 1 client shared by 8 tasks.
    pub(crate) shared: f64,
    /// 8 floor connections, one task each (`None` without a floor).
    pub(crate) floor: Option<f64>,
}

/// The two shapes into `out`: `throughput_8x8` (8 clients),
/// `throughput_shared_client` (1 client / 8 tasks), each with the floor's
/// median rate and the median of the rounds' ratios, and every round in
/// `client_shape_rounds`. Without a floor (in-memory) ours only.
///
/// # Errors
///
/// Connecting a client or a floor, or a cycle failing.
pub(super) async fn measure(
    out: &mut BenchFigures,
    url: &str,
    run: &str,
    plan: ShapePlan,
) -> Result<(), LockError> {
    let mut clients: Vec<Arc<dyn Contender>> = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(Arc::new(Ours::new(
            distlock::connect(url).await?,
            SHAPE_TTL,
        )));
    }
    let one: Arc<dyn Contender> = Arc::new(Ours::new(distlock::connect(url).await?, SHAPE_TTL));
    let shared: Vec<Arc<dyn Contender>> = vec![one; CLIENTS];
    let floors = crate::floors::contenders(url, SHAPE_TTL, CLIENTS).await;
    let prefix = |side: &str| format!("bench-{run}/shape-{side}");
    // Warm up every connection, script and statement cache.
    let warm = Duration::from_millis(100);
    cycles_for(&clients, &prefix("clients"), warm).await?;
    cycles_for(&shared, &prefix("shared"), warm).await?;
    if let Some(floors) = &floors {
        cycles_for(floors, &prefix("floor"), warm).await?;
    }
    let mut rounds = Vec::with_capacity(plan.rounds);
    for round in 0..plan.rounds {
        let mut rates = [0.0_f64; 3];
        for step in 0..3 {
            let side = (round + step) % 3;
            rates[side] = match side {
                0 => rate(cycles_for(&clients, &prefix("clients"), plan.window()).await?),
                1 => rate(cycles_for(&shared, &prefix("shared"), plan.window()).await?),
                _ => match &floors {
                    Some(floors) => {
                        rate(cycles_for(floors, &prefix("floor"), plan.window()).await?)
                    }
                    None => 0.0,
                },
            };
        }
        rounds.push(ShapeRound {
            clients: rates[0],
            shared: rates[1],
            floor: floors.is_some().then_some(rates[2]),
        });
    }
    let of = |pick: fn(&ShapeRound) -> Option<f64>| -> Option<f64> {
        let values: Vec<f64> = rounds.iter().filter_map(pick).collect();
        (!values.is_empty()).then(|| median(values))
    };
    out.throughput_8x8 = of(|r| Some(r.clients));
    out.throughput_shared_client = of(|r| Some(r.shared));
    out.floor_throughput_8x8 = of(|r| r.floor);
    out.floor_throughput_shared_client = out.floor_throughput_8x8;
    out.throughput_ratio = of(|r| Some(bench::ratio(r.clients, r.floor?)));
    out.throughput_shared_client_ratio = of(|r| Some(bench::ratio(r.shared, r.floor?)));
    out.client_shape_plan = Some(plan);
    out.client_shape_rounds = rounds;
    Ok(())
}

/// Cycles per second.
pub(super) fn rate((cycles, wall): (u64, Duration)) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let cycles = cycles as f64;
    let wall = wall.as_secs_f64();
    if wall > 0.0 { cycles / wall } else { 0.0 }
}

/// Every contender cycling on its own key (`<prefix>-<i>`) at once, each
/// starting cycles until `window` has passed: the cycles done, and the
/// time until the last one ended.
pub(super) async fn cycles_for(
    contenders: &[Arc<dyn Contender>],
    prefix: &str,
    window: Duration,
) -> Result<(u64, Duration), LockError> {
    let started = Instant::now();
    let until = started + window;
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = contenders
        .iter()
        .enumerate()
        .map(|(i, who)| {
            let (who, done) = (who.clone(), done.clone());
            let key = format!("{prefix}-{i}");
            tokio::spawn(async move {
                while Instant::now() < until {
                    who.cycle(&key).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, LockError>(())
            })
        })
        .collect();
    conformance::bench::join_tasks(tasks).await?;
    Ok((done.load(Ordering::Relaxed), started.elapsed()))
}
