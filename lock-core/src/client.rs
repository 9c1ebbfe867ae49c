//! The friendly API: `client.lock("key").ttl(..).wait(..).acquire().await`.

/// The setters of a request for one lock and for a set
/// ([`LockRequest`], [`MultiRequest`](multi::MultiRequest)): both keep a
/// `ttl`, a `wait` and a `renewal` policy.
macro_rules! lease_setters {
    () => {
        /// The TTL of each lease (renewed by the guard about every TTL/3).
        pub fn ttl(mut self, ttl: Duration) -> Self {
            self.ttl = ttl;
            self
        }

        /// How long to wait while a key is held (0 = try once;
        /// `Duration::MAX`: for ever).
        pub fn wait(mut self, wait: Duration) -> Self {
            self.wait = wait;
            self
        }

        /// Do not renew: each lease is lost at its first deadline.
        pub fn no_renewal(mut self) -> Self {
            self.renewal.enabled = false;
            self
        }
    };
}

pub(crate) mod multi;
pub(crate) mod segments;

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{GrantRequest, LockBackend};
use crate::calls::{LockBackendExt, granted};
use crate::capabilities::{Capabilities, Requirements};
use crate::error::{ErrorKind, LockError, Operation};
use crate::guard::LockGuard;
use crate::hold::RenewalPolicy;
use crate::key::LockKey;
use crate::kind::LeaseKind;
use crate::options::{check_ttl, saturating_add};
use crate::runtime::RenewalRuntime;
use crate::scheduler::Scheduler;
use crate::types::{Lease, LockInfo};
use tracing::Instrument;

/// Defaults applied to every lock request of a [`LockClient`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockDefaults {
    /// Lease TTL. Default 30 s (renewed by the guard).
    pub ttl: Duration,
    /// How long `acquire` waits for a held key. Default: 0 (try once).
    pub wait: Duration,
    /// How the guard renews.
    pub renewal: RenewalPolicy,
}

impl Default for LockDefaults {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            wait: Duration::ZERO,
            renewal: RenewalPolicy::default(),
        }
    }
}

/// A backend plus defaults: the entry point users hold.
///
/// Cheap to clone (the backend is shared).
///
/// Guards renew on the dedicated renewal thread by default (see
/// [`RenewalRuntime`] for why, and for what it means for network backends);
/// [`with_renewal_runtime`](Self::with_renewal_runtime) picks another.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lock_core::{LockClient, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let client = LockClient::new(MemoryBackend::new());
/// let guard = client
///     .lock("jobs/nightly")
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(1))
///     .acquire()
///     .await?;
/// println!("holding with fencing token {}", guard.token());
/// assert!(guard.release().await?);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct LockClient {
    backend: Arc<dyn LockBackend>,
    defaults: LockDefaults,
    renewal_runtime: RenewalRuntime,
    /// The renewal schedulers of this client's guards, one per runtime
    /// (shared by clones). Held here so that a scheduler and its task
    /// outlive the guards: acquiring never starts a task, releasing never
    /// stops one.
    schedulers: Arc<Schedulers>,
}

/// A client's renewal schedulers.
#[derive(Debug, Default)]
struct Schedulers {
    /// The one on the dedicated renewal runtime (the default), with that
    /// runtime's handle, once a guard needed it; `None` when the renewal
    /// thread could not start. That runtime never stops, so its scheduler
    /// is found without a lock or a look-up per guard.
    dedicated: OnceLock<Option<(Arc<Scheduler>, tokio::runtime::Handle)>>,
    /// Those on other runtimes.
    others: Mutex<Vec<Arc<Scheduler>>>,
}

