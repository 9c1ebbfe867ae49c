//! The cutover guard against `Old` stragglers (see the module docs of
//! [`migration`](super)): the marker, its checks and the key-by-key
//! wait-out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::{Instant, sleep};

use super::{MOVED, MigrationBackend};
use crate::capabilities::TtlModel;
use crate::error::{ErrorKind, LockError, Operation};
use crate::key::LockKey;
use crate::options::MAX_TTL;
use crate::types::{Lease, clock_drift};

/// This process's view of the cutover, shared by clones and
/// [`with_phase`](MigrationBackend::with_phase) copies.
#[derive(Debug, Default)]
pub(super) struct Cutover {
    /// The marker was seen older than the wait-out: `New` grants need no
    /// look at the old backend any more.
    pub(super) done: AtomicBool,
    /// One marker check / announcement at a time.
    pub(super) turn: Mutex<()>,
    /// When this process first saw the marker (its age where the backend
    /// cannot tell).
    pub(super) first_seen: std::sync::Mutex<Option<Instant>>,
}

impl Cutover {
    fn first_seen(&self) -> Option<Instant> {
        *self
            .first_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_first_seen(&self, at: Option<Instant>) {
        *self
            .first_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = at;
    }
}

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

    /// Phase `New`: makes sure the cutover marker exists in the old
    /// backend (announcing it if not). `None` once the marker is older than
    /// the wait-out (from then on the old backend is not consulted again);
    /// otherwise the instant at which it will be.
    pub(super) async fn cutover_pending(&self) -> Result<Option<Instant>, LockError> {
        if self.cutover.done.load(Ordering::Acquire) {
            return Ok(None);
        }
        let _turn = self.cutover.turn.lock().await;
        if self.cutover.done.load(Ordering::Acquire) {
            return Ok(None);
        }
        let needed = self.old_lease_max + clock_drift(self.old_lease_max);
        let server_age_counts = self.old.capabilities().ttl_model == TtlModel::PerLease;
        let mut attempts = 0;
        let (now, server_age) = loop {
            let now = Instant::now();
            match self.old.inspect(&self.cutover_key).await? {
                Some(info) => {
                    let age = info
                        .remaining_ttl
                        .filter(|_| server_age_counts)
                        .map(|left| MAX_TTL.saturating_sub(left));
                    break (now, age);
                }
                None => {
                    self.cutover.set_first_seen(None);
                    if self
                        .old
                        .try_acquire(&self.cutover_key, MAX_TTL)
                        .await?
                        .is_some()
                    {
                        // Never renewed or released: it lasts its TTL.
                        tracing::info!(
                            migration = %self.name,
                            marker = %self.cutover_key,
                            "announced the cutover to the new backend in the old backend"
                        );
                        break (now, Some(Duration::ZERO));
                    }
                    // Someone announced between our read and our take.
                    attempts += 1;
                    if attempts >= 5 {
                        return Err(LockError::new(
                            ErrorKind::Unavailable,
                            Operation::Acquire,
                            "the migration's cutover marker is neither readable nor free in the old backend",
                        )
                        .with_key(&self.cutover_key));
                    }
                    sleep(Duration::from_millis(5)).await;
                }
            }
        };
        let first_seen = self.cutover.first_seen().unwrap_or(now);
        self.cutover.set_first_seen(Some(first_seen));
        let age = server_age
            .unwrap_or(Duration::ZERO)
            .max(now.saturating_duration_since(first_seen));
        if age >= needed {
            self.cutover.done.store(true, Ordering::Release);
            return Ok(None);
        }
        Ok(Some(now.checked_add(needed - age).unwrap_or(now)))
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
            Some(deadline) => match self.old.acquire(key, ttl, deadline.min(ready_at)).await {
                Ok(old) => old,
                // Held all along until the wait-out passed: every old
                // promise has ended by now.
                Err(e) if e.is_contended() && Instant::now() >= ready_at => return Ok(true),
                Err(e) if e.is_contended() => return Ok(false),
                Err(e) => return Err(e),
            },
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
