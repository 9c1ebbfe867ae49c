//! The verdict stage of a backend's comparison: the conformance suite and
//! the fault scenarios, with the library's metrics they caused; and what a
//! quick run leaves to the full one.
//!
//! A quick run (`--quick`) runs the mutex's cases and its fault matrix and
//! leaves the other shapes (read-write locks, semaphores, segments,
//! multi-locks, reentrancy, elections) to the run without `--quick`; it
//! names what it left out, per backend ([`BackendResult`]'s
//! `left_to_full_run`). Its verdict stages run a few backends at a time
//! (they mostly wait out TTLs), each backend's metrics attributed by the
//! `backend` label, which two backends of one driver share: those take
//! turns.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};

use conformance::scenarios::{self, ScenarioEnv, ScenarioReport};
use conformance::{Harness, SuiteConfig, SuiteReport};
use lock_core::Capabilities;

use super::phases::Phases;
use super::{BackendResult, kind_scenario_name};
use super::{Candidate, CompareOptions, Progress, holder_command, holder_command_kind};

/// The conformance cases a quick run keeps: the mutex's contract (input,
/// ownership, exclusion, tokens, waiting, deadlines, cancellation, expiry,
/// renewal, the lost signal) and operating it (inspect, list, force
/// release, watch). Every other case, including any added later, is left
/// to the full run and named in the report.
pub(super) const QUICK_CASES: &[&str] = &[
    "bad_input_is_rejected",
    "inspect_reports_holder",
    "only_owner_can_release_or_renew",
    "stale_release_is_refused",
    "mutual_exclusion",
    "fencing_tokens_increase",
    "waiters_are_served_in_order",
    "acquire_times_out_at_deadline",
    "dropped_acquire_leaves_nothing",
    "expiry_frees_key",
    "renew_extends",
    "guard_keeps_lock_past_ttl",
    "lost_signal_when_unreachable",
    "holder_details_are_reported",
    "list_finds_held_locks",
    "force_release_fences_the_old_holder",
    "watch_follows_the_holder",
];

/// The figures a quick run leaves to the full run on every backend (the
/// other shapes' benchmarks).
pub(super) const QUICK_LEFT_FIGURES: &[&str] = &["figures shared-lock", "figures composed-shapes"];

/// How many backends a quick run's verdict stages run at once: one per
/// CPU, at most three. Their timing checks keep their margins: with three
/// at once on two CPUs (and a build beside them), etcd's
/// `dropped_acquire_leaves_nothing` missed its 1.5 s in two runs of two.
pub(super) fn quick_lanes() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(3))
}

/// What the verdict stage found on one backend.
pub(super) struct Verdicts {
    pub(super) caps: Capabilities,
    /// The backend's facets ([`lock_core::Facets::names`]).
    pub(super) facets: Vec<&'static str>,
    pub(super) suite: SuiteReport,
    pub(super) scenarios: BTreeMap<String, ScenarioReport>,
    /// The library's metrics series of this backend that grew meanwhile.
    pub(super) metrics: BTreeMap<String, f64>,
    /// The checks a quick run did not make here (`case NAME`, `scenario
    /// NAME[KIND]`, `figures WHAT`).
    pub(super) left_to_full_run: Vec<String>,
}

/// The verdict stages' lanes: a slot per backend running, and one turn
/// per metrics `backend` label, so that backends sharing a label (Redis,
/// its replicated deployment and Redlock) take turns and each one's
/// metrics are its own. A backend waiting for its label's turn gives its
/// slot to the next backend meanwhile.
pub(super) struct Lanes {
    slots: Arc<Semaphore>,
    turns: Mutex<HashMap<&'static str, Arc<tokio::sync::Mutex<()>>>>,
}

impl Lanes {
    /// `n` backends at a time.
    pub(super) fn new(n: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(n.max(1))),
            turns: Mutex::default(),
        }
    }

    /// Waits for a free slot (in the order asked: the semaphore is fair).
    pub(super) async fn slot(&self) -> OwnedSemaphorePermit {
        self.slots
            .clone()
            .acquire_owned()
            .await
            .expect("the lanes' semaphore is never closed")
    }

    /// `label`'s turn, with a slot; `slot` is given up while another
    /// backend of the label has the turn.
    async fn turn(
        &self,
        label: &'static str,
        slot: OwnedSemaphorePermit,
    ) -> (OwnedSemaphorePermit, OwnedMutexGuard<()>) {
        let turn = {
            let mut turns = self
                .turns
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            turns.entry(label).or_default().clone()
        };
        match turn.clone().try_lock_owned() {
            Ok(taken) => (slot, taken),
            Err(_) => {
                drop(slot);
                let taken = turn.lock_owned().await;
                (self.slot().await, taken)
            }
        }
    }
}

