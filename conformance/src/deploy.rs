//! Servers started for a comparison run, behind one interface: a URL to
//! reach them, the address to put a fault proxy in front of, and process
//! faults (pause, kill, restart; for the replicated and clustered kinds
//! also failover and killing a minority or a majority of nodes).

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{LockBackend, LockError};
use tokio::sync::Mutex;

use crate::harness::Target;
use crate::process::HarnessError;
use crate::proxy::FaultProxy;
use crate::servers::{
    etcd::EtcdServer,
    mariadb::MariaDbServer,
    postgres::PostgresServer,
    redis::RedisServer,
    zookeeper::{ZkEnsemble, ZkServer},
};

/// The server kinds `distlock compare --spawn` can start, in report order:
/// the single servers, then the replicated and clustered deployments.
pub const KINDS: &[&str] = &[
    "redis",
    "etcd",
    "zookeeper",
    "postgres",
    "mariadb",
    "postgres-session",
    "mariadb-session",
    "redis-replica",
    "redlock",
    "etcd-cluster",
    "zookeeper-ensemble",
];

/// The multi-node kinds of [`KINDS`] (slower to start; they are the ones
/// the failover and node-loss scenarios apply to).
pub const CLUSTER_KINDS: &[&str] = &[
    "redis-replica",
    "redlock",
    "etcd-cluster",
    "zookeeper-ensemble",
];

/// Independent servers in a `redlock` deployment.
pub const REDLOCK_NODES: usize = 5;

/// Members of an `etcd-cluster` and nodes of a `zookeeper-ensemble`.
pub const QUORUM_NODES: usize = 3;

/// A Redis master with one asynchronous replica, both without persistence.
/// Clients talk to the current master; a failover kills it and promotes
/// the replica.
#[derive(Debug)]
pub struct ReplicatedRedis {
    primary: RedisServer,
    replica: RedisServer,
    replica_paused: bool,
    replica_down: bool,
}

impl ReplicatedRedis {
    /// Starts a master and a replica of it, and waits until the replica is
    /// in sync.
    ///
    /// # Errors
    ///
    /// Missing binaries, servers that do not start, or a replica that does
    /// not sync within 20 s.
    pub async fn start() -> Result<Self, HarnessError> {
        // Full syncs start at once (the default waits 5 s for more
        // replicas); either server may become the primary.
        let fast_sync = ["--repl-diskless-sync-delay", "0"];
        let primary = RedisServer::start_with(&fast_sync).await?;
        let port = primary.port().to_string();
        let replica = RedisServer::start_with(&[
            "--replicaof",
            "127.0.0.1",
            &port,
            fast_sync[0],
            fast_sync[1],
        ])
        .await?;
        replica.wait_replica_synced(Duration::from_secs(20)).await?;
        Ok(Self {
            primary,
            replica,
            replica_paused: false,
            replica_down: false,
        })
    }

    /// The current master.
    pub fn primary(&self) -> &RedisServer {
        &self.primary
    }

    /// The current replica (down after a failover until
    /// [`restart`](Self::restart_replica)).
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// Stops replication: waits until the replica has everything written
    /// so far, then freezes it (SIGSTOP) and makes the master drop its link,
    /// so that later writes stay on the master only.
    ///
    /// # Errors
    ///
    /// When the replica is not in sync or a command fails.
    pub async fn hold_replication(&mut self) -> Result<(), HarnessError> {
        if self.replica_down {
            self.restart_replica().await?;
        }
        if self.replica_paused {
            return Ok(());
        }
        self.replica
            .wait_replica_synced(Duration::from_secs(10))
            .await?;
        // Everything written so far reaches the replica...
        self.primary.cli(&["WAIT", "1", "2000"])?;
        // ...and nothing after: frozen, and its link dropped (data already
        // in its socket buffer would otherwise still arrive on resume).
        self.replica.process().pause()?;
        self.replica_paused = true;
        self.primary.cli(&["CLIENT", "KILL", "TYPE", "replica"])?;
        Ok(())
    }

