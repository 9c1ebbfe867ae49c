//! Operating locks: `inspect`'s holder look-up (with the holder details in
//! the lock node's data), `list` of the root's key directories, `force_release`
//! and `gc` of empty key directories. See the crate docs, "Operating locks".

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_core::{
    ErrorKind, FencingToken, GcReport, ListQuery, LockError, LockInfo, LockKey, LockPage,
    Operation, OwnerId, check_list_limit,
};
use tokio::time::Instant;
use zookeeper_client as zk;

use super::session::Session;
use super::{ZkBackend, lock};
use crate::error::{CallError, NAME, timed};
use crate::paths::{self, kazoo_owner_of, owner_of};

/// The prefix of a `list` cursor; the rest is the escaped name of the last
/// key directory the page examined.
const CURSOR_PREFIX: &str = "zk1:";

/// The most key directories one `gc` call examines.
pub(super) const GC_SCAN: usize = 1000;

/// How many times a look-up starts over when the holder it found went away
/// before it could be read.
const LOOKS: usize = 5;

/// The holder a look-up found: its node's path and what `inspect` reports.
pub(super) struct Found {
    pub(super) path: String,
    pub(super) info: LockInfo,
}

impl ZkBackend {
    /// The holder of `key`'s mutex directory `dir`: the lowest contender,
    /// its `czxid` and its data (the holder details) read with one
    /// `getData`. `None` when nobody holds.
    pub(super) async fn holder_in(
        &self,
        session: &Session,
        key: &LockKey,
        dir: &str,
        operation: Operation,
    ) -> Result<Option<Found>, LockError> {
        let fail = |err: CallError| err.into_lock_error(operation).with_key(key);
        // The holder may release between the list and the read: look again.
        for _ in 0..LOOKS {
            let children = match timed(self.op_timeout(), session.client.list_children(dir)).await {
                Ok(children) => children,
                Err(err) if err.is(&zk::Error::NoNode) => return Ok(None),
                Err(err) => return Err(fail(err)),
            };
            let Some((seq, name)) = paths::sorted_mutex_contenders(children).into_iter().next()
            else {
                return Ok(None);
            };
            let path = format!("{dir}/{name}");
            match timed(self.op_timeout(), session.client.get_data(&path)).await {
                Ok((data, stat)) => {
                    let info = self.holder_info(key, seq, name, &data, &stat);
                    return Ok(Some(Found { path, info }));
                }
                Err(err) if err.is(&zk::Error::NoNode) => continue,
                Err(err) => return Err(fail(err)),
            }
        }
        Err(LockError::new(
            ErrorKind::Unavailable,
            operation,
            "the holder kept changing while we looked",
        )
        .with_key(key)
        .with_backend(NAME))
    }

    /// Waits until `key`'s holder is no longer `seen` (or `deadline`),
    /// waking on a ZooKeeper watch armed before each read: of the key
    /// directory's children (a holder or waiter comes or goes), or of the
    /// directory's creation while it does not exist. No polling.
    pub(super) async fn watch_holder_in(
        &self,
        key: &LockKey,
        seen: Option<&LockInfo>,
        deadline: Instant,
    ) -> Result<Option<LockInfo>, LockError> {
        let op = Operation::Inspect;
        let dir = self.checked_key_path(key, op)?;
        loop {
            let session = self.session(op).await.map_err(|e| e.with_key(key))?;
            let fail = |err: CallError| err.into_lock_error(op).with_key(key);
            let client = &session.client;
            let watcher = match timed(self.op_timeout(), client.list_and_watch_children(&dir)).await
            {
                Ok((_, watcher)) => watcher,
                Err(err) if err.is(&zk::Error::NoNode) => {
                    match timed(self.op_timeout(), client.check_and_watch_stat(&dir))
                        .await
                        .map_err(fail)?
                    {
                        (None, watcher) => watcher,
                        // Created meanwhile: watch its children.
                        (Some(_), _) => continue,
                    }
                }
                Err(err) => return Err(fail(err)),
            };
            let now = self
                .holder_in(&session, key, &dir, op)
                .await?
                .map(|found| found.info);
            if !LockInfo::same_holder(now.as_ref(), seen) || Instant::now() >= deadline {
                return Ok(now);
            }
            let mut state = session.state.clone();
            tokio::select! {
                _ = watcher.changed() => {}
                // A lost session never fires its watches: a new one reads.
                () = super::waiting::wait_lost(&mut state) => {}
                () = tokio::time::sleep_until(deadline) => return Ok(now),
            }
        }
    }

