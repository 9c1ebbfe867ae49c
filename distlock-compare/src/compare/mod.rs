//! `distlock-compare compare`: the conformance suite, the fault scenarios and the
//! benchmarks, per backend, side by side; a terminal table, JSON and HTML.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use conformance::bench::{self};
use conformance::deploy::{self, DeployedTarget, Opener};
use conformance::scenarios::{self, HolderCommand, ScenarioReport, Verdict};
use conformance::{HarnessError, MemoryTarget, SuiteReport, Target};
use lock_core::{Capabilities, LockBackend, LockError};
use serde::Serialize;
use serde_json::{Value, json};

mod bench_setup;
mod compose;
mod figures;
mod phases;
pub(crate) mod probe;
mod shapes;
mod shared;
mod soak_run;
mod verdicts;

pub(crate) use figures::held_at_scale_child;
use figures::*;
use phases::Phases;
pub(crate) use soak_run::*;

/// A backend reached by URL: every client is a fresh `distlock::backend::open`.
/// It cannot inject faults, so fault cases are skipped for it.
pub(crate) struct UrlTarget {
    pub(crate) name: String,
    pub(crate) url: String,
}

impl UrlTarget {
    /// The target of a server the user runs at `url`, named by its scheme.
    pub(crate) fn of(url: &str) -> Self {
        Self {
            name: url.split(':').next().unwrap_or("url").to_owned(),
            url: url.to_owned(),
        }
    }
}

#[async_trait]
impl Target for UrlTarget {
    fn name(&self) -> String {
        self.name.clone()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        distlock::backend::open(&self.url).await
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }
}

/// What to compare and how.
#[derive(Debug)]
pub(crate) struct CompareOptions {
    pub(crate) backends: Option<Vec<String>>,
    pub(crate) urls: Vec<String>,
    pub(crate) spawn: bool,
    /// The quick run: the mutex only, fewer rounds (see [`verdicts`]).
    pub(crate) quick: bool,
    pub(crate) full: bool,
    pub(crate) scenarios: bool,
    pub(crate) json: Option<PathBuf>,
    pub(crate) html: Option<PathBuf>,
}

