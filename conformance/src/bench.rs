//! Latency and throughput measurements, for benchmarks that print ratios
//! measured in one run (ours vs. the raw round trips issued by hand). No
//! timed assertions: these only measure.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{LockBackend, LockError, LockKey};
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

/// One uncontended acquire + release through the trait.
///
/// # Errors
///
/// Backend errors, or `Contended` if the key was unexpectedly held.
pub async fn cycle(
    backend: &dyn LockBackend,
    key: &LockKey,
    ttl: Duration,
) -> Result<(), LockError> {
    let lease = backend.try_acquire(key, ttl).await?.ok_or_else(|| {
        LockError::new(
            lock_core::ErrorKind::Contended,
            lock_core::Operation::TryAcquire,
            "benchmark key unexpectedly held",
        )
        .with_key(key)
    })?;
    backend.release(&lease).await?;
    Ok(())
}

/// Sequential acquire+release cycles on one key.
///
/// # Errors
///
/// Backend errors.
pub async fn cycle_latency(
    backend: Arc<dyn LockBackend>,
    key: &LockKey,
    ttl: Duration,
    n: usize,
) -> Result<LatencyStats, LockError> {
    measure_sequential(n, |_| {
        let backend = backend.clone();
        let key = key.clone();
        async move { cycle(&*backend, &key, ttl).await }
    })
    .await
}

/// `tasks` tasks each cycling on its own key (`<prefix>-<task>`).
///
/// # Errors
///
/// Backend errors.
pub async fn cycle_throughput(
    backend: Arc<dyn LockBackend>,
    prefix: &str,
    ttl: Duration,
    tasks: usize,
    per_task: usize,
) -> Result<LatencyStats, LockError> {
    let keys: Vec<LockKey> = (0..tasks)
        .map(|t| LockKey::new(format!("{prefix}-{t}")))
        .collect::<Result<_, _>>()?;
    let keys = Arc::new(keys);
    measure_parallel(tasks, per_task, move |t, _| {
        let backend = backend.clone();
        let keys = keys.clone();
        async move { cycle(&*backend, &keys[t], ttl).await }
    })
    .await
}

/// Handoffs per second and handoff latency with `tasks` tasks contending on
/// one key: each task loops acquire (waiting) → release. A handoff's latency
/// is the time from a release to the next grant.
///
/// # Errors
///
/// Backend errors.
pub async fn handoff(
    backend: Arc<dyn LockBackend>,
    key: &LockKey,
    ttl: Duration,
    tasks: usize,
    grants: usize,
) -> Result<LatencyStats, LockError> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let remaining = Arc::new(AtomicUsize::new(grants));
    let last_release: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::new(Mutex::new(Vec::new()));
    let wall = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (backend, key, remaining, last_release, samples) = (
            backend.clone(),
            key.clone(),
            remaining.clone(),
            last_release.clone(),
            samples.clone(),
        );
        handles.push(tokio::spawn(async move {
            while remaining
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let lease = backend
                    .acquire(&key, ttl, Instant::now() + Duration::from_secs(30))
                    .await?;
                let granted = Instant::now();
                if let Some(released) = last_release.lock().expect("lock").take() {
                    samples.lock().expect("lock").push(granted - released);
                }
                *last_release.lock().expect("lock") = Some(Instant::now());
                backend.release(&lease).await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    for handle in handles {
        match handle.await {
            Ok(result) => result?,
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }
    let samples = std::mem::take(&mut *samples.lock().expect("lock"));
    let mut stats = LatencyStats::from_samples(samples, wall.elapsed());
    #[allow(clippy::cast_precision_loss)]
    {
        stats.per_sec = grants as f64 / wall.elapsed().as_secs_f64();
    }
    Ok(stats)
}

/// `value / floor`, or 0 when the floor is 0.
pub fn ratio(value: f64, floor: f64) -> f64 {
    if floor == 0.0 { 0.0 } else { value / floor }
}
