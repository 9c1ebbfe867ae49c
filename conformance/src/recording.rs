//! Recording what a client does, as it does it: a [`RecordingBackend`]
//! that writes every grant, renewal and release of one client process
//! into a [`History`](crate::history::History), and [`recorded_guard`],
//! which takes a lock the way users do (a [`LockGuard`] that renews on its
//! own) and also records the moment the guard reports the lock lost.
//!
//! With it, a promised window ends where the holder's promise really ended:
//! at its release, at its lost signal, or at the deadline of its last
//! successful renewal.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::election::Leader;
use lock_core::{
    Downgrade, Elections, Facets, GrantRequest, Lease, LeaseKind, LockBackend, LockBackendExt,
    LockClient, LockError, LockGuard, LockKey, LockSets, LockState, LockWrapper, WatchRequest,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::history::{Op, Recorder};

/// A backend wrapper that records one client process's operations.
///
/// Grants record `invoke`, then `ok` with the promised deadline or `fail`;
/// releases record `invoke` (which ends the promised window whatever the
/// outcome), then `ok` / `fail`. An error whose outcome is unknown (a
/// timeout) is recorded as `fail`: it promised nothing. `renew_many` is
/// forwarded as the batch it is (the scheduler's renewals go through the
/// driver's batched path, which is what must be judged), each lease
/// recorded as one renewal.
///
/// Grants made through facets are recorded too: the wrapper has its own
/// [`LockSets`], [`Downgrade`] and [`Elections`] facets wherever the inner
/// backend has them (each recording, then calling the inner facet), and
/// forwards the facets that grant nothing ([`Admin`](lock_core::Admin),
/// [`HolderWatch`](lock_core::HolderWatch)) unchanged. Without an inner
/// `Elections` facet, a campaign is a grant of the election's mutex,
/// recorded by [`grant`](LockBackend::grant).
#[derive(Debug)]
pub struct RecordingBackend {
    inner: Arc<dyn LockBackend>,
    recorder: Recorder,
}

impl RecordingBackend {
    /// Wraps `inner`, recording into `recorder`.
    pub fn new(inner: Arc<dyn LockBackend>, recorder: Recorder) -> Self {
        Self { inner, recorder }
    }

    /// The recorder.
    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    /// Records a grant of `kind` on `key` that returned `lease`.
    fn granted(&self, key: &LockKey, kind: LeaseKind, lease: &Lease) {
        let (token, deadline) = (lease.token(), lease.validity_deadline());
        match kind {
            LeaseKind::Exclusive => self.recorder.acquired(key, token, deadline),
            kind => self.recorder.acquired_kind(key, kind, token, deadline),
        }
    }
}

#[async_trait]
impl LockWrapper for RecordingBackend {
    fn inner(&self) -> &dyn LockBackend {
        &*self.inner
    }

    /// Every kind, tried once or waited for: `invoke`, then `ok` with the
    /// lease's deadline, or `fail` (an error, or "held" for a try).
    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let (key, kind) = (request.key, request.kind);
        self.recorder.invoke(Op::Acquire, key, None);
        let result = self.inner.grant(request).await;
        match &result {
            Ok(Some(lease)) => self.granted(key, kind, lease),
            _ => self.recorder.failed(Op::Acquire, key, None),
        }
        result
    }

    /// Forwards the batch to the inner backend's `renew_many` (not one
    /// renewal per lease, which is not the path the renewal scheduler
    /// takes): every lease's `invoke` when the batch is sent, then each
    /// one's `ok` with the deadline the batch returned for it, or `fail`.
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        for lease in leases {
            self.recorder
                .invoke(Op::Renew, lease.key(), Some(lease.token()));
        }
        let results = self.inner.renew_many(leases).await;
        for (i, lease) in leases.iter().enumerate() {
            let (key, token) = (lease.key(), lease.token());
            match results.get(i) {
                Some(Ok(deadline)) => self.recorder.renewed(key, token, *deadline),
                // An error, or no answer for it (the caller treats that as
                // a temporary error).
                _ => self.recorder.failed(Op::Renew, key, Some(token)),
            }
        }
        results
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let (key, token) = (lease.key(), lease.token());
        self.recorder.invoke(Op::Release, key, Some(token));
        let result = self.inner.release(lease).await;
        match &result {
            Ok(held) => self.recorder.released(key, token, *held),
            Err(_) => self.recorder.failed(Op::Release, key, Some(token)),
        }
        result
    }

    /// The inner backend's facets, with this wrapper's recording
    /// [`LockSets`], [`Downgrade`] and [`Elections`] in place of the inner
    /// ones (present exactly where the inner backend has them).
    fn facets(&self) -> Facets<'_> {
        let inner = self.inner.facets();
        Facets {
            lock_sets: inner.lock_sets.map(|_| self as &dyn LockSets),
            downgrade: inner.downgrade.map(|_| self as &dyn Downgrade),
            elections: inner.elections.map(|_| self as &dyn Elections),
            ..inner
        }
    }
}

#[async_trait]
impl LockSets for RecordingBackend {
    /// Recorded as one acquire per key, invoked together and granted (or
    /// failed) together.
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        for key in keys {
            self.recorder.invoke(Op::Acquire, key, None);
        }
        let result = self.inner.try_acquire_all(keys, ttl).await;
        match &result {
            Ok(Some(leases)) => {
                for lease in leases {
                    self.granted(lease.key(), LeaseKind::Exclusive, lease);
                }
            }
            _ => {
                for key in keys {
                    self.recorder.failed(Op::Acquire, key, None);
                }
            }
        }
        result
    }
}

