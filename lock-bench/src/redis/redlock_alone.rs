//! redis-rs alone on Redlock: the driver's mutex cycle over the nodes of a
//! `redlock://` URL, sent through the client library the driver requires
//! and nothing else of lock-redis but its key names and script texts.
//!
//! [`RedlockCrateAlone`] opens one multiplexed connection of the crate per
//! node with the driver's data-connection settings
//! ([`RedisConfig::connection_config`](lock_redis::RedisConfig::connection_config)),
//! loads the two scripts on each, and per cycle sends what lock-redis's
//! Redlock grant and release send (`Grants::attempt`, `release_everywhere`):
//!
//! 1. the acquire of [`cycle_requests`] to every node at once, each bounded
//!    by redis-rs's response timeout set to the driver's per-node bound
//!    (the operation timeout, at most a tenth of the TTL but at least
//!    100 ms); granted on a majority of the nodes while the grant is still
//!    valid (TTL − elapsed − drift, `lock_core::validity_deadline`);
//! 2. the release of [`cycle_requests`] to every node at once, bounded by
//!    the operation timeout; released when a majority released it (or,
//!    as the driver counts it, any node with no node failing).
//!
//! An attempt without a majority (or whose majority came too late) is
//! undone on every node with the same release, bounded per node, as the
//! driver undoes it (not sent when no node granted or failed), and the
//! cycle fails.

use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use async_trait::async_trait;
use conformance::bench::Contender;
use futures_util::future::join_all;
use lock_core::{ErrorKind, HolderDetails, LockError, LockKey, Operation, OwnerId};
use lock_redis::RedisTopology;
use lock_redis::keys::{KeyNames, Scripts};
use tokio::time::Instant;

use super::crate_alone::{connect_loaded, crate_error, node_url};
use super::{NAME, cycle_requests, floor_config, unsupported};

/// The driver's Redlock cycle through redis-rs alone, one multiplexed
/// connection per node; see the module docs. Calls from several tasks
/// share the connections: eight independent clients are eight of these.
pub struct RedlockCrateAlone {
    nodes: Vec<MultiplexedConnection>,
    scripts: Scripts,
    prefix: String,
    /// Every grant's TTL, and in milliseconds as the script takes it.
    ttl: Duration,
    ttl_ms: String,
    /// The driver's bound on each node's acquire.
    per_node: Duration,
    /// The operation timeout (each node's release).
    timeout: Duration,
    quorum: usize,
}

