//! Moving a running fleet from one backend to another with no window in
//! which two processes hold the same key.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::LockBackend;
use crate::capabilities::{Capabilities, FencingScope, TtlModel, WaitStrategy};
use crate::error::{ErrorKind, LockError, Operation};
use crate::key::LockKey;
use crate::types::{FencingToken, Lease, LockInfo, OwnerId, SessionState};

/// Tokens granted through the new backend carry this epoch in their top
/// byte, so every one of them is greater than any token of the old backend
/// (whose raw tokens must stay below 2^56).
pub const NEW_EPOCH: u64 = 1 << 56;

/// Where one process stands in a migration.
///
/// Roll every process `Old → Dual`, and only when none is left on `Old`,
/// `Dual → New`. Adjacent phases exclude each other on every key: `Old` and
/// `Dual` through the old backend, `Dual` and `New` through the new one.
/// `Old` and `New` do **not** exclude each other: never run them together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MigrationPhase {
    /// Lock through the old backend only (tokens: the old backend's own).
    Old,
    /// Lock the old backend, then the new one; release both (tokens: the
    /// new backend's, in the new epoch).
    Dual,
    /// Lock through the new backend only (tokens: the new backend's, in the
    /// new epoch).
    New,
}

impl MigrationPhase {
    /// Parses `old`, `dual` or `new`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for anything else.
    pub fn parse(text: &str) -> Result<Self, LockError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "old" => Ok(Self::Old),
            "dual" => Ok(Self::Dual),
            "new" => Ok(Self::New),
            other => Err(LockError::config(format!(
                "unknown migration phase {other:?}: expected old, dual or new"
            ))),
        }
    }

    /// `old`, `dual` or `new`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Old => "old",
            Self::Dual => "dual",
            Self::New => "new",
        }
    }
}

/// A backend that migrates locks from `old` to `new` in phases.
///
/// # Fencing tokens across the rollout
///
/// `Old` hands out the old backend's tokens unchanged, so putting a fleet
/// behind this wrapper in phase `Old` changes nothing. `Dual` and `New`
/// hand out `NEW_EPOCH + t` where `t` is the new backend's token: dual and
/// new processes draw from one monotonic source, so their tokens interleave
/// correctly, and every one of them is above every old-backend token.
///
/// Safety holds at every boundary: a resource that checks tokens never
/// accepts a write out of order. The cost is liveness during the `Old +
/// Dual` stretch only: once a `Dual` process has written, writes from
/// processes still on `Old` carry lower tokens and are **rejected** by the
/// resource until they move to `Dual`. `Dual + New` costs nothing.
///
/// After the migration, keep this wrapper in phase `New` (a thin
/// pass-through): dropping it would hand out raw new-backend tokens, lower
/// than the epoch tokens the resource has already seen.
#[derive(Clone, Debug)]
pub struct MigrationBackend {
    old: Arc<dyn LockBackend>,
    new: Arc<dyn LockBackend>,
    phase: MigrationPhase,
}

impl MigrationBackend {
    /// Wraps the two backends in `phase`.
    pub fn new(
        old: Arc<dyn LockBackend>,
        new: Arc<dyn LockBackend>,
        phase: MigrationPhase,
    ) -> Self {
        Self { old, new, phase }
    }

    /// The phase.
    pub fn phase(&self) -> MigrationPhase {
        self.phase
    }

    /// The same backends in another phase.
    #[must_use]
    pub fn with_phase(&self, phase: MigrationPhase) -> Self {
        Self {
            old: self.old.clone(),
            new: self.new.clone(),
            phase,
        }
    }

    fn epoch_token(lease: &Lease) -> Result<FencingToken, LockError> {
        let raw = lease.token().get();
        if raw >= NEW_EPOCH {
            return Err(LockError::new(
                ErrorKind::Backend,
                Operation::Acquire,
                format!("new backend token {raw} does not fit below 2^56; cannot place it in the migration epoch"),
            )
            .with_key(lease.key()));
        }
        Ok(FencingToken::new(NEW_EPOCH | raw))
    }

