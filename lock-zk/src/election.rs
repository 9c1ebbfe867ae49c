//! Leader election in the layout of Curator's `LeaderLatch`.
//!
//! The election named N lives in `<root>/.election/<escaped N>` (beside
//! `.rwlock` and `.semaphore`: no mutex key's directory starts with `.`).
//! A candidate creates an `EPHEMERAL_SEQUENTIAL` node
//! `_c_<owner id as a UUID>-latch-<sequence>` (Curator's protected name,
//! so a create whose reply was lost is found again by its id) whose data
//! is its owner value (Curator's participant id). The candidate whose node
//! has the lowest sequence (the digits after `latch-`, Curator's sort)
//! leads; the others watch the node just before their own. Resigning
//! deletes the node. This is the mutex recipe's queue with another node
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

use std::time::Duration;

use lock_core::election::{Leader, election_lock_key};
use lock_core::{
    ErrorKind, FencingToken, Lease, LockError, LockKey, Operation, OwnerId, check_ttl,
};
use tokio::time::{Instant, sleep_until};
use zookeeper_client as zk;

use super::session::Session;
use super::waiting::{Recipe, wait_lost};
use super::{ACQUIRE_GRACE, MIN_TTL, ZkBackend};
use crate::error::{CallError, NAME, timed};
use crate::paths::{self, LATCH_NAME, owner_of, sequence_named};

/// How many times a read retries when the node it found went meanwhile.
const LOOKS: usize = 5;

impl ZkBackend {
    /// The ZooKeeper path (inside the chroot) of the election `election`'s
    /// latch directory: `<root>/.election/<escaped name>`. A Curator
    /// `LeaderLatch` on `<chroot>` + this path is a candidate of the same
    /// election.
    pub fn latch_path(&self, election: &LockKey) -> String {
        paths::latch_dir(self.inner.config.root(), election)
    }

    pub(super) async fn campaign_latch(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let key = election_lock_key(election).map_err(|e| e.with_backend(NAME))?;
        check_ttl(ttl, MIN_TTL, Operation::Acquire)
            .map_err(|e| e.with_key(&key).with_backend(NAME))?;
        let dir = self.latch_path(election);
        let bounded = tokio::time::timeout_at(
            deadline + ACQUIRE_GRACE,
            self.lock_in_recipe(
                &key,
                &dir,
                ttl,
                Some(deadline),
                Operation::Acquire,
                true,
                Recipe::Latch,
            ),
        )
        .await
        .map_err(|_| {
            LockError::new(
                ErrorKind::Timeout,
                Operation::Acquire,
                "ZooKeeper did not answer before the campaign's deadline",
            )
            .with_key(&key)
            .with_backend(NAME)
        })?;
        bounded?.ok_or_else(|| {
            LockError::new(
                ErrorKind::Contended,
                Operation::Acquire,
                "another candidate still leads at the campaign's deadline",
            )
            .with_key(&key)
            .with_backend(NAME)
        })
    }

    pub(super) async fn latch_leader(
        &self,
        election: &LockKey,
    ) -> Result<Option<Leader>, LockError> {
        let key = election_lock_key(election).map_err(|e| e.with_backend(NAME))?;
        let session = self
            .session(Operation::Inspect)
            .await
            .map_err(|e| e.with_key(&key))?;
        let dir = self.latch_path(election);
        self.read_leader(&session, &dir, false)
            .await
            .map(|(leader, _)| leader)
            .map_err(|err| err.with_key(&key))
    }

    pub(super) async fn watch_latch_leader(
        &self,
        election: &LockKey,
        seen: Option<&Leader>,
        deadline: Instant,
    ) -> Result<Option<Leader>, LockError> {
        let key = election_lock_key(election).map_err(|e| e.with_backend(NAME))?;
        let dir = self.latch_path(election);
        loop {
            let session = self
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
        let timeout = self.op_timeout();
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
            let Some((_, first)) = paths::sorted_named(children, LATCH_NAME).into_iter().next()
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

    /// The leader a latch node named `name` with `data` stands for.
    fn leader_of(&self, name: &str, data: &[u8], czxid: i64) -> Leader {
        let clock = self.inner.clock;
        let seq = sequence_named(name, LATCH_NAME).and_then(|seq| u32::try_from(seq).ok());
        let remaining_ttl = owner_of(name).and_then(|owner: OwnerId| {
            self.tracked(owner, |node| {
                (Some(node.seq) == seq).then(|| clock.remaining(node.due, Instant::now()))
            })
            .flatten()
        });
        Leader {
            details: None,
            holder: String::from_utf8_lossy(data).into_owned(),
            term: u64::try_from(czxid).ok().map(FencingToken::new),
            remaining_ttl,
        }
    }
}
