//! A randomized fault soak: clients take locks and update a counter under
//! them against one deployment while a nemesis injects faults on a random
//! schedule; the history checker judges the whole run.
//!
//! # What runs
//!
//! - **Workers** (4 by default) loop over a few keys: acquire through a
//!   guard (`client.lock(key).ttl(..).wait(..)`), a fenced read of the
//!   key's counter, a short hold, then a fenced write of `read + 1`, then
//!   release. A well-behaved worker checks that its guard still holds
//!   before it reads and before it writes. Every operation, renewal, lost
//!   signal and write is recorded in one [`History`].
//! - **The protected resource** is a counter per key that refuses a read
//!   or a write whose token is below the highest one it has seen, the way
//!   a store uses fencing tokens (`UPDATE .. WHERE last_token <= $token`).
//!   On a backend without fencing (capabilities) writes carry no token and
//!   are all applied. Lost increments are `applied writes - final value`.
//! - **The nemesis** runs two lanes from one seeded schedule: process and
//!   network faults one after another ([`FaultKind`]), and client freezes
//!   (a worker that stops acting while it holds its guard's token, for a
//!   time that may exceed the TTL, then writes with that token without
//!   looking again, as a process paused by a GC or SIGSTOP would; its
//!   guard does not renew during the freeze, since a paused process renews
//!   nothing either).
//!
//! # Partitions in the kernel
//!
//! [`run_soak`] cuts client links in fault proxies (or in-process links)
//! and members' peer links in the deployment's proxies.
//! [`run_soak_in_lab`] puts each worker's client on a host of a
//! [`Lab`](lock_testkit::netns::Lab) of its own (a thread in that host's
//! network namespace, with its own runtime; the history and the resource
//! are shared as in the other mode) and cuts the partitions there:
//! isolating a worker's host, cutting a member's host from its peers', or
//! the single-member worker's host from its member's (see [`SoakLab`]).
//! Client latency is left out in that mode.
//!
//! # Replaying a run
//!
//! Everything random comes from one seed ([`SplitMix64`]): the fault
//! schedule (kinds, order, durations, targets, gaps) is a pure function of
//! the seed, the kinds that apply and the run's length ([`plan`]); each
//! worker draws its keys and hold times from its own stream derived from
//! the same seed. Timing (how fast servers answer) still differs between
//! runs, so a replay repeats the schedule exactly and the clients' choices
//! in the same order, not every interleaving.
//!
//! # Judging, and negative controls
//!
//! The verdict comes from [`history::check`](crate::history::check) over
//! the whole run (overlapping promised windows, grants past their
//! deadline, stale writes accepted, token regressions and duplicates where
//! the backend promises fencing) plus lost increments of the counter. Each
//! violation found is attributed to the faults that *cover* it: those that
//! could have made it, judged from when each fault was active and where:
//!
//! - **When**: the fault was active at some moment between the earlier
//!   grant involved and the moment the violation became possible: for a
//!   double grant (overlapping windows), from the first holder's grant to
//!   the second's (a fault that starts once both hold came too late, and
//!   one that ended before the first grant too early); for a stale write,
//!   from the late writer's grant to the newer grant whose write got in
//!   first; for a lost increment, from the earliest grant involved to the
//!   write; for a token regression, between the two grants.
//! - **Where**: a fault of one client's link, or a freeze of one client,
//!   covers only a late write of that very client: a stale write it made,
//!   or a lost increment it made or whose overwritten increments include
//!   its own (its late write got in, then the current holder's write
//!   overwrote it). A paused or cut-off holder cannot make the server
//!   grant twice. A single-member client's partition covers only
//!   violations that client took part in. Server, node and member faults
//!   act on every client.
//!
//! Some fault kinds are known to break some backends, decided from
//! [`Capabilities`] only ([`known_unsafe`]): server restarts, leader kills
//! and node kills where `fencing_survives_failover` is false (Redis without
//! persistence, an asynchronous replica promoted), client freezes, client
//! partitions and latency where there is no fencing (Redlock), member
//! partitions where the store is not linearizable. The nemesis still
//! injects them (a negative control must be able to show its violation),
//! and a violation that one of them covers is reported as *expected
//! (negative control)* for that kind instead of failing the run. A
//! violation no known-unsafe fault covers fails the run
//! ([`SoakReport::fails_run`]), whatever else was active meanwhile: a
//! double grant on Redlock while only a freeze of some client was under
//! way, or one made after a restart's window, is the backend's. Stale writes are tied to their
//! writes by replaying the checker's rule on the recorded events;
//! every overlapping pair is listed by running the checker again with the
//! listed pairs' earlier windows taken out (it lists ten at a time). A
//! stale write the soak cannot tie to a write fails the run unless every
//! tied violation was expected (or the backend has no fencing and a
//! known-unsafe fault was injected).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{Capabilities, LockBackend, LockError, LockKey, OwnerId};
use tokio::time::Instant;

