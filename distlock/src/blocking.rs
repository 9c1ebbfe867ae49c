//! The same locks for programs that are not async: a [`Client`] with
//! synchronous methods, its requests and its guards.
//!
//! A blocking client owns a small Tokio runtime (one worker thread, named
//! `distlock-blocking`) on which its backend's connections live; every call
//! blocks the calling thread until the async operation it wraps finishes.
//! Guards renew on the renewal thread exactly as async guards do (see
//! [`RenewalRuntime`](lock_core::RenewalRuntime)), so a thread busy with
//! its work keeps its lock, and [`Guard::is_held`] / [`Guard::wait_lost`]
//! tell it when the lock is lost.
//!
//! ```
//! use std::time::Duration;
//!
//! let client = distlock::blocking::Client::connect("memory://docs")?;
//! let guard = client.lock("reports/nightly").ttl(Duration::from_secs(10)).acquire()?;
//! assert!(guard.is_held());
//! // ... write to the resource with guard.token() as the fencing token ...
//! assert!(guard.release()?);
//! # Ok::<(), distlock::LockError>(())
//! ```
//!
//! Calling a blocking method from inside an async runtime would stall that
//! runtime's thread; it is refused with
//! [`ErrorKind::Config`](lock_core::ErrorKind::Config) instead (use the
//! async API there). Dropping a client or a guard is fine anywhere: a guard
//! dropped without [`Guard::release`] is released in the background while
//! its client (or another of its guards) still exists, and otherwise
//! expires with its TTL.
//!
//! Cancel safety does not apply (nothing here is a future); a call that
//! times out behaves as the async call's timeout does.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lock_core::election::{ElectionPage, Leader};
use lock_core::{
    FencingToken, HolderInfo, Lease, LeaseKind, ListQuery, LockBackendExt, LockClient, LockError,
    LockGuard, LockInfo, LockKey, LockPage, LockRequest, LockShape, LockState, MultiGuard, OwnerId,
    SharedPage,
};
use tokio::runtime::Runtime;

use crate::Config;

/// The runtime a blocking client and its guards share; shut down (in the
/// background) when the last of them is gone.
#[derive(Debug)]
struct Rt {
    runtime: Option<Runtime>,
}

impl Rt {
    fn new() -> Result<Self, LockError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("distlock-blocking")
            .enable_all()
            .build()
            .map_err(|e| {
                LockError::config("cannot start the blocking client's runtime").with_source(e)
            })?;
        Ok(Self {
            runtime: Some(runtime),
        })
    }

    /// Runs `work` to completion on this runtime, from a thread that is not
    /// itself running async code.
    fn block_on<F: Future>(&self, work: F) -> Result<F::Output, LockError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(LockError::config(
                "distlock::blocking called from inside an async runtime (it would block one of its \
                 threads); use the async API there",
            ));
        }
        match &self.runtime {
            Some(runtime) => Ok(runtime.block_on(work)),
            None => Err(LockError::config("the blocking client's runtime is gone")),
        }
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            // Never blocks, also when dropped inside another runtime.
            runtime.shutdown_background();
        }
    }
}

/// A blocking lock client: [`LockClient`]'s operations as synchronous
/// calls. Cheap to clone (clones share the connection and the runtime).
#[derive(Clone, Debug)]
pub struct Client {
    inner: LockClient,
    rt: Arc<Rt>,
}

impl Client {
    /// Connects to the backend a URL names (as [`crate::connect`]).
    ///
    /// # Errors
    ///
    /// As [`crate::connect`]; [`ErrorKind::Config`](lock_core::ErrorKind::Config)
    /// when called inside an async runtime.
    pub fn connect(url: &str) -> Result<Self, LockError> {
        Self::connect_config(&Config::from_url(url)?)
    }

    /// Connects with a full [`Config`] (as [`crate::connect_config`]).
    ///
    /// # Errors
    ///
    /// As [`crate::connect_config`]; `Config` inside an async runtime.
    pub fn connect_config(config: &Config) -> Result<Self, LockError> {
        let rt = Arc::new(Rt::new()?);
        let inner = rt.block_on(crate::connect_config(config))??;
        Ok(Self { inner, rt })
    }

    /// The async client underneath (for code that has both worlds; its
    /// futures must run on an async runtime, not through this client).
    pub fn as_async(&self) -> &LockClient {
        &self.inner
    }

