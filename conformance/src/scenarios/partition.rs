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
        let target = |open| {
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

/// [`holder_cut_off`] on `env` whose holder is broken (told of its loss
/// too late, e.g. [`crate::doubles::HourLongerLeases`]): panics unless the
/// check catches it, by another client's grant before the holder was told.
pub async fn assert_told_too_late_caught(env: &PartitionEnv, label: &str) {
    let report = holder_cut_off(env).await;
    eprintln!(
        "{label} (broken holder): {:?}: {}",
        report.verdict, report.detail
    );
    assert_eq!(
        report.verdict,
        Verdict::Violation,
        "{label}: {}",
        report.detail
    );
    // Caught for the right reason: the grant came first, not an error.
    assert!(report.detail.contains("granted"), "{}", report.detail);
}

/// Runs `make()` to the end on a thread inside `ns`, on a runtime of its
/// own (its workers are in the namespace too); its output comes back
/// through the returned channel.
fn run_in<F, Fut, T>(ns: &Namespace, make: F) -> oneshot::Receiver<Result<T, String>>
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

async fn received<T>(rx: oneshot::Receiver<Result<T, String>>, what: &str) -> Result<T, String> {
    rx.await.map_err(|_| {
        format!("the {what} thread ended without an answer (namespace not entered?)")
    })?
}

/// The holder takes the key and keeps it (renewed) for half a TTL; then its
/// host is cut off, both ways, in the kernel. The
/// observer, through the other link, waits for the key. Judged: the
/// holder's lost signal must fire no later than the observer's grant (the
/// margin, server free time minus the holder's Lost time, is the figure
/// `lost_before_grant_ms`), and the key must be freed at all.
pub async fn holder_cut_off(env: &PartitionEnv) -> ScenarioReport {
    finish(holder_cut_off_inner(env).await)
}

async fn holder_cut_off_inner(env: &PartitionEnv) -> Result<ScenarioReport, String> {
    let key = key("cut-off");
    let ttl = env.ttl;
    let (cut_tx, cut_rx) = oneshot::channel::<()>();
    let (held_tx, held_rx) = oneshot::channel::<Result<(), String>>();
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
        let lost_at = tokio::time::timeout(bound, guard.lost())
            .await
            .map(|_reason| Instant::now())
            .map_err(|_| format!("the cut-off holder was not told within {bound:?}"));
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
        let lease = observer
            .acquire(&observer_key, ttl, cut_at + bound)
            .await
            .map_err(|e| {
                format!("the cut-off holder's lock was not freed within {bound:?}: {e}")
            })?;
        let at = Instant::now();
        let _ = observer.release(&lease).await;
        Ok(at)
    });
    ready_rx
        .await
        .map_err(|_| "the observer thread ended early".to_owned())??;
    // Renewals run for a while before the cut.
    sleep(ttl / 2).await;
    env.lab
        .isolate(HOLDER_HOST)
        .map_err(|e| format!("cutting the holder off: {e}"))?;
    let cut_at = Instant::now();
    let _ = cut_tx.send(());
    let _ = start_tx.send(cut_at);
    let granted = received(granted, "observer").await;
    // The holder must have been told by the grant; past it, a little
    // patience for the report's figure, not for the verdict.
    let lost = tokio::time::timeout(Duration::from_secs(2), received(lost, "holder")).await;
    let healed = env.lab.heal();
    let granted_at = granted?;
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