/// Benchmark figures of one backend (ratios to the raw floor where the
/// driver has one).
#[derive(Debug, Default, Serialize)]
pub(crate) struct BenchFigures {
    pub(crate) cycle_p50_us: Option<f64>,
    pub(crate) cycle_p99_us: Option<f64>,
    pub(crate) cycles_per_s: Option<f64>,
    /// Acquire+release latency distribution: bucket `i` counts cycles that
    /// took `[2^i, 2^(i+1))` µs.
    pub(crate) cycle_histogram: Option<[u32; bench::HISTOGRAM_BUCKETS]>,
    pub(crate) floor_cycle_p50_us: Option<f64>,
    pub(crate) cycle_ratio: Option<f64>,
    /// The 1-client pair measured again with this process and the servers
    /// it started pinned to one CPU (`conformance::cpu::OneCpu`): ours, the
    /// floor, the ratio.
    pub(crate) one_cpu_cycle_p50_us: Option<f64>,
    pub(crate) one_cpu_floor_cycle_p50_us: Option<f64>,
    pub(crate) one_cpu_cycle_ratio: Option<f64>,
    /// 8 clients in this process (`distlock::connect` each), one task
    /// each on a key of its own, cycles/s: the median round
    /// ([`shapes`]).
    pub(crate) throughput_8x8: Option<f64>,
    /// 8 floor connections in this process, one task each, cycles/s: the
    /// median round.
    pub(crate) floor_throughput_8x8: Option<f64>,
    /// The median over the rounds of the 8 clients' rate over the floor's
    /// in the same round.
    pub(crate) throughput_ratio: Option<f64>,
    /// One client shared by 8 tasks (each on a key of its own), cycles/s:
    /// the median round, interleaved with the 8 clients and the floor.
    pub(crate) throughput_shared_client: Option<f64>,
    /// The floor's median round (the same floor rounds as
    /// `floor_throughput_8x8`).
    pub(crate) floor_throughput_shared_client: Option<f64>,
    /// The median over the rounds of the shared client's rate over the
    /// floor's in the same round.
    pub(crate) throughput_shared_client_ratio: Option<f64>,
    /// The client shapes' rounds and window per side.
    pub(crate) client_shape_plan: Option<shapes::ShapePlan>,
    /// Every round of the client shapes: each side's rate.
    pub(crate) client_shape_rounds: Vec<shapes::ShapeRound>,
    /// SQL session mode: 8 connections taking the raw server lock by hand
    /// (`pg_try_advisory_lock` / `GET_LOCK` + unlock, no token) in the
    /// client shapes' rounds, cycles/s: the median round.
    pub(crate) raw_throughput_8x8: Option<f64>,
    /// The median over the rounds of the 8 clients' rate over the raw
    /// server lock's in the same round.
    pub(crate) throughput_raw_ratio: Option<f64>,
    /// The median over the rounds of the shared client's rate over the raw
    /// server lock's in the same round.
    pub(crate) throughput_shared_client_raw_ratio: Option<f64>,
    /// The median over the rounds of the floor's rate (the driver's grant
    /// by hand, which takes the fencing token and publishes the holder in
    /// the same statement) over the raw server lock's: below 1 by what the
    /// token and the published holder cost.
    pub(crate) token_cost_ratio: Option<f64>,
    /// The client library measured alone in the client shapes' rounds
    /// (`zookeeper-client`, `etcd-client`, `redis`), where the driver
    /// speaks through one.
    pub(crate) crate_alone_library: Option<String>,
    /// 8 clients of that library alone, each sending the driver's requests
    /// of a cycle, cycles/s: the median round.
    pub(crate) crate_alone_throughput_8x8: Option<f64>,
    /// The median over the rounds of the library alone's rate over the
    /// floor's: the library's share of a gap to the floor.
    pub(crate) crate_alone_floor_ratio: Option<f64>,
    /// The median over the rounds of the 8 clients' rate over the library
    /// alone's: the driver's own share.
    pub(crate) throughput_crate_alone_ratio: Option<f64>,
    /// 1 client of that library alone shared by 8 tasks, each sending the
    /// driver's requests of a cycle, cycles/s: the median round.
    pub(crate) crate_alone_throughput_shared_client: Option<f64>,
    /// The median over the rounds of the shared library client's rate over
    /// the floor's: the library's share of the shared shape's gap.
    pub(crate) crate_alone_shared_client_floor_ratio: Option<f64>,
    /// The median over the rounds of the shared client's rate over the
    /// shared library client's: the driver's own share in that shape.
    pub(crate) throughput_shared_client_crate_alone_ratio: Option<f64>,
    pub(crate) handoffs_per_s: Option<f64>,
    /// The busiest handoff client's grants over the least busy one's.
    pub(crate) handoff_spread: Option<f64>,
    pub(crate) floor_handoffs_per_s: Option<f64>,
    pub(crate) floor_handoff_spread: Option<f64>,
    pub(crate) handoff_ratio: Option<f64>,
    /// Round trips per uncontended cycle, counted by a fault proxy.
    pub(crate) round_trips_per_cycle: Option<f64>,
    pub(crate) floor_round_trips_per_cycle: Option<f64>,
    /// What the floor's exchange is written to cost.
    pub(crate) floor_round_trips_declared: Option<u32>,
    /// Locks held by one client in the scale measurement.
    pub(crate) held_locks: Option<usize>,
    /// Client-side heap bytes per held lock.
    pub(crate) bytes_per_held_lock: Option<f64>,
    /// Round trips per renewal period with `held_locks` held (proxy count),
    /// or `renew_many` calls per period where no proxy could be put in
    /// front (`renewal_round_trips_counted` false).
    pub(crate) renewal_round_trips_per_period: Option<f64>,
    pub(crate) renewal_round_trips_counted: Option<bool>,
    /// Why the scale measurement failed, if it did.
    pub(crate) held_error: Option<String>,
    /// Grants per second of 8 independent readers on one key (read lock
    /// acquire+release each), where the backend has read-write locks.
    pub(crate) readers_8_per_s: Option<f64>,
    /// Grants per second of 8 independent clients taking the mutex of one
    /// key, measured interleaved with the readers.
    pub(crate) mutex_8_per_s: Option<f64>,
    /// `readers_8_per_s / mutex_8_per_s`: what sharing buys.
    pub(crate) readers_ratio: Option<f64>,
    /// One client's permit acquire+release (one of 4), p50.
    pub(crate) permit_p50_us: Option<f64>,
    /// The hand-written permit floor's p50, interleaved with ours.
    pub(crate) floor_permit_p50_us: Option<f64>,
    /// `permit_p50_us / floor_permit_p50_us`.
    pub(crate) permit_ratio: Option<f64>,
    /// Why the shared-lock figures failed, if they did.
    pub(crate) shared_error: Option<String>,
    /// One client's `lock_all` of 3 keys (acquire+release), p50.
    pub(crate) multi_p50_us: Option<f64>,
    /// The same client's plain lock cycle, interleaved with the multi-lock.
    pub(crate) multi_plain_p50_us: Option<f64>,
    /// `multi_p50_us / multi_plain_p50_us`.
    pub(crate) multi_ratio: Option<f64>,
    /// One election term (campaign + resign) of one client, p50.
    pub(crate) elect_p50_us: Option<f64>,
    /// The term over a plain lock cycle measured interleaved with it.
    pub(crate) elect_ratio: Option<f64>,
    /// 4 clients handing one key over, default (unfair) mode, grants/s.
    pub(crate) unfair_handoffs_per_s: Option<f64>,
    /// The same in the driver's fair mode, interleaved with the unfair runs.
    pub(crate) fair_handoffs_per_s: Option<f64>,
    /// Busiest over least busy client, unfair.
    pub(crate) unfair_handoff_spread: Option<f64>,
    /// Busiest over least busy client, fair.
    pub(crate) fair_handoff_spread: Option<f64>,
    /// Why the composed-shapes figures failed, if they did.
    pub(crate) compose_error: Option<String>,
    /// The settings the servers ran with during the timed benchmarks
    /// (`conformance::servers::Durability::settings_of`), for servers this
    /// run started.
    pub(crate) servers: Option<String>,
    pub(crate) error: Option<String>,
}

