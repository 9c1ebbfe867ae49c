//! Dual grants and token epochs: composing one lease of an old and a new
//! one, splitting it back, and waiting for the new side while renewing the
//! old.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use super::{EPOCH_SHIFT, MigrationBackend, MigrationPhase, NEW_EPOCH, OLD_ONLY_MARK};
use crate::backend::LockBackend;
use crate::calls::LockBackendExt;
use crate::election::Leader;
use crate::error::{ErrorKind, LockError, Operation};
use crate::key::LockKey;
use crate::types::{FencingToken, Lease, LockInfo, OwnerId, SessionState};

impl MigrationBackend {
    pub(super) fn epoch_base(&self) -> u64 {
        u64::from(self.epoch) << EPOCH_SHIFT
    }

    /// What `inspect` and `leader` read, by phase: `old` the old store's
    /// record as it is; `new` the new store's, its token carrying the
    /// migration's epoch; `dual` the new store's if it has one (with the
    /// epoch), else the old store's, [marked](Record::old_only) old-only.
    /// Only the phase's reads run (the futures are lazy), the new store's
    /// first.
    pub(super) async fn read_by_phase<T: Record>(
        &self,
        old: impl Future<Output = Result<Option<T>, LockError>> + Send,
        new: impl Future<Output = Result<Option<T>, LockError>> + Send,
    ) -> Result<Option<T>, LockError> {
        let base = self.epoch_base();
        let epoch = |mut record: T| {
            let token = record.token();
            *token = token.map(|t| FencingToken::new(base | t.get()));
            record
        };
        match self.phase {
            MigrationPhase::Old => old.await,
            MigrationPhase::New => Ok(new.await?.map(epoch)),
            MigrationPhase::Dual => {
                if let Some(record) = new.await? {
                    return Ok(Some(epoch(record)));
                }
                Ok(old.await?.map(T::old_only))
            }
        }
    }

    pub(super) fn epoch_token(&self, lease: &Lease) -> Result<FencingToken, LockError> {
        let raw = lease.token().get();
        if raw >= NEW_EPOCH {
            return Err(LockError::new(
                ErrorKind::Backend,
                Operation::Acquire,
                format!("new backend token {raw} does not fit below 2^56; cannot place it in the migration epoch"),
            )
            .with_key(lease.key()));
        }
        Ok(FencingToken::new(self.epoch_base() | raw))
    }

    /// Refuses an old-side grant whose token is already in this
    /// migration's epoch or above: our own tokens would not stay above it.
    pub(super) fn check_old_epoch(
        &self,
        old: &Lease,
        operation: Operation,
    ) -> Result<(), LockError> {
        let epoch = old.token().get() >> EPOCH_SHIFT;
        if epoch >= u64::from(self.epoch) {
            return Err(LockError::new(
                ErrorKind::Config,
                operation,
                format!(
                    "the old backend hands out tokens of migration epoch {epoch} (is it itself a migration?); \
                     this migration stamps epoch {}, so its tokens would not stay above them: \
                     build it with MigrationBackend::stacked",
                    self.epoch
                ),
            )
            .with_key(old.key()));
        }
        Ok(())
    }

    pub(super) fn check_key(&self, key: &LockKey, operation: Operation) -> Result<(), LockError> {
        // Reserved first: no allocation on the path of ordinary keys.
        if key.is_reserved()
            && (*key == self.cutover_key
                || key
                    .as_str()
                    .starts_with(&super::marker::record_prefix(&self.name)))
        {
            return Err(LockError::invalid_argument(
                operation,
                "this key holds the migration's cutover marker (or its record) and cannot be locked through it",
            )
            .with_key(key));
        }
        Ok(())
    }

