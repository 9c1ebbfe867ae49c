//! Connecting a [`RedisBackend`]: the nodes of a topology, their shared
//! connections and scripts, and the eviction check.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{ErrorKind, LockError, Operation};
use redis::Value;

use super::{Inner, RedisBackend};
use crate::batch::Renewer;
use crate::config::{RedisConfig, RedisTopology};
use crate::conn::Node;
use crate::error::NAME;
use crate::eviction::{self, EvictionCheck};
use crate::keys::{Scripts, TokenFloor};
use crate::notify::Notifier;

/// Connects to the Redis deployment a URL names (see [`RedisConfig`] for the
/// forms).
///
/// # Errors
///
/// [`ErrorKind::Config`] for a bad URL; [`ErrorKind::Unavailable`] /
/// [`ErrorKind::Timeout`] when not enough servers answer.
///
/// # Cancel safety
///
/// Safe: dropping it drops the half-made connections.
pub async fn connect(url: &str) -> Result<RedisBackend, LockError> {
    RedisBackend::connect(RedisConfig::from_url(url)?).await
}

impl RedisBackend {
    /// Connects with `config`: opens the shared connection of each node and
    /// loads the scripts. Must be called within a Tokio runtime (the
    /// backend runs its pub/sub and renewal-batching tasks on it). Redlock needs a majority of its nodes to answer;
    /// the others are connected later, when they come back.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for a bad configuration or wrong credentials;
    /// [`ErrorKind::Unavailable`] / [`ErrorKind::Timeout`] when not enough
    /// servers answer.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping it drops the half-made connections.
    pub async fn connect(config: RedisConfig) -> Result<Self, LockError> {
        config.validate()?;
        if tokio::runtime::Handle::try_current().is_err() {
            // Its background tasks (pub/sub, renewal batches) need Tokio.
            return Err(
                LockError::config("the Redis backend needs a Tokio runtime").with_backend(NAME)
            );
        }
        let config = Arc::new(config);
        let nodes: Vec<Node> = match &config.topology {
            RedisTopology::Single(node) => vec![Node::direct(&config, node)?],
            RedisTopology::Sentinel { sentinels, master } => {
                vec![Node::sentinel(&config, sentinels, master)?]
            }
            RedisTopology::Cluster(seeds) => vec![Node::cluster(&config, seeds)?],
            RedisTopology::Redlock(nodes) => nodes
                .iter()
                .map(|n| Node::direct(&config, n))
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
        let scripts = Arc::new(Scripts::for_layout(config.layout));
        let renewers = nodes
            .iter()
            .map(|n| Renewer::new(n.clone(), scripts.clone()))
            .collect();
        let notifier = Notifier::new(&nodes, config.operation_timeout.min(Duration::from_secs(1)));
        let quorum = nodes.len() / 2 + 1;
        let mut inner = Inner {
            config: config.clone(),
            scripts,
            nodes,
            renewers,
            notifier,
            redlock,
            quorum,
            eviction: EvictionCheck::NoEviction,
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
            gc_cursor: std::sync::Mutex::new((0, 0)),
        };
        inner.floor.prepare();
        // Connect and load the scripts (a cluster loads them per node on
        // first use, through the EVAL fallback).
        let loads = inner.nodes.iter().map(|node| {
            let scripts = inner.scripts.clone();
            node.run(
                Operation::Connect,
                config.operation_timeout,
                move |mut conn| async move {
                    if !matches!(conn, crate::conn::Conn::Cluster(_)) {
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
        });
        let results = futures_util::future::join_all(loads).await;
        let ok = results.iter().filter(|r| r.is_ok()).count();
        if ok < inner.quorum {
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
        inner.eviction = eviction::check(&inner.nodes, &live, config.operation_timeout).await;
        eviction::apply(&inner.eviction, config.eviction)?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }
}
