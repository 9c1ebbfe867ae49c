//! A Redis master, its replica and three sentinels (`redis-sentinel`).

use std::time::Duration;

use async_trait::async_trait;

use super::{Deployment, Started};
use crate::process::HarnessError;
use crate::servers::redis::SentinelGroup;

/// The master name the sentinels watch.
pub const SENTINEL_MASTER: &str = "locks";

/// How long a failover by the sentinels may take: 1 s down-after, the
/// vote, the promotion, after the TILT period of sentinels that were
/// frozen (5 s, or 30 s on a Redis older than 7.0).
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(45);

/// How long [`SentinelRedis`] leaves the sentinels to settle the roles on
/// their own (they make a returning old master a replica 10 s after it
/// reports its role) before it sets them itself.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a replica may take to sync once told whom to follow.
const SYNC_TIMEOUT: Duration = Duration::from_secs(20);

/// A Sentinel deployment ([`SentinelGroup`]): two data nodes without
/// persistence, one the master and one its asynchronous replica, and
/// sentinels (down-after 1 s, a majority quorum) that promote the replica
/// when the master is gone. Clients find the master through the sentinels
/// (`redis+sentinel://`), and find it again after a failover.
///
/// The faults:
///
/// - pause: every process frozen, the sentinels first (and resumed last),
///   so that none of them sees the data nodes stop: a pause is no
///   failover. (A sentinel frozen for over 2 s then spends its TILT
///   period, 5 s here, acting on nothing.) Freezing the data nodes alone
///   would be a failover: a frozen replica is not always seen down by the
///   time the sentinels pick one, and carries out its promotion on resume.
/// - kill and restart: both data nodes killed and started again, empty (as
///   Redis without persistence comes back). The sentinels see the master
///   gone at once (down-after 1 s is their ping period) and often fail
///   over to the restarted replica; the roles are set as the sentinels'
///   majority names them, and the fault lasts until the sentinels agree
///   and the replica is in sync.
/// - fail over: the master killed; the sentinels promote the replica. The
///   killed node comes back (empty) as a replica of the new master at
///   [`restart_nodes`](Deployment::restart_nodes).
/// - member partition (in a lab): the current master ([`primary_member`])
///   cut from its replica and the sentinels, which fail over without it
///   when the cut lasts past their down-after; clients still reach it.
///   After the heal, [`restart_nodes`](Deployment::restart_nodes) waits
///   until the sentinels have made the old master a replica of the new one,
///   as they do on their own; until then it serves the clients still
///   connected to it.
///
/// The replication hold ([`hold_replication`](Deployment::hold_replication))
/// does not freeze the replica, as `redis-replica`'s does: the sentinels
/// would not promote a replica that does not answer. The master refuses
/// its `PSYNC` and `SYNC` (`ACL SETUSER default -psync -sync`) and drops
/// its link: the replica keeps answering the sentinels, its link stays
/// down, and a failover soon after promotes it without the writes made
/// since.
///
/// [`primary_member`]: Deployment::primary_member
#[derive(Debug)]
pub struct SentinelRedis {
    group: SentinelGroup,
    /// The data node a failover killed, until it is started again.
    down: Option<usize>,
    /// The data node that refuses its replica's syncs (a replication
    /// hold), until it is killed or the hold undone.
    held: Option<usize>,
}

impl SentinelRedis {
    /// Wraps a started group.
    pub fn new(group: SentinelGroup) -> Self {
        Self {
            group,
            down: None,
            held: None,
        }
    }

    /// The group.
    pub fn group(&mut self) -> &mut SentinelGroup {
        &mut self.group
    }

    /// Undoes a replication hold on a node still running.
    fn release_hold(&mut self) -> Result<(), HarnessError> {
        if let Some(master) = self.held.take()
            && self.down != Some(master)
        {
            self.group.nodes()[master].cli(&["ACL", "SETUSER", "default", "+psync", "+sync"])?;
        }
        Ok(())
    }

    /// Gives the data nodes the roles a majority of the sentinels names:
    /// the master a master, the other (when it runs) its replica.
    fn align(&mut self) -> Result<(), HarnessError> {
        let master = self.group.current_master()?;
        self.group.node(master).promote()?;
        let other = 1 - master;
        if self.down != Some(other) {
            self.group.replicate(other, master)?;
        }
        Ok(())
    }

    /// Whether the roles are settled: every sentinel names the same
    /// master, sees it up and has no failover under way, it is a master,
    /// and the other node (when it runs) is its replica with its link up.
    fn settled(&self) -> bool {
        let Ok(master) = self.group.agreed_master() else {
            return false;
        };
        let other = 1 - master;
        self.group.is_master(master)
            && (self.down == Some(other) || self.group.is_replica_of(other, master))
    }