    /// Builds the composite lease handed to users.
    fn compose(&self, old: Option<&Lease>, new: Option<&Lease>) -> Result<Lease, LockError> {
        let (key, ttl) = match (old, new) {
            (_, Some(l)) | (Some(l), None) => (l.key().clone(), l.ttl()),
            (None, None) => {
                return Err(LockError::new(
                    ErrorKind::Backend,
                    Operation::Acquire,
                    "empty migration lease",
                ));
            }
        };
        let token = match new {
            Some(new) => Self::epoch_token(new)?,
            None => old.map(Lease::token).unwrap_or(FencingToken::new(0)),
        };
        let deadline = [old, new]
            .into_iter()
            .flatten()
            .map(Lease::validity_deadline)
            .min()
            .unwrap_or_else(Instant::now);
        let owner = OwnerId::random();
        let data = format!(
            "m1|{}|{}|{}",
            owner.to_hex(),
            old.map_or_else(|| "-".to_owned(), Lease::to_handle),
            new.map_or_else(|| "-".to_owned(), Lease::to_handle)
        );
        let lease = Lease::from_parts(key, owner, token, ttl, deadline, data);
        let sessions: Vec<watch::Receiver<SessionState>> = [old, new]
            .into_iter()
            .flatten()
            .filter_map(|l| l.session().cloned())
            .collect();
        Ok(match sessions.len() {
            0 => lease,
            1 => lease.with_session(sessions.into_iter().next().expect("one session")),
            _ => lease.with_session(merge_sessions(sessions)),
        })
    }

    /// Splits a composite lease back into its parts.
    fn split(
        lease: &Lease,
        operation: Operation,
    ) -> Result<(Option<Lease>, Option<Lease>), LockError> {
        let bad = || {
            LockError::invalid_argument(operation, "not a lease of a migration backend")
                .with_key(lease.key())
        };
        let mut parts = lease.backend_data().split('|');
        if parts.next() != Some("m1") {
            return Err(bad());
        }
        // The composite's owner is part of its identity: a lease with the
        // same inner handles but another owner is not ours.
        if parts.next() != Some(lease.owner().to_hex().as_str()) {
            return Err(LockError::new(
                ErrorKind::NotHeld,
                operation,
                "the lease's owner does not match its migration grant",
            )
            .with_key(lease.key()));
        }
        let mut part = || -> Result<Option<Lease>, LockError> {
            match parts.next().ok_or_else(bad)? {
                "-" => Ok(None),
                handle => Lease::from_handle(handle).map(Some),
            }
        };
        let old = part()?;
        let new = part()?;
        Ok((old, new))
    }

    fn empty_error(operation: Operation) -> LockError {
        LockError::invalid_argument(operation, "migration lease holds no backend lease")
    }
}

/// One receiver that is `Lost` when any input is lost, `Suspect` when any
/// is suspect, `Alive` otherwise.
fn merge_sessions(inputs: Vec<watch::Receiver<SessionState>>) -> watch::Receiver<SessionState> {
    let combine = |inputs: &[watch::Receiver<SessionState>]| {
        let states: Vec<SessionState> = inputs.iter().map(|r| r.borrow().clone()).collect();
        if let Some(lost) = states.iter().find(|s| matches!(s, SessionState::Lost(_))) {
            lost.clone()
        } else if states.contains(&SessionState::Suspect) {
            SessionState::Suspect
        } else {
            SessionState::Alive
        }
    };
    let (tx, rx) = watch::channel(combine(&inputs));
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(async move {
            let mut inputs = inputs;
            loop {
                let changed = inputs.iter_mut().map(|r| Box::pin(r.changed()));
                let (result, _, _) = futures_select_all(changed.collect()).await;
                let state = if result.is_err() {
                    SessionState::Lost("session closed".to_owned())
                } else {
                    combine(&inputs)
                };
                let terminal = matches!(state, SessionState::Lost(_));
                if tx.send(state).is_err() || terminal {
                    return;
                }
            }
        });
    }
    rx
}

/// The first of several futures to finish (a tiny `select_all`).
async fn futures_select_all<F: std::future::Future + Unpin>(
    mut futures: Vec<F>,
) -> (F::Output, usize, Vec<F>) {
    std::future::poll_fn(move |cx| {
        for (i, fut) in futures.iter_mut().enumerate() {
            if let std::task::Poll::Ready(out) = std::pin::Pin::new(fut).poll(cx) {
                return std::task::Poll::Ready((out, i, Vec::new()));
            }
        }
        std::task::Poll::Pending
    })
    .await
}

