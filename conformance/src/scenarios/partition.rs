//! A holder cut off by a real partition, in the kernel (see
//! [`lock_testkit::netns`]): the holder's client runs in one network
//! namespace, another client in a second one, the server in a third; the
//! holder's link is cut by dropping its packets both ways. Unlike the
//! proxy's partition, the server's TCP sees what a network failure does:
//! keep-alive probes unanswered, retransmissions lost. Whatever the
//! server's own liveness checks do with that (PostgreSQL's keep-alive and
//! `idle_session_timeout`, MariaDB's `wait_timeout`, ZooKeeper's session
//! timeout, etcd's lease) must not free the lock before the holder's
//! deadline, which is when its lost signal fires.
//!
//! Each driver's `tests/partition.rs` runs [`holder_cut_off`] on its
//! servers placed on lab hosts by the test kit (`start_in`). Beyond the
//! default ones (PostgreSQL session mode, etcd), those tests run only with
//! `DISTLOCK_PARTITIONS=all` ([`all_partitions_selected`]): each takes a
//! lab, a server and a TTL or two.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lock_core::LockBackendExt;
use lock_core::LockClient;
use lock_testkit::HarnessError;
use lock_testkit::netns::{Lab, Namespace};

/// The host of a [`PartitionEnv`]'s lab whose client is cut off.
pub const HOLDER_HOST: &str = "holder";
/// The host of a [`PartitionEnv`]'s lab whose client stays connected.
pub const OBSERVER_HOST: &str = "observer";
use serde_json::json;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::*;

/// What [`holder_cut_off`] runs against: a server (or cluster) on hosts of
/// `lab`, reached by `holder`'s clients from the lab's [`HOLDER_HOST`] and
/// by `observer`'s from its [`OBSERVER_HOST`].
#[derive(Clone)]
pub struct PartitionEnv {
    /// The hosts, with [`HOLDER_HOST`] and [`OBSERVER_HOST`] among them.
    pub lab: Arc<Lab>,
    /// The holder's clients; each is made (and does all its I/O) on a
    /// thread inside the holder's namespace.
    pub holder: Arc<dyn Target>,
    /// The observer's clients, made inside the observer's namespace.
    pub observer: Arc<dyn Target>,
    /// The lease TTL.
    pub ttl: Duration,
    /// Whether the observer opens a new client for each attempt after the
    /// cut (a process started after a failover, which finds the new
    /// master), rather than one client made before it.
    pub observer_fresh_clients: bool,
}

/// The environment variable that selects every partition test
/// ([`all_partitions_selected`]).
pub const PARTITIONS_VAR: &str = "DISTLOCK_PARTITIONS";

/// Whether `DISTLOCK_PARTITIONS=all` selects every partition test; when it
/// does not, prints `skipped: set DISTLOCK_PARTITIONS=all` (and the test
/// returns).
pub fn all_partitions_selected() -> bool {
    let selected = std::env::var(PARTITIONS_VAR).is_ok_and(|v| v == "all");
    if !selected {
        eprintln!("skipped: set {PARTITIONS_VAR}=all");
    }
    selected
}

impl PartitionEnv {
    /// A lab with a host per name in `servers` (for the servers the test
    /// kit's `start_in` puts there), then [`HOLDER_HOST`] and
    /// [`OBSERVER_HOST`].
    ///
    /// # Errors
    ///
    /// As [`Lab::new`].
    pub fn lab(servers: &[&str]) -> Result<Arc<Lab>, HarnessError> {
        let mut hosts = servers.to_vec();
        hosts.extend([HOLDER_HOST, OBSERVER_HOST]);
        Ok(Arc::new(Lab::new(&hosts)?))
    }

    /// Holder and observer clients opened on `url` (the holder's with
    /// `holder`, the observer's with `observer`), named `name` in reports.
    pub fn on_url(
        lab: Arc<Lab>,
        name: &str,
        url: &str,
        holder: crate::deploy::Opener,
        observer: crate::deploy::Opener,
        ttl: Duration,
    ) -> Self {
        Self::on_urls(lab, name, (url, holder), (url, observer), ttl)
    }

