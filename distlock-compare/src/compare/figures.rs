//! The benchmark part of a comparison: latency and throughput against the
//! raw floor, handoffs, round trips per cycle, held locks at scale.

use std::sync::Arc;
use std::time::Duration;

use conformance::Target;
use conformance::bench::{self, Contender, FloorCycle, Ours};
use conformance::scale::{self, ScaleConfig, ScaleReport};
use lock_core::{LockBackend, LockClient, LockError, OwnerId};
use tokio::time::Instant;

use super::bench_setup::{Bench, Start};
use super::phases::Phases;

use super::*;

/// The benchmarks of `target` into `out`; the held-at-scale figures too
/// unless `out` has them (the quick run measures those beside the verdicts:
/// bytes in a child process and round trips counted by a proxy do not
/// depend on what else runs).
pub(super) async fn benchmarks(
    target: &dyn Target,
    url: &str,
    opts: &CompareOptions,
    phases: &mut Phases,
    mut out: BenchFigures,
) -> BenchFigures {
    let bench = Bench {
        target,
        url,
        full: opts.full,
        quick: opts.quick,
    };
    if let Err(e) = bench_into(&mut out, bench, phases).await {
        out.error = Some(e.to_string());
    }
    out
}

async fn bench_into(
    out: &mut BenchFigures,
    bench: Bench<'_>,
    phases: &mut Phases,
) -> Result<(), LockError> {
    let Bench {
        target,
        url,
        full,
        quick,
    } = bench;
    let mut phase = Instant::now();
    let Start { probe, ttl, run } = Start::of(target).await?;
    let caps = probe.capabilities();
    let ours_client = |backend: Arc<dyn LockBackend>| -> Arc<dyn Contender> {
        Arc::new(Ours::new(LockClient::from_arc(backend), ttl))
    };
    // Independent clients for the latency and handoff figures, as separate
    // processes would have: each its own connection, ours and the floor's
    // alike.
    let mut ours = Vec::with_capacity(HANDOFF_CLIENTS);
    for _ in 0..HANDOFF_CLIENTS {
        ours.push(ours_client(target.client().await?));
    }
    let floors = crate::floors::contenders(url, ttl, HANDOFF_CLIENTS).await;
    let (cycle_key, floor_key) = (format!("bench-{run}/cycle"), format!("floor-{run}/cycle"));
    // Warm up connections, scripts and statement caches.
    for _ in 0..20 {
        ours[0].cycle(&cycle_key).await?;
        if let Some(floors) = &floors {
            floors[0].cycle(&floor_key).await?;
        }
    }
    phases.record("bench setup", phase.elapsed());
    phase = Instant::now();
    let n = if full { 2000 } else { 300 };
    let cycle = match &floors {
        Some(floors) => {
            let (cycle, floor) =
                bench::interleaved_latency(&*ours[0], &*floors[0], (&cycle_key, &floor_key), n, 10)
                    .await?;
            out.floor_cycle_p50_us = Some(floor.p50_us);
            out.cycle_ratio = Some(bench::ratio(cycle.p50_us, floor.p50_us));
            phases.record("bench latency", phase.elapsed());
            phase = Instant::now();
            // On a machine with few CPUs, which CPU the OS gives each side
            // of a hand-off (the caller, an embedded database's connection
            // thread, a server process) sets a whole run's latency level,
            // ours and the floor's apart: the pair again with this process
            // and the servers it started on one CPU (conformance::cpu::OneCpu),
            // reported beside the above.
            // Longer and in shorter rounds than the unpinned pair: on one
            // CPU a server's background work (a vacuum, a JIT compiler, a
            // timer) lands inside whichever side's round is running, and
            // 300 cycles in 10 rounds moved PostgreSQL's ratio between 1.06
            // and 1.20 from one run to the next.
            // Only this backend's servers share the CPU with us: the
            // other backends' servers go to the other CPU meanwhile.
            // The quick run's pair is a quarter as long: a first look, its
            // ratio noisier (said under the table).
            let (cycles, rounds) = if quick {
                (ONE_CPU_CYCLES / 4, ONE_CPU_ROUNDS / 4)
            } else {
                (ONE_CPU_CYCLES, ONE_CPU_ROUNDS)
            };
            if let Some(pinned) = conformance::cpu::OneCpu::pin_serving(&loopback_ports(url)) {
                let pair = bench::interleaved_latency(
                    &*ours[0],
                    &*floors[0],
                    (&cycle_key, &floor_key),
                    cycles,
                    rounds,
                )
                .await;
                drop(pinned);
                let (ours, floor) = pair?;
                out.one_cpu_cycle_p50_us = Some(ours.p50_us);
                out.one_cpu_floor_cycle_p50_us = Some(floor.p50_us);
                out.one_cpu_cycle_ratio = Some(bench::ratio(ours.p50_us, floor.p50_us));
            }
            phases.record("bench one-cpu", phase.elapsed());
            cycle
        }
        None => {
            let cycle = bench::concurrent_cycles(&ours[..1], &cycle_key, n).await?;
            phases.record("bench latency", phase.elapsed());
            cycle
        }
    };
    phase = Instant::now();
    out.cycle_p50_us = Some(cycle.p50_us);
    out.cycle_p99_us = Some(cycle.p99_us);
    out.cycles_per_s = Some(cycle.per_sec);
    out.cycle_histogram = Some(cycle.histogram);
    let window = match (full, quick) {
        (true, _) => Duration::from_secs(5),
        (false, false) => Duration::from_millis(1500),
        (false, true) => Duration::from_millis(750),
    };
    let handoff = bench::handoffs(
        &ours[..HANDOFF_CLIENTS],
        &format!("bench-{run}/handoff"),
        window,
    )
    .await?;
    out.handoffs_per_s = Some(handoff.per_sec);
    out.handoff_spread = Some(handoff.spread());
    if let Some(floors) = &floors {
        let floor = bench::handoffs(
            &floors[..HANDOFF_CLIENTS],
            &format!("floor-{run}/handoff"),
            window,
        )
        .await?;
        out.floor_handoffs_per_s = Some(floor.per_sec);
        out.floor_handoff_spread = Some(floor.spread());
        out.handoff_ratio = Some(bench::ratio(handoff.per_sec, floor.per_sec));
    }
    drop((ours, floors));
    phases.record("bench handoff", phase.elapsed());
    // The two shapes services run, on clients of their own (see
    // [`super::shapes`]), with the clients above closed.
    let plan = super::shapes::ShapePlan::of(full, quick);
    phases
        .time(
            "bench throughput",
            super::shapes::measure(out, url, &run, plan),
        )
        .await?;
    phases
        .time("bench round-trips", round_trips_into(out, url, ttl, &run))
        .await?;
    drop(probe);
    if out.held_locks.is_none() && out.held_error.is_none() {
        phases
            .time(
                "bench held-at-scale",
                held_at_scale(out, url, full, caps.max_held),
            )
            .await;
    }
    if quick {
        // The other shapes' figures are the full run's (named in the
        // report's list of what the quick run left out).
        return Ok(());
    }
    if let Err(e) = phases
        .time("bench shared", super::shared::measure(out, bench))
        .await
    {
        out.shared_error = Some(e.to_string());
    }
    if let Err(e) = phases
        .time("bench compose", super::compose::measure(out, bench))
        .await
    {
        out.compose_error = Some(e.to_string());
    }
    Ok(())
}