    /// Builds the composite lease handed to users.
    ///
    /// Fails with [`ErrorKind::LeaseLost`] when the composed deadline (the
    /// earlier of both sides') has already passed: such a lease is never
    /// handed out.
    pub(super) fn compose(
        &self,
        old: Option<&Lease>,
        new: Option<&Lease>,
    ) -> Result<Lease, LockError> {
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
            Some(new) => self.epoch_token(new)?,
            None => old.map(Lease::token).unwrap_or(FencingToken::new(0)),
        };
        let deadline = [old, new]
            .into_iter()
            .flatten()
            .map(Lease::validity_deadline)
            .min()
            .unwrap_or_else(Instant::now);
        if deadline <= Instant::now() {
            return Err(LockError::new(
                ErrorKind::LeaseLost,
                Operation::Acquire,
                "the migration lease's deadline (the earlier of its two sides') had already passed when both sides were granted",
            )
            .with_key(&key));
        }
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

    /// Composes, or releases both sides and fails.
    pub(super) async fn finish(
        &self,
        old: Option<Lease>,
        new: Option<Lease>,
    ) -> Result<Lease, LockError> {
        match self.compose(old.as_ref(), new.as_ref()) {
            Ok(lease) => Ok(lease),
            Err(e) => {
                self.release_parts(old.as_ref(), new.as_ref()).await;
                Err(e)
            }
        }
    }

    /// Best-effort release of both parts (new, then old), each attempted.
    pub(super) async fn release_parts(&self, old: Option<&Lease>, new: Option<&Lease>) {
        if let Some(new) = new {
            let _ = self.new.release(new).await;
        }
        if let Some(old) = old {
            let _ = self.old.release(old).await;
        }
    }

