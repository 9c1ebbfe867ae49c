//! Acquiring: creating the lock node, the grant decision, and the waiting
//! acquire (the predecessor's and our own node's watches, the session
//! signal, the deadline), retried on a new session when one is lost.

use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;

use std::time::Duration;

use lock_core::{
    Backoff, ErrorKind, FencingToken, Lease, LockError, LockKey, Operation, OwnerId, RetryPolicy,
    SessionState, check_ttl, saturating_add,
};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};
use zookeeper_client as zk;

use crate::cleanup::{Cleanup, NodeCleanup};
use crate::config::MIN_TTL;
use crate::connection::{Connection, Session, synced};
use crate::error::{CallError, NAME, timed, timed_pair};
use crate::expiry::Expiry;
use crate::keys::{self, mutex_owner_of};

/// How far past its deadline an acquire may run when the servers are slow
/// to answer (a normal wait ends at the deadline itself).
pub(crate) const ACQUIRE_GRACE: Duration = Duration::from_millis(500);

/// Where and how an acquisition waits: the key's queue of nodes in the
/// lock directory `dir`, following `recipe` (the mutex's nodes, or an
/// election's latch nodes: same queue, same watches, same cleanup).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Queue<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) dir: &'a str,
    pub(crate) ttl: Duration,
    /// `None` for a single try.
    pub(crate) deadline: Option<Instant>,
    pub(crate) operation: Operation,
    /// Enforce the lease's TTL locally (a lease handed to the user); a
    /// semaphore's internal mutex, held only while its acquire runs, is not
    /// tracked (its holder deletes it, or it goes with the session).
    pub(crate) track: bool,
    pub(crate) recipe: Recipe,
}

/// Our node went away while we waited (`why`): the attempt ends with
/// `LeaseLost` (its cleanup is disarmed by the caller: nothing to delete).
fn node_gone(why: String, operation: Operation, key: &LockKey) -> AttemptError {
    AttemptError::Lock(
        LockError::new(ErrorKind::LeaseLost, operation, why)
            .with_key(key)
            .with_backend(NAME),
    )
}

/// Which recipe an attempt follows: the node name it creates and sorts on,
/// the data it writes, and how its lease names the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recipe {
    /// Curator's `InterProcessMutex`: `lock-` nodes whose data is
    /// `<owner hex>\n<holder details>` (Curator never reads it).
    Mutex,
    /// The mutex with kazoo's `Lock` names (`nodes=kazoo`): `__lock__`
    /// nodes whose data is `<owner hex>\n<holder details>` (what kazoo's
    /// `contenders()` lists); the lease's data is `kazoo:<seq>`.
    KazooMutex,
    /// Curator's `LeaderLatch` on the election `name`: `latch-` nodes
    /// whose data is the candidate's owner value (Curator's participant
    /// id) and whose name carries the holder details (`keys.rs`);
    /// the lease's data is `latch:<seq>;<escaped details>`.
    Latch,
}

impl Recipe {
    pub(crate) fn node_name(self) -> &'static str {
        match self {
            Self::Mutex => keys::LOCK_NAME,
            Self::KazooMutex => keys::KAZOO_LOCK_NAME,
            Self::Latch => keys::LATCH_NAME,
        }
    }
}

/// A create whose reply came back: when it was sent, and the reply to the
/// list of the directory sent right behind it.
pub(crate) struct Created {
    sent: Instant,
    listed: Result<Vec<String>, CallError>,
}

/// Why one attempt ended without a result.
pub(crate) enum AttemptError {
    /// The session is gone (and our node with it): a new session may try.
    SessionLost,
    /// A final error for the caller.
    Lock(LockError),
}

/// How an attempt's failed request ends it: a lost session lets a new
/// one try; anything else is the caller's error.
pub(crate) fn fail(
    session: &Session,
    err: CallError,
    operation: Operation,
    key: &LockKey,
) -> AttemptError {
    if err.ends_session() || session.is_lost() {
        AttemptError::SessionLost
    } else {
        AttemptError::Lock(err.into_lock_error(operation).with_key(key))
    }
}

