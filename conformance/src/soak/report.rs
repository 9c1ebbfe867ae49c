//! What a soak run reports: faults injected, counts per kind, violations.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::history::CheckReport;

use super::*;

/// A fault as it was injected.
#[derive(Clone, Debug, Serialize)]
pub struct InjectedFault {
    /// What.
    pub kind: FaultKind,
    /// Worker or member index.
    pub target: usize,
    /// When it started (on the history's clock; ms in JSON).
    #[serde(rename = "start_ms", serialize_with = "as_ms")]
    pub start: Duration,
    /// When it was healed (ms in JSON).
    #[serde(rename = "end_ms", serialize_with = "as_ms")]
    pub end: Duration,
}

pub(super) fn as_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(ms(*d))
}

/// Figures of one fault kind.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FaultStats {
    /// How many times it was injected.
    pub injected: usize,
    /// Time it was active, in all.
    pub active_ms: u64,
    /// Grants observed while it was active.
    pub grants: usize,
    /// Failed acquires and renewals observed while it was active.
    pub errors: usize,
    /// Lost signals observed while it was active.
    pub lost: usize,
    /// Violations it covers (it could have made them: see the soak's
    /// module docs).
    pub violations: usize,
    /// Of those, the ones it excuses: it is a known unsafe case for this
    /// backend (see `known_unsafe`), so they are expected.
    pub expected_violations: usize,
    /// Why this kind is a known unsafe case for this backend, if it is.
    pub known_unsafe: Option<String>,
}

/// One violation found, with the faults active during it.
#[derive(Clone, Debug, Serialize)]
pub struct Violation {
    /// `overlap`, `stale_write`, `lost_update`, `token_regression`,
    /// `duplicate_token`, `grant_past_deadline`, or `unattributed`.
    pub what: String,
    /// Interval it covers, on the history's clock (ms).
    pub from_ms: u64,
    /// End of that interval (ms).
    pub to_ms: u64,
    /// Fault kinds that cover it: active between the earlier grant
    /// involved and the moment it became possible, and, for a fault of one
    /// client, on the client whose late write it is (see the soak's module
    /// docs). Faults merely active meanwhile are not listed.
    pub faults: Vec<FaultKind>,
    /// Whether one of them is a known unsafe case for this backend.
    pub expected: bool,
    /// Details.
    pub detail: String,
}

/// How many violations of one kind, and how many of them expected.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ViolationCount {
    /// All of them.
    pub total: usize,
    /// In a known unsafe case (negative control).
    pub expected: usize,
}

/// Violations listed in a report (all are counted).
pub(super) const MAX_LISTED: usize = 100;

/// The outcome of a soak run.
#[derive(Clone, Debug, Serialize)]
pub struct SoakReport {
    /// Target name.
    pub backend: String,
    /// The seed (`--seed` replays the schedule).
    pub seed: u64,
    /// How long clients ran (s).
    pub duration_s: f64,
    /// Workers.
    pub workers: usize,
    /// Keys.
    pub keys: usize,
    /// TTL (ms).
    pub ttl_ms: u64,
    /// One hold in this many lasted one to three TTLs (0: none did).
    pub long_hold_every: u32,
    /// Whether the resource checked tokens (the backend has fencing).
    pub fenced: bool,
    /// How the client-link faults reach the workers: `tcp proxy` or
    /// `in-process link`.
    pub client_links: String,
    /// Fault kinds the nemesis drew from.
    pub kinds: Vec<FaultKind>,
    /// Kinds that do not apply to this target, and why.
    pub not_applicable: BTreeMap<String, String>,
    /// Per fault kind.
    pub faults: BTreeMap<String, FaultStats>,
    /// Every injected fault, in order.
    pub injected: Vec<InjectedFault>,
    /// Grants in all.
    pub grants: usize,
    /// Failed acquires and renewals in all.
    pub errors: usize,
    /// Lost signals in all.
    pub lost_signals: usize,
    /// Writes that reached the resource.
    pub writes: usize,
    /// Of those, refused by the resource (token below one it had seen).
    pub writes_refused: usize,
    /// Reads refused by the resource.
    pub reads_refused: usize,
    /// The real fenced store's answers, when the run had one.
    pub fence_store: Option<FenceStoreReport>,
    /// Increments lost: applied writes minus the counters' final values.
    pub lost_increments: u64,
    /// The history checker's findings.
    pub check: CheckReport,
    /// Violations, attributed to fault kinds (the unexpected ones first;
    /// at most 100 listed).
    pub violations: Vec<Violation>,
    /// Violations per kind of violation (all of them).
    pub violation_counts: BTreeMap<String, ViolationCount>,
    /// Violations that fail the run.
    pub unexpected_violations: usize,
    /// Violations in known unsafe cases (negative controls).
    pub expected_violations: usize,
    /// Faults the nemesis could not inject or heal.
    pub nemesis_errors: Vec<String>,
    /// `safe`, `expected violations only (negative control)`, or
    /// `VIOLATION`.
    pub verdict: String,
}