    /// A cluster whose members answer clients at `addresses`: the holder
    /// attached to member `attached` only (`None`: to every member), the
    /// observer to every other member; `url_of` makes a URL from a list of
    /// addresses. Both open clients with `open`.
    pub fn attached_to(
        lab: Arc<Lab>,
        name: &str,
        addresses: &[String],
        attached: Option<usize>,
        url_of: impl Fn(&[String]) -> String,
        open: crate::deploy::Opener,
        ttl: Duration,
    ) -> Self {
        let holder_url = match attached {
            Some(i) => url_of(&addresses[i..=i]),
            None => url_of(addresses),
        };
        let others: Vec<String> = (0..addresses.len())
            .filter(|i| Some(*i) != attached)
            .map(|i| addresses[i].clone())
            .collect();
        let observer_url = url_of(&others);
        Self::on_urls(
            lab,
            name,
            (&holder_url, open.clone()),
            (&observer_url, open),
            ttl,
        )
    }

    /// As [`on_url`](Self::on_url) with a URL of its own for the holder and
    /// for the observer (a holder attached to one member of a cluster).
    pub fn on_urls(
        lab: Arc<Lab>,
        name: &str,
        holder: (&str, crate::deploy::Opener),
        observer: (&str, crate::deploy::Opener),
        ttl: Duration,
    ) -> Self {
        let target = |(url, open): (&str, crate::deploy::Opener)| {
            Arc::new(crate::UrlTarget {
                name: name.to_owned(),
                url: url.to_owned(),
                open,
            }) as Arc<dyn Target>
        };
        Self {
            lab,
            holder: target(holder),
            observer: target(observer),
            ttl,
            observer_fresh_clients: false,
        }
    }
}

/// [`holder_cut_off`] on `env`, printed under `label` (verdict, detail and
/// figures); panics unless it is [`Verdict::Safe`].
pub async fn assert_cut_off_safe(env: &PartitionEnv, label: &str) -> ScenarioReport {
    let report = holder_cut_off(env).await;
    eprintln!(
        "{label}: {:?}: {}: {:?}",
        report.verdict, report.detail, report.figures
    );
    assert_eq!(report.verdict, Verdict::Safe, "{label}: {}", report.detail);
    report
}

/// [`holder_under_cut`] on `env` with `cut`, printed under `label`; panics
/// unless it is [`Verdict::Safe`].
pub async fn assert_under_cut_safe(env: &PartitionEnv, cut: &Cut, label: &str) -> ScenarioReport {
    let report = holder_under_cut(env, cut).await;
    eprintln!(
        "{label}: {:?}: {}: {:?}",
        report.verdict, report.detail, report.figures
    );
    assert_eq!(report.verdict, Verdict::Safe, "{label}: {}", report.detail);
    report
}

/// The clustered backends' [`ClusterCut`] test, skipped unless
/// [`all_partitions_selected`]: `start(which)` starts a cluster of
/// `members` on lab hosts and attaches the holder as
/// [`which.attach`](ClusterCut::attach) says, returning the env, what must
/// live through the scenario (the server) and the holder's member (`None`
/// from `start`: skipped); then [`assert_under_cut_safe`] with
/// [`which.cut`](ClusterCut::cut), printed under `label`. Returns the
/// report, the env (its lab's hosts live as long as it does) and what
/// `start` kept, or `None` when skipped.
pub async fn assert_cluster_cut_safe<S, Fut>(
    which: ClusterCut,
    members: &[&str],
    label: &str,
    start: impl FnOnce(ClusterCut) -> Fut,
) -> Option<(ScenarioReport, PartitionEnv, S)>
where
    Fut: Future<Output = Option<(PartitionEnv, S, Option<usize>)>>,
{
    if !all_partitions_selected() {
        return None;
    }
    let (env, kept, attached) = start(which).await?;
    let report = assert_under_cut_safe(&env, &which.cut(members, attached), label).await;
    Some((report, env, kept))
}

/// [`holder_cut_off`] on `env` whose holder is broken (told of its loss
/// too late, e.g. [`crate::doubles::HourLongerLeases`]): panics unless the
/// check catches it, by another client's grant before the holder was told.
pub async fn assert_told_too_late_caught(env: &PartitionEnv, label: &str) {
    let report = holder_cut_off(env).await;
    eprintln!(
        "{label} (broken holder): {:?}: {}",
        report.verdict, report.detail
    );
    assert_caught(&report, label);
}

/// Panics unless `report` is a [`Verdict::Violation`] caught for the right
/// reason: another client's grant came first (not an error).
pub fn assert_caught(report: &ScenarioReport, label: &str) {
    assert_eq!(
        report.verdict,
        Verdict::Violation,
        "{label}: {}",
        report.detail
    );
    assert!(report.detail.contains("granted"), "{}", report.detail);
}

