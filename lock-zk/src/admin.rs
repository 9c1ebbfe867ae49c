//! Operating locks: `inspect`'s holder look-up (with the holder details in
//! the lock node's data), `list` of the root's key directories, `force_release`
//! and `gc` of empty key directories. See the crate docs, "Operating locks".

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lock_core::election::ElectionPage;
use lock_core::{
    ErrorKind, GcReport, ListQuery, LockError, LockInfo, LockKey, LockPage, LockShape, Operation,
    SharedPage, WatchRequest,
};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::cleanup::Cleanup;
use crate::connection::{Connection, lock};
use crate::elections::Elections;
use crate::error::{CallError, NAME, timed};
use crate::grants::Grants;
use crate::keys;
use crate::shared::list::SharedListing;

// Paging over the root's children, shared with the shapes' and the
// elections' listings.
pub(crate) mod pages;
use pages::{PageBounds, escaped_keys};

/// The most key directories one `gc` call examines.
pub(crate) const GC_SCAN: usize = 1000;

/// The operating facets: `Admin` (`force_release`, `gc`), `Listing`
/// (mutexes here; read-write locks, semaphores and elections from their
/// components) and `HolderWatch`.
pub(crate) struct Admin {
    conn: Arc<Connection>,
    cleanup: Cleanup,
    grants: Grants,
    shared: SharedListing,
    elections: Elections,
    /// The escaped name of the last key directory `gc` examined: the next
    /// call goes on from there.
    gc_cursor: Mutex<Option<String>>,
}

impl Admin {
    pub(crate) fn new(
        (conn, cleanup): (Arc<Connection>, Cleanup),
        grants: Grants,
        shared: SharedListing,
        elections: Elections,
    ) -> Self {
        Self {
            conn,
            cleanup,
            grants,
            shared,
            elections,
            gc_cursor: Mutex::new(None),
        }
    }

