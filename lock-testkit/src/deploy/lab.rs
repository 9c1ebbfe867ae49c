//! Deployments on the hosts of a [`Lab`]: each server (each member of a
//! cluster, each Redlock node) in a network namespace of its own, and
//! hosts for the clients, so that a partition is cut in the kernel
//! ([`Lab::isolate`], [`Lab::cut_from`]) rather than in a proxy. The same
//! [`Deployment`] types as on loopback, so pausing, killing and failing
//! over work as there.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::nats::NatsCluster;
use super::quorum::Fleet;
use super::sentinel::{SENTINEL_MASTER, SentinelRedis};
use super::single::Single;
use super::{Deployment, QUORUM_NODES, REDLOCK_NODES};
use crate::netns::Lab;
use crate::process::HarnessError;
use crate::servers::{
    etcd::EtcdServer, mariadb::MariaDbServer, nats::BUCKET, nats::NatsServer,
    postgres::PostgresServer, redis::RedisServer, redis::SentinelGroup, zookeeper::ZkEnsemble,
    zookeeper::ZkServer,
};

/// The host, right after the servers', from which the test kit reaches the
/// servers (readiness, leader and health probes) and which no fault cuts.
pub const CONTROL_HOST: &str = "control";

/// The hosts of a deployment started by [`start_in_lab`].
#[derive(Clone, Debug)]
pub struct LabHosts {
    /// The lab. Keep it (and drop it last): dropping it deletes the
    /// namespaces.
    pub lab: Arc<Lab>,
    /// The servers' hosts: the one server, the members of a cluster (in
    /// member order), Redlock's nodes, or a Sentinel deployment's master,
    /// replica and sentinels.
    pub servers: Vec<String>,
    /// For a cluster whose members replicate to one another (etcd,
    /// ZooKeeper, NATS JetStream): per member, in member order, a URL that
    /// reaches that member alone (a NATS client may move to another node
    /// if its connection drops). Empty for the other kinds.
    pub member_urls: Vec<String>,
    /// Hosts for clients, `client0`, `client1`, ...: nothing else runs
    /// there.
    pub clients: Vec<String>,
}

/// What a kind's lab start returns: the deployment and its member URLs.
type LabStarted = Result<(Box<dyn Deployment>, Vec<String>), HarnessError>;

/// Starts a kind's servers on the given hosts of a lab.
type LabStartFn = fn(Arc<Lab>, Vec<String>) -> Pin<Box<dyn Future<Output = LabStarted> + Send>>;

/// A kind of [`KINDS`](super::KINDS) that can be started in a lab.
struct LabKind {
    name: &'static str,
    /// How many server hosts it takes.
    servers: usize,
    start: LabStartFn,
}

macro_rules! lab_kind {
    ($name:literal, $servers:expr, $start:expr) => {
        LabKind {
            name: $name,
            servers: $servers,
            start: |lab, hosts| Box::pin($start(lab, hosts)),
        }
    };
}

/// Hosts of a `redis-sentinel` deployment: the master, its replica, three
/// sentinels.
const SENTINEL_HOSTS: usize = 5;

/// The kinds [`start_in_lab`] knows, with the options their loopback
/// deployments use (short sessions, the mode).
static LAB_TABLE: &[LabKind] = &[
    lab_kind!("redis", 1, redis),
    lab_kind!("etcd", 1, etcd),
    lab_kind!("zookeeper", 1, zookeeper),
    lab_kind!("postgres", 1, postgres),
    lab_kind!("mariadb", 1, mariadb),
    lab_kind!("postgres-session", 1, postgres_session),
    lab_kind!("mariadb-session", 1, mariadb_session),
    lab_kind!("nats", 1, nats),
    lab_kind!("redis-sentinel", SENTINEL_HOSTS, redis_sentinel),
    lab_kind!("redlock", REDLOCK_NODES, redlock),
    lab_kind!("etcd-cluster", QUORUM_NODES, etcd_cluster),
    lab_kind!("zookeeper-ensemble", QUORUM_NODES, zookeeper_ensemble),
    lab_kind!("nats-cluster", QUORUM_NODES, nats_cluster),
];

/// The names of the kinds [`start_in_lab`] can start.
pub fn lab_kind_names() -> Vec<&'static str> {
    LAB_TABLE.iter().map(|k| k.name).collect()
}

