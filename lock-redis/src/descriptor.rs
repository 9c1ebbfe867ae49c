//! This driver's entry in the family ([`lock_core::driver`]).

use lock_core::LockError;
use lock_core::driver::{BoxFuture, Driver};
use lock_core::floor::RawFloor;

use crate::floor::{RedisFloor, RedlockFloor};

/// The Redis driver: one server, Sentinel, Cluster and Redlock.
pub static DRIVER: Driver = Driver {
    name: "redis",
    schemes: &[
        "redis",
        "rediss",
        "redis+sentinel",
        "rediss+sentinel",
        "redis+cluster",
        "rediss+cluster",
        "redlock",
    ],
    default_ports: &[
        ("redis", 6379),
        ("rediss", 6379),
        ("redis+sentinel", 26379),
        ("rediss+sentinel", 26379),
        ("redis+cluster", 6379),
        ("rediss+cluster", 6379),
        ("redlock", 6379),
    ],
    summary: "redis://host[:port][/db], redis+sentinel://, redis+cluster://, redlock://a,b,c",
    connect,
    floor: Some(floor),
    capabilities: None,
};

lock_core::connect_fn!(fn connect = crate::connect);

fn floor(url: &str) -> BoxFuture<'_, Result<Option<Box<dyn RawFloor>>, LockError>> {
    Box::pin(async move {
        Ok(
            match lock_core::driver::scheme_of(url)
                .to_ascii_lowercase()
                .as_str()
            {
                "redis" | "rediss" => {
                    Some(Box::new(RedisFloor::connect(url).await?) as Box<dyn RawFloor>)
                }
                "redlock" => Some(Box::new(RedlockFloor::connect(url).await?) as Box<dyn RawFloor>),
                _ => None,
            },
        )
    })
}
