//! Making and keeping the connections: one [`Node`] per endpoint (a
//! server, a Sentinel-managed master, a cluster) behind one shared
//! connection, the pub/sub connections of the release notifications, the
//! eviction check at connect, and [`Servers`], what every component of a
//! backend shares.

pub(crate) mod eviction;
pub(crate) mod node;
pub(crate) mod pubsub;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use lock_core::{ErrorKind, LockError, Operation};
use redis::Value;

use crate::config::{RedisConfig, RedisTopology};
use crate::error::NAME;
use crate::keys::layout::scripts_for;
use crate::keys::names::TokenFloor;
use crate::keys::scripts::Scripts;
use crate::keys::space::KeySpace;
pub(crate) use eviction::EvictionCheck;
pub(crate) use node::{Conn, Lane, Node, ScriptCall};
use pubsub::Notifier;

/// One backend's deployment: its configuration and key names, the scripts,
/// one [`Node`] per endpoint (several for Redlock), the release
/// notifications, and what the connect-time checks found. Shared (in an
/// `Arc`) by every component and every clone of the backend.
pub(crate) struct Servers {
    pub(crate) config: Arc<RedisConfig>,
    pub(crate) keys: KeySpace,
    pub(crate) scripts: Arc<Scripts>,
    pub(crate) nodes: Vec<Arc<Node>>,
    pub(crate) notifier: Notifier,
    /// Redlock over independent servers (a majority decides).
    pub(crate) redlock: bool,
    /// How many nodes must agree: 1 on one endpoint, a majority for Redlock.
    pub(crate) quorum: usize,
    /// Where the token floor keys (`gc`) are: one per server, one per
    /// Cluster slot, or none.
    pub(crate) floor: TokenFloor,
    pub(crate) eviction: EvictionCheck,
    /// The tests' deliberately broken variants of the lane pinning.
    #[cfg(test)]
    pub(crate) unpinned: Unpinned,
}

/// Switches of the unit tests' broken variants: an undo or withdrawal
/// (`undo`) or a grant's `WAIT` (`wait`) sent on another lane than the
/// grant's, so the checks of the pinning can be seen to fail.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Unpinned {
    pub(crate) undo: std::sync::atomic::AtomicBool,
    pub(crate) wait: std::sync::atomic::AtomicBool,
}

