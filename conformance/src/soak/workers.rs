//! The clients and the nemesis of a soak run.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::{FencingToken, LockBackend, LockClient, LockError, LockKey};
use tokio::time::Instant;

use crate::harness::Target;
use crate::proxy::FaultProxy;

use super::*;

pub(super) struct Worker {
    pub(super) index: usize,
    pub(super) client: LockClient,
    pub(super) journal: Journal,
    pub(super) rng: SplitMix64,
    /// A freeze the nemesis asked for: applied at the next hold.
    pub(super) freeze: Arc<Mutex<Option<Duration>>>,
    pub(super) reach: Reach,
    /// The target's URL the client was made for.
    pub(super) url: Option<String>,
}

/// A worker before its client: everything but the client, so that the
/// client can be made where the worker runs (inside a lab host's network
/// namespace, for a kernel-partition soak).
pub(super) struct WorkerSetup {
    pub(super) index: usize,
    pub(super) journal: Journal,
    pub(super) rng: SplitMix64,
    pub(super) freeze: Arc<Mutex<Option<Duration>>>,
    pub(super) reach: Reach,
    pub(super) url: Option<String>,
}

impl WorkerSetup {
    /// The worker, with `backend` recorded into its journal.
    pub(super) fn with_client(self, backend: Arc<dyn LockBackend>) -> Worker {
        Worker {
            index: self.index,
            client: LockClient::from_arc(self.journal.backend(backend)),
            journal: self.journal,
            rng: self.rng,
            freeze: self.freeze,
            reach: self.reach,
            url: self.url,
        }
    }
}

/// How a worker reaches the backend (and so how it reconnects when a
/// failover moved the primary: clients made from then on talk to the new
/// one, as [`Target::fail_over`] says).
#[derive(Clone)]
pub(super) enum Reach {
    /// A plain client of the target.
    Direct,
    /// Through the target's TCP fault proxy (this link slot).
    Proxy(Link),
    /// Through an in-process link (this slot).
    InProcess(Link),
    /// Through a proxy in front of one member: never moves.
    Member,
}

/// A worker's fault link, replaced when the worker reconnects.
pub(super) type Link = Arc<Mutex<FaultProxy>>;

pub(super) fn with_link<T>(link: &Link, f: impl FnOnce(&FaultProxy) -> T) -> T {
    f(&link.lock().unwrap_or_else(PoisonError::into_inner))
}

/// A client for `reach`, replacing the link's proxy where it has one.
pub(super) async fn connect(
    target: &dyn Target,
    reach: &Reach,
) -> Result<Arc<dyn LockBackend>, LockError> {
    match reach {
        Reach::Direct | Reach::Member => target.client().await,
        Reach::Proxy(link) => match target.proxied_client().await {
            Ok(Some((client, proxy))) => {
                *link.lock().unwrap_or_else(PoisonError::into_inner) = proxy;
                Ok(client)
            }
            Ok(None) | Err(_) => Err(LockError::config("no proxied client")),
        },
        Reach::InProcess(link) => {
            let (client, proxy) =
                FaultProxy::in_process(target.client().await?, Duration::from_secs(1));
            *link.lock().unwrap_or_else(PoisonError::into_inner) = proxy;
            Ok(client)
        }
    }
}

pub(super) struct Shared {
    pub(super) target: Arc<dyn Target>,
    pub(super) keys: Vec<LockKey>,
    pub(super) ttl: Duration,
    /// See [`SoakConfig::long_hold_every`].
    pub(super) long_hold_every: u32,
    pub(super) end: Instant,
    pub(super) resource: Resource,
    /// The real fenced store, when the run has one and the backend has
    /// tokens.
    pub(super) store: Option<FenceStore>,
    /// One turn per key: a write goes to the store and to the resource
    /// in one step, so both see the writes of a key in the same order.
    pub(super) turns: HashMap<String, Arc<tokio::sync::Mutex<()>>>,
    pub(super) injected: Mutex<Vec<InjectedFault>>,
    pub(super) stop: AtomicBool,
}