use crate::harness::Target;
use crate::history::{CheckReport, Event, History};
use crate::process::HarnessError;
use crate::proxy::FaultProxy;

mod faults;
mod lab;
mod observe;
mod report;
mod workers;

pub use faults::*;
use lab::*;
pub use lab::{SoakLab, run_soak_in_lab};
use observe::*;
pub use report::*;
use workers::*;

/// Where a run's network faults act.
pub(super) enum Network {
    /// Workers on this runtime; client faults through fault proxies or
    /// in-process links, member faults through the deployment's
    /// ([`MemberFaults`]).
    Proxies(Option<Arc<dyn MemberFaults>>),
    /// Workers on lab hosts; partitions cut in the kernel
    /// ([`run_soak_in_lab`]).
    Lab(Arc<SoakLab>),
}

/// Faults on the members of a clustered deployment: peer-link partitions
/// and clients attached to a single member. Implemented by
/// [`DeployedTarget`](crate::deploy::DeployedTarget) for the deployments
/// started with peer proxies.
#[async_trait]
pub trait MemberFaults: Send + Sync {
    /// How many members can be partitioned from the others (0: none).
    ///
    /// # Cancel safety
    ///
    /// Safe: it only looks.
    async fn partitionable_members(&self) -> usize;

    /// How many members a single-member client can be attached to.
    ///
    /// # Cancel safety
    ///
    /// Safe: it only looks.
    async fn members(&self) -> usize;

    /// Cuts member `index` off from the other members.
    ///
    /// # Errors
    ///
    /// When the fault cannot be injected.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: call [`heal_member`](Self::heal_member) afterwards.
    async fn partition_member(&self, index: usize) -> Result<bool, HarnessError>;

    /// Undoes [`partition_member`](Self::partition_member).
    ///
    /// # Errors
    ///
    /// When the fault cannot be removed.
    ///
    /// # Cancel safety
    ///
    /// Safe to call again.
    async fn heal_member(&self, index: usize) -> Result<(), HarnessError>;

    /// A client whose only endpoint is a fault proxy in front of member
    /// `index`, with that proxy; `None` when the deployment has no members.
    ///
    /// # Errors
    ///
    /// When the proxy or the client cannot be set up.
    ///
    /// # Cancel safety
    ///
    /// Safe: a dropped call leaves at most an unused proxy behind.
    async fn member_client(
        &self,
        index: usize,
    ) -> Result<Option<(Arc<dyn LockBackend>, FaultProxy)>, HarnessError>;
}

/// Settings of a soak run.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// How long clients run (the last fault may end a little later).
    pub duration: Duration,
    /// The seed of everything random.
    pub seed: u64,
    /// Concurrent workers (each its own client).
    pub workers: usize,
    /// Keys they compete for.
    pub keys: usize,
    /// Lease TTL (raised to the backend's minimum).
    pub ttl: Duration,
    /// Restrict the nemesis to these kinds (`None`: every kind that
    /// applies to the target).
    pub kinds: Option<Vec<FaultKind>>,
    /// One hold in this many lasts one to three TTLs, renewed meanwhile,
    /// instead of under a quarter of one: a partition then lands while a
    /// holder depends on its renewals and its lost signal (the path a
    /// kernel cut tests). `0` (the default): never.
    pub long_hold_every: u32,
    /// A real fenced store (a `lock-fence` adapter) every write also goes
    /// to, with the holder's token, when the backend has tokens: the
    /// report then counts the stale writes it refused, and any write it
    /// judged otherwise than the resource's rule is a violation.
    pub fence_store: Option<FenceStore>,
}

