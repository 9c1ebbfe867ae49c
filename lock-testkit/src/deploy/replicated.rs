//! A Redis master with an asynchronous replica (`redis-replica`).

use std::time::Duration;

use async_trait::async_trait;

use super::{Deployment, Started};
use crate::process::HarnessError;
use crate::servers::redis::RedisServer;

/// A Redis master with one asynchronous replica, both without persistence.
/// Clients talk to the current master; a failover kills it and promotes
/// the replica.
#[derive(Debug)]
pub struct ReplicatedRedis {
    primary: RedisServer,
    replica: RedisServer,
    replica_paused: bool,
    replica_down: bool,
}

impl ReplicatedRedis {
    /// Starts a master and a replica of it, and waits until the replica is
    /// in sync.
    ///
    /// # Errors
    ///
    /// Missing binaries, servers that do not start, or a replica that does
    /// not sync within 20 s.
    pub async fn start() -> Result<Self, HarnessError> {
        // Full syncs start at once (the default waits 5 s for more
        // replicas); either server may become the primary.
        let fast_sync = ["--repl-diskless-sync-delay", "0"];
        let primary = RedisServer::start_with(&fast_sync).await?;
        let port = primary.port().to_string();
        let replica = RedisServer::start_with(&[
            "--replicaof",
            "127.0.0.1",
            &port,
            fast_sync[0],
            fast_sync[1],
        ])
        .await?;
        replica.wait_replica_synced(Duration::from_secs(20)).await?;
        Ok(Self {
            primary,
            replica,
            replica_paused: false,
            replica_down: false,
        })
    }

    /// The current master.
    pub fn primary(&self) -> &RedisServer {
        &self.primary
    }

    /// The current replica (down after a failover until
    /// [`restart`](Self::restart_replica)).
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// Stops replication: waits until the replica has everything written
    /// so far, then freezes it (SIGSTOP) and makes the master drop its link,
    /// so that later writes stay on the master only.
    ///
    /// # Errors
    ///
    /// When the replica is not in sync or a command fails.
    pub async fn hold_replication(&mut self) -> Result<(), HarnessError> {
        if self.replica_down {
            self.restart_replica().await?;
        }
        if self.replica_paused {
            return Ok(());
        }
        self.replica
            .wait_replica_synced(Duration::from_secs(10))
            .await?;
        // Everything written so far reaches the replica...
        self.primary.cli(&["WAIT", "1", "2000"])?;
        // ...and nothing after: frozen, and its link dropped (data already
        // in its socket buffer would otherwise still arrive on resume).
        self.replica.process().pause()?;
        self.replica_paused = true;
        self.primary.cli(&["CLIENT", "KILL", "TYPE", "replica"])?;
        Ok(())
    }

    /// Kills the master (SIGKILL) and promotes the replica, which becomes
    /// the primary; the old master stays down until
    /// [`restart_replica`](Self::restart_replica).
    ///
    /// # Errors
    ///
    /// When there is no live replica or the promotion fails.
    pub async fn fail_over(&mut self) -> Result<(), HarnessError> {
        if self.replica_down {
            return Err(HarnessError::Setup {
                what: "redis failover".into(),
                output: "the replica is down (restart it first)".into(),
            });
        }
        self.primary.process().kill()?;
        if self.replica_paused {
            self.replica.process().resume()?;
            self.replica_paused = false;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match self.replica.promote() {
                Ok(()) => break,
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        std::mem::swap(&mut self.primary, &mut self.replica);
        self.replica_down = true;
        Ok(())
    }

    /// Starts the killed old master again (empty: no persistence) as a
    /// replica of the current primary and waits until it is in sync. Does
    /// nothing when the replica is up.
    ///
    /// # Errors
    ///
    /// When it does not start or sync.
    pub async fn restart_replica(&mut self) -> Result<(), HarnessError> {
        if !self.replica_down {
            return Ok(());
        }
        self.replica.process().restart().await?;
        let port = self.primary.port().to_string();
        self.replica.cli(&["REPLICAOF", "127.0.0.1", &port])?;
        self.replica_down = false;
        self.replica
            .wait_replica_synced(Duration::from_secs(20))
            .await
    }
}

#[async_trait]
impl Deployment for ReplicatedRedis {
    fn kind(&self) -> &'static str {
        "redis-replica"
    }

    fn url(&self) -> String {
        self.primary.url()
    }

    fn port(&self) -> u16 {
        self.primary.port()
    }

    fn pause(&mut self) -> Result<(), HarnessError> {
        self.primary.process().pause()
    }

    fn resume(&mut self) -> Result<(), HarnessError> {
        self.primary.process().resume()
    }

    async fn kill_and_restart(&mut self) -> Result<(), HarnessError> {
        self.primary.process().restart().await?;
        // It may have been started as a replica (before a failover).
        self.primary.cli(&["REPLICAOF", "NO", "ONE"])?;
        if !self.replica_down {
            self.replica
                .wait_replica_synced(Duration::from_secs(20))
                .await?;
        }
        Ok(())
    }

    async fn hold_replication(&mut self) -> Result<bool, HarnessError> {
        ReplicatedRedis::hold_replication(self).await.map(|()| true)
    }

    async fn fail_over(&mut self) -> Result<bool, HarnessError> {
        ReplicatedRedis::fail_over(self).await.map(|()| true)
    }

    async fn restart_nodes(&mut self) -> Result<(), HarnessError> {
        self.restart_replica().await
    }
}

pub(super) async fn start(_peer_proxies: bool) -> Started {
    Ok(Box::new(ReplicatedRedis::start().await?))
}
