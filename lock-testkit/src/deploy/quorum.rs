//! Deployments over several servers: Redlock's independent nodes, a
//! three-member etcd cluster and a three-node ZooKeeper ensemble.

use std::time::Duration;

use async_trait::async_trait;

use super::single::etcd_port;
use super::{Deployment, QUORUM_NODES, REDLOCK_NODES, Started};
use crate::process::HarnessError;
use crate::servers::etcd::EtcdServer;
use crate::servers::redis::RedisServer;
use crate::servers::zookeeper::{SYNC_LIMIT_TICKS, ZkEnsemble};

/// Nodes of a multi-node deployment and which of them are down.
#[derive(Debug)]
pub struct Fleet<T> {
    servers: T,
    down: Vec<usize>,
}

impl<T> Fleet<T> {
    pub(super) fn new(servers: T) -> Self {
        Self {
            servers,
            down: Vec::new(),
        }
    }

    /// The servers.
    pub fn servers(&self) -> &T {
        &self.servers
    }

    /// Indexes of the nodes killed by a fault and not restarted yet.
    pub fn down(&self) -> &[usize] {
        &self.down
    }
}

/// Which `n` of `total` nodes to kill: the leader first (when known),
/// then the others in order, skipping those already down.
fn pick_nodes(
    total: usize,
    down: &[usize],
    leader: Option<usize>,
    n: usize,
) -> Result<Vec<usize>, HarnessError> {
    let mut order: Vec<usize> = leader.into_iter().collect();
    order.extend((0..total).filter(|i| Some(*i) != leader));
    order.retain(|i| !down.contains(i));
    if n > order.len() {
        return Err(HarnessError::Setup {
            what: format!("stopping {n} nodes"),
            output: format!("only {} of {total} are running", order.len()),
        });
    }
    order.truncate(n);
    Ok(order)
}

/// Independent redis-servers for Redlock (`redlock`).
pub type RedlockFleet = Fleet<Vec<RedisServer>>;

#[async_trait]
impl Deployment for RedlockFleet {
    fn kind(&self) -> &'static str {
        "redlock"
    }

    fn url(&self) -> String {
        // Each node's own address: 127.0.0.1, or its lab host's.
        RedisServer::redlock_url(&self.servers)
    }

    fn port(&self) -> u16 {
        self.servers.first().map_or(0, RedisServer::port)
    }

    fn cluster_size(&self) -> Option<usize> {
        Some(self.servers.len())
    }

    fn pause(&mut self) -> Result<(), HarnessError> {
        for node in &mut self.servers {
            if node.process().pid().is_some() && !node.process().is_paused() {
                node.process().pause()?;
            }
        }
        Ok(())
    }

    fn resume(&mut self) -> Result<(), HarnessError> {
        for node in &mut self.servers {
            if node.process().is_paused() {
                node.process().resume()?;
            }
        }
        Ok(())
    }

    async fn kill_and_restart(&mut self) -> Result<(), HarnessError> {
        for node in &mut self.servers {
            node.process().kill()?;
        }
        for node in &mut self.servers {
            node.process().restart().await?;
        }
        self.down.clear();
        Ok(())
    }

    async fn stop_nodes(&mut self, n: usize) -> Result<Option<usize>, HarnessError> {
        let total = self.servers.len();
        for i in pick_nodes(total, &self.down, None, n)? {
            self.servers[i].process().kill()?;
            self.down.push(i);
        }
        Ok(Some(total))
    }

    async fn restart_nodes(&mut self) -> Result<(), HarnessError> {
        for i in std::mem::take(&mut self.down) {
            self.servers[i].process().restart().await?;
        }
        Ok(())
    }
}

pub(super) async fn redlock(_peer_proxies: bool) -> Started {
    let mut nodes = Vec::with_capacity(REDLOCK_NODES);
    for _ in 0..REDLOCK_NODES {
        nodes.push(RedisServer::start().await?);
    }
    Ok(Box::new(Fleet::new(nodes)))
}

/// A three-member etcd cluster (`etcd-cluster`).
pub type EtcdCluster = Fleet<EtcdServer>;

