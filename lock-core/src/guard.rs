//! The guard users hold: renewed by its client's scheduler, says when the lock is lost.

use std::future::Future;
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use crate::backend::LockBackend;
use crate::calls::LockBackendExt;
use crate::error::{ErrorKind, LockError, Operation};
use crate::hold::{LockState, RenewalPolicy, Shared};
use crate::key::LockKey;
use crate::kind::LeaseKind;
use crate::runtime::RenewalRuntime;
use crate::scheduler::{Registration, Scheduler};
use crate::types::{FencingToken, Lease, OwnerId};

/// A held lock.
///
/// The guard's lease is renewed by its client's renewal scheduler (about
/// every TTL/3, see [`RenewalPolicy`]): one task per backend and
/// [`RenewalRuntime`] that renews every held lock in batches
/// ([`LockBackend::renew_many`]), not a task per guard. The guard exposes the
/// fencing token and the local validity deadline, and reports [`LockState`]
/// changes: `Held → Suspect → Lost`. `Lost` fires no later than the local
/// deadline when renewals keep failing, and at once when the backend says
/// the lease is gone.
///
/// The scheduler runs on a [`RenewalRuntime`]: by default a dedicated
/// thread, so that an application blocking its own runtime does not starve
/// it (see [`RenewalRuntime`] for what that does and does not cover with
/// network backends). Whatever runtime it runs on, any end of that task
/// other than the scheduler being dropped (a panic in the backend, its
/// runtime shutting down) turns every guard it renews `Lost` at once, and
/// the state reads `Lost` as soon as the deadline has passed, even if the
/// scheduler has not run since.
///
/// Give it back with [`release`](Self::release). **Dropping** the guard stops
/// renewal and releases in the background on the current Tokio runtime (or,
/// outside one, on the runtime the guard renews on): best effort, with no
/// way to observe failure (the lease then expires with its TTL).
pub struct LockGuard {
    shared: Arc<Shared>,
    scheduler: Arc<Scheduler>,
    /// [`Registration::RELEASED`] once [`release`](Self::release) started.
    registration: Registration,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("backend", &self.scheduler.backend().name())
            .field("lease", &self.shared.lease())
            .field("state", &self.shared.state())
            .finish()
    }
}

impl LockGuard {
    /// Wraps a fresh lease and renews it on the default [`RenewalRuntime`]
    /// (the dedicated renewal thread).
    ///
    /// Works inside or outside a Tokio runtime.
    pub fn new(backend: Arc<dyn LockBackend>, lease: Lease, policy: RenewalPolicy) -> Self {
        Self::with_runtime(backend, lease, policy, &RenewalRuntime::default())
    }

    /// Wraps a fresh lease and renews it on `runtime`, with the scheduler
    /// every guard of `backend` on that runtime shares.
    ///
    /// Should no runtime be available at all (`current` outside a runtime
    /// and the dedicated thread unable to start), the guard cannot renew
    /// and starts out `Lost`.
    pub fn with_runtime(
        backend: Arc<dyn LockBackend>,
        lease: Lease,
        policy: RenewalPolicy,
        runtime: &RenewalRuntime,
    ) -> Self {
        match runtime.handle() {
            Some(handle) => {
                let scheduler = Scheduler::shared_for(&backend, &handle);
                Self::register(scheduler, &handle, lease, &policy)
            }
            None => {
                let shared = Arc::new(Shared::new(lease, backend.name()));
                shared.set_state(LockState::Lost(
                    "cannot renew: no Tokio runtime to run the renewal task on".to_owned(),
                ));
                Self {
                    shared,
                    scheduler: Scheduler::new(backend, None),
                    registration: Registration::NONE,
                }
            }
        }
    }

    /// Registers a fresh lease with `scheduler` (whose task runs on `handle`).
    pub(crate) fn register(
        scheduler: Arc<Scheduler>,
        handle: &tokio::runtime::Handle,
        lease: Lease,
        policy: &RenewalPolicy,
    ) -> Self {
        let shared = Arc::new(scheduler.hold(lease));
        let registration = scheduler.register(&shared, policy, handle);
        Self {
            shared,
            scheduler,
            registration,
        }
    }

    /// The key.
    pub fn key(&self) -> LockKey {
        self.shared.original().key().clone()
    }

    /// A nested guard over `shared` (see [`crate::reentry`]).
    pub(crate) fn nested(shared: Arc<Shared>, scheduler: Arc<Scheduler>) -> Self {
        Self {
            shared,
            scheduler,
            registration: Registration::NESTED,
        }
    }

    /// A nested guard for the same grant: same key, token and state, no
    /// round trip. Releasing or dropping it only ends the nesting; the lock
    /// stays held until this (outermost) guard ends, and the nested guard
    /// then reads `Released` (or `Lost` when the lock is lost, at the same
    /// moment as this guard). See [`crate::reentry`].
    pub fn reenter(&self) -> LockGuard {
        Self::nested(self.shared.clone(), self.scheduler.clone())
    }