    /// Splits a composite lease back into its parts.
    pub(super) fn split(
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

    pub(super) fn empty_error(operation: Operation) -> LockError {
        LockError::invalid_argument(operation, "migration lease holds no backend lease")
    }

    /// Phase `Dual` once `old` (the old side's grant: a lock or a term) is
    /// held: checks its epoch, waits for `acquire` (the new side's grant)
    /// while renewing `old`, and composes the two. `old` is given back when
    /// either fails, and if this future is dropped.
    pub(super) async fn dual_grant(
        &self,
        key: &LockKey,
        ttl: Duration,
        old: Lease,
        acquire: impl Future<Output = Result<Lease, LockError>>,
    ) -> Result<Lease, LockError> {
        // Gives the old lease back if this future is dropped.
        let mut pending = ReleaseOnDrop::new(self.old.clone(), old.clone());
        if let Err(e) = self.check_old_epoch(&old, Operation::Acquire) {
            pending.disarm();
            let _ = self.old.release(&old).await;
            return Err(e);
        }
        let (old, new) = self.new_side_keeping_old(key, ttl, acquire, old).await;
        pending.disarm();
        match new {
            Ok(new) => self.finish(Some(old), Some(new)).await,
            Err(e) => {
                let _ = self.old.release(&old).await;
                Err(e)
            }
        }
    }

    /// Waits for `acquire` (the new side's grant: a lock or a campaign)
    /// while renewing `old`, and gives up when `old` is lost.
    async fn new_side_keeping_old(
        &self,
        key: &LockKey,
        ttl: Duration,
        acquire: impl Future<Output = Result<Lease, LockError>>,
        mut old: Lease,
    ) -> (Lease, Result<Lease, LockError>) {
        enum Step {
            Granted(Result<Lease, LockError>),
            Renewed(Result<Instant, LockError>),
            Renew,
            OldExpired,
        }
        let interval = (ttl / 3).max(Duration::from_millis(1));
        tokio::pin!(acquire);
        let mut next_renewal = Instant::now() + interval;
        let mut renewal: Option<Renewal> = None;
        loop {
            let old_deadline = old.validity_deadline();
            let step = tokio::select! {
                biased;
                granted = &mut acquire => Step::Granted(granted),
                renewed = poll_renewal(&mut renewal), if renewal.is_some() => Step::Renewed(renewed),
                () = sleep_until(next_renewal), if renewal.is_none() => Step::Renew,
                () = sleep_until(old_deadline) => Step::OldExpired,
            };
            match step {
                Step::Granted(granted) => return (old, granted),
                Step::Renew => {
                    let (backend, lease) = (self.old.clone(), old.clone());
                    renewal = Some(Box::pin(async move { backend.renew(&lease).await }));
                }
                Step::Renewed(Ok(until)) => {
                    renewal = None;
                    old.set_validity_deadline(until);
                    next_renewal = Instant::now() + interval;
                }
                Step::Renewed(Err(e))
                    if matches!(e.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost) =>
                {
                    let lost = LockError::new(
                        ErrorKind::LeaseLost,
                        Operation::Acquire,
                        format!("the old backend's lease was lost while waiting for the new backend: {}", e.message()),
                    )
                    .with_key(key)
                    .with_source(e);
                    return (old, Err(lost));
                }
                Step::Renewed(Err(_)) => {
                    renewal = None;
                    next_renewal = Instant::now() + (interval / 4).max(Duration::from_millis(5));
                }
                Step::OldExpired => {
                    let lost = LockError::new(
                        ErrorKind::LeaseLost,
                        Operation::Acquire,
                        "the old backend's lease ran out (renewals failed) while waiting for the new backend",
                    )
                    .with_key(key);
                    return (old, Err(lost));
                }
            }
        }
    }
}

/// An old-side renewal in flight while a dual acquire waits.
pub(super) type Renewal = Pin<Box<dyn Future<Output = Result<Instant, LockError>> + Send>>;

pub(super) async fn poll_renewal(renewal: &mut Option<Renewal>) -> Result<Instant, LockError> {
    match renewal {
        Some(future) => future.as_mut().await,
        None => std::future::pending().await,
    }
}

/// The first error of two, preferring a final one (the lease is gone) over
/// a temporary one.
pub(super) fn worse(a: LockError, b: LockError) -> LockError {
    let lost = |e: &LockError| matches!(e.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost);
    if !lost(&a) && lost(&b) { b } else { a }
}

/// One receiver that is `Lost` when any input is lost, `Suspect` when any
/// is suspect, `Alive` otherwise.
pub(super) fn merge_sessions(
    inputs: Vec<watch::Receiver<SessionState>>,
) -> watch::Receiver<SessionState> {
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
pub(super) async fn futures_select_all<F: std::future::Future + Unpin>(
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

/// Releases a lease in the background if the acquire that holds it is
/// dropped before it can hand it out.
pub(super) struct ReleaseOnDrop {
    backend: Arc<dyn LockBackend>,
    lease: Option<Lease>,
}

impl ReleaseOnDrop {
    pub(super) fn new(backend: Arc<dyn LockBackend>, lease: Lease) -> Self {
        Self {
            backend,
            lease: Some(lease),
        }
    }

    pub(super) fn disarm(&mut self) {
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

/// What [`read_by_phase`](MigrationBackend::read_by_phase) reads: a lock's
/// info or an election's leader.
pub(super) trait Record: Send + Sized {
    /// Its fencing token (a leader's term), which the epoch goes into.
    fn token(&mut self) -> &mut Option<FencingToken>;
    /// Read in the old store only during `dual`: its holder marked with
    /// [`OLD_ONLY_MARK`].
    fn old_only(self) -> Self;
}

/// `holder` with [`OLD_ONLY_MARK`] before it.
fn mark_old_only(holder: &mut String) {
    holder.insert_str(0, OLD_ONLY_MARK);
}

impl Record for LockInfo {
    fn token(&mut self) -> &mut Option<FencingToken> {
        &mut self.token
    }

    /// Held in the old store only: a process still on `old` (or a dual
    /// acquire half-way). Marked so operators can find them.
    fn old_only(mut self) -> Self {
        mark_old_only(&mut self.holder);
        self
    }
}

impl Record for Leader {
    fn token(&mut self) -> &mut Option<FencingToken> {
        &mut self.term
    }

    /// A phase-`old` leader, or a dual campaign half-way: named, but its
    /// old-store token is no term of this migration.
    fn old_only(mut self) -> Self {
        mark_old_only(&mut self.holder);
        self.term = None;
        self
    }
}
