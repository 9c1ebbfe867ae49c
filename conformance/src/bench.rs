//! Latency and throughput measurements, for benchmarks that print ratios
//! measured in one run (ours vs. the raw round trips issued by hand). No
//! timed assertions: these only measure.

mod standard;
pub use standard::{StandardFigures, StandardRun, standard_figures};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::floor::RawFloor;
use lock_core::{LockClient, LockError};
use serde::Serialize;
use tokio::time::Instant;

/// Latency distribution of one operation.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LatencyStats {
    /// Samples taken.
    pub samples: usize,
    /// Median, in microseconds.
    pub p50_us: f64,
    /// 99th percentile, in microseconds.
    pub p99_us: f64,
    /// Mean, in microseconds.
    pub mean_us: f64,
    /// Operations per second over the whole run.
    pub per_sec: f64,
    /// Latency distribution: bucket `i` counts samples in
    /// `[2^i, 2^(i+1))` microseconds (bucket 0 also holds anything faster).
    pub histogram: [u32; HISTOGRAM_BUCKETS],
}

/// Buckets of [`LatencyStats::histogram`]: 1 µs up to about 16 s.
pub const HISTOGRAM_BUCKETS: usize = 24;

fn bucket_of(sample: Duration) -> usize {
    let micros = sample.as_micros().max(1);
    let bucket = usize::try_from(micros.ilog2()).unwrap_or(usize::MAX);
    bucket.min(HISTOGRAM_BUCKETS - 1)
}

impl LatencyStats {
    /// Computes the statistics of `samples` taken over `wall` time.
    pub fn from_samples(mut samples: Vec<Duration>, wall: Duration) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let pick = |q: f64| {
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                clippy::cast_precision_loss
            )]
            let i = ((samples.len() - 1) as f64 * q).round() as usize;
            samples[i.min(samples.len() - 1)].as_secs_f64() * 1e6
        };
        let total: Duration = samples.iter().sum();
        #[allow(clippy::cast_precision_loss)]
        let n = samples.len() as f64;
        let mut histogram = [0u32; HISTOGRAM_BUCKETS];
        for sample in &samples {
            let slot = &mut histogram[bucket_of(*sample)];
            *slot = slot.saturating_add(1);
        }
        Self {
            histogram,
            samples: samples.len(),
            p50_us: pick(0.50),
            p99_us: pick(0.99),
            mean_us: total.as_secs_f64() * 1e6 / n,
            per_sec: if wall.is_zero() {
                0.0
            } else {
                n / wall.as_secs_f64()
            },
        }
    }
}

/// Runs `op` `n` times one after another and measures each call.
///
/// # Errors
///
/// The first error `op` returns.
pub async fn measure_sequential<F, Fut, E>(n: usize, mut op: F) -> Result<LatencyStats, E>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let mut samples = Vec::with_capacity(n);
    let wall = Instant::now();
    for i in 0..n {
        let started = Instant::now();
        op(i).await?;
        samples.push(started.elapsed());
    }
    Ok(LatencyStats::from_samples(samples, wall.elapsed()))
}

/// Runs `tasks` concurrent tasks, each calling `op(task, i)` `per_task`
/// times, and measures every call and the total throughput.
///
/// # Errors
///
/// The first error any task returns.
pub async fn measure_parallel<F, Fut, E>(
    tasks: usize,
    per_task: usize,
    op: F,
) -> Result<LatencyStats, E>
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Send + 'static,
{
    let op = Arc::new(op);
    let wall = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let op = op.clone();
        handles.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(per_task);
            for i in 0..per_task {
                let started = Instant::now();
                op(t, i).await?;
                samples.push(started.elapsed());
            }
            Ok::<_, E>(samples)
        }));
    }
    let mut all = Vec::with_capacity(tasks * per_task);
    for handle in handles {
        match handle.await {
            Ok(Ok(samples)) => all.extend(samples),
            Ok(Err(e)) => return Err(e),
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }
    Ok(LatencyStats::from_samples(all, wall.elapsed()))
}

/// `value / floor`, or 0 when the floor is 0.
pub fn ratio(value: f64, floor: f64) -> f64 {
    if floor == 0.0 { 0.0 } else { value / floor }
}

