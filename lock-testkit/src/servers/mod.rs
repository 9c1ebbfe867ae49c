//! Spawners for each real server the drivers are tested against. Each
//! starts its server on free loopback ports in a temporary directory and
//! stops it on drop; a missing binary is [`HarnessError::MissingBinary`]
//! naming the Debian package. Each also has a `start_in` that puts it on
//! hosts of a [`Lab`](crate::netns::Lab) (see
//! [`netns::Placement`](crate::netns::Placement)), for real partitions.
//!
//! [`HarnessError::MissingBinary`]: crate::process::HarnessError::MissingBinary

pub mod etcd;
pub mod mariadb;
pub mod nats;
pub mod postgres;
pub mod redis;
pub mod zookeeper;

use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use tempfile::TempDir;

use crate::netns::Placement;
use crate::process::ServerProcess;

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
