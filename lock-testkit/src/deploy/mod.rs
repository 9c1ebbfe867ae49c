//! Deployments: started servers behind one trait, [`Deployment`] (a URL
//! to reach them, the port to put a fault proxy in front of, and process
//! faults: pause, kill and restart; for the replicated and clustered kinds
//! also failover, losing nodes and partitioning members).
//!
//! Each kind is one entry of [`KINDS`] with a function that starts it;
//! [`start`] picks it by name. Adding a kind is one type implementing
//! [`Deployment`] and one line in [`KINDS`]. [`start_in_lab`] starts the
//! same deployments with each server on a host of a
//! [`Lab`](crate::netns::Lab), for partitions cut in the kernel.

mod lab;
mod nats;
mod quorum;
mod replicated;
mod sentinel;
mod single;

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;

pub use lab::{CONTROL_HOST, LabHosts, lab_kind_names, start_in_lab};
pub use nats::NatsCluster;
pub use quorum::{EtcdCluster, Fleet, RedlockFleet, ZkQuorum};
pub use replicated::ReplicatedRedis;
pub use sentinel::{SENTINEL_MASTER, SentinelRedis};
pub use single::{Single, SingleServer};

use crate::process::HarnessError;

/// Independent servers in a `redlock` deployment.
pub const REDLOCK_NODES: usize = 5;

/// Members of an `etcd-cluster` and nodes of a `zookeeper-ensemble`.
pub const QUORUM_NODES: usize = 3;

/// A started server or group of servers of one kind.
///
/// The fault methods other than pause, resume and kill-and-restart have
/// defaults for kinds that cannot do them (`Ok(false)`, `Ok(None)`, `0`).
#[async_trait]
pub trait Deployment: fmt::Debug + Send + Sync {
    /// The kind's name (an entry of [`KINDS`]).
    fn kind(&self) -> &'static str;

    /// The backend URL clients use now (it changes after a failover).
    fn url(&self) -> String;

    /// The loopback port clients connect to (the one a fault proxy goes
    /// in front of).
    fn port(&self) -> u16;

    /// The number of nodes of a quorum deployment (Redlock, the etcd
    /// cluster, the ZooKeeper ensemble); `None` for the others. A fault
    /// proxy in front of one node of several cuts nobody off.
    fn cluster_size(&self) -> Option<usize> {
        None
    }

    /// Freezes the server(s) (SIGSTOP).
    ///
    /// # Errors
    ///
    /// When a signal cannot be sent.
    fn pause(&mut self) -> Result<(), HarnessError>;

    /// Resumes paused servers (SIGCONT).
    ///
    /// # Errors
    ///
    /// When a signal cannot be sent.
    fn resume(&mut self) -> Result<(), HarnessError>;

    /// Kills the server(s) with SIGKILL and starts them again on the same
    /// ports and data (Redis here runs without persistence, so it comes
    /// back empty: that is the point of its negative control).
    ///
    /// # Errors
    ///
    /// When it cannot be restarted.
    async fn kill_and_restart(&mut self) -> Result<(), HarnessError>;

    /// Stops replication from now until the next failover (writes are
    /// still acknowledged but a failover loses them); `Ok(false)` for
    /// kinds without an asynchronous replica.
    ///
    /// # Errors
    ///
    /// When the replica is not in sync or cannot be paused.
    async fn hold_replication(&mut self) -> Result<bool, HarnessError> {
        Ok(false)
    }

    /// Fails over (promotes the replica, or kills the leader and waits for
    /// a new one); `Ok(false)` for kinds that cannot.
    ///
    /// # Errors
    ///
    /// When the failover fails or no new leader is elected in time.
    async fn fail_over(&mut self) -> Result<bool, HarnessError> {
        Ok(false)
    }

    /// Kills `n` nodes of a quorum deployment (the leader first) and
    /// returns `Some(total)`; `Ok(None)` for the other kinds.
    ///
    /// # Errors
    ///
    /// When fewer than `n` nodes run, or a node cannot be killed.
    async fn stop_nodes(&mut self, _n: usize) -> Result<Option<usize>, HarnessError> {
        Ok(None)
    }

    /// Starts every node a fault killed and waits until the deployment
    /// serves; for a deployment that recovers from a partition on its own
    /// ([`primary_member`](Self::primary_member)), also until it has (a
    /// lab soak's member partition lasts until then).
    ///
    /// # Errors
    ///
    /// When a node does not come back.
    async fn restart_nodes(&mut self) -> Result<(), HarnessError> {
        Ok(())
    }

    /// For a deployment of one primary and peers that watch it without a
    /// consensus of their own on the data (Redis Sentinel: the master, its
    /// replica and the sentinels, in that order on a lab's server hosts),
    /// the index in that order of the current primary: the member a lab
    /// soak's member partition cuts from the others. `None` for the other
    /// kinds (there any member may be cut).
    fn primary_member(&self) -> Option<usize> {
        None
    }

    /// Members whose peer traffic can be cut ([`partition_member`](Self::partition_member)).
    fn partitionable_members(&self) -> usize {
        0
    }

    /// Members a client can be pinned to ([`member_url`](Self::member_url)).
    fn members(&self) -> usize {
        0
    }

