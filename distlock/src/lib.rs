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
//! | `memory://[name]` | in-process ([`MemoryBackend`](backend::MemoryBackend)); same name, same locks | always |
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
//! Tools that call a backend directly (an admin command, a test harness)
//! and driver authors use [`backend`]: `backend::open` returns the
//! backend's kernel ([`backend::LockBackend`]), with the calls built on it
//! and on its optional facets ([`backend::LockBackendExt`]: `try_acquire`,
//! `inspect`, `list`, `force_release`, ...).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::LockError> {
//! use std::time::Duration;
//! use distlock::LockKey;
//! use distlock::backend::LockBackendExt;
//!
//! let backend = distlock::backend::open("memory://tools").await?;
//! let key = LockKey::new("jobs/nightly")?;
//! let lease = backend.try_acquire(&key, Duration::from_secs(30)).await?.expect("free");
//! assert_eq!(backend.inspect(&key).await?.unwrap().token, Some(lease.token()));
//! assert!(backend.facets().admin.is_some());
//! let broken = backend.force_release(&key).await?;
//! assert!(broken.is_some());
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

pub mod backend;
pub mod blocking;
mod config;
mod duration;

pub use config::{Config, MigrationConfig, parse_requirements, redact_url};
pub use duration::{format_duration, parse_duration};
pub use lock_core::{
    Capabilities, ErrorKind, FencingScope, FencingToken, GcReport, HolderDetails, HolderInfo,
    KeyLabel, LeaseKind, ListQuery, LockClient, LockDefaults, LockError, LockGuard, LockInfo,
    LockKey, LockPage, LockRequest, LockShape, LockState, MigrationPhase, MultiGuard, MultiRequest,
    NEW_EPOCH, Operation, OwnerId, RenewalPolicy, Requirements, SharedLockInfo, SharedPage,
    TtlModel, WaitStrategy, disable_metrics, enable_metrics, set_holder_label,
};

use backend::Driver;

/// The drivers this facade knows, one line each: its cargo feature (which
/// is also the driver's [`backend::Driver::name`]) and its crate, which exports a
/// `DRIVER` descriptor. A driver whose feature is off is left out of the
/// build, and its feature is named when a URL cannot be served.
macro_rules! drivers {
    ($($feature:literal => $krate:ident),* $(,)?) => {
        /// The drivers compiled into this build, the in-memory one first
        /// (public as [`backend::drivers`]).
        fn registered_drivers() -> &'static [&'static Driver] {
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
    "file" => lock_file,
    "nats" => lock_nats,
}

/// The URL schemes this build understands.
pub fn supported_schemes() -> Vec<&'static str> {
    registered_drivers()
        .iter()
        .flat_map(|d| d.schemes.iter().copied())
        .collect()
}

/// Connects to the backend a URL names and wraps it in a [`LockClient`].
///
/// # Errors
///
/// As [`backend::open`].
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
/// As [`backend::open_config`].
///
/// # Cancel safety
///
/// Safe: a dropped connect leaves nothing behind.
pub async fn connect_config(config: &Config) -> Result<LockClient, LockError> {
    let backend = backend::open_config(config).await?;
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
            let err = backend::open(url).await.unwrap_err();
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
