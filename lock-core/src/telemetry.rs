//! Metrics through the [`metrics`] facade, so any exporter plugs in
//! (Prometheus, StatsD, OpenTelemetry: install its recorder, then call
//! [`enable_metrics`]).
//!
//! Off until [`enable_metrics`] is called: then every acquire, renewal,
//! release and state change of a [`LockGuard`](crate::LockGuard) records,
//! labelled by `backend` (the driver's name) and, when the
//! [`KeyLabel`] rule gives one, `key` (never the raw key by default:
//! bounded cardinality):
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `distlock_acquire_attempts_total` | counter | backend, key, shape | acquires and tries asked for |
//! | `distlock_acquire_grants_total` | counter | backend, key, shape | granted |
//! | `distlock_acquire_contended_total` | counter | backend, key, shape | a try found the key held |
//! | `distlock_acquire_timeouts_total` | counter | backend, key, shape | a waiting acquire's wait ran out |
//! | `distlock_acquire_errors_total` | counter | backend, key, shape, kind | failed otherwise (`kind`: the error kind) |
//! | `distlock_acquire_wait_seconds` | histogram | backend, key, shape | from the call to the grant |
//! | `distlock_hold_seconds` | histogram | backend, key | from the grant to the release or the loss |
//! | `distlock_renewals_total` | counter | backend, key, outcome | renewals `ok` / `failed` |
//! | `distlock_renewal_margin_seconds` | histogram | backend, key | time left before the old deadline when a renewal returned: near zero means the TTL is too short |
//! | `distlock_suspect_seconds` | histogram | backend, key | time spent `Suspect` before `Held` again or `Lost` |
//! | `distlock_locks_lost_total` | counter | backend, key, reason | locks lost, by reason class |
//!
//! `shape` is `mutex`, `read-write` or `semaphore`; the lost `reason` is
//! `refused` (the backend said the lease is gone), `expired` (renewals
//! did not succeed before the deadline), `session` (the backend session
//! ended), `hold-limit`, `not-renewed` (renewal disabled), `impossible`
//! (the lease cannot be renewed at all) or `other`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use metrics::{Label, counter, histogram};
use tokio::time::Instant;

use crate::error::LockError;
use crate::key::LockKey;
use crate::kind::LockShape;

/// Why a guard was lost, in the words its `Lost` state carries (and the
/// metrics classify).
pub(crate) const RENEWAL_FAILED: &str =
    "the lease's validity deadline passed before a renewal succeeded";
pub(crate) const HOLD_LIMIT: &str = "the hold limit was reached and the lease ran out";
pub(crate) const NOT_RENEWED: &str = "the lease ran out (renewal disabled)";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// How a key becomes the `key` label of the metrics.
#[derive(Clone, Default)]
pub enum KeyLabel {
    /// No `key` label (the default): series per backend only.
    #[default]
    Omit,
    /// The first `n` `/`-separated segments of the key (`jobs/nightly/42`
    /// with 1: `jobs`; with 2: `jobs/nightly`): bounded as long as the
    /// first segments name kinds of work, not items.
    Segments(usize),
    /// A function of the key; its values should be few.
    Custom(Arc<dyn Fn(&LockKey) -> String + Send + Sync>),
}

impl std::fmt::Debug for KeyLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Omit => f.write_str("Omit"),
            Self::Segments(n) => write!(f, "Segments({n})"),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl KeyLabel {
    fn label(&self, key: &LockKey) -> Option<String> {
        match self {
            Self::Omit => None,
            Self::Segments(n) => Some(
                key.as_str()
                    .split('/')
                    .take((*n).max(1))
                    .collect::<Vec<_>>()
                    .join("/"),
            ),
            Self::Custom(f) => Some(f(key)),
        }
    }
}

/// Backend names, interned so a guard keeps one byte for its label.
static NAMES: RwLock<Vec<&'static str>> = RwLock::new(Vec::new());

/// The index of `name` (the 255th and later names share the last slot).
pub(crate) fn intern(name: &'static str) -> u8 {
    let find = |names: &[&'static str]| names.iter().position(|n| *n == name);
    if let Some(i) = find(&NAMES.read().unwrap_or_else(PoisonError::into_inner)) {
        return u8::try_from(i).unwrap_or(u8::MAX);
    }
    let mut names = NAMES.write().unwrap_or_else(PoisonError::into_inner);
    let i = match find(&names) {
        Some(i) => i,
        None if names.len() < usize::from(u8::MAX) => {
            names.push(name);
            names.len() - 1
        }
        None => usize::from(u8::MAX),
    };
    u8::try_from(i).unwrap_or(u8::MAX)
}

/// The name interned at `index` (`"other"` past the table).
pub(crate) fn name_of(index: u8) -> &'static str {
    NAMES
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(usize::from(index))
        .copied()
        .unwrap_or("other")
}