impl EtcdCluster {
    /// Starts the etcd members that are down (all processes first: a
    /// member only becomes healthy once a quorum runs), then waits until
    /// each is healthy.
    async fn restart_down(&mut self) -> Result<(), HarnessError> {
        let down = std::mem::take(&mut self.down);
        for &i in &down {
            self.servers.member(i).process().restart().await?;
        }
        for &i in &down {
            self.servers
                .wait_healthy(i, Duration::from_secs(30))
                .await?;
        }
        self.servers
            .wait_leader(Duration::from_secs(30))
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl Deployment for EtcdCluster {
    fn kind(&self) -> &'static str {
        "etcd-cluster"
    }

    fn url(&self) -> String {
        self.servers.url("distlock", "ttl=2s")
    }

    fn port(&self) -> u16 {
        etcd_port(&self.servers)
    }

    fn cluster_size(&self) -> Option<usize> {
        Some(self.servers.len())
    }

    fn pause(&mut self) -> Result<(), HarnessError> {
        self.servers.pause_all()
    }

    fn resume(&mut self) -> Result<(), HarnessError> {
        self.servers.resume_all()
    }

    async fn kill_and_restart(&mut self) -> Result<(), HarnessError> {
        let members = self.servers.len();
        for i in 0..members {
            self.servers.kill(i)?;
        }
        self.down = (0..members).collect();
        self.restart_down().await
    }

    async fn fail_over(&mut self) -> Result<bool, HarnessError> {
        let leader = self.servers.wait_leader(Duration::from_secs(10)).await?;
        self.servers.kill(leader)?;
        self.down.push(leader);
        self.servers.wait_leader(Duration::from_secs(30)).await?;
        Ok(true)
    }

    async fn stop_nodes(&mut self, n: usize) -> Result<Option<usize>, HarnessError> {
        let total = self.servers.len();
        let leader = self.servers.leader().await;
        for i in pick_nodes(total, &self.down, leader, n)? {
            self.servers.kill(i)?;
            self.down.push(i);
        }
        Ok(Some(total))
    }

    async fn restart_nodes(&mut self) -> Result<(), HarnessError> {
        self.restart_down().await
    }

    fn partitionable_members(&self) -> usize {
        if self.servers.has_peer_proxies() {
            self.servers.len()
        } else {
            0
        }
    }

    fn members(&self) -> usize {
        self.servers.len()
    }

    fn partition_member(&self, index: usize) -> Result<bool, HarnessError> {
        Ok(self.servers.partition_member(index))
    }

    fn heal_member(&self, index: usize) -> Result<(), HarnessError> {
        self.servers.heal_member(index);
        Ok(())
    }

    fn member_url(&self, index: usize) -> Option<(u16, String)> {
        let endpoint = self.servers.endpoints().get(index)?.clone();
        let port = endpoint.rsplit(':').next()?.parse().ok()?;
        Some((port, "etcd://127.0.0.1:{port}/distlock?ttl=2s".to_owned()))
    }
}

pub(super) async fn etcd_cluster(peer_proxies: bool) -> Started {
    let servers = if peer_proxies {
        EtcdServer::start_cluster_with_peer_proxies(QUORUM_NODES).await?
    } else {
        EtcdServer::start_cluster(QUORUM_NODES).await?
    };
    Ok(Box::new(Fleet::new(servers)))
}

/// A three-node ZooKeeper ensemble (`zookeeper-ensemble`).
pub type ZkQuorum = Fleet<ZkEnsemble>;

async fn zk_wait_leader(ensemble: &ZkEnsemble, timeout: Duration) -> Result<usize, HarnessError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(leader) = ensemble.leader().await {
            return Ok(leader);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(HarnessError::NotReady {
                name: "zookeeper ensemble (no leader)".into(),
                log_tail: String::new(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl ZkQuorum {
    /// Starts the ZooKeeper nodes that are down, then waits until every
    /// node serves.
    async fn restart_down(&mut self) -> Result<(), HarnessError> {
        for i in std::mem::take(&mut self.down) {
            if let Some(node) = self.servers.node_mut(i) {
                node.process().restart().await?;
            }
        }
        self.servers.wait_serving(Duration::from_secs(90)).await?;
        zk_wait_leader(&self.servers, Duration::from_secs(30))
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl Deployment for ZkQuorum {
    fn kind(&self) -> &'static str {
        "zookeeper-ensemble"
    }

    fn url(&self) -> String {
        format!("{}?session_timeout=2s", self.servers.url())
    }

    fn port(&self) -> u16 {
        self.servers.nodes().first().map_or(0, |n| n.client_port())
    }

    fn cluster_size(&self) -> Option<usize> {
        Some(self.servers.nodes().len())
    }

    fn pause(&mut self) -> Result<(), HarnessError> {
        for i in 0..self.servers.nodes().len() {
            if let Some(node) = self.servers.node_mut(i)
                && node.process().pid().is_some()
                && !node.process().is_paused()
            {
                node.process().pause()?;
            }
        }
        Ok(())
    }

    fn resume(&mut self) -> Result<(), HarnessError> {
        self.servers.resume_all()
    }

    async fn kill_and_restart(&mut self) -> Result<(), HarnessError> {
        let nodes = self.servers.nodes().len();
        for i in 0..nodes {
            if let Some(node) = self.servers.node_mut(i) {
                node.process().kill()?;
            }
        }
        self.down = (0..nodes).collect();
        self.restart_down().await
    }

    async fn fail_over(&mut self) -> Result<bool, HarnessError> {
        let leader = zk_wait_leader(&self.servers, Duration::from_secs(20)).await?;
        if let Some(node) = self.servers.node_mut(leader) {
            node.process().kill()?;
        }
        self.down.push(leader);
        zk_wait_leader(&self.servers, Duration::from_secs(30)).await?;
        Ok(true)
    }

    async fn stop_nodes(&mut self, n: usize) -> Result<Option<usize>, HarnessError> {
        let total = self.servers.nodes().len();
        let leader = self.servers.leader().await;
        for i in pick_nodes(total, &self.down, leader, n)? {
            if let Some(node) = self.servers.node_mut(i) {
                node.process().kill()?;
            }
            self.down.push(i);
        }
        Ok(Some(total))
    }

    async fn restart_nodes(&mut self) -> Result<(), HarnessError> {
        self.restart_down().await
    }

    fn partitionable_members(&self) -> usize {
        // Its peer proxies are checked when a member is partitioned.
        self.servers.nodes().len()
    }

    fn members(&self) -> usize {
        self.servers.nodes().len()
    }

    fn partition_member(&self, index: usize) -> Result<bool, HarnessError> {
        self.servers.partition_member(index).map(|()| true)
    }

    fn heal_member(&self, index: usize) -> Result<(), HarnessError> {
        self.servers.heal_member(index)
    }

    fn member_url(&self, index: usize) -> Option<(u16, String)> {
        let port = self.servers.nodes().get(index)?.client_port();
        Some((port, "zk://127.0.0.1:{port}?session_timeout=2s".to_owned()))
    }
}

pub(super) async fn zookeeper_ensemble(peer_proxies: bool) -> Started {
    let servers = if peer_proxies {
        ZkEnsemble::start_with_peer_proxies(QUORUM_NODES, SYNC_LIMIT_TICKS).await?
    } else {
        ZkEnsemble::start(QUORUM_NODES).await?
    };
    Ok(Box::new(Fleet::new(servers)))
}
