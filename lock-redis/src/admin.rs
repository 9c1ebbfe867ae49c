//! Operating locks: the `Admin` facet (`force_release` in one script,
//! `gc` of token counters under a floor) and the `Listing` facet (`list`
//! and `list_shared` by `SCAN`: `listing.rs`, over `scan.rs`); see the
//! crate docs, *Operating locks*.

pub(crate) mod listing;
pub(crate) mod scan;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::{
    ErrorKind, FencingToken, GcReport, ListQuery, LockError, LockInfo, LockKey, LockPage,
    LockShape, Operation, SharedPage, async_trait,
};
use redis::Value;

use crate::connection::{Lane, Servers};
use crate::error::NAME;
use crate::grants::holders::{eval_on_every_node, majority_holder};
use crate::keys::layout::RedisLayout;
use crate::keys::names::{FLOOR_KEY, TokenFloor, glob_escape};
use crate::shared::Shared;
use scan::{MAX_SCANS, ScanTarget, scan, scan_targets};

/// The operators' calls: the `Admin` and `Listing` facets.
#[derive(Clone)]
pub(crate) struct Admin {
    servers: Arc<Servers>,
    shared: Shared,
    /// Where the next `gc` run goes on scanning: the scan target (the
    /// Cluster master's index) and its `SCAN` cursor; `(0, 0)`: from the
    /// start. Shared by the backend's clones.
    gc_cursor: Arc<Mutex<(usize, u64)>>,
}

impl Admin {
    pub(crate) fn new(servers: Arc<Servers>, shared: Shared) -> Self {
        Self {
            servers,
            shared,
            gc_cursor: Arc::new(Mutex::new((0, 0))),
        }
    }

