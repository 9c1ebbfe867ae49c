//! The backend side of the facade, for tools that call a backend directly
//! (an admin command, a test harness, a benchmark) and for driver authors:
//! the drivers compiled in, [`open`] (a backend's kernel rather than a
//! [`LockClient`](crate::LockClient)), the kernel trait [`LockBackend`], its
//! optional facets and the calls built on both ([`LockBackendExt`]).
//!
//! [`LockBackend::facets`] says which optional parts ([`Admin`],
//! [`Listing`], [`Elections`], [`LockSets`], [`Downgrade`],
//! [`HolderWatch`]) a backend has; a call of a facet it lacks answers
//! [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported).

use std::sync::Arc;

pub use lock_core::driver::Driver;
pub use lock_core::{
    Admin, Downgrade, Elections, Facets, GrantRequest, HolderWatch, Lease, Listing, LockBackend,
    LockBackendExt, LockSets, LockWrapper, MemoryBackend, MigrationBackend,
};

use crate::{Config, LockError, redact_url, supported_schemes};

/// The drivers compiled into this build, the in-memory one first (one line
/// each in the facade's `drivers!` list).
pub fn drivers() -> &'static [&'static Driver] {
    crate::registered_drivers()
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
        let missing = crate::missing_features();
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

