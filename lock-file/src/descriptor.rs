//! This driver's entry in the family ([`DRIVER`]).

use lock_core::driver::Driver;

use crate::NAME;
use crate::backend::CAPABILITIES;
use crate::config::FileConfig;

/// The file driver: `file:///path/to/dir`.
pub static DRIVER: Driver = Driver {
    name: NAME,
    schemes: &["file"],
    default_ports: &[],
    summary: "file:///path/to/dir: flock(2) on one file per key, one host",
    connect,
    capabilities: Some(|url| FileConfig::from_endpoint(url.clone()).map(|_| CAPABILITIES)),
};

lock_core::connect_fn!(fn connect = crate::open);
