//! The cutover marker in the old store while `New` runs: asserting it
//! (re-creating it when it vanished, renewing this process's own before
//! its TTL runs out), the record of the longest old TTL beside it, and the
//! keeper task that does both every refresh interval (see the module docs
//! of [`migration`](super)).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::{Instant, sleep};

use crate::backend::LockBackend;
use crate::calls::LockBackendExt;
use crate::error::{ErrorKind, LockError, Operation};
use crate::key::LockKey;
use crate::options::MAX_TTL;
use crate::runtime::RenewalRuntime;
use crate::types::{FencingToken, Lease, ListQuery, LockInfo};

/// This process's view of the cutover, shared by clones and
/// [`with_phase`](MigrationBackend::with_phase) copies.
#[derive(Debug, Default)]
pub(super) struct Cutover {
    /// The marker was seen older than the wait-out: `New` grants need no
    /// look at the old backend any more. Cleared again by the keeper when
    /// the marker was set again since its last look.
    pub(super) done: AtomicBool,
    /// One marker check, announcement or keeper round at a time, with
    /// what they share.
    pub(super) turn: Mutex<Seen>,
    /// The keeper task was started.
    pub(super) keeper: AtomicBool,
}

/// What the marker checks of one process remember.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// When this process first saw the current marker (its age where the
    /// backend cannot tell).
    pub(super) first_seen: Option<Instant>,
    /// The current marker's holder and token: a different one means the
    /// marker vanished and was set again.
    pub(super) marker_id: Option<(String, Option<FencingToken>)>,
    /// The marker, when this process set it (renewed by the keeper).
    pub(super) marker_lease: Option<Lease>,
    /// This process's record of its `old_lease_max`, when it set it.
    pub(super) record_lease: Option<Lease>,
    /// The record was asserted since the current marker was first seen.
    pub(super) recorded: bool,
    /// The wait-out last read from the records of the current marker
    /// (read when it is first seen and again before it is declared old
    /// enough, not at every grant: listing can be costly).
    pub(super) wait_out: Option<Duration>,
}

/// The prefix of the reserved keys that record, beside a migration's
/// cutover marker, the longest TTL a process in phase `Old` may hold
/// (`__distlock/migration-old-ttl/<name>/<milliseconds>`). The trait gives
/// a lock no payload, so the value is the key's last segment.
pub(super) const OLD_TTL_RECORD_PREFIX: &str = "__distlock/migration-old-ttl/";

/// The most pages one reading of the records goes through. A fleet
/// writes one record per distinct `old_ttl`, but a page can come back
/// empty with a cursor (Redis scans its keyspace a bounded slice per
/// page), so this bounds the reading on a large store rather than the
/// number of records.
const RECORD_PAGES: usize = 100;

/// The marker as one observation saw it.
pub(super) struct Observed {
    /// What `inspect` reported.
    pub(super) info: LockInfo,
    /// When the `inspect` that saw it was sent.
    pub(super) at: Instant,
    /// It is not the marker this process saw last: the one before
    /// vanished and this one was set since (by us or another process).
    pub(super) changed: bool,
}

/// Where a migration's marker and records live in the old store, and the
/// wait-out this process records.
#[derive(Clone, Debug)]
pub(super) struct MarkerSite {
    pub(super) old: Arc<dyn LockBackend>,
    pub(super) marker: LockKey,
    pub(super) name: String,
    pub(super) old_lease_max: Duration,
}

/// The record key of `old_lease_max` for migration `name`.
pub(super) fn record_key(name: &str, old_lease_max: Duration) -> Result<LockKey, LockError> {
    let ms = old_lease_max.min(MAX_TTL).as_millis();
    LockKey::new(format!("{OLD_TTL_RECORD_PREFIX}{name}/{ms}"))
}

/// The prefix every record key of migration `name` starts with.
pub(super) fn record_prefix(name: &str) -> String {
    format!("{OLD_TTL_RECORD_PREFIX}{name}/")
}

/// Makes sure `key` is held in `old` by someone: takes it (with
/// [`MAX_TTL`], into `ours`) when it is free, and renews `ours` when half
/// its TTL is gone. Returns what `inspect` saw last, when that `inspect`
/// was sent, and whether this call took the key.
async fn assert_held(
    old: &dyn LockBackend,
    key: &LockKey,
    ours: &mut Option<Lease>,
) -> Result<(LockInfo, Instant, bool), LockError> {
    let mut took = false;
    for _ in 0..5 {
        let at = Instant::now();
        if let Some(info) = old.inspect(key).await? {
            // Only our own lease can be extended; another process's
            // marker is checked again when it runs out (see `keep`).
            if let Some(lease) = ours.as_mut()
                && info
                    .remaining_ttl
                    .is_some_and(|left| left < lease.ttl() / 2)
            {
                match old.renew(lease).await {
                    Ok(until) => lease.set_validity_deadline(until),
                    // The key is held, but not by this lease any more.
                    Err(e) if matches!(e.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost) => {
                        *ours = None;
                    }
                    Err(e) => return Err(e),
                }
            }
            return Ok((info, at, took));
        }
        if let Some(lease) = old.try_acquire(key, MAX_TTL).await? {
            // Never released: when this process ends it lasts its TTL (or
            // its session), and a `New` process still running sets it
            // again if it vanishes.
            *ours = Some(lease);
            took = true;
            continue;
        }
        // Taken between our read and our take: read it again.
        sleep(Duration::from_millis(5)).await;
    }
    Err(LockError::new(
        ErrorKind::Unavailable,
        Operation::Acquire,
        "the migration's cutover marker (or its record) is neither readable nor free in the old backend",
    )
    .with_key(key))
}