/// The ports of the hosts `url` names (`scheme://[user@]h:p[,h:p...]/...`);
/// none for a URL without an authority (SQLite, memory).
pub(super) fn loopback_ports(url: &str) -> Vec<u16> {
    let Some((_, rest)) = url.split_once("://") else {
        return Vec::new();
    };
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    hosts
        .split(',')
        .filter_map(|host| host.rsplit_once(':')?.1.parse().ok())
        .collect()
}

/// Cycles a side of the 1-client pair on one CPU, and its rounds.
const ONE_CPU_CYCLES: usize = 2000;
const ONE_CPU_ROUNDS: usize = 40;

/// Independent clients contending on one key in the handoff benchmark.
pub(super) const HANDOFF_CLIENTS: usize = 4;

/// Round trips per uncontended cycle, ours and the floor's, each counted
/// by a fault proxy of its own in front of the server (loopback servers
/// named by a single-server URL only).
pub(super) async fn round_trips_into(
    out: &mut BenchFigures,
    url: &str,
    ttl: Duration,
    run: &str,
) -> Result<(), LockError> {
    const CYCLES: usize = 50;
    if let Some((proxied, proxy)) = crate::floors::proxied(url).await {
        let ours = Ours::new(
            LockClient::from_arc(distlock::backend::open(&proxied).await?),
            ttl,
        );
        let key = format!("bench-{run}/round-trips");
        out.round_trips_per_cycle =
            Some(bench::round_trips_per_cycle(&ours, &proxy, &key, 5, CYCLES).await?);
    }
    if let Some((proxied, proxy)) = crate::floors::proxied(url).await
        && let Some(floor) = crate::floors::connect(&proxied).await?
    {
        let floor = FloorCycle::new(floor, ttl);
        out.floor_round_trips_declared = Some(floor.declared_round_trips());
        let key = format!("floor-{run}/round-trips");
        out.floor_round_trips_per_cycle =
            Some(bench::round_trips_per_cycle(&floor, &proxy, &key, 5, CYCLES).await?);
    }
    Ok(())
}