/// The watcher `watched` (a `check_and_watch_stat`) set on a node
/// that exists; `None` when the node is gone (the caller looks again).
pub(crate) fn watcher_if_present(
    session: &Session,
    watched: Result<(Option<zk::Stat>, zk::OneshotWatcher), CallError>,
    operation: Operation,
    key: &LockKey,
) -> Result<Option<zk::OneshotWatcher>, AttemptError> {
    match watched {
        Ok((Some(_), watcher)) => Ok(Some(watcher)),
        Ok((None, _)) => Ok(None),
        Err(err) => Err(fail(session, err, operation, key)),
    }
}

/// Where acquisitions wait: an `EPHEMERAL_SEQUENTIAL` node in the key's
/// queue, the grant decision, the waiting on the predecessor, retried on a
/// new session when one is lost. Both the mutex (single tries too) and an
/// election's latch go through it, and the semaphore's internal mutex.
#[derive(Clone)]
pub(crate) struct Waiting {
    conn: Arc<Connection>,
    expiry: Expiry,
    cleanup: Cleanup,
}

impl Waiting {
    pub(crate) fn new(conn: Arc<Connection>, expiry: Expiry, cleanup: Cleanup) -> Self {
        Self {
            conn,
            expiry,
            cleanup,
        }
    }

    /// Creates the key's directory (and missing ancestors): containers
    /// where the server has them, so empty directories go away by
    /// themselves without a client ever deleting a directory a waiter is
    /// about to use.
    pub(crate) async fn ensure_dir(
        &self,
        session: &Session,
        dir: &str,
        operation: Operation,
        key: &LockKey,
    ) -> Result<(), AttemptError> {
        loop {
            // A path-layout directory (outside the root) is another
            // library's path: persistent, as kazoo and Curator make it.
            let containers = self.conn.containers() && !self.conn.is_foreign_dir(dir);
            let mode = if containers {
                zk::CreateMode::Container
            } else {
                zk::CreateMode::Persistent
            };
            let options = mode.with_acls(self.conn.acls());
            match timed(self.conn.op_timeout(), session.client.mkdir(dir, &options)).await {
                Ok(()) => return Ok(()),
                Err(CallError::Zk(zk::Error::Unimplemented)) if containers => {
                    tracing::info!(
                        "ZooKeeper server has no container nodes; using persistent key directories"
                    );
                    self.conn.no_containers();
                }
                Err(err) => return Err(fail(session, err, operation, key)),
            }
        }
    }