impl SoakReport {
    /// Whether the run found a violation the backend promises to avoid.
    pub fn fails_run(&self) -> bool {
        self.unexpected_violations > 0
    }

    /// The per-kind table, for terminals.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "soak {}: seed {} | {:.0} s | {} workers on {} keys | ttl {} ms{} | clients: {} | {} grants, {} errors, {} lost signals, {} writes ({} refused), {} lost increments",
            self.backend,
            self.seed,
            self.duration_s,
            self.workers,
            self.keys,
            self.ttl_ms,
            if self.long_hold_every > 0 {
                format!(", 1 hold in {} of 1-3 TTLs", self.long_hold_every)
            } else {
                String::new()
            },
            self.client_links,
            self.grants,
            self.errors,
            self.lost_signals,
            self.writes,
            self.writes_refused,
            self.lost_increments
        );
        if let Some(store) = &self.fence_store {
            let _ = writeln!(
                out,
                "  fenced store {}: {} writes, {} stale refused, {} errors; judged otherwise than the rule: {} accepted stale, {} refused in order",
                store.store,
                store.writes,
                store.refused,
                store.errors,
                store.accepted_stale,
                store.refused_admitted
            );
        }
        let _ = writeln!(
            out,
            "  {:<24} {:>8} {:>10} {:>7} {:>7} {:>6} {:>10} {:>9}",
            "fault", "injected", "active s", "grants", "errors", "lost", "violations", "expected"
        );
        for (name, s) in &self.faults {
            #[allow(clippy::cast_precision_loss)] // display only
            let active = s.active_ms as f64 / 1000.0;
            let _ = writeln!(
                out,
                "  {:<24} {:>8} {:>10.1} {:>7} {:>7} {:>6} {:>10} {:>9}{}",
                name,
                s.injected,
                active,
                s.grants,
                s.errors,
                s.lost,
                s.violations,
                s.expected_violations,
                if s.known_unsafe.is_some() {
                    "  (negative control)"
                } else {
                    ""
                }
            );
        }
        for (name, why) in &self.not_applicable {
            let _ = writeln!(out, "  {name:<24} not applicable: {why}");
        }
        let _ = writeln!(out, "  checker: {}", self.check.summary());
        for (what, c) in &self.violation_counts {
            let _ = writeln!(
                out,
                "  {what}: {} ({} expected as negative control)",
                c.total, c.expected
            );
        }
        for v in self.violations.iter().take(5) {
            let faults: Vec<&str> = v.faults.iter().map(|k| k.as_str()).collect();
            let _ = writeln!(
                out,
                "  {} {} at {}..{} ms covered by [{}]: {}",
                if v.expected { "expected" } else { "VIOLATION" },
                v.what,
                v.from_ms,
                v.to_ms,
                faults.join(", "),
                v.detail
            );
        }
        for e in self.nemesis_errors.iter().take(5) {
            let _ = writeln!(out, "  nemesis error: {e}");
        }
        let _ = writeln!(out, "  verdict: {}", self.verdict);
        out
    }
}

// ---------------------------------------------------------------------
// The protected resource.

/// What the real fenced store ([`SoakConfig::fence_store`]) answered.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FenceStoreReport {
    /// The store (its adapter and database).
    pub store: String,
    /// Writes sent to it.
    pub writes: usize,
    /// Stale writes it refused.
    pub refused: usize,
    /// Writes it failed to answer.
    pub errors: usize,
    /// Writes it accepted although the rule says stale (a violation).
    pub accepted_stale: usize,
    /// Writes it refused although the rule admits them (a violation: a
    /// broken adapter).
    pub refused_admitted: usize,
}
