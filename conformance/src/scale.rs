//! Held locks at scale: heap bytes per held lock on the client side, and
//! renewal round trips per renewal period, with N locks held by one client.
//!
//! [`held_locks`] takes a backend (connected by the caller, through a
//! [`FaultProxy`](crate::proxy::FaultProxy) when round trips should be
//! counted), acquires `locks` keys through one [`LockClient`], holds them
//! for a few renewal periods and reports. Heap bytes come from a counting
//! global allocator the calling binary installs ([`CountingAllocator`]):
//!
//! ```text
//! #[global_allocator]
//! static ALLOC: conformance::scale::CountingAllocator = conformance::scale::CountingAllocator;
//! ```
//!
//! For an in-process backend (the memory backend) the server's own state
//! lives in the same heap: it is measured separately by taking as many
//! leases directly on the backend first, and subtracted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering};
use std::time::Duration;

use lock_core::LockBackendExt;
use lock_core::{
    Lease, LockBackend, LockClient, LockError, LockGuard, LockKey, LockWrapper, async_trait,
};
use serde::Serialize;
use tokio::time::{Instant, sleep};

/// A global allocator that counts live heap bytes (install it with
/// `#[global_allocator]` in a test or example binary).
#[derive(Debug)]
pub struct CountingAllocator;

static LIVE: AtomicIsize = AtomicIsize::new(0);

fn delta(size: usize) -> isize {
    isize::try_from(size).unwrap_or(isize::MAX)
}

// SAFETY: every method forwards to the system allocator unchanged and only
// adds bookkeeping on an atomic counter.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(delta(layout.size()), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(delta(layout.size()), Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(delta(layout.size()), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's arguments.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_add(delta(new_size) - delta(layout.size()), Ordering::Relaxed);
        }
        new
    }
}

/// Heap bytes currently allocated through [`CountingAllocator`] (0 when
/// the binary did not install it).
pub fn live_bytes() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct ScaleConfig {
    /// How many locks the one client holds.
    pub locks: usize,
    /// Their TTL; the renewal period is a third of it.
    pub ttl: Duration,
    /// How many renewal periods to count round trips over.
    pub periods: u32,
    /// Acquisitions (and releases) in flight at once while setting up.
    pub concurrency: usize,
    /// Key prefix (keys are `<prefix><index>`).
    pub key_prefix: String,
    /// The backend lives in this process (its state is in the same heap
    /// and is subtracted).
    pub in_process: bool,
}

impl ScaleConfig {
    /// `locks` locks with a 3 s TTL (1 s renewal period) over 3 periods, or
    /// above 10,000 locks a 30 s TTL (10 s period) over 2, so that one
    /// renewal round of a slow backend fits in a period.
    pub fn new(locks: usize) -> Self {
        let large = locks > 10_000;
        Self {
            locks,
            ttl: Duration::from_secs(if large { 30 } else { 3 }),
            periods: if large { 2 } else { 3 },
            concurrency: 32,
            key_prefix: format!("scale-{}/", std::process::id()),
            in_process: false,
        }
    }
}

/// What [`held_locks`] measured.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct ScaleReport {
    /// The backend's name.
    pub backend: String,
    /// Locks held.
    pub locks: usize,
    /// Client-side heap retained per held lock: the lowest of the samples
    /// taken every 50 ms while holding (guards, their scheduler entries and
    /// the driver's per-lock state; the server's own state excluded for
    /// in-process backends). A renewal batch's buffers in flight belong to
    /// the batch (at most `RENEW_BATCH` leases), not to each held lock:
    /// they are in the peak. (The median used before counted them whenever
    /// a loaded server kept a batch in flight for half the window.)
    pub bytes_per_lock: f64,
    /// The highest sample (renewal batches in flight included).
    pub peak_bytes_per_lock: f64,
    /// Server-side heap per lock, for in-process backends (else 0).
    pub server_bytes_per_lock: f64,
    /// `renew_many` calls per renewal period.
    pub renew_calls_per_period: f64,
    /// Leases renewed per renewal period (about `locks`, up to 4/3 of it
    /// when batches take leases a little early).
    pub renewals_per_period: f64,
    /// Network round trips per renewal period (the proxy's count), when a
    /// counter was given.
    pub round_trips_per_period: Option<f64>,
    /// The renewal period (TTL / 3).
    pub period_ms: u64,
    /// Time to acquire all the locks.
    pub acquire_ms: u64,
    /// Every guard still held at the end.
    pub all_held: bool,
    /// Releases that failed at the end (the leases then expire), with the
    /// first error.
    pub release_errors: usize,
    /// The first release error, if any.
    pub first_release_error: Option<String>,
}

