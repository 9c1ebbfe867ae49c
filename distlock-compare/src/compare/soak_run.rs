//! `distlock-compare compare --soak`: the randomized fault soak per backend.

use std::sync::Arc;
use std::time::Duration;

use conformance::deploy::{self, DeployedTarget};
use conformance::{HarnessError, Target};
use lock_core::LockError;
use serde::Serialize;
use serde_json::{Value, json};

use super::*;

/// One backend's soak outcome (`distlock-compare compare --soak`).
#[derive(Debug, Serialize)]
pub(crate) struct SoakResult {
    pub(crate) name: String,
    pub(crate) report: Option<conformance::soak::SoakReport>,
    /// Why the backend could not be soaked (not installed, ...).
    pub(crate) error: Option<String>,
}

impl SoakResult {
    /// A violation the backend promises to avoid.
    pub(crate) fn failed(&self) -> bool {
        self.report
            .as_ref()
            .is_some_and(conformance::soak::SoakReport::fails_run)
    }
}

/// A soak target: the deployments start with peer proxies, so the
/// clustered kinds can also partition a member from the others.
pub(super) async fn soak_target(
    name: &str,
) -> Result<
    (
        Arc<dyn Target>,
        Option<Arc<dyn conformance::soak::MemberFaults>>,
        Option<tempfile::TempDir>,
    ),
    String,
> {
    if deploy::kind(name).is_some() {
        let deployment = deploy::start_with_peer_proxies(name)
            .await
            .map_err(|e| match e {
                HarnessError::MissingBinary { .. } => format!("not installed: {e}"),
                other => format!("could not start: {other}"),
            })?;
        let target = Arc::new(DeployedTarget::new(deployment, opener()));
        let members: Arc<dyn conformance::soak::MemberFaults> = target.clone();
        return Ok((target, Some(members), None));
    }
    let c = candidate(name).await?;
    Ok((c.target, None, c._keep))
}

/// In a kernel-partition soak, one hold in this many lasts 1-3 TTLs.
const LAB_LONG_HOLD_EVERY: u32 = 4;

/// `distlock-compare compare --soak DURATION --netns`: `name`'s servers
/// started in a lab, the workers' clients on hosts of their own, the
/// partitions cut in the kernel.
async fn soak_in_lab(
    name: &str,
    config: &conformance::soak::SoakConfig,
) -> Result<conformance::soak::SoakReport, String> {
    let (deployment, hosts) =
        deploy::start_in_lab(name, config.workers)
            .await
            .map_err(|e| match e {
                HarnessError::MissingBinary { .. } => format!("not installed: {e}"),
                other => format!("could not start in a lab: {other}"),
            })?;
    let lab = conformance::soak::SoakLab::from_hosts(&hosts, name, &opener());
    let target: Arc<dyn Target> = Arc::new(DeployedTarget::new(deployment, opener()));
    let report = conformance::soak::run_soak_in_lab(target, lab, config)
        .await
        .map_err(|e| format!("cannot run: {e}"));
    // The servers went with the target; the lab's namespaces go last.
    drop(hosts);
    report
}

/// `distlock-compare compare --soak DURATION`: each backend in turn, one seed for
/// all (printed first; `--seed` replays it); with `netns`, in a lab
/// ([`soak_in_lab`]).
pub(crate) async fn soak(
    opts: &CompareOptions,
    duration: Duration,
    seed: Option<u64>,
    netns: bool,
    store: crate::fence_store::Kind,
) -> Result<Vec<SoakResult>, LockError> {
    let seed = seed.unwrap_or_else(conformance::soak::random_seed);
    eprintln!("soak seed {seed} (replay with --seed {seed})");
    if netns && opts.backends.is_none() {
        return Err(LockError::config(format!(
            "--netns needs --backends (of {})",
            deploy::lab_kind_names().join(", ")
        )));
    }
    let names = selected_backends(opts, EMBEDDED)?;
    let mut results = Vec::new();
    for (name, progress) in visits(&names, &opts.urls) {
        progress.say("starting");
        if netns {
            progress.say(&format!(
                "kernel-partition soak for {}",
                distlock::format_duration(duration)
            ));
            let mut config = conformance::soak::SoakConfig::new(duration, seed);
            // Holds across renewals, so that a cut lands while a holder
            // depends on them.
            config.long_hold_every = LAB_LONG_HOLD_EVERY;
            config.fence_store = fence_store(store).await;
            let (report, error) = match soak_in_lab(name, &config).await {
                Ok(report) => {
                    progress.say(&report.verdict);
                    (Some(report), None)
                }
                Err(why) => {
                    progress.say(&why);
                    (None, Some(why))
                }
            };
            results.push(SoakResult {
                name: name.to_owned(),
                report,
                error,
            });
            continue;
        }
        let started = if name.contains(':') {
            let target: Arc<dyn Target> = Arc::new(UrlTarget::of(name));
            Ok((target, None, None))
        } else {
            soak_target(name).await
        };
        let (target, members, _keep) = match started {
            Ok(t) => t,
            Err(why) => {
                progress.say(&why);
                results.push(SoakResult {
                    name: name.to_owned(),
                    report: None,
                    error: Some(why),
                });
                continue;
            }
        };
        progress.say(&format!("soak for {}", distlock::format_duration(duration)));
        let mut config = conformance::soak::SoakConfig::new(duration, seed);
        config.fence_store = fence_store(store).await;
        let result = match conformance::soak::run_soak(target, members, &config).await {
            Ok(report) => {
                progress.say(&report.verdict);
                SoakResult {
                    name: name.to_owned(),
                    report: Some(report),
                    error: None,
                }
            }
            Err(e) => {
                progress.say(&format!("cannot run: {e}"));
                SoakResult {
                    name: name.to_owned(),
                    report: None,
                    error: Some(e.to_string()),
                }
            }
        };
        results.push(result);
    }
    Ok(results)
}

/// The soak's terminal table: one block per backend.
pub(crate) fn print_soak(results: &[SoakResult]) {
    for r in results {
        match (&r.report, &r.error) {
            (Some(report), _) => println!("{}", report.table()),
            (None, Some(e)) => println!("soak {}: {e}\n", r.name),
            (None, None) => {}
        }
    }
}

/// The soak's JSON document.
pub(crate) fn soak_json(results: &[SoakResult]) -> Value {
    json!({ "soak": results })
}

/// The soak's real fenced store (said on stderr when it cannot be made:
/// the run then checks tokens in its in-process resource only).
async fn fence_store(kind: crate::fence_store::Kind) -> Option<conformance::soak::FenceStore> {
    match crate::fence_store::start(kind).await {
        Ok(store) => Some(store),
        Err(why) => {
            eprintln!(
                "soak: no fenced store ({why}); tokens are checked by the in-process resource only"
            );
            None
        }
    }
}