    /// What `inspect` reports of the contender `name` (sequence `seq`)
    /// with data `data` and stat `stat`.
    fn holder_info(
        &self,
        key: &LockKey,
        seq: i64,
        name: String,
        data: &[u8],
        stat: &zk::Stat,
    ) -> LockInfo {
        // The holder may be a kazoo lock: its node name is the holder, or
        // with `nodes=kazoo` (where ours have kazoo's names too) the 32-hex
        // id in it, as for ours.
        let owner = match self.inner.config.node_names() {
            crate::ZkNodeNames::Curator => owner_of(&name),
            crate::ZkNodeNames::Kazoo => owner_of(&name).or_else(|| kazoo_owner_of(&name)),
        };
        let seq = u32::try_from(seq).ok();
        let clock = self.inner.clock;
        let remaining_ttl = owner.and_then(|owner| {
            self.tracked(owner, |node| {
                (Some(node.seq) == seq).then(|| clock.remaining(node.due, Instant::now()))
            })
            .flatten()
        });
        LockInfo {
            details: paths::details_of_data(data),
            key: key.clone(),
            holder: owner.map_or(name, OwnerId::to_hex),
            token: u64::try_from(stat.czxid).ok().map(FencingToken::new),
            remaining_ttl,
        }
    }

    /// The keys of the root's children this backend's mutexes live in,
    /// sorted by their escaped names: every escaped key in the default
    /// layout; in the path layout only the library's own keys (the others
    /// live at their paths, outside the root).
    fn root_keys(&self, children: Vec<String>) -> Vec<(String, LockKey)> {
        let layout = self.inner.config.layout();
        let mut keys = escaped_keys(children);
        keys.retain(|(_, key)| paths::layout_of(layout, key.as_str()) == crate::ZkLayout::Escaped);
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        keys
    }

    /// The children of `parent` (the root, or a shape's `.` directory), or
    /// none when it does not exist yet.
    pub(super) async fn children_of(
        &self,
        session: &Session,
        parent: &str,
        operation: Operation,
    ) -> Result<Vec<String>, LockError> {
        match timed(self.op_timeout(), session.client.list_children(parent)).await {
            Ok(children) => Ok(children),
            Err(err) if err.is(&zk::Error::NoNode) => Ok(Vec::new()),
            Err(err) => Err(err.into_lock_error(operation)),
        }
    }