impl Shared {
    /// Writes `read + 1` under `token`: to the real store first (if any),
    /// then to the resource, which compares the two verdicts.
    async fn write(
        &self,
        journal: &Journal,
        key: &LockKey,
        token: FencingToken,
        read: u64,
        grant_at: Duration,
    ) {
        let turn = self.turns.get(key.as_str()).cloned();
        let _turn = match &turn {
            Some(turn) => Some(turn.lock().await),
            None => None,
        };
        let store = match &self.store {
            Some(store) => Some(
                store
                    .0
                    .write(key.as_str(), token.get(), &(read + 1).to_string())
                    .await,
            ),
            None => None,
        };
        self.resource
            .write(journal, key, token, read, grant_at, store);
    }

    pub(super) fn push_fault(&self, fault: InjectedFault) {
        self.injected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(fault);
    }
}

pub(super) async fn work(mut w: Worker, shared: Arc<Shared>) {
    let ttl = shared.ttl;
    while Instant::now() < shared.end && !shared.stop.load(Ordering::Relaxed) {
        let url = shared.target.url();
        if url != w.url && !matches!(w.reach, Reach::Member) {
            // A failover moved the primary.
            if let Ok(backend) = connect(&*shared.target, &w.reach).await {
                w.client = LockClient::from_arc(w.journal.backend(backend));
                w.url = url;
            }
        }
        let key = shared.keys[w.rng.index(shared.keys.len())].clone();
        // Drawn only when asked for: runs without long holds replay the
        // same choices as before they existed.
        let long =
            shared.long_hold_every > 0 && w.rng.below(u64::from(shared.long_hold_every)) == 0;
        let hold = if long {
            w.rng.between(ttl, ttl * 3)
        } else {
            w.rng.between(Duration::ZERO, ttl / 4)
        };
        let backoff = w
            .rng
            .between(Duration::from_millis(5), Duration::from_millis(60));
        let freeze = w
            .freeze
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let mut request = w.client.lock(key.as_str()).ttl(ttl).wait(ttl * 2);
        if freeze.is_some() {
            // A paused process renews nothing.
            request = request.no_renewal();
        }
        // The acquire is bounded by its wait and the backend's timeouts;
        // this outer bound only keeps a wedged client from stalling the run.
        let guard = match tokio::time::timeout(ttl * 2 + Duration::from_secs(10), request.acquire())
            .await
        {
            Ok(Ok(guard)) => guard,
            Ok(Err(_)) | Err(_) => {
                if let Some(d) = freeze {
                    // Not holding: keep the freeze for the next grant.
                    *w.freeze.lock().unwrap_or_else(PoisonError::into_inner) = Some(d);
                }
                tokio::time::sleep(backoff).await;
                continue;
            }
        };
        let grant_at = w.journal.now();
        let watcher = w.journal.watch_lost(&guard);
        let token = guard.token();
        let read = if guard.is_held() {
            shared.resource.read(&key, token)
        } else {
            None
        };
        if read.is_none()
            && let Some(d) = freeze
        {
            // Not used: keep it for the next grant.
            *w.freeze.lock().unwrap_or_else(PoisonError::into_inner) = Some(d);
        }
        if let Some(read) = read {
            match freeze {
                Some(d) => {
                    let start = w.journal.now();
                    tokio::time::sleep(d).await;
                    shared.push_fault(InjectedFault {
                        kind: FaultKind::ClientFreeze,
                        target: w.index,
                        start,
                        end: w.journal.now(),
                    });
                    // Wakes and writes with the token it holds, without
                    // looking at the guard: what a paused process does.
                    shared.write(&w.journal, &key, token, read, grant_at).await;
                }
                None => {
                    tokio::time::sleep(hold).await;
                    if guard.is_held() {
                        shared.write(&w.journal, &key, token, read, grant_at).await;
                    }
                }
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), guard.release()).await;
        watcher.abort();
    }
}

// ---------------------------------------------------------------------
// The nemesis.

pub(super) struct Links {
    /// Worker links with faults (tcp proxies or in-process links).
    pub(super) workers: Vec<(usize, Link)>,
    /// The single-member worker's link.
    pub(super) member: Option<(usize, FaultProxy)>,
}

