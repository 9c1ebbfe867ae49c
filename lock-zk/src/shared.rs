//! Read-write locks and semaphores, in the layouts of Curator's
//! `InterProcessReadWriteLock` and `InterProcessSemaphoreV2` (see the crate
//! docs for the layout and what each token promises).
//!
//! - **Read-write lock** of key K: `<root>/.rwlock/<escaped K>` holds
//!   `EPHEMERAL_SEQUENTIAL` nodes `_c_<id>-__READ__<seq>` and
//!   `_c_<id>-__WRIT__<seq>`, sorted on the digits after the name. A writer
//!   holds when its node is the first of all; a reader when no write node
//!   comes before it. A waiting writer watches the node just before it, a
//!   waiting reader the first write node (both as Curator does). The
//!   directory's data is the token of the last write grant (the epoch
//!   readers carry).
//! - **Semaphore** of key K: `<root>/.semaphore/<escaped K>/locks` is a
//!   mutex (the mutex recipe), held while acquiring;
//!   `<root>/.semaphore/<escaped K>/leases` holds `_c_<id>-lease-<seq>`
//!   nodes. Holding the mutex, the acquirer creates its lease nodes and
//!   waits (still holding it) until the directory has at most `limit`
//!   children. The `leases` directory's data is the limit our clients use.

use std::future::Future;
use std::time::Duration;

use lock_core::{
    ErrorKind, Lease, LeaseKind, LockError, LockKey, LockShape, Operation, OwnerId, check_ttl,
    validity_deadline,
};
use tokio::time::{Instant, sleep_until};
use zookeeper_client as zk;

use super::session::{Session, session_gone, synced};
use super::waiting::{AttemptError, bounded_wait, granted, to_token, wait_lost};
use super::{MIN_TTL, ZkBackend, lock};
use crate::error::{CallError, NAME, timed, timed_resending};
use crate::paths::{self, LEASE_NAME, READ_NAME, WRITE_NAME, sequence_named};

// The read-write lock's attempt.
#[path = "shared_rw.rs"]
mod rw;

// The semaphore's attempt and lease nodes.
#[path = "shared_sem.rs"]
mod sem;

// `holders` and `list_shared` of both shapes.
#[path = "shared_list.rs"]
mod list;

/// How long a `try_acquire_kind` of permits waits for the semaphore's
/// internal mutex, which other acquirers hold for a few round trips (a
/// waiter holds it until its permits are free: the try then gives up).
const TRY_MUTEX_WAIT: Duration = Duration::from_millis(1_000);

/// The `locks` child of a semaphore directory (Curator's `LOCK_PARENT`).
const LOCKS: &str = "locks";
/// The `leases` child of a semaphore directory (Curator's `LEASE_PARENT`).
const LEASES: &str = "leases";

/// The nodes a shared lease names (from its kind, key, owner and data).
pub(super) struct SharedNodes {
    /// The directory the nodes are in.
    pub(super) dir: String,
    /// The nodes' paths.
    pub(super) paths: Vec<String>,
    /// The first node's `czxid` (renewals confirm it).
    pub(super) czxid: i64,
}

/// Nodes to delete when an acquire ends without a grant (at once, or in
/// the background when the future is dropped): nodes created, and
/// directories to sweep for an owner whose create's outcome is unknown.
struct Pending {
    backend: ZkBackend,
    client: zk::Client,
    nodes: Vec<(String, String, OwnerId)>,
    sweeps: Vec<(String, OwnerId)>,
}

impl Pending {
    fn new(backend: &ZkBackend, client: &zk::Client) -> Self {
        Self {
            backend: backend.clone(),
            client: client.clone(),
            nodes: Vec::new(),
            sweeps: Vec::new(),
        }
    }

    /// Deletes everything now (bounded); what fails stays for the
    /// background cleanup at drop.
    async fn withdraw(&mut self) {
        let timeout = self.backend.op_timeout();
        let mut left = Vec::new();
        // Newest first: a semaphore's lease nodes before its mutex, so the
        // next acquirer does not count them.
        for (dir, path, owner) in std::mem::take(&mut self.nodes).into_iter().rev() {
            match timed(timeout, self.client.delete(&path, None)).await {
                Ok(()) => {}
                Err(err) if err.is(&zk::Error::NoNode) || err.ends_session() => {}
                Err(_) => left.push((dir, path, owner)),
            }
        }
        left.reverse();
        self.nodes = left;
        for (dir, owner) in std::mem::take(&mut self.sweeps) {
            lock(&self.backend.inner.uncertain).insert(owner);
            self.backend
                .sweep_uncertain(&self.client, &dir, owner, false)
                .await;
        }
    }