#[cfg(test)]
impl Unpinned {
    pub(crate) fn wait(&self) -> bool {
        self.wait.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Servers {
    /// Connects with `config`: opens the shared connection of each node,
    /// loads the scripts and checks the servers' eviction policy. Redlock
    /// needs a majority of its nodes to answer; the others are connected
    /// later, when they come back.
    pub(crate) async fn connect(config: RedisConfig) -> Result<Self, LockError> {
        config.validate()?;
        if tokio::runtime::Handle::try_current().is_err() {
            // Its background tasks (pub/sub, renewal batches) need Tokio.
            return Err(
                LockError::config("the Redis backend needs a Tokio runtime").with_backend(NAME)
            );
        }
        let config = Arc::new(config);
        let nodes: Vec<Node> = match &config.topology {
            RedisTopology::Single(node) => vec![Node::server(&config, node)?],
            RedisTopology::Sentinel { sentinels, master } => {
                vec![Node::sentinel(&config, sentinels, master)?]
            }
            RedisTopology::Cluster(seeds) => vec![Node::cluster(&config, seeds)?],
            RedisTopology::Redlock(nodes) => nodes
                .iter()
                .map(|n| Node::server(&config, n))
                .collect::<Result<_, _>>()?,
        };
        let redlock = matches!(config.topology, RedisTopology::Redlock(_));
        let cluster = matches!(config.topology, RedisTopology::Cluster(_));
        if config.wait_replicas > 0 && (redlock || cluster) {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                Operation::Connect,
                "WAIT for replicas is supported with redis:// and redis+sentinel:// only",
            )
            .with_backend(NAME));
        }
        let nodes: Vec<Arc<Node>> = nodes.into_iter().map(Arc::new).collect();
        let notifier = Notifier::new(&nodes, config.operation_timeout.min(Duration::from_secs(1)));
        let mut servers = Self {
            keys: KeySpace::new(config.layout, &config.prefix, &config.token_suffix, cluster),
            scripts: Arc::new(scripts_for(config.layout)),
            quorum: nodes.len() / 2 + 1,
            nodes,
            notifier,
            redlock,
            eviction: EvictionCheck::NoEviction,
            #[cfg(test)]
            unpinned: Unpinned::default(),
            // One floor key per server (each Redlock node has its own, so
            // gc keeps each node's counter strictly increasing, as it was
            // without gc); in Cluster one per slot, where the layout is
            // ours (gc refuses the legacy layouts).
            floor: if cluster && config.layout.is_legacy() {
                TokenFloor::Absent
            } else if cluster {
                TokenFloor::PerSlot
            } else {
                TokenFloor::Server
            },
            config: config.clone(),
        };
        servers.floor.prepare();
        // Connect and load the scripts (a cluster loads them per node on
        // first use, through the EVAL fallback).
        let loads = servers.nodes.iter().map(|node| async {
            let scripts = servers.scripts.clone();
            node.run_on(
                Lane::ANY,
                Operation::Connect,
                config.operation_timeout,
                move |mut conn| async move {
                    if !matches!(conn, Conn::Cluster(_)) {
                        for script in scripts.all() {
                            let _: String = conn
                                .query(redis::cmd("SCRIPT").arg("LOAD").arg(script.code))
                                .await?;
                        }
                    } else {
                        let _: Value = conn.query(&redis::cmd("PING")).await?;
                    }
                    Ok(())
                },
            )
            .await?;
            // The other lanes too: a server that refuses more connections
            // fails here, and no call later pays for connecting.
            node.open_lanes().await
        });
        let results = futures_util::future::join_all(loads).await;
        let ok = results.iter().filter(|r| r.is_ok()).count();
        if ok < servers.quorum {
            let err = results.into_iter().find_map(Result::err);
            return Err(err.unwrap_or_else(|| {
                LockError::new(
                    ErrorKind::Unavailable,
                    Operation::Connect,
                    "no node answered",
                )
            }));
        }
        // A server that may evict keys can delete a held lock or a token
        // counter: warn, or refuse when the configuration asks for it.
        let live: Vec<bool> = results.iter().map(Result::is_ok).collect();
        servers.eviction = eviction::check(&servers.nodes, &live, config.operation_timeout).await;
        eviction::apply(&servers.eviction, config.eviction)?;
        Ok(servers)
    }

    /// The lane of the undo of a grant that went on `grant` (a grant whose
    /// answer was not seen, a waiter's withdrawal): the same, so that each
    /// node processes the undo after the grant (see [`Lane`]).
    pub(crate) fn undo_lane(&self, grant: Lane) -> Lane {
        #[cfg(test)]
        if self
            .unpinned
            .undo
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return grant.next();
        }
        grant
    }

    /// The operation timeout of one call.
    pub(crate) fn timeout(&self) -> Duration {
        self.config.operation_timeout
    }

    /// The node of the one-server shapes (one server, Sentinel, Cluster):
    /// fair mutexes, shared kinds, sets of keys.
    pub(crate) fn first(&self) -> &Node {
        &self.nodes[0]
    }

    /// Runs `call` on every node (concurrently; directly when there is
    /// one) and hands each result to `each`.
    pub(crate) async fn each_node<'a, F, Fut, T>(&'a self, call: F, mut each: impl FnMut(T))
    where
        F: FnMut(&'a Arc<Node>) -> Fut,
        Fut: Future<Output = T>,
    {
        if let [node] = self.nodes.as_slice() {
            // One server: no futures to join, no vector of results.
            let mut call = call;
            each(call(node).await);
        } else {
            for result in futures_util::future::join_all(self.nodes.iter().map(call)).await {
                each(result);
            }
        }
    }
}