    /// Kills the master (SIGKILL) and promotes the replica, which becomes
    /// the primary; the old master stays down until
    /// [`restart_replica`](Self::restart_replica).
    ///
    /// # Errors
    ///
    /// When there is no live replica or the promotion fails.
    pub async fn fail_over(&mut self) -> Result<(), HarnessError> {
        if self.replica_down {
            return Err(HarnessError::Setup {
                what: "redis failover".into(),
                output: "the replica is down (restart it first)".into(),
            });
        }
        self.primary.process().kill()?;
        if self.replica_paused {
            self.replica.process().resume()?;
            self.replica_paused = false;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match self.replica.promote() {
                Ok(()) => break,
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        std::mem::swap(&mut self.primary, &mut self.replica);
        self.replica_down = true;
        Ok(())
    }

    /// Starts the killed old master again (empty: no persistence) as a
    /// replica of the current primary and waits until it is in sync. Does
    /// nothing when the replica is up.
    ///
    /// # Errors
    ///
    /// When it does not start or sync.
    pub async fn restart_replica(&mut self) -> Result<(), HarnessError> {
        if !self.replica_down {
            return Ok(());
        }
        self.replica.process().restart().await?;
        let port = self.primary.port().to_string();
        self.replica.cli(&["REPLICAOF", "127.0.0.1", &port])?;
        self.replica_down = false;
        self.replica
            .wait_replica_synced(Duration::from_secs(20))
            .await
    }
}

/// Nodes of a multi-node deployment and which of them are down.
#[derive(Debug)]
pub struct Fleet<T> {
    servers: T,
    down: Vec<usize>,
}

impl<T> Fleet<T> {
    fn new(servers: T) -> Self {
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
    /// PostgreSQL, locks in the session (`postgres-session`: advisory
    /// locks, `mode=session`).
    PostgresSession(PostgresServer),
    /// MariaDB, locks in the session (`mariadb-session`: `GET_LOCK`,
    /// `mode=session`).
    MariaDbSession(MariaDbServer),
    /// A Redis master and an asynchronous replica (`redis-replica`).
    RedisReplica(Box<ReplicatedRedis>),
    /// Independent redis-servers for Redlock (`redlock`).
    Redlock(Fleet<Vec<RedisServer>>),
    /// A three-member etcd cluster (`etcd-cluster`).
    EtcdCluster(Fleet<EtcdServer>),
    /// A three-node ZooKeeper ensemble (`zookeeper-ensemble`).
    ZkEnsemble(Fleet<ZkEnsemble>),
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
            "postgres-session" => Self::PostgresSession(PostgresServer::start().await?),
            "mariadb-session" => Self::MariaDbSession(MariaDbServer::start().await?),
            "redis-replica" => Self::RedisReplica(Box::new(ReplicatedRedis::start().await?)),
            "redlock" => {
                let mut nodes = Vec::with_capacity(REDLOCK_NODES);
                for _ in 0..REDLOCK_NODES {
                    nodes.push(RedisServer::start().await?);
                }
                Self::Redlock(Fleet::new(nodes))
            }
            "etcd-cluster" => {
                Self::EtcdCluster(Fleet::new(EtcdServer::start_cluster(QUORUM_NODES).await?))
            }
            "zookeeper-ensemble" => {
                Self::ZkEnsemble(Fleet::new(ZkEnsemble::start(QUORUM_NODES).await?))
            }
            other => {
                return Err(HarnessError::Setup {
                    what: format!("starting {other}"),
                    output: format!("unknown server kind; expected one of {}", KINDS.join(", ")),
                });
            }
        })
    }

