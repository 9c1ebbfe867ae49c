//! The soak with its partitions cut in the kernel ([`run_soak_in_lab`]):
//! each worker's client lives on a host of a [`Lab`] of its own, in that
//! host's network namespace, and the partition faults drop packets there
//! instead of holding them in a userspace proxy.
//!
//! A proxy's own sockets answer the server's keep-alive probes and its
//! connections end cleanly; a cut in the kernel leaves the server's TCP
//! facing silence, as a real network failure does, so whatever the server
//! does about a silent client (PostgreSQL's keep-alives, MariaDB's
//! `wait_timeout`, ZooKeeper's session timeout, etcd's lease) happens
//! during the run, and the checker judges the outcome. What each fault
//! does in the lab:
//!
//! - [`FaultKind::ClientPartition`]: the worker's host is isolated
//!   ([`Lab::isolate`]): every packet between it and any other host is
//!   dropped, both ways.
//! - [`FaultKind::MemberPartition`]: one member's host is cut from the
//!   other members' ([`Lab::cut_from`]); the workers still reach it. On a
//!   deployment with a primary its peers watch
//!   ([`Target::primary_member`]: Redis Sentinel), the current primary is
//!   the one cut (the master from its replica and the sentinels), and the
//!   fault lasts until the deployment has settled after the heal
//!   ([`Target::restart_nodes`]: the sentinels demote the old master 8 s
//!   after it returns, and until then it serves the clients still
//!   connected to it).
//! - [`FaultKind::MemberClientPartition`]: the last worker, whose client
//!   knows one member only, is cut from that member's host.
//!
//! Each is healed ([`Lab::heal`]) at the end of its duration (the
//! nemesis's lane runs one fault at a time). Holds shorter than a
//! quarter TTL end (with a release, which closes the holder's window)
//! long before any server frees a cut-off holder's lock: set
//! [`SoakConfig::long_hold_every`] so that some holds span renewals and a
//! cut tests the lost signal. Client latency is not
//! injected: it needs a proxy in the worker's path (this kernel has no
//! `netem`), and a proxy there would answer for a cut-off worker. The
//! other kinds (freezes, server pauses, restarts, leader and node kills)
//! act as in [`run_soak`].

use std::sync::Arc;

use lock_core::{Capabilities, LockBackend, LockError};
use lock_testkit::netns::Lab;
use tokio::sync::oneshot;

use super::*;
use crate::harness::Target;
use crate::scenarios::{received, run_in};

/// Why client latency is left out of a lab soak.
pub(super) const LATENCY_NOT_IN_LAB: &str = "kernel-partition soak: latency needs a userspace \
     proxy in the worker's path (no netem here), which would answer for a cut-off worker";

/// Where a kernel-partition soak runs: the lab whose hosts carry the
/// servers and the workers' clients. Build it from a deployment the test
/// kit started in a lab ([`SoakLab::from_hosts`]).
pub struct SoakLab {
    /// The lab.
    pub lab: Arc<Lab>,
    /// The servers' hosts, in member order.
    pub servers: Vec<String>,
    /// For a cluster whose members replicate to one another: per member,
    /// in the order of `servers`, a target whose clients reach that member
    /// alone. Empty otherwise (then there are no member faults).
    pub members: Vec<Arc<dyn Target>>,
    /// The workers' hosts: worker `i` runs on `clients[i]`, one host per
    /// worker, so that cutting a host cuts one worker.
    pub clients: Vec<String>,
}

impl std::fmt::Debug for SoakLab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoakLab")
            .field("servers", &self.servers)
            .field("members", &self.members.len())
            .field("clients", &self.clients)
            .finish_non_exhaustive()
    }
}

