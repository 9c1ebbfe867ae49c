//! One server per deployment: Redis, etcd, ZooKeeper, PostgreSQL and
//! MariaDB (the SQL ones also in session mode).

use async_trait::async_trait;

use super::{Deployment, Started};
use crate::process::{HarnessError, ServerProcess};
use crate::servers::{
    etcd::EtcdServer, mariadb::MariaDbServer, postgres::PostgresServer, redis::RedisServer,
    zookeeper::ZkServer,
};

/// What a single server offers a [`Single`] deployment.
#[async_trait]
pub trait SingleServer: std::fmt::Debug + Send + Sync {
    /// The base URL of the server (the deployment may add options).
    fn base_url(&self) -> String;
    /// The client port.
    fn client_port(&self) -> u16;
    /// The server's process.
    fn process(&mut self) -> &mut ServerProcess;
    /// SIGSTOP (the process by default).
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent.
    fn pause(&mut self) -> Result<(), HarnessError> {
        self.process().pause()
    }
    /// SIGCONT (the process by default).
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent.
    fn resume(&mut self) -> Result<(), HarnessError> {
        self.process().resume()
    }
    /// SIGKILL, then a start on the same port and data (the process's
    /// restart by default).
    ///
    /// # Errors
    ///
    /// When it does not come back.
    async fn kill_and_restart(&mut self) -> Result<(), HarnessError> {
        self.process().restart().await
    }
}

/// One server as a deployment of kind `kind`, its URL followed by
/// `options` (`?mode=session`, short sessions, ...).
#[derive(Debug)]
pub struct Single<S> {
    kind: &'static str,
    server: S,
    options: &'static str,
}

impl<S: SingleServer> Single<S> {
    /// Wraps a started server.
    pub fn new(kind: &'static str, server: S, options: &'static str) -> Self {
        Self {
            kind,
            server,
            options,
        }
    }

    /// The server.
    pub fn server(&self) -> &S {
        &self.server
    }
}

#[async_trait]
impl<S: SingleServer + 'static> Deployment for Single<S> {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn url(&self) -> String {
        format!("{}{}", self.server.base_url(), self.options)
    }

    fn port(&self) -> u16 {
        self.server.client_port()
    }

    fn pause(&mut self) -> Result<(), HarnessError> {
        self.server.pause()
    }

    fn resume(&mut self) -> Result<(), HarnessError> {
        self.server.resume()
    }

    async fn kill_and_restart(&mut self) -> Result<(), HarnessError> {
        self.server.kill_and_restart().await
    }
}

#[async_trait]
impl SingleServer for RedisServer {
    fn base_url(&self) -> String {
        self.url()
    }
    fn client_port(&self) -> u16 {
        self.port()
    }
    fn process(&mut self) -> &mut ServerProcess {
        RedisServer::process(self)
    }
}

/// The client port in the first endpoint of an etcd server or cluster.
pub(super) fn etcd_port(server: &EtcdServer) -> u16 {
    server
        .endpoints()
        .first()
        .and_then(|e| e.rsplit(':').next()?.parse().ok())
        .unwrap_or(0)
}

#[async_trait]
impl SingleServer for EtcdServer {
    fn base_url(&self) -> String {
        self.url("distlock", "")
    }
    fn client_port(&self) -> u16 {
        etcd_port(self)
    }
    fn process(&mut self) -> &mut ServerProcess {
        self.member(0).process()
    }
    fn pause(&mut self) -> Result<(), HarnessError> {
        self.pause_all()
    }
    fn resume(&mut self) -> Result<(), HarnessError> {
        self.resume_all()
    }
    async fn kill_and_restart(&mut self) -> Result<(), HarnessError> {
        self.kill(0)?;
        self.restart(0).await
    }
}

#[async_trait]
impl SingleServer for ZkServer {
    fn base_url(&self) -> String {
        self.url()
    }
    fn client_port(&self) -> u16 {
        self.node().client_port()
    }
    fn process(&mut self) -> &mut ServerProcess {
        self.node_mut().process()
    }
    fn pause(&mut self) -> Result<(), HarnessError> {
        ZkServer::pause(self)
    }
    fn resume(&mut self) -> Result<(), HarnessError> {
        ZkServer::resume(self)
    }
}