pub(super) struct Nemesis {
    pub(super) target: Arc<dyn Target>,
    pub(super) members: Option<Arc<dyn MemberFaults>>,
    pub(super) links: Links,
    /// In a kernel-partition soak: the partitions are cut in the lab.
    pub(super) lab: Option<LabFaults>,
    pub(super) partitionable: usize,
    pub(super) ttl: Duration,
    pub(super) errors: Mutex<Vec<String>>,
}

impl Nemesis {
    pub(super) fn error(&self, what: &str, e: &dyn std::fmt::Display) {
        self.errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(format!("{what}: {e}"));
    }

    /// Injects one fault; returns the target index and whether it was
    /// injected, after healing it.
    pub(super) async fn inject(
        &self,
        fault: &PlannedFault,
        clock: Instant,
    ) -> Option<InjectedFault> {
        let since = |t: Instant| t.saturating_duration_since(clock);
        let start = Instant::now();
        let pick = |n: usize| {
            let n = u64::try_from(n.max(1)).unwrap_or(1);
            usize::try_from(fault.target % n).unwrap_or(0)
        };
        if let Some(lab) = &self.lab
            && lab.cuts(fault.kind)
        {
            let target = lab.cut(self, fault).await?;
            return Some(InjectedFault {
                kind: fault.kind,
                target,
                start: since(start),
                end: since(Instant::now()),
            });
        }
        let target = match fault.kind {
            FaultKind::ClientLatency | FaultKind::ClientPartition => {
                let (index, link) = self.links.workers.get(pick(self.links.workers.len()))?;
                if fault.kind == FaultKind::ClientLatency {
                    let latency = (fault.duration * 2 / 3).min(self.ttl * 2);
                    with_link(link, |l| l.set_latency(latency, latency / 4));
                    tokio::time::sleep(fault.duration).await;
                    with_link(link, |l| l.set_latency(Duration::ZERO, Duration::ZERO));
                } else {
                    with_link(link, FaultProxy::partition);
                    tokio::time::sleep(fault.duration).await;
                    with_link(link, FaultProxy::heal);
                }
                *index
            }
            FaultKind::MemberClientPartition => {
                let (index, link) = self.links.member.as_ref()?;
                link.partition();
                tokio::time::sleep(fault.duration).await;
                link.heal();
                *index
            }
            FaultKind::MemberPartition => {
                let members = self.members.as_ref()?;
                let index = pick(self.partitionable);
                match members.partition_member(index).await {
                    Ok(true) => {}
                    Ok(false) => return None,
                    Err(e) => {
                        self.error("member partition", &e);
                        return None;
                    }
                }
                tokio::time::sleep(fault.duration).await;
                if let Err(e) = members.heal_member(index).await {
                    self.error("member heal", &e);
                }
                index
            }
            FaultKind::ServerPause => {
                match self.target.make_unreachable().await {
                    Ok(true) => {}
                    Ok(false) => return None,
                    Err(e) => {
                        self.error("server pause", &e);
                        let _ = self.target.heal().await;
                        return None;
                    }
                }
                tokio::time::sleep(fault.duration).await;
                if let Err(e) = self.target.heal().await {
                    self.error("server resume", &e);
                }
                0
            }
            FaultKind::ServerRestart => {
                match self.target.kill_and_restart_server().await {
                    Ok(true) => {}
                    Ok(false) => return None,
                    Err(e) => {
                        self.error("server restart", &e);
                        return None;
                    }
                }
                0
            }
            FaultKind::LeaderKill | FaultKind::NodeKill => {
                let done = if fault.kind == FaultKind::LeaderKill {
                    // Where replication is asynchronous, let the replica
                    // lag first (writes acknowledged by the primary only),
                    // as it does under load.
                    if matches!(self.target.hold_replication().await, Ok(true)) {
                        tokio::time::sleep(fault.duration / 2).await;
                    }
                    self.target.fail_over().await
                } else {
                    self.target.stop_nodes(1).await.map(|t| t.is_some())
                };
                match done {
                    Ok(true) => {}
                    Ok(false) => return None,
                    Err(e) => {
                        self.error(fault.kind.as_str(), &e);
                        if let Err(e) = self.target.restart_nodes().await {
                            self.error("restart nodes", &e);
                        }
                        return None;
                    }
                }
                tokio::time::sleep(fault.duration).await;
                if let Err(e) = self.target.restart_nodes().await {
                    self.error("restart nodes", &e);
                }
                0
            }
            FaultKind::ClientFreeze => return None,
        };
        Some(InjectedFault {
            kind: fault.kind,
            target,
            start: since(start),
            end: since(Instant::now()),
        })
    }
}