    /// Cuts member `index` off from its peers; `Ok(false)` when this kind
    /// cannot.
    ///
    /// # Errors
    ///
    /// When the member's proxies cannot be set.
    fn partition_member(&self, _index: usize) -> Result<bool, HarnessError> {
        Ok(false)
    }

    /// Undoes [`partition_member`](Self::partition_member).
    ///
    /// # Errors
    ///
    /// When the member's proxies cannot be set.
    fn heal_member(&self, _index: usize) -> Result<(), HarnessError> {
        Ok(())
    }

    /// The client port of member `index` and a URL template reaching only
    /// it (`{port}` stands for the port, so a proxy can go in between).
    fn member_url(&self, _index: usize) -> Option<(u16, String)> {
        None
    }
}

/// `url` with the loopback port `from` replaced by `to` (a fault proxy's).
pub fn url_via(url: &str, from: u16, to: u16) -> String {
    url.replace(&format!("127.0.0.1:{from}"), &format!("127.0.0.1:{to}"))
}

/// A started deployment.
pub type Started = Result<Box<dyn Deployment>, HarnessError>;

/// Starts a deployment (a boxed future, so kinds fit in one table).
pub type StartFn = fn(peer_proxies: bool) -> Pin<Box<dyn Future<Output = Started> + Send>>;

/// One kind of deployment that `distlock-compare compare --spawn` and the tests
/// can start.
#[derive(Clone, Copy)]
pub struct Kind {
    /// Its name (`redis`, `etcd-cluster`, ...).
    pub name: &'static str,
    /// Whether it spreads over several servers (slower to start; the
    /// failover and node-loss scenarios apply to these).
    pub cluster: bool,
    /// Whether `distlock-compare compare --spawn` starts it only with `--full` (or
    /// when named): the three-server quorums, and the other libraries'
    /// layouts on a single server (the same server again, in another
    /// layout).
    pub full_only: bool,
    /// Starts it; with `peer_proxies` the clustered kinds route their peer
    /// traffic through fault proxies (for member partitions).
    pub start: StartFn,
}

impl fmt::Debug for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kind")
            .field("name", &self.name)
            .field("cluster", &self.cluster)
            .field("full_only", &self.full_only)
            .finish_non_exhaustive()
    }
}

macro_rules! kind {
    ($name:literal, $cluster:literal, $full_only:literal, $start:expr) => {
        Kind {
            name: $name,
            cluster: $cluster,
            full_only: $full_only,
            start: |peer_proxies| Box::pin($start(peer_proxies)),
        }
    };
}

/// Every kind, in report order: the single servers, the replicated and
/// clustered deployments, then single servers in another library's layout
/// (`-plain`, `-redisson`: Redis `layout=`; `-kazoo`: ZooKeeper
/// `nodes=kazoo`; `-shedlock`: the SQL ShedLock table).
pub static KINDS: &[Kind] = &[
    kind!("redis", false, false, single::redis),
    kind!("etcd", false, false, single::etcd),
    kind!("zookeeper", false, false, single::zookeeper),
    kind!("postgres", false, false, single::postgres),
    kind!("mariadb", false, false, single::mariadb),
    kind!("postgres-session", false, false, single::postgres_session),
    kind!("mariadb-session", false, false, single::mariadb_session),
    kind!("nats", false, false, nats::single),
    kind!("redis-replica", true, false, replicated::start),
    kind!("redis-sentinel", true, true, sentinel::start),
    kind!("redlock", true, false, quorum::redlock),
    kind!("etcd-cluster", true, true, quorum::etcd_cluster),
    kind!("zookeeper-ensemble", true, true, quorum::zookeeper_ensemble),
    kind!("nats-cluster", true, true, nats::cluster),
    kind!("redis-plain", false, true, single::redis_plain),
    kind!("redis-redisson", false, true, single::redis_redisson),
    kind!("zookeeper-kazoo", false, true, single::zookeeper_kazoo),
    kind!("postgres-shedlock", false, true, single::postgres_shedlock),
    kind!("mariadb-shedlock", false, true, single::mariadb_shedlock),
];

/// The names of [`KINDS`].
pub fn kind_names() -> Vec<&'static str> {
    KINDS.iter().map(|k| k.name).collect()
}

/// The kind called `name`.
pub fn kind(name: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.name == name)
}

/// Starts a deployment of kind `name`.
///
/// # Errors
///
/// An unknown kind, a missing binary (naming the package), or a server
/// that does not start.
pub async fn start(name: &str) -> Started {
    start_kind(name, false).await
}

/// Starts a deployment of kind `name` like [`start`], with the clustered
/// kinds' peer traffic through fault proxies (for member partitions). The
/// other kinds start as usual.
///
/// # Errors
///
/// As for [`start`].
pub async fn start_with_peer_proxies(name: &str) -> Started {
    start_kind(name, true).await
}

async fn start_kind(name: &str, peer_proxies: bool) -> Started {
    match kind(name) {
        Some(kind) => (kind.start)(peer_proxies).await,
        None => Err(HarnessError::Setup {
            what: format!("starting {name}"),
            output: format!(
                "unknown server kind; expected one of {}",
                kind_names().join(", ")
            ),
        }),
    }
}