    /// Starts a server of `kind` like [`start`](Self::start), with the
    /// clustered kinds' peer traffic through fault proxies (for member
    /// partitions: [`EtcdServer::start_cluster_with_peer_proxies`],
    /// [`ZkEnsemble::start_with_peer_proxies`]). The other kinds start as
    /// usual.
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start).
    pub async fn start_with_peer_proxies(kind: &str) -> Result<Self, HarnessError> {
        Ok(match kind {
            "etcd-cluster" => Self::EtcdCluster(Fleet::new(
                EtcdServer::start_cluster_with_peer_proxies(QUORUM_NODES).await?,
            )),
            "zookeeper-ensemble" => Self::ZkEnsemble(Fleet::new(
                ZkEnsemble::start_with_peer_proxies(
                    QUORUM_NODES,
                    crate::servers::zookeeper::SYNC_LIMIT_TICKS,
                )
                .await?,
            )),
            other => Self::start(other).await?,
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
            Self::PostgresSession(_) => "postgres-session",
            Self::MariaDbSession(_) => "mariadb-session",
            Self::RedisReplica(_) => "redis-replica",
            Self::Redlock(_) => "redlock",
            Self::EtcdCluster(_) => "etcd-cluster",
            Self::ZkEnsemble(_) => "zookeeper-ensemble",
        }
    }

    /// The number of nodes of a quorum deployment (Redlock, the etcd
    /// cluster, the ZooKeeper ensemble); `None` for the others.
    pub fn cluster_size(&self) -> Option<usize> {
        match self {
            Self::Redlock(f) => Some(f.servers.len()),
            Self::EtcdCluster(f) => Some(f.servers.len()),
            Self::ZkEnsemble(f) => Some(f.servers.nodes().len()),
            _ => None,
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
            Self::Postgres(s) | Self::PostgresSession(s) => s.port(),
            Self::MariaDb(s) | Self::MariaDbSession(s) => s.port(),
            Self::RedisReplica(s) => s.primary.port(),
            Self::Redlock(f) => f.servers.first().map_or(0, RedisServer::port),
            Self::EtcdCluster(f) => f
                .servers
                .endpoints()
                .first()
                .and_then(|e| e.rsplit(':').next()?.parse().ok())
                .unwrap_or(0),
            Self::ZkEnsemble(f) => f.servers.nodes().first().map_or(0, |n| n.client_port()),
        }
    }

    /// Whether the backend is spread over several nodes (a fault proxy in
    /// front of one of them does not cut a client off).
    fn multi_node(&self) -> bool {
        matches!(
            self,
            Self::Redlock(_) | Self::EtcdCluster(_) | Self::ZkEnsemble(_)
        )
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
            Self::PostgresSession(s) => format!("{}?mode=session", s.url()),
            Self::MariaDbSession(s) => format!("{}?mode=session", s.url()),
            Self::RedisReplica(s) => s.primary.url(),
            Self::Redlock(f) => format!(
                "redlock://{}",
                f.servers
                    .iter()
                    .map(|n| format!("127.0.0.1:{}", n.port()))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Self::EtcdCluster(f) => f.servers.url("distlock", "ttl=2s"),
            Self::ZkEnsemble(f) => format!("{}?session_timeout=2s", f.servers.url()),
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
            Self::Postgres(s) | Self::PostgresSession(s) => s.pause(),
            Self::MariaDb(s) | Self::MariaDbSession(s) => s.process().pause(),
            Self::RedisReplica(s) => s.primary.process().pause(),
            Self::Redlock(f) => {
                for node in &mut f.servers {
                    if node.process().pid().is_some() && !node.process().is_paused() {
                        node.process().pause()?;
                    }
                }
                Ok(())
            }
            Self::EtcdCluster(f) => f.servers.pause_all(),
            Self::ZkEnsemble(f) => {
                for i in 0..f.servers.nodes().len() {
                    if let Some(node) = f.servers.node_mut(i)
                        && node.process().pid().is_some()
                        && !node.process().is_paused()
                    {
                        node.process().pause()?;
                    }
                }
                Ok(())
            }
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
            Self::Postgres(s) | Self::PostgresSession(s) => s.resume(),
            Self::MariaDb(s) | Self::MariaDbSession(s) => s.process().resume(),
            Self::RedisReplica(s) => s.primary.process().resume(),
            Self::Redlock(f) => {
                for node in &mut f.servers {
                    if node.process().is_paused() {
                        node.process().resume()?;
                    }
                }
                Ok(())
            }
            Self::EtcdCluster(f) => f.servers.resume_all(),
            Self::ZkEnsemble(f) => f.servers.resume_all(),
        }
    }

    /// Kills the server with SIGKILL and starts it again on the same port
    /// and data directory (Redis here runs without persistence, so it comes
    /// back empty: that is the point of its negative control). For the
    /// multi-node kinds every node is killed, then all are started again
    /// (a replica resyncs from its empty master).
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
            Self::Postgres(s) | Self::PostgresSession(s) => {
                s.kill()?;
                s.restart().await
            }
            Self::MariaDb(s) | Self::MariaDbSession(s) => {
                s.process().kill()?;
                s.restart().await
            }
            Self::RedisReplica(s) => {
                s.primary.process().restart().await?;
                // It may have been started as a replica (before a failover).
                s.primary.cli(&["REPLICAOF", "NO", "ONE"])?;
                if !s.replica_down {
                    s.replica
                        .wait_replica_synced(Duration::from_secs(20))
                        .await?;
                }
                Ok(())
            }
            Self::Redlock(f) => {
                for node in &mut f.servers {
                    node.process().kill()?;
                }
                for node in &mut f.servers {
                    node.process().restart().await?;
                }
                f.down.clear();
                Ok(())
            }
            Self::EtcdCluster(f) => {
                let members = f.servers.len();
                for i in 0..members {
                    f.servers.kill(i)?;
                }
                f.down = (0..members).collect();
                restart_etcd(f).await
            }
            Self::ZkEnsemble(f) => {
                let nodes = f.servers.nodes().len();
                for i in 0..nodes {
                    if let Some(node) = f.servers.node_mut(i) {
                        node.process().kill()?;
                    }
                }
                f.down = (0..nodes).collect();
                restart_zk(f).await
            }
        }
    }

    /// See [`Target::hold_replication`]: `Ok(false)` for every kind but
    /// `redis-replica`.
    ///
    /// # Errors
    ///
    /// When the replica is not in sync or cannot be paused.
    pub async fn hold_replication(&mut self) -> Result<bool, HarnessError> {
        match self {
            Self::RedisReplica(s) => s.hold_replication().await.map(|()| true),
            _ => Ok(false),
        }
    }

    /// See [`Target::fail_over`]: promotes the Redis replica, or kills the
    /// etcd / ZooKeeper leader and waits for a new one; `Ok(false)` for the
    /// other kinds.
    ///
    /// # Errors
    ///
    /// When the failover fails or no new leader is elected within 30 s.
    pub async fn fail_over(&mut self) -> Result<bool, HarnessError> {
        match self {
            Self::RedisReplica(s) => s.fail_over().await.map(|()| true),
            Self::EtcdCluster(f) => {
                let leader = f.servers.wait_leader(Duration::from_secs(10)).await?;
                f.servers.kill(leader)?;
                f.down.push(leader);
                f.servers.wait_leader(Duration::from_secs(30)).await?;
                Ok(true)
            }
            Self::ZkEnsemble(f) => {
                let leader = zk_wait_leader(&f.servers, Duration::from_secs(20)).await?;
                if let Some(node) = f.servers.node_mut(leader) {
                    node.process().kill()?;
                }
                f.down.push(leader);
                zk_wait_leader(&f.servers, Duration::from_secs(30)).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// See [`Target::stop_nodes`]: kills `n` nodes of a quorum deployment
    /// (the leader first) and returns `Some(total)`; `Ok(None)` for the
    /// other kinds.
    ///
    /// # Errors
    ///
    /// When fewer than `n` nodes run, or a node cannot be killed.
    pub async fn stop_nodes(&mut self, n: usize) -> Result<Option<usize>, HarnessError> {
        match self {
            Self::Redlock(f) => {
                let total = f.servers.len();
                for i in pick_nodes(total, &f.down, None, n)? {
                    f.servers[i].process().kill()?;
                    f.down.push(i);
                }
                Ok(Some(total))
            }
            Self::EtcdCluster(f) => {
                let total = f.servers.len();
                let leader = f.servers.leader().await;
                for i in pick_nodes(total, &f.down, leader, n)? {
                    f.servers.kill(i)?;
                    f.down.push(i);
                }
                Ok(Some(total))
            }
            Self::ZkEnsemble(f) => {
                let total = f.servers.nodes().len();
                let leader = f.servers.leader().await;
                for i in pick_nodes(total, &f.down, leader, n)? {
                    if let Some(node) = f.servers.node_mut(i) {
                        node.process().kill()?;
                    }
                    f.down.push(i);
                }
                Ok(Some(total))
            }
            _ => Ok(None),
        }
    }

    /// See [`Target::restart_nodes`]: starts every node a fault killed and
    /// waits until the deployment serves.
    ///
    /// # Errors
    ///
    /// When a node does not come back.
    pub async fn restart_nodes(&mut self) -> Result<(), HarnessError> {
        match self {
            Self::RedisReplica(s) => s.restart_replica().await,
            Self::Redlock(f) => {
                for i in std::mem::take(&mut f.down) {
                    f.servers[i].process().restart().await?;
                }
                Ok(())
            }
            Self::EtcdCluster(f) => restart_etcd(f).await,
            Self::ZkEnsemble(f) => restart_zk(f).await,
            _ => Ok(()),
        }
    }
}

#[async_trait]
impl crate::soak::MemberFaults for DeployedTarget {
    async fn partitionable_members(&self) -> usize {
        match &*self.deployment.lock().await {
            Deployment::EtcdCluster(f) if f.servers.has_peer_proxies() => f.servers.len(),
            // Its peer proxies are checked when a member is partitioned.
            Deployment::ZkEnsemble(f) => f.servers.nodes().len(),
            _ => 0,
        }
    }

    async fn members(&self) -> usize {
        match &*self.deployment.lock().await {
            Deployment::EtcdCluster(f) => f.servers.len(),
            Deployment::ZkEnsemble(f) => f.servers.nodes().len(),
            _ => 0,
        }
    }

    async fn partition_member(&self, index: usize) -> Result<bool, HarnessError> {
        match &*self.deployment.lock().await {
            Deployment::EtcdCluster(f) => Ok(f.servers.partition_member(index)),
            Deployment::ZkEnsemble(f) => f.servers.partition_member(index).map(|()| true),
            _ => Ok(false),
        }
    }

    async fn heal_member(&self, index: usize) -> Result<(), HarnessError> {
        match &*self.deployment.lock().await {
            Deployment::EtcdCluster(f) => {
                f.servers.heal_member(index);
                Ok(())
            }
            Deployment::ZkEnsemble(f) => f.servers.heal_member(index),
            _ => Ok(()),
        }
    }

    async fn member_client(
        &self,
        index: usize,
    ) -> Result<Option<(Arc<dyn LockBackend>, FaultProxy)>, HarnessError> {
        let (port, url) = {
            let mut d = self.deployment.lock().await;
            match &mut *d {
                Deployment::EtcdCluster(f) if index < f.servers.len() => {
                    let port = f.servers.member(index).client_port();
                    (port, "etcd://127.0.0.1:{port}/distlock?ttl=2s")
                }
                Deployment::ZkEnsemble(f) if index < f.servers.nodes().len() => {
                    let port = f.servers.nodes()[index].client_port();
                    (port, "zk://127.0.0.1:{port}?session_timeout=2s")
                }
                _ => return Ok(None),
            }
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

/// Starts the etcd members that are down (all processes first: a member
/// only becomes healthy once a quorum runs), then waits until each is
/// healthy.
async fn restart_etcd(f: &mut Fleet<EtcdServer>) -> Result<(), HarnessError> {
    let down = std::mem::take(&mut f.down);
    for &i in &down {
        f.servers.member(i).process().restart().await?;
    }
    for &i in &down {
        f.servers.wait_healthy(i, Duration::from_secs(30)).await?;
    }
    f.servers
        .wait_leader(Duration::from_secs(30))
        .await
        .map(|_| ())
}

/// Starts the ZooKeeper nodes that are down, then waits until every node
/// serves.
async fn restart_zk(f: &mut Fleet<ZkEnsemble>) -> Result<(), HarnessError> {
    for i in std::mem::take(&mut f.down) {
        if let Some(node) = f.servers.node_mut(i) {
            node.process().restart().await?;
        }
    }
    f.servers.wait_serving(Duration::from_secs(90)).await?;
    zk_wait_leader(&f.servers, Duration::from_secs(30))
        .await
        .map(|_| ())
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
/// fault proxy. The replicated and clustered kinds also fail over and lose
/// nodes on demand ([`Target::fail_over`], [`Target::stop_nodes`]).
pub struct DeployedTarget {
    name: String,
    deployment: Mutex<Deployment>,
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
    pub fn new(deployment: Deployment, open: Opener) -> Self {
        let url = deployment.url(None);
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
        self.set_url(d.url(None));
        Ok(true)
    }

    async fn proxied_client(
        &self,
    ) -> Result<Option<(Arc<dyn LockBackend>, FaultProxy)>, HarnessError> {
        let (upstream_port, url) = {
            let d = self.deployment.lock().await;
            if d.multi_node() {
                // A proxy in front of one node of several cuts nothing off.
                return Ok(None);
            }
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

    async fn hold_replication(&self) -> Result<bool, HarnessError> {
        self.deployment.lock().await.hold_replication().await
    }

    async fn fail_over(&self) -> Result<bool, HarnessError> {
        let mut d = self.deployment.lock().await;
        let done = d.fail_over().await?;
        self.set_url(d.url(None));
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
}
