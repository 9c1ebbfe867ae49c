//! `slowmem://name?delay=1ms`: in-process locks, like `memory://`, with a
//! fixed delay before every call, as if each request crossed a network.
//!
//! It exists to show what a driver of the distlock family consists of, in
//! the fewest lines: a configuration read with the shared URL parser
//! ([`lock_core::endpoint`]), the backend, and a [`DRIVER`] descriptor
//! that the `distlock` facade registers in one line (see
//! `CONTRIBUTING.md`). Its tests run the whole conformance suite through
//! `distlock::backend::open`, the way every driver's do.
//!
//! The backend has the two parts every backend has:
//!
//! - **the kernel** ([`LockBackend`]): `name`, `capabilities`, `grant`
//!   (one call for every kind of grant, tried once or waited for),
//!   `renew_many`, `release`, `holders` and `facets`. Everything else a
//!   caller uses (`try_acquire`, `acquire`, `renew` of one lease,
//!   `inspect`, the mutex-based election, ...) comes from
//!   [`LockBackendExt`], built on the kernel;
//! - **facets** ([`lock_core::facets`]): [`Listing`], [`Admin`], [`Elections`],
//!   [`LockSets`], [`Downgrade`], [`HolderWatch`], each present or not;
//!   presence is the capability, and the conformance suite checks every
//!   facet a backend has.
//!
//! `SlowMemory` is made of a [`MemoryBackend`], so it is written as a
//! [`LockWrapper`]: it delays each kernel call, and offers exactly the
//! facets of the memory service, each call delayed too (today: `Listing`, `Admin`,
//! `LockSets`, `Downgrade`). A backend of its own (a new store) implements
//! [`LockBackend`] directly, and one `impl` per facet it has.
//!
//! Same name, same locks (within this process); `slowmem://` and
//! `memory://` with the same name are independent.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_core::LockError> {
//! let backend = lock_slowmem::connect("slowmem://doc?delay=1ms")?;
//! let client = lock_core::LockClient::new(backend);
//! let guard = client.lock("k").acquire().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::driver::Driver;
use lock_core::election::{ElectionPage, Leader};
use lock_core::endpoint::Endpoint;
use lock_core::{
    Admin, Downgrade, Elections, Facets, GcReport, GrantRequest, HolderInfo, HolderWatch, Lease,
    ListQuery, Listing, LockBackend, LockBackendExt, LockError, LockInfo, LockKey, LockPage,
    LockSets, LockShape, LockWrapper, MemoryBackend, SharedPage, WatchRequest,
};
use tokio::time::{Instant, sleep};

/// The longest delay accepted (a typo such as `delay=10m` is an error,
/// not a hang).
pub const MAX_DELAY: Duration = Duration::from_secs(1);

/// This driver's entry in the family.
pub static DRIVER: Driver = Driver {
    name: "slowmem",
    schemes: &["slowmem"],
    default_ports: &[],
    summary: "slowmem://name?delay=1ms: in-process locks with a delay per call",
    connect: connect_boxed,
    capabilities: Some(|url| Ok(LockBackend::capabilities(&from_endpoint(url.clone())?))),
};

lock_core::connect_fn!(fn connect_boxed = open);

async fn open(endpoint: Endpoint, _: lock_core::Requirements) -> Result<SlowMemory, LockError> {
    from_endpoint(endpoint)
}

/// Opens `slowmem://name[?delay=<duration>]` (no delay by default).
///
/// # Errors
///
/// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for another scheme,
/// an unknown option, or a delay that is not a duration up to
/// [`MAX_DELAY`].
pub fn connect(url: &str) -> Result<SlowMemory, LockError> {
    from_endpoint(Endpoint::parse(url)?)
}

/// [`connect`] for a parsed URL.
///
/// # Errors
///
/// As [`connect`].
pub fn from_endpoint(mut endpoint: Endpoint) -> Result<SlowMemory, LockError> {
    if endpoint.scheme() != "slowmem" || !endpoint.has_authority() {
        return Err(LockError::config(
            "a slowmem URL is slowmem://name[?delay=1ms]",
        ));
    }
    let options = endpoint.options();
    let delay = options.duration("delay")?.unwrap_or(Duration::ZERO);
    options.finish("slowmem")?;
    if delay > MAX_DELAY {
        return Err(LockError::config(format!(
            "option delay: at most {MAX_DELAY:?}, got {delay:?}"
        )));
    }
    let name = endpoint.raw_base()["slowmem://".len()..]
        .trim_end_matches('/')
        .to_owned();
    Ok(SlowMemory {
        inner: named(name),
        delay,
    })
}

/// The process's shared memory backend of this name.
fn named(name: String) -> MemoryBackend {
    static REGISTRY: OnceLock<Mutex<HashMap<String, MemoryBackend>>> = OnceLock::new();
    REGISTRY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(name)
        .or_default()
        .clone()
}