/// The suite and the scenarios on `c` (the metrics must be on), timed into
/// `phases`, run in `slot` of `lanes` (given back with the verdicts); `Err`
/// with why when no client connects.
pub(super) async fn verdicts(
    c: &Candidate,
    opts: &CompareOptions,
    progress: &Progress,
    phases: &mut Phases,
    (lanes, slot): (&Lanes, OwnedSemaphorePermit),
) -> Result<(Verdicts, OwnedSemaphorePermit), String> {
    let client = phases
        .time("start connect", c.target.client())
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let (caps, label, facets) = (
        client.capabilities(),
        client.name(),
        client.facets().names(),
    );
    drop(client);
    let (slot, turn) = lanes.turn(label, slot).await;
    let metrics_before = crate::metrics::snapshot();
    let mut left_to_full_run = Vec::new();
    let cases: Vec<conformance::Case> = conformance::all_cases()
        .into_iter()
        .filter(|case| {
            let kept = !opts.quick || QUICK_CASES.contains(&case.name);
            if !kept {
                left_to_full_run.push(format!("case {}", case.name));
            }
            kept
        })
        .collect();
    progress.say("conformance suite");
    let config = SuiteConfig {
        iterations: if opts.full { 25 } else { 10 },
        fencing_grants: 1000,
        ..SuiteConfig::default()
    };
    let suite =
        conformance::run_cases(&Harness::with_config(c.target.clone(), config), &cases).await;
    for case in &suite.cases {
        phases.record(
            &format!("suite {}", case.name),
            Duration::from_millis(u64::try_from(case.elapsed_ms).unwrap_or(u64::MAX)),
        );
    }
    progress.say(&format!(
        "conformance {} in {:.0} s",
        suite.verdict(),
        phases.seconds("suite ")
    ));
    let mut scenarios_out = BTreeMap::new();
    if opts.scenarios {
        let env = ScenarioEnv {
            target: c.target.clone(),
            holder: holder_command(),
            quick: !opts.full,
            ttl: Duration::from_secs(1).max(caps.min_ttl),
        };
        for name in scenarios::SCENARIOS {
            progress.say(&format!("scenario {name}"));
            let report = phases
                .time(
                    &format!("scenario {name}"),
                    scenarios::run_scenario(name, &env),
                )
                .await;
            scenarios_out.insert((*name).to_owned(), report);
        }
        for kind in scenarios::scenario_kinds(&caps) {
            let env = scenarios::for_kind(&env, kind, holder_command_kind(kind));
            for name in scenarios::KIND_SCENARIOS {
                let label = kind_scenario_name(name, kind);
                if opts.quick {
                    left_to_full_run.push(format!("scenario {label}"));
                    continue;
                }
                progress.say(&format!("scenario {label}"));
                let report = phases
                    .time(
                        &format!("scenario {label}"),
                        scenarios::run_scenario(name, &env),
                    )
                    .await;
                scenarios_out.insert(label, report);
            }
        }
    }
    let series = format!("backend=\"{label}\"");
    let metrics = crate::metrics::delta(&metrics_before, &crate::metrics::snapshot())
        .into_iter()
        .filter(|(name, _)| name.contains(&series))
        .collect();
    drop(turn);
    if opts.quick {
        left_to_full_run.extend(QUICK_LEFT_FIGURES.iter().map(|f| (*f).to_owned()));
    }
    let found = Verdicts {
        caps,
        facets,
        suite,
        scenarios: scenarios_out,
        metrics,
        left_to_full_run,
    };
    Ok((found, slot))
}

/// What the quick run left to the full run, one line per set of backends
/// that left the same checks out (nothing when nothing was left out).
pub(super) fn print_left_to_full_run(results: &[BackendResult]) {
    let mut groups: Vec<(&[String], Vec<&str>)> = Vec::new();
    for r in results.iter().filter(|r| !r.left_to_full_run.is_empty()) {
        match groups
            .iter_mut()
            .find(|(left, _)| *left == r.left_to_full_run.as_slice())
        {
            Some((_, names)) => names.push(&r.name),
            None => groups.push((&r.left_to_full_run, vec![&r.name])),
        }
    }
    if groups.is_empty() {
        return;
    }
    println!();
    println!(
        "quick run: these checks were NOT made; they are left to the full run \
         (compare without --quick):"
    );
    for (left, names) in groups {
        println!("  on {}:", names.join(", "));
        for what in ["case", "scenario", "figures"] {
            let items: Vec<&str> = left
                .iter()
                .filter_map(|l| l.strip_prefix(what)?.strip_prefix(' '))
                .collect();
            if !items.is_empty() {
                let heading = match what {
                    "case" => "conformance cases",
                    "scenario" => "scenarios",
                    _ => "figures",
                };
                println!("    {heading} ({}): {}", items.len(), items.join(", "));
            }
        }
    }
    println!(
        "  (and the mutex's figures came from fewer rounds than the full run's: \
         the one-CPU pair, 8 clients and handoffs read noisier)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renamed or removed case must not drop out of the quick run
    /// unnoticed.
    #[test]
    fn quick_cases_are_suite_cases() {
        let names: Vec<&str> = conformance::all_cases().iter().map(|c| c.name).collect();
        for case in QUICK_CASES {
            assert!(names.contains(case), "{case} is not a conformance case");
        }
    }
}