impl std::fmt::Debug for RedlockCrateAlone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockCrateAlone")
            .field("nodes", &self.nodes.len())
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedlockCrateAlone {
    /// Connects one multiplexed connection of the crate to every node of a
    /// `redlock://` URL (same syntax and options as
    /// [`lock_redis::connect`]; its prefix, database, credentials and
    /// timeout are used) and loads the driver's two scripts on each; every
    /// grant asks for `ttl`. Every node must answer: the baseline measures
    /// the full exchange.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for a bad URL; [`ErrorKind::Unsupported`] for
    /// TLS and for URLs that are not `redlock://`; [`ErrorKind::Backend`]
    /// when a node refuses; `Timeout` past twice the operation timeout.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes the connections made so far.
    pub async fn connect(url: &str, ttl: Duration) -> Result<Self, LockError> {
        let config = floor_config(url)?;
        let RedisTopology::Redlock(nodes) = config.topology() else {
            return Err(unsupported(
                "non-Redlock",
                "use RedisCrateAlone for one server",
            ));
        };
        let settings = config.connection_config();
        let scripts = Scripts::new();
        let budget = config.timeout() * 2;
        let nodes = join_all(
            nodes
                .iter()
                .map(|node| connect_loaded(node_url(&config, node), &settings, &scripts, budget)),
        )
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
        let timeout = config.timeout();
        Ok(Self {
            quorum: nodes.len() / 2 + 1,
            nodes,
            scripts,
            prefix: config.key_prefix().to_owned(),
            ttl,
            ttl_ms: ttl.as_millis().to_string(),
            per_node: timeout.min((ttl / 10).max(Duration::from_millis(100))),
            timeout,
        })
    }

    /// `cmd` on every node at once, each bounded by `bound`: the integer
    /// replies (the first element of an array reply), or the errors.
    async fn everywhere(
        &self,
        cmd: &::redis::Cmd,
        bound: Duration,
        operation: Operation,
    ) -> Vec<Result<i64, LockError>> {
        join_all(self.nodes.iter().map(|conn| {
            let mut conn = conn.clone();
            conn.set_response_timeout(bound);
            async move {
                let reply: ::redis::Value = cmd
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| crate_error(operation, &e))?;
                first_int(&reply).ok_or_else(|| {
                    LockError::new(
                        ErrorKind::Backend,
                        operation,
                        format!("redis-rs alone: unexpected reply {reply:?}"),
                    )
                })
            }
        }))
        .await
    }

    /// The grant on a majority and the release of the free `key`, with a
    /// fresh owner and the holder details, as the driver makes them.
    async fn exchange(&self, key: &LockKey) -> Result<(), LockError> {
        let names = KeyNames::new(&self.prefix, key);
        let owner = OwnerId::random().to_hex();
        let details = HolderDetails::encode_current();
        let (acquire, release) =
            cycle_requests(&self.scripts, &names, &owner, &self.ttl_ms, &details);
        let sent_at = Instant::now();
        let (granted, failed) = tally(
            self.everywhere(&acquire, self.per_node, Operation::Acquire)
                .await,
        );
        let in_time = lock_core::validity_deadline(sent_at, self.ttl) > Instant::now();
        if granted < self.quorum || !in_time {
            // The driver's undo of a partial (or late) grant, on every
            // node; nothing to undo when no node granted or failed.
            if granted > 0 || failed > 0 {
                self.everywhere(&release, self.per_node, Operation::Release)
                    .await;
            }
            return Err(LockError::new(
                ErrorKind::Contended,
                Operation::Acquire,
                format!(
                    "redis-rs alone: {granted} of {} nodes granted in time",
                    self.nodes.len()
                ),
            ));
        }
        let (released, failed) = tally(
            self.everywhere(&release, self.timeout, Operation::Release)
                .await,
        );
        // The driver's rule: a majority, or on Redlock any node with no
        // error.
        if released < self.quorum && (released == 0 || failed > 0) {
            return Err(LockError::new(
                ErrorKind::NotHeld,
                Operation::Release,
                "redis-rs alone: the grant was gone at release",
            ));
        }
        Ok(())
    }
}

/// An integer reply, or the first element of an array reply (the acquire
/// script answers `[granted, token or pttl]`).
fn first_int(reply: &::redis::Value) -> Option<i64> {
    match reply {
        ::redis::Value::Int(n) => Some(*n),
        ::redis::Value::Array(items) => match items.first()? {
            ::redis::Value::Int(n) => Some(*n),
            _ => None,
        },
        _ => None,
    }
}

/// The nodes that answered 1 (granted, released) and the nodes that
/// failed, of one request sent everywhere.
fn tally<E>(replies: impl IntoIterator<Item = Result<i64, E>>) -> (usize, usize) {
    replies
        .into_iter()
        .fold((0, 0), |(ok, failed), reply| match reply {
            Ok(1) => (ok + 1, failed),
            Ok(_) => (ok, failed),
            Err(_) => (ok, failed + 1),
        })
}

#[async_trait]
impl Contender for RedlockCrateAlone {
    /// One acquire + release of the free `key`: two requests per node.
    async fn cycle(&self, key: &str) -> Result<(), LockError> {
        let key = LockKey::new(key)?;
        self.exchange(&key)
            .await
            .map_err(|e| e.with_key(&key).with_backend(NAME))
    }
}
