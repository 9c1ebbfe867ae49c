//! This driver's entry in the family ([`DRIVER`]).

use std::sync::Arc;

use lock_core::LockBackend;
use lock_core::driver::{BoxFuture, Driver};

use crate::backend::CAPABILITIES;
use crate::config::FileConfig;
use crate::{FileBackend, LockError, NAME};

/// The file driver: `file:///path/to/dir`.
pub static DRIVER: Driver = Driver {
    name: NAME,
    schemes: &["file"],
    default_ports: &[],
    summary: "file:///path/to/dir: flock(2) on one file per key, one host",
    connect: connect_boxed,
    // The hand-written floor lives in lock-bench (`lock_bench::file`).
    floor: None,
    permit_floor: None,
    capabilities: Some(|url| FileConfig::from_url(url).map(|_| CAPABILITIES)),
    fair_option: None,
};

fn connect_boxed(url: &str) -> BoxFuture<'_, Result<Arc<dyn LockBackend>, LockError>> {
    Box::pin(async move {
        let backend: FileBackend = crate::connect(url).await?;
        Ok(Arc::new(backend) as Arc<dyn LockBackend>)
    })
}
