//! Distributed locks whose backend is chosen by configuration.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::LockError> {
//! use std::time::Duration;
//!
//! let client = distlock::connect("memory://").await?;
//! let guard = client
//!     .lock("jobs/nightly")
//!     .ttl(Duration::from_secs(30))
//!     .wait(Duration::from_secs(5))
//!     .acquire()
//!     .await?;
//! // Pass the fencing token to the resource you protect.
//! println!("token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Switching backend is a configuration change: the URL (or `DISTLOCK_URL`,
//! or a TOML file, see [`Config`]) picks the driver.
//!
//! | scheme | backend | cargo feature |
//! |---|---|---|
//! | `memory://[name]` | in-process ([`MemoryBackend`]); same name, same locks | always |
//! | `redis://`, `rediss://`, `redis+sentinel://`, `redis+cluster://`, `redlock://` | [`lock_redis`] | `redis` |
//! | `etcd://`, `etcds://` | [`lock_etcd`] | `etcd` |
//! | `zk://`, `zookeeper://` | [`lock_zk`] | `zk` |
//! | `postgres://`, `postgresql://`, `mysql://`, `mariadb://`, `sqlite://`, `sqlite::memory:` | [`lock_sql`] | `sql` |
//!
//! All four driver features are on by default; turn off what you do not use.

#![deny(missing_docs)]

mod config;
mod duration;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

pub use config::{Config, MigrationConfig, parse_requirements, redact_url};
pub use duration::{format_duration, parse_duration};
pub use lock_core::{
    Capabilities, ErrorKind, FencingScope, FencingToken, Lease, LockBackend, LockClient,
    LockDefaults, LockError, LockGuard, LockInfo, LockKey, LockRequest, LockState, MemoryBackend,
    MigrationBackend, MigrationPhase, NEW_EPOCH, Operation, OwnerId, RenewalPolicy, Requirements,
    TtlModel, WaitStrategy,
};

/// Every scheme, with the cargo feature that provides it (`None`: always).
const SCHEMES: &[(&str, Option<&str>)] = &[
    ("memory", None),
    ("redis", Some("redis")),
    ("rediss", Some("redis")),
    ("redis+sentinel", Some("redis")),
    ("rediss+sentinel", Some("redis")),
    ("redis+cluster", Some("redis")),
    ("rediss+cluster", Some("redis")),
    ("redlock", Some("redis")),
    ("etcd", Some("etcd")),
    ("etcds", Some("etcd")),
    ("zk", Some("zk")),
    ("zookeeper", Some("zk")),
    ("postgres", Some("sql")),
    ("postgresql", Some("sql")),
    ("mysql", Some("sql")),
    ("mariadb", Some("sql")),
    ("sqlite", Some("sql")),
];

fn feature_enabled(feature: &str) -> bool {
    (feature == "redis" && cfg!(feature = "redis"))
        || (feature == "etcd" && cfg!(feature = "etcd"))
        || (feature == "zk" && cfg!(feature = "zk"))
        || (feature == "sql" && cfg!(feature = "sql"))
}

/// The URL schemes this build understands.
pub fn supported_schemes() -> Vec<&'static str> {
    SCHEMES
        .iter()
        .filter(|(_, feature)| feature.is_none_or(feature_enabled))
        .map(|(scheme, _)| *scheme)
        .collect()
}

/// The scheme of a URL (`sqlite::memory:` counts as `sqlite`).
fn scheme_of(url: &str) -> &str {
    match url.split_once("://") {
        Some((scheme, _)) => scheme,
        None if url.starts_with("sqlite:") => "sqlite",
        None => "",
    }
}

/// Opens the backend a URL names.
///
/// # Errors
///
/// [`ErrorKind::Config`] for a malformed URL or an unknown scheme (naming
/// the cargo feature when the scheme's driver is not compiled in); the
/// driver's connection errors, within its connect timeout.
///
/// # Cancel safety
///
/// Safe: a dropped connect leaves nothing behind.
pub async fn open(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    let config = Config::from_url(url)?;
    open_config(&config).await
}

/// Opens the backend of a [`Config`] and checks its requirements.
///
/// # Errors
///
/// As [`open`], plus [`ErrorKind::Unsupported`] when the backend cannot
/// meet the config's requirements.
///
/// # Cancel safety
///
/// Safe: a dropped connect leaves nothing behind.
pub async fn open_config(config: &Config) -> Result<Arc<dyn LockBackend>, LockError> {
    let required = |url: &str| required_safety(url, &config.requirements);
    let backend = match &config.migration {
        Some(m) => {
            let old = open_url(&required(&m.old_url)).await?;
            let new = open_url(&required(&m.new_url)).await?;
            Arc::new(m.backend(old, new, config.defaults.ttl)?) as Arc<dyn LockBackend>
        }
        None => open_url(&required(&config.url)).await?,
    };
    backend
        .capabilities()
        .check(&config.requirements)
        .map_err(|e| e.with_backend(backend.name()))?;
    Ok(backend)
}

