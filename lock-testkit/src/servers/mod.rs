//! Spawners for each real server the drivers are tested against. Each
//! starts its server on free loopback ports in a temporary directory and
//! stops it on drop; a missing binary is [`HarnessError::MissingBinary`]
//! naming the Debian package. Each also has a `start_in` that puts it on
//! hosts of a [`Lab`] (see
//! [`netns::Placement`](crate::netns::Placement)), for real partitions.
//!
//! [`HarnessError::MissingBinary`]: crate::process::HarnessError::MissingBinary

pub mod etcd;
pub mod mariadb;
pub mod nats;
pub mod pgbouncer;
pub mod postgres;
pub mod redis;
pub mod zookeeper;

use std::marker::PhantomData;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::netns::{Lab, Placement};
use crate::process::{HarnessError, ServerProcess};

/// How the servers started from now on treat durability.
///
/// The functional tests run [`Fast`](Self::Fast) (the default): what they
/// check does not depend on a write reaching the disk. Benchmarks run
/// [`ServerDefaults`](Self::ServerDefaults), as deployments do, so that a
/// write per grant costs what it costs ([`set_durability`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// PostgreSQL `fsync=off`, MariaDB `innodb_flush_log_at_trx_commit=2`,
    /// etcd's data on `/dev/shm`, Redis without snapshots; ZooKeeper as
    /// its defaults (`forceSync=yes`, data on disk).
    Fast,
    /// Every server with its own defaults, data on disk: PostgreSQL
    /// `fsync=on`, MariaDB flushing its log at each commit, etcd's WAL on
    /// disk, Redis's default snapshots (`appendonly no`: Redis's default is
    /// not durable), ZooKeeper unchanged.
    ServerDefaults,
}

impl Durability {
    /// The settings in a line (for reports).
    pub fn describe(self) -> &'static str {
        match self {
            Self::Fast => {
                "fast test settings: PostgreSQL fsync=off, MariaDB innodb_flush_log_at_trx_commit=2, \
                 etcd data on /dev/shm, Redis without snapshots, ZooKeeper defaults"
            }
            Self::ServerDefaults => {
                "server defaults, data on disk: PostgreSQL fsync=on, MariaDB \
                 innodb_flush_log_at_trx_commit=1, etcd WAL fsynced on disk, Redis default \
                 snapshots (appendonly no), ZooKeeper forceSync=yes"
            }
        }
    }

    /// What one server ran with under these settings, in a line (for
    /// reports): `server` is `redis`, `etcd`, `zookeeper`, `postgres`,
    /// `mariadb` or `nats`; `None` for any other name.
    pub fn settings_of(self, server: &str) -> Option<&'static str> {
        let fast = self == Self::Fast;
        Some(match server {
            "postgres" if fast => "PostgreSQL fsync=off, synchronous_commit=on, data on disk",
            "postgres" => "PostgreSQL defaults: fsync=on, synchronous_commit=on, data on disk",
            "mariadb" if fast => {
                "MariaDB innodb_flush_log_at_trx_commit=2 (log flushed about once a second), \
                 binary log off, data on disk"
            }
            "mariadb" => {
                "MariaDB defaults: innodb_flush_log_at_trx_commit=1 (log flushed at each \
                 commit), binary log off, data on disk"
            }
            "etcd" if fast => "etcd data and WAL on /dev/shm (its fsyncs reach memory only)",
            "etcd" => "etcd defaults: data and WAL on disk, WAL fsynced at each write",
            "zookeeper" => "ZooKeeper defaults: forceSync=yes, dataDir on disk",
            "redis" if fast => "Redis with no snapshots and no AOF (--save '' --appendonly no)",
            "redis" => {
                "Redis defaults: RDB snapshots (save 3600 1 300 100 60 10000, a fork every \
                 minute under load), appendonly no: a restart loses the grants since the last \
                 snapshot"
            }
            "nats" => "NATS JetStream defaults: file store on disk, synced every 2 minutes",
            _ => return None,
        })
    }
}

static SERVER_DEFAULTS: AtomicBool = AtomicBool::new(false);

/// Sets how the servers started from now on (in this process) treat
/// durability; servers already running keep theirs.
pub fn set_durability(durability: Durability) {
    SERVER_DEFAULTS.store(durability == Durability::ServerDefaults, Ordering::SeqCst);
}

/// How the servers started now treat durability ([`set_durability`]).
pub fn durability() -> Durability {
    if SERVER_DEFAULTS.load(Ordering::SeqCst) {
        Durability::ServerDefaults
    } else {
        Durability::Fast
    }
}

/// `fast` under [`Durability::Fast`], nothing under the server's defaults.
fn fast_only(fast: &[&str]) -> Vec<String> {
    match durability() {
        Durability::Fast => fast.iter().map(|a| (*a).to_owned()).collect(),
        Durability::ServerDefaults => Vec::new(),
    }
}