    /// Waits until the roles are settled, as the sentinels settle them;
    /// when they have not within [`SETTLE_TIMEOUT`], sets them as their
    /// majority says and waits again.
    async fn settle(&mut self) -> Result<(), HarnessError> {
        for (patience, align) in [(SETTLE_TIMEOUT, false), (SYNC_TIMEOUT, true)] {
            if align {
                self.align()?;
            }
            let deadline = tokio::time::Instant::now() + patience;
            while tokio::time::Instant::now() < deadline {
                if self.settled() {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Err(HarnessError::NotReady {
            name: "redis-sentinel (the sentinels and the data nodes' roles do not agree)"
                .to_owned(),
            log_tail: self
                .group
                .agreed_master()
                .map_or_else(|e| e.to_string(), |m| format!("master: node {m}")),
        })
    }
}

#[async_trait]
impl Deployment for SentinelRedis {
    fn kind(&self) -> &'static str {
        "redis-sentinel"
    }

    fn url(&self) -> String {
        self.group.url()
    }

    /// The current master's port. It is not in [`url`](Self::url), which
    /// names the sentinels: a fault proxy cannot go in front of the master
    /// by rewriting the URL (the soak then cuts clients in process).
    fn port(&self) -> u16 {
        let master = self.group.current_master().unwrap_or(0);
        self.group.nodes()[master].port()
    }

    fn pause(&mut self) -> Result<(), HarnessError> {
        for sentinel in self.group.sentinels() {
            let process = sentinel.process();
            if process.pid().is_some() && !process.is_paused() {
                process.pause()?;
            }
        }
        for i in 0..2 {
            let node = self.group.node(i).process();
            if node.pid().is_some() && !node.is_paused() {
                node.pause()?;
            }
        }
        Ok(())
    }

    fn resume(&mut self) -> Result<(), HarnessError> {
        for i in 0..2 {
            let node = self.group.node(i).process();
            if node.is_paused() {
                node.resume()?;
            }
        }
        for sentinel in self.group.sentinels() {
            let process = sentinel.process();
            if process.is_paused() {
                process.resume()?;
            }
        }
        Ok(())
    }

    async fn kill_and_restart(&mut self) -> Result<(), HarnessError> {
        for i in 0..2 {
            self.group.node(i).process().kill()?;
        }
        for i in 0..2 {
            self.group.node(i).process().restart().await?;
        }
        self.down = None;
        self.held = None;
        // Both come back masters; the sentinels may be failing over
        // meanwhile (settle waits for them).
        let _ = self.align();
        self.settle().await
    }

    async fn hold_replication(&mut self) -> Result<bool, HarnessError> {
        if self.held.is_some() {
            return Ok(true);
        }
        if self.down.is_some() {
            self.restart_nodes().await?;
        } else {
            self.settle().await?;
        }
        let master = self.group.current_master()?;
        let node = &self.group.nodes()[master];
        // Everything written so far reaches the replica...
        node.cli(&["WAIT", "1", "2000"])?;
        // ...and nothing after: it may not sync again, and its link is
        // dropped.
        node.cli(&["ACL", "SETUSER", "default", "-psync", "-sync"])?;
        self.held = Some(master);
        node.cli(&["CLIENT", "KILL", "TYPE", "replica"])?;
        Ok(true)
    }

    async fn fail_over(&mut self) -> Result<bool, HarnessError> {
        let old = self.group.current_master()?;
        self.group.node(old).process().kill()?;
        self.down = Some(old);
        if self.held == Some(old) {
            // Its refusal went with it.
            self.held = None;
        }
        let deadline = tokio::time::Instant::now() + FAILOVER_TIMEOUT;
        loop {
            if let Ok(new) = self.group.current_master()
                && new != old
                && self.group.is_master(new)
            {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HarnessError::NotReady {
                    name: "redis-sentinel failover (no replica promoted)".to_owned(),
                    log_tail: String::new(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Undoes a replication hold; starts the node a failover killed
    /// (empty) and makes it a replica of the current master at once; then
    /// waits until the roles are settled (after a member partition, until
    /// the sentinels have made the old master a replica), setting them
    /// itself if the sentinels have not within 30 s.
    async fn restart_nodes(&mut self) -> Result<(), HarnessError> {
        self.release_hold()?;
        if let Some(down) = self.down {
            self.group.node(down).process().restart().await?;
            self.down = None;
            let _ = self.align();
        }
        self.settle().await
    }

    fn primary_member(&self) -> Option<usize> {
        self.group.current_master().ok()
    }
}

pub(super) async fn start(_peer_proxies: bool) -> Started {
    let group = SentinelGroup::start(SENTINEL_MASTER).await?;
    Ok(Box::new(SentinelRedis::new(group)))
}
