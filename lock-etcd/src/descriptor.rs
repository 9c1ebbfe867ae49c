//! This driver's entry in the family ([`lock_core::driver`]).

use lock_core::driver::Driver;

/// The etcd driver.
pub static DRIVER: Driver = Driver {
    name: "etcd",
    schemes: &["etcd", "etcds"],
    default_ports: &[("etcd", 2379), ("etcds", 2379)],
    summary: "etcd://host[:port][,host[:port]...][/prefix] (etcds:// for TLS)",
    connect,
    capabilities: Some(|url| {
        crate::EtcdConfig::from_endpoint(url.clone())?;
        Ok(crate::capabilities())
    }),
};

lock_core::connect_fn!(fn connect = crate::open);