impl LockClient {
    /// A client over `backend` with default options.
    pub fn new(backend: impl LockBackend + 'static) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// A client over a shared backend (e.g. one chosen at run time).
    pub fn from_arc(backend: Arc<dyn LockBackend>) -> Self {
        Self {
            backend,
            defaults: LockDefaults::default(),
            renewal_runtime: RenewalRuntime::default(),
            schedulers: Arc::default(),
        }
    }

    /// The scheduler renewing this client's guards on `runtime`, if any
    /// runtime is available.
    fn scheduler(
        &self,
        runtime: &RenewalRuntime,
    ) -> Option<(Arc<Scheduler>, tokio::runtime::Handle)> {
        if runtime.is_dedicated()
            && let Some((scheduler, handle)) = self.dedicated_scheduler()
        {
            return Some((scheduler.clone(), handle.clone()));
        }
        let handle = runtime.handle()?;
        let id = handle.id();
        let mut schedulers = self
            .schedulers
            .others
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = schedulers.iter().find(|s| s.runtime_id() == Some(id)) {
            return Some((found.clone(), handle));
        }
        // Runtimes come and go (tests, `current` on short-lived runtimes):
        // forget schedulers that renew nothing and have no task.
        schedulers.retain(|s| !s.is_idle());
        let scheduler = Scheduler::shared_for(&self.backend, &handle);
        schedulers.push(scheduler.clone());
        Some((scheduler, handle))
    }

    /// Runs the renewal tasks of this client's guards on `runtime` (default:
    /// [`RenewalRuntime::dedicated`]; [`RenewalRuntime::current`] renews on
    /// the runtime each lock is taken on).
    ///
    /// With a network backend, renewal only survives a blocked application
    /// runtime if the backend was also connected on the renewal runtime
    /// (its connection tasks run where it was connected): see
    /// [`RenewalRuntime::run_on`].
    #[must_use]
    pub fn with_renewal_runtime(mut self, runtime: RenewalRuntime) -> Self {
        self.renewal_runtime = runtime;
        self
    }

    /// Where this client's guards renew.
    pub fn renewal_runtime(&self) -> &RenewalRuntime {
        &self.renewal_runtime
    }

    /// Replaces the defaults.
    #[must_use]
    pub fn with_defaults(mut self, defaults: LockDefaults) -> Self {
        self.defaults = defaults;
        self
    }

    /// Checks the backend against `requirements`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] naming what is missing.
    pub fn require(self, requirements: &Requirements) -> Result<Self, LockError> {
        self.backend
            .capabilities()
            .check(requirements)
            .map_err(|e| e.with_backend(self.backend.name()))?;
        Ok(self)
    }

    /// The defaults applied to this client's requests.
    pub fn defaults(&self) -> &LockDefaults {
        &self.defaults
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.backend
    }

    /// The backend's capabilities.
    pub fn capabilities(&self) -> Capabilities {
        self.backend.capabilities()
    }

    /// Starts a request for `key` (validated when the request runs).
    pub fn lock(&self, key: impl AsRef<str>) -> LockRequest<'_> {
        self.request(key.as_ref(), LeaseKind::Exclusive)
    }

