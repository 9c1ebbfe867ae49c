//! This driver's entry in the family ([`lock_core::driver`]).

use std::sync::Arc;

use lock_core::driver::{BoxFuture, Driver};
use lock_core::floor::RawFloor;
use lock_core::{LockBackend, LockError};

use crate::floor::ZkFloor;

/// The ZooKeeper driver.
pub static DRIVER: Driver = Driver {
    name: "zk",
    schemes: &["zk", "zookeeper"],
    default_ports: &[("zk", 2181), ("zookeeper", 2181)],
    summary: "zk://host[:port][,host[:port]...][/chroot]",
    connect,
    floor: Some(floor),
};

fn connect(url: &str) -> BoxFuture<'_, Result<Arc<dyn LockBackend>, LockError>> {
    Box::pin(async move { Ok(Arc::new(crate::connect(url).await?) as Arc<dyn LockBackend>) })
}

fn floor(url: &str) -> BoxFuture<'_, Result<Option<Box<dyn RawFloor>>, LockError>> {
    Box::pin(async move {
        Ok(Some(
            Box::new(ZkFloor::connect(url).await?) as Box<dyn RawFloor>
        ))
    })
}