#[async_trait]
impl LockBackend for MigrationBackend {
    fn name(&self) -> &'static str {
        "migration"
    }

    fn capabilities(&self) -> Capabilities {
        let old = self.old.capabilities();
        let new = self.new.capabilities();
        match self.phase {
            MigrationPhase::Old => old,
            MigrationPhase::New => Capabilities {
                fencing: match new.fencing {
                    FencingScope::None => FencingScope::None,
                    _ => FencingScope::PerKey,
                },
                ..new
            },
            MigrationPhase::Dual => Capabilities {
                fencing: match new.fencing {
                    FencingScope::None => FencingScope::None,
                    _ => FencingScope::PerKey,
                },
                fencing_survives_failover: new.fencing_survives_failover,
                waiting: if old.waiting == WaitStrategy::Notify
                    && new.waiting == WaitStrategy::Notify
                {
                    WaitStrategy::Notify
                } else {
                    WaitStrategy::Poll
                },
                fifo: false,
                ttl_model: if old.ttl_model == TtlModel::PerSession
                    || new.ttl_model == TtlModel::PerSession
                {
                    TtlModel::PerSession
                } else {
                    TtlModel::PerLease
                },
                // Exclusion in this phase rests on both stores.
                linearizable: old.linearizable && new.linearizable,
                min_ttl: old.min_ttl.max(new.min_ttl),
                shared_locks: false,
                semaphores: false,
            },
        }
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        match self.phase {
            MigrationPhase::Old => match self.old.try_acquire(key, ttl).await? {
                Some(old) => self.compose(Some(&old), None).map(Some),
                None => Ok(None),
            },
            MigrationPhase::New => match self.new.try_acquire(key, ttl).await? {
                Some(new) => self.compose(None, Some(&new)).map(Some),
                None => Ok(None),
            },
            MigrationPhase::Dual => {
                let Some(old) = self.old.try_acquire(key, ttl).await? else {
                    return Ok(None);
                };
                let new = match self.new.try_acquire(key, ttl).await {
                    Ok(Some(new)) => new,
                    other => {
                        // Never keep the first lock without the second.
                        let _ = self.old.release(&old).await;
                        return other.map(|_| None);
                    }
                };
                match self.compose(Some(&old), Some(&new)) {
                    Ok(lease) => Ok(Some(lease)),
                    Err(e) => {
                        let _ = self.new.release(&new).await;
                        let _ = self.old.release(&old).await;
                        Err(e)
                    }
                }
            }
        }
    }

    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        match self.phase {
            MigrationPhase::Old => {
                let old = self.old.acquire(key, ttl, deadline).await?;
                self.compose(Some(&old), None)
            }
            MigrationPhase::New => {
                let new = self.new.acquire(key, ttl, deadline).await?;
                self.compose(None, Some(&new))
            }
            MigrationPhase::Dual => {
                // Always old first, then new: one global order, no deadlock
                // between dual processes.
                let old = self.old.acquire(key, ttl, deadline).await?;
                let mut release_old = ReleaseOnDrop::new(self.old.clone(), old.clone());
                let new = self.new.acquire(key, ttl, deadline).await?;
                match self.compose(Some(&old), Some(&new)) {
                    Ok(lease) => {
                        release_old.disarm();
                        Ok(lease)
                    }
                    Err(e) => {
                        let _ = self.new.release(&new).await;
                        Err(e)
                    }
                }
            }
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        let (old, new) = Self::split(lease, Operation::Renew)?;
        let (old_deadline, new_deadline) = match (&old, &new) {
            (Some(old), Some(new)) => {
                let (a, b) = tokio::join!(self.old.renew(old), self.new.renew(new));
                (Some(a?), Some(b?))
            }
            (Some(old), None) => (Some(self.old.renew(old).await?), None),
            (None, Some(new)) => (None, Some(self.new.renew(new).await?)),
            (None, None) => return Err(Self::empty_error(Operation::Renew)),
        };
        Ok([old_deadline, new_deadline]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(Instant::now))
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let (old, new) = match Self::split(lease, Operation::Release) {
            Ok(parts) => parts,
            Err(e) if e.is_not_held() => return Ok(false),
            Err(e) => return Err(e),
        };
        // Reverse of the acquire order: new, then old.
        let new_held = match &new {
            Some(new) => Some(self.new.release(new).await?),
            None => None,
        };
        let old_held = match &old {
            Some(old) => Some(self.old.release(old).await?),
            None => None,
        };
        match (old_held, new_held) {
            (None, None) => Err(Self::empty_error(Operation::Release)),
            (a, b) => Ok(a.unwrap_or(true) && b.unwrap_or(true)),
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let epoch = |mut info: LockInfo| {
            info.token = info.token.map(|t| FencingToken::new(NEW_EPOCH | t.get()));
            info
        };
        match self.phase {
            MigrationPhase::Old => self.old.inspect(key).await,
            MigrationPhase::New => Ok(self.new.inspect(key).await?.map(epoch)),
            MigrationPhase::Dual => {
                if let Some(info) = self.new.inspect(key).await? {
                    return Ok(Some(epoch(info)));
                }
                // Held in the old store only: a process still on `old` (or a
                // dual acquire half-way). Say so, so operators can find them.
                Ok(self.old.inspect(key).await?.map(|mut info| {
                    info.holder = format!("old-only:{}", info.holder);
                    info
                }))
            }
        }
    }
}

