//! `slowmem://name?delay=1ms`: in-process locks, like `memory://`, with a
//! fixed delay before every call, as if each request crossed a network.
//!
//! It exists to show what a driver of the distlock family consists of, in
//! the fewest lines: a configuration read with the shared URL parser
//! ([`lock_core::endpoint`]), a [`LockBackend`] implementation, and a
//! [`DRIVER`] descriptor that the `distlock` facade registers in one line
//! (see `CONTRIBUTING.md`). Its tests run the whole conformance suite
//! through `distlock::open`, the way every driver's do.
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
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::driver::{BoxFuture, Driver};
use lock_core::endpoint::Endpoint;
use lock_core::{
    Capabilities, HolderInfo, Lease, LeaseKind, LockBackend, LockError, LockInfo, LockKey,
    LockShape, MemoryBackend,
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
    floor: None,
    permit_floor: None,
    capabilities: Some(|url| Ok(connect(url)?.capabilities())),
    fair_option: None,
};

fn connect_boxed(url: &str) -> BoxFuture<'_, Result<Arc<dyn LockBackend>, LockError>> {
    Box::pin(async move { Ok(Arc::new(connect(url)?) as Arc<dyn LockBackend>) })
}

/// Opens `slowmem://name[?delay=<duration>]` (no delay by default).
///
/// # Errors
///
/// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for another scheme,
/// an unknown option, or a delay that is not a duration up to
/// [`MAX_DELAY`].
pub fn connect(url: &str) -> Result<SlowMemory, LockError> {
    let mut endpoint = Endpoint::parse(url)?;
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

/// In-process locks with a delay before every call.
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

#[async_trait]
impl LockBackend for SlowMemory {
    fn name(&self) -> &'static str {
        "slowmem"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.travel().await;
        self.inner.try_acquire(key, ttl).await
    }

    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.travel().await;
        self.inner.acquire(key, ttl, deadline).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        self.travel().await;
        self.inner.renew(lease).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.travel().await;
        self.inner.release(lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.travel().await;
        self.inner.inspect(key).await
    }

    async fn try_acquire_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        self.travel().await;
        self.inner.try_acquire_kind(key, kind, ttl).await
    }

    async fn acquire_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.travel().await;
        self.inner.acquire_kind(key, kind, ttl, deadline).await
    }

    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.travel().await;
        self.inner.downgrade(lease).await
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        self.travel().await;
        self.inner.holders(key, shape).await
    }

    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        self.travel().await;
        self.inner.try_acquire_all(keys, ttl).await
    }
}
