//! The shared-lock part of a comparison: 8 readers on one key against 8
//! clients on the mutex of one key (what sharing buys), and one client's
//! permit acquire+release against the driver's hand-written permit floor.

use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{self, Contender, FloorCycle, Ours};
use lock_core::{LeaseKind, LockBackend, LockClient, LockError};

use conformance::cpu::median;

use super::bench_setup::{Bench, CLIENTS, Start};
use super::{BenchFigures, Column};

/// The permit floors' semaphore size (see `lock_bench::Floors::permit_floor`).
const PERMIT_LIMIT: u32 = 4;

/// The shared-lock figures into `out` (see the module docs).
pub(super) async fn measure(out: &mut BenchFigures, bench: Bench<'_>) -> Result<(), LockError> {
    let Bench {
        target, url, full, ..
    } = bench;
    let Start { probe, ttl, run } = Start::of(target).await?;
    let caps = probe.capabilities();
    let contender = |backend: Arc<dyn LockBackend>, kind| -> Arc<dyn Contender> {
        Arc::new(Ours::with_kind(LockClient::from_arc(backend), ttl, kind))
    };
    let window = if full {
        Duration::from_secs(4)
    } else {
        Duration::from_millis(1500)
    };
    if caps.shared_locks {
        let mut readers = Vec::with_capacity(CLIENTS);
        let mut mutexes = Vec::with_capacity(CLIENTS);
        for _ in 0..CLIENTS {
            let backend = target.client().await?;
            readers.push(contender(backend.clone(), LeaseKind::Read));
            mutexes.push(contender(backend, LeaseKind::Exclusive));
        }
        // Interleaved: readers, mutex, readers, mutex; the medians.
        let (mut r, mut m) = (Vec::new(), Vec::new());
        for round in 0..4 {
            let key = format!("bench-{run}/shared-{round}");
            if round % 2 == 0 {
                r.push(bench::handoffs(&readers, &key, window / 2).await?.per_sec);
                m.push(bench::handoffs(&mutexes, &key, window / 2).await?.per_sec);
            } else {
                m.push(bench::handoffs(&mutexes, &key, window / 2).await?.per_sec);
                r.push(bench::handoffs(&readers, &key, window / 2).await?.per_sec);
            }
        }
        let (r, m) = (median(r), median(m));
        out.readers_8_per_s = Some(r);
        out.mutex_8_per_s = Some(m);
        out.readers_ratio = Some(bench::ratio(r, m));
    }
    if caps.semaphores {
        let kind = LeaseKind::Permits {
            count: 1,
            limit: PERMIT_LIMIT,
        };
        let ours = contender(target.client().await?, kind);
        let key = format!("bench-{run}/permit");
        let floor =
            match lock_bench::for_driver(distlock::backend::driver_for(url)?.name).permit_floor {
                Some(connect) => connect(url).await?,
                None => None,
            };
        let n = if full { 1000 } else { 200 };
        for _ in 0..10 {
            ours.cycle(&key).await?;
        }
        match floor {
            Some(floor) => {
                let floor = FloorCycle::new(floor, ttl);
                let floor_key = format!("floor-{run}/permit");
                for _ in 0..10 {
                    floor.cycle(&floor_key).await?;
                }
                let (ours, floor) =
                    bench::interleaved_latency(&*ours, &floor, (&key, &floor_key), n, 10).await?;
                out.permit_p50_us = Some(ours.p50_us);
                out.floor_permit_p50_us = Some(floor.p50_us);
                out.permit_ratio = Some(bench::ratio(ours.p50_us, floor.p50_us));
            }
            None => {
                let stats = bench::concurrent_cycles(&[ours], &key, n).await?;
                out.permit_p50_us = Some(stats.p50_us);
            }
        }
    }
    Ok(())
}

/// The shared-lock table, one row per backend that has read-write locks or
/// semaphores.
pub(crate) fn print_shared_table(results: &[super::BackendResult]) {
    super::print_small_table(
        results,
        |b| b.readers_8_per_s.is_some() || b.permit_p50_us.is_some() || b.shared_error.is_some(),
        &[
            Column("8 readers/s", 11, |b| b.readers_8_per_s, 0),
            Column("8 mutex/s", 11, |b| b.mutex_8_per_s, 0),
            Column("x mutex", 8, |b| b.readers_ratio, 2),
            Column("permit p50", 11, |b| b.permit_p50_us, 1),
            Column("floor p50", 11, |b| b.floor_permit_p50_us, 1),
            Column("x floor", 8, |b| b.permit_ratio, 2),
        ],
        |b| b.shared_error.as_ref(),
        "shared-lock",
        &format!(
            "(8 independent clients on one key: read lock vs mutex acquire+release, interleaved, \
             medians of 2 rounds each; permit: one of {PERMIT_LIMIT}, one client, µs, against the \
             driver's hand-written permit floor where it has one)"
        ),
    );
}