/// One backend's results.
#[derive(Debug, Serialize)]
pub(crate) struct BackendResult {
    pub(crate) name: String,
    pub(crate) url: String,
    pub(crate) capabilities: Value,
    pub(crate) conformance: Option<SuiteReport>,
    pub(crate) scenarios: BTreeMap<String, ScenarioReport>,
    pub(crate) bench: BenchFigures,
    /// The library's metrics recorded while the suite and the scenarios ran
    /// on this backend (counters and histogram counts and sums, as
    /// Prometheus series: what an operator's scrape would have seen; the
    /// benchmarks run with the metrics off).
    pub(crate) metrics: BTreeMap<String, f64>,
    /// Why the backend could not be compared at all (not installed, ...).
    pub(crate) error: Option<String>,
    /// How long each phase took (server start, each suite case, each
    /// scenario, each benchmark part), in the order they ran.
    pub(crate) phases: Phases,
    /// The checks a quick run did not make on this backend (`case NAME`,
    /// `scenario NAME[KIND]`, `figures WHAT`); empty in the full run.
    pub(crate) left_to_full_run: Vec<String>,
}

impl BackendResult {
    fn unavailable(name: &str, why: String, phases: Phases) -> Self {
        Self {
            name: name.to_owned(),
            url: String::new(),
            capabilities: Value::Null,
            conformance: None,
            scenarios: BTreeMap::new(),
            bench: BenchFigures::default(),
            metrics: BTreeMap::new(),
            error: Some(why),
            phases,
            left_to_full_run: Vec::new(),
        }
    }

    /// A failed conformance case, or a scenario violation (including a
    /// negative control that was not flagged).
    pub(crate) fn failed(&self) -> bool {
        self.conformance.as_ref().is_some_and(|s| !s.passed())
            || self.scenarios.values().any(ScenarioReport::fails_run)
    }

    pub(crate) fn verdict(&self) -> String {
        match &self.conformance {
            Some(s) => s.verdict(),
            None => "not run".to_owned(),
        }
    }
}

fn opener() -> Opener {
    Arc::new(|url: String| Box::pin(async move { distlock::backend::open(&url).await }))
}

fn holder_command() -> Option<HolderCommand> {
    holder_command_kind(lock_core::LeaseKind::Exclusive)
}

fn holder_command_kind(kind: lock_core::LeaseKind) -> Option<HolderCommand> {
    crate::holder::command(kind)
}

/// The name a scenario run with `kind` in the mutex's place is reported
/// under: `holder_killed[w]`, `holder_killed[p1-1]`.
pub(crate) fn kind_scenario_name(name: &str, kind: lock_core::LeaseKind) -> String {
    format!("{name}[{}]", kind.code())
}

struct Candidate {
    name: String,
    url: String,
    target: Arc<dyn Target>,
    _keep: Option<tempfile::TempDir>,
}

impl Candidate {
    /// A server the user runs at `url`.
    fn at_url(url: &str) -> Self {
        let target = UrlTarget::of(url);
        Self {
            name: target.name.clone(),
            url: url.to_owned(),
            target: Arc::new(target),
            _keep: None,
        }
    }
}

pub(crate) const EMBEDDED: &[&str] = &["memory", "sqlite", "file"];

/// The server kinds `--spawn` starts when `--backends` is not given: every
/// single server, the Redis master/replica pair and Redlock (they start in
/// a second and their failover and node-loss scenarios take seconds); the
/// etcd cluster, the ZooKeeper ensemble (three JVMs), Redis Sentinel and the other
/// libraries' layouts (`redis-plain`, `redis-redisson`, `zookeeper-kazoo`,
/// `postgres-shedlock`, `mariadb-shedlock`) only with `--full`, which keeps
/// `--quick` under 5 minutes on a two-core machine. Any kind can be asked
/// for by name with `--backends`.
fn default_kinds(full: bool) -> Vec<&'static str> {
    deploy::KINDS
        .iter()
        .filter(|k| full || !k.full_only)
        .map(|k| k.name)
        .collect()
}

async fn candidate(name: &str) -> Result<Candidate, String> {
    match name {
        "memory" => Ok(Candidate {
            name: "memory".into(),
            url: "memory://".into(),
            target: Arc::new(MemoryTarget::new()),
            _keep: None,
        }),
        "sqlite" | "file" => {
            let dir = tempfile::Builder::new()
                .prefix("distlock-compare-")
                .tempdir()
                .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
            let url = if name == "sqlite" {
                format!("sqlite://{}", dir.path().join("locks.db").display())
            } else {
                format!("file://{}", dir.path().display())
            };
            Ok(Candidate {
                name: name.into(),
                url: url.clone(),
                target: Arc::new(UrlTarget {
                    name: name.into(),
                    url,
                }),
                _keep: Some(dir),
            })
        }
        kind if deploy::kind(kind).is_some() => {
            let deployment = deploy::start(kind).await.map_err(|e| match e {
                HarnessError::MissingBinary { .. } => format!("not installed: {e}"),
                other => format!("could not start: {other}"),
            })?;
            let target = DeployedTarget::new(deployment, opener());
            Ok(Candidate {
                name: kind.to_owned(),
                url: target.url(),
                target: Arc::new(target),
                _keep: None,
            })
        }
        other => Err(format!(
            "unknown backend {other:?}; expected one of memory, sqlite, file, {}",
            deploy::kind_names().join(", ")
        )),
    }
}