    /// Creates our `EPHEMERAL_SEQUENTIAL` node. When a reply is lost the
    /// node is looked up by the attempt id in its name before creating
    /// again, so a lost reply does not leave an orphan blocking the key.
    ///
    /// The list of the directory is sent right behind each create, before
    /// the create's reply is awaited: the server answers a session's
    /// requests in order and a read only after that session's earlier
    /// writes are applied, so the list already shows our node, and a free
    /// key is decided in one round trip (create + list) instead of two.
    ///
    /// Returns the node's path and `czxid`, and, when the create's own
    /// reply came back, when it was sent with the list sent behind it
    /// (`None` when the node was found by a lookup after a lost reply).
    async fn create_node(
        &self,
        session: &Session,
        dir: &str,
        owner: OwnerId,
        recipe: Recipe,
        operation: Operation,
        key: &LockKey,
    ) -> Result<(String, i64, Option<Created>), AttemptError> {
        let (prefix, data) = match recipe {
            // The holder details ride in the create itself (no extra
            // request), after the owner hex kazoo's `contenders()` lists.
            Recipe::Mutex => (
                keys::node_path_prefix(dir, owner),
                keys::mutex_node_data(owner),
            ),
            Recipe::KazooMutex => (
                keys::mutex_node_prefix(dir, owner, crate::ZkNodeNames::Kazoo),
                keys::mutex_node_data(owner),
            ),
            // The data is Curator's participant id, the whole of it: the
            // details ride in the name (see keys.rs).
            Recipe::Latch => (
                keys::named_prefix(
                    dir,
                    owner,
                    &crate::keys::latch_name(&crate::keys::details_component()),
                ),
                owner.to_hex(),
            ),
        };
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.conn.acls());
        let mut missing_dir = 0;
        let mut unknown = 0;
        loop {
            let sent = Instant::now();
            // Both requests are made now, in this order, and awaited together
            // (the list's reply is dropped unless the create succeeded).
            let (created, listed) = timed_pair(
                self.conn.op_timeout(),
                session.client.create(&prefix, data.as_bytes(), &options),
                session.client.list_children(dir),
            )
            .await;
            match created {
                Ok((stat, sequence)) => {
                    // The prefix has room for the sequence number.
                    let mut path = prefix;
                    let _ = write!(path, "{sequence}");
                    return Ok((path, stat.czxid, Some(Created { sent, listed })));
                }
                // The directory is created on demand, and a container may be
                // removed by the server between our mkdir and create.
                Err(err) if err.is(&zk::Error::NoNode) && missing_dir < 3 => {
                    missing_dir += 1;
                    self.ensure_dir(session, dir, operation, key).await?;
                }
                // Our own timeout: the server is not answering, so give up
                // now; the armed cleanup finds the node by its id later.
                Err(err @ CallError::TimedOut(_)) => {
                    self.cleanup.mark_uncertain(owner);
                    return Err(fail(session, err, operation, key));
                }
                // The connection dropped with the reply in flight: look for
                // the node once we are connected again.
                Err(err) if err.outcome_unknown() && unknown < 3 && !session.is_lost() => {
                    unknown += 1;
                    self.cleanup.mark_uncertain(owner);
                    tracing::debug!(%key, "create reply lost; looking for our node");
                    if let Some((path, czxid)) = self.find_own(session, dir, owner, recipe).await {
                        return Ok((path, czxid, None));
                    }
                }
                Err(err) => return Err(fail(session, err, operation, key)),
            }
        }
    }

    /// Our node in `dir`, found by the attempt id in its name.
    async fn find_own(
        &self,
        session: &Session,
        dir: &str,
        owner: OwnerId,
        recipe: Recipe,
    ) -> Option<(String, i64)> {
        let children = timed(self.conn.op_timeout(), session.client.list_children(dir))
            .await
            .ok()?;
        let (_, name) = keys::sorted_named(children, recipe.node_name())
            .into_iter()
            .find(|(_, name)| mutex_owner_of(name) == Some(owner))?;
        let path = format!("{dir}/{name}");
        let stat = timed(self.conn.op_timeout(), session.client.check_stat(&path))
            .await
            .ok()??;
        Some((path, stat.czxid))
    }

    /// One acquisition in `queue` with a fresh attempt id on `session`.
    async fn attempt(
        &self,
        session: &Arc<Session>,
        queue: Queue<'_>,
    ) -> Result<Option<Lease>, AttemptError> {
        let Queue {
            key,
            dir,
            ttl,
            deadline,
            operation,
            track,
            recipe,
        } = queue;
        let owner = self.expiry.next_owner();
        let mut cleanup = NodeCleanup {
            cleanup: &self.cleanup,
            client: &session.client,
            dir,
            owner,
            armed: true,
            path: None,
        };
        let (path, czxid, created_at) = self
            .create_node(session, dir, owner, recipe, operation, key)
            .await?;
        cleanup.path = Some(path.clone());
        let name = &path[dir.len() + 1..];
        let token = to_token(czxid, operation, key)?;
        let mut own_watch: Option<WatchFuture> = None;
        // The first list, sent right behind our own create, needs no `sync`.
        let mut after_create = created_at;
        loop {
            // The list that decides the grant must be the leader's view, not
            // a follower's stale copy. Right after our create it is: the
            // create is a write the leader committed (a follower cut off from
            // its leader cannot complete it), and a server answers a
            // session's read only after applying that session's earlier
            // writes, so the list reflects the leader's state at least as of
            // the create. The grant is then dated from the create's sending,
            // before the leader last heard from the session. Every later list
            // (after a watch event) is preceded by a `sync` (see `synced`).
            // Skipping it here keeps a free key's create and list together
            // (see `create_node`).
            let (sent, listed) = match after_create.take() {
                Some(Created { sent, listed }) => (sent, listed),
                None => {
                    let sent = Instant::now();
                    let listed = synced(
                        session.client.sync(dir),
                        self.conn.op_timeout(),
                        session.client.list_children(dir),
                    )
                    .await;
                    (sent, listed)
                }
            };
            let children = match listed {
                Ok(children) => children,
                Err(err) if err.is(&zk::Error::NoNode) && !session.is_lost() => {
                    cleanup.disarm();
                    return Err(node_gone(
                        format!(
                            "the lock directory {dir} was removed while we waited, \
                             and our node {name} with it"
                        ),
                        operation,
                        key,
                    ));
                }
                Err(err) => return Err(fail(session, err, operation, key)),
            };
            // Curator's order: the digits after the recipe's node name;
            // the first node holds (leads). Other children are ignored.
            // A mutex also waits behind kazoo's lock nodes in its directory.
            let mut nodes = match recipe {
                Recipe::Mutex | Recipe::KazooMutex => keys::sorted_mutex_contenders(children),
                Recipe::Latch => keys::sorted_named(children, recipe.node_name()),
            };
            // Extra nodes of this attempt (a create retried after a lost
            // reply) would block everyone: remove them.
            nodes.retain(|(_, other)| {
                if *other != name && mutex_owner_of(other) == Some(owner) {
                    let client = session.client.clone();
                    let extra = format!("{dir}/{other}");
                    let timeout = self.conn.op_timeout();
                    tokio::spawn(async move {
                        let _ = timed(timeout, client.delete(&extra, None)).await;
                    });
                    false
                } else {
                    true
                }
            });
            let Some(index) = nodes.iter().position(|(_, n)| *n == name) else {
                if session.is_lost() {
                    return Err(AttemptError::SessionLost);
                }
                cleanup.disarm();
                return Err(node_gone(
                    format!(
                        "our lock node {path} was deleted while we waited \
                         (by another client or an administrator)"
                    ),
                    operation,
                    key,
                ));
            };
            if index == 0 {
                // Granted on the strength of this session's node: only if the
                // session is still the one that created it and not lost.
                if session.is_lost() {
                    return Err(AttemptError::SessionLost);
                }
                // The server heard from this session after `sent`, so it
                // cannot expire it (and free the key) before
                // `sent + session timeout`: the lease never promises more.
                let ttl = ttl.min(session.timeout);
                // The lease stores the sequence number alone (see
                // `lease_path`); ZooKeeper's sequence is a 32-bit counter.
                let seq = u32::try_from(nodes[0].0).map_err(|_| {
                    AttemptError::Lock(
                        LockError::new(
                            ErrorKind::Backend,
                            operation,
                            format!("lock node {path} has an unexpected sequence number"),
                        )
                        .with_key(key)
                        .with_backend(NAME),
                    )
                })?;
                let data = match recipe {
                    Recipe::Mutex => seq.to_string(),
                    Recipe::KazooMutex => format!("{}{seq}", keys::KAZOO_DATA),
                    Recipe::Latch => {
                        format!("{}{seq};{}", keys::LATCH_DATA, keys::details_of_name(name))
                    }
                };
                let lease = granted(key, owner, token, (ttl, sent), data)?;
                cleanup.disarm();
                if track {
                    match recipe {
                        Recipe::Mutex | Recipe::KazooMutex => {
                            self.expiry
                                .schedule_expiry(owner, key.as_str(), seq, sent + ttl);
                        }
                        Recipe::Latch => {
                            let election = key.as_str().strip_prefix("election/").unwrap_or("");
                            let mark = super::expiry::LATCH_MARK;
                            let details = crate::keys::details_of_name(name);
                            let tracked = format!("{mark}{election}{mark}{details}");
                            self.expiry
                                .schedule_expiry(owner, &tracked, seq, sent + ttl);
                        }
                    }
                }
                return Ok(Some(lease.with_session(session.state.clone())));
            }
            let Some(deadline) = deadline else {
                // A single try: someone holds it; withdraw.
                self.cleanup.withdraw(session, &mut cleanup).await;
                return Ok(None);
            };
            // Watch only the immediate predecessor (no herd on release), and
            // our own node, so that its deletion by someone else ends the
            // wait at once instead of when the predecessor goes. Both
            // requests are sent before either reply is awaited.
            let predecessor = format!("{dir}/{}", nodes[index - 1].1);
            let pred = if own_watch.is_none() {
                let (own, pred) = tokio::join!(
                    timed(
                        self.conn.op_timeout(),
                        session.client.check_and_watch_stat(&path)
                    ),
                    timed(
                        self.conn.op_timeout(),
                        session.client.check_and_watch_stat(&predecessor)
                    ),
                );
                match own {
                    Ok((Some(_), watcher)) => own_watch = Some(Box::pin(watcher.changed())),
                    // Gone: the next look reports it.
                    Ok((None, _)) => continue,
                    Err(err) => return Err(fail(session, err, operation, key)),
                }
                pred
            } else {
                // The watch on our own node is still armed from an earlier
                // round: keeping it spares a request before the next list.
                timed(
                    self.conn.op_timeout(),
                    session.client.check_and_watch_stat(&predecessor),
                )
                .await
            };
            // Gone between our list and the watch: look again.
            let Some(pred_watcher) = watcher_if_present(session, pred, operation, key)? else {
                continue;
            };
            let mut state = session.state.clone();
            tokio::select! {
                _ = pred_watcher.changed() => {}
                _ = armed(&mut own_watch) => own_watch = None,
                () = wait_lost(&mut state) => return Err(AttemptError::SessionLost),
                () = sleep_until(deadline) => {
                    self.cleanup.withdraw(session, &mut cleanup).await;
                    return Err(AttemptError::Lock(
                        LockError::new(
                            ErrorKind::Contended,
                            operation,
                            "still held by another owner at the wait deadline",
                        )
                        .with_key(key)
                        .with_backend(NAME),
                    ));
                }
            }
        }
    }

    pub(crate) async fn lock_key(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Option<Instant>,
        operation: Operation,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(ttl, MIN_TTL, operation).map_err(|e| e.with_key(key).with_backend(NAME))?;
        let dir = self.conn.checked_key_path(key, operation)?;
        // A user's mutex takes the configured names; a semaphore's internal
        // mutex (`shared/sem.rs`) keeps Curator's.
        let recipe = match self.conn.config().node_names() {
            crate::ZkNodeNames::Curator => Recipe::Mutex,
            crate::ZkNodeNames::Kazoo => Recipe::KazooMutex,
        };
        let queue = Queue {
            key,
            dir: &dir,
            ttl,
            deadline,
            operation,
            track: true,
            recipe,
        };
        self.lock_in_recipe(queue).await
    }

    /// The mutex recipe in `queue` (see [`Queue`]), with attempts retried
    /// as [`Self::retry_attempts`] says.
    pub(crate) async fn lock_in_recipe(
        &self,
        queue: Queue<'_>,
    ) -> Result<Option<Lease>, LockError> {
        self.retry_attempts(
            queue.key,
            queue.deadline,
            queue.operation,
            "acquire attempt",
            move |session| async move { self.attempt(&session, queue).await },
        )
        .await
    }

    /// Runs `attempt` on the live session, again after a temporary
    /// failure while the wait deadline allows, and on a new session when
    /// one is lost (while the deadline allows; twice for a single try).
    /// `what` names the attempt in the debug log.
    pub(crate) async fn retry_attempts<F, A>(
        &self,
        key: &LockKey,
        deadline: Option<Instant>,
        operation: Operation,
        what: &str,
        mut attempt: F,
    ) -> Result<Option<Lease>, LockError>
    where
        F: FnMut(Arc<Session>) -> A,
        A: Future<Output = Result<Option<Lease>, AttemptError>>,
    {
        // Made at the first retry: seeding it reads the OS's randomness
        // (a system call), which an attempt that succeeds at once, nearly
        // every acquire, has no use for.
        let mut backoff: Option<Backoff> = None;
        let mut next_delay = move || {
            backoff
                .get_or_insert_with(|| RetryPolicy::default().backoff())
                .next_delay()
                .unwrap_or(Duration::from_millis(100))
        };
        let mut tries_left: u32 = 2;
        loop {
            let session = self
                .conn
                .session(operation)
                .await
                .map_err(|e| e.with_key(key))?;
            match attempt(session).await {
                Ok(result) => return Ok(result),
                // A wait rides out disconnections (an election, a server
                // restart): the failed attempt's nodes are deleted in the
                // background and a new attempt joins the queue.
                Err(AttemptError::Lock(err))
                    if matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout)
                        && deadline
                            .is_some_and(|d| Instant::now() + Duration::from_millis(100) < d) =>
                {
                    tracing::debug!(%key, %err, "{what} failed; retrying");
                    let delay = next_delay();
                    tokio::time::sleep(delay).await;
                }
                Err(AttemptError::Lock(err)) => return Err(err),
                Err(AttemptError::SessionLost) => {
                    // Our nodes went with the session. A new session may
                    // try again while the wait deadline allows.
                    tries_left = tries_left.saturating_sub(1);
                    let delay = next_delay();
                    let can_retry = match deadline {
                        Some(deadline) => Instant::now() + delay < deadline,
                        None => tries_left > 0,
                    };
                    if !can_retry {
                        return Err(LockError::new(
                            ErrorKind::Unavailable,
                            operation,
                            "the ZooKeeper session was lost during the attempt",
                        )
                        .with_key(key)
                        .with_backend(NAME));
                    }
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}

/// `attempt`, a waiting acquire of `key` until `deadline`, bounded at
/// [`ACQUIRE_GRACE`] past the deadline: requests have their own timeouts,
/// but a wait must also end near its deadline when the servers stop
/// answering (`Timeout`: "ZooKeeper did not answer before the
/// `<deadline_name>`"). No grant by the deadline is `Contended` with `why`.
pub(crate) async fn bounded_wait(
    key: &LockKey,
    deadline: Instant,
    (deadline_name, why): (&str, &str),
    attempt: impl Future<Output = Result<Option<Lease>, LockError>>,
) -> Result<Lease, LockError> {
    let operation = Operation::Acquire;
    let fail = |kind, why: String| {
        LockError::new(kind, operation, why)
            .with_key(key)
            .with_backend(NAME)
    };
    // Saturating: a deadline near the end of time must not overflow.
    let answered = tokio::time::timeout_at(saturating_add(deadline, ACQUIRE_GRACE), attempt)
        .await
        .map_err(|_| {
            fail(
                ErrorKind::Timeout,
                format!("ZooKeeper did not answer before the {deadline_name}"),
            )
        })?;
    answered?.ok_or_else(|| fail(ErrorKind::Contended, why.to_owned()))
}

/// The fencing token of a grant whose node has `czxid`.
pub(crate) fn to_token(
    czxid: i64,
    operation: Operation,
    key: &LockKey,
) -> Result<u64, AttemptError> {
    u64::try_from(czxid).map_err(|_| {
        AttemptError::Lock(
            LockError::new(
                ErrorKind::Backend,
                operation,
                format!("negative czxid {czxid}"),
            )
            .with_key(key)
            .with_backend(NAME),
        )
    })
}

/// The lease of a grant to `owner` with `token`, valid `ttl` from `sent`,
/// whose nodes `data` names.
pub(crate) fn granted(
    key: &LockKey,
    owner: OwnerId,
    token: u64,
    (ttl, sent): (Duration, Instant),
    data: String,
) -> Result<Lease, AttemptError> {
    Lease::granted(
        key.clone(),
        owner,
        FencingToken::new(token),
        ttl,
        sent,
        data,
    )
    .map_err(|e| AttemptError::Lock(e.with_backend(NAME)))
}

type WatchFuture = std::pin::Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>;

/// Waits for an armed watch; never returns when there is none.
async fn armed(watch: &mut Option<WatchFuture>) -> zk::WatchedEvent {
    match watch {
        Some(watch) => watch.as_mut().await,
        None => std::future::pending().await,
    }
}

pub(crate) async fn wait_lost(state: &mut watch::Receiver<SessionState>) {
    loop {
        if matches!(*state.borrow_and_update(), SessionState::Lost(_)) {
            return;
        }
        if state.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use conformance::process::end_of_time;

    /// Issue 37: a waiting acquire's bound is its deadline plus
    /// [`ACQUIRE_GRACE`]; a deadline closer to the end of time than that
    /// must not overflow (`Instant + Duration` panics).
    #[tokio::test]
    async fn a_wait_with_a_deadline_near_the_end_of_time_does_not_panic() {
        let key = LockKey::new("far").unwrap();
        let deadline = end_of_time() - Duration::from_millis(100);
        let lease = Lease::granted(
            key.clone(),
            OwnerId::random(),
            FencingToken::new(1),
            Duration::from_secs(5),
            Instant::now(),
            String::new(),
        )
        .unwrap();
        let granted = bounded_wait(&key, deadline, ("wait deadline", "held"), async {
            Ok(Some(lease))
        })
        .await;
        assert!(granted.is_ok(), "{granted:?}");
    }
}
