//! Leader election in the layout of Curator's `LeaderLatch`.
//!
//! The election named N lives in `<root>/.election/<escaped N>` (beside
//! `.rwlock` and `.semaphore`: no mutex key's directory starts with `.`).
//! A candidate creates an `EPHEMERAL_SEQUENTIAL` node
//! `_c_<owner id as a UUID>-<escaped details>-latch-<sequence>` (Curator's
//! protected name, so a create whose reply was lost is found again by its
//! id; the holder details in the name, see `keys.rs`) whose data
//! is its owner value (Curator's participant id, which must stay whole).
//! The candidate whose node has the lowest sequence (the digits after the
//! last `latch-`, Curator's sort) leads; the others watch the node just
//! before their own. Resigning deletes the node. This is the mutex recipe's queue with another node
//! name and data (`waiting.rs`), so it has the same cleanup, session and
//! deadline handling.
//!
//! **Term** = the leader node's `czxid`, as the mutex's fencing token: a
//! node leads only once every node created before it in the directory is
//! gone, and zxids only grow (across server leader elections too), so each
//! term is greater than every earlier one. The sequence number is not
//! used: it restarts when the container directory is deleted (empty) and
//! created again.
//!
//! Observers read the first node's data and `czxid`, and wait with a
//! ZooKeeper watch (never polling): on the leader's node when there is a
//! leader (nobody else can lead before it goes: sequences only grow), on
//! the directory's children when it is empty, on the directory's existence
//! when it is missing.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::election::{ElectionInfo, ElectionPage, Leader, election_lock_key};
use lock_core::{
    ErrorKind, FencingToken, Lease, ListQuery, LockError, LockKey, Operation, WatchRequest,
    check_ttl,
};
use tokio::time::{Instant, sleep_until};
use zookeeper_client as zk;

use crate::admin::pages::{PageBounds, escaped_keys};
use crate::config::MIN_TTL;
use crate::connection::{Connection, Session};
use crate::error::{CallError, NAME, timed};
use crate::expiry::Expiry;
use crate::keys::{self, ELECTION_PARENT, LATCH_NAME, owner_of, sequence_named};
use crate::waiting::{Queue, Recipe, Waiting, bounded_wait, wait_lost};

/// How many times a read retries when the node it found went meanwhile.
const LOOKS: usize = 5;

/// The `Elections` facet in Curator's `LeaderLatch` layout.
#[derive(Clone)]
pub(crate) struct Elections {
    conn: Arc<Connection>,
    expiry: Expiry,
    waiting: Waiting,
}

impl Elections {
    pub(crate) fn new(conn: Arc<Connection>, expiry: Expiry, waiting: Waiting) -> Self {
        Self {
            conn,
            expiry,
            waiting,
        }
    }

    pub(crate) async fn campaign_latch(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let key = election_lock_key(election).map_err(|e| e.with_backend(NAME))?;
        check_ttl(ttl, MIN_TTL, Operation::Acquire)
            .map_err(|e| e.with_key(&key).with_backend(NAME))?;
        let dir = keys::latch_dir(self.conn.config().root(), election);
        let attempt = self.waiting.lock_in_recipe(Queue {
            key: &key,
            dir: &dir,
            ttl,
            deadline: Some(deadline),
            operation: Operation::Acquire,
            track: true,
            recipe: Recipe::Latch,
        });
        let why = "another candidate still leads at the campaign's deadline";
        bounded_wait(&key, deadline, ("campaign's deadline", why), attempt).await
    }

    pub(crate) async fn latch_leader(
        &self,
        election: &LockKey,
    ) -> Result<Option<Leader>, LockError> {
        let key = election_lock_key(election).map_err(|e| e.with_backend(NAME))?;
        let session = self
            .conn
            .session(Operation::Inspect)
            .await
            .map_err(|e| e.with_key(&key))?;
        let dir = keys::latch_dir(self.conn.config().root(), election);
        self.read_leader(&session, &dir, false)
            .await
            .map(|(leader, _)| leader)
            .map_err(|err| err.with_key(&key))
    }