    /// Waits until `key`'s holder is no longer `seen` (or `deadline`),
    /// waking on a ZooKeeper watch armed before each read: of the key
    /// directory's children (a holder or waiter comes or goes), or of the
    /// directory's creation while it does not exist. No polling.
    pub(crate) async fn watch_holder_in(
        &self,
        key: &LockKey,
        seen: Option<&LockInfo>,
        deadline: Instant,
    ) -> Result<Option<LockInfo>, LockError> {
        let op = Operation::Inspect;
        let dir = self.conn.checked_key_path(key, op)?;
        loop {
            let session = self.conn.session(op).await.map_err(|e| e.with_key(key))?;
            let fail = |err: CallError| err.into_lock_error(op).with_key(key);
            let client = &session.client;
            let watcher =
                match timed(self.conn.op_timeout(), client.list_and_watch_children(&dir)).await {
                    Ok((_, watcher)) => watcher,
                    Err(err) if err.is(&zk::Error::NoNode) => {
                        match timed(self.conn.op_timeout(), client.check_and_watch_stat(&dir))
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
                .grants
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
                () = crate::waiting::wait_lost(&mut state) => {}
                () = tokio::time::sleep_until(deadline) => return Ok(now),
            }
        }
    }

    /// The keys of the root's children this backend's mutexes live in,
    /// sorted by their escaped names: every escaped key in the default
    /// layout; in the path layout only the library's own keys (the others
    /// live at their paths, outside the root).
    fn root_keys(&self, children: Vec<String>) -> Vec<(String, LockKey)> {
        let layout = self.conn.config().layout();
        let mut keys = escaped_keys(children);
        keys.retain(|(_, key)| keys::layout_of(layout, key.as_str()) == crate::ZkLayout::Escaped);
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        keys
    }

    /// `list`: one `getChildren` of the root, then the key directories
    /// after the cursor whose key starts with `prefix`, at most `limit` of
    /// them: one pipelined `getChildren` each, then one pipelined
    /// `getData` of each lowest contender.
    pub(crate) async fn list_page(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        let (prefix, cursor, limit) = query.parts();
        let bounds = PageBounds::new(prefix, cursor, limit)?;
        let session = self.conn.session(Operation::Inspect).await?;
        let root = self.conn.config().root();
        let children = self
            .conn
            .children_of(&session, root, Operation::Inspect)
            .await?;
        let (keys, next) = bounds.select(self.root_keys(children));
        let dirs: Vec<String> = keys
            .iter()
            .map(|(name, _)| format!("{root}/{name}"))
            .collect();
        // Pipelined: the client sends each request when it is called.
        let listings: Vec<_> = dirs
            .iter()
            .map(|dir| timed(self.conn.op_timeout(), session.client.list_children(dir)))
            .collect();
        let mut heads = Vec::with_capacity(keys.len());
        for listing in listings {
            heads.push(match listing.await {
                Ok(children) => keys::sorted_mutex_contenders(children).into_iter().next(),
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
                    timed(self.conn.op_timeout(), session.client.get_data(&path))
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
                    .push(self.grants.holder_info(key, seq, name, &data, &stat)),
                // The holder left between the two reads: look at the key again.
                Err(err) if err.is(&zk::Error::NoNode) => {
                    if let Some(found) = self
                        .grants
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
    pub(crate) async fn break_holder(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let operation = Operation::Release;
        let session = self
            .conn
            .session(operation)
            .await
            .map_err(|e| e.with_key(key))?;
        let dir = self.conn.checked_key_path(key, operation)?;
        for _ in 0..crate::grants::LOOKS {
            let Some(found) = self
                .grants
                .holder_in(&session, key, &dir, operation)
                .await?
            else {
                return Ok(None);
            };
            match timed(
                self.conn.op_timeout(),
                session.client.delete(&found.path, None),
            )
            .await
            {
                Ok(()) => {
                    tracing::warn!(%key, node = %found.path, holder = %found.info.holder,
                        token = ?found.info.token, "lock broken by force_release");
                    self.cleanup.remove_empty_dir(&session.client, &dir).await;
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
    pub(crate) async fn collect_empty_dirs(
        &self,
        older_than: Duration,
    ) -> Result<GcReport, LockError> {
        let operation = Operation::Release;
        let session = self.conn.session(operation).await?;
        let root = self.conn.config().root();
        let children = self.conn.children_of(&session, root, operation).await?;
        let keys = self.root_keys(children);
        let start = {
            let cursor = lock(&self.gc_cursor);
            cursor.as_deref().map_or(0, |after| {
                keys.partition_point(|(name, _)| name.as_str() <= after)
            })
        };
        let count = keys.len().min(GC_SCAN);
        let dirs: Vec<String> = (0..count)
            .map(|i| format!("{root}/{}", keys[(start + i) % keys.len()].0))
            .collect();
        *lock(&self.gc_cursor) = dirs
            .last()
            .and_then(|dir| dir.rsplit('/').next().map(str::to_owned));
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let cutoff =
            now_ms.saturating_sub(i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX));
        let stats: Vec<_> = dirs
            .iter()
            .map(|dir| timed(self.conn.op_timeout(), session.client.check_stat(dir)))
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
            .map(|dir| timed(self.conn.op_timeout(), session.client.delete(dir, None)))
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

#[async_trait]
impl lock_core::Admin for Admin {
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.break_holder(key).await
    }

    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError> {
        self.collect_empty_dirs(older_than).await
    }
}

#[async_trait]
impl lock_core::Listing for Admin {
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        self.list_page(query).await
    }

    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        match shape {
            LockShape::Mutex => lock_core::list_mutex_shared(self, query).await,
            _ => self.shared.list_shared_page(shape, query).await,
        }
    }

    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        // The latch directories (see elections.rs), not the generic
        // election's mutexes.
        self.elections.list_latches(query).await
    }
}

#[async_trait]
impl lock_core::HolderWatch for Admin {
    async fn watch_holder(
        &self,
        request: WatchRequest<'_, LockInfo>,
    ) -> Result<Option<LockInfo>, LockError> {
        // A ZooKeeper watch, never polling.
        self.watch_holder_in(request.key, request.seen, request.deadline)
            .await
    }
}