    /// A request for the mutex `key` (see [`LockClient::lock`]).
    pub fn lock(&self, key: impl AsRef<str>) -> Request<'_> {
        self.request(self.inner.lock(key))
    }

    /// A request for the read lock of `key` (see [`LockClient::read_lock`]).
    pub fn read_lock(&self, key: impl AsRef<str>) -> Request<'_> {
        self.request(self.inner.read_lock(key))
    }

    /// A request for the write lock of `key`.
    pub fn write_lock(&self, key: impl AsRef<str>) -> Request<'_> {
        self.request(self.inner.write_lock(key))
    }

    /// A request for one permit of the semaphore `key` of `limit` permits
    /// (more with [`Request::permits`]).
    pub fn semaphore(&self, key: impl AsRef<str>, limit: u32) -> Request<'_> {
        self.request(self.inner.semaphore(key, limit))
    }

    /// A request for a grant of any kind.
    pub fn lock_kind(&self, key: impl AsRef<str>, kind: LeaseKind) -> Request<'_> {
        self.request(self.inner.lock_kind(key, kind))
    }

    fn request<'a>(&'a self, inner: LockRequest<'a>) -> Request<'a> {
        Request {
            inner,
            rt: &self.rt,
        }
    }

    /// Takes every key of `keys` or none, waiting up to `wait` (0: try
    /// once), each with `ttl` (see [`LockClient::lock_all`]).
    ///
    /// # Errors
    ///
    /// As [`MultiRequest::acquire`](lock_core::MultiRequest::acquire).
    pub fn lock_all<I, K>(&self, keys: I, ttl: Duration, wait: Duration) -> Result<Multi, LockError>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        let request = self.inner.lock_all(keys).ttl(ttl).wait(wait);
        let inner = self.rt.block_on(request.acquire())??;
        Ok(Multi {
            inner,
            rt: self.rt.clone(),
        })
    }

    /// Campaigns in election `name` until this client leads or `wait`
    /// ends (see [`LockClient::elect`]).
    ///
    /// # Errors
    ///
    /// As [`Campaign::campaign`](lock_core::election::Campaign::campaign).
    pub fn elect(&self, name: &str, ttl: Duration, wait: Duration) -> Result<Guard, LockError> {
        let campaign = self.inner.elect(name).ttl(ttl).wait(wait);
        let leading = self.rt.block_on(campaign.campaign())??;
        Ok(self.guard(leading.into_guard()))
    }

    /// Who leads election `name` right now.
    ///
    /// # Errors
    ///
    /// As [`LockClient::leader`].
    pub fn leader(&self, name: &str) -> Result<Option<Leader>, LockError> {
        self.rt.block_on(self.inner.leader(name))?
    }

    /// Who holds the mutex `key` right now.
    ///
    /// # Errors
    ///
    /// As [`LockClient::inspect`].
    pub fn inspect(&self, key: impl AsRef<str>) -> Result<Option<LockInfo>, LockError> {
        self.rt.block_on(self.inner.inspect(key))?
    }

    /// One page of the locks held under the query's prefix.
    ///
    /// # Errors
    ///
    /// As [`Listing::list`](lock_core::Listing::list).
    pub fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        let (backend, query) = (self.inner.backend().clone(), query.clone());
        self.rt
            .block_on(async move { backend.list(&query).await })?
    }

    /// Every holder of `key` in `shape`'s namespace (see
    /// [`LockBackend::holders`](lock_core::LockBackend::holders)).
    ///
    /// # Errors
    ///
    /// A bad key; otherwise as
    /// [`LockBackend::holders`](lock_core::LockBackend::holders).
    pub fn holders(
        &self,
        key: impl AsRef<str>,
        shape: LockShape,
    ) -> Result<Vec<HolderInfo>, LockError> {
        let key = LockKey::new(key.as_ref())?;
        let backend = self.inner.backend().clone();
        self.rt
            .block_on(async move { backend.holders(&key, shape).await })?
    }

    /// One page of the keys of `shape` held under the query's prefix, each with its
    /// holders.
    ///
    /// # Errors
    ///
    /// As [`Listing::list_shared`](lock_core::Listing::list_shared).
    pub fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        let (backend, query) = (self.inner.backend().clone(), query.clone());
        self.rt
            .block_on(async move { backend.list_shared(shape, &query).await })?
    }

    /// One page of the elections with a leader under the query's prefix.
    ///
    /// # Errors
    ///
    /// As [`Listing::list_elections`](lock_core::Listing::list_elections).
    pub fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        let (backend, query) = (self.inner.backend().clone(), query.clone());
        self.rt
            .block_on(async move { backend.list_elections(&query).await })?
    }

    /// Breaks the mutex `key` whoever holds it (see
    /// [`LockClient::force_release`](lock_core::LockClient::force_release)):
    /// refuses the library's own reserved keys, such as a migration's
    /// cutover marker.
    ///
    /// # Errors
    ///
    /// A bad or reserved key (`InvalidArgument`); otherwise as
    /// [`Admin::force_release`](lock_core::Admin::force_release).
    pub fn force_release(&self, key: impl AsRef<str>) -> Result<Option<LockInfo>, LockError> {
        self.rt.block_on(self.inner.force_release(key.as_ref()))?
    }

    /// [`force_release`](Self::force_release) that also breaks the
    /// library's own reserved keys (see
    /// [`LockClient::force_release_reserved`](lock_core::LockClient::force_release_reserved)).
    ///
    /// # Errors
    ///
    /// A bad key; otherwise as
    /// [`Admin::force_release`](lock_core::Admin::force_release).
    pub fn force_release_reserved(
        &self,
        key: impl AsRef<str>,
    ) -> Result<Option<LockInfo>, LockError> {
        self.rt
            .block_on(self.inner.force_release_reserved(key.as_ref()))?
    }

    fn guard(&self, inner: LockGuard) -> Guard {
        Guard {
            inner,
            rt: self.rt.clone(),
        }
    }
}