    pub(crate) async fn watch_latch_leader(
        &self,
        election: &LockKey,
        seen: Option<&Leader>,
        deadline: Instant,
    ) -> Result<Option<Leader>, LockError> {
        let key = election_lock_key(election).map_err(|e| e.with_backend(NAME))?;
        let dir = keys::latch_dir(self.conn.config().root(), election);
        loop {
            let session = self
                .conn
                .session(Operation::Inspect)
                .await
                .map_err(|e| e.with_key(&key))?;
            let (now, watcher) = self
                .read_leader(&session, &dir, true)
                .await
                .map_err(|err| err.with_key(&key))?;
            if !Leader::same(now.as_ref(), seen) || Instant::now() >= deadline {
                return Ok(now);
            }
            let Some(watcher) = watcher else {
                // A watched read always arms one; without it, never spin.
                return Ok(now);
            };
            let mut state = session.state.clone();
            tokio::select! {
                _ = watcher.changed() => {}
                // A lost session never fires its watches: a new one reads.
                () = wait_lost(&mut state) => {}
                () = sleep_until(deadline) => return Ok(now),
            }
        }
    }

    /// The leader of the latch directory `dir`: the first `latch-` node's
    /// data and `czxid`. `watch`: also arm a watch that fires when that
    /// answer may change (the leader's node, or the directory when nobody
    /// leads).
    async fn read_leader(
        &self,
        session: &Session,
        dir: &str,
        watch: bool,
    ) -> Result<(Option<Leader>, Option<zk::OneshotWatcher>), LockError> {
        let fail = |err: CallError| err.into_lock_error(Operation::Inspect);
        let timeout = self.conn.op_timeout();
        let client = &session.client;
        for _ in 0..LOOKS {
            let children = match timed(timeout, client.list_children(dir)).await {
                Ok(children) => children,
                Err(err) if err.is(&zk::Error::NoNode) => {
                    if !watch {
                        return Ok((None, None));
                    }
                    // No directory yet: wait for its creation.
                    match timed(timeout, client.check_and_watch_stat(dir))
                        .await
                        .map_err(fail)?
                    {
                        (None, w) => return Ok((None, Some(w))),
                        // Created meanwhile: list again.
                        (Some(_), _) => continue,
                    }
                }
                Err(err) => return Err(fail(err)),
            };
            let Some((_, first)) = keys::sorted_named(children, LATCH_NAME).into_iter().next()
            else {
                if !watch {
                    return Ok((None, None));
                }
                // Nobody leads: watch the children (a second list, so that
                // the common case, a leader, arms no watch it then drops,
                // which would cost a `removeWatches`).
                match timed(timeout, client.list_and_watch_children(dir)).await {
                    Ok((children, w))
                        if !children
                            .iter()
                            .any(|c| sequence_named(c, LATCH_NAME).is_some()) =>
                    {
                        return Ok((None, Some(w)));
                    }
                    // A candidate arrived, or the directory went: look again.
                    Ok(_) => continue,
                    Err(err) if err.is(&zk::Error::NoNode) => continue,
                    Err(err) => return Err(fail(err)),
                }
            };
            let path = format!("{dir}/{first}");
            let read = if watch {
                timed(timeout, client.get_and_watch_data(&path))
                    .await
                    .map(|(data, stat, w)| (data, stat, Some(w)))
            } else {
                timed(timeout, client.get_data(&path))
                    .await
                    .map(|(data, stat)| (data, stat, None))
            };
            let (data, stat, node_watch) = match read {
                Ok(read) => read,
                // The leader resigned between the list and the read.
                Err(err) if err.is(&zk::Error::NoNode) => continue,
                Err(err) => return Err(fail(err)),
            };
            return Ok((Some(self.leader_of(&first, &data, stat.czxid)), node_watch));
        }
        Err(LockError::new(
            ErrorKind::Unavailable,
            Operation::Inspect,
            "the election's leader kept changing while we looked",
        )
        .with_backend(NAME))
    }

