//! Targets for every Redis topology, on servers started by the tests.

#![allow(dead_code, unreachable_pub, clippy::large_enum_variant)]

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use conformance::HarnessError;
use conformance::Target;
use conformance::process::ServerProcess;
use conformance::servers::redis::{RedisCluster, RedisSentinel, RedisServer};
use lock_core::{LockBackend, LockError};
use lock_redis::{RedisBackend, RedisConfig};

/// The servers behind one target.
pub enum Fleet {
    Single(RedisServer),
    Cluster(RedisCluster),
    Sentinel {
        master: RedisServer,
        replica: RedisServer,
        sentinel: RedisSentinel,
    },
    Redlock(Vec<RedisServer>),
}

impl Fleet {
    /// The running server processes (killed ones are left out).
    pub fn processes(&mut self) -> Vec<&mut ServerProcess> {
        let all: Vec<&mut ServerProcess> = match self {
            Self::Single(s) => vec![s.process()],
            Self::Cluster(c) => c.nodes().iter_mut().map(RedisServer::process).collect(),
            Self::Sentinel {
                master,
                replica,
                sentinel,
            } => vec![master.process(), replica.process(), sentinel.process()],
            Self::Redlock(nodes) => nodes.iter_mut().map(RedisServer::process).collect(),
        };
        all.into_iter().filter(|p| p.pid().is_some()).collect()
    }
}

/// A topology as a conformance target: `client()` is a new, independent
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

    pub async fn single() -> Result<Self, HarnessError> {
        let server = RedisServer::start().await?;
        Ok(Self {
            name: "redis".into(),
            url: server.url(),
            fleet: Mutex::new(Fleet::Single(server)),
        })
    }

    pub async fn cluster() -> Result<Self, HarnessError> {
        let cluster = RedisCluster::start(3).await?;
        Ok(Self {
            name: "redis-cluster".into(),
            url: cluster.url(),
            fleet: Mutex::new(Fleet::Cluster(cluster)),
        })
    }

    pub async fn sentinel() -> Result<Self, HarnessError> {
        let master = RedisServer::start().await?;
        let replica = RedisServer::start_replica_of(&master).await?;
        replica
            .wait_replica_synced(std::time::Duration::from_secs(20))
            .await?;
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

    pub async fn redlock(n: usize) -> Result<Self, HarnessError> {
        let mut nodes = Vec::new();
        for _ in 0..n {
            nodes.push(RedisServer::start().await?);
        }
        let hosts: Vec<String> = nodes
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        Ok(Self {
            name: format!("redlock-{n}"),
            url: format!("redlock://{}", hosts.join(",")),
            fleet: Mutex::new(Fleet::Redlock(nodes)),
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