/// Runs `make()` to the end on a thread inside `ns`, on a runtime of its
/// own (its workers are in the namespace too); its output comes back
/// through the returned channel.
pub(crate) fn run_in<F, Fut, T>(ns: &Namespace, make: F) -> oneshot::Receiver<Result<T, String>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, String>>,
    T: Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let _detached = ns.spawn(move || {
        let result = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
        {
            Ok(runtime) => {
                let out = runtime.block_on(make());
                runtime.shutdown_timeout(Duration::from_secs(1));
                out
            }
            Err(e) => Err(format!("runtime: {e}")),
        };
        let _ = tx.send(result);
    });
    rx
}

/// How the observer's failed wait begins.
const NOT_FREED: &str = "the cut-off holder's lock was not freed";

pub(crate) async fn received<T>(
    rx: oneshot::Receiver<Result<T, String>>,
    what: &str,
) -> Result<T, String> {
    rx.await.map_err(|_| {
        format!("the {what} thread ended without an answer (namespace not entered?)")
    })?
}

/// Finds the client port of the holder's connection that holds its lock,
/// once the holder is granted (from the server's view of its sessions,
/// for example), for [`Cut::HolderConnection`].
#[derive(Clone)]
#[allow(clippy::type_complexity)]
pub struct Locate(
    pub  Arc<
        dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = Result<u16, String>> + Send>>
            + Send
            + Sync,
    >,
);

impl std::fmt::Debug for Locate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Locate(..)")
    }
}

/// Which links a partition scenario cuts, half a TTL after the holder's
/// grant.
#[derive(Clone, Debug)]
pub enum Cut {
    /// One connection of the holder's: the one `locate` finds, to `port`
    /// of host `server`; the holder's other connections (its pool's)
    /// stay up.
    HolderConnection {
        /// The server's host.
        server: String,
        /// The server's port.
        port: u16,
        /// Finds the holder's end of the connection.
        locate: Locate,
    },
    /// The holder's host from every other host: the lock must be freed,
    /// and the holder told first ([`holder_cut_off`]).
    HolderIsolated,
    /// The holder's host from these server hosts (members of a cluster);
    /// the other links stay up. A client that fails over may keep its
    /// lock.
    HolderFrom(Vec<String>),
    /// A server host (member) from the other server hosts (its peers); the
    /// clients still reach every member. A holder attached to the cut
    /// member must not keep its lock on the strength of the member's stale
    /// state.
    MemberFromPeers {
        /// The member cut.
        member: String,
        /// The members it is cut from.
        peers: Vec<String>,
    },
}

impl Cut {
    async fn apply(&self, lab: &Lab) -> Result<(), String> {
        let done = match self {
            Self::HolderConnection {
                server,
                port,
                locate,
            } => {
                let client_port = (locate.0)().await?;
                lab.cut_connection(HOLDER_HOST, client_port, server, *port)
            }
            Self::HolderIsolated => lab.isolate(HOLDER_HOST),
            Self::HolderFrom(servers) => {
                let servers: Vec<&str> = servers.iter().map(String::as_str).collect();
                lab.cut_from(HOLDER_HOST, &servers)
            }
            Self::MemberFromPeers { member, peers } => {
                let peers: Vec<&str> = peers.iter().map(String::as_str).collect();
                lab.cut_from(member, &peers)
            }
        };
        done.map_err(|e| e.to_string())
    }

    /// `members[member]` cut from every other of `members`.
    pub fn member_from_peers(members: &[&str], member: usize) -> Self {
        Self::MemberFromPeers {
            member: members[member].to_owned(),
            peers: members
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != member)
                .map(|(_, m)| (*m).to_owned())
                .collect(),
        }
    }

    /// Whether the cut must end in the lock's release: only when the
    /// holder can reach no server at all.
    fn must_free(&self) -> bool {
        matches!(self, Self::HolderIsolated)
    }
}

/// The cuts every clustered backend's `tests/partition.rs` runs on a
/// cluster on lab hosts (behind [`all_partitions_selected`]): the holder
/// attached to one member that is cut from its peers (the leader, or a
/// follower), or attached to every member and cut from all but the last.
/// Each driver starts its cluster and attaches the holder where
/// [`attach`](Self::attach) says, then runs [`cut`](Self::cut) with
/// [`assert_under_cut_safe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterCut {
    /// The leader cut from its peers; the holder attached to it only.
    LeaderFromPeers,
    /// A follower (the member after the leader) cut from its peers; the
    /// holder attached to it only.
    FollowerFromPeers,
    /// The holder cut from every member but the last; the members still
    /// reach one another, so a client that fails over may keep its lock.
    HolderFromAllButOne,
}

