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
//!
//! Programs that are not async use [`blocking::Client`]: the same locks with
//! synchronous methods.
//!
//! Tools that call a backend directly use [`open`]: the backend's kernel
//! ([`LockBackend`]) and the calls built on it and its optional facets
//! ([`LockBackendExt`]: `try_acquire`, `inspect`, `list`,
//! `force_release`, ...). [`LockBackend::facets`] says which optional parts
//! ([`Admin`], [`Elections`], [`LockSets`], [`Downgrade`], [`HolderWatch`])
//! a backend has; a call of a facet it lacks answers
//! [`ErrorKind::Unsupported`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::LockError> {
//! use std::time::Duration;
//! use distlock::{LockBackendExt, LockKey};
//!
//! let backend = distlock::open("memory://tools").await?;
//! let key = LockKey::new("jobs/nightly")?;
//! let lease = backend.try_acquire(&key, Duration::from_secs(30)).await?.expect("free");
//! assert_eq!(backend.inspect(&key).await?.unwrap().token, Some(lease.token()));
//! assert!(backend.facets().admin.is_some());
//! let broken = backend.force_release(&key).await?;
//! assert!(broken.is_some());
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

pub mod blocking;
mod config;
mod duration;

use std::sync::Arc;

pub use config::{Config, MigrationConfig, parse_requirements, redact_url};
pub use duration::{format_duration, parse_duration};
pub use lock_core::driver::Driver;
pub use lock_core::{
    Capabilities, ErrorKind, FencingScope, FencingToken, GcReport, HolderDetails, KeyLabel, Lease,
    ListQuery, LockClient, LockDefaults, LockError, LockGuard, LockInfo, LockKey, LockPage,
    LockRequest, LockState, MemoryBackend, MigrationBackend, MigrationPhase, NEW_EPOCH, Operation,
    OwnerId, RenewalPolicy, Requirements, TtlModel, WaitStrategy, disable_metrics, enable_metrics,
    set_holder_label,
};
// The backend contract, for tools that call a backend directly (what
// `open` returns) and for driver authors: the kernel every driver
// implements, its optional facets, and the calls built on both.
pub use lock_core::{
    Admin, Downgrade, Elections, Facets, GrantRequest, HolderWatch, LockBackend, LockBackendExt,
    LockSets, LockWrapper,
};

/// The drivers this facade knows, one line each: its cargo feature (which
/// is also the driver's [`Driver::name`]) and its crate, which exports a
/// `DRIVER` descriptor. A driver whose feature is off is left out of the
/// build, and its feature is named when a URL cannot be served.
macro_rules! drivers {
    ($($feature:literal => $krate:ident),* $(,)?) => {
        /// The drivers compiled into this build, the in-memory one first.
        pub fn drivers() -> &'static [&'static Driver] {
            static DRIVERS: &[&Driver] = &[
                &lock_core::driver::MEMORY,
                $(
                    #[cfg(feature = $feature)]
                    &$krate::DRIVER,
                )*
            ];
            DRIVERS
        }

        /// The driver features of this facade that this build lacks.
        fn missing_features() -> Vec<&'static str> {
            [$(($feature, cfg!(feature = $feature))),*]
                .into_iter()
                .filter(|(_, on)| !on)
                .map(|(feature, _)| feature)
                .collect()
        }

        $(
            #[cfg(feature = $feature)]
            pub use $krate;
        )*
    };
}

drivers! {
    "redis" => lock_redis,
    "etcd" => lock_etcd,
    "zk" => lock_zk,
    "sql" => lock_sql,
    "slowmem" => lock_slowmem,
}

/// The URL schemes this build understands.
pub fn supported_schemes() -> Vec<&'static str> {
    drivers()
        .iter()
        .flat_map(|d| d.schemes.iter().copied())
        .collect()
}

/// The driver this build has for `url`'s scheme.
///
/// # Errors
///
/// [`ErrorKind::Config`] for an unknown scheme, listing the supported ones
/// and the driver features this build was compiled without.
pub fn driver_for(url: &str) -> Result<&'static Driver, LockError> {
    lock_core::driver::find(drivers(), url).ok_or_else(|| {
        let scheme = lock_core::driver::scheme_of(url);
        let missing = missing_features();
        let hint = if missing.is_empty() {
            String::new()
        } else {
            format!(
                "; drivers not compiled in (cargo features of distlock): {}",
                missing.join(", ")
            )
        };
        LockError::config(format!(
            "unknown backend scheme {scheme:?} in {:?}; this build supports: {}{hint}",
            redact_url(url),
            supported_schemes().join(", ")
        ))
    })
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
    let redis_family = driver_for(url).is_ok_and(|d| d.name == "redis");
    if !requirements.fencing || !redis_family || url.contains("eviction=") {
        return url.to_owned();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}eviction=refuse")
}

async fn open_url(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    Config::from_url(url)?;
    (driver_for(url)?.connect)(url).await
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