/// Releases a lease in the background if the acquire that holds it is
/// dropped or fails before it can hand it out.
struct ReleaseOnDrop {
    backend: Arc<dyn LockBackend>,
    lease: Option<Lease>,
}

impl ReleaseOnDrop {
    fn new(backend: Arc<dyn LockBackend>, lease: Lease) -> Self {
        Self {
            backend,
            lease: Some(lease),
        }
    }

    fn disarm(&mut self) {
        self.lease = None;
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if let (Some(lease), Ok(handle)) =
            (self.lease.take(), tokio::runtime::Handle::try_current())
        {
            let backend = self.backend.clone();
            handle.spawn(async move {
                let _ = backend.release(&lease).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryBackend;

    fn pair() -> (Arc<dyn LockBackend>, Arc<dyn LockBackend>) {
        (
            Arc::new(MemoryBackend::new()),
            Arc::new(MemoryBackend::new()),
        )
    }

    #[tokio::test]
    async fn adjacent_phases_exclude_each_other() {
        let (old, new) = pair();
        let key = LockKey::new("k").unwrap();
        let ttl = Duration::from_secs(5);
        let on_old = MigrationBackend::new(old.clone(), new.clone(), MigrationPhase::Old);
        let on_dual = on_old.with_phase(MigrationPhase::Dual);
        let on_new = on_old.with_phase(MigrationPhase::New);

        let held = on_old.try_acquire(&key, ttl).await.unwrap().unwrap();
        assert!(on_dual.try_acquire(&key, ttl).await.unwrap().is_none());
        // The failed dual attempt left nothing in the new store.
        assert!(new.inspect(&key).await.unwrap().is_none());
        assert!(on_old.release(&held).await.unwrap());

        let dual = on_dual.try_acquire(&key, ttl).await.unwrap().unwrap();
        assert!(on_old.try_acquire(&key, ttl).await.unwrap().is_none());
        assert!(on_new.try_acquire(&key, ttl).await.unwrap().is_none());
        assert!(dual.token().get() > NEW_EPOCH);
        on_dual.renew(&dual).await.unwrap();
        assert!(on_dual.release(&dual).await.unwrap());
        assert!(!on_dual.release(&dual).await.unwrap());

        let newest = on_new.try_acquire(&key, ttl).await.unwrap().unwrap();
        assert!(on_dual.try_acquire(&key, ttl).await.unwrap().is_none());
        assert!(newest.token() > dual.token());
        assert!(on_new.release(&newest).await.unwrap());
    }

    #[tokio::test]
    async fn inspect_flags_old_only_holders_during_dual() {
        let (old, new) = pair();
        let key = LockKey::new("k").unwrap();
        let on_old = MigrationBackend::new(old, new, MigrationPhase::Old);
        let held = on_old
            .try_acquire(&key, Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        let info = on_old
            .with_phase(MigrationPhase::Dual)
            .inspect(&key)
            .await
            .unwrap()
            .unwrap();
        assert!(info.holder.starts_with("old-only:"), "{}", info.holder);
        on_old.release(&held).await.unwrap();
    }

    #[test]
    fn phases_parse() {
        assert_eq!(MigrationPhase::parse("Dual").unwrap(), MigrationPhase::Dual);
        assert_eq!(
            MigrationPhase::parse("x").unwrap_err().kind(),
            ErrorKind::Config
        );
    }
}
