//! `holders` and `list_shared` of read-write locks and semaphores (see
//! `shared.rs`): a directory's children and data (sent together), the
//! holders they make by Curator's predicates, then one pipelined `getData`
//! of each holder's first node: its `czxid` (the token, where the
//! directory does not give it) and its holder details (the node's data,
//! `<owner hex>\n<details>` as a mutex node's).

use std::future::Future;
use std::time::Duration;

use lock_core::{
    ErrorKind, FencingToken, HolderInfo, LeaseKind, ListQuery, LockError, LockKey, LockShape,
    Operation, OwnerId, SharedLockInfo, SharedPage,
};
use tokio::time::Instant;
use zookeeper_client as zk;

use std::sync::Arc;

use super::nodes::{Held, LEASES, epoch_of, limit_of, rw_blocker, sorted_rw_nodes};
use crate::admin::pages::{PageBounds, escaped_keys};
use crate::connection::Connection;
use crate::error::{CallError, NAME, timed};
use crate::expiry::Expiry;
use crate::keys::{self, LEASE_NAME, RW_PARENT, SEM_PARENT, owner_of, sequence_named};

/// A directory's children and data, and the stored epoch (a read-write
/// lock's epoch node, 0 when none or not asked); `None` when the
/// directory does not exist.
type Listing = Option<(Vec<String>, Vec<u8>, u64)>;

/// Sends a `getChildren` and a `getData` of `dir`, and a `getData` of
/// `epoch` (a read-write lock's epoch node) when given, at once (every
/// request leaves before the returned future is polled).
fn read_dir<'a>(
    client: &'a zk::Client,
    dir: &str,
    epoch: Option<&str>,
    timeout: Duration,
) -> impl Future<Output = Result<Listing, CallError>> + Send + 'a {
    let children = timed(timeout, client.list_children(dir));
    let data = timed(timeout, client.get_data(dir));
    let stored = epoch.map(|path| timed(timeout, client.get_data(path)));
    async move {
        let children = match children.await {
            Ok(children) => children,
            Err(err) if err.is(&zk::Error::NoNode) => return Ok(None),
            Err(err) => return Err(err),
        };
        let stored = match stored {
            Some(read) => match read.await {
                Ok((data, _)) => epoch_of(&data),
                Err(err) if err.is(&zk::Error::NoNode) => 0,
                Err(err) => return Err(err),
            },
            None => 0,
        };
        match data.await {
            Ok((data, _)) => Ok(Some((children, data, stored))),
            Err(err) if err.is(&zk::Error::NoNode) => Ok(None),
            Err(err) => Err(err),
        }
    }
}

/// The holders of a `shape` directory with `children` and `data`, in
/// grant order: a read-write lock's writer or readers (readers carry the
/// epoch: the greater of `stored`, the epoch node's, and the directory's
/// data), a semaphore's permit holders (a grant of several permits is
/// several nodes; the nodes past the limit are a waiter's).
fn held_of(shape: LockShape, children: Vec<String>, data: &[u8], stored: u64) -> Vec<Held> {
    match shape {
        LockShape::ReadWrite => {
            let epoch = epoch_of(data).max(stored);
            let nodes = sorted_rw_nodes(children);
            let mut held = Vec::new();
            for (index, node) in nodes.iter().enumerate() {
                if rw_blocker(&nodes, index).is_none() {
                    if node.write {
                        held.push((vec![node.name.clone()], LeaseKind::Write, None));
                    } else {
                        held.push((vec![node.name.clone()], LeaseKind::Read, Some(epoch)));
                    }
                }
            }
            held
        }
        LockShape::Semaphore => {
            let limit = limit_of(data).unwrap_or(u32::MAX);
            let mut nodes: Vec<(i64, String)> = children
                .into_iter()
                .filter_map(|n| sequence_named(&n, LEASE_NAME).map(|s| (s, n)))
                .collect();
            nodes.sort();
            let mut groups: Vec<(Option<OwnerId>, Vec<String>)> = Vec::new();
            for (_, name) in nodes {
                let owner = owner_of(&name);
                match groups
                    .iter_mut()
                    .find(|(o, _)| owner.is_some() && *o == owner)
                {
                    Some((_, names)) => names.push(name),
                    None => groups.push((owner, vec![name])),
                }
            }
            let mut held: Vec<Held> = Vec::new();
            let mut total: u32 = 0;
            for (_, names) in groups {
                let count = u32::try_from(names.len()).unwrap_or(u32::MAX);
                if total.saturating_add(count) > limit {
                    break;
                }
                total += count;
                let kind = LeaseKind::Permits {
                    count,
                    limit: if limit == u32::MAX { count } else { limit },
                };
                held.push((names, kind, None));
            }
            held
        }
        _ => Vec::new(),
    }
}

/// `holders` and `list_shared` of read-write locks and semaphores.
#[derive(Clone)]
pub(crate) struct SharedListing {
    conn: Arc<Connection>,
    expiry: Expiry,
}

impl SharedListing {
    pub(crate) fn new(conn: Arc<Connection>, expiry: Expiry) -> Self {
        Self { conn, expiry }
    }

    /// The directory whose children are the nodes of `shape` locks, and
    /// the child of a key's directory they are in (a semaphore's
    /// `leases`).
    fn shape_parent(&self, shape: LockShape) -> Option<(String, Option<&'static str>)> {
        let root = self.conn.config().root();
        match shape {
            LockShape::ReadWrite => Some((format!("{root}/{RW_PARENT}"), None)),
            LockShape::Semaphore => Some((format!("{root}/{SEM_PARENT}"), Some(LEASES))),
            _ => None,
        }
    }