    /// Starts a request for a read share of the read-write lock `key`:
    /// many readers may hold it at once, never beside a writer; once a
    /// writer waits, new readers queue behind it. (A read-write lock is not
    /// the mutex of the same name: see [`crate::kind`].)
    pub fn read_lock(&self, key: impl AsRef<str>) -> LockRequest<'_> {
        self.request(key.as_ref(), LeaseKind::Read)
    }

    /// Starts a request for the write side of the read-write lock `key`:
    /// one writer, no reader.
    pub fn write_lock(&self, key: impl AsRef<str>) -> LockRequest<'_> {
        self.request(key.as_ref(), LeaseKind::Write)
    }

    /// Starts a request for one permit (see [`LockRequest::permits`]) of
    /// the semaphore `key` of `limit` permits. Every client of a semaphore
    /// must use the same limit: a request with another limit while the
    /// semaphore is in use fails with [`ErrorKind::InvalidArgument`].
    pub fn semaphore(&self, key: impl AsRef<str>, limit: u32) -> LockRequest<'_> {
        self.request(key.as_ref(), LeaseKind::Permits { count: 1, limit })
    }

    /// Starts a request for a grant of `kind` on `key` (the general form
    /// of [`lock`](Self::lock), [`read_lock`](Self::read_lock),
    /// [`write_lock`](Self::write_lock) and [`semaphore`](Self::semaphore),
    /// for callers that choose the kind at run time).
    pub fn lock_kind(&self, key: impl AsRef<str>, kind: LeaseKind) -> LockRequest<'_> {
        self.request(key.as_ref(), kind)
    }

    fn request(&self, key: &str, kind: LeaseKind) -> LockRequest<'_> {
        LockRequest {
            client: self,
            key: LockKey::new(key).map_err(Box::new),
            kind,
            ttl: self.defaults.ttl,
            wait: self.defaults.wait,
            renewal: self.defaults.renewal,
            renewal_runtime: self.renewal_runtime.clone(),
        }
    }

    /// Starts a request for every key of `keys` at once, all or nothing
    /// (see [`MultiRequest`](crate::MultiRequest)).
    pub fn lock_all<I, K>(&self, keys: I) -> crate::MultiRequest<'_>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        crate::MultiRequest::new(self, keys)
    }

    /// Wraps a fresh lease in a guard renewed by this client's scheduler.
    pub(crate) fn guard_for(&self, lease: crate::Lease, policy: &RenewalPolicy) -> LockGuard {
        self.guard_on(&self.renewal_runtime, lease, policy)
    }

    /// Wraps a fresh lease in a guard renewed by this client's scheduler
    /// on `runtime`.
    fn guard_on(
        &self,
        runtime: &RenewalRuntime,
        lease: crate::Lease,
        policy: &RenewalPolicy,
    ) -> LockGuard {
        match self.scheduler(runtime) {
            Some((scheduler, handle)) => LockGuard::register(scheduler, &handle, lease, policy),
            None => LockGuard::with_runtime(self.backend.clone(), lease, *policy, runtime),
        }
    }

    /// The scheduler renewing this client's guards on the dedicated
    /// renewal runtime, with its handle (`None`: the renewal thread could
    /// not start; [`RenewalRuntime::handle`] then falls back to the
    /// current runtime, found by [`scheduler`](Self::scheduler)).
    fn dedicated_scheduler(&self) -> Option<&(Arc<Scheduler>, tokio::runtime::Handle)> {
        self.schedulers
            .dedicated
            .get_or_init(|| {
                let handle = crate::runtime::dedicated_handle()?;
                Some((Scheduler::shared_for(&self.backend, &handle), handle))
            })
            .as_ref()
    }

    /// Starts a request for any one of `segments` locks that together
    /// guard one resource split into parts (`key/0` .. `key/<segments-1>`):
    /// see [`SegmentRequest`](crate::SegmentRequest).
    pub fn segments(&self, key: impl AsRef<str>, segments: u32) -> crate::SegmentRequest<'_> {
        crate::SegmentRequest::new(self, key.as_ref(), segments)
    }

    /// Runs `work` under the lock on `key` (default options, waiting up to
    /// the default wait), releases afterwards, and cancels `work` if the
    /// lock is lost.
    ///
    /// # Errors
    ///
    /// Acquire errors; [`ErrorKind::LeaseLost`] when the lock was lost while
    /// `work` ran (it was dropped).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `work` and releases in the background.
    pub async fn with_lock<F: Future>(
        &self,
        key: impl AsRef<str>,
        work: F,
    ) -> Result<F::Output, LockError> {
        let guard = self.lock(key).acquire().await?;
        let out = guard.run(work).await;
        let _ = guard.release().await;
        out
    }

    /// Who holds `key` right now.
    ///
    /// # Errors
    ///
    /// Invalid key, or the backend's inspect errors.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    pub async fn inspect(&self, key: impl AsRef<str>) -> Result<Option<LockInfo>, LockError> {
        let key = LockKey::new(key.as_ref())?;
        let span =
            tracing::debug_span!("distlock.inspect", backend = self.backend.name(), key = %key);
        self.backend.inspect(&key).instrument(span).await
    }

    /// Breaks the mutex on `key` whoever holds it (an operator's tool for a
    /// stuck lock; see [`Admin::force_release`](crate::Admin::force_release)), and returns the
    /// holder it removed, or `None` when the key was free.
    ///
    /// Refuses the library's own [reserved keys](LockKey::is_reserved),
    /// such as a migration's cutover marker: breaking that one lets a
    /// process still configured for phase `old` in beside `new` holders.
    /// Use [`force_release_reserved`](Self::force_release_reserved) to
    /// break one on purpose.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// for an invalid or a reserved key (nothing is sent); otherwise as
    /// [`Admin::force_release`](crate::Admin::force_release).
    ///
    /// # Cancel safety
    ///
    /// As [`Admin::force_release`](crate::Admin::force_release): one atomic request.
    ///
    /// # Examples
    ///
    /// ```
    /// use lock_core::{ErrorKind, LockClient, MemoryBackend};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// let client = LockClient::new(MemoryBackend::new());
    /// let guard = client.lock("jobs/stuck").acquire().await?;
    /// let broken = client.force_release("jobs/stuck").await?;
    /// assert_eq!(broken.and_then(|h| h.token), Some(guard.token()));
    /// let marker = "__distlock/migration-cutover/default";
    /// let refused = client.force_release(marker).await.unwrap_err();
    /// assert_eq!(refused.kind(), ErrorKind::InvalidArgument);
    /// # Ok(()) }
    /// ```
    pub async fn force_release(&self, key: impl AsRef<str>) -> Result<Option<LockInfo>, LockError> {
        let key = LockKey::new(key.as_ref())?;
        if key.is_reserved() {
            return Err(LockError::invalid_argument(
                Operation::Release,
                format!(
                    "{key} is one of the library's own keys (a migration's cutover marker or its record): \
                     breaking it lets processes still on phase `old` in beside `new` holders; \
                     use force_release_reserved to break it anyway"
                ),
            )
            .with_key(&key)
            .with_backend(self.backend.name()));
        }
        self.backend.force_release(&key).await
    }

    /// [`force_release`](Self::force_release) that also breaks the
    /// library's own [reserved keys](LockKey::is_reserved): for an
    /// operator who means it (a migration abandoned, a marker of a
    /// migration that no longer exists). A migration's `new` processes
    /// that still run set their cutover marker again within their refresh
    /// interval.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// for an invalid key; otherwise as [`Admin::force_release`](crate::Admin::force_release).
    ///
    /// # Cancel safety
    ///
    /// As [`Admin::force_release`](crate::Admin::force_release): one atomic request.
    pub async fn force_release_reserved(
        &self,
        key: impl AsRef<str>,
    ) -> Result<Option<LockInfo>, LockError> {
        let key = LockKey::new(key.as_ref())?;
        self.backend.force_release(&key).await
    }
}