/// A real fenced store for [`SoakConfig::fence_store`].
#[derive(Clone)]
pub struct FenceStore(pub Arc<dyn crate::fencing::FencedResource>);

impl std::fmt::Debug for FenceStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("FenceStore").field(&self.0.name()).finish()
    }
}

impl SoakConfig {
    /// Defaults for a run of `duration` with `seed`.
    pub fn new(duration: Duration, seed: u64) -> Self {
        Self {
            duration,
            seed,
            workers: 4,
            keys: 2,
            ttl: Duration::from_secs(1),
            kinds: None,
            long_hold_every: 0,
            fence_store: None,
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs a soak against `target` (with `members` for peer-link and
/// single-member faults on clustered deployments).
///
/// # Errors
///
/// When no client can be made at all (the report is otherwise always
/// produced: faults that cannot be injected are listed in it).
///
/// # Cancel safety
///
/// Not cancel safe: a dropped run may leave a fault injected (a paused
/// server, a partitioned member).
pub async fn run_soak(
    target: Arc<dyn Target>,
    members: Option<Arc<dyn MemberFaults>>,
    config: &SoakConfig,
) -> Result<SoakReport, LockError> {
    run(target, Network::Proxies(members), config).await
}

/// A worker whose client is made: where it runs, and how to start it.
enum Prepared {
    /// On this runtime.
    Here(Box<Worker>),
    /// On a lab host's thread.
    InLab(LabWorker),
}

/// [`run_soak`] or [`run_soak_in_lab`], by `network`.
async fn run(
    target: Arc<dyn Target>,
    network: Network,
    config: &SoakConfig,
) -> Result<SoakReport, LockError> {
    let caps = match &network {
        Network::Lab(lab) => lab.capabilities(&target).await?,
        Network::Proxies(_) => target.client().await?.capabilities(),
    };
    let ttl = config.ttl.max(caps.min_ttl);
    let mut nemesis_errors = Vec::new();
    let (mut kinds, mut not_applicable) = applicable(&target, &network, &mut nemesis_errors).await;
    if let Some(only) = &config.kinds {
        for k in kinds.iter().filter(|k| !only.contains(k)) {
            not_applicable.insert(
                k.as_str().to_owned(),
                "excluded by the run's settings".into(),
            );
        }
        kinds.retain(|k| only.contains(k));
    }
    let schedule = plan(config.seed, &kinds, config.duration, ttl);

    let history = Arc::new(History::new());
    let clock = Instant::now();
    let run = &OwnerId::random().to_hex()[..8];
    let keys: Vec<LockKey> = (0..config.keys.max(1))
        .map(|i| LockKey::new(format!("soak-{run}/k{i}")))
        .collect::<Result<_, _>>()?;

    let workers = config.workers.max(2);
    let url = target.url();
    let mut freeze_slots = Vec::new();
    let mut worker_processes = Vec::new();
    let mut setup = |index: usize, reach: Reach| {
        let journal = Journal {
            recorder: history.process(),
            clock,
        };
        worker_processes.push(journal.recorder.id());
        let slot = Arc::new(Mutex::new(None));
        freeze_slots.push(slot.clone());
        WorkerSetup {
            index,
            journal,
            rng: SplitMix64::stream(config.seed, 100 + u64::try_from(index).unwrap_or(0)),
            freeze: slot,
            reach,
            url: url.clone(),
        }
    };
    let mut links = Links {
        workers: Vec::new(),
        member: None,
    };
    let mut lab_faults = None;
    let mut prepared = Vec::new();
    let client_links;
    match &network {
        Network::Proxies(members) => {
            // The first two workers behind fault links, the last one (on
            // a multi-member deployment) attached to a single member.
            let mut links_kind = "none".to_owned();
            for i in 0..workers {
                let mut backend = None;
                let mut reach = Reach::Direct;
                if i == workers - 1
                    && let Some(m) = members
                    && m.members().await > 1
                {
                    let member = usize::try_from(config.seed % 3).unwrap_or(0) % m.members().await;
                    match m.member_client(member).await {
                        Ok(Some((client, proxy))) => {
                            links.member = Some((i, proxy));
                            backend = Some(client);
                            reach = Reach::Member;
                        }
                        Ok(None) => {}
                        Err(e) => nemesis_errors.push(format!("member client: {e}")),
                    }
                }
                if backend.is_none() && i < 2 {
                    match target.proxied_client().await {
                        Ok(Some((client, proxy))) => {
                            links_kind = "tcp proxy".into();
                            let link = Arc::new(Mutex::new(proxy));
                            links.workers.push((i, link.clone()));
                            reach = Reach::Proxy(link);
                            backend = Some(client);
                        }
                        Ok(None) | Err(_) => {
                            let inner = target.client().await?;
                            let (client, proxy) =
                                FaultProxy::in_process(inner, Duration::from_secs(1));
                            links_kind = "in-process link".into();
                            let link = Arc::new(Mutex::new(proxy));
                            links.workers.push((i, link.clone()));
                            reach = Reach::InProcess(link);
                            backend = Some(client);
                        }
                    }
                }
                let backend = match backend {
                    Some(b) => b,
                    None => target.client().await?,
                };
                prepared.push(Prepared::Here(Box::new(
                    setup(i, reach).with_client(backend),
                )));
            }
            client_links = links_kind;
        }
        Network::Lab(lab) => {
            // Every worker on a host of its own; the last one (on a
            // cluster) attached to a single member.
            let member_worker = (lab.members.len() > 1).then(|| {
                let member = usize::try_from(config.seed % 3).unwrap_or(0) % lab.members.len();
                (workers - 1, member)
            });
            let setups = (0..workers)
                .map(|i| {
                    let reach = match member_worker {
                        Some((w, _)) if w == i => Reach::Member,
                        _ => Reach::Direct,
                    };
                    setup(i, reach)
                })
                .collect();
            let started = lab.start_workers(&target, member_worker, setups).await?;
            prepared.extend(started.into_iter().map(Prepared::InLab));
            lab_faults = Some(LabFaults {
                lab: lab.clone(),
                workers,
                member_worker,
                primary_cut: lab.members.len() <= 1 && target.primary_member().await.is_some(),
            });
            client_links = "kernel cuts (a network namespace per worker)".to_owned();
        }
    }

    let keys_for_turns = keys.clone();
    let shared = Arc::new(Shared {
        target: target.clone(),
        keys,
        ttl,
        long_hold_every: config.long_hold_every,
        end: Instant::now() + config.duration,
        resource: Resource {
            fenced: caps.has_fencing(),
            state: Mutex::new(ResourceState::default()),
        },
        store: config.fence_store.clone().filter(|_| caps.has_fencing()),
        turns: keys_for_turns
            .iter()
            .map(|k| (k.as_str().to_owned(), Arc::default()))
            .collect(),
        injected: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
    });
    let mut tasks: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> =
        Vec::new();
    for worker in prepared {
        match worker {
            Prepared::Here(worker) => {
                let task = tokio::spawn(work(*worker, shared.clone()));
                tasks.push(Box::pin(async move {
                    let _ = task.await;
                }));
            }
            Prepared::InLab(worker) => {
                let _ = worker.start.send(shared.clone());
                tasks.push(Box::pin(async move {
                    let _ = worker.done.await;
                }));
            }
        }
    }

    let members = match &network {
        Network::Proxies(members) => members.clone(),
        Network::Lab(_) => None,
    };
    let nemesis = Arc::new(Nemesis {
        target: target.clone(),
        members: members.clone(),
        links,
        lab: lab_faults,
        partitionable: match &members {
            Some(m) => m.partitionable_members().await,
            None => 0,
        },
        ttl,
        errors: Mutex::new(nemesis_errors),
    });
    let lane = {
        let (nemesis, shared, faults) = (nemesis.clone(), shared.clone(), schedule.faults.clone());
        tokio::spawn(async move {
            for fault in &faults {
                tokio::time::sleep(fault.gap).await;
                if Instant::now() >= shared.end {
                    break;
                }
                if let Some(done) = nemesis.inject(fault, clock).await {
                    shared.push_fault(done);
                }
            }
        })
    };
    let freezes = {
        let (shared, plan) = (shared.clone(), schedule.freezes.clone());
        tokio::spawn(async move {
            for fault in &plan {
                tokio::time::sleep(fault.gap).await;
                if Instant::now() >= shared.end {
                    break;
                }
                let n = u64::try_from(freeze_slots.len().max(1)).unwrap_or(1);
                let w = usize::try_from(fault.target % n).unwrap_or(0);
                *freeze_slots[w]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(fault.duration);
                // The freeze itself runs inside the worker; wait about as
                // long before the next one.
                tokio::time::sleep(fault.duration).await;
            }
        })
    };
    let _ = lane.await;
    let _ = freezes.await;
    // Clients run the whole duration, whatever the lanes planned.
    tokio::time::sleep_until(shared.end).await;
    shared.stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = tokio::time::timeout(ttl * 6 + Duration::from_secs(30), task).await;
    }
    // Leave the deployment healthy.
    if let Some(m) = &members {
        for i in 0..nemesis.partitionable {
            let _ = m.heal_member(i).await;
        }
    }
    if let Network::Lab(lab) = &network
        && let Err(e) = lab.heal().await
    {
        nemesis.error("lab heal", &e);
    }
    let _ = target.heal().await;
    let _ = target.restart_nodes().await;

    let elapsed = clock.elapsed();
    let injected = std::mem::take(
        &mut *shared
            .injected
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    let nemesis_errors = std::mem::take(
        &mut *nemesis
            .errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    let check = history.check();
    let resource = shared.resource.lock();
    let final_total: u64 = resource.registers.values().map(|r| r.value).sum();
    let lost_increments = resource.applied.saturating_sub(final_total);
    let obs = observed(&history);
    let judged = Judged {
        caps: &caps,
        injected: &injected,
        workers: &worker_processes,
    };
    let events = history.events();
    let stale = stale_writes(&events);
    let violations = judged.violations(&check, &obs, &events, &resource.lost, &stale);
    let mut faults: BTreeMap<String, FaultStats> = BTreeMap::new();
    for &k in &kinds {
        faults.insert(
            k.as_str().to_owned(),
            FaultStats {
                known_unsafe: known_unsafe(k, &caps).map(str::to_owned),
                ..FaultStats::default()
            },
        );
    }
    for f in &injected {
        let s = faults.entry(f.kind.as_str().to_owned()).or_default();
        s.injected += 1;
        s.active_ms += ms(f.end.saturating_sub(f.start));
        let during = |t: &&Duration| **t >= f.start && **t <= f.end;
        s.grants += obs.grants.iter().filter(during).count();
        s.errors += obs.errors.iter().filter(during).count();
        s.lost += obs.lost.iter().filter(during).count();
    }
    for v in &violations {
        for k in &v.faults {
            let s = faults.entry(k.as_str().to_owned()).or_default();
            s.violations += 1;
            if known_unsafe(*k, &caps).is_some() {
                s.expected_violations += 1;
            }
        }
    }
    let listed_unexpected = violations.iter().filter(|v| !v.expected).count();
    let expected = violations.len() - listed_unexpected;
    // A real store that judged a write otherwise than the rule.
    let store_disagreements = resource.store.accepted_stale + resource.store.refused_admitted;
    let unexpected = listed_unexpected + store_disagreements;
    let mut violation_counts: BTreeMap<String, ViolationCount> = BTreeMap::new();
    for v in &violations {
        let c = violation_counts.entry(v.what.clone()).or_default();
        c.total += 1;
        c.expected += usize::from(v.expected);
    }
    // The unexpected ones first, then as many expected ones as fit.
    let mut violations = violations;
    violations.sort_by_key(|v| v.expected);
    violations.truncate(MAX_LISTED);
    let verdict = if unexpected > 0 {
        "VIOLATION".to_owned()
    } else if expected > 0 {
        "expected violations only (negative control)".to_owned()
    } else {
        "safe".to_owned()
    };
    Ok(SoakReport {
        backend: target.name(),
        seed: config.seed,
        duration_s: elapsed.as_secs_f64(),
        workers,
        keys: shared.keys.len(),
        ttl_ms: ms(ttl),
        long_hold_every: config.long_hold_every,
        fenced: caps.has_fencing(),
        client_links,
        kinds,
        not_applicable,
        faults,
        injected,
        grants: obs.grants.len(),
        errors: obs.errors.len(),
        lost_signals: obs.lost.len(),
        writes: resource.writes,
        writes_refused: resource.writes_refused,
        reads_refused: resource.reads_refused,
        fence_store: shared.store.as_ref().map(|s| FenceStoreReport {
            store: s.0.name(),
            writes: resource.store.writes,
            refused: resource.store.refused,
            errors: resource.store.errors,
            accepted_stale: resource.store.accepted_stale,
            refused_admitted: resource.store.refused_admitted,
        }),
        lost_increments,
        check,
        violations,
        violation_counts,
        unexpected_violations: unexpected,
        expected_violations: expected,
        nemesis_errors,
        verdict,
    })
}

/// Attribution of violations to the faults that cover them (see the
/// module docs).
struct Judged<'a> {
    caps: &'a Capabilities,
    injected: &'a [InjectedFault],
    /// The history's process of each worker, by worker index (the target
    /// of a client fault).
    workers: &'a [u64],
}

/// What a fault must cover to have made a violation.
struct Cause {
    /// It must have been active at some moment in `from..=to`.
    from: Duration,
    to: Duration,
    /// The processes whose grants or writes make the violation.
    involved: Vec<u64>,
    /// For a violation made by a late write: the processes whose write
    /// may be the late one (empty for a double grant).
    late_writers: Vec<u64>,
}

impl Judged<'_> {
    /// The history's process of worker `index`.
    fn worker(&self, index: usize) -> Option<u64> {
        self.workers.get(index).copied()
    }

    /// Whether `fault` can have made a violation of `cause`.
    fn covers(&self, fault: &InjectedFault, cause: &Cause) -> bool {
        if fault.start > cause.to || fault.end < cause.from {
            return false;
        }
        match fault.kind {
            // A frozen, slowed or cut-off client can only write late: it
            // makes no server grant twice.
            FaultKind::ClientFreeze | FaultKind::ClientLatency | FaultKind::ClientPartition => self
                .worker(fault.target)
                .is_some_and(|p| cause.late_writers.contains(&p)),
            FaultKind::MemberClientPartition => self
                .worker(fault.target)
                .is_some_and(|p| cause.involved.contains(&p)),
            FaultKind::ServerPause
            | FaultKind::ServerRestart
            | FaultKind::LeaderKill
            | FaultKind::NodeKill
            | FaultKind::MemberPartition => true,
        }
    }

    fn violation(
        &self,
        what: &str,
        from: Duration,
        to: Duration,
        cause: &Cause,
        detail: String,
    ) -> Violation {
        let mut faults: Vec<FaultKind> = self
            .injected
            .iter()
            .filter(|f| self.covers(f, cause))
            .map(|f| f.kind)
            .collect();
        faults.sort();
        faults.dedup();
        let expected = faults.iter().any(|k| known_unsafe(*k, self.caps).is_some());
        Violation {
            what: what.to_owned(),
            from_ms: ms(from),
            to_ms: ms(to),
            faults,
            expected,
            detail,
        }
    }

    fn violations(
        &self,
        check: &CheckReport,
        obs: &Observed,
        events: &[Event],
        lost: &[LostIncrement],
        stale: &[LostIncrement],
    ) -> Vec<Violation> {
        let caps = self.caps;
        let mut out = Vec::new();
        let (overlaps, incomplete) = all_overlaps(events);
        for (a, b) in &overlaps {
            // The second grant is the double grant: a fault must have
            // been active between the first grant and it.
            let cause = Cause {
                from: a.start,
                to: b.start,
                involved: vec![a.process, b.process],
                late_writers: Vec::new(),
            };
            out.push(self.violation(
                "overlap",
                a.start,
                a.end.min(b.end),
                &cause,
                format!(
                    "key {}: process {} (token {:?}) and process {} (token {:?})",
                    a.key, a.process, a.token, b.process, b.token
                ),
            ));
        }
        if incomplete {
            out.push(Violation {
                what: "overlap".into(),
                from_ms: 0,
                to_ms: 0,
                faults: Vec::new(),
                expected: false,
                detail: format!(
                    "{} overlapping pairs counted, {} attributed before giving up",
                    check.overlap_count,
                    overlaps.len()
                ),
            });
        }
        let late_write = |l: &LostIncrement| {
            let mut writers = l.overwritten.clone();
            writers.push(l.writer);
            Cause {
                from: l.grant_at,
                to: l.newer_grant_at.unwrap_or(l.write_at),
                involved: writers.clone(),
                late_writers: writers,
            }
        };
        for l in lost {
            out.push(self.violation(
                "lost_update",
                l.grant_at,
                l.write_at,
                &late_write(l),
                format!("key {}: {} increment(s) overwritten", l.key, l.lost),
            ));
        }
        for l in stale {
            out.push(self.violation(
                "stale_write",
                l.grant_at,
                l.write_at,
                &late_write(l),
                format!(
                    "key {}: a write from the grant at {} ms got in after a later grant's write",
                    l.key,
                    ms(l.grant_at)
                ),
            ));
        }
        if caps.has_fencing() {
            // Each step down between consecutive grants of a key is one
            // event (after a reset every later grant is below the old
            // highest, which the checker counts; one event per reset is
            // enough to judge it, and every step down is seen).
            let mut previous: HashMap<&str, (u64, Duration)> = HashMap::new();
            for (key, at, token) in &obs.tokens {
                if let Some(&(p, p_at)) = previous.get(key.as_str())
                    && *token <= p
                {
                    let what = if *token == p {
                        "duplicate_token"
                    } else {
                        "token_regression"
                    };
                    let cause = Cause {
                        from: p_at,
                        to: *at,
                        involved: Vec::new(),
                        late_writers: Vec::new(),
                    };
                    out.push(self.violation(
                        what,
                        p_at,
                        *at,
                        &cause,
                        format!("key {key}: token {token} after {p}"),
                    ));
                }
                previous.insert(key.as_str(), (*token, *at));
            }
        }
        // The checker's counts the soak cannot tie to events: any of them
        // fails the run, unless every event-level violation was expected
        // and there is at least one (then they are the same fault's work).
        let tied_expected = !out.is_empty() && out.iter().all(|v| v.expected);
        for (what, count) in [
            (
                "stale_write",
                check.stale_writes_accepted.saturating_sub(stale.len()),
            ),
            ("grant_past_deadline", check.grants_past_deadline),
        ] {
            if count > 0 {
                let expected = what == "stale_write" && (tied_expected || self.stale_expected());
                out.push(Violation {
                    what: what.into(),
                    from_ms: 0,
                    to_ms: 0,
                    faults: Vec::new(),
                    expected,
                    detail: format!("{count} found by the history checker"),
                });
            }
        }
        out
    }

    /// Stale writes are expected when the backend has no fencing and the
    /// nemesis froze clients (the only way a late write gets in then).
    fn stale_expected(&self) -> bool {
        !self.caps.has_fencing()
            && self
                .injected
                .iter()
                .any(|f| known_unsafe(f.kind, self.caps).is_some())
    }
}

#[cfg(test)]
mod tests;
