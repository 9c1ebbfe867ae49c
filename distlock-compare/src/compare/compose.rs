//! The composed shapes of a comparison: one client's multi-lock of three
//! keys and one election term (campaign + resign), each interleaved with a
//! plain lock cycle of the same client; and, for a driver with a fair mode,
//! 4 clients handing one key over, unfair and fair, interleaved.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::Target;
use conformance::bench::{self, Contender, Ours};
use conformance::cpu::median;
use lock_core::{LockBackend, LockClient, LockError};

use super::bench_setup::{Bench, Start};
use super::{BenchFigures, Column};

/// Keys in the multi-lock cycle.
const MULTI_KEYS: usize = 3;
/// Clients in the fair/unfair handoff comparison.
const HANDOFF_CLIENTS: usize = 4;

/// `lock_all([key/0, key/1, key/2])`, waiting, then release.
struct MultiCycle {
    client: LockClient,
    ttl: Duration,
}

#[async_trait]
impl Contender for MultiCycle {
    async fn cycle(&self, key: &str) -> Result<(), LockError> {
        let keys: Vec<String> = (0..MULTI_KEYS).map(|i| format!("{key}/{i}")).collect();
        let guard = self
            .client
            .lock_all(keys.iter())
            .ttl(self.ttl)
            .wait(bench::CONTENDED_LIMIT)
            .acquire()
            .await?;
        guard.release().await?;
        Ok(())
    }
}

/// One term: campaign (waiting), then resign.
struct ElectCycle {
    client: LockClient,
    ttl: Duration,
}

#[async_trait]
impl Contender for ElectCycle {
    async fn cycle(&self, name: &str) -> Result<(), LockError> {
        let term = self
            .client
            .elect(name)
            .ttl(self.ttl)
            .wait(bench::CONTENDED_LIMIT)
            .campaign()
            .await?;
        term.resign().await?;
        Ok(())
    }
}

/// The composed-shapes figures into `out` (see the module docs).
pub(super) async fn measure(out: &mut BenchFigures, bench: Bench<'_>) -> Result<(), LockError> {
    let Bench {
        target, url, full, ..
    } = bench;
    let Start {
        probe: backend,
        ttl,
        run,
    } = Start::of(target).await?;
    let client = LockClient::from_arc(backend);
    let plain = Ours::new(client.clone(), ttl);
    let multi = MultiCycle {
        client: client.clone(),
        ttl,
    };
    let elect = ElectCycle { client, ttl };
    let n = if full { 1000 } else { 150 };
    let keys = (format!("bench-{run}/plain"), format!("bench-{run}/multi"));
    for _ in 0..10 {
        plain.cycle(&keys.0).await?;
        multi.cycle(&keys.1).await?;
    }
    let (p, m) = bench::interleaved_latency(&plain, &multi, (&keys.0, &keys.1), n, 10).await?;
    out.multi_p50_us = Some(m.p50_us);
    out.multi_plain_p50_us = Some(p.p50_us);
    out.multi_ratio = Some(bench::ratio(m.p50_us, p.p50_us));
    let name = format!("bench-{run}/term");
    for _ in 0..10 {
        elect.cycle(&name).await?;
    }
    let (p, e) = bench::interleaved_latency(&plain, &elect, (&keys.0, &name), n, 10).await?;
    out.elect_p50_us = Some(e.p50_us);
    out.elect_ratio = Some(bench::ratio(e.p50_us, p.p50_us));
    if let Some(option) =
        lock_bench::for_driver(distlock::backend::driver_for(url)?.name).fair_option
    {
        fair_handoffs(out, target, &with_option(url, option), ttl, &run, full).await?;
    }
    Ok(())
}

/// `url` with `option` (`name=value`) added to its query.
fn with_option(url: &str, option: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{option}")
}

async fn fair_handoffs(
    out: &mut BenchFigures,
    target: &dyn Target,
    fair_url: &str,
    ttl: Duration,
    run: &str,
    full: bool,
) -> Result<(), LockError> {
    let mut unfair = Vec::with_capacity(HANDOFF_CLIENTS);
    let mut fair = Vec::with_capacity(HANDOFF_CLIENTS);
    for _ in 0..HANDOFF_CLIENTS {
        let backend: Arc<dyn LockBackend> = target.client().await?;
        unfair.push(Arc::new(Ours::new(LockClient::from_arc(backend), ttl)) as Arc<dyn Contender>);
        let backend = match distlock::backend::open(fair_url).await {
            Ok(backend) => backend,
            // This configuration has no fair mode (another library's
            // layout): no fair column, not an error.
            Err(e) if e.kind() == lock_core::ErrorKind::Unsupported => return Ok(()),
            Err(e) => return Err(e),
        };
        fair.push(Arc::new(Ours::new(LockClient::from_arc(backend), ttl)) as Arc<dyn Contender>);
    }
    let window = if full {
        Duration::from_secs(3)
    } else {
        Duration::from_secs(1)
    };
    let (mut u, mut f, mut us, mut fs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..4 {
        let key = format!("bench-{run}/handoff-{round}");
        let first_fair = round % 2 == 1;
        for fair_now in [first_fair, !first_fair] {
            let set = if fair_now { &fair } else { &unfair };
            let got = bench::handoffs(set, &key, window).await?;
            if fair_now {
                f.push(got.per_sec);
                fs.push(got.spread());
            } else {
                u.push(got.per_sec);
                us.push(got.spread());
            }
        }
    }
    out.unfair_handoffs_per_s = Some(median(u));
    out.fair_handoffs_per_s = Some(median(f));
    out.unfair_handoff_spread = Some(median(us));
    out.fair_handoff_spread = Some(median(fs));
    Ok(())
}

/// The composed-shapes table: one row per backend measured.
pub(crate) fn print_compose_table(results: &[super::BackendResult]) {
    super::print_small_table(
        results,
        |b| b.multi_p50_us.is_some() || b.compose_error.is_some(),
        &[
            Column("lock p50", 10, |b| b.multi_plain_p50_us, 1),
            Column("3-key p50", 10, |b| b.multi_p50_us, 1),
            Column("x lock", 7, |b| b.multi_ratio, 2),
            Column("term p50", 10, |b| b.elect_p50_us, 1),
            Column("x lock", 7, |b| b.elect_ratio, 2),
            Column("unfair/s", 10, |b| b.unfair_handoffs_per_s, 0),
            Column("spread", 7, |b| b.unfair_handoff_spread, 2),
            Column("fair/s", 10, |b| b.fair_handoffs_per_s, 0),
            Column("spread", 7, |b| b.fair_handoff_spread, 2),
        ],
        |b| b.compose_error.as_ref(),
        "composed-shapes",
        &format!(
            "(one client, µs, interleaved with a plain lock cycle: lock_all of {MULTI_KEYS} keys, \
             and one election term = campaign + resign; handoffs: {HANDOFF_CLIENTS} independent \
             clients on one key, grants/s and busiest/least busy client, without and with the \
             driver's fair mode, interleaved, medians of 2 rounds each)"
        ),
    );
}