/// The capabilities and the facets (the optional parts the backend has:
/// `admin`, `elections`, `lock_sets`, `downgrade`, `holder_watch`).
fn capabilities_json(c: &Capabilities, facets: &[&str]) -> Value {
    json!({
        "fencing": match c.fencing {
            lock_core::FencingScope::None => "none",
            lock_core::FencingScope::PerKey => "per_key",
            _ => "global",
        },
        "fencing_survives_failover": c.fencing_survives_failover,
        "grants_survive_restart": c.grants_survive_restart,
        "waiting": format!("{:?}", c.waiting).to_lowercase(),
        "fifo": c.fifo,
        "ttl_model": match c.ttl_model { lock_core::TtlModel::PerLease => "per_lease", _ => "per_session" },
        "linearizable": c.linearizable,
        "min_ttl_ms": c.min_ttl.as_millis(),
        "shared_locks": c.shared_locks,
        "semaphores": c.semaphores,
        "max_held": c.max_held,
        "facets": facets,
    })
}

/// `distlock-compare --url URL check`: the suite and the scenarios that need no
/// process control, against a server the user runs.
pub(crate) async fn check(url: &str) -> Vec<BackendResult> {
    let candidate = Candidate::at_url(url);
    let opts = CompareOptions {
        backends: None,
        urls: Vec::new(),
        spawn: false,
        quick: false,
        full: false,
        scenarios: true,
        json: None,
        html: None,
    };
    let progress = Progress {
        step: 1,
        total: 1,
        name: candidate.name.clone(),
    };
    vec![compare_one(candidate, &opts, &progress, Phases::default()).await]
}

/// URL schemes `--backends` accepts for the backend kind they name (the
/// kinds and embedded names themselves are accepted as they are).
pub(crate) const ALIASES: &[(&str, &str)] = &[
    ("zk", "zookeeper"),
    ("postgresql", "postgres"),
    ("mysql", "mariadb"),
    ("rediss", "redis"),
    ("etcds", "etcd"),
];

/// Every name `--backends` takes: the embedded backends, then the test
/// kit's deployment kinds.
pub(crate) fn backend_names() -> Vec<&'static str> {
    EMBEDDED
        .iter()
        .copied()
        .chain(deploy::kind_names())
        .collect()
}

/// The kind or embedded backend `name` means (case-insensitive; URL
/// schemes as aliases), `None` when it means nothing.
pub(crate) fn canonical_backend(name: &str) -> Option<String> {
    let name = name.trim().to_ascii_lowercase();
    if backend_names().contains(&name.as_str()) {
        return Some(name);
    }
    ALIASES
        .iter()
        .find(|(alias, _)| *alias == name)
        .map(|(_, kind)| (*kind).to_owned())
}

/// The backends `--backends` names, or `defaults`; an unknown name is a
/// usage error before anything starts; a server kind without
/// `--spawn` is a usage error.
fn selected_backends(opts: &CompareOptions, defaults: &[&str]) -> Result<Vec<String>, LockError> {
    let names: Vec<String> =
        match &opts.backends {
            Some(list) => {
                list.iter()
                    .map(|name| {
                        canonical_backend(name).ok_or_else(|| {
                    LockError::config(format!(
                        "unknown backend {name:?}; expected one of {} (or a URL scheme: {})",
                        backend_names().join(", "),
                        ALIASES.iter().map(|(a, _)| *a).collect::<Vec<_>>().join(", ")
                    ))
                })
                    })
                    .collect::<Result<_, _>>()?
            }
            None => defaults.iter().map(|s| (*s).to_owned()).collect(),
        };
    for name in &names {
        if deploy::kind(name).is_some() && !opts.spawn {
            return Err(LockError::config(format!(
                "backend {name:?} needs a server: add --spawn to start one on loopback, or pass --with URL"
            )));
        }
    }
    Ok(names)
}

/// Runs the comparison; progress goes to stderr.
pub(crate) async fn run(opts: &CompareOptions) -> Result<Vec<BackendResult>, LockError> {
    crate::metrics::install_once();
    let defaults: Vec<&str> = if opts.spawn {
        EMBEDDED
            .iter()
            .copied()
            .chain(default_kinds(opts.full))
            .collect()
    } else {
        EMBEDDED.to_vec()
    };
    let names = selected_backends(opts, &defaults)?;
    if opts.quick {
        return Ok(run_in_lanes(opts, &names).await);
    }
    let mut results = Vec::new();
    for (name, progress) in visits(&names, &opts.urls) {
        let mut phases = Phases::default();
        match start(name, &progress, &mut phases, "start servers").await {
            Ok(c) => results.push(compare_one(c, opts, &progress, phases).await),
            Err(why) => results.push(BackendResult::unavailable(name, why, phases)),
        }
    }
    Ok(results)
}