/// A blocking lock request, made by [`Client::lock`] and its siblings.
#[derive(Debug)]
#[must_use = "a lock request does nothing until acquired"]
pub struct Request<'a> {
    inner: LockRequest<'a>,
    rt: &'a Arc<Rt>,
}

impl Request<'_> {
    /// The lease TTL (renewed by the guard).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.inner = self.inner.ttl(ttl);
        self
    }

    /// How long [`acquire`](Self::acquire) waits while the key is held.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.inner = self.inner.wait(wait);
        self
    }

    /// How many permits of a semaphore to take at once.
    pub fn permits(mut self, count: u32) -> Self {
        self.inner = self.inner.permits(count);
        self
    }

    /// Stop renewing after `max_hold`: the lock is then lost.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.inner = self.inner.max_hold(max_hold);
        self
    }

    /// Do not renew: the lock is lost at its first deadline.
    pub fn no_renewal(mut self) -> Self {
        self.inner = self.inner.no_renewal();
        self
    }

    /// Takes the lock, waiting up to the request's wait.
    ///
    /// # Errors
    ///
    /// As [`LockRequest::acquire`] (`Contended` when still held at the end
    /// of the wait); `Config` inside an async runtime.
    pub fn acquire(self) -> Result<Guard, LockError> {
        let inner = self.rt.block_on(self.inner.acquire())??;
        Ok(Guard {
            inner,
            rt: self.rt.clone(),
        })
    }

    /// Tries once; `Ok(None)` when the key is held.
    ///
    /// # Errors
    ///
    /// As [`LockRequest::try_acquire`].
    pub fn try_acquire(self) -> Result<Option<Guard>, LockError> {
        let rt = self.rt.clone();
        Ok(self
            .rt
            .block_on(self.inner.try_acquire())??
            .map(|inner| Guard { inner, rt }))
    }
}

/// A held lock (or leadership), renewed on the renewal thread until
/// released, dropped or lost.
#[derive(Debug)]
pub struct Guard {
    // Dropped before the runtime: a dropped guard's release is spawned on
    // the renewal thread while the connection still runs.
    inner: LockGuard,
    rt: Arc<Rt>,
}

impl Guard {
    /// The lock's key.
    pub fn key(&self) -> LockKey {
        self.inner.key()
    }

    /// The grant's fencing token (for an election: the term).
    pub fn token(&self) -> FencingToken {
        self.inner.token()
    }

    /// The grant's owner id.
    pub fn owner(&self) -> OwnerId {
        self.inner.owner()
    }

    /// The grant's kind.
    pub fn kind(&self) -> LeaseKind {
        self.inner.kind()
    }

    /// The lease (for a handle another process can renew or release).
    pub fn lease(&self) -> Lease {
        self.inner.lease()
    }

    /// `Held`, `Suspect` (renewals failing), `Lost` or `Released`.
    pub fn state(&self) -> LockState {
        self.inner.state()
    }

    /// Whether the lock is held and may be acted on right now.
    pub fn is_held(&self) -> bool {
        self.inner.is_held()
    }

    /// Blocks until the lock is lost (`Some(reason)`) or `timeout` passes
    /// while it is still held (`None`).
    ///
    /// # Errors
    ///
    /// `Config` inside an async runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<Option<String>, LockError> {
        let guard = &self.inner;
        self.rt
            .block_on(async { tokio::time::timeout(timeout, guard.lost()).await.ok() })
    }

    /// Turns a held write lock into a read lock with no gap for writers.
    ///
    /// # Errors
    ///
    /// As [`LockGuard::downgrade`].
    pub fn downgrade(&mut self) -> Result<(), LockError> {
        self.rt.block_on(self.inner.downgrade())?
    }

    /// Gives the lock back; `Ok(true)` when it was still held.
    ///
    /// # Errors
    ///
    /// As [`LockGuard::release`]; the lease then expires with its TTL.
    pub fn release(self) -> Result<bool, LockError> {
        let Self { inner, rt } = self;
        rt.block_on(inner.release())?
    }
}

/// A held multi-lock, made by [`Client::lock_all`].
#[derive(Debug)]
pub struct Multi {
    inner: MultiGuard,
    rt: Arc<Rt>,
}

impl Multi {
    /// Every key's token, in lock order.
    pub fn tokens(&self) -> Vec<(LockKey, FencingToken)> {
        self.inner.tokens()
    }

    /// Whether every key is still held.
    pub fn is_held(&self) -> bool {
        self.inner.is_held()
    }

    /// Gives every key back; `Ok(true)` when all were still held.
    ///
    /// # Errors
    ///
    /// As [`MultiGuard::release`].
    pub fn release(self) -> Result<bool, LockError> {
        let Self { inner, rt } = self;
        rt.block_on(inner.release())?
    }
}