/// One lock request; finish it with [`acquire`](Self::acquire) or
/// [`try_acquire`](Self::try_acquire).
#[derive(Debug)]
#[must_use = "a lock request does nothing until acquired"]
pub struct LockRequest<'a> {
    client: &'a LockClient,
    /// The key, or why the request is refused (boxed: the request and the
    /// acquire future that holds it stay small).
    key: Result<LockKey, Box<LockError>>,
    kind: LeaseKind,
    ttl: Duration,
    wait: Duration,
    renewal: RenewalPolicy,
    renewal_runtime: RenewalRuntime,
}

impl<'a> LockRequest<'a> {
    /// For a [semaphore](LockClient::semaphore) request: take `count`
    /// permits at once, atomically (all or none). On any other request,
    /// acquiring fails with [`ErrorKind::InvalidArgument`].
    pub fn permits(mut self, count: u32) -> Self {
        self.kind = match self.kind {
            LeaseKind::Permits { limit, .. } => LeaseKind::Permits { count, limit },
            _ => {
                self.key = Err(Box::new(LockError::invalid_argument(
                    Operation::Validate,
                    "permits() applies to semaphore requests only",
                )));
                self.kind
            }
        };
        self
    }

    /// What this request asks for.
    pub fn kind(&self) -> LeaseKind {
        self.kind
    }

    lease_setters!();