    /// `list_elections`: one `getChildren` of `<root>/.election`, then the
    /// latch directories of the page (bounded and paged as `list`): one
    /// pipelined `getChildren` each, then one pipelined `getData` of each
    /// first candidate (3 round trips, at most `2 × limit + 1` requests,
    /// plus a look again at an election whose leader left in between).
    pub(crate) async fn list_latches(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        let (prefix, cursor, limit) = query.parts();
        let op = Operation::Inspect;
        let bounds = PageBounds::new(prefix, cursor, limit)?;
        let session = self.conn.session(op).await?;
        let client = &session.client;
        let timeout = self.conn.op_timeout();
        let parent = format!("{}/{ELECTION_PARENT}", self.conn.config().root());
        let children = self.conn.children_of(&session, &parent, op).await?;
        let (elections, next) = bounds.select(escaped_keys(children));
        let dirs: Vec<String> = elections
            .iter()
            .map(|(name, _)| format!("{parent}/{name}"))
            .collect();
        // Pipelined: every request is sent when its call is made.
        let listings: Vec<_> = dirs
            .iter()
            .map(|dir| timed(timeout, client.list_children(dir)))
            .collect();
        let mut heads = Vec::with_capacity(dirs.len());
        for listing in listings {
            heads.push(match listing.await {
                Ok(children) => keys::sorted_named(children, LATCH_NAME)
                    .into_iter()
                    .next()
                    .map(|(_, name)| name),
                Err(err) if err.is(&zk::Error::NoNode) => None,
                Err(err) => return Err(err.into_lock_error(op)),
            });
        }
        let reads: Vec<_> = heads
            .iter()
            .zip(&dirs)
            .map(|(head, dir)| {
                head.as_ref()
                    .map(|name| timed(timeout, client.get_data(&format!("{dir}/{name}"))))
            })
            .collect();
        let mut page = ElectionPage::default();
        for (((read, head), dir), (_, election)) in
            reads.into_iter().zip(heads).zip(&dirs).zip(&elections)
        {
            let (Some(read), Some(name)) = (read, head) else {
                continue;
            };
            let leader = match read.await {
                Ok((data, stat)) => Some(self.leader_of(&name, &data, stat.czxid)),
                // The leader resigned between the two reads: look again.
                Err(err) if err.is(&zk::Error::NoNode) => {
                    self.read_leader(&session, dir, false)
                        .await
                        .map_err(|e| e.with_key(election))?
                        .0
                }
                Err(err) => return Err(err.into_lock_error(op).with_key(election)),
            };
            if let Some(leader) = leader {
                page.elections.push(ElectionInfo {
                    election: election.clone(),
                    leader,
                });
            }
        }
        page.cursor = next;
        Ok(page)
    }

    /// The leader a latch node named `name` with `data` stands for.
    fn leader_of(&self, name: &str, data: &[u8], czxid: i64) -> Leader {
        let seq = sequence_named(name, LATCH_NAME).and_then(|seq| u32::try_from(seq).ok());
        let remaining_ttl = owner_of(name).and_then(|owner| self.expiry.remaining(owner, seq));
        Leader {
            // In the name: the data is Curator's participant id, whole.
            details: crate::keys::holder_details(name),
            holder: String::from_utf8_lossy(data).into_owned(),
            term: u64::try_from(czxid).ok().map(FencingToken::new),
            remaining_ttl,
        }
    }
}

#[async_trait]
impl lock_core::Elections for Elections {
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.campaign_latch(election, ttl, deadline).await
    }

    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        self.latch_leader(election).await
    }

    async fn watch_leader(
        &self,
        request: WatchRequest<'_, Leader>,
    ) -> Result<Option<Leader>, LockError> {
        // A ZooKeeper watch, never polling.
        self.watch_latch_leader(request.key, request.seen, request.deadline)
            .await
    }
}
