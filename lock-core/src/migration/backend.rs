//! The [`LockBackend`] implementation and its elections: each operation by
//! phase.

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::dual::worse;
use super::{MigrationBackend, MigrationPhase};
use crate::backend::{GrantRequest, LockBackend, unsupported_shape};
use crate::calls::LockBackendExt;
use crate::capabilities::{Capabilities, FencingScope, TtlModel, WaitStrategy};
use crate::election::{Leader, election_lock_key};
use crate::error::{LockError, Operation};
use crate::facets::{Elections, Facets, WatchRequest};
use crate::key::LockKey;
use crate::kind::{HolderInfo, LockShape};
use crate::types::Lease;

#[async_trait]
impl LockBackend for MigrationBackend {
    fn name(&self) -> &'static str {
        "migration"
    }

    fn capabilities(&self) -> Capabilities {
        let old = self.old.capabilities();
        let new = self.new.capabilities();
        // A migration moves mutexes only: read-write locks and semaphores
        // are not bridged between the stores in any phase.
        match self.phase {
            MigrationPhase::Old => Capabilities {
                shared_locks: false,
                semaphores: false,
                ..old
            },
            MigrationPhase::New => Capabilities {
                fencing: match new.fencing {
                    FencingScope::None => FencingScope::None,
                    _ => FencingScope::PerKey,
                },
                shared_locks: false,
                semaphores: false,
                ..new
            },
            MigrationPhase::Dual => Capabilities {
                fencing: match new.fencing {
                    FencingScope::None => FencingScope::None,
                    _ => FencingScope::PerKey,
                },
                fencing_survives_failover: new.fencing_survives_failover,
                grants_survive_restart: new.grants_survive_restart && old.grants_survive_restart,
                waiting: if old.waiting == WaitStrategy::Notify
                    && new.waiting == WaitStrategy::Notify
                {
                    WaitStrategy::Notify
                } else {
                    WaitStrategy::Poll
                },
                fifo: false,
                // The looser of the two: a lease of the pair lasts as
                // long as its longest-lived part.
                ttl_model: match (old.ttl_model, new.ttl_model) {
                    (TtlModel::PerProcess, _) | (_, TtlModel::PerProcess) => TtlModel::PerProcess,
                    (TtlModel::PerSession, _) | (_, TtlModel::PerSession) => TtlModel::PerSession,
                    _ => TtlModel::PerLease,
                },
                // Exclusion in this phase rests on both stores.
                linearizable: old.linearizable && new.linearizable,
                min_ttl: old.min_ttl.max(new.min_ttl),
                shared_locks: false,
                semaphores: false,
                // Its inspect composes both sides' answers; it claims none.
                holder_details: false,
                // A dual grant holds on both stores at once.
                max_held: match (old.max_held, new.max_held) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                },
            },
        }
    }

    /// Mutexes only: a migration does not bridge read-write locks or
    /// semaphores between the stores.
    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        request.mutex_only(LockBackend::name(self))?;
        let GrantRequest {
            key, ttl, deadline, ..
        } = request;
        match deadline {
            None => self.try_take(key, ttl).await,
            Some(deadline) => self.take_waiting(key, ttl, deadline).await.map(Some),
        }
    }

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        crate::renew_many::renew_concurrently(leases, crate::RENEW_CONCURRENCY, |lease| {
            self.renew_one(lease)
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let (old, new) = match Self::split(lease, Operation::Release) {
            Ok(parts) => parts,
            Err(e) if e.is_not_held() => return Ok(false),
            Err(e) => return Err(e),
        };
        if old.is_none() && new.is_none() {
            return Err(Self::empty_error(Operation::Release));
        }
        // Reverse of the acquire order: new, then old; the second is
        // attempted whatever happened to the first.
        let new_result = match &new {
            Some(new) => Some(self.new.release(new).await),
            None => None,
        };
        let old_result = match &old {
            Some(old) => Some(self.old.release(old).await),
            None => None,
        };
        let mut held = true;
        let mut first_error = None;
        for result in [new_result, old_result].into_iter().flatten() {
            match result {
                Ok(h) => held &= h,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(held),
        }
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        if shape != LockShape::Mutex {
            return Err(unsupported_shape(LockBackend::name(self), key, shape));
        }
        self.check_key(key, Operation::Inspect)?;
        Ok(crate::kind::mutex_holders(
            self.read_by_phase(self.old.inspect(key), self.new.inspect(key))
                .await?,
        ))
    }

    fn facets(&self) -> Facets<'_> {
        Facets {
            elections: Some(self),
            ..Facets::default()
        }
    }
}