impl ClusterCut {
    /// The index of the member the holder is attached to, given the
    /// leader's among `members` members; `None`: every member.
    pub fn attach(self, leader: usize, members: usize) -> Option<usize> {
        match self {
            Self::LeaderFromPeers => Some(leader),
            Self::FollowerFromPeers => Some((leader + 1) % members),
            Self::HolderFromAllButOne => None,
        }
    }

    /// The cut among `members`, the holder being attached where
    /// [`attach`](Self::attach) said (`attached`).
    ///
    /// # Panics
    ///
    /// A member cut from its peers without `attached` (the driver did not
    /// attach the holder as told).
    pub fn cut(self, members: &[&str], attached: Option<usize>) -> Cut {
        match self {
            Self::LeaderFromPeers | Self::FollowerFromPeers => {
                let member = attached.expect("the holder is attached to the member cut");
                Cut::member_from_peers(members, member)
            }
            Self::HolderFromAllButOne => Cut::HolderFrom(
                members[..members.len().saturating_sub(1)]
                    .iter()
                    .map(|m| (*m).to_owned())
                    .collect(),
            ),
        }
    }
}

/// The holder takes the key and keeps it (renewed) for half a TTL; then its
/// host is cut off, both ways, in the kernel. The
/// observer, through the other link, waits for the key. Judged: the
/// holder's lost signal must fire no later than the observer's grant (the
/// margin, server free time minus the holder's Lost time, is the figure
/// `lost_before_grant_ms`), and the key must be freed at all.
pub async fn holder_cut_off(env: &PartitionEnv) -> ScenarioReport {
    finish(holder_under_cut_inner(env, &Cut::HolderIsolated).await)
}

/// As [`holder_cut_off`] with any [`Cut`]. When the cut leaves the holder
/// a way to its servers, the observer's wait may end without the key (the
/// holder kept it, told of no loss): safe. Judged in every case: a grant
/// to the observer before the holder's lost signal is a violation; a
/// holder told it lost a key that was then not freed within the bound is
/// a failure.
pub async fn holder_under_cut(env: &PartitionEnv, cut: &Cut) -> ScenarioReport {
    finish(holder_under_cut_inner(env, cut).await)
}