fn rule() -> &'static RwLock<KeyLabel> {
    static RULE: RwLock<KeyLabel> = RwLock::new(KeyLabel::Omit);
    &RULE
}

/// Turns the metrics on for this process, with `key_label` deciding the
/// `key` label. Install the exporter's recorder first (without one, the
/// `metrics` facade drops everything).
pub fn enable_metrics(key_label: KeyLabel) {
    *rule().write().unwrap_or_else(PoisonError::into_inner) = key_label;
    ENABLED.store(true, Ordering::Release);
}

/// Turns the metrics off again.
pub fn disable_metrics() {
    ENABLED.store(false, Ordering::Release);
}

/// Whether [`enable_metrics`] is in effect.
pub fn metrics_enabled() -> bool {
    ENABLED.load(Ordering::Acquire)
}

fn labels(backend: &'static str, key: &LockKey) -> Vec<Label> {
    let mut labels = vec![Label::from_static_parts("backend", backend)];
    if let Some(value) = rule()
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .label(key)
    {
        labels.push(Label::new("key", value));
    }
    labels
}

fn shape_name(shape: LockShape) -> &'static str {
    match shape {
        LockShape::Mutex => "mutex",
        LockShape::ReadWrite => "read-write",
        LockShape::Semaphore => "semaphore",
    }
}

/// An acquire began: `Some(start)` when metrics are on.
pub(crate) fn acquire_started(
    backend: &'static str,
    key: &LockKey,
    shape: LockShape,
) -> Option<Instant> {
    if !metrics_enabled() {
        return None;
    }
    let mut labels = labels(backend, key);
    labels.push(Label::from_static_parts("shape", shape_name(shape)));
    counter!("distlock_acquire_attempts_total", labels).increment(1);
    Some(Instant::now())
}

/// How an acquire begun at `start` ended (`waited`: it had a wait).
pub(crate) fn acquire_ended<T>(
    start: Option<Instant>,
    backend: &'static str,
    key: &LockKey,
    shape: LockShape,
    waited: bool,
    result: &Result<T, LockError>,
) {
    let Some(start) = start else {
        return;
    };
    let mut labels = labels(backend, key);
    labels.push(Label::from_static_parts("shape", shape_name(shape)));
    match result {
        Ok(_) => {
            counter!("distlock_acquire_grants_total", labels.clone()).increment(1);
            histogram!("distlock_acquire_wait_seconds", labels).record(start.elapsed());
        }
        Err(e) if e.is_contended() && waited => {
            counter!("distlock_acquire_timeouts_total", labels).increment(1);
        }
        Err(e) if e.is_contended() => {
            counter!("distlock_acquire_contended_total", labels).increment(1);
        }
        Err(e) => {
            labels.push(Label::new("kind", e.kind().to_string()));
            counter!("distlock_acquire_errors_total", labels).increment(1);
        }
    }
}

/// A renewal returned: `margin` is the time that was left before the old
/// deadline (for a success).
/// Records a grant's outcome on its span (when enabled): the lease's
/// token in `token_field` (`token`, an election's `term`), its owner and
/// `granted` as the outcome, or the error's kind.
pub(crate) fn record_grant(
    span: &tracing::Span,
    result: &Result<crate::Lease, LockError>,
    token_field: &str,
    granted: &str,
) {
    if span.is_disabled() {
        return;
    }
    match result {
        Ok(lease) => {
            span.record(token_field, lease.token().get());
            span.record("owner", tracing::field::display(lease.owner().to_hex()));
            span.record("outcome", granted);
        }
        Err(e) => {
            span.record("outcome", tracing::field::display(e.kind()));
        }
    }
}

pub(crate) fn renewal(backend: &'static str, key: &LockKey, ok: bool, margin: Duration) {
    if !metrics_enabled() {
        return;
    }
    let labels = labels(backend, key);
    let outcome = if ok { "ok" } else { "failed" };
    let mut with_outcome = labels.clone();
    with_outcome.push(Label::from_static_parts("outcome", outcome));
    counter!("distlock_renewals_total", with_outcome).increment(1);
    if ok {
        histogram!("distlock_renewal_margin_seconds", labels).record(margin);
    }
}

