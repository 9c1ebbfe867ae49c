//! A started deployment ([`lock_testkit::deploy`]) as a suite
//! [`Target`]: [`DeployedTarget`]. The deployments themselves (the
//! [`Deployment`] trait, the table of kinds, [`start`]) are re-exported
//! from the test kit.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::{LockBackend, LockError};
pub use lock_testkit::deploy::*;
use tokio::sync::Mutex;

pub use crate::harness::Opener;
use crate::harness::Target;
use crate::process::HarnessError;
use crate::proxy::FaultProxy;

#[async_trait]
impl crate::soak::MemberFaults for DeployedTarget {
    async fn partitionable_members(&self) -> usize {
        self.deployment.lock().await.partitionable_members()
    }

    async fn members(&self) -> usize {
        self.deployment.lock().await.members()
    }

    async fn partition_member(&self, index: usize) -> Result<bool, HarnessError> {
        self.deployment.lock().await.partition_member(index)
    }

    async fn heal_member(&self, index: usize) -> Result<(), HarnessError> {
        self.deployment.lock().await.heal_member(index)
    }

    async fn member_client(
        &self,
        index: usize,
    ) -> Result<Option<(Arc<dyn LockBackend>, FaultProxy)>, HarnessError> {
        let Some((port, url)) = self.deployment.lock().await.member_url(index) else {
            return Ok(None);
        };
        let proxy = FaultProxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await?;
        let url = url.replace("{port}", &proxy.port().to_string());
        let client = (self.open)(url).await.map_err(|e| HarnessError::Setup {
            what: format!("connecting to member {index} through a proxy"),
            output: e.to_string(),
        })?;
        Ok(Some((client, proxy)))
    }
}

/// A started server as a [`Target`]: clients open its URL; "unreachable"
/// pauses it; scenarios can also kill and restart it and reach it through a
/// fault proxy. The replicated and clustered kinds also fail over and lose
/// nodes on demand ([`Target::fail_over`], [`Target::stop_nodes`]).
pub struct DeployedTarget {
    name: String,
    deployment: Mutex<Box<dyn Deployment>>,
    /// The URL of the current primary: it changes after a failover.
    url: std::sync::Mutex<String>,
    cluster_size: Option<usize>,
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
    pub fn new(deployment: Box<dyn Deployment>, open: Opener) -> Self {
        let url = deployment.url();
        Self {
            name: deployment.kind().to_owned(),
            cluster_size: deployment.cluster_size(),
            deployment: Mutex::new(deployment),
            url: std::sync::Mutex::new(url),
            open,
        }
    }

    /// The URL clients use now (it changes after a failover).
    pub fn url(&self) -> String {
        self.url
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_url(&self, url: String) {
        *self
            .url
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = url;
    }
}

#[async_trait]
impl Target for DeployedTarget {
    fn name(&self) -> String {
        self.name.clone()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        (self.open)(DeployedTarget::url(self)).await
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
        Some(DeployedTarget::url(self))
    }

    async fn kill_and_restart_server(&self) -> Result<bool, HarnessError> {
        let mut d = self.deployment.lock().await;
        d.kill_and_restart().await?;
        self.set_url(d.url());
        Ok(true)
    }

    async fn proxied_client(
        &self,
    ) -> Result<Option<(Arc<dyn LockBackend>, FaultProxy)>, HarnessError> {
        let (upstream_port, url) = {
            let d = self.deployment.lock().await;
            if d.cluster_size().is_some() {
                // A proxy in front of one node of several cuts nothing off.
                return Ok(None);
            }
            (d.port(), d.url())
        };
        let proxy =
            FaultProxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, upstream_port))).await?;
        let proxied = url_via(&url, upstream_port, proxy.port());
        if proxied == url {
            // Clients do not connect to that port by the URL (they find
            // the server through others: Sentinel); a proxy there would
            // cut nothing.
            return Ok(None);
        }
        let url = proxied;
        let client = (self.open)(url).await.map_err(|e| HarnessError::Setup {
            what: "connecting through the proxy".into(),
            output: e.to_string(),
        })?;
        Ok(Some((client, proxy)))
    }

    async fn hold_replication(&self) -> Result<bool, HarnessError> {
        self.deployment.lock().await.hold_replication().await
    }

    async fn fail_over(&self) -> Result<bool, HarnessError> {
        let mut d = self.deployment.lock().await;
        let done = d.fail_over().await?;
        self.set_url(d.url());
        Ok(done)
    }

    fn cluster_size(&self) -> Option<usize> {
        self.cluster_size
    }

    async fn stop_nodes(&self, n: usize) -> Result<Option<usize>, HarnessError> {
        self.deployment.lock().await.stop_nodes(n).await
    }

    async fn restart_nodes(&self) -> Result<(), HarnessError> {
        self.deployment.lock().await.restart_nodes().await
    }

    async fn primary_member(&self) -> Option<usize> {
        self.deployment.lock().await.primary_member()
    }
}
