//! Servers started for a comparison run, behind one interface: a URL to
//! reach them, the address to put a fault proxy in front of, and process
//! faults (pause, kill, restart).

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::{LockBackend, LockError};
use tokio::sync::Mutex;

use crate::harness::Target;
use crate::process::HarnessError;
use crate::proxy::FaultProxy;
use crate::servers::{
    etcd::EtcdServer, mariadb::MariaDbServer, postgres::PostgresServer, redis::RedisServer,
    zookeeper::ZkServer,
};

/// The server kinds `distlock compare --spawn` can start, in report order.
pub const KINDS: &[&str] = &["redis", "etcd", "zookeeper", "postgres", "mariadb"];

/// One started server of some kind.
#[derive(Debug)]
#[non_exhaustive]
pub enum Deployment {
    /// A standalone redis-server without persistence.
    Redis(RedisServer),
    /// A single etcd member.
    Etcd(EtcdServer),
    /// A standalone ZooKeeper.
    Zookeeper(ZkServer),
    /// PostgreSQL.
    Postgres(PostgresServer),
    /// MariaDB.
    MariaDb(MariaDbServer),
}

impl Deployment {
    /// Starts a server of `kind` (one of [`KINDS`]).
    ///
    /// # Errors
    ///
    /// A missing binary (naming the package), or a server that does not
    /// start.
    pub async fn start(kind: &str) -> Result<Self, HarnessError> {
        Ok(match kind {
            "redis" => Self::Redis(RedisServer::start().await?),
            "etcd" => Self::Etcd(EtcdServer::start().await?),
            "zookeeper" => Self::Zookeeper(ZkServer::start().await?),
            "postgres" => Self::Postgres(PostgresServer::start().await?),
            "mariadb" => Self::MariaDb(MariaDbServer::start().await?),
            other => {
                return Err(HarnessError::Setup {
                    what: format!("starting {other}"),
                    output: format!("unknown server kind; expected one of {}", KINDS.join(", ")),
                });
            }
        })
    }

    /// The kind's name.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Redis(_) => "redis",
            Self::Etcd(_) => "etcd",
            Self::Zookeeper(_) => "zookeeper",
            Self::Postgres(_) => "postgres",
            Self::MariaDb(_) => "mariadb",
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        match self {
            Self::Redis(s) => s.port(),
            Self::Etcd(s) => s
                .endpoints()
                .first()
                .and_then(|e| e.rsplit(':').next()?.parse().ok())
                .unwrap_or(0),
            Self::Zookeeper(s) => s.node().client_port(),
            Self::Postgres(s) => s.port(),
            Self::MariaDb(s) => s.port(),
        }
    }

    /// The backend URL reaching this server (through `port` instead of the
    /// server's own port when given, e.g. a fault proxy's).
    pub fn url(&self, port: Option<u16>) -> String {
        let url = match self {
            Self::Redis(s) => s.url(),
            // Short sessions, so crash scenarios finish in seconds.
            Self::Etcd(s) => s.url("distlock", "ttl=2s"),
            Self::Zookeeper(s) => format!("{}?session_timeout=2s", s.url()),
            Self::Postgres(s) => s.url(),
            Self::MariaDb(s) => s.url(),
        };
        match port {
            Some(port) => url.replace(
                &format!("127.0.0.1:{}", self.port()),
                &format!("127.0.0.1:{port}"),
            ),
            None => url,
        }
    }

    /// Freezes the server (SIGSTOP).
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent.
    pub fn pause(&mut self) -> Result<(), HarnessError> {
        match self {
            Self::Redis(s) => s.process().pause(),
            Self::Etcd(s) => s.pause_all(),
            Self::Zookeeper(s) => s.pause(),
            Self::Postgres(s) => s.pause(),
            Self::MariaDb(s) => s.process().pause(),
        }
    }

    /// Resumes a paused server (SIGCONT).
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent.
    pub fn resume(&mut self) -> Result<(), HarnessError> {
        match self {
            Self::Redis(s) => s.process().resume(),
            Self::Etcd(s) => s.resume_all(),
            Self::Zookeeper(s) => s.resume(),
            Self::Postgres(s) => s.resume(),
            Self::MariaDb(s) => s.process().resume(),
        }
    }

    /// Kills the server with SIGKILL and starts it again on the same port
    /// and data directory (Redis here runs without persistence, so it comes
    /// back empty: that is the point of its negative control).
    ///
    /// # Errors
    ///
    /// When it cannot be restarted.
    pub async fn kill_and_restart(&mut self) -> Result<(), HarnessError> {
        match self {
            Self::Redis(s) => s.process().restart().await,
            Self::Etcd(s) => {
                s.kill(0)?;
                s.restart(0).await
            }
            Self::Zookeeper(s) => s.node_mut().process().restart().await,
            Self::Postgres(s) => {
                s.kill()?;
                s.restart().await
            }
            Self::MariaDb(s) => {
                s.process().kill()?;
                s.restart().await
            }
        }
    }
}

/// Opens a backend from a URL (the facade's `distlock::open`, injected so
/// that this crate stays independent of the drivers).
pub type Opener = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<Arc<dyn LockBackend>, LockError>> + Send>>
        + Send
        + Sync,
>;

/// A started server as a [`Target`]: clients open its URL; "unreachable"
/// pauses it; scenarios can also kill and restart it and reach it through a
/// fault proxy.
pub struct DeployedTarget {
    name: String,
    deployment: Mutex<Deployment>,
    url: String,
    open: Opener,
}

impl std::fmt::Debug for DeployedTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeployedTarget")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl DeployedTarget {
    /// Wraps a started server.
    pub fn new(deployment: Deployment, open: Opener) -> Self {
        let url = deployment.url(None);
        Self {
            name: deployment.kind().to_owned(),
            deployment: Mutex::new(deployment),
            url,
            open,
        }
    }

    /// The URL clients use.
    pub fn url(&self) -> &str {
        &self.url
    }
}

#[async_trait]
impl Target for DeployedTarget {
    fn name(&self) -> String {
        self.name.clone()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        (self.open)(self.url.clone()).await
    }

    async fn make_unreachable(&self) -> Result<bool, HarnessError> {
        self.deployment.lock().await.pause()?;
        Ok(true)
    }

    async fn heal(&self) -> Result<(), HarnessError> {
        let mut d = self.deployment.lock().await;
        d.resume()
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }

    async fn kill_and_restart_server(&self) -> Result<bool, HarnessError> {
        self.deployment.lock().await.kill_and_restart().await?;
        Ok(true)
    }

    async fn proxied_client(
        &self,
    ) -> Result<Option<(Arc<dyn LockBackend>, FaultProxy)>, HarnessError> {
        let (upstream_port, url) = {
            let d = self.deployment.lock().await;
            (d.port(), d.url(None))
        };
        let proxy =
            FaultProxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, upstream_port))).await?;
        let url = url.replace(
            &format!("127.0.0.1:{upstream_port}"),
            &format!("127.0.0.1:{}", proxy.port()),
        );
        let client = (self.open)(url).await.map_err(|e| HarnessError::Setup {
            what: "connecting through the proxy".into(),
            output: e.to_string(),
        })?;
        Ok(Some((client, proxy)))
    }
}
