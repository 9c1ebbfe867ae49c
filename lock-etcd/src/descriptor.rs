//! This driver's entry in the family ([`lock_core::driver`]).

use std::sync::Arc;

use lock_core::driver::{BoxFuture, Driver};
use lock_core::floor::RawFloor;
use lock_core::{LockBackend, LockError};

use crate::floor::EtcdFloor;

/// The etcd driver.
pub static DRIVER: Driver = Driver {
    name: "etcd",
    schemes: &["etcd", "etcds"],
    default_ports: &[("etcd", 2379), ("etcds", 2379)],
    summary: "etcd://host[:port][,host[:port]...][/prefix] (etcds:// for TLS)",
    connect,
    floor: Some(floor),
};

fn connect(url: &str) -> BoxFuture<'_, Result<Arc<dyn LockBackend>, LockError>> {
    Box::pin(async move { Ok(Arc::new(crate::connect(url).await?) as Arc<dyn LockBackend>) })
}

fn floor(url: &str) -> BoxFuture<'_, Result<Option<Box<dyn RawFloor>>, LockError>> {
    Box::pin(async move {
        Ok(Some(
            Box::new(EtcdFloor::connect(url).await?) as Box<dyn RawFloor>
        ))
    })
}