/// Counts what the scheduler asks of the backend: renewal calls and the
/// leases they carry; every other call goes straight through.
#[derive(Debug)]
struct Counted {
    inner: Arc<dyn LockBackend>,
    calls: AtomicU64,
    leases: AtomicU64,
}

#[async_trait]
impl LockWrapper for Counted {
    fn inner(&self) -> &dyn LockBackend {
        &*self.inner
    }
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.leases
            .fetch_add(u64::try_from(leases.len()).unwrap_or(0), Ordering::Relaxed);
        self.inner.renew_many(leases).await
    }
}

#[allow(clippy::cast_precision_loss)] // reporting ratios
fn per(amount: f64, count: usize) -> f64 {
    amount / count.max(1) as f64
}

/// Holds `config.locks` locks with one client on `backend` and measures
/// heap bytes per held lock and renewal calls (and, with `round_trips`,
/// network round trips) per renewal period.
///
/// `round_trips` reads a round-trip counter (e.g. a
/// [`FaultProxy`](crate::proxy::FaultProxy)'s `round_trips`) and
/// `reset_round_trips` zeroes it; both are called around the counting
/// window only.
///
/// # Errors
///
/// The first acquire error (failed releases at the end are counted in the
/// report).
///
/// # Cancel safety
///
/// Dropping the future drops the guards (released in the background).
#[allow(clippy::cast_precision_loss)] // reporting ratios
pub async fn held_locks(
    backend: Arc<dyn LockBackend>,
    config: &ScaleConfig,
    round_trips: Option<&(dyn Fn() -> u64 + Sync)>,
    reset_round_trips: Option<&(dyn Fn() + Sync)>,
) -> Result<ScaleReport, LockError> {
    let n = config.locks;
    let ttl = config.ttl;
    let period = ttl / 3;
    let counted = Arc::new(Counted {
        inner: backend.clone(),
        calls: AtomicU64::new(0),
        leases: AtomicU64::new(0),
    });
    let client = LockClient::from_arc(counted.clone());
    // Warm up: the scheduler, its task and the connections exist, and one
    // full batch was renewed, so buffers a driver keeps and reuses for a
    // batch (a pipeline's request bytes: about 150 kB for 1,000 Redis
    // renewals) are not counted per lock. They do not grow with the number
    // of locks: at most a few batches are in flight at once.
    // (Directly on the backend: the scheduler's own tables are counted.)
    let warm_up = client
        .lock(format!("{}warm-up", config.key_prefix))
        .ttl(ttl)
        .acquire()
        .await?;
    warm_up.release().await?;
    // An in-process backend has no connections or buffers, and warming it
    // would pre-size its own tables (then counted as client-side below).
    // Otherwise the warm-up runs as concurrently as the measurement, so a
    // pool opens the connections it will use before the baseline, with no
    // more leases than that: warming with as many leases as are measured
    // (up to 1,000) pre-sized the drivers' per-lock maps before the
    // baseline, which then hid them at 1,000 held locks.
    let warm_locks = if config.in_process {
        0
    } else {
        n.min(config.concurrency.max(1))
    };
    let mut warm = Vec::with_capacity(warm_locks);
    {
        let mut tasks = tokio::task::JoinSet::new();
        for range in ranges(warm_locks, config.concurrency) {
            let backend = backend.clone();
            let prefix = format!("{}warm-up/", config.key_prefix);
            tasks.spawn(async move {
                let mut got = Vec::with_capacity(range.len());
                for i in range {
                    let key = LockKey::new(format!("{prefix}{i:08}"))?;
                    if let Some(lease) = backend.try_acquire(&key, ttl).await? {
                        got.push(lease);
                    }
                }
                Ok::<_, LockError>(got)
            });
        }
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(result) => warm.extend(result?),
                Err(err) => std::panic::resume_unwind(err.into_panic()),
            }
        }
    }
    let refs: Vec<&Lease> = warm.iter().collect();
    if !refs.is_empty() {
        drop(backend.renew_many(&refs).await);
    }
    drop(refs);
    for lease in &warm {
        backend.release(lease).await?;
    }
    drop(warm);

    let server_bytes_per_lock = if config.in_process {
        // Same key lengths as the measured ones, held directly on the backend.
        let before = live_bytes();
        let mut leases = Vec::with_capacity(n);
        for i in 0..n {
            let key = LockKey::new(format!("{}{i:08}", probe_prefix(&config.key_prefix)))?;
            if let Some(lease) = backend.try_acquire(&key, ttl).await? {
                leases.push(lease);
            }
        }
        drop(leases);
        per((live_bytes() - before) as f64, n)
    } else {
        0.0
    };

    let before = live_bytes();
    let started = Instant::now();
    let mut guards: Vec<LockGuard> = Vec::with_capacity(n);
    {
        let mut tasks = tokio::task::JoinSet::new();
        for range in ranges(n, config.concurrency) {
            let client = client.clone();
            let prefix = config.key_prefix.clone();
            tasks.spawn(async move {
                let mut got = Vec::with_capacity(range.len());
                for i in range {
                    got.push(
                        client
                            .lock(format!("{prefix}{i:08}"))
                            .ttl(ttl)
                            .acquire()
                            .await?,
                    );
                }
                Ok::<_, LockError>(got)
            });
        }
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(result) => guards.extend(result?),
                Err(err) => std::panic::resume_unwind(err.into_panic()),
            }
        }
    }
    let acquire_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);

    // One period for every guard to be renewed once (batches form), then count.
    sleep(period).await;
    counted.calls.store(0, Ordering::Relaxed);
    counted.leases.store(0, Ordering::Relaxed);
    if let Some(reset) = reset_round_trips {
        reset();
    }
    let window = period * config.periods.max(1);
    let until = Instant::now() + window;
    let mut samples = Vec::new();
    while Instant::now() < until {
        samples.push(live_bytes() - before);
        sleep(Duration::from_millis(50)).await;
    }
    let calls = counted.calls.load(Ordering::Relaxed);
    let leases = counted.leases.load(Ordering::Relaxed);
    let trips = round_trips.map(|read| read());
    let all_held = guards.iter().all(LockGuard::is_held);
    samples.sort_unstable();
    let retained = samples.first().copied().unwrap_or(0);
    let peak = samples.last().copied().unwrap_or(0);
    let periods = f64::from(config.periods.max(1));

    let report = ScaleReport {
        backend: backend.name().to_owned(),
        locks: n,
        bytes_per_lock: per(retained as f64, n) - server_bytes_per_lock,
        peak_bytes_per_lock: per(peak as f64, n) - server_bytes_per_lock,
        server_bytes_per_lock,
        renew_calls_per_period: calls as f64 / periods,
        renewals_per_period: leases as f64 / periods,
        round_trips_per_period: trips.map(|t| t as f64 / periods),
        period_ms: u64::try_from(period.as_millis()).unwrap_or(u64::MAX),
        acquire_ms,
        all_held,
        release_errors: 0,
        first_release_error: None,
    };
    let mut report = report;

    // Give everything back, `concurrency` at a time.
    // A failed release is reported, not returned: the measurement is made.
    let mut tasks = tokio::task::JoinSet::new();
    let per_task = guards.len().div_ceil(config.concurrency.max(1)).max(1);
    while !guards.is_empty() {
        let part = guards.split_off(guards.len().saturating_sub(per_task));
        tasks.spawn(async move {
            let mut failed = (0usize, None);
            for guard in part {
                if let Err(err) = guard.release().await {
                    failed.0 += 1;
                    failed.1.get_or_insert_with(|| err.to_string());
                }
            }
            failed
        });
    }
    while let Some(joined) = tasks.join_next().await {
        if let Ok((count, first)) = joined {
            report.release_errors += count;
            if report.first_release_error.is_none() {
                report.first_release_error = first;
            }
        }
    }
    Ok(report)
}

