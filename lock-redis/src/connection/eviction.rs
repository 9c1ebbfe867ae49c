//! The eviction check at connect: a Redis allowed to evict keys
//! (`maxmemory-policy` other than `noeviction`) can delete a held lock (so
//! another client is granted it while the first still works) and a token
//! counter (so tokens start again at 1).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{LockError, Operation};

use crate::config::EvictionMode;
use crate::connection::node::{Lane, Node};
use crate::error::NAME;

/// What the connect-time check found ([`RedisBackend::eviction`](crate::RedisBackend::eviction)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EvictionCheck {
    /// Every server checked has `maxmemory-policy noeviction`: a full
    /// server refuses writes instead of deleting keys.
    NoEviction,
    /// A server may evict keys: lock keys (they have a TTL, so `volatile-*`
    /// policies evict them too) and, under `allkeys-*`, token counters.
    MayEvict {
        /// The server (or `cluster`).
        node: String,
        /// Its `maxmemory-policy`.
        policy: String,
        /// Its `maxmemory` in bytes (0: no limit set yet, so nothing is
        /// evicted until one is set, which can happen at run time).
        maxmemory: u64,
    },
    /// The policy could not be read (e.g. `CONFIG` disabled or renamed, as
    /// on many managed services).
    Unknown {
        /// The server (or `cluster`).
        node: String,
        /// Why.
        reason: String,
    },
}

/// Reads `maxmemory-policy` and `maxmemory` of every node that answered at
/// connect (`live[i]`), and reports the worst finding: any `MayEvict`
/// first, then any `Unknown`, else `NoEviction`.
pub(crate) async fn check(nodes: &[Arc<Node>], live: &[bool], timeout: Duration) -> EvictionCheck {
    let checks = nodes
        .iter()
        .zip(live)
        .filter(|(_, live)| **live)
        .map(|(node, _)| check_node(node, timeout));
    let results = futures_util::future::join_all(checks).await;
    let mut unknown = None;
    for result in results {
        match result {
            found @ EvictionCheck::MayEvict { .. } => return found,
            found @ EvictionCheck::Unknown { .. } => unknown = unknown.or(Some(found)),
            EvictionCheck::NoEviction => {}
        }
    }
    unknown.unwrap_or(EvictionCheck::NoEviction)
}

async fn check_node(node: &Node, timeout: Duration) -> EvictionCheck {
    let label = node.label().to_owned();
    let read = |name: &'static str| {
        let op = Operation::Connect;
        node.run_on(Lane::ANY, op, timeout, move |mut conn| async move {
            conn.query::<HashMap<String, String>>(redis::cmd("CONFIG").arg("GET").arg(name))
                .await
        })
    };
    let policy = match read("maxmemory-policy").await {
        Ok(map) => map.get("maxmemory-policy").cloned(),
        Err(err) => {
            return EvictionCheck::Unknown {
                node: label,
                reason: format!("CONFIG GET maxmemory-policy failed: {err}"),
            };
        }
    };
    let Some(policy) = policy else {
        return EvictionCheck::Unknown {
            node: label,
            reason: "CONFIG GET maxmemory-policy returned nothing".to_owned(),
        };
    };
    if policy.eq_ignore_ascii_case("noeviction") {
        return EvictionCheck::NoEviction;
    }
    let maxmemory = match read("maxmemory").await {
        Ok(map) => map
            .get("maxmemory")
            .and_then(|m| m.parse::<u64>().ok())
            .unwrap_or(0),
        Err(_) => 0,
    };
    EvictionCheck::MayEvict {
        node: label,
        policy,
        maxmemory,
    }
}

/// Logs the finding, and refuses in [`EvictionMode::Refuse`] when a server
/// may evict.
///
/// # Errors
///
/// A `Config` error for `MayEvict` under `Refuse`.
pub(crate) fn apply(found: &EvictionCheck, mode: EvictionMode) -> Result<(), LockError> {
    match found {
        EvictionCheck::NoEviction => Ok(()),
        EvictionCheck::MayEvict {
            node,
            policy,
            maxmemory,
        } => {
            let limit = if *maxmemory == 0 {
                "maxmemory 0: nothing is evicted until a limit is set, which CONFIG SET can do at any time".to_owned()
            } else {
                format!("maxmemory {maxmemory} bytes")
            };
            let text = format!(
                "redis node {node} has maxmemory-policy {policy} ({limit}): it may evict lock keys \
                 (a held lock vanishes and is granted again) and token counters (fencing tokens \
                 start again at 1); set maxmemory-policy noeviction"
            );
            if mode == EvictionMode::Refuse {
                return Err(
                    LockError::config(format!("{text} (refused: eviction=refuse)"))
                        .with_backend(NAME),
                );
            }
            tracing::warn!(target: "lock_redis", "{text}");
            Ok(())
        }
        EvictionCheck::Unknown { node, reason } => {
            tracing::warn!(
                target: "lock_redis",
                "could not check the eviction policy of redis node {node} ({reason}); make sure \
                 maxmemory-policy is noeviction, or locks and token counters may be evicted"
            );
            Ok(())
        }
    }
}
