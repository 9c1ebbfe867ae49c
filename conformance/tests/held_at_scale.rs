//! Held locks at scale on the memory backend: heap bytes per held lock and
//! renewal calls per renewal period, with the checks shown failing on
//! broken variants (a backend that renews one lease per call, one that
//! keeps a kilobyte per lease). `DISTLOCK_SCALE=1000,10000,100000` runs
//! more sizes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use conformance::doubles::KilobytePerLease;
use conformance::scale::{
    CountingAllocator, ScaleConfig, held_locks, print_report, round_trip_bound, scales_from_env,
};
use lock_core::LockBackendExt;
use lock_core::{
    Lease, LockBackend, LockError, LockWrapper, MemoryBackend, RENEW_BATCH, async_trait,
};
use tokio::time::Instant;

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

const MAX_BYTES_PER_LOCK: f64 = 400.0;

/// The heap counter is process-wide: one measurement at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn config(locks: usize) -> ScaleConfig {
    ScaleConfig {
        in_process: true,
        ..ScaleConfig::new(locks)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_holds_many_locks_in_few_bytes_and_few_renewal_calls() {
    let _serial = SERIAL.lock().await;
    for locks in scales_from_env(&[1_000]) {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let report = held_locks(backend, &config(locks), None, None)
            .await
            .unwrap();
        print_report(&report);
        assert!(report.all_held, "{report:?}");
        assert!(
            report.bytes_per_lock <= MAX_BYTES_PER_LOCK,
            "{:.0} bytes per held lock",
            report.bytes_per_lock
        );
        let bound = round_trip_bound(locks, RENEW_BATCH, 0);
        assert!(
            report.renew_calls_per_period <= bound,
            "{} renew calls per period, bound {bound}",
            report.renew_calls_per_period
        );
        // Every lease renewed about once a period (up to 4/3 with early takes;
        // fewer when one debug-build pass over 100k guards takes a while).
        #[allow(clippy::cast_precision_loss)]
        let n = locks as f64;
        assert!(
            report.renewals_per_period >= n * 0.5 && report.renewals_per_period <= n * 1.5,
            "{report:?}"
        );
    }
}

/// Broken: renews every lease in a round trip of its own (what a task per
/// guard cost), counted in `.1`.
#[derive(Debug)]
struct OnePerCall(MemoryBackend, AtomicU64);

#[async_trait]
impl LockWrapper for OnePerCall {
    fn inner(&self) -> &dyn LockBackend {
        &self.0
    }
    fn name(&self) -> &'static str {
        "broken-memory"
    }
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        let mut out = Vec::with_capacity(leases.len());
        for lease in leases {
            self.1.fetch_add(1, Ordering::Relaxed);
            out.push(self.0.renew(lease).await);
        }
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checks_catch_a_round_trip_per_lease_and_a_kilobyte_per_lease() {
    let _serial = SERIAL.lock().await;
    let locks = 1_000;
    let broken = Arc::new(OnePerCall(MemoryBackend::new(), AtomicU64::new(0)));
    let trips = {
        let broken = broken.clone();
        move || broken.1.load(Ordering::Relaxed)
    };
    let reset = {
        let broken = broken.clone();
        move || broken.1.store(0, Ordering::Relaxed)
    };
    let report = held_locks(broken, &config(locks), Some(&trips), Some(&reset))
        .await
        .unwrap();
    print_report(&report);
    let bound = round_trip_bound(locks, RENEW_BATCH, 0);
    let counted = report.round_trips_per_period.unwrap();
    assert!(
        counted > bound,
        "the round-trip check missed a round trip per lease: {counted} <= {bound}"
    );

    let broken: Arc<dyn LockBackend> =
        Arc::new(KilobytePerLease::new(Arc::new(MemoryBackend::new())));
    let report = held_locks(broken, &config(locks), None, None)
        .await
        .unwrap();
    print_report(&report);
    assert!(
        report.bytes_per_lock > MAX_BYTES_PER_LOCK,
        "the memory check missed a kilobyte per lease: {:.0}",
        report.bytes_per_lock
    );
}