impl MarkerSite {
    /// Makes sure the marker is set in the old store (setting it again if
    /// it vanished) and tells whether it is the one this process saw last.
    /// A marker seen for the first time, or set again, starts its age
    /// afresh (`first_seen` is cleared).
    pub(super) async fn assert_marker(&self, seen: &mut Seen) -> Result<Observed, LockError> {
        let (info, at, took) =
            assert_held(&*self.old, &self.marker, &mut seen.marker_lease).await?;
        let id = (info.holder.clone(), info.token);
        let changed = seen.marker_id.as_ref().is_some_and(|last| *last != id);
        if changed || seen.marker_id.is_none() {
            seen.first_seen = None;
            seen.recorded = false;
            seen.wait_out = None;
        }
        seen.marker_id = Some(id);
        if took {
            tracing::info!(
                migration = %self.name,
                marker = %self.marker,
                again = changed,
                "announced the cutover to the new backend in the old backend"
            );
        }
        Ok(Observed { info, at, changed })
    }

    /// Makes sure the old store records this process's `old_lease_max`
    /// beside the marker.
    pub(super) async fn assert_record(&self, seen: &mut Seen) -> Result<(), LockError> {
        let key = record_key(&self.name, self.old_lease_max)?;
        assert_held(&*self.old, &key, &mut seen.record_lease).await?;
        seen.recorded = true;
        Ok(())
    }

    /// The longest `old_lease_max` any `New` process recorded beside the
    /// marker; `None` when there is none, or when the old backend cannot
    /// list its keys (then only the local value counts). A listing cut
    /// short after [`RECORD_PAGES`] pages counts what it found, and says
    /// so in the log.
    pub(super) async fn recorded_old_lease_max(&self) -> Result<Option<Duration>, LockError> {
        let prefix = record_prefix(&self.name);
        let mut query = ListQuery::new(prefix.clone(), 100);
        let mut longest: Option<u64> = None;
        for _ in 0..RECORD_PAGES {
            let page = match self.old.list(&query).await {
                Ok(page) => page,
                Err(e) if e.kind() == ErrorKind::Unsupported => {
                    tracing::debug!(
                        migration = %self.name,
                        "the old backend cannot list keys: the wait-out is the local old_lease_max"
                    );
                    return Ok(None);
                }
                Err(e) => return Err(e),
            };
            for info in &page.locks {
                // `<prefix><digits>` only: a migration whose name extends
                // this one's (`<name>/...`) records under a longer prefix.
                let ms = info
                    .key
                    .as_str()
                    .strip_prefix(prefix.as_str())
                    .and_then(|rest| {
                        rest.bytes()
                            .all(|b| b.is_ascii_digit())
                            .then(|| rest.parse::<u64>().ok())
                            .flatten()
                    });
                if let Some(ms) = ms {
                    longest = Some(longest.map_or(ms, |l| l.max(ms)));
                }
            }
            match query.next_page(page.cursor) {
                Some(next) => query = next,
                None => return Ok(longest.map(|ms| Duration::from_millis(ms).min(MAX_TTL))),
            }
        }
        tracing::warn!(
            migration = %self.name,
            pages = RECORD_PAGES,
            "the old backend's listing of the old-TTL records did not finish; \
             the wait-out counts the records found so far"
        );
        Ok(longest.map(|ms| Duration::from_millis(ms).min(MAX_TTL)))
    }
}

/// Starts the keeper of `site`'s marker once per cutover state, on the
/// renewal runtime (a blocked application runtime does not stop it). It
/// ends when the last handle on `cutover` is dropped.
pub(super) fn start_keeper(site: &MarkerSite, cutover: &Arc<Cutover>, every: Duration) {
    if every.is_zero() || cutover.keeper.swap(true, Ordering::AcqRel) {
        return;
    }
    let task = keep(site.clone(), Arc::downgrade(cutover), every);
    if let Err(e) = RenewalRuntime::dedicated().spawn(task) {
        cutover.keeper.store(false, Ordering::Release);
        tracing::warn!(
            migration = %site.name,
            error = %e,
            "cannot start the keeper of the cutover marker; the next grant tries again"
        );
    }
}

/// Every `every`, while `state` lives: asserts the marker (and this
/// process's record), and when the marker was set again since the last
/// look, makes `New` grants wait the old leases out again.
async fn keep(site: MarkerSite, state: Weak<Cutover>, every: Duration) {
    let mut failing = false;
    let mut next = every;
    loop {
        sleep(next).await;
        let Some(cutover) = state.upgrade() else {
            return;
        };
        let mut seen = cutover.turn.lock().await;
        next = every;
        match site.assert_marker(&mut seen).await {
            Ok(observed) => {
                if observed.changed {
                    cutover.done.store(false, Ordering::Release);
                    tracing::warn!(
                        migration = %site.name,
                        marker = %site.marker,
                        "the cutover marker had vanished from the old backend and is set again; \
                         `new` grants take each key in the old backend again until the wait-out has passed"
                    );
                }
                // Another process's marker cannot be renewed from here:
                // look again right after it runs out.
                if let Some(left) = observed.info.remaining_ttl {
                    next = every.min(left + Duration::from_millis(1));
                }
                if failing {
                    tracing::info!(migration = %site.name, "the cutover marker is checked again");
                    failing = false;
                }
            }
            Err(e) => {
                if failing {
                    tracing::debug!(migration = %site.name, error = %e, "cannot check the cutover marker");
                } else {
                    tracing::warn!(
                        migration = %site.name,
                        error = %e,
                        "cannot check the cutover marker in the old backend; retrying every refresh"
                    );
                }
                failing = true;
            }
        }
        if !failing && let Err(e) = site.assert_record(&mut seen).await {
            tracing::debug!(migration = %site.name, error = %e, "cannot record the old TTL");
        }
    }
}
