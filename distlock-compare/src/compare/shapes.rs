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
//! .acquire()`, then `release()`, for a fixed window. The sides (8
//! clients, 1 client, the floors) run one after another in each round, the
//! order rotated every round, on this process's multi-thread runtime; each
//! round gives a ratio per shape (ours over the floor of the same round) and
//! the report takes the median of the rounds' ratios.
//!
//! Where they apply, two more sides of 8 connections run in the same
//! rounds:
//!
//! - **raw server lock** (SQL session mode): the bare advisory-lock /
//!   `GET_LOCK` exchange with no token (`lock_bench::sql::SqlRawLock`):
//!   ours over raw per shape, and the floor over raw (what the fencing
//!   token and the published holder cost, the floor's grant taking both
//!   in the same statement);
//! - **crate alone** (ZooKeeper, etcd, Redis on one server, Redlock): the
//!   driver's requests through its required client library and nothing
//!   else (`lock_bench::crate_alone`): the library over the floor (its
//!   share), 8 clients of ours over it (the driver's own).
//!
//! With the crate-alone side comes its shared shape, **1 crate-alone
//! client / 8 tasks** (one client of the library, e.g. one redis-rs
//! multiplexed connection, shared by eight tasks): the library's share of
//! the shared shape's gap (over the floor), and the shared client of ours
//! over it (the driver's own there).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::bench::{self, Contender, Ours};
use conformance::cpu::median;
use lock_core::LockError;
use serde::Serialize;
use tokio::time::Instant;

use super::BenchFigures;
use super::bench_setup::CLIENTS;

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
    /// with `--full` (three sides a round: 7 s, 15 s, 60 s; four where the
    /// raw server lock applies: 10 s, 20 s, 80 s; five where the client
    /// library alone does, its 8 clients and its shared client: 12 s,
    /// 25 s, 100 s).
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
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(crate) struct ShapeRound {
    /// 8 clients, one task each.
    pub(crate) clients: f64,
    /// 1 client shared by 8 tasks.
    pub(crate) shared: f64,
    /// 8 floor connections, one task each (`None` without a floor).
    pub(crate) floor: Option<f64>,
    /// 8 raw server-lock connections (SQL session mode only).
    pub(crate) raw: Option<f64>,
    /// 8 clients of the driver's client library alone (ZooKeeper, etcd,
    /// Redis on one server, Redlock only).
    pub(crate) crate_alone: Option<f64>,
    /// 1 client of that library alone shared by 8 tasks (where
    /// `crate_alone` is measured).
    pub(crate) shared_crate_alone: Option<f64>,
}

/// A side of the rounds: what it is and its 8 contenders.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Clients,
    Shared,
    Floor,
    Raw,
    CrateAlone,
    SharedCrateAlone,
}

impl Side {
    /// Its keys' prefix part.
    fn tag(self) -> &'static str {
        match self {
            Self::Clients => "clients",
            Self::Shared => "shared",
            Self::Floor => "floor",
            Self::Raw => "raw",
            Self::CrateAlone => "crate-alone",
            Self::SharedCrateAlone => "shared-crate-alone",
        }
    }

    /// Its rate into `round`.
    fn record(self, round: &mut ShapeRound, rate: f64) {
        match self {
            Self::Clients => round.clients = rate,
            Self::Shared => round.shared = rate,
            Self::Floor => round.floor = Some(rate),
            Self::Raw => round.raw = Some(rate),
            Self::CrateAlone => round.crate_alone = Some(rate),
            Self::SharedCrateAlone => round.shared_crate_alone = Some(rate),
        }
    }
}

/// The two shapes into `out`: `throughput_8x8` (8 clients),
/// `throughput_shared_client` (1 client / 8 tasks), each with the floor's
/// median rate and the median of the rounds' ratios, and every round in
/// `client_shape_rounds`; where they apply, the raw server lock's and the
/// client library's figures (see the module docs). Without a floor
/// (in-memory) ours only.
///
/// # Errors
///
/// Connecting a client or a floor, or a cycle failing.
///
/// # Cancel safety
///
/// Not a lock API: dropping the future mid-round may leave the round's
/// keys held until their TTL.
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
    let mut sides: Vec<(Side, Vec<Arc<dyn Contender>>)> =
        vec![(Side::Clients, clients), (Side::Shared, vec![one; CLIENTS])];
    if let Some(floors) = crate::floors::contenders(url, SHAPE_TTL, CLIENTS).await {
        sides.push((Side::Floor, floors));
    }
    if let Some(raw) = crate::floors::raw_server_locks(url, CLIENTS).await {
        sides.push((Side::Raw, raw));
    }
    if let Some((library, alone)) = crate::floors::crate_alone(url, SHAPE_TTL, CLIENTS).await {
        out.crate_alone_library = Some(library.to_owned());
        sides.push((Side::CrateAlone, alone));
        if let Some((_, mut one)) = crate::floors::crate_alone(url, SHAPE_TTL, 1).await
            && let Some(one) = one.pop()
        {
            sides.push((Side::SharedCrateAlone, vec![one; CLIENTS]));
        }
    }
    let prefix = |side: Side| format!("bench-{run}/shape-{}", side.tag());
    // Warm up every connection, script and statement cache.
    let warm = Duration::from_millis(100);
    for (side, contenders) in &sides {
        cycles_for(contenders, &prefix(*side), warm).await?;
    }
    let mut rounds = Vec::with_capacity(plan.rounds);
    for round in 0..plan.rounds {
        let mut rates = ShapeRound::default();
        for step in 0..sides.len() {
            let (side, contenders) = &sides[(round + step) % sides.len()];
            let rate = rate(cycles_for(contenders, &prefix(*side), plan.window()).await?);
            side.record(&mut rates, rate);
        }
        rounds.push(rates);
    }
    let of = |pick: &dyn Fn(&ShapeRound) -> Option<f64>| -> Option<f64> {
        let values: Vec<f64> = rounds.iter().filter_map(pick).collect();
        (!values.is_empty()).then(|| median(values))
    };
    out.throughput_8x8 = of(&|r| Some(r.clients));
    out.throughput_shared_client = of(&|r| Some(r.shared));
    out.floor_throughput_8x8 = of(&|r| r.floor);
    out.floor_throughput_shared_client = out.floor_throughput_8x8;
    out.throughput_ratio = of(&|r| Some(bench::ratio(r.clients, r.floor?)));
    out.throughput_shared_client_ratio = of(&|r| Some(bench::ratio(r.shared, r.floor?)));
    out.raw_throughput_8x8 = of(&|r| r.raw);
    out.throughput_raw_ratio = of(&|r| Some(bench::ratio(r.clients, r.raw?)));
    out.throughput_shared_client_raw_ratio = of(&|r| Some(bench::ratio(r.shared, r.raw?)));
    out.token_cost_ratio = of(&|r| Some(bench::ratio(r.floor?, r.raw?)));
    out.crate_alone_throughput_8x8 = of(&|r| r.crate_alone);
    out.crate_alone_floor_ratio = of(&|r| Some(bench::ratio(r.crate_alone?, r.floor?)));
    out.throughput_crate_alone_ratio = of(&|r| Some(bench::ratio(r.clients, r.crate_alone?)));
    out.crate_alone_throughput_shared_client = of(&|r| r.shared_crate_alone);
    out.crate_alone_shared_client_floor_ratio =
        of(&|r| Some(bench::ratio(r.shared_crate_alone?, r.floor?)));
    out.throughput_shared_client_crate_alone_ratio =
        of(&|r| Some(bench::ratio(r.shared, r.shared_crate_alone?)));
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