fn probe_prefix(prefix: &str) -> String {
    // As long as the prefix, so keys (and their server state) are as large.
    let mut probe: String = "p".repeat(prefix.len());
    probe.truncate(prefix.len());
    probe
}

/// Splits `0..n` into at most `parts` contiguous ranges.
fn ranges(n: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    let size = n.div_ceil(parts.max(1)).max(1);
    (0..n)
        .step_by(size)
        .map(|start| start..(start + size).min(n))
        .collect()
}

/// Renewal round trips per period allowed for `locks` locks renewed in
/// batches of `batch`: every lease may be renewed up to 4/3 times a period
/// (batches take leases due within a quarter interval), in at most 4 groups,
/// plus `background` (keep-alives, pings).
pub fn round_trip_bound(locks: usize, batch: usize, background: usize) -> f64 {
    let per_batch = locks.div_ceil(batch.max(1));
    per(((per_batch + 4) * 4) as f64, 3) + per(background as f64, 1)
}

/// Prints one line per report (for tests and examples).
pub fn print_report(report: &ScaleReport) {
    println!(
        "held-at-scale {}: {} locks, {:.0} B/lock (peak {:.0}, server {:.0}), \
         {:.1} renew calls / {:.0} renewals / {} round trips per {} ms period, acquired in {} ms, all held: {}, \
         failed releases: {}",
        report.backend,
        report.locks,
        report.bytes_per_lock,
        report.peak_bytes_per_lock,
        report.server_bytes_per_lock,
        report.renew_calls_per_period,
        report.renewals_per_period,
        report
            .round_trips_per_period
            .map_or_else(|| "-".to_owned(), |t| format!("{t:.1}")),
        report.period_ms,
        report.acquire_ms,
        report.all_held,
        report.release_errors,
    );
    if let Some(err) = &report.first_release_error {
        println!(
            "held-at-scale {}: first failed release: {err}",
            report.backend
        );
    }
}