/// Where the nodes of a cluster started on a lab's hosts run: node `i` on
/// the `i`-th host named (its address, in its namespace), checked from a
/// host that runs none (a host cannot reach its own address). What the
/// clustered servers ([`nats::NatsServer`], [`etcd::EtcdServer`]) share.
#[derive(Debug)]
struct LabNodes {
    /// Node i's address and namespace.
    hosts: Vec<(Ipv4Addr, PathBuf)>,
    /// A namespace from which every node can be reached.
    probe_from: PathBuf,
}

impl LabNodes {
    /// A node on each of `lab`'s hosts named in `hosts`.
    ///
    /// # Errors
    ///
    /// A setup error, naming `spawner`, when every host of the lab runs a
    /// `node` (nothing to check them from).
    fn on(lab: &Lab, hosts: &[&str], spawner: &str, node: &str) -> Result<Self, HarnessError> {
        let prober = lab
            .hosts()
            .iter()
            .find(|h| !hosts.contains(&h.name()))
            .ok_or_else(|| HarnessError::Setup {
                what: format!("{spawner}::start_in"),
                output: format!("the lab needs a host that runs no {node}"),
            })?;
        Ok(Self {
            hosts: hosts
                .iter()
                .map(|name| {
                    let host = lab.host(name);
                    (host.addr(), host.netns().path())
                })
                .collect(),
            probe_from: prober.netns().path(),
        })
    }

    /// Node `index`'s address: 127.0.0.1 when the cluster is not in a lab.
    fn addr(nodes: Option<&Self>, index: usize) -> Ipv4Addr {
        nodes
            .and_then(|p| p.hosts.get(index))
            .map_or(Ipv4Addr::LOCALHOST, |(addr, _)| *addr)
    }

    /// Node `index`'s namespace: `None` (this process's) when the cluster
    /// is not in a lab.
    fn netns(nodes: Option<&Self>, index: usize) -> Option<PathBuf> {
        nodes
            .and_then(|p| p.hosts.get(index))
            .map(|(_, netns)| netns.clone())
    }
}

/// A plain HTTP/1.0 `GET path` of `addr:port` made from the namespace
/// `from` (this process's when `None`): the whole response, `None` on any
/// failure or after `timeout`. For the servers' monitoring endpoints.
async fn http_get(
    from: Option<PathBuf>,
    addr: Ipv4Addr,
    port: u16,
    path: &str,
    timeout: Duration,
) -> Option<String> {
    let Some(from) = from else {
        return http_get_here(addr, port, path, timeout).await;
    };
    let path = path.to_owned();
    let thread = crate::netns::spawn_runtime_in(from, 0, move || async move {
        http_get_here(addr, port, &path, timeout).await
    });
    tokio::task::spawn_blocking(move || thread.join().ok()?.ok()?)
        .await
        .ok()
        .flatten()
}

async fn http_get_here(addr: Ipv4Addr, port: u16, path: &str, timeout: Duration) -> Option<String> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect((addr, port)).await.ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        Some(String::from_utf8_lossy(&response).into_owned())
    };
    tokio::time::timeout(timeout, fetch).await.ok().flatten()
}

/// The body of an HTTP `200` response; `None` for any other.
fn ok_body(response: &str) -> Option<&str> {
    let (head, body) = response.split_once("\r\n\r\n")?;
    (head.starts_with("HTTP/1.") && head.contains(" 200 ")).then_some(body)
}

/// One server process of kind `K` on a free loopback port, in a temporary
/// directory it is stopped with: what the single-process servers
/// ([`redis::RedisServer`], [`postgres::PostgresServer`],
/// [`mariadb::MariaDbServer`]) share. Each kind adds its start, its URL and
/// its faults.
#[derive(Debug)]
pub struct LoopbackServer<K: Kind> {
    process: ServerProcess,
    port: u16,
    place: Placement,
    dir: TempDir,
    kind: PhantomData<K>,
}

/// A kind of [`LoopbackServer`]: what it does besides stopping its process
/// when dropped.
pub trait Kind: std::fmt::Debug + Send + Sync + Sized {
    /// Runs as the server is dropped, before its process is stopped
    /// (nothing by default).
    fn on_drop(_server: &mut LoopbackServer<Self>) {}
}

impl<K: Kind> LoopbackServer<K> {
    fn new(process: ServerProcess, port: u16, place: Placement, dir: TempDir) -> Self {
        Self {
            process,
            port,
            place,
            dir,
            kind: PhantomData,
        }
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address it listens on: 127.0.0.1, or its lab host's.
    pub fn addr(&self) -> std::net::Ipv4Addr {
        self.place.addr()
    }

    /// Where it runs (and is reached from).
    pub fn placement(&self) -> &Placement {
        &self.place
    }

    /// The temporary directory (data and log).
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// The server's process, for faults (pause, kill, restart). A kind
    /// whose server has more processes says so with its own faults.
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}

impl<K: Kind> Drop for LoopbackServer<K> {
    fn drop(&mut self) {
        K::on_drop(self);
    }
}
