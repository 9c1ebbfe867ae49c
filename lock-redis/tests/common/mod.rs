//! The Redis targets of the tests: the deployments of
//! `conformance::deploy` (`redis`, `redlock`, or a server started here
//! wrapped as one) opened with this driver, and a target of our own for the
//! topologies no deployment has: Redis Cluster and Sentinel.

#![allow(dead_code, unreachable_pub, clippy::large_enum_variant)]

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use conformance::deploy::{self, DeployedTarget, Deployment, Opener};
use conformance::process::ServerProcess;
use conformance::servers::redis::{RedisCluster, RedisSentinel, RedisServer};
use conformance::{HarnessError, OrSkip, Target};
use lock_core::{LockBackend, LockError};
use lock_redis::{RedisBackend, RedisConfig};

/// Opens this driver's backend from a deployment's URL, rewritten by `map`
/// first (the deployment hands out `redis://127.0.0.1:<port>`; a test may
/// change the scheme or add options).
pub fn opener_with(map: impl Fn(String) -> String + Send + Sync + 'static) -> Opener {
    let map = Arc::new(map);
    Arc::new(move |url: String| {
        let url = map(url);
        Box::pin(
            async move { Ok(Arc::new(lock_redis::connect(&url).await?) as Arc<dyn LockBackend>) },
        )
    })
}

/// Opens this driver's backend from a deployment's URL as it is.
pub fn opener() -> Opener {
    opener_with(|url| url)
}

/// A started deployment (`redis`, `redlock`) as a suite target, or `None`
/// (skip) when redis-server is missing.
pub async fn deployed(kind: &str) -> Option<DeployedTarget> {
    let deployment: Box<dyn Deployment> = deploy::start(kind).await.or_skip()?;
    Some(DeployedTarget::new(deployment, opener()))
}

/// `url` with one more query option (`fair=true`).
pub fn with_option(url: &str, option: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{option}")
}

/// A started deployment whose clients all open its URL plus `option`.
pub async fn deployed_with(kind: &str, option: &'static str) -> Option<DeployedTarget> {
    let deployment: Box<dyn Deployment> = deploy::start(kind).await.or_skip()?;
    Some(DeployedTarget::new(
        deployment,
        opener_with(move |url| with_option(&url, option)),
    ))
}

/// A bare connection to the server on `port`, for reading and changing
/// keys behind the driver's back.
pub async fn raw(port: u16) -> redis::aio::MultiplexedConnection {
    try_raw(port).await.expect("raw connection")
}

/// [`raw`], or the error (a server that is down).
pub async fn try_raw(port: u16) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
}

/// A master with one synced replica, and a client of the master whose
/// grants wait for that replica (`replicas=1&wait_timeout=200ms`); `None`
/// (skip) when redis-server is missing.
pub async fn waiting_for_a_replica() -> Option<(RedisServer, RedisServer, RedisBackend)> {
    let (master, replica) = RedisServer::start_with_synced_replica().await.or_skip()?;
    let url = format!("{}?replicas=1&wait_timeout=200ms", master.url());
    let backend = lock_redis::connect(&url).await.unwrap();
    Some((master, replica, backend))
}

/// The servers behind one target.
pub enum Fleet {
    Cluster(RedisCluster),
    Sentinel {
        master: RedisServer,
        replica: RedisServer,
        sentinel: RedisSentinel,
    },
}

impl Fleet {
    /// The running server processes (killed ones are left out).
    pub fn processes(&mut self) -> Vec<&mut ServerProcess> {
        let all: Vec<&mut ServerProcess> = match self {
            Self::Cluster(c) => c.nodes().iter_mut().map(RedisServer::process).collect(),
            Self::Sentinel {
                master,
                replica,
                sentinel,
            } => vec![master.process(), replica.process(), sentinel.process()],
        };
        all.into_iter().filter(|p| p.pid().is_some()).collect()
    }
}

/// A topology that no deployment of `conformance::deploy` has (Cluster,
/// Sentinel) as a conformance target: `client()` is a new, independent
/// `RedisBackend`; unreachable = SIGSTOP of every server process.
pub struct RedisTarget {
    pub name: String,
    pub url: String,
    pub fleet: Mutex<Fleet>,
}

impl RedisTarget {
    pub fn fleet(&self) -> std::sync::MutexGuard<'_, Fleet> {
        self.fleet.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub async fn backend(&self) -> Result<RedisBackend, LockError> {
        RedisBackend::connect(RedisConfig::from_url(&self.url)?).await
    }

    pub async fn cluster() -> Result<Self, HarnessError> {
        let cluster = RedisCluster::start(3).await?;
        Ok(Self {
            name: "redis-cluster".into(),
            url: cluster.url(),
            fleet: Mutex::new(Fleet::Cluster(cluster)),
        })
    }

    /// This target with one more URL option on every client (and a name
    /// that says so).
    pub fn with_option(mut self, option: &str) -> Self {
        self.url = with_option(&self.url, option);
        self.name = format!("{}?{option}", self.name);
        self
    }

    pub async fn sentinel() -> Result<Self, HarnessError> {
        let (master, replica) = RedisServer::start_with_synced_replica().await?;
        let sentinel = RedisSentinel::start("locks", master.port()).await?;
        sentinel
            .wait_replica_known(std::time::Duration::from_secs(20))
            .await?;
        Ok(Self {
            name: "redis-sentinel".into(),
            url: sentinel.url(),
            fleet: Mutex::new(Fleet::Sentinel {
                master,
                replica,
                sentinel,
            }),
        })
    }
}

#[async_trait]
impl Target for RedisTarget {
    fn name(&self) -> String {
        self.name.clone()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(self.backend().await?))
    }

    async fn make_unreachable(&self) -> Result<bool, HarnessError> {
        for process in self.fleet().processes() {
            process.pause()?;
        }
        Ok(true)
    }

    async fn heal(&self) -> Result<(), HarnessError> {
        for process in self.fleet().processes() {
            if process.is_paused() {
                process.resume()?;
            }
        }
        Ok(())
    }
}