/// One independent client in a benchmark: ours (a [`LockClient`] used as
/// users use it) or a hand-written floor on a bare connection of its own.
#[async_trait::async_trait]
pub trait Contender: Send + Sync {
    /// Takes `key` (waiting while someone else holds it) and gives it back.
    ///
    /// # Errors
    ///
    /// Backend errors, or `Contended` when `key` stayed held for
    /// [`CONTENDED_LIMIT`].
    ///
    /// # Cancel safety
    ///
    /// Not a lock API: a dropped cycle may leave `key` held until its TTL.
    async fn cycle(&self, key: &str) -> Result<(), LockError>;
}

/// The longest a benchmark cycle waits for a held key.
pub const CONTENDED_LIMIT: Duration = Duration::from_secs(60);

/// Our cycle as a user writes it:
/// `client.lock(key).ttl(ttl).wait(60 s).acquire()`, then `guard.release()`.
pub struct Ours {
    client: LockClient,
    ttl: Duration,
    kind: lock_core::LeaseKind,
}

impl Ours {
    /// A contender on its own client, taking the mutex.
    pub fn new(client: LockClient, ttl: Duration) -> Self {
        Self::with_kind(client, ttl, lock_core::LeaseKind::Exclusive)
    }

    /// A contender taking grants of `kind` (a read share, permits...):
    /// `client.lock_kind(key, kind)`, otherwise as [`new`](Self::new).
    pub fn with_kind(client: LockClient, ttl: Duration, kind: lock_core::LeaseKind) -> Self {
        Self { client, ttl, kind }
    }
}

#[async_trait::async_trait]
impl Contender for Ours {
    async fn cycle(&self, key: &str) -> Result<(), LockError> {
        let guard = self
            .client
            .lock_kind(key, self.kind)
            .ttl(self.ttl)
            .wait(CONTENDED_LIMIT)
            .acquire()
            .await?;
        guard.release().await?;
        Ok(())
    }
}

/// One waiting acquire of a free `key` and its release, through the user
/// API as [`Ours`] does it (`client.lock(key).ttl(ttl).wait(60 s)`), for
/// the tests that count what a cycle costs on the wire.
///
/// # Panics
///
/// On any error, or when the release finds the lock no longer held.
pub async fn waiting_cycle(client: &LockClient, key: &str, ttl: Duration) {
    let guard = client
        .lock(key)
        .ttl(ttl)
        .wait(CONTENDED_LIMIT)
        .acquire()
        .await
        .expect("a free key is granted");
    assert!(guard.release().await.expect("release"), "released");
}

/// [`waiting_cycle`] with a single try (`try_acquire`) instead of a
/// waiting acquire.
///
/// # Panics
///
/// As [`waiting_cycle`], and when the key is held.
pub async fn try_cycle(client: &LockClient, key: &str, ttl: Duration) {
    let guard = client
        .lock(key)
        .ttl(ttl)
        .try_acquire()
        .await
        .expect("try_acquire")
        .expect("a free key is granted");
    assert!(guard.release().await.expect("release"), "released");
}

/// A floor's cycle: its grant and release; on a held key it asks again at
/// once (a hand-written polling loop: the floor has no waiting of its own).
pub struct FloorCycle {
    floor: Box<dyn RawFloor>,
    ttl: Duration,
}

impl FloorCycle {
    /// A contender on `floor`'s connection.
    pub fn new(floor: Box<dyn RawFloor>, ttl: Duration) -> Self {
        Self { floor, ttl }
    }

    /// The floor's declared round trips per cycle.
    pub fn declared_round_trips(&self) -> u32 {
        self.floor.round_trips_per_cycle()
    }
}

#[async_trait::async_trait]
impl Contender for FloorCycle {
    async fn cycle(&self, key: &str) -> Result<(), LockError> {
        let give_up = Instant::now() + CONTENDED_LIMIT;
        loop {
            if let Some(grant) = self.floor.try_grant(key, self.ttl).await? {
                self.floor.release(&grant).await?;
                return Ok(());
            }
            if Instant::now() >= give_up {
                return Err(LockError::new(
                    lock_core::ErrorKind::Contended,
                    lock_core::Operation::Acquire,
                    "the floor's benchmark key stayed held",
                )
                .with_backend(self.floor.name()));
            }
            tokio::task::yield_now().await;
        }
    }
}