/// Which kinds apply to this target, by trying each once before the run
/// (those probe injections are not counted), and why the others do not.
pub(super) async fn applicable(
    target: &Arc<dyn Target>,
    network: &Network,
    errors: &mut Vec<String>,
) -> (Vec<FaultKind>, BTreeMap<String, String>) {
    let mut kinds = vec![FaultKind::ClientFreeze];
    let mut not = BTreeMap::new();
    let mut note = |k: FaultKind, why: &str| {
        not.insert(k.as_str().to_owned(), why.to_owned());
    };
    let members = match network {
        Network::Proxies(members) => {
            kinds.extend([FaultKind::ClientLatency, FaultKind::ClientPartition]);
            members.as_ref()
        }
        Network::Lab(_) => {
            kinds.push(FaultKind::ClientPartition);
            note(FaultKind::ClientLatency, LATENCY_NOT_IN_LAB);
            None
        }
    };
    match target.make_unreachable().await {
        Ok(true) => {
            if let Err(e) = target.heal().await {
                errors.push(format!("probe heal: {e}"));
            }
            kinds.push(FaultKind::ServerPause);
        }
        Ok(false) => note(FaultKind::ServerPause, "the target cannot pause its server"),
        Err(e) => note(FaultKind::ServerPause, &format!("probe failed: {e}")),
    }
    match target.kill_and_restart_server().await {
        Ok(true) => kinds.push(FaultKind::ServerRestart),
        Ok(false) => note(
            FaultKind::ServerRestart,
            "no server process to restart (embedded or external)",
        ),
        Err(e) => note(FaultKind::ServerRestart, &format!("probe failed: {e}")),
    }
    match target.fail_over().await {
        Ok(true) => {
            if let Err(e) = target.restart_nodes().await {
                errors.push(format!("probe restart nodes: {e}"));
            }
            kinds.push(FaultKind::LeaderKill);
        }
        Ok(false) => note(FaultKind::LeaderKill, "no leader or primary to kill"),
        Err(e) => {
            let _ = target.restart_nodes().await;
            note(FaultKind::LeaderKill, &format!("probe failed: {e}"));
        }
    }
    if target.cluster_size().is_some() && !kinds.contains(&FaultKind::LeaderKill) {
        kinds.push(FaultKind::NodeKill);
    } else {
        note(
            FaultKind::NodeKill,
            if target.cluster_size().is_some() {
                "covered by leader_kill (the leader is the node killed first)"
            } else {
                "not a quorum deployment"
            },
        );
    }
    if let Network::Lab(lab) = network {
        if lab.members.len() > 1 {
            kinds.extend([FaultKind::MemberPartition, FaultKind::MemberClientPartition]);
        } else if lab.servers.len() > 1 && target.primary_member().await.is_some() {
            kinds.push(FaultKind::MemberPartition);
            note(
                FaultKind::MemberClientPartition,
                "clients find the primary through the deployment (Sentinel): none is pinned to one member",
            );
        } else {
            for k in [FaultKind::MemberPartition, FaultKind::MemberClientPartition] {
                note(k, "not a cluster whose members replicate to one another");
            }
        }
        return (kinds, not);
    }
    match members {
        Some(m) => {
            if m.partitionable_members().await > 1 {
                kinds.push(FaultKind::MemberPartition);
            } else {
                note(
                    FaultKind::MemberPartition,
                    "the deployment has no peer proxies",
                );
            }
            if m.members().await > 1 {
                kinds.push(FaultKind::MemberClientPartition);
            } else {
                note(
                    FaultKind::MemberClientPartition,
                    "not a multi-member deployment",
                );
            }
        }
        None => {
            note(FaultKind::MemberPartition, "not a multi-member deployment");
            note(
                FaultKind::MemberClientPartition,
                "not a multi-member deployment",
            );
        }
    }
    (kinds, not)
}
