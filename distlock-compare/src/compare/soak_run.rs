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

/// `distlock-compare compare --soak DURATION`: each backend in turn, one seed for
/// all (printed first; `--seed` replays it).
pub(crate) async fn soak(
    opts: &CompareOptions,
    duration: Duration,
    seed: Option<u64>,
) -> Result<Vec<SoakResult>, LockError> {
    let seed = seed.unwrap_or_else(conformance::soak::random_seed);
    eprintln!("soak seed {seed} (replay with --seed {seed})");
    let names = selected_backends(opts, EMBEDDED)?;
    let mut results = Vec::new();
    for (name, progress) in visits(&names, &opts.urls) {
        progress.say("starting");
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
        let config = conformance::soak::SoakConfig::new(duration, seed);
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