/// Sequential cycles of `ours` and `floor`, interleaved: `rounds` rounds of
/// `n / rounds` cycles each, the order swapped every round, so both see the
/// same machine load. Returns (ours, floor).
///
/// # Errors
///
/// The first cycle error.
pub async fn interleaved_latency(
    ours: &dyn Contender,
    floor: &dyn Contender,
    keys: (&str, &str),
    n: usize,
    rounds: usize,
) -> Result<(LatencyStats, LatencyStats), LockError> {
    let rounds = rounds.max(1);
    let per_round = (n / rounds).max(1);
    let mut samples = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut walls = (Duration::ZERO, Duration::ZERO);
    for round in 0..rounds {
        for side in [round % 2, 1 - round % 2] {
            let (who, key, out, wall) = if side == 0 {
                (ours, keys.0, &mut samples.0, &mut walls.0)
            } else {
                (floor, keys.1, &mut samples.1, &mut walls.1)
            };
            let started = Instant::now();
            for _ in 0..per_round {
                let at = Instant::now();
                who.cycle(key).await?;
                out.push(at.elapsed());
            }
            *wall += started.elapsed();
        }
    }
    Ok((
        LatencyStats::from_samples(samples.0, walls.0),
        LatencyStats::from_samples(samples.1, walls.1),
    ))
}

/// Every contender cycling on its own key (`<prefix>-<i>`) at once, for
/// `per_client` cycles: throughput over the run, latency of each cycle.
///
/// # Errors
///
/// The first cycle error.
pub async fn concurrent_cycles(
    contenders: &[Arc<dyn Contender>],
    prefix: &str,
    per_client: usize,
) -> Result<LatencyStats, LockError> {
    let wall = Instant::now();
    let mut handles = Vec::with_capacity(contenders.len());
    for (i, who) in contenders.iter().enumerate() {
        let who = who.clone();
        let key = format!("{prefix}-{i}");
        handles.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(per_client);
            for _ in 0..per_client {
                let at = Instant::now();
                who.cycle(&key).await?;
                samples.push(at.elapsed());
            }
            Ok::<_, LockError>(samples)
        }));
    }
    let mut all = Vec::new();
    for handle in handles {
        match handle.await {
            Ok(samples) => all.extend(samples?),
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }
    Ok(LatencyStats::from_samples(all, wall.elapsed()))
}

/// [`concurrent_cycles`] of ours and of the floors, interleaved over
/// `rounds` rounds (order swapped every round). Returns (ours, floor), each
/// over all its rounds.
///
/// # Errors
///
/// The first cycle error.
pub async fn interleaved_throughput(
    ours: &[Arc<dyn Contender>],
    floors: &[Arc<dyn Contender>],
    prefixes: (&str, &str),
    per_client: usize,
    rounds: usize,
) -> Result<(LatencyStats, LatencyStats), LockError> {
    let rounds = rounds.max(1);
    let per_round = (per_client / rounds).max(1);
    let mut runs: (Vec<LatencyStats>, Vec<LatencyStats>) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for side in [round % 2, 1 - round % 2] {
            if side == 0 {
                runs.0
                    .push(concurrent_cycles(ours, prefixes.0, per_round).await?);
            } else {
                runs.1
                    .push(concurrent_cycles(floors, prefixes.1, per_round).await?);
            }
        }
    }
    Ok((merge_runs(&runs.0), merge_runs(&runs.1)))
}

/// Several runs as one: samples and wall times summed, percentiles from
/// the merged histogram's run with the median rate.
fn merge_runs(runs: &[LatencyStats]) -> LatencyStats {
    let mut rates: Vec<f64> = runs.iter().map(|r| r.per_sec).collect();
    rates.sort_by(f64::total_cmp);
    let mut merged = runs
        .iter()
        .find(|r| r.per_sec == rates[rates.len() / 2])
        .copied()
        .unwrap_or_default();
    merged.samples = runs.iter().map(|r| r.samples).sum();
    merged.per_sec = rates.get(rates.len() / 2).copied().unwrap_or(0.0);
    merged
}

/// `clients` tasks, each running `cycles` of `floor`'s cycle on a key of
/// its own (`par/<i>`) at once, as the benchmarks run floors: a floor
/// shared by tasks must keep their exchanges apart.
///
/// # Errors
///
/// The first cycle error.
///
/// # Panics
///
/// If a task panicked (the panic is resumed).
pub async fn floor_cycles_in_parallel(
    floor: Arc<dyn RawFloor>,
    ttl: Duration,
    clients: usize,
    cycles: usize,
) -> Result<(), LockError> {
    let tasks: Vec<_> = (0..clients)
        .map(|t| {
            let floor = floor.clone();
            tokio::spawn(async move {
                for _ in 0..cycles {
                    floor.cycle(&format!("par/{t}"), ttl).await?;
                }
                Ok::<_, LockError>(())
            })
        })
        .collect();
    join_tasks(tasks).await
}