impl SoakLab {
    /// The soak's view of a deployment started by
    /// [`start_in_lab`](crate::deploy::start_in_lab), its member clients
    /// opened with `open` and named `name`.
    pub fn from_hosts(
        hosts: &crate::deploy::LabHosts,
        name: &str,
        open: &crate::deploy::Opener,
    ) -> Self {
        let members = hosts
            .member_urls
            .iter()
            .map(|url| {
                Arc::new(crate::UrlTarget {
                    name: name.to_owned(),
                    url: url.clone(),
                    open: open.clone(),
                }) as Arc<dyn Target>
            })
            .collect();
        Self {
            lab: hosts.lab.clone(),
            servers: hosts.servers.clone(),
            members,
            clients: hosts.clients.clone(),
        }
    }

    /// The backend's capabilities, from a client made on the first
    /// worker's host (no other namespace reaches the servers).
    pub(super) async fn capabilities(
        &self,
        target: &Arc<dyn Target>,
    ) -> Result<Capabilities, LockError> {
        let host = self.clients.first().ok_or_else(|| {
            LockError::config("a kernel-partition soak needs at least one client host")
        })?;
        let target = target.clone();
        let probe = run_in(self.lab.host(host).netns(), move || async move {
            Ok(target.client().await.map(|c| c.capabilities()))
        });
        received(probe, "capabilities probe")
            .await
            .map_err(LockError::config)?
    }

    /// Starts each worker of `setups` on a thread in its host's namespace,
    /// with a runtime of its own, where it makes its client (of `target`,
    /// or of its member for the worker `member` names) and then waits for
    /// the run's shared state. Returns once every client is made.
    ///
    /// # Errors
    ///
    /// The first client that cannot be made (the other workers then end
    /// without running).
    pub(super) async fn start_workers(
        &self,
        target: &Arc<dyn Target>,
        member: Option<(usize, usize)>,
        setups: Vec<WorkerSetup>,
    ) -> Result<Vec<LabWorker>, LockError> {
        if self.clients.len() < setups.len() {
            return Err(LockError::config(format!(
                "a kernel-partition soak of {} workers needs as many client hosts, not {}",
                setups.len(),
                self.clients.len()
            )));
        }
        let mut started = Vec::new();
        let mut ready = Vec::new();
        for setup in setups {
            let maker = match member {
                Some((worker, m)) if worker == setup.index => self.members[m].clone(),
                _ => target.clone(),
            };
            let (ready_tx, ready_rx) = oneshot::channel::<Result<(), LockError>>();
            let (start_tx, start_rx) = oneshot::channel::<Arc<Shared>>();
            let host = self.lab.host(&self.clients[setup.index]);
            let done = run_in(host.netns(), move || async move {
                let backend: Arc<dyn LockBackend> = match maker.client().await {
                    Ok(backend) => {
                        let _ = ready_tx.send(Ok(()));
                        backend
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return Ok(());
                    }
                };
                // No shared state: the run was abandoned.
                if let Ok(shared) = start_rx.await {
                    work(setup.with_client(backend), shared).await;
                }
                Ok(())
            });
            ready.push(ready_rx);
            started.push(LabWorker {
                start: start_tx,
                done,
            });
        }
        for rx in ready {
            match rx.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(LockError::config(
                        "a worker's thread ended before its client was made (namespace not entered?)",
                    ));
                }
            }
        }
        Ok(started)
    }

    /// Undoes every cut, off the async threads (`tc` runs as a process).
    pub(super) async fn heal(&self) -> Result<(), String> {
        let lab = self.lab.clone();
        tokio::task::spawn_blocking(move || lab.heal())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }
}

/// A worker running on a thread of its own in a lab host's namespace.
pub(super) struct LabWorker {
    /// Hands it the run's shared state: it starts working.
    pub(super) start: oneshot::Sender<Arc<Shared>>,
    /// Answers when it stopped.
    pub(super) done: oneshot::Receiver<Result<(), String>>,
}