    /// Whether this is a nested guard (from [`reenter`](Self::reenter) or
    /// a request made inside a [`scope`](Self::scope)).
    pub fn is_nested(&self) -> bool {
        self.registration == Registration::NESTED
    }

    /// Runs `work` with this lock in the current task's scope: inside it,
    /// a request for the same key (same client, same kind, or a read
    /// request under a write lock) returns a nested guard at once instead
    /// of asking the backend. Tasks spawned from `work` are not in the
    /// scope: they wait like any other client.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `work` and ends the scope; the lock stays
    /// held by this guard.
    pub async fn scope<F: Future>(&self, work: F) -> F::Output {
        let backend = crate::reentry::backend_id(self.scheduler.backend());
        crate::reentry::run_in_scope(backend, self.shared.clone(), self.scheduler.clone(), work)
            .await
    }

    /// What this guard holds: the mutex, a read or write share, permits.
    pub fn kind(&self) -> LeaseKind {
        self.shared.original().kind()
    }

    /// Turns this write lock into a read lock of the same key with no gap
    /// in which another writer could enter; the guard then holds the read
    /// lease (same token: the epoch this writer wrote) and renews it.
    ///
    /// Receivers from [`subscribe`](Self::subscribe) taken before the
    /// downgrade see `Released` (the write lease ended); subscribe again
    /// for the read lease. A hold limit keeps counting from the original
    /// grant; a renewal cap starts again.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] when this guard does not hold a write
    /// lock; [`ErrorKind::NotHeld`] when the write lock is no longer held
    /// (the guard is unchanged: it is lost or about to be); the backend's
    /// errors, with the guard unchanged (after a timeout the server may hold
    /// either lease; both end with their TTL).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it finishes leaves the guard holding the
    /// write lease, while the server may already hold the read lease in its
    /// place: the guard's renewals then fail and it reports `Lost`, and the
    /// read lease expires with its TTL.
    pub async fn downgrade(&mut self) -> Result<(), LockError> {
        let backend = self.scheduler.backend().clone();
        let key = self.shared.original().key().clone();
        let kind = self.kind();
        if self.is_nested() {
            return Err(LockError::invalid_argument(
                Operation::Downgrade,
                "a nested guard cannot downgrade: the outermost guard owns the lock",
            )
            .with_key(&key)
            .with_backend(backend.name()));
        }
        if kind != LeaseKind::Write {
            return Err(LockError::invalid_argument(
                Operation::Downgrade,
                format!("only a write lock can be downgraded; this guard holds {kind}"),
            )
            .with_key(&key)
            .with_backend(backend.name()));
        }
        if !self.is_held() {
            return Err(LockError::new(
                ErrorKind::NotHeld,
                Operation::Downgrade,
                "the write lock is no longer held",
            )
            .with_key(&key)
            .with_backend(backend.name()));
        }
        let read = backend.downgrade(&self.shared.lease()).await?;
        let policy = self
            .scheduler
            .policy_for(self.registration, &self.shared)
            .unwrap_or_default();
        let handle = self
            .scheduler
            .handle()
            .or_else(|| Handle::try_current().ok());
        let shared = Arc::new(self.scheduler.hold(read));
        let registration = match handle {
            Some(handle) => self.scheduler.register(&shared, &policy, &handle),
            None => {
                shared.set_state(LockState::Lost(
                    "cannot renew: no Tokio runtime to run the renewal task on".to_owned(),
                ));
                Registration::NONE
            }
        };
        self.scheduler.deregister(self.registration, &self.shared);
        self.shared.set_state(LockState::Released);
        self.shared = shared;
        self.registration = registration;
        Ok(())
    }

    /// Refuses to turn a read lock into a write lock: two readers upgrading
    /// at once would each wait for the other to leave, for ever. Release the
    /// read lock and take the write lock instead (re-reading what the read
    /// lock protected: another writer may come in between).
    ///
    /// # Errors
    ///
    /// Always: [`ErrorKind::WouldDeadlock`] for a read lock,
    /// [`ErrorKind::InvalidArgument`] for any other kind.
    pub fn upgrade(&self) -> Result<(), LockError> {
        let key = self.shared.original().key();
        let err = match self.kind() {
            LeaseKind::Read => LockError::new(
                ErrorKind::WouldDeadlock,
                Operation::Acquire,
                "a read lock cannot be upgraded to a write lock (two upgrading readers would \
                 deadlock): release it and take the write lock",
            ),
            other => LockError::invalid_argument(
                Operation::Acquire,
                format!("only a read lock could be upgraded; this guard holds {other}"),
            ),
        };
        Err(err
            .with_key(key)
            .with_backend(self.scheduler.backend().name()))
    }

    /// The fencing token of this grant: pass it to the protected resource.
    pub fn token(&self) -> FencingToken {
        self.shared.original().token()
    }

    /// The owner id of this grant.
    pub fn owner(&self) -> OwnerId {
        self.shared.original().owner()
    }

    /// The current local validity deadline (moves forward with renewals).
    pub fn validity_deadline(&self) -> Instant {
        self.shared.deadline()
    }

