//! Elections in the layout of etcd's `concurrency.Election` (and so of
//! `etcdctl elect`): each candidate is an entry `<election prefix><lease
//! hex>` created with its session lease if absent, the leader is the entry
//! with the lowest create revision, a candidate waits for the deletion of
//! every older entry (watching the one just before its own, as the mutex
//! does: the same queue), and resigning deletes the entry. The term is the
//! leader entry's create revision.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{KeyValue, WatchFilterType, WatchOptions};
use lock_core::election::{Leader, election_lock_key};
use lock_core::{FencingToken, Lease, LockError, LockKey, Operation, WatchRequest};
use tokio::time::{Instant, sleep_until};

use crate::connection::Connection;
use crate::error::NAME;
use crate::grants::{Grants, Layout};
use crate::keys;
use crate::waiting::{Waiting, bounded_wait};

/// The leader as read, with its entry's name, and the revision of the read.
struct LeaderRead {
    leader: Option<Leader>,
    entry: Option<Vec<u8>>,
    revision: i64,
}

/// Elections in the layout of etcd's `concurrency.Election`
/// (`etcdctl elect` sees the same leader).
#[derive(Clone, Debug)]
pub(crate) struct Elections {
    conn: Arc<Connection>,
    grants: Grants,
    waiting: Waiting,
}

#[async_trait]
impl lock_core::Elections for Elections {
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.campaign_entry(election, ttl, deadline).await
    }

    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        self.election_leader(election).await
    }

    async fn watch_leader(
        &self,
        request: WatchRequest<'_, Leader>,
    ) -> Result<Option<Leader>, LockError> {
        self.watch_election(request.key, request.seen, request.deadline)
            .await
    }
}

impl Elections {
    pub(crate) fn new(conn: Arc<Connection>, grants: Grants, waiting: Waiting) -> Self {
        Self {
            conn,
            grants,
            waiting,
        }
    }

    /// Campaigns: our entry under the election's prefix, then our turn, as
    /// a waiting acquire of the mutex does (bounded the same way).
    pub(crate) async fn campaign_entry(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let key = election_lock_key(election).map_err(|e| e.with_backend(NAME))?;
        let prefix = self.conn.election_prefix(election);
        let attempt = async {
            self.waiting
                .acquire_entry(
                    &key,
                    prefix,
                    Layout::Election,
                    ttl,
                    deadline,
                    Operation::Acquire,
                )
                .await
                .map(Some)
        };
        bounded_wait(&key, deadline, attempt).await
    }

    /// The oldest candidate under the election's prefix: holder = its value
    /// (the proposal `etcdctl elect` was given; our candidates store their
    /// owner id in hex), term = its create revision.
    async fn read_leader(
        &self,
        election: &LockKey,
        op: Operation,
    ) -> Result<LeaderRead, LockError> {
        let prefix = self.conn.election_prefix(election);
        let response = self
            .grants
            .read_oldest(&prefix, op)
            .await
            .map_err(|e| e.with_key(election))?;
        let revision = response.header().map_or(0, |h| h.revision());
        let Some(first) = response.kvs().first() else {
            return Ok(LeaderRead {
                leader: None,
                entry: None,
                revision,
            });
        };
        let leader = self.leader_of(first, op).await;
        Ok(LeaderRead {
            leader: Some(leader),
            entry: Some(first.key().to_vec()),
            revision,
        })
    }

    async fn leader_of(&self, kv: &KeyValue, op: Operation) -> Leader {
        let name = String::from_utf8_lossy(kv.key()).into_owned();
        let remaining_ttl = self.grants.remaining_ttl(&name, kv.lease(), op).await;
        leader_of_entry(kv, remaining_ttl)
    }

    pub(crate) async fn election_leader(
        &self,
        election: &LockKey,
    ) -> Result<Option<Leader>, LockError> {
        Ok(self.read_leader(election, Operation::Inspect).await?.leader)
    }

    /// Reads the leader until it is not `seen` (or `deadline`), waking on an
    /// etcd watch: of the leader's entry (deleted, or rewritten by an
    /// `etcdctl`/Go leader's proclaim) while there is one, of the prefix's
    /// puts while there is none. No polling.
    pub(crate) async fn watch_election(
        &self,
        election: &LockKey,
        seen: Option<&Leader>,
        deadline: Instant,
    ) -> Result<Option<Leader>, LockError> {
        loop {
            let read = self.read_leader(election, Operation::Inspect).await?;
            if !Leader::same(read.leader.as_ref(), seen) || Instant::now() >= deadline {
                return Ok(read.leader);
            }
            let from = read.revision + 1;
            let (watched, options) = match read.entry {
                Some(entry) => (entry, WatchOptions::new().with_start_revision(from)),
                None => (
                    self.conn.election_prefix(election).into_bytes(),
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(from)
                        .with_filters([WatchFilterType::NoDelete]),
                ),
            };
            tokio::select! {
                () = sleep_until(deadline) => {}
                () = self.waiting.wait_change(watched, options, from) => {}
            }
        }
    }
}

/// The leader a candidate entry names: for our candidates (`<owner hex>
/// <details>`) the owner and the details; for any other value (an
/// `etcdctl elect` or Go proposal, whatever it holds, or an earlier
/// version's owner hex alone) the whole value as `holder`, no details.
/// The term is the entry's create revision.
pub(crate) fn leader_of_entry(kv: &KeyValue, remaining_ttl: Option<Duration>) -> Leader {
    let value = kv.value();
    let details = keys::value_details(value);
    let holder = if details.is_some() {
        keys::value_owner(value)
    } else {
        value
    };
    Leader {
        holder: String::from_utf8_lossy(holder).into_owned(),
        term: u64::try_from(kv.create_revision())
            .ok()
            .map(FencingToken::new),
        remaining_ttl,
        details,
    }
}