    /// Stop renewing after the lock has been held this long.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.renewal.max_hold = Some(max_hold);
        self
    }

    /// Stop renewing after this many renewals.
    pub fn max_renewals(mut self, count: u64) -> Self {
        self.renewal.max_renewals = Some(count);
        self
    }

    /// Replaces the renewal policy (checked by
    /// [`RenewalPolicy::validate`] when the request runs).
    pub fn renewal(mut self, renewal: RenewalPolicy) -> Self {
        self.renewal = renewal;
        self
    }

    /// Where this lock's guard renews (default: the client's, see
    /// [`LockClient::with_renewal_runtime`]).
    pub fn renewal_runtime(mut self, runtime: RenewalRuntime) -> Self {
        self.renewal_runtime = runtime;
        self
    }

    /// Takes the lock, waiting up to the request's `wait`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for a bad key or TTL, or a renewal
    /// policy that fails [`RenewalPolicy::validate`] (checked before
    /// anything is sent);
    /// [`ErrorKind::Contended`] when the key stayed held for the whole wait;
    /// timeouts and backend errors.
    ///
    /// # Cancel safety
    ///
    /// See [`LockBackendExt::acquire`](crate::LockBackendExt::acquire): dropping withdraws the request and
    /// leaves nothing held past its TTL. Nothing is checked or sent before
    /// the future is first polled.
    pub fn acquire(self) -> impl Future<Output = Result<LockGuard, LockError>> + Send + 'a {
        // A plain function returning the future, not an `async fn`: the
        // future holds the request's parts once, where an `async fn` keeps
        // its argument twice (as passed, and as moved into its body).
        let LockRequest {
            client,
            key,
            kind,
            ttl,
            wait,
            renewal,
            renewal_runtime,
        } = self;
        async move {
            let backend = &client.backend;
            let key = key.map_err(|e| *e)?;
            check_ttl(ttl, backend.capabilities().min_ttl, Operation::Acquire)
                .map_err(|e| e.with_key(&key).with_backend(backend.name()))?;
            renewal
                .validate(ttl)
                .map_err(|e| e.with_key(&key).with_backend(backend.name()))?;
            kind.validate(Operation::Acquire)
                .map_err(|e| e.with_key(&key).with_backend(backend.name()))?;
            // Inside the scope of a guard of this lock: a nested guard, no
            // second grant (see `reentry`).
            if let Some((shared, scheduler)) =
                crate::reentry::find(crate::reentry::backend_id(backend), &key, kind)
            {
                return Ok(LockGuard::nested(shared, scheduler));
            }
            let shape = kind.shape();
            let span = crate::telemetry::hot_span!(
                "distlock.acquire",
                backend = backend.name(),
                key = %key,
                kind = %kind,
                ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                token = tracing::field::Empty,
                owner = tracing::field::Empty,
                outcome = tracing::field::Empty,
            );
            let started = crate::telemetry::acquire_started(backend.name(), &key, shape);
            // The backend's future awaited here, not inside helpers of our
            // own: each would add its state (and a copy of the request) to
            // this future.
            let request = GrantRequest::mutex(&key, ttl).kind(kind);
            let request = if wait.is_zero() {
                request
            } else {
                request.until(saturating_add(Instant::now(), wait))
            };
            let found = match &span {
                None => backend.grant(request).await,
                Some(span) => backend.grant(request).instrument(span.clone()).await,
            };
            let result = Self::granted(found, backend.name(), &key, kind, wait);
            crate::telemetry::acquire_ended(
                started,
                backend.name(),
                &key,
                shape,
                !wait.is_zero(),
                &result,
            );
            if let Some(span) = &span {
                crate::telemetry::record_grant(span, &result, "token", "granted");
            }
            let lease = result?;
            Ok(client.guard_on(&renewal_runtime, lease, &renewal))
        }
    }

    /// The backend's answer to the grant as the request's result: a
    /// waiting grant's as [`LockBackendExt::acquire`](crate::LockBackendExt::acquire)
    /// reads it, a single try's "held" as [`ErrorKind::Contended`].
    fn granted(
        found: Result<Option<Lease>, LockError>,
        backend: &'static str,
        key: &LockKey,
        kind: LeaseKind,
        wait: Duration,
    ) -> Result<Lease, LockError> {
        if !wait.is_zero() {
            return granted(found, backend, key);
        }
        found?.ok_or_else(|| {
            let message = match kind {
                LeaseKind::Exclusive => "held by another owner".to_owned(),
                kind => format!("cannot take {kind} now"),
            };
            LockError::new(ErrorKind::Contended, Operation::TryAcquire, message)
                .with_key(key)
                .with_backend(backend)
        })
    }

    /// Tries once; `Ok(None)` when the key is held.
    ///
    /// # Errors
    ///
    /// Bad key or TTL, timeouts and backend errors.
    ///
    /// # Cancel safety
    ///
    /// See [`LockBackendExt::try_acquire`](crate::LockBackendExt::try_acquire).
    pub async fn try_acquire(self) -> Result<Option<LockGuard>, LockError> {
        match self.wait(Duration::ZERO).acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(err) if err.is_contended() => Ok(None),
            Err(err) => Err(err),
        }
    }
}