/// The lock counts to run, from `DISTLOCK_SCALE` (comma-separated, e.g.
/// `1000,10000,100000`), or `default` when unset.
pub fn scales_from_env(default: &[usize]) -> Vec<usize> {
    match std::env::var("DISTLOCK_SCALE") {
        Ok(text) => text
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect(),
        Err(_) => default.to_vec(),
    }
}

/// The most client-side heap a held lock may cost. The drivers measure
/// 255-340 B at 1,000 held locks, etcd 380-401 B (its median sample moves
/// with the renewals in flight on a loaded machine); the bound is there to
/// catch the kilobyte-sized regressions seen before (1.4 kB per etcd lock
/// with a watch channel per grant).
pub const MAX_BYTES_PER_LOCK: f64 = 450.0;

/// [`held_locks`] with the backend connected through a fresh
/// [`FaultProxy`](crate::proxy::FaultProxy) in front of `upstream`, whose
/// round trips are counted: `connect` gets the proxy's address.
///
/// # Errors
///
/// The proxy failing to start (as `Unavailable`), `connect`'s error, or
/// [`held_locks`]'s.
///
/// # Cancel safety
///
/// As [`held_locks`].
pub async fn held_locks_proxied<F, Fut>(
    upstream: std::net::SocketAddr,
    config: &ScaleConfig,
    connect: F,
) -> Result<ScaleReport, LockError>
where
    F: FnOnce(std::net::SocketAddr) -> Fut,
    Fut: std::future::Future<Output = Result<Arc<dyn LockBackend>, LockError>>,
{
    let proxy = crate::proxy::FaultProxy::start(upstream)
        .await
        .map_err(|e| {
            LockError::new(
                lock_core::ErrorKind::Unavailable,
                lock_core::Operation::Connect,
                format!("fault proxy: {e}"),
            )
        })?;
    let backend = connect(proxy.addr()).await?;
    held_locks_through(backend, config, &proxy).await
}

