//! This driver's entry in the family ([`DRIVER`]).

use lock_core::driver::Driver;

use crate::NAME;
use crate::backend::CAPABILITIES;
use crate::config::{DEFAULT_PORT, NatsConfig};

/// The NATS driver: `nats://host:port[,host:port]/bucket`.
pub static DRIVER: Driver = Driver {
    name: NAME,
    schemes: &["nats"],
    default_ports: &[("nats", DEFAULT_PORT)],
    summary: "nats://host:port[,host:port]/bucket: a JetStream key-value bucket (server 2.11+)",
    connect,
    capabilities: Some(|url| NatsConfig::from_endpoint(url.clone()).map(|_| CAPABILITIES)),
};

lock_core::connect_fn!(fn connect = crate::open);