    /// A copy of the current lease (for handles and diagnostics).
    pub fn lease(&self) -> Lease {
        self.shared.lease()
    }

    /// The current state. Once the local validity deadline has passed it is
    /// `Lost`, even if the renewal scheduler has not had a chance to say so.
    pub fn state(&self) -> LockState {
        self.shared.checked_state()
    }

    /// Whether the lock is held and safe to act on right now: not lost and
    /// before its local deadline.
    pub fn is_held(&self) -> bool {
        self.shared.is_held()
    }

    /// A receiver of state changes, for callers that want to react
    /// themselves.
    pub fn subscribe(&self) -> watch::Receiver<LockState> {
        self.shared.subscribe()
    }

    /// Resolves when the lock is lost (or released), with the reason.
    ///
    /// # Cancel safety
    ///
    /// Safe: it only watches.
    pub async fn lost(&self) -> String {
        wait_terminal(&self.shared, self.shared.subscribe()).await
    }

    /// Runs `work` while the lock is held, and cancels it (drops it) as soon
    /// as the lock is lost, or its local deadline passes: `work` is not
    /// polled again after that, even if the renewal scheduler has been
    /// starved.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LeaseLost`] when the lock was lost before `work` finished;
    /// `work` has then been dropped.
    ///
    /// # Cancel safety
    ///
    /// Dropping this future drops `work`; the lock stays held.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, LockError> {
        let rx = self.shared.subscribe();
        tokio::select! {
            biased;
            reason = wait_terminal(&self.shared, rx) => Err(self.lost_error(reason)),
            out = work => Ok(out),
        }
    }

    fn lost_error(&self, reason: String) -> LockError {
        LockError::new(ErrorKind::LeaseLost, Operation::Renew, reason)
            .with_key(self.shared.original().key())
            .with_backend(self.scheduler.backend().name())
    }

    /// Stops renewal and gives the lock back.
    ///
    /// Returns `Ok(true)` when we still held it, `Ok(false)` when it had
    /// already been lost or taken over (nothing of anyone else's was touched).
    ///
    /// # Errors
    ///
    /// The backend's release errors (timeout, unavailable); the lease then
    /// expires with its TTL.
    ///
    /// # Cancel safety
    ///
    /// Dropping this future after it started leaves the release in an
    /// unknown state; the lease expires with its TTL either way.
    pub async fn release(mut self) -> Result<bool, LockError> {
        if self.is_nested() {
            // Only the nesting ends: the outermost guard still holds.
            self.registration = Registration::RELEASED;
            return Ok(self.shared.is_held());
        }
        self.scheduler.deregister(self.registration, &self.shared);
        self.registration = Registration::RELEASED;
        let lease = self.shared.original();
        let span = crate::telemetry::hot_span!(
            "distlock.release",
            backend = self.shared.backend_name(),
            key = %lease.key(),
            token = lease.token().get(),
            outcome = tracing::field::Empty,
        );
        // The backend's future awaited here (a helper of our own around it
        // would add its state to this future).
        let result = match &span {
            None => self.scheduler.backend().release(lease).await,
            Some(span) => {
                tracing::Instrument::instrument(
                    self.scheduler.backend().release(lease),
                    span.clone(),
                )
                .await
            }
        };
        if let Some(span) = &span {
            match &result {
                Ok(true) => span.record("outcome", "released"),
                Ok(false) => span.record("outcome", "not held"),
                Err(e) => span.record("outcome", tracing::field::display(e.kind())),
            };
        }
        self.shared.set_state(LockState::Released);
        result
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.registration == Registration::RELEASED || self.is_nested() {
            return;
        }
        self.scheduler.deregister(self.registration, &self.shared);
        self.shared.set_state(LockState::Released);
        if let Some(handle) = Handle::try_current()
            .ok()
            .or_else(|| self.scheduler.handle())
        {
            let backend = self.scheduler.backend().clone();
            let shared = self.shared.clone();
            handle.spawn(async move {
                let lease = shared.original();
                if let Err(err) = backend.release(lease).await {
                    tracing::debug!(key = %lease.key(), %err, "background release failed; the lease will expire");
                }
            });
        }
    }
}

/// Resolves at the first terminal state, or when the local deadline passes
/// (which it then records as `Lost`): a starved scheduler cannot keep a
/// waiter believing in an expired lease.
async fn wait_terminal(shared: &Shared, mut rx: watch::Receiver<LockState>) -> String {
    loop {
        rx.borrow_and_update();
        match shared.checked_state() {
            LockState::Lost(reason) => return reason,
            LockState::Released => return "released".to_owned(),
            _ => {}
        }
        // Timers need a Tokio runtime; elsewhere only the watch is awaited
        // (the scheduler still fires `Lost` at the deadline).
        let deadline = Handle::try_current().is_ok().then(|| shared.deadline());
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    // The guard is gone: treat as released.
                    return "guard dropped".to_owned();
                }
            }
            // Renewals move the deadline without a state change: re-read it.
            () = sleep_until_opt(deadline) => {}
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}
