//! The conformance cases: public async functions over a [`Harness`],
//! selected by capabilities, runnable from any driver's tests.
//!
//! Each returns a [`CaseResult`]: an [`Outcome`], or the failure. Timing checks use the harness's margin for
//! lateness only; safety is judged from the recorded history, never from
//! wall-clock luck.
//!
//! Optional parts are gated on what the backend *declares*, never on an
//! `Unsupported` answer: a case for a [facet](lock_core::facets) runs when
//! the backend's [`facets()`](lock_core::LockBackend::facets) has it and is
//! skipped, naming the facet, otherwise; a present facet that answers
//! `Unsupported` fails the case. Shapes are gated on the
//! capabilities (`shared_locks`, `semaphores`) the same way. Calls with a
//! fallback for every backend (elections through the mutex, holder watches
//! by polling, multi-locks key by key in `LockClient`) run everywhere.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{Lease, LockBackend, LockBackendExt, LockKey};
use tokio::time::Instant;

use crate::harness::Harness;
use crate::history::{Op, Recorder};

/// How a case ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Everything held; the text has the figures.
    Passed(String),
    /// Not applicable to this backend (capabilities or target), with why.
    Skipped(String),
    /// A check failed, with what was seen.
    Failed(String),
}

impl Outcome {
    /// Whether it failed.
    pub fn is_failed(&self) -> bool {
        matches!(self, Self::Failed(_))
    }
}

/// What a case function returns: `Ok` with how it ended (passed or
/// skipped, with the figures or the reason), or `Err` with what failed.
/// The suite turns an `Err` into [`Outcome::Failed`].
pub type CaseResult = Result<Outcome, String>;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

fn fmt_err(what: &str) -> impl Fn(lock_core::LockError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// The skip of a case whose facet the backend does not have.
fn without_facet(facet: &str, what: &str) -> Outcome {
    Outcome::Skipped(format!("the backend has no {facet} facet ({what})"))
}

/// The answer of a call to a facet the backend has (see
/// [`Facets`](lock_core::Facets)): the value, or the failure, an
/// `Unsupported` answer included (a present facet serves every call).
fn served<T>(
    result: Result<T, lock_core::LockError>,
    facet: &str,
    call: &str,
) -> Result<T, String> {
    result.map_err(|e| {
        if e.kind() == lock_core::ErrorKind::Unsupported {
            format!("{call}: the backend has the {facet} facet, which answered Unsupported: {e}")
        } else {
            format!("{call}: {e}")
        }
    })
}

async fn clients(h: &Harness, n: usize) -> Result<Vec<Arc<dyn LockBackend>>, String> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        out.push(h.client().await.map_err(fmt_err("connecting a client"))?);
    }
    Ok(out)
}

/// Two independent clients.
async fn two_clients(h: &Harness) -> Result<(Arc<dyn LockBackend>, Arc<dyn LockBackend>), String> {
    let mut both = clients(h, 2).await?.into_iter();
    match (both.next(), both.next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err("could not make two clients".into()),
    }
}

/// Takes a key that must be free.
async fn take_free(
    backend: &dyn LockBackend,
    key: &LockKey,
    ttl: Duration,
) -> Result<Lease, String> {
    backend
        .try_acquire(key, ttl)
        .await
        .map_err(fmt_err("try_acquire"))?
        .ok_or_else(|| format!("the free key {key} was reported held"))
}

/// Acquires waiting until `deadline`, recording invoke/ok/fail.
pub(crate) async fn recorded_acquire(
    backend: &dyn LockBackend,
    rec: &Recorder,
    key: &LockKey,
    ttl: Duration,
    deadline: Instant,
) -> Result<Lease, lock_core::LockError> {
    rec.invoke(Op::Acquire, key, None);
    match backend.acquire(key, ttl, deadline).await {
        Ok(lease) => {
            rec.acquired(key, lease.token(), lease.validity_deadline());
            Ok(lease)
        }
        Err(e) => {
            rec.failed(Op::Acquire, key, None);
            Err(e)
        }
    }
}

/// The history checker's verdict as a case error: no overlapping windows
/// (`overlap` says what that means here) and, with fencing, strictly
/// increasing tokens (`tokens` says what those are). The summary otherwise.
fn check_history(
    history: &crate::history::History,
    fenced: bool,
    overlap: &str,
    tokens: &str,
) -> Result<String, String> {
    let report = history.check();
    ensure!(report.is_exclusive(), "{overlap}: {}", report.summary());
    if fenced {
        ensure!(
            report.token_regressions == 0 && report.duplicate_tokens == 0,
            "{tokens} did not strictly increase: {}",
            report.summary()
        );
    }
    Ok(report.summary())
}

use crate::recording::recorded_release;

// After the macros above, which the case modules use.
mod admin;
mod admin_shapes;
mod api;
mod compose;
mod elect;
mod exclusion;
mod holder_details;
mod leases;
mod shared;

pub use admin::*;
pub use admin_shapes::*;
pub use api::*;
pub use compose::*;
pub use elect::*;
pub use exclusion::*;
pub use leases::*;
pub use shared::*;
