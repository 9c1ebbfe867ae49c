//! Driver descriptors: what a backend crate tells the rest of the family
//! about itself, so that the facade, the command-line tool and the tests
//! derive their scheme tables and connects from one list instead of
//! naming every driver by hand.
//!
//! A driver crate exports one `pub static DRIVER: Driver`; the facade lists
//! the descriptors of the crates compiled in (one line per driver) and
//! [`find`] picks the one a URL's scheme names.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::capabilities::Requirements;
use crate::endpoint::Endpoint;
use crate::{LockBackend, LockError, MemoryBackend};

/// A boxed, sendable future (what a descriptor's functions return).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Connects the backend of a parsed URL (parsed once, by the caller, who
/// chose the driver from its scheme), meeting what the caller requires
/// where the driver has a setting for it (a Redis that must not evict keys
/// when fencing is required, say). The caller still checks the
/// capabilities against the requirements once connected.
pub type ConnectFn =
    fn(Endpoint, Requirements) -> BoxFuture<'static, Result<Arc<dyn LockBackend>, LockError>>;

/// What a URL's backend promises, read from the parsed URL alone (no
/// connect).
pub type CapabilitiesFn = fn(&Endpoint) -> Result<crate::Capabilities, LockError>;

/// One driver's entry in the family.
#[derive(Clone, Copy)]
pub struct Driver {
    /// Short name (`redis`, `etcd`, `zookeeper`, `sql`, `memory`): the
    /// facade's cargo feature and the name in messages.
    pub name: &'static str,
    /// The URL schemes it serves, lower case (`redis`, `rediss`, ...).
    pub schemes: &'static [&'static str],
    /// Per scheme, the port a host written without one gets (schemes whose
    /// URLs name no server are left out; see
    /// [`default_port`](Self::default_port)).
    pub default_ports: &'static [(&'static str, u16)],
    /// One line for help texts: what it is and its URL form.
    pub summary: &'static str,
    /// Connects the backend a URL names.
    pub connect: ConnectFn,
    /// The capabilities a URL's backend will report, without connecting
    /// (`None`: known only once connected).
    pub capabilities: Option<CapabilitiesFn>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// Whether this driver serves the scheme of `url`.
    pub fn handles(&self, url: &str) -> bool {
        let scheme = scheme_of(url);
        self.schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme))
    }

    /// The default port of `scheme` (a host written without a port gets
    /// it), if this driver's URLs of that scheme name servers.
    pub fn default_port(&self, scheme: &str) -> Option<u16> {
        self.default_ports
            .iter()
            .find(|(s, _)| s.eq_ignore_ascii_case(scheme))
            .map(|(_, port)| *port)
    }
}

/// The scheme of a URL, as written (`redis` for `redis://h`, `sqlite` for
/// `sqlite::memory:`); empty when there is none.
pub fn scheme_of(url: &str) -> &str {
    let url = url.trim();
    match url.split_once(':') {
        Some((scheme, _))
            if !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
        {
            scheme
        }
        _ => "",
    }
}

/// The driver among `drivers` that serves `url`'s scheme.
pub fn find<'a>(drivers: &[&'a Driver], url: &str) -> Option<&'a Driver> {
    drivers.iter().copied().find(|d| d.handles(url))
}

/// Declares a [`ConnectFn`] named `$name` that opens a backend with
/// `$open(endpoint, requirements).await` (an
/// `async fn(Endpoint, Requirements) -> Result<B, LockError>` whose `B`
/// implements [`LockBackend`]).
///
/// ```text
/// lock_core::connect_fn!(fn connect = crate::open);
/// ```
#[macro_export]
macro_rules! connect_fn {
    ($vis:vis fn $name:ident = $open:path) => {
        $vis fn $name(
            endpoint: $crate::endpoint::Endpoint,
            requirements: $crate::Requirements,
        ) -> $crate::driver::BoxFuture<
            'static,
            ::std::result::Result<::std::sync::Arc<dyn $crate::LockBackend>, $crate::LockError>,
        > {
            ::std::boxed::Box::pin(async move {
                let backend = $open(endpoint, requirements).await?;
                Ok(::std::sync::Arc::new(backend) as ::std::sync::Arc<dyn $crate::LockBackend>)
            })
        }
    };
}

