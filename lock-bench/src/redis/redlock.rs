//! [`RedlockFloor`]: the driver's Redlock grant by hand, one bare
//! connection per node.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use conformance::floor::{FloorGrant, RawFloor};
use futures_util::future::join_all;
use lock_core::{ErrorKind, LockError, Operation, async_trait, validity_deadline};
use tokio::time::Instant;

use lock_redis::RedisTopology;
use lock_redis::keys::Scripts;

use super::{FloorNode, GrantRequest, NAME, Target, floor_config, send_release, unsupported};

/// The driver's Redlock cycle by hand: one bare connection per node of a
/// `redlock://` URL; the acquire script sent to every node at once, granted
/// on a majority while the grant is still valid (TTL − elapsed − drift, as
/// the driver computes it), released on every node. Two round trips per
/// node per cycle (10 on 5 nodes), on the nodes' connections in parallel.
///
/// A failed attempt (no majority, or the majority came too late) releases
/// on every node, as the driver does. Clones share the connections.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use conformance::floor::RawFloor;
/// use lock_bench::redis::RedlockFloor;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let floor = RedlockFloor::connect("redlock://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002").await?;
/// assert_eq!(floor.round_trips_per_cycle(), 6);
/// floor.cycle("bench/0", Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedlockFloor {
    shared: Arc<Shared>,
}

struct Shared {
    nodes: Vec<FloorNode>,
    scripts: Scripts,
    prefix: String,
    quorum: usize,
    timeout: Duration,
}

impl fmt::Debug for RedlockFloor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockFloor")
            .field("nodes", &self.shared.nodes.len())
            .field("prefix", &self.shared.prefix)
            .finish_non_exhaustive()
    }
}

impl RedlockFloor {
    /// Opens one bare connection to every node of a `redlock://` URL (same
    /// syntax and options as [`lock_redis::connect`]) and loads the driver's
    /// acquire and release scripts on each. Every node must answer: a
    /// floor measures the full exchange.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for a bad URL or rejected credentials;
    /// [`ErrorKind::Unsupported`] for any other scheme and for TLS;
    /// [`ErrorKind::Unavailable`] / [`ErrorKind::Timeout`] when a node does
    /// not answer within the URL's operation timeout.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes the connections made so far.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = floor_config(url)?;
        let RedisTopology::Redlock(nodes) = config.topology() else {
            return Err(unsupported("non-Redlock", "use RedisFloor for one server"));
        };
        let scripts = Scripts::new();
        let connected = join_all(
            nodes
                .iter()
                .map(|node| FloorNode::connect(Target::new(&config, node), &scripts)),
        )
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            shared: Arc::new(Shared {
                quorum: connected.len() / 2 + 1,
                nodes: connected,
                scripts,
                prefix: config.key_prefix().to_owned(),
                timeout: config.timeout(),
            }),
        })
    }

    /// Releases `grant` on every node: how many still held it, and the
    /// errors.
    async fn release_all(&self, grant: &FloorGrant) -> (usize, Vec<LockError>) {
        let s = &*self.shared;
        let results = join_all(
            s.nodes
                .iter()
                .map(|node| send_release(node, &s.scripts, &s.prefix, grant)),
        )
        .await;
        let mut released = 0;
        let mut errors = Vec::new();
        for result in results {
            match result {
                Ok(true) => released += 1,
                Ok(false) => {}
                Err(err) => errors.push(err),
            }
        }
        (released, errors)
    }
}

#[async_trait]
impl RawFloor for RedlockFloor {
    fn name(&self) -> &'static str {
        NAME
    }

    /// `EVALSHA` acquire and `EVALSHA` release on each node.
    fn round_trips_per_cycle(&self) -> u32 {
        u32::try_from(self.shared.nodes.len() * 2).unwrap_or(u32::MAX)
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        let s = &*self.shared;
        let request = GrantRequest::new(&s.prefix, key, ttl)?;
        // The driver's per-node bound: a slow node must not eat the TTL.
        let per_node = s.timeout.min((ttl / 10).max(Duration::from_millis(100)));
        let sent_at = Instant::now();
        let replies = join_all(
            s.nodes
                .iter()
                .map(|node| request.send(node, &s.scripts, per_node)),
        )
        .await;
        let mut tokens = Vec::new();
        let mut errors = Vec::new();
        for reply in replies {
            match reply.and_then(|r| request.granted(r)) {
                Ok(Some(token)) => tokens.push(token),
                Ok(None) => {}
                Err(err) => errors.push(err),
            }
        }
        // The highest node counter, as the driver reports it (a hint only:
        // Redlock has no safe fencing token).
        let grant = request.grant(tokens.iter().copied().max().unwrap_or(0));
        if tokens.len() >= s.quorum && validity_deadline(sent_at, ttl) > Instant::now() {
            return Ok(Some(grant));
        }
        if !tokens.is_empty() || !errors.is_empty() {
            // Undo a partial (or late) grant everywhere, also where the
            // answer was lost.
            let _ = self.release_all(&grant).await;
        }
        if tokens.len() >= s.quorum {
            return Err(LockError::new(
                ErrorKind::Timeout,
                Operation::TryAcquire,
                "a majority granted, but after the grant's validity ran out; undone",
            )
            .with_backend(NAME));
        }
        if errors.len() > s.nodes.len() - s.quorum {
            return Err(errors.swap_remove(0));
        }
        Ok(None)
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        let (released, mut errors) = self.release_all(grant).await;
        if released >= self.shared.quorum {
            return Ok(true);
        }
        if errors.is_empty() {
            Ok(false)
        } else {
            Err(errors.swap_remove(0))
        }
    }
}