/// The quick run: the verdict stages of [`verdicts::quick_lanes`] backends
/// at a time (they mostly wait: TTLs, paused holders, injected latency),
/// each on servers of its own, stopped when its stage and its held-at-scale
/// counts end (those beside the next backend's stage); then the timed
/// benchmarks of one backend at a time on servers started again, with
/// nothing else running.
async fn run_in_lanes(opts: &CompareOptions, names: &[String]) -> Vec<BackendResult> {
    let lanes = verdicts::Lanes::new(verdicts::quick_lanes());
    let started = std::time::Instant::now();
    lock_core::enable_metrics(lock_core::KeyLabel::Omit);
    let stage = visits(names, &opts.urls).map(|(name, progress)| {
        let lanes = &lanes;
        async move {
            let slot = lanes.slot().await;
            let mut phases = Phases::default();
            let found = match start(name, &progress, &mut phases, "start servers").await {
                Ok(c) => {
                    let found =
                        verdicts::verdicts(&c, opts, &progress, &mut phases, (lanes, slot)).await;
                    match found {
                        Ok((v, slot)) => {
                            // Counted in a child process and by a proxy of
                            // its own: the next backend may start meanwhile.
                            drop(slot);
                            let mut figures = BenchFigures::default();
                            let url = c.target.url().unwrap_or_else(|| c.url.clone());
                            phases
                                .time(
                                    "bench held-at-scale",
                                    held_at_scale(&mut figures, &url, opts.full, v.caps.max_held),
                                )
                                .await;
                            Ok((v, distlock::redact_url(&c.url), figures))
                        }
                        Err(why) => Err(why),
                    }
                }
                Err(why) => Err(why),
            };
            (name, progress, phases, found)
        }
    });
    let stage = futures_util::future::join_all(stage).await;
    lock_core::disable_metrics();
    eprintln!(
        "verdict stages: {:.0} s ({} backends at a time); benchmarks next, one at a time",
        started.elapsed().as_secs_f64(),
        verdicts::quick_lanes()
    );
    let started = std::time::Instant::now();
    let mut results = Vec::new();
    for (name, progress, mut phases, found) in stage {
        let (v, url, figures) = match found {
            Ok(found) => found,
            Err(why) => {
                progress.say(&why);
                results.push(BackendResult::unavailable(name, why, phases));
                continue;
            }
        };
        let bench = match start_for_benchmarks(name, &progress, &mut phases).await {
            Ok((c, servers)) => {
                progress.say("benchmarks");
                let url = c.target.url().unwrap_or_else(|| c.url.clone());
                let figures = BenchFigures { servers, ..figures };
                benchmarks(&*c.target, &url, opts, &mut phases, figures).await
            }
            Err(why) => BenchFigures {
                error: Some(format!("not measured: {why}")),
                ..figures
            },
        };
        progress.say(&phases::summary("took", &phases));
        results.push(result_of(name.to_owned(), url, v, bench, phases));
    }
    eprintln!("benchmarks: {:.0} s", started.elapsed().as_secs_f64());
    results
}

/// Starts the backend `name` again for the timed benchmarks, timed as
/// `start again`: a server kind with the servers' own durable defaults (as
/// deployed: a write per grant costs a disk flush), with those settings
/// described; an embedded backend or a URL as it is.
async fn start_for_benchmarks(
    name: &str,
    progress: &Progress,
    phases: &mut Phases,
) -> Result<(Candidate, Option<String>), String> {
    use conformance::servers::{Durability, set_durability};
    let spawned = !name.contains(':') && deploy::kind(name).is_some();
    if spawned {
        set_durability(Durability::ServerDefaults);
    }
    let started = start(name, progress, phases, "start again").await;
    set_durability(Durability::Fast);
    let servers = spawned
        .then(|| Durability::ServerDefaults.settings_of(server_of_kind(name)))
        .flatten()
        .map(str::to_owned);
    Ok((started?, servers))
}

/// The server a deployment kind runs (`redis-replica` and `redlock`:
/// `redis`; `postgres-session`: `postgres`; ...), as
/// `Durability::settings_of` names it.
fn server_of_kind(kind: &str) -> &str {
    match kind.split('-').next().unwrap_or(kind) {
        "redlock" => "redis",
        server => server,
    }
}

/// Starts the backend `name` (a kind, an embedded backend, or a URL to
/// use as it is), timed as `phase`.
async fn start(
    name: &str,
    progress: &Progress,
    phases: &mut Phases,
    phase: &str,
) -> Result<Candidate, String> {
    if name.contains(':') {
        return Ok(Candidate::at_url(name));
    }
    progress.say("starting");
    let started = phases.time(phase, candidate(name)).await;
    if let Err(why) = &started {
        progress.say(why);
    }
    started
}

/// One backend's result from its verdicts and its figures.
fn result_of(
    name: String,
    url: String,
    v: verdicts::Verdicts,
    bench: BenchFigures,
    phases: Phases,
) -> BackendResult {
    BackendResult {
        name,
        url,
        capabilities: capabilities_json(&v.caps, &v.facets),
        conformance: Some(v.suite),
        scenarios: v.scenarios,
        bench,
        metrics: v.metrics,
        error: None,
        phases,
        left_to_full_run: v.left_to_full_run,
    }
}