    /// Keeps nothing: the nodes are granted.
    fn disarm(&mut self) {
        self.nodes.clear();
        self.sweeps.clear();
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.nodes.is_empty() && self.sweeps.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.backend.clone();
        let client = self.client.clone();
        let nodes = std::mem::take(&mut self.nodes);
        let sweeps = std::mem::take(&mut self.sweeps);
        runtime.spawn(async move {
            for (dir, path, owner) in nodes.into_iter().rev() {
                backend.delete_node(&client, &path, &dir, owner).await;
            }
            for (dir, owner) in sweeps {
                lock(&backend.inner.uncertain).insert(owner);
                backend.sweep_uncertain(&client, &dir, owner, true).await;
            }
        });
    }
}

/// Waits for `watcher`'s event (the caller then looks again); ends the
/// attempt when the session is lost, and at `deadline` withdraws `pending`
/// and fails `Contended` with `why` (for `key`, in `operation`).
async fn wait_watched(
    session: &Session,
    watcher: zk::OneshotWatcher,
    deadline: Instant,
    pending: &mut Pending,
    (operation, key, why): (Operation, &LockKey, &str),
) -> Result<(), AttemptError> {
    let mut state = session.state.clone();
    tokio::select! {
        _ = watcher.changed() => Ok(()),
        () = wait_lost(&mut state) => Err(AttemptError::SessionLost),
        () = sleep_until(deadline) => {
            pending.withdraw().await;
            Err(AttemptError::Lock(error(ErrorKind::Contended, operation, key, why)))
        }
    }
}

/// A holder as `holders` finds it: its nodes' names, its kind, its token
/// when known without a look at its node.
type Held = (Vec<String>, LeaseKind, Option<u64>);

/// One node of a read-write lock directory.
struct RwNode {
    seq: i64,
    name: String,
    write: bool,
}

/// The read and write nodes among `children`, in grant order (Curator
/// sorts on the digits after `__READ__` / `__WRIT__`).
fn sorted_rw_nodes(children: Vec<String>) -> Vec<RwNode> {
    let mut nodes: Vec<RwNode> = children
        .into_iter()
        .filter_map(|name| {
            if let Some(seq) = sequence_named(&name, WRITE_NAME) {
                Some(RwNode {
                    seq,
                    name,
                    write: true,
                })
            } else {
                sequence_named(&name, READ_NAME).map(|seq| RwNode {
                    seq,
                    name,
                    write: false,
                })
            }
        })
        .collect();
    nodes.sort_by(|a, b| (a.seq, &a.name).cmp(&(b.seq, &b.name)));
    nodes
}

/// The node `index` waits for, or `None` when it holds: a writer waits
/// for the node just before it, a reader for the first write node before
/// it (Curator's predicates).
fn rw_blocker(nodes: &[RwNode], index: usize) -> Option<&str> {
    if nodes[index].write {
        index.checked_sub(1).map(|i| nodes[i].name.as_str())
    } else {
        nodes[..index]
            .iter()
            .find(|n| n.write)
            .map(|n| n.name.as_str())
    }
}