    /// `list`: one `getChildren` of the root, then the key directories
    /// after the cursor whose key starts with `prefix`, at most `limit` of
    /// them: one pipelined `getChildren` each, then one pipelined
    /// `getData` of each lowest contender.
    pub(super) async fn list_page(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        let (prefix, cursor, limit) = query.parts();
        let bounds = PageBounds::new(prefix, cursor, limit)?;
        let session = self.session(Operation::Inspect).await?;
        let root = self.inner.config.root();
        let children = self.children_of(&session, root, Operation::Inspect).await?;
        let (keys, next) = bounds.select(self.root_keys(children));
        let dirs: Vec<String> = keys
            .iter()
            .map(|(name, _)| format!("{root}/{name}"))
            .collect();
        // Pipelined: the client sends each request when it is called.
        let listings: Vec<_> = dirs
            .iter()
            .map(|dir| timed(self.op_timeout(), session.client.list_children(dir)))
            .collect();
        let mut heads = Vec::with_capacity(keys.len());
        for listing in listings {
            heads.push(match listing.await {
                Ok(children) => paths::sorted_mutex_contenders(children).into_iter().next(),
                Err(err) if err.is(&zk::Error::NoNode) => None,
                Err(err) => return Err(err.into_lock_error(Operation::Inspect)),
            });
        }
        // Pipelined too: each `getData` is sent here, awaited below.
        let reads: Vec<_> = heads
            .iter()
            .zip(&dirs)
            .map(|(head, dir)| {
                head.as_ref().map(|(_, name)| {
                    let path = format!("{dir}/{name}");
                    timed(self.op_timeout(), session.client.get_data(&path))
                })
            })
            .collect();
        let mut page = LockPage::default();
        for (((read, head), dir), (_, key)) in reads.into_iter().zip(heads).zip(&dirs).zip(&keys) {
            let (Some(read), Some((seq, name))) = (read, head) else {
                continue;
            };
            match read.await {
                Ok((data, stat)) => page
                    .locks
                    .push(self.holder_info(key, seq, name, &data, &stat)),
                // The holder left between the two reads: look at the key again.
                Err(err) if err.is(&zk::Error::NoNode) => {
                    if let Some(found) = self
                        .holder_in(&session, key, dir, Operation::Inspect)
                        .await?
                    {
                        page.locks.push(found.info);
                    }
                }
                Err(err) => return Err(err.into_lock_error(Operation::Inspect).with_key(key)),
            }
        }
        page.cursor = next;
        Ok(page)
    }

    /// `force_release`: the holder as `inspect` sees it, then a delete of
    /// its node (any version: it is the operator's to break); a holder
    /// that left first is looked up again, so whoever holds at the delete
    /// is the one broken.
    pub(super) async fn break_holder(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let operation = Operation::Release;
        let session = self.session(operation).await.map_err(|e| e.with_key(key))?;
        let dir = self.checked_key_path(key, operation)?;
        for _ in 0..LOOKS {
            let Some(found) = self.holder_in(&session, key, &dir, operation).await? else {
                return Ok(None);
            };
            match timed(self.op_timeout(), session.client.delete(&found.path, None)).await {
                Ok(()) => {
                    tracing::warn!(%key, node = %found.path, holder = %found.info.holder,
                        token = ?found.info.token, "lock broken by force_release");
                    self.remove_empty_dir(&session.client, &dir).await;
                    return Ok(Some(found.info));
                }
                Err(err) if err.is(&zk::Error::NoNode) => continue,
                Err(err) => return Err(err.into_lock_error(operation).with_key(key)),
            }
        }
        Err(LockError::new(
            ErrorKind::Unavailable,
            operation,
            "the holder kept changing while we tried to break it",
        )
        .with_key(key)
        .with_backend(NAME))
    }

