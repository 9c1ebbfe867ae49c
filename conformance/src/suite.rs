//! Runs every case against one harness and reports.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::cases::{self, Outcome};
use crate::harness::Harness;

type CaseFn = for<'a> fn(&'a Harness) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// One named case of the suite.
#[derive(Clone, Copy)]
pub struct Case {
    /// Its name (the function's name in [`cases`]).
    pub name: &'static str,
    /// What it checks, in one line.
    pub checks: &'static str,
    run: CaseFn,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Case {
    /// Runs this case, bounded by the harness's case timeout.
    pub async fn run(&self, h: &Harness) -> Outcome {
        match tokio::time::timeout(h.config().case_timeout, (self.run)(h)).await {
            Ok(outcome) => outcome,
            Err(_) => {
                // A case that hung may have left a fault injected.
                let _ = h.target().heal().await;
                Outcome::Failed(format!(
                    "did not finish within {:?}",
                    h.config().case_timeout
                ))
            }
        }
    }
}

macro_rules! case {
    ($name:ident, $checks:expr) => {
        Case {
            name: stringify!($name),
            checks: $checks,
            run: |h| Box::pin(async move { cases::$name(h).await.unwrap_or_else(Outcome::Failed) }),
        }
    };
}

/// Every case, in the order the suite runs them.
pub fn all_cases() -> Vec<Case> {
    vec![
        case!(
            bad_input_is_rejected,
            "bad keys and TTLs give typed errors and leave nothing"
        ),
        case!(
            inspect_reports_holder,
            "inspect shows holder, token and TTL"
        ),
        case!(
            only_owner_can_release_or_renew,
            "another owner cannot release or renew"
        ),
        case!(
            stale_release_is_refused,
            "double and stale releases report not held"
        ),
        case!(mutual_exclusion, "no two holders at once; no lost update"),
        case!(
            fencing_tokens_increase,
            "tokens strictly increase over 1,000+ grants"
        ),
        case!(waiters_are_served_in_order, "FIFO waiting"),
        case!(
            acquire_times_out_at_deadline,
            "a wait ends with Contended at its deadline"
        ),
        case!(
            dropped_acquire_leaves_nothing,
            "cancelled acquires leave no lock"
        ),
        case!(
            expiry_frees_key,
            "an unrenewed lease frees the key within its TTL"
        ),
        case!(renew_extends, "renew extends past the first expiry"),
        case!(
            guard_keeps_lock_past_ttl,
            "the guard holds for 3.5x TTL by renewing"
        ),
        case!(
            lost_signal_when_unreachable,
            "Lost fires by the deadline when cut off"
        ),
        case!(
            readers_share_writers_exclude,
            "readers inside together; no writer beside anyone"
        ),
        case!(
            writers_are_not_starved,
            "a waiting writer gets in during a stream of readers"
        ),
        case!(
            downgrade_leaves_no_gap,
            "downgrade keeps writers out and the token; upgrade refused"
        ),
        case!(
            permits_never_exceed_limit,
            "never more than N permits; holders inside together"
        ),
        case!(
            semaphore_limits_are_checked,
            "another limit and bad counts are refused"
        ),
        case!(
            crashed_share_is_freed,
            "a crashed reader or permit holder frees its share by its TTL"
        ),
        case!(
            cancelled_share_waits_leave_nothing,
            "cancelled writer and permit waits block nobody"
        ),
        case!(
            segments_take_any_free,
            "distinct free segments, then the first freed"
        ),
        case!(
            multi_lock_is_all_or_nothing,
            "lock_all leaves no partial grant; no deadlock"
        ),
        case!(
            lock_sets_are_atomic,
            "a set in one exchange: all or none; races never both win (LockSets facet)"
        ),
        case!(
            multi_lock_keeps_its_first_keys_while_waiting,
            "keys taken first stay held while lock_all waits for a later one"
        ),
        case!(
            reentrant_scope_nests,
            "the same lock in a scope is nested, not regranted"
        ),
        case!(
            multi_locks_never_deadlock,
            "[a,b] and [b,a] in a loop: no deadlock, no overlap, nothing left"
        ),
        case!(
            one_leader_at_a_time,
            "one leader at a time; terms increase; observers follow"
        ),
        case!(
            deposed_leader_steps_down,
            "a stalled or cut-off leader is replaced only after it is Lost"
        ),
        case!(
            holder_details_are_reported,
            "inspect names the holder's host, process, program and grant time"
        ),
        case!(
            list_finds_held_locks,
            "list pages through exactly the held locks under a prefix"
        ),
        case!(
            shared_holder_details_are_reported,
            "readers, writers, permit holders and leaders carry their details"
        ),
        case!(
            list_finds_shared_locks,
            "list_shared and list_elections page through exactly what is held"
        ),
        case!(
            force_release_fences_the_old_holder,
            "a broken lock's next token is higher; the old holder is out"
        ),
        case!(
            gc_keeps_tokens_rising,
            "gc keeps held keys and tokens rising (Admin facet)"
        ),
        case!(
            watch_follows_the_holder,
            "watch reports each grant and release, in order, within 5 s"
        ),
    ]
}

/// One case's result.
#[derive(Clone, Debug, Serialize)]
pub struct CaseReport {
    /// Case name.
    pub name: &'static str,
    /// `passed`, `skipped` or `failed`.
    pub verdict: &'static str,
    /// Figures or the failure.
    pub detail: String,
    /// How long it ran.
    pub elapsed_ms: u128,
}

/// The suite's result for one target.
#[derive(Clone, Debug, Serialize)]
pub struct SuiteReport {
    /// The target's name.
    pub target: String,
    /// The facets its clients have ([`Facets::names`](lock_core::Facets::names)):
    /// the cases of the others were skipped, naming them.
    pub facets: Vec<&'static str>,
    /// One entry per case.
    pub cases: Vec<CaseReport>,
}

impl SuiteReport {
    /// Cases that failed.
    pub fn failures(&self) -> Vec<&CaseReport> {
        self.cases
            .iter()
            .filter(|c| c.verdict == "failed")
            .collect()
    }