/// The in-process backend: `memory://[name]`. Every URL with the same
/// name opens the same locks in this process (like two clients of one
/// server); different names are independent.
pub static MEMORY: Driver = Driver {
    name: "memory",
    schemes: &["memory"],
    default_ports: &[],
    summary: "memory://[name]: in-process locks, shared by name within this process",
    connect: connect_memory,
    capabilities: Some(|_| Ok(MemoryBackend::new().capabilities())),
};

fn connect_memory(
    endpoint: Endpoint,
    _: Requirements,
) -> BoxFuture<'static, Result<Arc<dyn LockBackend>, LockError>> {
    Box::pin(async move { Ok(Arc::new(named_memory(endpoint)?) as Arc<dyn LockBackend>) })
}

/// The process's memory backend of that name (`memory://jobs`).
fn named_memory(mut endpoint: Endpoint) -> Result<MemoryBackend, LockError> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, MemoryBackend>>> = OnceLock::new();
    if endpoint.scheme() != "memory" || !endpoint.has_authority() {
        return Err(LockError::config("a memory URL is memory://[name]"));
    }
    endpoint.options().finish("memory")?;
    let name = endpoint.raw_base()["memory://".len()..]
        .trim_end_matches('/')
        .to_owned();
    let registry = REGISTRY.get_or_init(|| Mutex::new(HashMap::new()));
    Ok(registry
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(name)
        .or_default()
        .clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LockBackendExt;

    fn no_connect(
        _: Endpoint,
        _: Requirements,
    ) -> BoxFuture<'static, Result<Arc<dyn LockBackend>, LockError>> {
        Box::pin(async { Err(LockError::config("test driver")) })
    }

    static A: Driver = Driver {
        name: "a",
        schemes: &["a", "a+s"],
        default_ports: &[("a", 1)],
        summary: "a://host",
        connect: no_connect,
        capabilities: None,
    };

    #[test]
    fn schemes_pick_the_driver() {
        assert_eq!(scheme_of("A+S://h"), "A+S");
        assert_eq!(scheme_of("sqlite::memory:"), "sqlite");
        assert_eq!(scheme_of("nonsense"), "");
        assert_eq!(scheme_of("://x"), "");
        assert!(find(&[&A], "a+s://h").is_some());
        assert!(find(&[&A], "b://h").is_none());
        assert_eq!(A.default_port("A"), Some(1));
        assert_eq!(A.default_port("a+s"), None);
    }

    async fn open(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
        (MEMORY.connect)(Endpoint::parse(url)?, Requirements::none()).await
    }

    #[tokio::test]
    async fn memory_urls_share_by_name() {
        let a = open("memory://shared").await.unwrap();
        let b = open("memory://shared/").await.unwrap();
        let c = open("memory://other").await.unwrap();
        let key = crate::LockKey::new("k").unwrap();
        let ttl = std::time::Duration::from_secs(5);
        let lease = a.try_acquire(&key, ttl).await.unwrap().unwrap();
        assert!(b.try_acquire(&key, ttl).await.unwrap().is_none());
        assert!(c.try_acquire(&key, ttl).await.unwrap().is_some());
        a.release(&lease).await.unwrap();
        let promised =
            (MEMORY.capabilities.unwrap())(&Endpoint::parse("memory://shared").unwrap()).unwrap();
        assert_eq!(promised, a.capabilities());
        for bad in ["memory:x", "memory://x?ttl=1s"] {
            assert!(open(bad).await.is_err(), "{bad}");
        }
    }
}