/// The mutex's calls by phase.
impl MigrationBackend {
    async fn try_take(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.check_key(key, Operation::TryAcquire)?;
        match self.phase {
            MigrationPhase::Old => match self.old.try_acquire(key, ttl).await? {
                Some(old) => self.admit_old(old, Operation::TryAcquire).await.map(Some),
                None => Ok(None),
            },
            MigrationPhase::New => {
                if let Some(ready_at) = self.cutover_pending().await?
                    && !self.clear_old_side(key, ttl, None, ready_at).await?
                {
                    return Ok(None);
                }
                match self.new.try_acquire(key, ttl).await? {
                    Some(new) => self.finish(None, Some(new)).await.map(Some),
                    None => Ok(None),
                }
            }
            MigrationPhase::Dual => {
                let Some(old) = self.old.try_acquire(key, ttl).await? else {
                    return Ok(None);
                };
                if let Err(e) = self.check_old_epoch(&old, Operation::TryAcquire) {
                    let _ = self.old.release(&old).await;
                    return Err(e);
                }
                let new = match self.new.try_acquire(key, ttl).await {
                    Ok(Some(new)) => new,
                    other => {
                        // Never keep the first lock without the second.
                        let _ = self.old.release(&old).await;
                        return other.map(|_| None);
                    }
                };
                self.finish(Some(old), Some(new)).await.map(Some)
            }
        }
    }

    async fn take_waiting(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.check_key(key, Operation::Acquire)?;
        match self.phase {
            MigrationPhase::Old => {
                let old = self.old.acquire(key, ttl, deadline).await?;
                self.admit_old(old, Operation::Acquire).await
            }
            MigrationPhase::New => {
                if let Some(ready_at) = self.cutover_pending().await?
                    && !self
                        .clear_old_side(key, ttl, Some(deadline), ready_at)
                        .await?
                {
                    return Err(self.cutover_contended(key));
                }
                let new = self.new.acquire(key, ttl, deadline).await?;
                self.finish(None, Some(new)).await
            }
            MigrationPhase::Dual => {
                // Always old first, then new: one global order, no deadlock
                // between dual processes.
                let old = self.old.acquire(key, ttl, deadline).await?;
                self.dual_grant(key, ttl, old, self.new.acquire(key, ttl, deadline))
                    .await
            }
        }
    }

    async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        let (old, new) = Self::split(lease, Operation::Renew)?;
        match (&old, &new) {
            (Some(old), Some(new)) => {
                let (a, b) = tokio::join!(self.old.renew(old), self.new.renew(new));
                match (a, b) {
                    (Ok(a), Ok(b)) => Ok(a.min(b)),
                    (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
                    (Err(a), Err(b)) => Err(worse(a, b)),
                }
            }
            (Some(old), None) => {
                let until = self.old.renew(old).await?;
                // An old-only lease belongs to phase `Old`: once the fleet
                // has cut over it may not be extended (the new deadline is
                // not handed back, so the previous one stays in force).
                self.check_not_cut_over(lease.key(), Operation::Renew)
                    .await?;
                Ok(until)
            }
            (None, Some(new)) => self.new.renew(new).await,
            (None, None) => Err(Self::empty_error(Operation::Renew)),
        }
    }
}

#[async_trait]
impl Elections for MigrationBackend {
    /// Elections follow the phases as locks do, on each store's own
    /// election layout (so processes on the plain old backend and on phase
    /// `old` see the same leader, and phase `new` the same as the plain new
    /// backend): `old` campaigns in the old store; `dual`, and `new` until
    /// the cutover is confirmed, campaign in the old store and then in the
    /// new one (holding both, the old renewed while the new is awaited);
    /// `new` after the cutover campaigns in the new store only. Terms carry
    /// the migration's epoch as lock tokens do.
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let key = election_lock_key(election)?;
        self.check_key(&key, Operation::Acquire)?;
        if self.phase == MigrationPhase::Old {
            let old = self.old.campaign(election, ttl, deadline).await?;
            return self.admit_old(old, Operation::Acquire).await;
        }
        if self.phase == MigrationPhase::New && self.cutover_pending().await?.is_none() {
            let new = self.new.campaign(election, ttl, deadline).await?;
            return self.finish(None, Some(new)).await;
        }
        let old = self.old.campaign(election, ttl, deadline).await?;
        self.dual_grant(&key, ttl, old, self.new.campaign(election, ttl, deadline))
            .await
    }

    /// Phase `old` wakes on the old store's watch; the others poll
    /// [`leader`](Self::leader) (terms and `old-only:` marks are mapped
    /// there).
    async fn watch_leader(
        &self,
        request: WatchRequest<'_, Leader>,
    ) -> Result<Option<Leader>, LockError> {
        if self.phase == MigrationPhase::Old {
            return self.old.watch_leader(request).await;
        }
        crate::calls::poll_leader(self, request).await
    }

    /// The leader in the store the phase decides in (`dual`: the new
    /// store's, else the old store's, marked `old-only:` as `inspect` does
    /// and without a term).
    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        self.read_by_phase(self.old.leader(election), self.new.leader(election))
            .await
    }
}