#[async_trait]
impl SingleServer for PostgresServer {
    fn base_url(&self) -> String {
        self.url()
    }
    fn client_port(&self) -> u16 {
        self.port()
    }
    fn process(&mut self) -> &mut ServerProcess {
        PostgresServer::process(self)
    }
    fn pause(&mut self) -> Result<(), HarnessError> {
        PostgresServer::pause(self)
    }
    fn resume(&mut self) -> Result<(), HarnessError> {
        PostgresServer::resume(self)
    }
    async fn kill_and_restart(&mut self) -> Result<(), HarnessError> {
        self.kill()?;
        self.restart().await
    }
}

#[async_trait]
impl SingleServer for MariaDbServer {
    fn base_url(&self) -> String {
        self.url()
    }
    fn client_port(&self) -> u16 {
        self.port()
    }
    fn process(&mut self) -> &mut ServerProcess {
        MariaDbServer::process(self)
    }
    async fn kill_and_restart(&mut self) -> Result<(), HarnessError> {
        self.process().kill()?;
        self.restart().await
    }
}

fn boxed<S: SingleServer + 'static>(
    kind: &'static str,
    server: S,
    options: &'static str,
) -> Started {
    Ok(Box::new(Single::new(kind, server, options)))
}

pub(super) async fn redis(_peer_proxies: bool) -> Started {
    boxed("redis", RedisServer::start().await?, "")
}

// Short sessions, so that crash scenarios finish in seconds.
pub(super) async fn etcd(_peer_proxies: bool) -> Started {
    boxed("etcd", EtcdServer::start().await?, "?ttl=2s")
}

pub(super) async fn zookeeper(_peer_proxies: bool) -> Started {
    boxed("zookeeper", ZkServer::start().await?, "?session_timeout=2s")
}

pub(super) async fn postgres(_peer_proxies: bool) -> Started {
    boxed("postgres", PostgresServer::start().await?, "")
}

pub(super) async fn mariadb(_peer_proxies: bool) -> Started {
    boxed("mariadb", MariaDbServer::start().await?, "")
}

/// Advisory locks (`mode=session`).
pub(super) async fn postgres_session(_peer_proxies: bool) -> Started {
    boxed(
        "postgres-session",
        PostgresServer::start().await?,
        "?mode=session",
    )
}

/// `GET_LOCK` (`mode=session`).
pub(super) async fn mariadb_session(_peer_proxies: bool) -> Started {
    boxed(
        "mariadb-session",
        MariaDbServer::start().await?,
        "?mode=session",
    )
}

/// redis-py's, redsync's and node-redlock's layout (`layout=plain`).
pub(super) async fn redis_plain(_peer_proxies: bool) -> Started {
    boxed("redis-plain", RedisServer::start().await?, "?layout=plain")
}

/// Redisson's `RLock` hash (`layout=redisson`).
pub(super) async fn redis_redisson(_peer_proxies: bool) -> Started {
    boxed(
        "redis-redisson",
        RedisServer::start().await?,
        "?layout=redisson",
    )
}

/// kazoo's node names (`nodes=kazoo`).
pub(super) async fn zookeeper_kazoo(_peer_proxies: bool) -> Started {
    boxed(
        "zookeeper-kazoo",
        ZkServer::start().await?,
        "?session_timeout=2s&nodes=kazoo",
    )
}

/// ShedLock's table (`layout=shedlock`).
pub(super) async fn postgres_shedlock(_peer_proxies: bool) -> Started {
    boxed(
        "postgres-shedlock",
        PostgresServer::start().await?,
        "?layout=shedlock",
    )
}

/// ShedLock's table (`layout=shedlock`).
pub(super) async fn mariadb_shedlock(_peer_proxies: bool) -> Started {
    boxed(
        "mariadb-shedlock",
        MariaDbServer::start().await?,
        "?layout=shedlock",
    )
}
