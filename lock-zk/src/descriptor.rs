//! This driver's entry in the family ([`lock_core::driver`]).

use lock_core::driver::Driver;

use crate::floor::ZkFloor;

/// The ZooKeeper driver.
pub static DRIVER: Driver = Driver {
    name: "zk",
    schemes: &["zk", "zookeeper"],
    default_ports: &[("zk", 2181), ("zookeeper", 2181)],
    summary: "zk://host[:port][,host[:port]...][/chroot]",
    connect,
    floor: Some(floor),
    capabilities: None,
};

lock_core::connect_fn!(fn connect = crate::connect);
lock_core::floor_fn!(fn floor = ZkFloor::connect);
