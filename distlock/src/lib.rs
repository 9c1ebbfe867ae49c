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

mod config;
mod duration;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

pub use config::{Config, MigrationConfig, parse_requirements, redact_url};
pub use duration::{format_duration, parse_duration};
pub use lock_core::{
    Capabilities, ErrorKind, FencingScope, FencingToken, Lease, LockBackend, LockClient,
    LockDefaults, LockError, LockGuard, LockInfo, LockKey, LockRequest, LockState, MemoryBackend,
    MigrationBackend, MigrationPhase, Operation, OwnerId, RenewalPolicy, Requirements, TtlModel,
    WaitStrategy,
};

/// The URL schemes this build understands.
pub fn supported_schemes() -> Vec<&'static str> {
    vec!["memory"]
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
    let backend = match &config.migration {
        Some(m) => {
            let old = open_url(&m.old_url).await?;
            let new = open_url(&m.new_url).await?;
            Arc::new(MigrationBackend::new(old, new, m.phase)) as Arc<dyn LockBackend>
        }
        None => open_url(&config.url).await?,
    };
    backend
        .capabilities()
        .check(&config.requirements)
        .map_err(|e| e.with_backend(backend.name()))?;
    Ok(backend)
}

async fn open_url(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    Config::from_url(url)?;
    let scheme = url.split_once("://").map_or("sqlite", |(s, _)| s);
    let backend: Arc<dyn LockBackend> = match scheme {
        "memory" => Arc::new(named_memory(&url["memory://".len()..])),
        other => {
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