/// The nemesis's partitions in a lab.
pub(super) struct LabFaults {
    pub(super) lab: Arc<SoakLab>,
    /// Workers in the run (each on its own host).
    pub(super) workers: usize,
    /// The worker attached to a single member, and that member.
    pub(super) member_worker: Option<(usize, usize)>,
    /// Whether a member partition cuts the deployment's current primary
    /// ([`Target::primary_member`]: a Sentinel master from its replica and
    /// sentinels) rather than any member, and lasts until the deployment
    /// has recovered ([`Target::restart_nodes`]).
    pub(super) primary_cut: bool,
}

impl LabFaults {
    /// Whether `kind` is cut in the lab.
    pub(super) fn cuts(&self, kind: FaultKind) -> bool {
        matches!(
            kind,
            FaultKind::ClientPartition
                | FaultKind::MemberPartition
                | FaultKind::MemberClientPartition
        )
    }

    /// Cuts what `fault` says for its duration, then heals; returns the
    /// worker or member cut (`None` when nothing was injected, with the
    /// reason in the nemesis's errors).
    pub(super) async fn cut(&self, nemesis: &Nemesis, fault: &PlannedFault) -> Option<usize> {
        let pick = |n: usize| {
            let n = u64::try_from(n.max(1)).unwrap_or(1);
            usize::try_from(fault.target % n).unwrap_or(0)
        };
        let servers = &self.lab.servers;
        let (index, host, from) = match fault.kind {
            FaultKind::ClientPartition => {
                let worker = pick(self.workers);
                (worker, self.lab.clients[worker].clone(), None)
            }
            FaultKind::MemberPartition => {
                let member = if self.primary_cut {
                    match nemesis.target.primary_member().await {
                        Some(primary) if primary < servers.len() => primary,
                        _ => {
                            nemesis.error(fault.kind.as_str(), &"no primary member to cut");
                            return None;
                        }
                    }
                } else {
                    pick(servers.len())
                };
                let peers: Vec<String> = servers
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != member)
                    .map(|(_, h)| h.clone())
                    .collect();
                (member, servers[member].clone(), Some(peers))
            }
            FaultKind::MemberClientPartition => {
                let (worker, member) = self.member_worker?;
                (
                    worker,
                    self.lab.clients[worker].clone(),
                    Some(vec![servers[member].clone()]),
                )
            }
            _ => return None,
        };
        let lab = self.lab.lab.clone();
        let applied = tokio::task::spawn_blocking(move || match from {
            None => lab.isolate(&host),
            Some(peers) => {
                let peers: Vec<&str> = peers.iter().map(String::as_str).collect();
                lab.cut_from(&host, &peers)
            }
        })
        .await;
        let failed = match applied {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(e) = failed {
            nemesis.error(fault.kind.as_str(), &e);
            if let Err(e) = self.lab.heal().await {
                nemesis.error("lab heal", &e);
            }
            return None;
        }
        tokio::time::sleep(fault.duration).await;
        if let Err(e) = self.lab.heal().await {
            nemesis.error("lab heal", &e);
        }
        if self.primary_cut && fault.kind == FaultKind::MemberPartition {
            // A failover the cut caused goes on after the heal (the old
            // master serves its clients until the sentinels demote it):
            // the fault lasts until the deployment has settled.
            if let Err(e) = nemesis.target.restart_nodes().await {
                nemesis.error("member partition settle", &e);
            }
        }
        Some(index)
    }
}

/// Runs a soak whose workers' clients each live on a host of
/// `lab` (in its network namespace, on a runtime of their own) and whose
/// partitions are cut in the kernel (see the module docs); `target` is the
/// deployment on `lab`'s server hosts, for the server faults.
///
/// # Errors
///
/// As [`run_soak`]; also when the lab has fewer client hosts than the run
/// has workers.
///
/// # Cancel safety
///
/// Not cancel safe: a dropped run may leave a cut in place (a new
/// [`Lab::heal`] removes it) and workers running until the run's end.
pub async fn run_soak_in_lab(
    target: Arc<dyn Target>,
    lab: SoakLab,
    config: &SoakConfig,
) -> Result<SoakReport, LockError> {
    run(target, Network::Lab(Arc::new(lab)), config).await
}
