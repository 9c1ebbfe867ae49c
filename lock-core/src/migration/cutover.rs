//! The cutover guard against `Old` stragglers (see the module docs of
//! [`migration`](super)): the marker, its checks and the key-by-key
//! wait-out.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::marker::{MarkerSite, start_keeper};
use super::{MOVED, MigrationBackend};
use crate::calls::LockBackendExt;
use crate::capabilities::TtlModel;
use crate::error::{ErrorKind, LockError, Operation};
use crate::key::LockKey;
use crate::options::MAX_TTL;
use crate::types::{Lease, clock_drift};

impl MigrationBackend {
    /// The cutover check of the `Old` phase, made after the old-backend
    /// grant or renewal: fails when the marker is set (or cannot be read).
    pub(super) async fn check_not_cut_over(
        &self,
        key: &LockKey,
        operation: Operation,
    ) -> Result<(), LockError> {
        match self.old.inspect(&self.cutover_key).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => {
                let kind = if operation == Operation::Renew {
                    ErrorKind::LeaseLost
                } else {
                    ErrorKind::Config
                };
                let detail = if operation == Operation::Renew {
                    "; the old-backend lease is left to expire"
                } else {
                    ""
                };
                Err(LockError::new(
                    kind,
                    operation,
                    format!(
                        "{MOVED} (the cutover marker {:?} of migration {:?} is set in the old backend{detail})",
                        self.cutover_key.as_str(),
                        self.name
                    ),
                )
                .with_key(key))
            }
            Err(e) => Err(LockError::new(
                e.kind(),
                operation,
                format!(
                    "cannot read the migration's cutover marker: {}",
                    e.message()
                ),
            )
            .with_key(key)
            .with_source(e)),
        }
    }

    /// An `Old`-phase grant: refused (and released) when its token is in
    /// our epoch or the fleet has cut over.
    pub(super) async fn admit_old(
        &self,
        old: Lease,
        operation: Operation,
    ) -> Result<Lease, LockError> {
        let checked = match self.check_old_epoch(&old, operation) {
            Ok(()) => self.check_not_cut_over(old.key(), operation).await,
            Err(e) => Err(e),
        };
        if let Err(e) = checked {
            let _ = self.old.release(&old).await;
            return Err(e);
        }
        self.finish(Some(old), None).await
    }

    /// Where this migration's marker lives, for the marker checks.
    pub(super) fn marker_site(&self) -> MarkerSite {
        MarkerSite {
            old: self.old.clone(),
            marker: self.cutover_key.clone(),
            name: self.name.clone(),
            old_lease_max: self.old_lease_max,
        }
    }

    /// Phase `New`: makes sure the cutover marker exists in the old
    /// backend (announcing it if not, or again if it vanished), records
    /// this process's `old_lease_max` beside it, and starts the keeper
    /// that keeps both while this process runs. `None` once the marker is
    /// older than the wait-out (from then on grants do not consult the old
    /// backend, until the keeper finds the marker set again); otherwise
    /// the instant at which it will be.
    ///
    /// The wait-out is the longest `old_lease_max` recorded beside the
    /// marker by any `New` process, or this process's own if longer.
    pub(super) async fn cutover_pending(&self) -> Result<Option<Instant>, LockError> {
        if self.cutover.done.load(Ordering::Acquire) {
            return Ok(None);
        }
        let mut seen = self.cutover.turn.lock().await;
        if self.cutover.done.load(Ordering::Acquire) {
            return Ok(None);
        }
        let site = self.marker_site();
        let observed = site.assert_marker(&mut seen).await?;
        start_keeper(&site, &self.cutover, self.marker_refresh);
        if !seen.recorded {
            site.assert_record(&mut seen).await?;
        }
        let server_age = observed
            .info
            .remaining_ttl
            .filter(|_| self.old.capabilities().ttl_model == TtlModel::PerLease)
            .map(|left| MAX_TTL.saturating_sub(left));
        let now = observed.at;
        let first_seen = *seen.first_seen.get_or_insert(now);
        let age = server_age
            .unwrap_or(Duration::ZERO)
            .max(now.saturating_duration_since(first_seen));
        let mut fresh = false;
        let mut wait_out = match seen.wait_out {
            Some(wait_out) => wait_out,
            None => {
                fresh = true;
                self.wait_out(&site).await?
            }
        };
        if age >= wait_out + clock_drift(wait_out) && !fresh {
            // About to stop looking: read the records once more, in case a
            // process with a longer `old_ttl` recorded it meanwhile.
            wait_out = self.wait_out(&site).await?;
        }
        seen.wait_out = Some(wait_out);
        let needed = wait_out + clock_drift(wait_out);
        if age >= needed {
            self.cutover.done.store(true, Ordering::Release);
            return Ok(None);
        }
        Ok(Some(now.checked_add(needed - age).unwrap_or(now)))
    }

    /// The wait-out: the longest `old_lease_max` recorded beside the
    /// marker, or this process's own if longer.
    async fn wait_out(&self, site: &MarkerSite) -> Result<Duration, LockError> {
        Ok(site
            .recorded_old_lease_max()
            .await?
            .map_or(self.old_lease_max, |recorded| {
                recorded.max(self.old_lease_max)
            }))
    }

    /// Phase `New` before the wait-out has passed: proves that no `Old`
    /// promise on `key` is open by taking `key` once in the old backend
    /// (after the marker was confirmed) and giving it straight back.
    /// `Ok(false)` when the key stayed held at `deadline`.
    pub(super) async fn clear_old_side(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Option<Instant>,
        ready_at: Instant,
    ) -> Result<bool, LockError> {
        let old = match deadline {
            None => match self.old.try_acquire(key, ttl).await? {
                Some(old) => old,
                None => return Ok(false),
            },
            Some(deadline) => {
                let mut ready_at = ready_at;
                loop {
                    match self.old.acquire(key, ttl, deadline.min(ready_at)).await {
                        Ok(old) => break old,
                        // Held all along until the wait-out passed: every
                        // old promise has ended by now, unless the wait-out
                        // grew meanwhile (a longer `old_ttl` recorded, the
                        // marker set again): ask again, and wait on if so.
                        Err(e) if e.is_contended() && Instant::now() >= ready_at => {
                            match self.cutover_pending().await? {
                                None => return Ok(true),
                                Some(later) if Instant::now() < deadline => ready_at = later,
                                Some(_) => return Ok(false),
                            }
                        }
                        Err(e) if e.is_contended() => return Ok(false),
                        Err(e) => return Err(e),
                    }
                }
            }
        };
        // If this release fails the old lease expires with its TTL; `Old`
        // processes are refused meanwhile and `Dual` ones wait.
        let _ = self.old.release(&old).await;
        Ok(true)
    }

    pub(super) fn cutover_contended(&self, key: &LockKey) -> LockError {
        LockError::new(
            ErrorKind::Contended,
            Operation::Acquire,
            "still held in the old backend at the wait deadline (phase new takes each key once in the old backend until the cutover's wait-out has passed)",
        )
        .with_key(key)
    }
}
