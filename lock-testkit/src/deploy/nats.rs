//! NATS JetStream deployments: `nats` (one server) and `nats-cluster`
//! (three servers, the bucket's stream with replicas 3).

use std::time::Duration;

use async_trait::async_trait;

use super::{Deployment, QUORUM_NODES, Single, SingleServer, Started};
use crate::process::{HarnessError, ServerProcess};
use crate::servers::nats::{BUCKET, NatsServer};

/// How long a leader change may take.
const ELECTION: Duration = Duration::from_secs(20);

#[async_trait]
impl SingleServer for NatsServer {
    fn base_url(&self) -> String {
        self.url(BUCKET)
    }
    fn client_port(&self) -> u16 {
        self.port()
    }
    fn process(&mut self) -> &mut ServerProcess {
        self.nodes_mut()[0].process()
    }
    async fn kill_and_restart(&mut self) -> Result<(), HarnessError> {
        self.kill_and_restart_all().await
    }
}

pub(super) async fn single(_peer_proxies: bool) -> Started {
    Ok(Box::new(Single::new(
        "nats",
        NatsServer::start().await?,
        "",
    )))
}

pub(super) async fn cluster(_peer_proxies: bool) -> Started {
    Ok(Box::new(NatsCluster::new(
        NatsServer::start_cluster(QUORUM_NODES).await?,
    )))
}

/// Three nats-servers in one JetStream cluster; the bucket's stream has a
/// replica on each. A failover kills the stream's leader.
#[derive(Debug)]
pub struct NatsCluster {
    servers: NatsServer,
}

impl NatsCluster {
    /// The deployment over started `servers` (on loopback or in a lab).
    pub(super) fn new(servers: NatsServer) -> Self {
        Self { servers }
    }

    /// The servers.
    pub fn servers(&self) -> &NatsServer {
        &self.servers
    }
}

#[async_trait]
impl Deployment for NatsCluster {
    fn kind(&self) -> &'static str {
        "nats-cluster"
    }

    fn url(&self) -> String {
        self.servers.url(BUCKET)
    }

    fn port(&self) -> u16 {
        self.servers.port()
    }

    fn cluster_size(&self) -> Option<usize> {
        Some(self.servers.nodes().len())
    }

    fn pause(&mut self) -> Result<(), HarnessError> {
        for node in self
            .servers
            .nodes_mut()
            .iter_mut()
            .filter(|n| n.is_running())
        {
            node.process().pause()?;
        }
        Ok(())
    }

    fn resume(&mut self) -> Result<(), HarnessError> {
        for node in self
            .servers
            .nodes_mut()
            .iter_mut()
            .filter(|n| n.is_running())
        {
            node.process().resume()?;
        }
        Ok(())
    }

    async fn kill_and_restart(&mut self) -> Result<(), HarnessError> {
        self.servers.kill_and_restart_all().await
    }

    /// Kills the bucket stream's leader and waits for a new one; the old
    /// leader stays down until [`restart_nodes`](Deployment::restart_nodes).
    async fn fail_over(&mut self) -> Result<bool, HarnessError> {
        let stream = format!("KV_{BUCKET}");
        self.servers.kill_stream_leader(&stream, ELECTION).await?;
        Ok(true)
    }

    async fn stop_nodes(&mut self, n: usize) -> Result<Option<usize>, HarnessError> {
        let stream = format!("KV_{BUCKET}");
        let total = self.servers.nodes().len();
        let leader = self.servers.stream_leader(&stream).await;
        let mut order: Vec<usize> = leader.into_iter().collect();
        order.extend((0..total).filter(|i| Some(*i) != leader));
        order.retain(|&i| self.servers.nodes()[i].is_running());
        if n > order.len() {
            return Err(HarnessError::Setup {
                what: format!("stopping {n} nodes"),
                output: format!("only {} of {total} are running", order.len()),
            });
        }
        for &i in &order[..n] {
            self.servers.kill_node(i)?;
        }
        Ok(Some(total))
    }

    async fn restart_nodes(&mut self) -> Result<(), HarnessError> {
        self.servers.restart_stopped().await
    }

    fn members(&self) -> usize {
        self.servers.nodes().len()
    }

    fn member_url(&self, index: usize) -> Option<(u16, String)> {
        let node = self.servers.nodes().get(index)?;
        // The node's own address: 127.0.0.1, or its lab host's.
        Some((
            node.client_port(),
            format!(
                "nats://{}:{{port}}/{BUCKET}?replicas={}",
                node.addr(),
                self.servers.nodes().len()
            ),
        ))
    }
}
