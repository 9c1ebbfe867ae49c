//! What every measuring part of the benchmarks starts from: the target and
//! the kind of run ([`Bench`]), a client, a TTL and a run tag ([`Start`]),
//! and the number of independent clients of the throughput figures
//! ([`CLIENTS`]). The parts (the benchmarks in `figures`, the shapes, the
//! shared lock, composition) each use them; `figures` runs the parts.

use std::sync::Arc;
use std::time::Duration;

use conformance::Target;
use lock_core::{LockBackend, LockError, OwnerId};

/// Independent clients (or tasks) in the throughput benchmarks.
pub(super) const CLIENTS: usize = 8;

/// What the measuring parts measure: the target, its URL, and whether the
/// run is the long one (more cycles, longer windows) or the quick one
/// (fewer rounds, the mutex only).
#[derive(Clone, Copy)]
pub(super) struct Bench<'a> {
    pub(super) target: &'a dyn Target,
    pub(super) url: &'a str,
    pub(super) full: bool,
    pub(super) quick: bool,
}

/// What each measuring part starts from: a client of the target (open while
/// the part runs), the TTL of the part's locks (10 s, or the backend's
/// minimum TTL if that is longer) and a fresh tag that keeps the part's keys
/// apart from other runs'.
pub(super) struct Start {
    pub(super) probe: Arc<dyn LockBackend>,
    pub(super) ttl: Duration,
    pub(super) run: String,
}

impl Start {
    /// Opens the part's client of `target` and draws its run tag.
    ///
    /// # Errors
    ///
    /// The target's client could not be opened.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the client being opened.
    pub(super) async fn of(target: &dyn Target) -> Result<Self, LockError> {
        let probe = target.client().await?;
        let ttl = Duration::from_secs(10).max(probe.capabilities().min_ttl);
        let run = OwnerId::random().to_hex()[..8].to_owned();
        Ok(Self { probe, ttl, run })
    }
}
