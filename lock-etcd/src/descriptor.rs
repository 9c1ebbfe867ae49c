//! This driver's entry in the family ([`lock_core::driver`]).

use lock_core::driver::Driver;

use lock_core::LockError;

use crate::floor::{EtcdFloor, EtcdPermitFloor};

/// The etcd driver.
pub static DRIVER: Driver = Driver {
    name: "etcd",
    schemes: &["etcd", "etcds"],
    default_ports: &[("etcd", 2379), ("etcds", 2379)],
    summary: "etcd://host[:port][,host[:port]...][/prefix] (etcds:// for TLS)",
    connect,
    floor: Some(floor),
    permit_floor: Some(permit_floor),
    capabilities: Some(|url| {
        crate::EtcdConfig::from_url(url)?;
        Ok(crate::capabilities())
    }),
    fair_option: None,
};

lock_core::connect_fn!(fn connect = crate::connect);
lock_core::floor_fn!(fn floor = EtcdFloor::connect);

/// One permit of a semaphore of 4 per cycle (the descriptor's contract).
async fn one_of_four(url: &str) -> Result<EtcdPermitFloor, LockError> {
    EtcdPermitFloor::connect(url, 1, 4).await
}

lock_core::floor_fn!(fn permit_floor = one_of_four);
