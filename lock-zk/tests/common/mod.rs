//! The ZooKeeper target for the shared suite and scenarios, and helpers for
//! the fault tests.

#![allow(dead_code, unreachable_pub)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use conformance::process::HarnessError;
use conformance::proxy::FaultProxy;
use conformance::servers::zookeeper::{ZkEnsemble, ZkServer};
use conformance::{OrSkip, Target};
use lock_core::{LockBackend, LockError};
use lock_zk::{ZkBackend, ZkConfig};
use tokio::sync::Mutex;

/// The session timeout the tests ask for (8 ticks of 500 ms).
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(4);

/// What the target runs on.
pub enum Servers {
    /// One standalone server.
    Single(Box<ZkServer>),
    /// A quorum of servers.
    Ensemble(ZkEnsemble),
}

/// A ZooKeeper target: `client()` is a new backend with its own session;
/// "unreachable" is SIGSTOP of every server.
pub struct ZkTarget {
    name: String,
    url: String,
    pub servers: Mutex<Servers>,
}

impl ZkTarget {
    /// A standalone server, or `None` (skip) when ZooKeeper is missing.
    pub async fn single() -> Option<Self> {
        let server = ZkServer::start().await.or_skip()?;
        Some(Self::new(
            "zookeeper",
            server.url(),
            Servers::Single(Box::new(server)),
        ))
    }

    /// A 3-member ensemble, or `None` (skip) when ZooKeeper is missing.
    pub async fn ensemble() -> Option<Self> {
        let ensemble = ZkEnsemble::start(3).await.or_skip()?;
        Some(Self::new(
            "zookeeper-ensemble",
            ensemble.url(),
            Servers::Ensemble(ensemble),
        ))
    }

    fn new(name: &str, url: String, servers: Servers) -> Self {
        Self {
            name: name.to_owned(),
            url,
            servers: Mutex::new(servers),
        }
    }

    /// The base URL (no options).
    pub fn base_url(&self) -> &str {
        &self.url
    }

    /// The URL the clients use.
    pub fn client_url(&self) -> String {
        format!(
            "{}?session_timeout={}ms&op_timeout=3s&connect_timeout=15s",
            self.url,
            SESSION_TIMEOUT.as_millis()
        )
    }

    /// A new backend with its own session.
    pub async fn backend(&self) -> Result<ZkBackend, LockError> {
        ZkBackend::connect(ZkConfig::from_url(&self.client_url())?).await
    }

    /// A raw client of the same servers, for outside interference.
    pub async fn raw(&self) -> zookeeper_client::Client {
        let hosts = self.url.trim_start_matches("zk://").to_owned();
        zookeeper_client::Client::connector()
            .with_session_timeout(SESSION_TIMEOUT)
            .connect(&hosts)
            .await
            .expect("raw ZooKeeper client")
    }

    /// SIGSTOP every server.
    pub async fn pause(&self) -> Result<(), HarnessError> {
        match &mut *self.servers.lock().await {
            Servers::Single(server) => server.pause(),
            Servers::Ensemble(ensemble) => ensemble.pause_all(),
        }
    }

    /// SIGCONT every server.
    pub async fn resume(&self) -> Result<(), HarnessError> {
        match &mut *self.servers.lock().await {
            Servers::Single(server) => server.resume(),
            Servers::Ensemble(ensemble) => ensemble.resume_all(),
        }
    }
}

#[async_trait::async_trait]
impl Target for ZkTarget {
    fn name(&self) -> String {
        self.name.clone()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(self.backend().await?))
    }

    async fn make_unreachable(&self) -> Result<bool, HarnessError> {
        self.pause().await?;
        Ok(true)
    }

    async fn heal(&self) -> Result<(), HarnessError> {
        self.resume().await
    }

    fn url(&self) -> Option<String> {
        Some(self.client_url())
    }

    async fn kill_and_restart_server(&self) -> Result<bool, HarnessError> {
        // A standalone server only: killing ensemble members is the
        // leader-kill test's business.
        match &mut *self.servers.lock().await {
            Servers::Single(server) => {
                server.node_mut().process().restart().await?;
                Ok(true)
            }
            Servers::Ensemble(_) => Ok(false),
        }
    }

    async fn proxied_client(
        &self,
    ) -> Result<Option<(Arc<dyn LockBackend>, FaultProxy)>, HarnessError> {
        let port = match &*self.servers.lock().await {
            Servers::Single(server) => server.node().client_port(),
            Servers::Ensemble(_) => return Ok(None),
        };
        let proxy = FaultProxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await?;
        let url = self.client_url().replace(
            &format!("127.0.0.1:{port}"),
            &format!("127.0.0.1:{}", proxy.port()),
        );
        let backend = lock_zk::connect(&url)
            .await
            .map_err(|e| HarnessError::Setup {
                what: "connecting through the proxy".into(),
                output: e.to_string(),
            })?;
        Ok(Some((Arc::new(backend), proxy)))
    }
}