/// Locks held at scale by one client: heap bytes per held lock (the
/// server's own state excluded for the in-process backend) and renewal
/// round trips per renewal period, counted by a fault proxy where the URL
/// names one loopback server (else `renew_many` calls per period).
///
/// Measured in a child process of its own (`distlock-compare held-at-scale`, see
/// [`held_at_scale_child`]): this process's heap also holds what earlier
/// phases left (the suite's clients, whose background tasks end on their
/// next tick, seconds later), and those frees during the window made the
/// heap shrink while 1,000 etcd locks were held.
pub(super) async fn held_at_scale(
    out: &mut BenchFigures,
    url: &str,
    full: bool,
    max_held: Option<u32>,
) {
    let locks = if full { 10_000 } else { 1000 };
    if let Some(limit) = max_held.filter(|&l| usize::try_from(l).is_ok_and(|l| l < locks)) {
        out.held_error = Some(format!(
            "a connection per held lock: at most {limit} held at once (capabilities' \
             max_held), fewer than the {locks} measured"
        ));
        return;
    }
    let prefix = format!("bench-{}/held-", &OwnerId::random().to_hex()[..8]);
    let measured = measure_in_child(url, locks, &prefix).await;
    match measured {
        Ok(report) => {
            out.held_locks = Some(report.locks);
            if report.bytes_per_lock > 0.0 {
                out.bytes_per_held_lock = Some(report.bytes_per_lock);
            } else {
                // Memory the backend let go of after the baseline (a
                // connection's buffers shrinking) outweighed the locks.
                out.held_error = Some(format!(
                    "bytes per held lock not measured: the heap shrank by {:.0} B per lock \
                     while holding (state freed after the baseline)",
                    -report.bytes_per_lock
                ));
            }
            out.renewal_round_trips_per_period = report
                .round_trips_per_period
                .or(Some(report.renew_calls_per_period));
            out.renewal_round_trips_counted = Some(report.round_trips_per_period.is_some());
        }
        // Said, not fatal.
        Err(e) => out.held_error = Some(e.to_string()),
    }
}

/// The longest the held-at-scale child may take (10,000 locks acquired,
/// three renewal periods, released).
const HELD_CHILD_LIMIT: Duration = Duration::from_secs(300);

/// Runs `distlock-compare held-at-scale` (this executable) on `url` and reads its
/// report.
async fn measure_in_child(url: &str, locks: usize, prefix: &str) -> Result<ScaleReport, LockError> {
    let exe = std::env::current_exe()
        .map_err(|e| LockError::config("cannot find this executable").with_source(e))?;
    let child = tokio::process::Command::new(exe)
        .args([
            "held-at-scale",
            "--locks",
            &locks.to_string(),
            "--key-prefix",
            prefix,
            url,
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| LockError::config("cannot start the held-at-scale child").with_source(e))?;
    let output = tokio::time::timeout(HELD_CHILD_LIMIT, child.wait_with_output())
        .await
        .map_err(|_| {
            LockError::new(
                lock_core::ErrorKind::Timeout,
                lock_core::Operation::Acquire,
                format!("the held-at-scale child took over {HELD_CHILD_LIMIT:?} (killed)"),
            )
        })?
        .map_err(|e| LockError::config("the held-at-scale child failed").with_source(e))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().last().unwrap_or("no message");
        return Err(LockError::new(
            lock_core::ErrorKind::Backend,
            lock_core::Operation::Acquire,
            format!("held locks at scale: {last}"),
        ));
    }
    serde_json::from_slice(&output.stdout).map_err(|e| {
        LockError::config("the held-at-scale child's report is not JSON").with_source(e)
    })
}

/// The child's side (`distlock-compare held-at-scale`): holds `locks` locks on
/// `url` with one client in this fresh process and prints the report as
/// JSON.
///
/// # Errors
///
/// Connecting, acquiring or renewing failed.
pub(crate) async fn held_at_scale_child(
    url: &str,
    locks: usize,
    key_prefix: &str,
) -> Result<u8, LockError> {
    let mut config = ScaleConfig::new(locks);
    key_prefix.clone_into(&mut config.key_prefix);
    config.in_process = url.starts_with("memory:");
    let report = match crate::floors::proxied(url).await {
        Some((proxied, proxy)) => {
            scale::held_locks_through(distlock::backend::open(&proxied).await?, &config, &proxy)
                .await?
        }
        None => scale::held_locks(distlock::backend::open(url).await?, &config, None, None).await?,
    };
    println!("{}", serde_json::to_string(&report).unwrap_or_default());
    Ok(0)
}