/// Starts a deployment of kind `name` in a new lab: its servers each on a
/// host of their own (`server0`, `server1`, ...), then [`CONTROL_HOST`],
/// then `clients` client hosts.
///
/// # Errors
///
/// A kind not in [`lab_kind_names`]; as [`Lab::new`] (not root, no iproute2);
/// a missing binary or a server that does not start.
pub async fn start_in_lab(
    name: &str,
    clients: usize,
) -> Result<(Box<dyn Deployment>, LabHosts), HarnessError> {
    let kind = LAB_TABLE
        .iter()
        .find(|k| k.name == name)
        .ok_or_else(|| HarnessError::Setup {
            what: format!("starting {name} in a lab"),
            output: format!(
                "not a lab kind; expected one of {}",
                lab_kind_names().join(", ")
            ),
        })?;
    let servers: Vec<String> = (0..kind.servers).map(|i| format!("server{i}")).collect();
    let client_hosts: Vec<String> = (0..clients).map(|i| format!("client{i}")).collect();
    let mut names: Vec<&str> = servers.iter().map(String::as_str).collect();
    names.push(CONTROL_HOST);
    names.extend(client_hosts.iter().map(String::as_str));
    let lab = Arc::new(Lab::new(&names)?);
    let (deployment, member_urls) = (kind.start)(lab.clone(), servers.clone()).await?;
    Ok((
        deployment,
        LabHosts {
            lab,
            servers,
            member_urls,
            clients: client_hosts,
        },
    ))
}

fn single<S: super::single::SingleServer + 'static>(
    kind: &'static str,
    server: S,
    options: &'static str,
) -> LabStarted {
    Ok((Box::new(Single::new(kind, server, options)), Vec::new()))
}

async fn redis(lab: Arc<Lab>, hosts: Vec<String>) -> LabStarted {
    single("redis", RedisServer::start_in(&lab, &hosts[0]).await?, "")
}

async fn etcd(lab: Arc<Lab>, hosts: Vec<String>) -> LabStarted {
    let server = EtcdServer::start_in(&lab, &[hosts[0].as_str()]).await?;
    single("etcd", server, "?ttl=2s")
}

async fn zookeeper(lab: Arc<Lab>, hosts: Vec<String>) -> LabStarted {
    let server = ZkServer::start_in(&lab, &hosts[0]).await?;
    single("zookeeper", server, "?session_timeout=2s")
}

async fn postgres(lab: Arc<Lab>, hosts: Vec<String>) -> LabStarted {
    single(
        "postgres",
        PostgresServer::start_in(&lab, &hosts[0]).await?,
        "",
    )
}

async fn mariadb(lab: Arc<Lab>, hosts: Vec<String>) -> LabStarted {
    single(
        "mariadb",
        MariaDbServer::start_in(&lab, &hosts[0]).await?,
        "",
    )
}

async fn postgres_session(lab: Arc<Lab>, hosts: Vec<String>) -> LabStarted {
    let server = PostgresServer::start_in(&lab, &hosts[0]).await?;
    single("postgres-session", server, "?mode=session")
}

async fn mariadb_session(lab: Arc<Lab>, hosts: Vec<String>) -> LabStarted {
    let server = MariaDbServer::start_in(&lab, &hosts[0]).await?;
    single("mariadb-session", server, "?mode=session")
}

async fn redis_sentinel(lab: Arc<Lab>, hosts: Vec<String>) -> LabStarted {
    let sentinels: Vec<&str> = hosts[2..].iter().map(String::as_str).collect();
    let group =
        SentinelGroup::start_in(&lab, &hosts[0], &hosts[1], &sentinels, SENTINEL_MASTER).await?;
    Ok((Box::new(SentinelRedis::new(group)), Vec::new()))
}

async fn redlock(lab: Arc<Lab>, hosts: Vec<String>) -> LabStarted {
    let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let nodes = RedisServer::start_many_in(&lab, &hosts).await?;
    Ok((Box::new(Fleet::new(nodes)), Vec::new()))
}

async fn etcd_cluster(lab: Arc<Lab>, hosts: Vec<String>) -> LabStarted {
    let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let servers = EtcdServer::start_in(&lab, &hosts).await?;
    let member_urls = servers
        .endpoints()
        .iter()
        .map(|endpoint| format!("etcd://{endpoint}/distlock?ttl=2s"))
        .collect();
    Ok((Box::new(Fleet::new(servers)), member_urls))
}

async fn zookeeper_ensemble(lab: Arc<Lab>, hosts: Vec<String>) -> LabStarted {
    let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let servers = ZkEnsemble::start_in(&lab, &hosts).await?;
    let member_urls = servers
        .nodes()
        .iter()
        .map(|node| format!("zk://{}?session_timeout=2s", node.address()))
        .collect();
    Ok((Box::new(Fleet::new(servers)), member_urls))
}

async fn nats(lab: Arc<Lab>, hosts: Vec<String>) -> LabStarted {
    single(
        "nats",
        NatsServer::start_in(&lab, &[hosts[0].as_str()]).await?,
        "",
    )
}

/// A NATS client given one node's address talks to that node only while
/// its connection lasts: the server's INFO names the other nodes, which
/// the client may reconnect to after a drop.
async fn nats_cluster(lab: Arc<Lab>, hosts: Vec<String>) -> LabStarted {
    let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let servers = NatsServer::start_in(&lab, &hosts).await?;
    let member_urls = servers
        .nodes()
        .iter()
        .map(|node| {
            format!(
                "nats://{}/{BUCKET}?replicas={}",
                node.address(),
                hosts.len()
            )
        })
        .collect();
    Ok((Box::new(NatsCluster::new(servers)), member_urls))
}