/// A config that requires fencing tokens cannot accept a Redis that may
/// evict keys (an evicted token counter starts again at 1): unless the URL
/// says otherwise, such a connect runs the Redis driver's eviction check in
/// `refuse` mode.
fn required_safety(url: &str, requirements: &lock_core::Requirements) -> String {
    let redis_family = scheme_of(url).starts_with("redis") || scheme_of(url) == "redlock";
    if !requirements.fencing || !redis_family || url.contains("eviction=") {
        return url.to_owned();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}eviction=refuse")
}

async fn open_url(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    Config::from_url(url)?;
    let scheme = scheme_of(url);
    let backend: Arc<dyn LockBackend> = match scheme {
        "memory" => Arc::new(named_memory(&url["memory://".len()..])),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" | "redis+cluster"
        | "rediss+cluster" | "redlock" => Arc::new(lock_redis::connect(url).await?),
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => Arc::new(lock_etcd::connect(url).await?),
        #[cfg(feature = "zk")]
        "zk" | "zookeeper" => Arc::new(lock_zk::connect(url).await?),
        #[cfg(feature = "sql")]
        "postgres" | "postgresql" | "mysql" | "mariadb" | "sqlite" => {
            Arc::new(lock_sql::connect(url).await?)
        }
        other => {
            if let Some((_, Some(feature))) = SCHEMES.iter().find(|(s, _)| *s == other) {
                return Err(LockError::config(format!(
                    "scheme {other:?} needs the `{feature}` cargo feature of distlock, which this build does not have"
                )));
            }
            return Err(LockError::config(format!(
                "unknown backend scheme {other:?} in {:?}; this build supports: {}",
                redact_url(url),
                supported_schemes().join(", ")
            )));
        }
    };
    Ok(backend)
}

/// Connects to the backend a URL names and wraps it in a [`LockClient`].
///
/// # Errors
///
/// As [`open`].
///
/// # Cancel safety
///
/// Safe: a dropped connect leaves nothing behind.
pub async fn connect(url: &str) -> Result<LockClient, LockError> {
    connect_config(&Config::from_url(url)?).await
}

/// Connects with a full [`Config`] (requirements checked, defaults applied).
///
/// # Errors
///
/// As [`open_config`].
///
/// # Cancel safety
///
/// Safe: a dropped connect leaves nothing behind.
pub async fn connect_config(config: &Config) -> Result<LockClient, LockError> {
    let backend = open_config(config).await?;
    Ok(LockClient::from_arc(backend).with_defaults(config.defaults))
}

/// In-process services by name, so that `memory://jobs` opened twice in one
/// process shares its locks (like two clients of one server).
fn named_memory(name: &str) -> MemoryBackend {
    static REGISTRY: OnceLock<Mutex<HashMap<String, MemoryBackend>>> = OnceLock::new();
    let registry = REGISTRY.get_or_init(|| Mutex::new(HashMap::new()));
    registry
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(name.trim_end_matches('/').to_owned())
        .or_default()
        .clone()
}

#[cfg(feature = "etcd")]
pub use lock_etcd;
#[cfg(feature = "redis")]
pub use lock_redis;
#[cfg(feature = "sql")]
pub use lock_sql;
#[cfg(feature = "zk")]
pub use lock_zk;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_urls_share_by_name() {
        let a = connect("memory://shared").await.unwrap();
        let b = connect("memory://shared").await.unwrap();
        let c = connect("memory://other").await.unwrap();
        let guard = a.lock("k").acquire().await.unwrap();
        assert!(b.lock("k").try_acquire().await.unwrap().is_none());
        assert!(c.lock("k").try_acquire().await.unwrap().is_some());
        guard.release().await.unwrap();
    }

    #[tokio::test]
    async fn unknown_schemes_and_bad_urls_are_config_errors() {
        for url in ["gopher://x", "nonsense", "", "://"] {
            let err = open(url).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
        }
    }

    #[tokio::test]
    async fn requirements_are_refused_at_connect() {
        // Memory meets everything a config can ask for.
        let config = Config::from_url("memory://req").unwrap().require(
            Requirements::none()
                .fencing()
                .linearizable()
                .fifo()
                .notify(),
        );
        connect_config(&config).await.unwrap();
    }
}