/// The backends to visit in order (`names`, then the `--url`s), each with
/// its progress line.
fn visits<'a>(
    names: &'a [String],
    urls: &'a [String],
) -> impl Iterator<Item = (&'a str, Progress)> + 'a {
    let total = names.len() + urls.len();
    names
        .iter()
        .chain(urls)
        .map(String::as_str)
        .enumerate()
        .map(move |(index, name)| {
            let progress = Progress {
                step: index + 1,
                total,
                name: name.to_owned(),
            };
            (name, progress)
        })
}

struct Progress {
    step: usize,
    total: usize,
    name: String,
}

impl Progress {
    fn say(&self, what: &str) {
        let width = 20;
        let filled = width * (self.step - 1) / self.total.max(1);
        eprintln!(
            "[{}{}] {}/{} {}: {what}",
            "#".repeat(filled),
            ".".repeat(width - filled),
            self.step,
            self.total,
            self.name
        );
    }
}

async fn compare_one(
    c: Candidate,
    opts: &CompareOptions,
    progress: &Progress,
    mut phases: Phases,
) -> BackendResult {
    lock_core::enable_metrics(lock_core::KeyLabel::Omit);
    let lanes = verdicts::Lanes::new(1);
    let slot = lanes.slot().await;
    let found = verdicts::verdicts(&c, opts, progress, &mut phases, (&lanes, slot)).await;
    lock_core::disable_metrics();
    let v = match found {
        Ok((v, _)) => v,
        Err(why) => {
            progress.say(&why);
            return BackendResult::unavailable(&c.name, why, phases);
        }
    };
    let (name, url) = (c.name.clone(), distlock::redact_url(&c.url));
    // A spawned server kind is started again for the benchmarks, with its
    // durable defaults; anything else is measured where it is (scenarios
    // may have moved it: the floor talks to where clients talk now).
    let again = if deploy::kind(&name).is_some() {
        drop(c);
        start_for_benchmarks(&name, progress, &mut phases).await
    } else {
        Ok((c, None))
    };
    let bench = match again {
        Ok((c, servers)) => {
            progress.say("benchmarks");
            let current_url = c.target.url().unwrap_or_else(|| c.url.clone());
            let figures = BenchFigures {
                servers,
                ..BenchFigures::default()
            };
            benchmarks(&*c.target, &current_url, opts, &mut phases, figures).await
        }
        Err(why) => BenchFigures {
            error: Some(format!("not measured: {why}")),
            ..BenchFigures::default()
        },
    };
    progress.say(&phases::summary("took", &phases));
    result_of(name, url, v, bench, phases)
}

/// A small table's column: its header, its width, the figure it shows and
/// that figure's decimals.
pub(super) struct Column(
    pub(super) &'static str,
    pub(super) usize,
    pub(super) fn(&BenchFigures) -> Option<f64>,
    pub(super) usize,
);

/// A small table of benchmark figures: the rows `keep` selects, a header of
/// the columns' titles after the backend name, each row's figures with
/// their decimals ("-" where a figure is missing), the row's error (as
/// "`what` benchmark error: ..."), then `note`.
pub(super) fn print_small_table(
    results: &[BackendResult],
    keep: impl Fn(&BenchFigures) -> bool,
    columns: &[Column],
    error: impl Fn(&BenchFigures) -> Option<&String>,
    what: &str,
    note: &str,
) {
    let rows: Vec<&BackendResult> = results.iter().filter(|r| keep(&r.bench)).collect();
    if rows.is_empty() {
        return;
    }
    let w = rows
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(0)
        .max(10);
    let line = |name: &str, values: Vec<String>| {
        let mut text = format!("{name:<w$}");
        for (Column(_, width, ..), value) in columns.iter().zip(values) {
            text.push_str(&format!(" {value:>width$}"));
        }
        println!("{text}");
    };
    println!();
    line("backend", columns.iter().map(|c| c.0.to_owned()).collect());
    for r in rows {
        let cells = columns
            .iter()
            .map(|Column(_, _, figure, digits)| cell(figure(&r.bench), *digits));
        line(&r.name, cells.collect());
        if let Some(e) = error(&r.bench) {
            println!("{:<w$}   {what} benchmark error: {e}", "");
        }
    }
    println!("{note}");
}

pub(super) fn cell(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.digits$}"))
}

