//! What the read-write lock, the semaphore and their listing share: the
//! nodes a shared lease names, nodes to withdraw when an acquire ends
//! without a grant, the read-write order, and the shared create.

use std::future::Future;
use std::time::Duration;

use lock_core::{ErrorKind, LeaseKind, LockError, LockKey, Operation, OwnerId};
use tokio::time::{Instant, sleep_until};
use zookeeper_client as zk;

use crate::cleanup::Cleanup;
use crate::connection::{Connection, Session};
use crate::error::{NAME, timed};
use crate::keys::{READ_NAME, WRITE_NAME, sequence_named};
use crate::waiting::{AttemptError, Waiting, fail, wait_lost};

/// How long a `try_acquire_kind` of permits waits for the semaphore's
/// internal mutex, which other acquirers hold for a few round trips (a
/// waiter holds it until its permits are free: the try then gives up).
pub(crate) const TRY_MUTEX_WAIT: Duration = Duration::from_millis(1_000);

/// The `locks` child of a semaphore directory (Curator's `LOCK_PARENT`).
pub(crate) const LOCKS: &str = "locks";
/// The `leases` child of a semaphore directory (Curator's `LEASE_PARENT`).
pub(crate) const LEASES: &str = "leases";

/// The nodes a shared lease names (from its kind, key, owner and data).
pub(crate) struct SharedNodes {
    /// The directory the nodes are in.
    pub(crate) dir: String,
    /// The nodes' paths.
    pub(crate) paths: Vec<String>,
    /// The first node's `czxid` (renewals confirm it).
    pub(crate) czxid: i64,
}

/// Nodes to delete when an acquire ends without a grant (at once, or in
/// the background when the future is dropped): nodes created, and
/// directories to sweep for an owner whose create's outcome is unknown.
pub(crate) struct Pending {
    cleanup: Cleanup,
    client: zk::Client,
    pub(crate) nodes: Vec<(String, String, OwnerId)>,
    pub(crate) sweeps: Vec<(String, OwnerId)>,
}

impl Pending {
    pub(crate) fn new(cleanup: &Cleanup, client: &zk::Client) -> Self {
        Self {
            cleanup: cleanup.clone(),
            client: client.clone(),
            nodes: Vec::new(),
            sweeps: Vec::new(),
        }
    }

    /// Deletes everything now (bounded); what fails stays for the
    /// background cleanup at drop.
    pub(crate) async fn withdraw(&mut self) {
        let timeout = self.cleanup.conn().op_timeout();
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
            self.cleanup.mark_uncertain(owner);
            self.cleanup
                .sweep_uncertain(&self.client, &dir, owner, false)
                .await;
        }
    }

    /// Keeps nothing: the nodes are granted.
    pub(crate) fn disarm(&mut self) {
        self.nodes.clear();
        self.sweeps.clear();
    }

    /// Waits for `watcher`'s event (the caller then looks again); ends the
    /// attempt when the session is lost, and at `deadline` withdraws these
    /// nodes and fails `Contended` with `why` (for `key`, in `operation`).
    pub(crate) async fn wait_watched(
        &mut self,
        session: &Session,
        watcher: zk::OneshotWatcher,
        deadline: Instant,
        (operation, key, why): (Operation, &LockKey, &str),
    ) -> Result<(), AttemptError> {
        let mut state = session.state.clone();
        tokio::select! {
            _ = watcher.changed() => Ok(()),
            () = wait_lost(&mut state) => Err(AttemptError::SessionLost),
            () = sleep_until(deadline) => {
                self.withdraw().await;
                Err(AttemptError::Lock(error(ErrorKind::Contended, operation, key, why)))
            }
        }
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
        let cleanup = self.cleanup.clone();
        let client = self.client.clone();
        let nodes = std::mem::take(&mut self.nodes);
        let sweeps = std::mem::take(&mut self.sweeps);
        runtime.spawn(async move {
            for (dir, path, owner) in nodes.into_iter().rev() {
                cleanup.delete_node(&client, &path, &dir, owner).await;
            }
            for (dir, owner) in sweeps {
                cleanup.mark_uncertain(owner);
                cleanup.sweep_uncertain(&client, &dir, owner, true).await;
            }
        });
    }
}

/// A holder as `holders` finds it: its nodes' names, its kind, its token
/// when known without a look at its node.
pub(crate) type Held = (Vec<String>, LeaseKind, Option<u64>);

/// One node of a read-write lock directory.
pub(crate) struct RwNode {
    pub(crate) seq: i64,
    pub(crate) name: String,
    pub(crate) write: bool,
}

/// The read and write nodes among `children`, in grant order (Curator
/// sorts on the digits after `__READ__` / `__WRIT__`).
pub(crate) fn sorted_rw_nodes(children: Vec<String>) -> Vec<RwNode> {
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
pub(crate) fn rw_blocker(nodes: &[RwNode], index: usize) -> Option<&str> {
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
pub(crate) fn epoch_of(data: &[u8]) -> u64 {
    std::str::from_utf8(data)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The limit in a `leases` directory's data, if our clients wrote one.
pub(crate) fn limit_of(data: &[u8]) -> Option<u32> {
    std::str::from_utf8(data).ok()?.trim().parse().ok()
}

pub(crate) fn error(
    kind: ErrorKind,
    operation: Operation,
    key: &LockKey,
    why: impl Into<String>,
) -> LockError {
    LockError::new(kind, operation, why)
        .with_key(key)
        .with_backend(NAME)
}

pub(crate) fn seq_u32(seq: i64, operation: Operation, key: &LockKey) -> Result<u32, AttemptError> {
    u32::try_from(seq).map_err(|_| {
        AttemptError::Lock(error(
            ErrorKind::Backend,
            operation,
            key,
            format!("unexpected sequence number {seq}"),
        ))
    })
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
pub(crate) async fn create_sequential<B: Future>(
    (conn, waiting): (&Connection, &Waiting),
    session: &Session,
    dir: &str,
    prefix: &str,
    data: &[u8],
    operation: Operation,
    key: &LockKey,
    mut behind: impl FnMut() -> B,
) -> Result<(String, i64, i64, B), AttemptError> {
    let options = zk::CreateMode::EphemeralSequential.with_acls(conn.acls());
    let mut missing_dir = 0;
    loop {
        let created = timed(
            conn.op_timeout(),
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
                waiting.ensure_dir(session, dir, operation, key).await?;
            }
            Err(err) => return Err(fail(session, err, operation, key)),
        }
    }
}