async fn holder_under_cut_inner(env: &PartitionEnv, cut: &Cut) -> Result<ScenarioReport, String> {
    let key = key("cut-off");
    let ttl = env.ttl;
    let (cut_tx, cut_rx) = oneshot::channel::<()>();
    let (held_tx, held_rx) = oneshot::channel::<Result<(), String>>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let holder_target = env.holder.clone();
    let holder_key = key.clone();
    let lost = run_in(env.lab.host(HOLDER_HOST).netns(), move || async move {
        let acquired = async {
            let backend = holder_target
                .client()
                .await
                .map_err(|e| format!("holder client: {e}"))?;
            LockClient::from_arc(backend)
                .lock(holder_key.as_str())
                .ttl(ttl)
                .acquire()
                .await
                .map_err(|e| format!("holder acquire: {e}"))
        }
        .await;
        let guard = match acquired {
            Ok(guard) => {
                let _ = held_tx.send(Ok(()));
                guard
            }
            Err(e) => {
                let _ = held_tx.send(Err(e.clone()));
                return Err(e);
            }
        };
        let _ = cut_rx.await;
        let bound = ttl * 4 + Duration::from_secs(30);
        let lost_at = tokio::select! {
            lost = tokio::time::timeout(bound, guard.lost()) => lost
                .map(|_reason| Instant::now())
                .map_err(|_| format!("the cut-off holder was not told within {bound:?}")),
            _ = stop_rx => {
                // Kept through the cut (after the heal): released.
                let _ = tokio::time::timeout(ttl, guard.release()).await;
                return Err("kept".to_owned());
            }
        };
        // Its release cannot get through; it must not hold the thread.
        std::mem::forget(guard);
        lost_at
    });
    held_rx
        .await
        .map_err(|_| "the holder thread ended early".to_owned())??;
    // The observer's client is made, and makes its calls, on its own
    // namespace's runtime: it waits there for the cut, then for the key.
    let observer_target = env.observer.clone();
    let (ready_tx, ready_rx) = oneshot::channel::<Result<(), String>>();
    let (start_tx, start_rx) = oneshot::channel::<Instant>();
    let observer_key = key.clone();
    let fresh_clients = env.observer_fresh_clients;
    let granted = run_in(env.lab.host(OBSERVER_HOST).netns(), move || async move {
        let observer = match observer_target.client().await {
            Ok(observer) => {
                let _ = ready_tx.send(Ok(()));
                observer
            }
            Err(e) => {
                let _ = ready_tx.send(Err(format!("observer client: {e}")));
                return Err(format!("observer client: {e}"));
            }
        };
        let cut_at = start_rx
            .await
            .map_err(|_| "the scenario ended before the cut".to_owned())?;
        let bound = match observer.capabilities().ttl_model {
            TtlModel::PerLease => ttl * 2 + Duration::from_secs(5),
            _ => ttl * 2 + Duration::from_secs(30),
        };
        // As a user would: errors before the deadline (an election under
        // way, a member unreachable, an operation's own timeout) are
        // retried until it.
        let deadline = cut_at + bound;
        let mut errors = Vec::new();
        let mut observer = observer;
        let lease = loop {
            // A fresh process after the cut: a new client per attempt, one
            // second each.
            let until = if fresh_clients {
                match observer_target.client().await {
                    Ok(fresh) => observer = fresh,
                    Err(e) => errors.push(format!("observer client: {e}")),
                }
                deadline.min(Instant::now() + Duration::from_secs(1))
            } else {
                deadline
            };
            match observer.acquire(&observer_key, ttl, until).await {
                Ok(lease) => break lease,
                Err(e) if Instant::now() >= deadline => {
                    errors.dedup();
                    return Err(format!(
                        "{NOT_FREED} within {bound:?}: {e} (errors before: {errors:?})"
                    ));
                }
                Err(e) => {
                    errors.push(e.to_string());
                    sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let at = Instant::now();
        let _ = observer.release(&lease).await;
        Ok(at)
    });
    ready_rx
        .await
        .map_err(|_| "the observer thread ended early".to_owned())??;
    // Renewals run for a while before the cut.
    sleep(ttl / 2).await;
    cut.apply(&env.lab)
        .await
        .map_err(|e| format!("cutting {cut:?}: {e}"))?;
    let cut_at = Instant::now();
    let _ = cut_tx.send(());
    let _ = start_tx.send(cut_at);
    let granted = received(granted, "observer").await;
    // The holder must have been told by the grant; past it, a little
    // patience for the report's figure, not for the verdict.
    let lost = tokio::time::timeout(Duration::from_secs(2), received(lost, "holder")).await;
    let healed = env.lab.heal();
    let _ = stop_tx.send(());
    let granted_at = match granted {
        Ok(at) => at,
        Err(e) if !cut.must_free() && e.starts_with(NOT_FREED) => {
            healed.map_err(|e| format!("healing: {e}"))?;
            let mut figures = BTreeMap::new();
            figures.insert("ttl_ms".into(), ms(ttl));
            return match lost {
                Err(_) => Ok(ScenarioReport::judged(
                    false,
                    false,
                    format!(
                        "the holder kept its lock through the cut ({cut:?}): no loss, no grant ({e})"
                    ),
                    figures,
                )),
                Ok(lost) => Err(format!(
                    "the holder was told it lost the key ({:?} after the cut) but the key was not freed: {e}",
                    lost.map(|at| at - cut_at)
                )),
            };
        }
        Err(e) => return Err(e),
    };
    healed.map_err(|e| format!("healing the holder's link: {e}"))?;
    let Ok(lost) = lost else {
        let mut figures = BTreeMap::new();
        figures.insert("time_to_free_ms".into(), ms(granted_at - cut_at));
        figures.insert("ttl_ms".into(), ms(ttl));
        return Ok(ScenarioReport::judged(
            false,
            true,
            format!(
                "another client was granted {:?} after the cut while the cut-off holder was still not told 2 s later",
                granted_at - cut_at
            ),
            figures,
        ));
    };
    let lost_at = lost?;
    let violated = granted_at < lost_at;
    let margin_ms = if violated {
        -((lost_at - granted_at).as_secs_f64() * 1e3)
    } else {
        (granted_at - lost_at).as_secs_f64() * 1e3
    };
    let mut figures = BTreeMap::new();
    figures.insert("lost_signal_latency_ms".into(), ms(lost_at - cut_at));
    figures.insert("time_to_free_ms".into(), ms(granted_at - cut_at));
    figures.insert("lost_before_grant_ms".into(), json!(margin_ms));
    figures.insert("ttl_ms".into(), ms(ttl));
    Ok(ScenarioReport::judged(
        false,
        violated,
        if violated {
            format!(
                "another client was granted {:?} BEFORE the cut-off holder was told (cut {:?} before the grant)",
                lost_at - granted_at,
                granted_at - cut_at
            )
        } else {
            format!(
                "lost signal {:?} after the cut, {:?} before another client was granted",
                lost_at - cut_at,
                granted_at - lost_at
            )
        },
        figures,
    ))
}