/// The terminal table.
pub(crate) fn print_table(results: &[BackendResult]) {
    let w = results
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(0)
        .max(10);
    println!(
        "{:<w$} {:<22} {:>9} {:>9} {:>7} {:>10} {:>7} {:>9} {:>7} {:>6} {:>9} {:>8} {:>9}",
        "backend",
        "conformance",
        "p50 µs",
        "p99 µs",
        "x floor",
        "8 clients",
        "x floor",
        "handoff/s",
        "x floor",
        "spread",
        "RT/cycle",
        "B/lock",
        "RT/period"
    );
    for r in results {
        if let Some(err) = &r.error {
            println!("{:<w$} {err}", r.name);
            continue;
        }
        let b = &r.bench;
        let round_trips = match (b.round_trips_per_cycle, b.floor_round_trips_per_cycle) {
            (Some(ours), Some(floor)) => format!("{ours:.1}/{floor:.1}"),
            (Some(ours), None) => format!("{ours:.1}"),
            _ => "-".to_owned(),
        };
        println!(
            "{:<w$} {:<22} {:>9} {:>9} {:>7} {:>10} {:>7} {:>9} {:>7} {:>6} {:>9} {:>8} {:>9}",
            r.name,
            r.verdict(),
            cell(b.cycle_p50_us, 1),
            cell(b.cycle_p99_us, 1),
            cell(b.cycle_ratio, 2),
            cell(b.throughput_8x8, 0),
            cell(b.throughput_ratio, 2),
            cell(b.handoffs_per_s, 0),
            cell(b.handoff_ratio, 2),
            cell(b.handoff_spread.filter(|s| s.is_finite()), 1),
            round_trips,
            cell(b.bytes_per_held_lock, 0),
            cell(b.renewal_round_trips_per_period, 1),
        );
        if let Some(e) = &b.error {
            println!("{:<w$}   benchmark error: {e}", "");
        }
    }
    println!(
        "(x floor: ours over the hand-written floor on one bare connection, interleaved in one run; \
         8 clients on 8 keys: in this process, each from distlock::connect, medians of interleaved \
         rounds (the client shapes table below); handoff (4 clients, 1 key) uses independent clients \
         with a waiting acquire; spread: busiest/least busy handoff client; RT/cycle ours/floor counted by a fault \
         proxy; B/lock and RT/period with {} locks held by one client)",
        results
            .iter()
            .find_map(|r| r.bench.held_locks)
            .unwrap_or(1000)
    );
    for r in results {
        let b = &r.bench;
        if let (Some(ours), Some(floor), Some(ratio)) = (
            b.one_cpu_cycle_p50_us,
            b.one_cpu_floor_cycle_p50_us,
            b.one_cpu_cycle_ratio,
        ) {
            println!(
                "  {}: 1-client p50 on one CPU (this process and the servers it started): \
                 {ours:.1} µs, floor {floor:.1} µs, {ratio:.2}x",
                r.name
            );
        }
    }
    let with_servers: Vec<&BackendResult> = results
        .iter()
        .filter(|r| r.bench.servers.is_some())
        .collect();
    if !with_servers.is_empty() {
        println!("benchmarks on servers started again with their durable defaults:");
        for r in with_servers {
            println!("  {}: {}", r.name, r.bench.servers.as_deref().unwrap_or(""));
        }
    }
    for r in results {
        if let Some(e) = &r.bench.held_error {
            println!("  {}: held locks at scale not measured: {e}", r.name);
        }
    }
    print_client_shapes_table(results);
    shared::print_shared_table(results);
    compose::print_compose_table(results);
    let with_scenarios: Vec<&BackendResult> =
        results.iter().filter(|r| !r.scenarios.is_empty()).collect();
    if !with_scenarios.is_empty() {
        println!();
        print!("{:<24}", "scenario");
        for r in &with_scenarios {
            let cw = r.name.chars().count().max(10);
            print!(" {:>cw$}", r.name);
        }
        println!();
        let mut names: Vec<String> = scenarios::SCENARIOS
            .iter()
            .map(|n| (*n).to_owned())
            .collect();
        for r in &with_scenarios {
            for name in r.scenarios.keys() {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
        }
        for name in &names {
            print!("{name:<24}");
            for r in &with_scenarios {
                let cw = r.name.chars().count().max(10);
                let v = r.scenarios.get(name).map_or("-", |s| match s.verdict {
                    Verdict::Safe => "safe",
                    Verdict::Violation => "VIOLATION",
                    Verdict::Flagged => "flagged",
                    Verdict::Skipped => "skipped",
                });
                print!(" {v:>cw$}");
            }
            println!();
        }
        println!(
            "(flagged = a negative control: the unsafe outcome this backend cannot prevent was observed and reported; \
             name[w]: run with the write side of a read-write lock in the mutex's place, name[p1-1]: with a semaphore of one permit)"
        );
    }
    verdicts::print_left_to_full_run(results);
    println!();
    println!(
        "time per backend, s: its phases one after another, the slowest in brackets \
         (a quick run overlaps backends' verdict stages, so these add up to more than it took)"
    );
    for r in results {
        println!("  {}", phases::summary(&r.name, &r.phases));
    }
    for r in results {
        if let Some(s) = &r.conformance {
            for case in s.failures() {
                println!("  {} FAILED {}: {}", r.name, case.name, case.detail);
            }
        }
        for (name, s) in &r.scenarios {
            if s.fails_run() {
                println!("  {} VIOLATION {name}: {}", r.name, s.detail);
            }
        }
    }
}

/// The JSON document (shape documented in the README).
pub(crate) fn to_json(results: &[BackendResult]) -> Value {
    json!({ "backends": results })
}

/// The two ways a service runs 8 lockers in one process: 8 clients (each
/// from its own `distlock::connect`) and one client shared by 8 tasks,
/// each against the same 8 floor connections, interleaved ([`shapes`]).
fn print_client_shapes_table(results: &[BackendResult]) {
    let plan = results.iter().find_map(|r| r.bench.client_shape_plan);
    let note = format!(
        "(cycles/s in one process on its multi-thread runtime, 8 keys, lock(key).ttl(30s).wait(60s) \
         then release; {} rounds of {} ms a side, the sides' order rotated each round; each figure \
         the median round, x floor the median of the rounds' ratios)",
        plan.map_or(0, |p| p.rounds),
        plan.map_or(0, |p| p.window_ms),
    );
    print_small_table(
        results,
        |b| b.throughput_shared_client.is_some(),
        &[
            Column("8 clients", 10, |b| b.throughput_8x8, 0),
            Column("x floor", 7, |b| b.throughput_ratio, 2),
            Column("1 client/8 tasks", 16, |b| b.throughput_shared_client, 0),
            Column("x floor", 7, |b| b.throughput_shared_client_ratio, 2),
            Column("8 floors", 9, |b| b.floor_throughput_8x8, 0),
        ],
        |_| None,
        "client shapes",
        &note,
    );
    print_small_table(
        results,
        |b| b.raw_throughput_8x8.is_some() || b.crate_alone_throughput_8x8.is_some(),
        &[
            Column("8 raw", 8, |b| b.raw_throughput_8x8, 0),
            Column("8 cl/raw", 8, |b| b.throughput_raw_ratio, 2),
            Column("1 cl/raw", 8, |b| b.throughput_shared_client_raw_ratio, 2),
            Column("floor/raw", 9, |b| b.token_cost_ratio, 2),
            Column("8 crate alone", 13, |b| b.crate_alone_throughput_8x8, 0),
            Column("alone/floor", 11, |b| b.crate_alone_floor_ratio, 2),
            Column("8 cl/alone", 10, |b| b.throughput_crate_alone_ratio, 2),
            Column(
                "1 alone/floor",
                13,
                |b| b.crate_alone_shared_client_floor_ratio,
                2,
            ),
            Column(
                "1 cl/1 alone",
                12,
                |b| b.throughput_shared_client_crate_alone_ratio,
                2,
            ),
        ],
        |_| None,
        "client shapes' baselines",
        &baselines_note(results),
    );
}

/// What the baselines table's columns are, and which library each row's
/// crate-alone side used.
fn baselines_note(results: &[BackendResult]) -> String {
    let libraries: Vec<String> = results
        .iter()
        .filter_map(|r| {
            Some(format!(
                "{} {}",
                r.name,
                r.bench.crate_alone_library.as_ref()?
            ))
        })
        .collect();
    format!(
        "(the same rounds as the client shapes, two more sides of 8 connections where they apply: \
         raw = the server's own lock by hand with no token (SQL session mode: \
         pg_try_advisory_lock / GET_LOCK, then unlock), floor/raw = what the driver's grant adds to it (the fencing token, the holder published); \
         crate alone = the driver's requests of a cycle through its required client library and \
         nothing else ({}), alone/floor = the library's share, ours/alone = the driver's own; \
         1 alone = one client of the library shared by 8 tasks, the shared shape's baseline; \
         each the median of the rounds' ratios)",
        if libraries.is_empty() {
            "none here".to_owned()
        } else {
            libraries.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-CPU pair keeps the servers of these ports with it.
    #[test]
    fn loopback_ports_are_the_urls_hosts() {
        assert_eq!(
            loopback_ports("postgres://u:p@w@127.0.0.1:5432/db?mode=session"),
            [5432]
        );
        assert_eq!(
            loopback_ports("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"),
            [1, 2, 3]
        );
        assert_eq!(loopback_ports("etcd://127.0.0.1:2379/prefix"), [2379]);
        assert!(loopback_ports("sqlite:///tmp/x.db").is_empty());
        assert!(loopback_ports("memory://").is_empty());
    }

    /// Every deployment kind's servers have their settings written down
    /// for the report.
    #[test]
    fn every_kind_names_its_servers_settings() {
        use conformance::servers::Durability;
        for kind in deploy::KINDS {
            for durability in [Durability::Fast, Durability::ServerDefaults] {
                assert!(
                    durability.settings_of(server_of_kind(kind.name)).is_some(),
                    "{}: no settings",
                    kind.name
                );
            }
        }
        assert_eq!(server_of_kind("redlock"), "redis");
        assert_eq!(server_of_kind("postgres-session"), "postgres");
    }

    /// Every alias is a URL scheme some compiled-in driver handles, and
    /// names a backend `--backends` knows.
    #[test]
    fn aliases_are_driver_schemes_of_known_backends() {
        for (alias, kind) in ALIASES {
            assert!(
                distlock::backend::drivers()
                    .iter()
                    .any(|d| d.schemes.iter().any(|s| s == alias)),
                "{alias} is no driver's scheme"
            );
            assert!(backend_names().contains(kind), "{kind} is not a backend");
            assert_eq!(canonical_backend(alias).as_deref(), Some(*kind));
        }
        assert_eq!(canonical_backend("ZooKeeper").as_deref(), Some("zookeeper"));
        assert_eq!(canonical_backend("nosuch"), None);
    }
}