/// The token in a read-write lock directory's data (0 when none).
fn epoch_of(data: &[u8]) -> u64 {
    std::str::from_utf8(data)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The limit in a `leases` directory's data, if our clients wrote one.
fn limit_of(data: &[u8]) -> Option<u32> {
    std::str::from_utf8(data).ok()?.trim().parse().ok()
}

fn error(
    kind: ErrorKind,
    operation: Operation,
    key: &LockKey,
    why: impl Into<String>,
) -> LockError {
    LockError::new(kind, operation, why)
        .with_key(key)
        .with_backend(NAME)
}

fn seq_u32(seq: i64, operation: Operation, key: &LockKey) -> Result<u32, AttemptError> {
    u32::try_from(seq).map_err(|_| {
        AttemptError::Lock(error(
            ErrorKind::Backend,
            operation,
            key,
            format!("unexpected sequence number {seq}"),
        ))
    })
}

impl ZkBackend {
    /// The directory of `key`'s read-write lock (inside the chroot): point
    /// Curator's `InterProcessReadWriteLock` there to share it.
    pub fn rwlock_path(&self, key: &LockKey) -> String {
        paths::rw_dir(self.inner.config.root(), key)
    }

    /// The path of `key`'s semaphore (inside the chroot): point Curator's
    /// `InterProcessSemaphoreV2` there (with the same limit) to share it.
    pub fn semaphore_path(&self, key: &LockKey) -> String {
        paths::sem_dir(self.inner.config.root(), key)
    }

    /// The nodes of a read, write or permit lease. Its data is
    /// `<seq>[,<seq>...];<czxid of the first node>`.
    pub(super) fn shared_nodes(&self, lease: &Lease) -> Option<SharedNodes> {
        let root = self.inner.config.root();
        let (seqs, czxid) = lease.backend_data().split_once(';')?;
        let czxid: i64 = czxid.parse().ok()?;
        let seqs: Vec<u32> = seqs
            .split(',')
            .map(|s| {
                if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                    None
                } else {
                    s.parse().ok()
                }
            })
            .collect::<Option<_>>()?;
        let (dir, name) = match lease.kind() {
            LeaseKind::Read => (paths::rw_dir(root, lease.key()), READ_NAME),
            LeaseKind::Write => (paths::rw_dir(root, lease.key()), WRITE_NAME),
            LeaseKind::Permits { count, .. } => {
                if usize::try_from(count).ok()? != seqs.len() {
                    return None;
                }
                (
                    format!("{}/{LEASES}", paths::sem_dir(root, lease.key())),
                    LEASE_NAME,
                )
            }
            _ => return None,
        };
        if seqs.is_empty() || (lease.kind().shape() == LockShape::ReadWrite && seqs.len() != 1) {
            return None;
        }
        let paths = seqs
            .iter()
            .map(|seq| paths::named_node_path(&dir, lease.owner(), name, *seq))
            .collect();
        Some(SharedNodes { dir, paths, czxid })
    }

    /// `try_acquire_kind` / `acquire_kind` for read, write and permit
    /// grants: attempts on the live session, retried on a new one as the
    /// mutex's are.
    pub(super) async fn acquire_shared(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Option<Instant>,
        operation: Operation,
    ) -> Result<Option<Lease>, LockError> {
        kind.validate(operation)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        check_ttl(ttl, MIN_TTL, operation).map_err(|e| e.with_key(key).with_backend(NAME))?;
        let root = self.inner.config.root();
        self.retry_attempts(
            key,
            deadline,
            operation,
            "shared acquire attempt",
            move |session| async move {
                match kind {
                    LeaseKind::Read | LeaseKind::Write => {
                        let dir = paths::rw_dir(root, key);
                        self.rw_attempt(&session, key, &dir, kind, ttl, deadline, operation)
                            .await
                    }
                    LeaseKind::Permits { count, limit } => {
                        let base = paths::sem_dir(root, key);
                        self.sem_attempt(
                            &session,
                            key,
                            &base,
                            (count, limit),
                            ttl,
                            deadline,
                            operation,
                        )
                        .await
                    }
                    _ => Err(AttemptError::Lock(error(
                        ErrorKind::InvalidArgument,
                        operation,
                        key,
                        format!("{kind} is not a shared kind"),
                    ))),
                }
            },
        )
        .await
    }

    /// `acquire_kind` for shared kinds: bounded past the deadline like the
    /// mutex's `acquire`, `Contended` at the deadline.
    pub(super) async fn acquire_shared_until(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let attempt = self.acquire_shared(key, kind, ttl, Some(deadline), Operation::Acquire);
        let why = "still held by another owner at the wait deadline";
        bounded_wait(key, deadline, ("wait deadline", why), attempt).await
    }

    /// Creates one `EPHEMERAL_SEQUENTIAL` node at `prefix` in `dir`
    /// (creating the directory when missing). Returns its path, `czxid`
    /// and sequence number, and the future `behind` made right after the
    /// create that succeeded: requests it makes when called leave behind
    /// the create, before its reply is awaited (the server answers them
    /// once the create is applied), so a read of what the create changed
    /// costs no round trip of its own. Its replies are dropped when the
    /// create failed.
    #[allow(clippy::too_many_arguments)]
    async fn create_sequential<B: Future>(
        &self,
        session: &Session,
        dir: &str,
        prefix: &str,
        data: &[u8],
        operation: Operation,
        key: &LockKey,
        mut behind: impl FnMut() -> B,
    ) -> Result<(String, i64, i64, B), AttemptError> {
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let mut missing_dir = 0;
        loop {
            let created = timed(
                self.op_timeout(),
                session.client.create(prefix, data, &options),
            );
            let behind = behind();
            match created.await {
                Ok((stat, sequence)) => {
                    let path = format!("{prefix}{sequence}");
                    return Ok((path, stat.czxid, sequence.into_i64(), behind));
                }
                Err(err) if err.is(&zk::Error::NoNode) && missing_dir < 3 => {
                    missing_dir += 1;
                    self.ensure_dir(session, dir, operation, key).await?;
                }
                Err(err) => return Err(Self::fail(session, err, operation, key)),
            }
        }
    }

    /// `renew` of a read, write or permit lease: its nodes still exist
    /// (from the leader's view), with the grant's `czxid`, on this
    /// backend's session, and its TTL has not run out.
    pub(super) async fn renew_shared(&self, lease: &Lease) -> Result<Instant, LockError> {
        let op = Operation::Renew;
        let key = lease.key();
        let not_held = |why: &str| error(ErrorKind::NotHeld, op, key, why.to_owned());
        let Some(nodes) = self.shared_nodes(lease) else {
            return Err(not_held(
                "the lease does not name nodes of its key and owner",
            ));
        };
        if session_gone(lease) {
            return Err(not_held(
                "the ZooKeeper session that held this lease is gone",
            ));
        }
        let session = self.session(op).await.map_err(|e| e.with_key(key))?;
        let sent = Instant::now();
        let ours = lease
            .session()
            .is_some_and(|s| s.same_channel(&session.state));
        let clock = self.inner.clock;
        if ours
            && !self
                .tracked_shared(lease.owner(), |t| !clock.passed(t.due, sent))
                .unwrap_or(false)
        {
            return Err(not_held(
                "the lease's TTL ran out before this renewal; its nodes are deleted",
            ));
        }
        let client = &session.client;
        let read = async {
            let calls: Vec<_> = nodes.paths.iter().map(|p| client.check_stat(p)).collect();
            let mut stats = Vec::with_capacity(calls.len());
            for call in calls {
                stats.push(call.await?);
            }
            Ok::<_, zk::Error>(stats)
        };
        let stats = synced(client.sync(&nodes.dir), self.op_timeout(), read)
            .await
            .map_err(|err| err.into_lock_error(op).with_key(key))?;
        if stats.iter().any(Option::is_none) {
            self.forget_shared(lease.owner());
            return Err(not_held(
                "the lease's node is gone (released, expired, or deleted)",
            ));
        }
        let stats: Vec<zk::Stat> = stats.into_iter().flatten().collect();
        if stats[0].czxid != nodes.czxid {
            return Err(not_held("the lease's node was re-created: not this grant"));
        }
        if stats.iter().any(|s| s.ephemeral_owner != session.id) {
            return Err(error(
                ErrorKind::Unsupported,
                op,
                key,
                "the lease's nodes belong to another ZooKeeper session: they live as long as \
                 that session and can be released, but not renewed, from here",
            ));
        }
        let ttl = lease.ttl().min(session.timeout);
        let extended = self
            .tracked_shared(lease.owner(), |t| {
                if clock.passed(t.due, sent) {
                    return false;
                }
                if clock.passed(t.due, sent + ttl) {
                    t.due = clock.deadline(sent + ttl);
                }
                true
            })
            .unwrap_or(false);
        if !extended {
            return Err(not_held(
                "the lease's TTL ran out before this renewal; its nodes are deleted",
            ));
        }
        Ok(validity_deadline(sent, ttl))
    }

    /// `release` of a read, write or permit lease: deletes its nodes.
    pub(super) async fn release_shared(&self, lease: &Lease) -> Result<bool, LockError> {
        let op = Operation::Release;
        let Some(nodes) = self.shared_nodes(lease) else {
            return Ok(false);
        };
        let session = self
            .session(op)
            .await
            .map_err(|e| e.with_key(lease.key()))?;
        let calls: Vec<_> = nodes
            .paths
            .iter()
            .map(|p| timed_resending(self.op_timeout(), || session.client.delete(p, None)))
            .collect();
        let mut deleted = false;
        let mut failure = None;
        for call in calls {
            match call.await {
                Ok(()) => deleted = true,
                Err(err) if err.is(&zk::Error::NoNode) => {}
                Err(err) => failure = Some(err),
            }
        }
        if let Some(err) = failure {
            // The local expiry stays armed: it deletes the rest later.
            return Err(err.into_lock_error(op).with_key(lease.key()));
        }
        self.forget_shared(lease.owner());
        self.remove_empty_dir(&session.client, &nodes.dir).await;
        Ok(deleted)
    }

    /// `downgrade`: one transaction creates a read node named with the
    /// write node's sequence number (so it sorts where the write node was,
    /// before every waiter, as Curator 5.5+ names a read lock taken by the
    /// write lock's owner) and deletes the write node. No writer can come
    /// between: the read node exists before the write node goes.
    pub(super) async fn downgrade_write(&self, lease: &Lease) -> Result<Lease, LockError> {
        let op = Operation::Downgrade;
        let key = lease.key();
        let not_held = |why: &str| error(ErrorKind::NotHeld, op, key, why.to_owned());
        if lease.kind() != LeaseKind::Write {
            return Err(not_held("only a write lease can be downgraded"));
        }
        let Some(nodes) = self.shared_nodes(lease) else {
            return Err(not_held("the lease does not name a write node of its key"));
        };
        if session_gone(lease) {
            return Err(not_held(
                "the ZooKeeper session that held this lease is gone",
            ));
        }
        let session = self.session(op).await.map_err(|e| e.with_key(key))?;
        if !lease
            .session()
            .is_some_and(|s| s.same_channel(&session.state))
        {
            return Err(not_held(
                "the write lease is not of this backend's current session",
            ));
        }
        let sent = Instant::now();
        let clock = self.inner.clock;
        if !self
            .tracked_shared(lease.owner(), |t| !clock.passed(t.due, sent))
            .unwrap_or(false)
        {
            return Err(not_held("the write lease's TTL ran out"));
        }
        let write_path = &nodes.paths[0];
        let seq = lease
            .backend_data()
            .split_once(';')
            .and_then(|(s, _)| s.parse::<u32>().ok())
            .ok_or_else(|| not_held("bad lease data"))?;
        let owner = self.inner.owners.next();
        let read_path = paths::named_node_path(&nodes.dir, owner, READ_NAME, seq);
        let ttl = lease.ttl().min(session.timeout);
        // Tracked before the transaction is sent: if its outcome is
        // unknown, the read node is still deleted at its TTL.
        self.schedule_shared(owner, vec![read_path.clone()], sent + ttl);
        let options = zk::CreateMode::Ephemeral.with_acls(self.acls());
        let mut writer = session.client.new_multi_writer();
        let data = paths::mutex_node_data(owner);
        let added = writer
            .add_create(&read_path, data.as_bytes(), &options)
            .and_then(|()| writer.add_delete(write_path, None));
        if let Err(err) = added {
            self.forget_shared(owner);
            return Err(CallError::Zk(err).into_lock_error(op).with_key(key));
        }
        let timeout = self.op_timeout();
        let results = match tokio::time::timeout(timeout, writer.commit()).await {
            Err(_) => {
                return Err(CallError::TimedOut(timeout)
                    .into_lock_error(op)
                    .with_key(key));
            }
            Ok(Err(zk::MultiWriteError::OperationFailed {
                source: zk::Error::NoNode,
                ..
            })) => {
                self.forget_shared(owner);
                return Err(not_held("the write node is gone"));
            }
            Ok(Err(err)) => {
                let err = CallError::Zk(zk::Error::from(err));
                if !err.outcome_unknown() {
                    self.forget_shared(owner);
                }
                return Err(err.into_lock_error(op).with_key(key));
            }
            Ok(Ok(results)) => results,
        };
        drop(results);
        self.forget_shared(lease.owner());
        // A multi's create answers without a stat: read the node's czxid
        // (renewals confirm it).
        let czxid = match timed(timeout, session.client.check_stat(&read_path)).await {
            Ok(Some(stat)) => stat.czxid,
            Ok(None) => {
                self.forget_shared(owner);
                return Err(not_held("the read node vanished right after the downgrade"));
            }
            Err(err) => return Err(err.into_lock_error(op).with_key(key)),
        };
        let read = Lease::granted(
            key.clone(),
            owner,
            lease.token(),
            ttl,
            sent,
            format!("{seq};{czxid}"),
        )
        .map_err(|e| e.with_backend(NAME))?
        .with_kind(LeaseKind::Read)
        .with_session(session.state.clone());
        Ok(read)
    }
}