/// [`held_locks`] on a backend connected through `proxy`, which counts
/// the round trips.
///
/// # Errors
///
/// As [`held_locks`].
pub async fn held_locks_through(
    backend: Arc<dyn LockBackend>,
    config: &ScaleConfig,
    proxy: &crate::proxy::FaultProxy,
) -> Result<ScaleReport, LockError> {
    let trips = || proxy.round_trips();
    let reset = || proxy.reset_counters();
    held_locks(backend, config, Some(&trips), Some(&reset)).await
}

/// Checks a report against the targets: every lock held, at most
/// [`MAX_BYTES_PER_LOCK`] per lock, and renewal round trips per period
/// (or `renew_many` calls when no counter was given) within
/// [`round_trip_bound`] for batches of `batch` plus `background`.
///
/// # Errors
///
/// A message naming the target missed.
pub fn check_report(report: &ScaleReport, batch: usize, background: usize) -> Result<(), String> {
    check_round_trips(report, batch, background)?;
    if report.bytes_per_lock > MAX_BYTES_PER_LOCK {
        return Err(format!(
            "{:.0} bytes per held lock (at most {MAX_BYTES_PER_LOCK})",
            report.bytes_per_lock
        ));
    }
    Ok(())
}

/// [`check_report`] without the memory target: every lock held, every
/// release done, and round trips per period within the bound.
///
/// # Errors
///
/// A message naming the target missed.
pub fn check_round_trips(
    report: &ScaleReport,
    batch: usize,
    background: usize,
) -> Result<(), String> {
    if !report.all_held {
        return Err(format!("a guard was lost while holding: {report:?}"));
    }
    if report.release_errors > 0 {
        return Err(format!(
            "{} of {} releases failed (first: {}): locks left behind",
            report.release_errors,
            report.locks,
            report.first_release_error.as_deref().unwrap_or("?")
        ));
    }
    let bound = round_trip_bound(report.locks, batch, background);
    let counted = report
        .round_trips_per_period
        .unwrap_or(report.renew_calls_per_period);
    if counted > bound {
        return Err(format!(
            "{counted:.1} round trips per renewal period for {} locks (bound {bound:.1})",
            report.locks
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> ScaleReport {
        ScaleReport {
            backend: "test".into(),
            locks: 1000,
            bytes_per_lock: 300.0,
            peak_bytes_per_lock: 300.0,
            server_bytes_per_lock: 0.0,
            renew_calls_per_period: 1.0,
            renewals_per_period: 1000.0,
            round_trips_per_period: Some(1.0),
            period_ms: 1000,
            acquire_ms: 10,
            all_held: true,
            release_errors: 0,
            first_release_error: None,
        }
    }

    #[test]
    fn every_target_can_fail() {
        check_report(&report(), RENEW_BATCH_FOR_TESTS, 0).unwrap();
        let lost = ScaleReport {
            all_held: false,
            ..report()
        };
        assert!(check_report(&lost, RENEW_BATCH_FOR_TESTS, 0).is_err());
        let left_behind = ScaleReport {
            release_errors: 3,
            first_release_error: Some("timed out".into()),
            ..report()
        };
        let err = check_report(&left_behind, RENEW_BATCH_FOR_TESTS, 0).unwrap_err();
        assert!(
            err.contains("3 of 1000 releases failed (first: timed out)"),
            "{err}"
        );
        let fat = ScaleReport {
            bytes_per_lock: 1000.0,
            ..report()
        };
        assert!(check_report(&fat, RENEW_BATCH_FOR_TESTS, 0).is_err());
        let chatty = ScaleReport {
            round_trips_per_period: Some(1000.0),
            ..report()
        };
        assert!(check_report(&chatty, RENEW_BATCH_FOR_TESTS, 0).is_err());
    }

    const RENEW_BATCH_FOR_TESTS: usize = 1000;
}