    /// Sends one `getData` of each holder's first node in `dir` (all before
    /// the returned future is polled); it reports each holder still there.
    fn read_holders<'a>(
        &'a self,
        client: &'a zk::Client,
        dir: &str,
        held: Vec<Held>,
    ) -> impl Future<Output = Result<Vec<HolderInfo>, CallError>> + Send + 'a {
        let timeout = self.conn.op_timeout();
        let reads: Vec<_> = held
            .into_iter()
            .map(|(names, kind, token)| {
                let read = timed(timeout, client.get_data(&format!("{dir}/{}", names[0])));
                (names, kind, token, read)
            })
            .collect();
        async move {
            let clock = self.expiry.clock();
            let mut out = Vec::with_capacity(reads.len());
            for (names, kind, token, read) in reads {
                let (data, stat) = match read.await {
                    Ok(found) => found,
                    // Released while we looked.
                    Err(err) if err.is(&zk::Error::NoNode) => continue,
                    Err(err) => return Err(err),
                };
                let first = &names[0];
                let token = token.or_else(|| u64::try_from(stat.czxid).ok());
                let owner = owner_of(first);
                let now = Instant::now();
                let remaining_ttl = owner.and_then(|o| {
                    self.expiry
                        .shared()
                        .tracked(o, |t| clock.remaining(t.due, now))
                });
                out.push(HolderInfo {
                    details: keys::details_of_data(&data),
                    kind,
                    holder: owner.map_or_else(|| first.clone(), OwnerId::to_hex),
                    token: token.map(FencingToken::new),
                    remaining_ttl,
                });
            }
            Ok(out)
        }
    }

    /// `holders` of a read-write lock or a semaphore: the directory's
    /// children and data, then each holder's first node (2 round trips).
    pub(crate) async fn shared_holders(
        &self,
        key: &LockKey,
        shape: LockShape,
    ) -> Result<Vec<HolderInfo>, LockError> {
        let op = Operation::Inspect;
        if self.shape_parent(shape).is_none() {
            return Ok(Vec::new());
        }
        let session = self.conn.session(op).await.map_err(|e| e.with_key(key))?;
        let client = &session.client;
        let fail = |err: CallError| err.into_lock_error(op).with_key(key);
        let root = self.conn.config().root();
        let (dir, epoch) = match shape {
            LockShape::ReadWrite => (
                keys::rw_dir(root, key),
                Some(keys::rw_epoch_path(root, key)),
            ),
            _ => (format!("{}/{LEASES}", keys::sem_dir(root, key)), None),
        };
        let Some((children, data, stored)) =
            read_dir(client, &dir, epoch.as_deref(), self.conn.op_timeout())
                .await
                .map_err(fail)?
        else {
            return Ok(Vec::new());
        };
        let held = held_of(shape, children, &data, stored);
        self.read_holders(client, &dir, held).await.map_err(fail)
    }

    /// `list_shared` of read-write locks or semaphores: one `getChildren`
    /// of the shape's `.` directory, then the key directories of the page
    /// (bounded and paged as `list`), each's children and data (and a
    /// read-write lock's epoch node) pipelined, then every holder's
    /// first node pipelined: at most `5 × limit + 1` requests plus one per
    /// holder, in 3 round trips.
    pub(crate) async fn list_shared_page(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        let (prefix, cursor, limit) = query.parts();
        let op = Operation::Inspect;
        let Some((parent, child)) = self.shape_parent(shape) else {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                op,
                format!("{NAME} does not list {shape} locks"),
            )
            .with_backend(NAME));
        };
        let bounds = PageBounds::new(prefix, cursor, limit)?;
        let session = self.conn.session(op).await?;
        let client = &session.client;
        let children = self.conn.children_of(&session, &parent, op).await?;
        let (keys, next) = bounds.select(escaped_keys(children));
        let dirs: Vec<String> = keys
            .iter()
            .map(|(name, _)| key_nodes_dir(&parent, name, child))
            .collect();
        let timeout = self.conn.op_timeout();
        // Pipelined: every request is sent when its call is made.
        let root = self.conn.config().root();
        let epochs: Vec<Option<String>> = keys
            .iter()
            .map(|(name, _)| {
                (shape == LockShape::ReadWrite).then(|| keys::rw_epoch_path_of(root, name))
            })
            .collect();
        let listings: Vec<_> = dirs
            .iter()
            .zip(&epochs)
            .map(|(d, epoch)| read_dir(client, d, epoch.as_deref(), timeout))
            .collect();
        let mut held = Vec::with_capacity(listings.len());
        for (listing, (_, key)) in listings.into_iter().zip(&keys) {
            held.push(match listing.await {
                Ok(Some((children, data, stored))) => held_of(shape, children, &data, stored),
                Ok(None) => Vec::new(),
                Err(err) => return Err(err.into_lock_error(op).with_key(key)),
            });
        }
        let reads: Vec<_> = held
            .into_iter()
            .zip(&dirs)
            .map(|(held, dir)| self.read_holders(client, dir, held))
            .collect();
        let mut page = SharedPage::default();
        for (read, (_, key)) in reads.into_iter().zip(&keys) {
            let holders = read
                .await
                .map_err(|err| err.into_lock_error(op).with_key(key))?;
            if !holders.is_empty() {
                page.locks.push(SharedLockInfo {
                    key: key.clone(),
                    holders,
                });
            }
        }
        page.cursor = next;
        Ok(page)
    }
}

/// The directory of a key's nodes: `<parent>/<escaped key>[/<child>]`.
fn key_nodes_dir(parent: &str, escaped: &str, child: Option<&str>) -> String {
    match child {
        Some(child) => format!("{parent}/{escaped}/{child}"),
        None => format!("{parent}/{escaped}"),
    }
}