/// In-process locks with a delay before every call: a [`LockWrapper`]
/// over the memory service, with its facets.
#[derive(Clone, Debug)]
pub struct SlowMemory {
    inner: MemoryBackend,
    delay: Duration,
}

impl SlowMemory {
    /// The delay before each call.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The request's way there: the delay comes before the call, so the
    /// grant (and its deadline) is dated when the "server" makes it.
    async fn travel(&self) {
        if !self.delay.is_zero() {
            sleep(self.delay).await;
        }
    }
}

/// The kernel: each call travels, then runs in the memory service. Every
/// other call ([`LockBackendExt`]'s
/// conveniences) is built on these four and the facets below.
#[async_trait]
impl LockWrapper for SlowMemory {
    fn inner(&self) -> &dyn LockBackend {
        &self.inner
    }

    fn name(&self) -> &'static str {
        "slowmem"
    }

    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        self.travel().await;
        self.inner.grant(request).await
    }

    /// One trip for the whole batch, as a driver that renews in one
    /// exchange.
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        self.travel().await;
        self.inner.renew_many(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.travel().await;
        self.inner.release(lease).await
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        self.travel().await;
        self.inner.holders(key, shape).await
    }

    /// Exactly the memory service's facets, each call delayed like the
    /// kernel's. A wrapper that changes nothing in a facet would leave
    /// this to the default, which hands out the inner backend's facets
    /// unchanged.
    fn facets(&self) -> Facets<'_> {
        let inner = self.inner.facets();
        Facets {
            listing: inner.listing.map(|_| self as &dyn Listing),
            admin: inner.admin.map(|_| self as &dyn Admin),
            elections: inner.elections.map(|_| self as &dyn Elections),
            lock_sets: inner.lock_sets.map(|_| self as &dyn LockSets),
            downgrade: inner.downgrade.map(|_| self as &dyn Downgrade),
            holder_watch: inner.holder_watch.map(|_| self as &dyn HolderWatch),
        }
    }
}

// The facets. `facets` offers each only when the memory service has it, so
// each call below reaches the memory service's facet through the
// `LockBackendExt` method of the same name on `inner()`.

#[async_trait]
impl Admin for SlowMemory {
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.travel().await;
        self.inner().force_release(key).await
    }

    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError> {
        self.travel().await;
        self.inner().gc(older_than).await
    }
}

#[async_trait]
impl Listing for SlowMemory {
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        self.travel().await;
        self.inner().list(query).await
    }

    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        self.travel().await;
        self.inner().list_shared(shape, query).await
    }

    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        self.travel().await;
        self.inner().list_elections(query).await
    }
}

#[async_trait]
impl Elections for SlowMemory {
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.travel().await;
        self.inner().campaign(election, ttl, deadline).await
    }

    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        self.travel().await;
        self.inner().leader(election).await
    }

    async fn watch_leader(
        &self,
        request: WatchRequest<'_, Leader>,
    ) -> Result<Option<Leader>, LockError> {
        self.travel().await;
        self.inner.watch_leader(request).await
    }
}

#[async_trait]
impl LockSets for SlowMemory {
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        self.travel().await;
        self.inner().try_acquire_all(keys, ttl).await
    }
}

#[async_trait]
impl Downgrade for SlowMemory {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.travel().await;
        self.inner().downgrade(lease).await
    }
}

#[async_trait]
impl HolderWatch for SlowMemory {
    async fn watch_holder(
        &self,
        request: WatchRequest<'_, LockInfo>,
    ) -> Result<Option<LockInfo>, LockError> {
        self.travel().await;
        self.inner().watch_holder(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every facet the memory service has is here, delayed: no call the
    /// memory service serves answers `Unsupported` through slowmem.
    #[tokio::test]
    async fn the_memory_services_facets_are_all_here_and_delayed() {
        let slow: std::sync::Arc<dyn LockBackend> =
            std::sync::Arc::new(connect("slowmem://facets?delay=20ms").unwrap());
        let memory = named("facets".to_owned());
        assert_eq!(slow.facets().names(), memory.facets().names());
        assert_eq!(
            slow.facets().names(),
            ["listing", "admin", "lock_sets", "downgrade"],
            "the memory service's facets changed: check this driver's docs"
        );
        let key = LockKey::new("listed").unwrap();
        let lease = slow
            .try_acquire(&key, Duration::from_secs(5))
            .await
            .unwrap()
            .expect("free");
        let started = Instant::now();
        let page = slow.list(&ListQuery::new("", 10)).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(20));
        assert!(page.locks.iter().any(|info| info.key == key));
        let broken = slow.force_release(&key).await.unwrap().expect("held");
        assert_eq!(broken.token, Some(lease.token()));
        assert_eq!(slow.gc(Duration::ZERO).await.unwrap(), GcReport::default());
    }
}