    fn gc_cursor(&self) -> (usize, u64) {
        *self
            .gc_cursor
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn set_gc_cursor(&self, cursor: (usize, u64)) {
        *self
            .gc_cursor
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = cursor;
    }

    /// `force_release`: the force-release script on every node (a
    /// majority must answer); the holder it broke as inspect saw it.
    async fn force_release_nodes(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let op = Operation::Release;
        let servers = &self.servers;
        let names = servers.keys.mutex(key, op)?;
        // Redisson's waiters listen for its unlock message `0`, also on the
        // sharded channel; ours for `1`.
        let (message, sharded) = if servers.keys.layout() == RedisLayout::Redisson {
            ("0", "1")
        } else {
            ("1", "0")
        };
        let script = &servers.scripts.force_release;
        let args = [
            names.channel.as_str(),
            message,
            sharded,
            servers.keys.lock_type(),
        ];
        let answers = eval_on_every_node(servers, op, script, &names, &args).await;
        Ok(majority_holder(servers, key, op, answers)?.0)
    }

    /// `gc`: see the crate docs, *Operating locks*.
    async fn gc_counters(&self, older_than: Duration) -> Result<GcReport, LockError> {
        let op = Operation::Inspect;
        let servers = &self.servers;
        let config = &servers.config;
        if config.layout.is_legacy() {
            // Nothing gc may collect: the counters of the legacy layouts sit
            // in the other library's key space, beside keys gc cannot tell
            // from application data. Removing nothing keeps every token.
            return Ok(GcReport::default());
        }
        let floors = servers.floor;
        if floors == TokenFloor::Absent {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                op,
                "gc of token counters has no token floor here",
            )
            .with_backend(NAME));
        }
        let suffix = ":token";
        let pattern = format!("{}{{*}}{suffix}", glob_escape(&config.prefix));
        let idle = older_than.as_secs() + u64::from(older_than.subsec_nanos() > 0);
        let idle = idle.to_string();
        // One server: its one node; Cluster: every master in turn;
        // Redlock: every node in turn, each under its own floor.
        let targets = scan_targets(servers).await?;
        let mut report = GcReport::default();
        let (mut at, mut cursor) = self.gc_cursor();
        if at >= targets.len() {
            // The Cluster lost a master since the last run: start over.
            (at, cursor) = (0, 0);
        }
        for _ in 0..MAX_SCANS {
            let Some(target) = targets.get(at) else { break };
            let next = match self
                .gc_batch(target, cursor, &pattern, &idle, &mut report)
                .await
            {
                Ok(next) => next,
                // Redlock: a node that does not answer is passed over (its
                // counters wait for the next round); the others go on.
                Err(e) if servers.redlock && e.is_temporary() => 0,
                Err(e) => return Err(e),
            };
            cursor = next;
            if next == 0 {
                at += 1;
            }
            let done = at == targets.len();
            if done {
                at = 0;
            }
            self.set_gc_cursor((at, cursor));
            if done {
                break;
            }
        }
        // Cluster: a floor per slot, Redlock: one per node; no one value to
        // report.
        if floors == TokenFloor::Server && !servers.redlock {
            let timeout = config.operation_timeout;
            let value = servers
                .first()
                .run_on(Lane::ANY, op, timeout, |mut conn| async move {
                    conn.query::<Option<u64>>(redis::cmd("GET").arg(FLOOR_KEY))
                        .await
                })
                .await?;
            report.token_floor = Some(FencingToken::new(value.unwrap_or(0)));
        }
        Ok(report)
    }

    /// One `SCAN` of `gc` on `target` and the gc script on each counter it
    /// found, on that target's node (pipelined); the next Redis cursor.
    async fn gc_batch(
        &self,
        target: &ScanTarget,
        cursor: u64,
        pattern: &str,
        idle: &str,
        report: &mut GcReport,
    ) -> Result<u64, LockError> {
        let op = Operation::Inspect;
        let servers = &self.servers;
        let (suffix, floors) = (":token", servers.floor);
        let (next, found) = scan(servers, target, cursor, pattern, Some("string")).await?;
        let calls: Vec<(Vec<&str>, Vec<&str>)> = found
            .iter()
            .filter_map(|counter| {
                let lock = counter.strip_suffix(suffix)?;
                let key = servers.keys.lock_key_of(lock, "")?;
                if servers.keys.layout_names(&key).counter != *counter {
                    return None;
                }
                // The counter's own floor: the server's (the node's),
                // or its slot's.
                let floor = floors.key_for(counter)?;
                Some((vec![lock, counter.as_str(), floor], vec![idle]))
            })
            .collect();
        report.scanned += u64::try_from(calls.len()).unwrap_or(u64::MAX);
        if calls.is_empty() {
            return Ok(next);
        }
        let scripts = &servers.scripts;
        let node = &servers.nodes[target.0];
        let results = node
            .run_on(Lane::ANY, op, servers.timeout(), |mut conn| {
                let calls = &calls;
                async move { conn.eval_many(&scripts.gc_counter, calls).await }
            })
            .await?;
        for result in results {
            match result {
                Ok(Value::Int(1)) => report.removed += 1,
                Ok(_) => {}
                Err(err) => return Err(node.map_err(op, err)),
            }
        }
        Ok(next)
    }
}

#[async_trait]
impl lock_core::Admin for Admin {
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.force_release_nodes(key).await
    }

    /// An empty report in the legacy layouts, whose counters sit in the
    /// other library's key space (see the crate docs, *Operating locks*).
    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError> {
        self.gc_counters(older_than).await
    }
}

#[async_trait]
impl lock_core::Listing for Admin {
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        listing::list_page(&self.servers, query).await
    }

    /// Read-write locks and semaphores by `SCAN` (one server, Sentinel,
    /// Cluster); the mutex from `list`; `Unsupported` for the shared
    /// shapes with Redlock and the legacy layouts.
    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        match shape {
            LockShape::Mutex => lock_core::list_mutex_shared(self, query).await,
            shape => listing::list_shared_page(&self.servers, &self.shared, shape, query).await,
        }
    }

    /// Elections are the default mutexes.
    async fn list_elections(
        &self,
        query: &ListQuery,
    ) -> Result<lock_core::election::ElectionPage, LockError> {
        lock_core::election::list_mutex_elections(self, query).await
    }
}