#[async_trait]
impl Downgrade for RecordingBackend {
    /// Recorded as the write grant's release invoked when the downgrade is
    /// sent (the release's start ends the promised window: the service may
    /// let readers in as soon as it has the request, before the reply is
    /// back) and an acquire of a read grant (with the same token) that
    /// begins when the downgrade returned. A failed downgrade is a failed
    /// release and acquire; the write window stays ended at the invoke (the
    /// outcome may be unknown, so nothing more was promised).
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        let (key, token) = (lease.key(), lease.token());
        self.recorder.invoke(Op::Release, key, Some(token));
        self.recorder.invoke(Op::Acquire, key, None);
        let result = self.inner.downgrade(lease).await;
        match &result {
            Ok(read) => {
                self.recorder.released(key, token, true);
                self.granted(read.key(), LeaseKind::Read, read);
            }
            Err(_) => {
                self.recorder.failed(Op::Release, key, Some(token));
                self.recorder.failed(Op::Acquire, key, None);
            }
        }
        result
    }
}

#[async_trait]
impl Elections for RecordingBackend {
    /// Recorded as an acquire of the election's lock key: the leader's
    /// term is a grant like a lock's.
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let key = lock_core::election::election_lock_key(election)?;
        self.recorder.invoke(Op::Acquire, &key, None);
        let result = self.inner.campaign(election, ttl, deadline).await;
        match &result {
            Ok(lease) => self.granted(lease.key(), LeaseKind::Exclusive, lease),
            Err(_) => self.recorder.failed(Op::Acquire, &key, None),
        }
        result
    }

    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        self.inner.leader(election).await
    }

    async fn watch_leader(
        &self,
        request: WatchRequest<'_, Leader>,
    ) -> Result<Option<Leader>, LockError> {
        self.inner.watch_leader(request).await
    }
}

/// Releases `lease` through `backend`, recording `invoke` (which ends the
/// promised window whatever the outcome), then `ok` with whether it was
/// still held, or `fail`.
///
/// # Errors
///
/// The backend's release errors (recorded as a failed release).
///
/// # Cancel safety
///
/// As the backend's release; a dropped call has recorded only `invoke`.
pub async fn recorded_release(
    backend: &dyn LockBackend,
    rec: &Recorder,
    lease: &Lease,
) -> Result<bool, LockError> {
    rec.invoke(Op::Release, lease.key(), Some(lease.token()));
    let result = backend.release(lease).await;
    match &result {
        Ok(held) => rec.released(lease.key(), lease.token(), *held),
        Err(_) => rec.failed(Op::Release, lease.key(), Some(lease.token())),
    }
    result
}

/// A guard whose history is recorded: its acquire, every renewal (with the
/// deadline it promised) and its release through a [`RecordingBackend`],
/// and its lost signal by a watcher task, at the moment the guard reports
/// it.
#[derive(Debug)]
pub struct RecordedGuard {
    guard: LockGuard,
}

impl RecordedGuard {
    /// The guard.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Releases (recorded by the backend wrapper).
    ///
    /// # Errors
    ///
    /// The backend's release errors.
    ///
    /// # Cancel safety
    ///
    /// As [`LockGuard::release`].
    pub async fn release(self) -> Result<bool, LockError> {
        self.guard.release().await
    }
}

impl std::ops::Deref for RecordedGuard {
    type Target = LockGuard;

    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

/// Takes `key` through `backend` as users do (`client.lock(key).ttl(ttl)
/// .wait(wait).acquire()`), recording everything into `recorder`.
///
/// # Errors
///
/// The acquire's errors (recorded as a failed acquire).
///
/// # Cancel safety
///
/// As [`LockRequest::acquire`](lock_core::LockRequest::acquire).
pub async fn recorded_guard(
    backend: Arc<dyn LockBackend>,
    recorder: &Recorder,
    key: &LockKey,
    ttl: Duration,
    wait: Duration,
) -> Result<RecordedGuard, LockError> {
    let recording: Arc<dyn LockBackend> =
        Arc::new(RecordingBackend::new(backend, recorder.clone()));
    let guard = LockClient::from_arc(recording)
        .lock(key.as_str())
        .ttl(ttl)
        .wait(wait)
        .acquire()
        .await?;
    record_lost(&guard, recorder);
    Ok(RecordedGuard { guard })
}

/// Records `guard`'s lost signal into `recorder` at the moment the guard
/// reports it, from a watcher task that ends when the guard turns `Lost`
/// (recorded) or `Released` (nothing to record: the release was).
pub fn record_lost(guard: &LockGuard, recorder: &Recorder) -> JoinHandle<()> {
    let mut states = guard.subscribe();
    let (rec, key, token) = (recorder.clone(), guard.key(), guard.token());
    tokio::spawn(async move {
        loop {
            match &*states.borrow_and_update() {
                LockState::Lost(_) => {
                    rec.lost(&key, token);
                    return;
                }
                LockState::Released => return,
                LockState::Held | LockState::Suspect => {}
            }
            if states.changed().await.is_err() {
                return;
            }
        }
    })
}
