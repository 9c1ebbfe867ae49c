//! The client library alone, per driver: the driver's requests for one
//! mutex acquire + release on a free key, sent through the client crate
//! the driver requires and nothing else of the driver (its key layout and
//! script texts aside). Benchmarks run it beside the hand floor and the
//! driver, so that a gap to the floor is split into the library's share
//! (crate alone over floor) and the driver's own (ours over crate alone).
//!
//! One entry per driver that speaks through a client library in
//! [`for_driver`]: ZooKeeper ([`zk::ZkCrateAlone`](crate::zk::ZkCrateAlone),
//! `zookeeper-client`), etcd ([`etcd::EtcdCrateAlone`](crate::etcd::EtcdCrateAlone),
//! `etcd-client`), Redis on one server
//! ([`redis::RedisCrateAlone`](crate::redis::RedisCrateAlone), redis-rs)
//! and Redlock ([`redis::RedlockCrateAlone`](crate::redis::RedlockCrateAlone),
//! redis-rs, one connection per node). The SQL drivers' library (sqlx) is
//! the floors' own connection already, and Sentinel's and Cluster's cycles
//! go through the crate's discovery and routing: none for them.

use std::sync::Arc;
use std::time::Duration;

use conformance::bench::Contender;
use lock_core::LockError;

use crate::BoxFuture;

/// Connects one crate-alone client for a URL, every grant asking for the
/// given TTL where the backend's grants carry one: `Ok(None)` when this
/// URL's form has none (Sentinel, Cluster).
pub type CrateAloneFn =
    for<'a> fn(&'a str, Duration) -> BoxFuture<'a, Result<Option<Arc<dyn Contender>>, LockError>>;

/// A driver's client library measured alone.
#[derive(Clone, Copy, Debug)]
pub struct CrateAlone {
    /// The crate's name (`zookeeper-client`, `etcd-client`, `redis`).
    pub library: &'static str,
    /// Opens one client of it.
    pub connect: CrateAloneFn,
}

fn zk_alone(
    url: &str,
    _ttl: Duration,
) -> BoxFuture<'_, Result<Option<Arc<dyn Contender>>, LockError>> {
    Box::pin(async move {
        let alone = crate::zk::ZkCrateAlone::connect(url).await?;
        Ok(Some(Arc::new(alone) as Arc<dyn Contender>))
    })
}

fn etcd_alone(
    url: &str,
    _ttl: Duration,
) -> BoxFuture<'_, Result<Option<Arc<dyn Contender>>, LockError>> {
    Box::pin(async move {
        let alone = crate::etcd::EtcdCrateAlone::connect(url).await?;
        Ok(Some(Arc::new(alone) as Arc<dyn Contender>))
    })
}

fn redis_alone(
    url: &str,
    ttl: Duration,
) -> BoxFuture<'_, Result<Option<Arc<dyn Contender>>, LockError>> {
    Box::pin(async move {
        let config = lock_redis::RedisConfig::from_url(url)?;
        match config.topology() {
            lock_redis::RedisTopology::Single(_) => {
                let alone = crate::redis::RedisCrateAlone::connect(url, ttl).await?;
                Ok(Some(Arc::new(alone) as Arc<dyn Contender>))
            }
            lock_redis::RedisTopology::Redlock(_) => {
                let alone = crate::redis::RedlockCrateAlone::connect(url, ttl).await?;
                Ok(Some(Arc::new(alone) as Arc<dyn Contender>))
            }
            _ => Ok(None),
        }
    })
}

/// The client library of the driver named `driver` (`Driver::name`),
/// measured alone; `None` for a driver without one here (see the module
/// docs).
pub fn for_driver(driver: &str) -> Option<CrateAlone> {
    match driver {
        "zk" => Some(CrateAlone {
            library: "zookeeper-client",
            connect: zk_alone,
        }),
        "etcd" => Some(CrateAlone {
            library: "etcd-client",
            connect: etcd_alone,
        }),
        "redis" => Some(CrateAlone {
            library: "redis",
            connect: redis_alone,
        }),
        _ => None,
    }
}