/// A `Suspect` spell of `spell` ended (back to `Held`, or `Lost`).
pub(crate) fn suspect_ended(backend: &'static str, key: &LockKey, spell: Duration) {
    if metrics_enabled() {
        histogram!("distlock_suspect_seconds", labels(backend, key)).record(spell);
    }
}

/// A hold of `held` ended: released (`lost` is `None`) or lost.
pub(crate) fn hold_ended(backend: &'static str, key: &LockKey, held: Duration, lost: Option<&str>) {
    if !metrics_enabled() {
        return;
    }
    let labels = labels(backend, key);
    histogram!("distlock_hold_seconds", labels.clone()).record(held);
    if let Some(reason) = lost {
        let mut labels = labels;
        labels.push(Label::from_static_parts("reason", lost_class(reason)));
        counter!("distlock_locks_lost_total", labels).increment(1);
    }
}

/// The bounded class of a loss reason (the texts are the guard's own).
fn lost_class(reason: &str) -> &'static str {
    if reason.starts_with("renewal refused") {
        "refused"
    } else if reason.starts_with("backend session lost") {
        "session"
    } else if reason.starts_with("renewal impossible") || reason.starts_with("cannot renew") {
        "impossible"
    } else if reason == HOLD_LIMIT {
        "hold-limit"
    } else if reason == NOT_RENEWED {
        "not-renewed"
    } else if reason == RENEWAL_FAILED || reason.starts_with("the lease's validity deadline") {
        "expired"
    } else {
        "other"
    }
}

/// Whether a `debug` span of ours can reach anyone: a `tracing`
/// subscriber that wants `debug`, or, while no subscriber was ever set,
/// a `log` logger at `debug` (tracing's `log` fallback, which sqlx turns
/// on). Otherwise the hot calls use [`tracing::Span::none`]: a disabled
/// span from the macro still builds its fields and, through that fallback,
/// records them and asks `log` twice (about 180 instructions a span).
pub(crate) fn debug_spans() -> bool {
    tracing::level_enabled!(tracing::Level::DEBUG)
        || (!tracing::dispatcher::has_been_set() && log::max_level() >= log::LevelFilter::Debug)
}

/// `Some` `tracing::debug_span!` of `name` and its fields when someone
/// can see it ([`debug_spans`]) and it is enabled, else `None` (the fields
/// not evaluated, no span made or dropped): the hot calls' spans. Their
/// futures are instrumented only with `Some`: an instrumented future
/// enters and exits its span at every poll, disabled or not (with
/// tracing's `log` fallback compiled in, each of those looks at the `log`
/// crate's level too); that showed in a profile of an acquire+release
/// cycle as about 2,000 instructions of a 44,000 total.
macro_rules! hot_span {
    ($name:literal, $($fields:tt)*) => {
        if $crate::telemetry::debug_spans() {
            Some(tracing::debug_span!($name, $($fields)*)).filter(|span| !span.is_disabled())
        } else {
            None
        }
    };
}
pub(crate) use hot_span;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_labels_are_bounded_by_the_rule() {
        let key = LockKey::new("jobs/nightly/42").unwrap();
        assert_eq!(KeyLabel::Omit.label(&key), None);
        assert_eq!(KeyLabel::Segments(1).label(&key).as_deref(), Some("jobs"));
        assert_eq!(
            KeyLabel::Segments(2).label(&key).as_deref(),
            Some("jobs/nightly")
        );
        assert_eq!(KeyLabel::Segments(0).label(&key).as_deref(), Some("jobs"));
        let custom = KeyLabel::Custom(Arc::new(|k: &LockKey| k.as_str().len().to_string()));
        assert_eq!(custom.label(&key).as_deref(), Some("15"));
    }

    #[test]
    fn loss_reasons_fall_in_few_classes() {
        assert_eq!(lost_class("renewal refused: not held"), "refused");
        assert_eq!(lost_class("backend session lost: expired"), "session");
        assert_eq!(lost_class(RENEWAL_FAILED), "expired");
        assert_eq!(lost_class(HOLD_LIMIT), "hold-limit");
        assert_eq!(lost_class(NOT_RENEWED), "not-renewed");
        assert_eq!(lost_class("renewal impossible: bad ttl"), "impossible");
        assert_eq!(lost_class("something new"), "other");
    }
}