    /// Whether nothing failed.
    pub fn passed(&self) -> bool {
        self.failures().is_empty()
    }

    /// `"pass 11/13 (2 skipped)"`-style verdict.
    pub fn verdict(&self) -> String {
        let passed = self.cases.iter().filter(|c| c.verdict == "passed").count();
        let skipped = self.cases.iter().filter(|c| c.verdict == "skipped").count();
        let failed = self.failures().len();
        if failed == 0 {
            format!("pass {passed}/{} ({skipped} skipped)", self.cases.len())
        } else {
            format!("FAIL {failed}/{}", self.cases.len())
        }
    }

    /// A plain-text table, one case per line.
    pub fn table(&self) -> String {
        let mut out = format!(
            "conformance suite on {} (facets: {}): {}\n",
            self.target,
            facet_list(&self.facets),
            self.verdict()
        );
        for c in &self.cases {
            out.push_str(&format!(
                "  {:<8} {:<34} {:>7} ms  {}\n",
                c.verdict, c.name, c.elapsed_ms, c.detail
            ));
        }
        out
    }

    /// Prints the table and panics if any case failed (for `#[test]`s).
    ///
    /// # Panics
    ///
    /// When a case failed, listing every failure.
    pub fn assert_passed(&self) {
        println!("{}", self.table());
        let failures = self.failures();
        assert!(
            failures.is_empty(),
            "{} conformance case(s) failed on {}:\n{}",
            failures.len(),
            self.target,
            failures
                .iter()
                .map(|c| format!("  {}: {}", c.name, c.detail))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// The cases whose length comes from waiting out several TTLs or loops
/// (renewal by the guard, a multi-lock kept while waiting, elections, the
/// deadlock loop): they send the statements the short cases send, again
/// and again, and check the guard's and the client's logic above them.
pub const LONG_CASES: &[&str] = &[
    "guard_keeps_lock_past_ttl",
    "multi_lock_keeps_its_first_keys_while_waiting",
    "multi_locks_never_deadlock",
    "one_leader_at_a_time",
    "deposed_leader_steps_down",
];

/// Every case but the [`LONG_CASES`]: for a second dialect or layout of a
/// driver whose whole suite runs elsewhere (the statements differ, the
/// logic above them does not).
pub fn short_cases() -> Vec<Case> {
    all_cases()
        .into_iter()
        .filter(|c| !LONG_CASES.contains(&c.name))
        .collect()
}

/// Runs every case against `h`, one after another.
pub async fn run_suite(h: &Harness) -> SuiteReport {
    run_cases(h, &all_cases()).await
}

/// Runs the given cases against `h`, one after another.
pub async fn run_cases(h: &Harness, cases: &[Case]) -> SuiteReport {
    let facets = match h.client().await {
        Ok(client) => client.facets().names(),
        Err(_) => Vec::new(),
    };
    let mut reports = Vec::new();
    for case in cases {
        let started = Instant::now();
        let outcome = case.run(h).await;
        let elapsed = started.elapsed();
        let (verdict, detail) = match outcome {
            Outcome::Passed(d) => ("passed", d),
            Outcome::Skipped(d) => ("skipped", d),
            Outcome::Failed(d) => ("failed", d),
        };
        tracing::info!(target = %h.target().name(), case = case.name, verdict, %detail);
        reports.push(CaseReport {
            name: case.name,
            verdict,
            detail,
            elapsed_ms: elapsed.as_millis(),
        });
    }
    SuiteReport {
        target: h.target().name(),
        facets,
        cases: reports,
    }
}

/// `admin, lock_sets`, or `none`.
pub fn facet_list(facets: &[&str]) -> String {
    if facets.is_empty() {
        "none".to_owned()
    } else {
        facets.join(", ")
    }
}

/// Duration formatting used in reports.
pub fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