    /// `gc`: one `getChildren` of the root, then up to [`GC_SCAN`] key
    /// directories from where the previous call of this backend stopped
    /// (wrapping around): one pipelined `exists` each, then a delete of
    /// each one that is empty and was created at least `older_than` ago
    /// (the server refuses it if a node arrived in between).
    pub(super) async fn collect_empty_dirs(
        &self,
        older_than: Duration,
    ) -> Result<GcReport, LockError> {
        let operation = Operation::Release;
        let session = self.session(operation).await?;
        let root = self.inner.config.root();
        let children = self.children_of(&session, root, operation).await?;
        let keys = self.root_keys(children);
        let start = {
            let cursor = lock(&self.inner.gc_cursor);
            cursor.as_deref().map_or(0, |after| {
                keys.partition_point(|(name, _)| name.as_str() <= after)
            })
        };
        let count = keys.len().min(GC_SCAN);
        let dirs: Vec<String> = (0..count)
            .map(|i| format!("{root}/{}", keys[(start + i) % keys.len()].0))
            .collect();
        *lock(&self.inner.gc_cursor) = dirs
            .last()
            .and_then(|dir| dir.rsplit('/').next().map(str::to_owned));
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let cutoff =
            now_ms.saturating_sub(i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX));
        let stats: Vec<_> = dirs
            .iter()
            .map(|dir| timed(self.op_timeout(), session.client.check_stat(dir)))
            .collect();
        let mut empty = Vec::new();
        for (stat, dir) in stats.into_iter().zip(&dirs) {
            match stat.await {
                Ok(Some(stat))
                    if stat.num_children == 0 && stat.ctime <= cutoff && stat.mtime <= cutoff =>
                {
                    empty.push(dir);
                }
                Ok(_) => {}
                Err(err) => return Err(err.into_lock_error(operation)),
            }
        }
        let deletes: Vec<_> = empty
            .iter()
            .map(|dir| timed(self.op_timeout(), session.client.delete(dir, None)))
            .collect();
        let mut removed = 0;
        for delete in deletes {
            match delete.await {
                Ok(()) => removed += 1,
                // A waiter's node arrived, or someone else removed it.
                Err(err) if err.is(&zk::Error::NotEmpty) || err.is(&zk::Error::NoNode) => {}
                Err(err) => return Err(err.into_lock_error(operation)),
            }
        }
        Ok(GcReport {
            removed,
            scanned: u64::try_from(dirs.len()).unwrap_or(u64::MAX),
            // Tokens are `czxid`s: global, never reset by a removal.
            token_floor: None,
        })
    }
}

/// The bounds of one page of a listing (`list`, `list_shared`,
/// `list_elections`): the children of one parent directory that are
/// escaped keys, in escaped-name order, after the cursor, starting with
/// the prefix, at most `limit`.
pub(super) struct PageBounds<'a> {
    prefix: &'a str,
    after: Option<&'a str>,
    limit: usize,
}

impl<'a> PageBounds<'a> {
    /// Checks `limit` and `cursor` (before any request is sent).
    pub(super) fn new(
        prefix: &'a str,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> Result<Self, LockError> {
        check_list_limit(limit).map_err(|e| e.with_backend(NAME))?;
        let after = cursor.map(parse_cursor).transpose()?;
        Ok(Self {
            prefix,
            after,
            limit,
        })
    }

    /// The page's keys among `keys` (escaped name, key), and the cursor of
    /// the next page while more matching directories remain.
    pub(super) fn select(
        &self,
        mut keys: Vec<(String, LockKey)>,
    ) -> (Vec<(String, LockKey)>, Option<String>) {
        keys.retain(|(name, key)| {
            self.after.is_none_or(|a| name.as_str() > a) && key.as_str().starts_with(self.prefix)
        });
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        let more = keys.len() > self.limit;
        keys.truncate(self.limit);
        let next = if more {
            keys.last()
                .map(|(name, _)| format!("{CURSOR_PREFIX}{name}"))
        } else {
            None
        };
        (keys, next)
    }
}

/// The children of a parent directory that are escaped keys (see
/// [`paths::key_of_component`]), with their keys.
pub(super) fn escaped_keys(children: Vec<String>) -> Vec<(String, LockKey)> {
    children
        .into_iter()
        .filter_map(|name| paths::key_of_component(&name).map(|key| (name, key)))
        .collect()
}

/// The escaped name a `list` cursor continues after.
fn parse_cursor(text: &str) -> Result<&str, LockError> {
    text.strip_prefix(CURSOR_PREFIX)
        .filter(|name| paths::key_of_component(name).is_some())
        .ok_or_else(|| {
            LockError::invalid_argument(
                Operation::Inspect,
                format!("{text:?} is not a list cursor of the ZooKeeper backend"),
            )
            .with_backend(NAME)
        })
}
