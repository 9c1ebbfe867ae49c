//! The backend side of the facade, for tools that call a backend directly
//! (an admin command, a test harness, a benchmark) and for driver authors:
//! the drivers compiled in, [`open`] (a backend's kernel rather than a
//! [`LockClient`](crate::LockClient)), the kernel trait [`LockBackend`], its
//! optional facets and the calls built on both ([`LockBackendExt`]).
//!
//! [`LockBackend::facets`] says which optional parts ([`Admin`],
//! [`Listing`], [`Elections`], [`LockSets`], [`Downgrade`],
//! [`HolderWatch`]) a backend has; a call of a facet it lacks answers
//! [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported)(crate::ErrorKind::Unsupported).

use std::sync::Arc;

pub use lock_core::driver::Driver;
pub use lock_core::{
    Admin, Downgrade, Elections, Facets, GrantRequest, HolderWatch, Lease, Listing, LockBackend,
    LockBackendExt, LockSets, LockWrapper, MemoryBackend, MigrationBackend,
};

use lock_core::endpoint::Endpoint;

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
/// [`ErrorKind::Config`](crate::ErrorKind::Config) for an unknown scheme, listing the supported ones
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
/// [`ErrorKind::Config`](crate::ErrorKind::Config) for a malformed URL or an unknown scheme (naming
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
/// As [`open`], plus [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) when the backend cannot
/// meet the config's requirements.
///
/// # Cancel safety
///
/// Safe: a dropped connect leaves nothing behind.
pub async fn open_config(config: &Config) -> Result<Arc<dyn LockBackend>, LockError> {
    let requirements = &config.requirements;
    let backend = match &config.migration {
        Some(m) => {
            let old = open_url(&m.old_url, requirements).await?;
            let new = open_url(&m.new_url, requirements).await?;
            Arc::new(m.backend(old, new, config.defaults.ttl)?) as Arc<dyn LockBackend>
        }
        None => open_url(&config.url, requirements).await?,
    };
    backend
        .capabilities()
        .check(requirements)
        .map_err(|e| e.with_backend(backend.name()))?;
    Ok(backend)
}

/// The URL parsed once: its scheme picks the driver, which receives the
/// parsed URL and the typed requirements (a driver with a setting for one,
/// such as Redis refusing an evicting server when fencing is required,
/// applies it; every backend's capabilities are checked after).
async fn open_url(
    url: &str,
    requirements: &lock_core::Requirements,
) -> Result<Arc<dyn LockBackend>, LockError> {
    let endpoint = Endpoint::parse(url)
        .map_err(|e| LockError::config(format!("bad backend URL {:?}: {e}", redact_url(url))))?;
    let driver = drivers()
        .iter()
        .copied()
        .find(|d| d.schemes.contains(&endpoint.scheme()))
        .map_or_else(|| driver_for(url), Ok)?;
    (driver.connect)(endpoint, *requirements).await
}