/// Waits for every task: the first error any of them returned.
///
/// # Errors
///
/// The first task's error, in the order given.
///
/// # Panics
///
/// If a task panicked (the panic is resumed).
pub async fn join_tasks<E>(tasks: Vec<tokio::task::JoinHandle<Result<(), E>>>) -> Result<(), E> {
    for task in tasks {
        match task.await {
            Ok(result) => result?,
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }
    Ok(())
}

/// Checks that `floor` refuses bad input with a typed error, as the
/// driver would: an empty key, and a TTL of `too_short` (below the
/// driver's minimum) on a valid key.
///
/// # Panics
///
/// When either is accepted or fails with another kind than
/// `InvalidArgument`.
pub async fn assert_floor_refuses_bad_input(
    floor: &dyn RawFloor,
    ttl: Duration,
    too_short: Duration,
) {
    for (key, ttl) in [("", ttl), ("floor/too-short", too_short)] {
        match floor.cycle(key, ttl).await {
            Err(err) => assert_eq!(
                err.kind(),
                lock_core::ErrorKind::InvalidArgument,
                "key {key:?}, ttl {ttl:?}: {err}"
            ),
            Ok(()) => panic!("the floor accepted key {key:?} with ttl {ttl:?}"),
        }
    }
}

/// Contended handoffs: every contender cycles on one key for `duration`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Handoffs {
    /// Grants per second over the run, all contenders together.
    pub per_sec: f64,
    /// Grants of each contender.
    pub per_client: Vec<u64>,
}

impl Handoffs {
    /// The busiest contender's grants over the least busy one's (infinite
    /// when one got none).
    pub fn spread(&self) -> f64 {
        let max = self.per_client.iter().copied().max().unwrap_or(0);
        let min = self.per_client.iter().copied().min().unwrap_or(0);
        #[allow(clippy::cast_precision_loss)]
        if min == 0 {
            f64::INFINITY
        } else {
            max as f64 / min as f64
        }
    }
}

/// All `contenders` cycling on `key` at once for `duration`.
///
/// # Errors
///
/// The first cycle error.
pub async fn handoffs(
    contenders: &[Arc<dyn Contender>],
    key: &str,
    duration: Duration,
) -> Result<Handoffs, LockError> {
    let started = Instant::now();
    let stop = started + duration;
    let mut handles = Vec::with_capacity(contenders.len());
    for who in contenders {
        let who = who.clone();
        let key = key.to_owned();
        handles.push(tokio::spawn(async move {
            let mut grants = 0u64;
            while Instant::now() < stop {
                who.cycle(&key).await?;
                grants += 1;
            }
            Ok::<_, LockError>(grants)
        }));
    }
    let mut per_client = Vec::with_capacity(contenders.len());
    for handle in handles {
        match handle.await {
            Ok(grants) => per_client.push(grants?),
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }
    let wall = started.elapsed();
    #[allow(clippy::cast_precision_loss)]
    let per_sec = per_client.iter().sum::<u64>() as f64 / wall.as_secs_f64();
    Ok(Handoffs {
        per_sec,
        per_client,
    })
}

/// Round trips per cycle of `who`, counted by `proxy` (which must be
/// between `who` and its server, with nothing else on it) over `cycles`
/// sequential cycles on `key`, after `warm_up` cycles.
///
/// # Errors
///
/// The first cycle error.
pub async fn round_trips_per_cycle(
    who: &dyn Contender,
    proxy: &crate::proxy::FaultProxy,
    key: &str,
    warm_up: usize,
    cycles: usize,
) -> Result<f64, LockError> {
    let mut failed = None;
    let plan = crate::proxy::CyclePlan::new(warm_up, u64::try_from(cycles).unwrap_or(u64::MAX));
    let count = proxy
        .count_cycles(plan, async || {
            if failed.is_none()
                && let Err(err) = who.cycle(key).await
            {
                failed = Some(err);
            }
        })
        .await;
    match failed {
        Some(err) => Err(err),
        None => Ok(count.per_cycle()),
    }
}
