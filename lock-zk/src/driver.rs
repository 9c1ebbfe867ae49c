//! The [`LockBackend`] implementation: one ZooKeeper session per backend,
//! Curator-style lock nodes, czxid fencing tokens.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    Capabilities, ErrorKind, FencingScope, FencingToken, Lease, LockBackend, LockError, LockInfo,
    LockKey, Operation, OwnerId, RetryPolicy, SessionState, TtlModel, WaitStrategy, check_ttl,
    validity_deadline,
};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::paths::{self, owner_of, sequence_of, sorted_lock_nodes};

const NAME: &str = "zookeeper";

// Batched renewals; a child module for the session and expiry internals.
#[path = "renew_many.rs"]
mod renew_many;

// Local TTL enforcement: one expiry task per backend.
#[path = "expiry.rs"]
mod expiry;

/// How far past its deadline an acquire may run when the servers are slow
/// to answer (a normal wait ends at the deadline itself).
const ACQUIRE_GRACE: Duration = Duration::from_millis(500);

/// How long a background cleanup keeps trying to delete a node.
const CLEANUP_PATIENCE: Duration = Duration::from_secs(60);

const CLEANUP_RETRY: RetryPolicy = RetryPolicy {
    initial: Duration::from_millis(50),
    max: Duration::from_secs(2),
    multiplier: 2,
    max_attempts: None,
};

/// The shortest TTL accepted. A ZooKeeper lease lives as long as its
/// session; the TTL only paces renewals and bounds the local validity, so
/// it needs room for a few round trips.
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// A lock service on a ZooKeeper ensemble.
///
/// One ZooKeeper session per backend, shared by every lock it takes; clones
/// share it. See the [crate docs](crate) for the recipe and its guarantees.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use lock_core::{LockBackend, LockKey};
/// use lock_zk::ZkBackend;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let backend = lock_zk::connect("zk://127.0.0.1:2181/myapp").await?;
/// let key = LockKey::new("nightly-report")?;
/// let lease = backend.try_acquire(&key, Duration::from_secs(10)).await?.expect("free");
/// println!("fencing token {}", lease.token());
/// backend.release(&lease).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let session = self.inner.current().map(|s| s.id);
        f.debug_struct("ZkBackend")
            .field("config", &self.inner.config)
            .field("session_id", &session)
            .finish()
    }
}

struct Inner {
    config: ZkConfig,
    current: Mutex<Option<Arc<Session>>>,
    connecting: tokio::sync::Mutex<()>,
    containers: AtomicBool,
    /// Local TTL enforcement: the granted nodes by owner id, each with when
    /// it must be deleted if not renewed (the lease's validity deadline
    /// comes before). Removed at release. See expiry.rs.
    expiries: Mutex<HashMap<u64, expiry::Tracked>>,
    /// The attempt ids this backend hands out (and keys `expiries` by).
    owners: expiry::Owners,
    /// The deadlines' epoch.
    clock: expiry::Clock,
    /// The backend's one expiry task. Locked after `expiries` when both are.
    task: Mutex<expiry::ExpiryTask>,
    /// Attempts whose create had an unknown outcome: more than one node may
    /// carry their id, so cleanup sweeps the directory for it.
    uncertain: Mutex<HashSet<OwnerId>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        lock(&self.task).stop();
    }
}

impl Inner {
    fn current(&self) -> Option<Arc<Session>> {
        lock(&self.current).clone()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code path panics while holding these locks; recover anyway.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A lease's lock node (see `ZkBackend::lease_path`).
struct NodeRef {
    path: String,
    dir_len: usize,
    seq: u32,
}

impl NodeRef {
    fn path(&self) -> &str {
        &self.path
    }

    fn dir(&self) -> &str {
        &self.path[..self.dir_len]
    }
}

/// One ZooKeeper session and the state signal derived from it.
struct Session {
    client: zk::Client,
    id: i64,
    timeout: Duration,
    state: watch::Receiver<SessionState>,
    drain: tokio::task::JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.drain.abort();
    }
}

impl Session {
    fn is_lost(&self) -> bool {
        matches!(*self.state.borrow(), SessionState::Lost(_))
    }
}

/// Why one attempt ended without a result.
enum AttemptError {
    /// The session is gone (and our node with it): a new session may try.
    SessionLost,
    /// A final error for the caller.
    Lock(LockError),
}

/// A request that failed: the server's answer or our own timeout.
#[derive(Debug)]
enum CallError {
    Zk(zk::Error),
    TimedOut(Duration),
}

impl CallError {
    fn is(&self, err: &zk::Error) -> bool {
        matches!(self, Self::Zk(e) if e == err)
    }

    /// The request may or may not have been applied.
    fn outcome_unknown(&self) -> bool {
        matches!(
            self,
            Self::TimedOut(_) | Self::Zk(zk::Error::ConnectionLoss)
        )
    }

    fn ends_session(&self) -> bool {
        matches!(
            self,
            Self::Zk(zk::Error::SessionExpired | zk::Error::SessionMoved | zk::Error::ClientClosed)
        )
    }

    fn into_lock_error(self, operation: Operation) -> LockError {
        match self {
            Self::TimedOut(after) => LockError::new(
                ErrorKind::Timeout,
                operation,
                format!("no answer from ZooKeeper within the operation timeout of {after:?}"),
            )
            .with_backend(NAME),
            Self::Zk(err) => zk_error(operation, err),
        }
    }
}

/// The connection broke with the request in flight. The client reports
/// this as `ConnectionLoss`, or as a custom error carrying the reason
/// ("no response from connection in ...", an I/O error).
fn connection_failure(err: &zk::Error) -> bool {
    matches!(err, zk::Error::ConnectionLoss | zk::Error::Custom(_))
}

fn zk_error(operation: Operation, err: zk::Error) -> LockError {
    let kind = match &err {
        err if connection_failure(err) => ErrorKind::Unavailable,
        zk::Error::ConnectionLoss
        | zk::Error::NoHosts
        | zk::Error::SessionExpired
        | zk::Error::SessionMoved
        | zk::Error::ClientClosed
        | zk::Error::Throttled
        | zk::Error::NotReadOnly => ErrorKind::Unavailable,
        zk::Error::Timeout => ErrorKind::Timeout,
        zk::Error::BadArguments(_) => ErrorKind::InvalidArgument,
        _ => ErrorKind::Backend,
    };
    LockError::new(kind, operation, format!("ZooKeeper: {err}"))
        .with_backend(NAME)
        .with_source(err)
}

fn map_state(state: zk::SessionState) -> SessionState {
    match state {
        zk::SessionState::SyncConnected => SessionState::Alive,
        // Disconnected: the server may expire the session (and delete our
        // nodes) before the client hears about it, so it is only "maybe".
        // A read-only server cannot serve lock writes either.
        zk::SessionState::Disconnected | zk::SessionState::ConnectedReadOnly => {
            SessionState::Suspect
        }
        zk::SessionState::Expired => SessionState::Lost("ZooKeeper session expired".to_owned()),
        zk::SessionState::AuthFailed => {
            SessionState::Lost("ZooKeeper authentication failed".to_owned())
        }
        zk::SessionState::Closed => SessionState::Lost("ZooKeeper session closed".to_owned()),
    }
}

/// Forwards every session state change to the lock-core signal. The
/// client's watcher keeps only the latest state, so it is drained for the
/// whole life of the session.
async fn drain_states(mut watcher: zk::StateWatcher, tx: watch::Sender<SessionState>) {
    loop {
        let state = watcher.changed().await;
        tracing::debug!(%state, "ZooKeeper session state");
        let mapped = map_state(state);
        let terminal = matches!(mapped, SessionState::Lost(_));
        tx.send_replace(mapped);
        if terminal {
            // Keep the sender until the session is dropped so receivers
            // read the reason rather than a closed channel.
            std::future::pending::<()>().await;
        }
    }
}

async fn timed<T, F>(timeout: Duration, call: F) -> Result<T, CallError>
where
    F: Future<Output = Result<T, zk::Error>>,
{
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(CallError::Zk(err)),
        Err(_) => Err(CallError::TimedOut(timeout)),
    }
}

/// A read that reflects the leader's state as of some moment after it was
/// sent: a `sync` of `path` followed by `read`, both sent at once.
///
/// A follower answers reads from its own copy, which lags the leader and
/// stops moving altogether when the follower is cut off from the leader
/// (it keeps serving its clients for up to `syncLimit` ticks). The server
/// handles one session's requests in order and holds a read behind that
/// session's pending `sync` until the follower has caught up with the
/// leader; the leader also refuses the `sync` of a session it has expired.
/// So a read answered after a successful `sync` sees every change the
/// leader had committed when it handled the `sync`, and a follower cut off
/// from its leader cannot answer at all. Both requests are queued at once,
/// before either answer is awaited: one extra request, often no extra
/// client round trip (the client may write them as two packets, and a
/// server that answers the `sync` before the read arrives costs one more:
/// measured, about every other time on loopback), and on a follower one
/// follower-to-leader hop added to the read's latency. Callers create `read` after calling this
/// (the client sends a request when the call is made), e.g.
/// `synced(client, dir, t, client.list_children(dir))`.
///
/// `sync` + read is not a full linearizable read (ZOOKEEPER-1675: a leader
/// that was deposed but has not noticed yet can still answer a `sync`), but
/// such a leader steps down within `syncLimit` ticks and a new leader
/// starts every session's timeout afresh, so it cannot confirm a node that
/// a newer leader has already deleted.
async fn synced<T, F>(
    sync: impl Future<Output = Result<(), zk::Error>>,
    timeout: Duration,
    read: F,
) -> Result<T, CallError>
where
    F: Future<Output = Result<T, zk::Error>>,
{
    let (synced, read) = tokio::join!(timed(timeout, sync), timed(timeout, read));
    match synced {
        // The path of a sync is not checked by the server; tolerate a
        // server that does (the read reports the missing node itself).
        Ok(()) | Err(CallError::Zk(zk::Error::NoNode)) => read,
        Err(err) => Err(err),
    }
}

/// Deletes a waiting (or just-created) node when an attempt ends early:
/// timeout, error, or the future being dropped. Armed before the create is
/// sent: if the attempt is dropped while the create is in flight, the node
/// is found by the attempt id (requests of one session are answered in
/// order, so the lookup sees the create). Borrows what it needs and clones
/// it only when it fires.
struct NodeCleanup<'a> {
    backend: &'a ZkBackend,
    client: &'a zk::Client,
    dir: &'a str,
    owner: OwnerId,
    armed: bool,
    path: Option<String>,
}

impl NodeCleanup<'_> {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for NodeCleanup<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.backend.clone();
        let client = self.client.clone();
        let dir = self.dir.to_owned();
        let owner = self.owner;
        let path = self.path.take();
        runtime.spawn(async move {
            match path {
                Some(path) => backend.delete_node(&client, &path, &dir, owner).await,
                None => {
                    lock(&backend.inner.uncertain).insert(owner);
                    backend.sweep_uncertain(&client, &dir, owner, true).await;
                }
            }
        });
    }
}

impl ZkBackend {
    /// Connects with `config`: opens the session (and creates the chroot
    /// node when missing).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for an invalid configuration;
    /// [`ErrorKind::Unavailable`] / [`ErrorKind::Timeout`] when no server
    /// answers within the connect timeout.
    ///
    /// # Cancel safety
    ///
    /// Safe: a dropped connect leaves nothing behind.
    pub async fn connect(config: ZkConfig) -> Result<Self, LockError> {
        config.validate()?;
        // The ZooKeeper client and our session watcher run as Tokio tasks.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(LockError::config(
                "lock-zk needs a Tokio runtime: connect from inside one",
            )
            .with_backend(NAME));
        }
        let backend = Self {
            inner: Arc::new(Inner {
                containers: AtomicBool::new(config.containers()),
                config,
                current: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                expiries: Mutex::new(HashMap::new()),
                clock: expiry::Clock::new(),
                owners: expiry::Owners::new(),
                task: Mutex::new(expiry::ExpiryTask::default()),
                uncertain: Mutex::new(HashSet::new()),
            }),
        };
        backend.session(Operation::Connect).await?;
        Ok(backend)
    }

    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        &self.inner.config
    }

    /// The id of the current ZooKeeper session, if one is open.
    pub fn session_id(&self) -> Option<i64> {
        self.inner.current().map(|s| s.id)
    }

    /// The negotiated timeout of the current session, if one is open.
    pub fn session_timeout(&self) -> Option<Duration> {
        self.inner.current().map(|s| s.timeout)
    }

    /// What the current session says: `Alive`, `Suspect` (disconnected)
    /// or `Lost` (expired or closed; the next call opens a new session).
    /// The same signal is attached to every lease this backend grants.
    pub fn session_state(&self) -> SessionState {
        self.inner.current().map_or_else(
            || SessionState::Lost("no session".to_owned()),
            |s| s.state.borrow().clone(),
        )
    }

    /// The ZooKeeper path of `key`'s lock directory (inside the chroot).
    pub fn key_path(&self, key: &LockKey) -> String {
        paths::key_dir(self.inner.config.root(), key)
    }

    fn op_timeout(&self) -> Duration {
        self.inner.config.op_timeout()
    }

    fn acls(&self) -> zk::Acls<'static> {
        if self.inner.config.digest().is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }

    /// The live session, opening a new one when there is none or the last
    /// one is lost. Leases of a lost session stay lost: they carry that
    /// session's signal, never the new one's.
    async fn session(&self, operation: Operation) -> Result<Arc<Session>, LockError> {
        if let Some(session) = self.inner.current().filter(|s| !s.is_lost()) {
            return Ok(session);
        }
        let _connecting = self.inner.connecting.lock().await;
        if let Some(session) = self.inner.current().filter(|s| !s.is_lost()) {
            return Ok(session);
        }
        let session = Arc::new(self.open_session(operation).await?);
        tracing::debug!(session = session.id, "ZooKeeper session opened");
        *lock(&self.inner.current) = Some(session.clone());
        Ok(session)
    }

    async fn open_session(&self, operation: Operation) -> Result<Session, LockError> {
        let config = &self.inner.config;
        let mut connector = zk::Client::connector().with_session_timeout(config.session_timeout());
        if let Some((user, password)) = config.digest() {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        let connect_string = config.connect_string();
        let client = match timed(config.connect_timeout(), connector.connect(&connect_string)).await
        {
            Ok(client) => client,
            Err(CallError::TimedOut(after)) => {
                return Err(LockError::new(
                    ErrorKind::Unavailable,
                    operation,
                    format!("no ZooKeeper session with {connect_string} within {after:?}"),
                )
                .with_backend(NAME));
            }
            Err(CallError::Zk(err)) => {
                let kind = match err {
                    zk::Error::BadArguments(_) => ErrorKind::Config,
                    zk::Error::AuthFailed => ErrorKind::Config,
                    zk::Error::Timeout => ErrorKind::Unavailable,
                    _ => ErrorKind::Unavailable,
                };
                return Err(LockError::new(
                    kind,
                    operation,
                    format!("cannot open a ZooKeeper session with {connect_string}: {err}"),
                )
                .with_backend(NAME)
                .with_source(err));
            }
        };
        let client = match config.chroot() {
            None => client,
            Some(chroot) => {
                let options = zk::CreateMode::Persistent.with_acls(self.acls());
                match timed(self.op_timeout(), client.mkdir(chroot, &options)).await {
                    // Without permission to create it, it may still exist.
                    Ok(()) | Err(CallError::Zk(zk::Error::NoAuth)) => {}
                    Err(err) => return Err(err.into_lock_error(operation)),
                }
                client.chroot(chroot.to_owned()).map_err(|_| {
                    LockError::config(format!("bad ZooKeeper chroot {chroot:?}")).with_backend(NAME)
                })?
            }
        };
        let watcher = client.state_watcher();
        let (tx, rx) = watch::channel(map_state(watcher.peek_state()));
        let drain = tokio::spawn(drain_states(watcher, tx));
        Ok(Session {
            id: client.session_id().0,
            timeout: client.session_timeout(),
            client,
            state: rx,
            drain,
        })
    }

    fn fail(
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

    /// Creates the key's directory (and missing ancestors): containers
    /// where the server has them, so empty directories go away by
    /// themselves without a client ever deleting a directory a waiter is
    /// about to use.
    async fn ensure_dir(
        &self,
        session: &Session,
        dir: &str,
        operation: Operation,
        key: &LockKey,
    ) -> Result<(), AttemptError> {
        loop {
            let containers = self.inner.containers.load(Ordering::Relaxed);
            let mode = if containers {
                zk::CreateMode::Container
            } else {
                zk::CreateMode::Persistent
            };
            let options = mode.with_acls(self.acls());
            match timed(self.op_timeout(), session.client.mkdir(dir, &options)).await {
                Ok(()) => return Ok(()),
                Err(CallError::Zk(zk::Error::Unimplemented)) if containers => {
                    tracing::info!(
                        "ZooKeeper server has no container nodes; using persistent key directories"
                    );
                    self.inner.containers.store(false, Ordering::Relaxed);
                }
                Err(err) => return Err(Self::fail(session, err, operation, key)),
            }
        }
    }

    /// Creates our `EPHEMERAL_SEQUENTIAL` node. When a reply is lost the
    /// node is looked up by the attempt id in its name before creating
    /// again, so a lost reply does not leave an orphan blocking the key.
    ///
    /// Returns the node's path and `czxid`, and when the create whose reply
    /// came back was sent (`None` when the node was found by a lookup).
    async fn create_node(
        &self,
        session: &Session,
        dir: &str,
        owner: OwnerId,
        operation: Operation,
        key: &LockKey,
    ) -> Result<(String, i64, Option<Instant>), AttemptError> {
        let prefix = paths::node_path_prefix(dir, owner);
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let mut missing_dir = 0;
        let mut unknown = 0;
        loop {
            let sent = Instant::now();
            match timed(
                self.op_timeout(),
                session.client.create(&prefix, &[], &options),
            )
            .await
            {
                Ok((stat, sequence)) => {
                    // The prefix has room for the sequence number.
                    let mut path = prefix;
                    let _ = write!(path, "{sequence}");
                    return Ok((path, stat.czxid, Some(sent)));
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
                    lock(&self.inner.uncertain).insert(owner);
                    return Err(Self::fail(session, err, operation, key));
                }
                // The connection dropped with the reply in flight: look for
                // the node once we are connected again.
                Err(err) if err.outcome_unknown() && unknown < 3 && !session.is_lost() => {
                    unknown += 1;
                    lock(&self.inner.uncertain).insert(owner);
                    tracing::debug!(%key, "create reply lost; looking for our node");
                    if let Some((path, czxid)) = self.find_own(session, dir, owner).await {
                        return Ok((path, czxid, None));
                    }
                }
                Err(err) => return Err(Self::fail(session, err, operation, key)),
            }
        }
    }

    /// Our node in `dir`, found by the attempt id in its name.
    async fn find_own(
        &self,
        session: &Session,
        dir: &str,
        owner: OwnerId,
    ) -> Option<(String, i64)> {
        let children = timed(self.op_timeout(), session.client.list_children(dir))
            .await
            .ok()?;
        let (_, name) = sorted_lock_nodes(children)
            .into_iter()
            .find(|(_, name)| owner_of(name) == Some(owner))?;
        let path = format!("{dir}/{name}");
        let stat = timed(self.op_timeout(), session.client.check_stat(&path))
            .await
            .ok()??;
        Some((path, stat.czxid))
    }

    /// Deletes a node of ours and, if its attempt had a lost create reply,
    /// any other node carrying the same attempt id. Best effort.
    ///
    /// Retried through disconnections: a waiting node left behind by a
    /// live session would block the key for as long as the session lives.
    async fn delete_node(&self, client: &zk::Client, path: &str, dir: &str, owner: OwnerId) {
        let give_up = Instant::now() + CLEANUP_PATIENCE;
        let mut backoff = CLEANUP_RETRY.backoff();
        loop {
            match timed(self.op_timeout(), client.delete(path, None)).await {
                Ok(()) => break,
                Err(err) if err.is(&zk::Error::NoNode) => break,
                // The node went with the session.
                Err(err) if err.ends_session() => return,
                Err(err) if Instant::now() < give_up => {
                    tracing::debug!(%path, ?err, "deleting a lock node failed; retrying");
                    let delay = backoff.next_delay().unwrap_or(Duration::from_secs(1));
                    tokio::time::sleep(delay).await;
                }
                Err(err) => {
                    tracing::warn!(%path, ?err, "could not delete a lock node; it stays until its session ends");
                    return;
                }
            }
        }
        self.sweep_uncertain(client, dir, owner, true).await;
        self.remove_empty_dir(client, dir).await;
    }

    /// Deletes every node of `dir` carrying `owner`'s id, if that attempt
    /// had a create with an unknown outcome. `patient`: keep retrying
    /// through disconnections (background cleanups only).
    async fn sweep_uncertain(&self, client: &zk::Client, dir: &str, owner: OwnerId, patient: bool) {
        {
            let mut uncertain = lock(&self.inner.uncertain);
            // Almost always empty: no hashing then.
            if uncertain.is_empty() || !uncertain.remove(&owner) {
                return;
            }
        }
        let give_up = Instant::now() + CLEANUP_PATIENCE;
        let mut backoff = CLEANUP_RETRY.backoff();
        let children = loop {
            match timed(self.op_timeout(), client.list_children(dir)).await {
                Ok(children) => break children,
                Err(err) if err.is(&zk::Error::NoNode) || err.ends_session() => return,
                Err(_) if patient && Instant::now() < give_up => {
                    let delay = backoff.next_delay().unwrap_or(Duration::from_secs(1));
                    tokio::time::sleep(delay).await;
                }
                Err(err) => {
                    tracing::warn!(%dir, ?err, "could not look for nodes of a lost create reply");
                    return;
                }
            }
        };
        for name in children.iter().filter(|n| owner_of(n) == Some(owner)) {
            let path = format!("{dir}/{name}");
            if patient {
                Box::pin(self.delete_node(client, &path, dir, owner)).await;
            } else {
                let _ = timed(self.op_timeout(), client.delete(&path, None)).await;
            }
        }
    }

    /// Without container nodes, removes the key directory once empty. A
    /// non-empty directory (waiters) is refused by the server, and a waiter
    /// that finds it gone re-creates it, so this never breaks a waiter.
    async fn remove_empty_dir(&self, client: &zk::Client, dir: &str) {
        if !self.inner.containers.load(Ordering::Relaxed) {
            let _ = timed(self.op_timeout(), client.delete(dir, None)).await;
        }
    }

    /// Deletes our node at the end of an attempt that did not get the lock,
    /// with one bounded request; if that fails the cleanup stays armed and
    /// retries in the background when it is dropped.
    async fn withdraw(&self, session: &Session, cleanup: &mut NodeCleanup<'_>) {
        let Some(path) = cleanup.path.clone() else {
            return;
        };
        match timed(self.op_timeout(), session.client.delete(&path, None)).await {
            Err(err) if !err.is(&zk::Error::NoNode) && !err.ends_session() => {}
            _ => {
                cleanup.disarm();
                self.sweep_uncertain(&session.client, cleanup.dir, cleanup.owner, false)
                    .await;
                self.remove_empty_dir(&session.client, cleanup.dir).await;
            }
        }
    }

    /// The lock node of `lease`: its key's directory, a name carrying the
    /// lease's owner id, and the sequence number the lease stores (its
    /// `backend_data`, the digits alone: the rest of the path follows from
    /// the key and the owner, so a held lease keeps a few bytes instead of
    /// the whole path). A full path (what earlier versions stored) is
    /// accepted when it is a lock node of the lease's key and owner.
    /// Anything else is not a lease of ours and is never acted on.
    fn lease_path(&self, lease: &Lease) -> Option<NodeRef> {
        let data = lease.backend_data();
        let root = self.inner.config.root();
        if data.starts_with('/') {
            let (node_dir, name) = paths::split_node(data)?;
            let seq = u32::try_from(sequence_of(name)?).ok()?;
            return (paths::is_key_dir(root, lease.key(), node_dir)
                && owner_of(name) == Some(lease.owner()))
            .then(|| NodeRef {
                path: data.to_owned(),
                dir_len: node_dir.len(),
                seq,
            });
        }
        if data.is_empty() || !data.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let seq: u32 = data.parse().ok()?;
        let dir = paths::key_dir(root, lease.key());
        Some(NodeRef {
            dir_len: dir.len(),
            path: paths::node_path(&dir, lease.owner(), seq),
            seq,
        })
    }

    /// The ZooKeeper path of `lease`'s lock node (inside the chroot), or
    /// `None` when the lease is not a lock node of its key and owner.
    pub fn node_path(&self, lease: &Lease) -> Option<String> {
        self.lease_path(lease).map(|node| node.path)
    }

    /// Whether this backend tracks `lease`'s node and its TTL has not run
    /// out by `at`.
    fn tracked_until(&self, lease: &Lease, seq: u32, at: Instant) -> bool {
        let clock = self.inner.clock;
        self.tracked(lease.owner(), |node| {
            node.seq == seq && !clock.passed(node.due, at)
        })
        .unwrap_or(false)
    }

    /// Moves the deadline of `lease`'s node to `sent + ttl` after a
    /// confirmed renewal. `false` when the node is no longer tracked (its
    /// TTL ran out and the expiry task took it, or it was released), so the
    /// renewal must not be reported.
    fn extend(&self, lease: &Lease, seq: u32, sent: Instant, ttl: Duration) -> bool {
        let clock = self.inner.clock;
        self.tracked(lease.owner(), |node| {
            if node.seq != seq || clock.passed(node.due, sent) {
                return false;
            }
            if clock.passed(node.due, sent + ttl) {
                node.due = clock.deadline(sent + ttl);
            }
            true
        })
        .unwrap_or(false)
    }

    /// One acquisition with a fresh attempt id on `session`.
    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        &self,
        session: &Arc<Session>,
        key: &LockKey,
        dir: &str,
        ttl: Duration,
        deadline: Option<Instant>,
        operation: Operation,
    ) -> Result<Option<Lease>, AttemptError> {
        let owner = self.inner.owners.next();
        let mut cleanup = NodeCleanup {
            backend: self,
            client: &session.client,
            dir,
            owner,
            armed: true,
            path: None,
        };
        let (path, czxid, created_at) = self
            .create_node(session, dir, owner, operation, key)
            .await?;
        cleanup.path = Some(path.clone());
        let name = &path[dir.len() + 1..];
        let token = u64::try_from(czxid).map_err(|_| {
            AttemptError::Lock(
                LockError::new(
                    ErrorKind::Backend,
                    operation,
                    format!("negative czxid {czxid}"),
                )
                .with_key(key)
                .with_backend(NAME),
            )
        })?;
        let mut own_watch: Option<WatchFuture> = None;
        // The first list right after our own create needs no `sync`.
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
            // Skipping it here keeps a free key at create + list: the client
            // may write a `sync` and the list in two packets, and a server
            // that answers the `sync` in between costs one more round trip.
            let (sent, listed) = match after_create.take() {
                Some(create_sent) => (
                    create_sent,
                    timed(self.op_timeout(), session.client.list_children(dir)).await,
                ),
                None => {
                    let sent = Instant::now();
                    let listed = synced(
                        session.client.sync(dir),
                        self.op_timeout(),
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
                    return Err(AttemptError::Lock(
                        LockError::new(
                            ErrorKind::LeaseLost,
                            operation,
                            format!(
                                "the lock directory {dir} was removed while we waited, \
                                 and our node {name} with it"
                            ),
                        )
                        .with_key(key)
                        .with_backend(NAME),
                    ));
                }
                Err(err) => return Err(Self::fail(session, err, operation, key)),
            };
            let mut nodes = sorted_lock_nodes(children);
            // Extra nodes of this attempt (a create retried after a lost
            // reply) would block everyone: remove them.
            nodes.retain(|(_, other)| {
                if *other != name && owner_of(other) == Some(owner) {
                    let client = session.client.clone();
                    let extra = format!("{dir}/{other}");
                    let timeout = self.op_timeout();
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
                return Err(AttemptError::Lock(
                    LockError::new(
                        ErrorKind::LeaseLost,
                        operation,
                        format!(
                            "our lock node {path} was deleted while we waited \
                             (by another client or an administrator)"
                        ),
                    )
                    .with_key(key)
                    .with_backend(NAME),
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
                let lease = Lease::granted(
                    key.clone(),
                    owner,
                    FencingToken::new(token),
                    ttl,
                    sent,
                    seq.to_string(),
                )
                .map_err(|e| AttemptError::Lock(e.with_backend(NAME)))?;
                cleanup.disarm();
                self.schedule_expiry(owner, key.as_str(), seq, sent + ttl);
                return Ok(Some(lease.with_session(session.state.clone())));
            }
            let Some(deadline) = deadline else {
                // A single try: someone holds it; withdraw.
                self.withdraw(session, &mut cleanup).await;
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
                        self.op_timeout(),
                        session.client.check_and_watch_stat(&path)
                    ),
                    timed(
                        self.op_timeout(),
                        session.client.check_and_watch_stat(&predecessor)
                    ),
                );
                match own {
                    Ok((Some(_), watcher)) => own_watch = Some(Box::pin(watcher.changed())),
                    // Gone: the next look reports it.
                    Ok((None, _)) => continue,
                    Err(err) => return Err(Self::fail(session, err, operation, key)),
                }
                pred
            } else {
                // The watch on our own node is still armed from an earlier
                // round: keeping it spares a request before the next list.
                timed(
                    self.op_timeout(),
                    session.client.check_and_watch_stat(&predecessor),
                )
                .await
            };
            let pred_watcher = match pred {
                // Gone between our list and the watch: look again.
                Ok((None, _)) => continue,
                Ok((Some(_), watcher)) => watcher,
                Err(err) => return Err(Self::fail(session, err, operation, key)),
            };
            let mut state = session.state.clone();
            tokio::select! {
                _ = pred_watcher.changed() => {}
                _ = armed(&mut own_watch) => own_watch = None,
                () = wait_lost(&mut state) => return Err(AttemptError::SessionLost),
                () = sleep_until(deadline) => {
                    self.withdraw(session, &mut cleanup).await;
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

    async fn lock_key(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Option<Instant>,
        operation: Operation,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(ttl, MIN_TTL, operation).map_err(|e| e.with_key(key).with_backend(NAME))?;
        let dir = self.key_path(key);
        let mut backoff = RetryPolicy::default().backoff();
        let mut tries_left: u32 = 2;
        loop {
            let session = self.session(operation).await.map_err(|e| e.with_key(key))?;
            match self
                .attempt(&session, key, &dir, ttl, deadline, operation)
                .await
            {
                Ok(result) => return Ok(result),
                // A wait rides out disconnections (an election, a server
                // restart): the failed attempt's node is deleted in the
                // background and a new attempt joins the queue.
                Err(AttemptError::Lock(err))
                    if matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout)
                        && deadline
                            .is_some_and(|d| Instant::now() + Duration::from_millis(100) < d) =>
                {
                    tracing::debug!(%key, %err, "acquire attempt failed; retrying");
                    let delay = backoff.next_delay().unwrap_or(Duration::from_millis(100));
                    tokio::time::sleep(delay).await;
                }
                Err(AttemptError::Lock(err)) => return Err(err),
                Err(AttemptError::SessionLost) => {
                    // Our node went with the session. A new session may try
                    // again while the wait deadline allows.
                    tries_left = tries_left.saturating_sub(1);
                    let delay = backoff.next_delay().unwrap_or(Duration::from_millis(100));
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

type WatchFuture = std::pin::Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>;

/// Waits for an armed watch; never returns when there is none.
async fn armed(watch: &mut Option<WatchFuture>) -> zk::WatchedEvent {
    match watch {
        Some(watch) => watch.as_mut().await,
        None => std::future::pending().await,
    }
}

async fn wait_lost(state: &mut watch::Receiver<SessionState>) {
    loop {
        if matches!(*state.borrow_and_update(), SessionState::Lost(_)) {
            return;
        }
        if state.changed().await.is_err() {
            return;
        }
    }
}

#[async_trait]
impl LockBackend for ZkBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // czxid: strictly increasing per key (grants follow creation
            // order within a directory), and zxids survive leader changes.
            fencing: FencingScope::PerKey,
            fencing_survives_failover: true,
            // Sessions and their ephemeral nodes are in the snapshot and
            // the transaction log, and resume after a restart.
            grants_survive_restart: true,
            waiting: WaitStrategy::Notify,
            fifo: true,
            ttl_model: TtlModel::PerSession,
            linearizable: true,
            min_ttl: MIN_TTL,
            shared_locks: false,
            semaphores: false,
        }
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.lock_key(key, ttl, None, Operation::TryAcquire).await
    }

    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        // Requests have their own timeouts, but a wait must also end near
        // its deadline when the servers stop answering.
        let bounded = tokio::time::timeout_at(
            deadline + ACQUIRE_GRACE,
            self.lock_key(key, ttl, Some(deadline), Operation::Acquire),
        )
        .await
        .map_err(|_| {
            LockError::new(
                ErrorKind::Timeout,
                Operation::Acquire,
                "ZooKeeper did not answer before the wait deadline",
            )
            .with_key(key)
            .with_backend(NAME)
        })?;
        match bounded? {
            Some(lease) => Ok(lease),
            None => Err(LockError::new(
                ErrorKind::Contended,
                Operation::Acquire,
                "still held by another owner at the wait deadline",
            )
            .with_key(key)
            .with_backend(NAME)),
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        let not_held = |why: &str| {
            LockError::new(ErrorKind::NotHeld, Operation::Renew, why.to_owned())
                .with_key(lease.key())
                .with_backend(NAME)
        };
        let Some(node) = self.lease_path(lease) else {
            return Err(not_held(
                "the lease does not name a lock node of its key and owner",
            ));
        };
        if lease
            .session()
            .is_some_and(|s| matches!(*s.borrow(), SessionState::Lost(_)))
        {
            return Err(not_held(
                "the ZooKeeper session that held this lease is gone",
            ));
        }
        let session = self
            .session(Operation::Renew)
            .await
            .map_err(|e| e.with_key(lease.key()))?;
        let sent = Instant::now();
        // A lease this backend already gave up on (its TTL ran out without a
        // renewal: the node is being deleted) is not revived. Every node
        // granted on this session is tracked until released or expired.
        let ours = lease
            .session()
            .is_some_and(|s| s.same_channel(&session.state));
        if ours && !self.tracked_until(lease, node.seq, sent) {
            return Err(not_held(
                "the lease's TTL ran out before this renewal; its node is deleted",
            ));
        }
        // Confirm the node from the leader's view: a follower cut off from
        // the leader would still show it after the leader expired our
        // session and granted the key to someone else (see `synced`).
        match synced(
            session.client.sync(node.dir()),
            self.op_timeout(),
            session.client.check_stat(node.path()),
        )
        .await
        {
            Ok(None) => {
                self.forget_expiry(lease.owner());
                Err(not_held(
                    "the lock node is gone (released, expired, or deleted)",
                ))
            }
            Ok(Some(stat)) if u64::try_from(stat.czxid).ok() != Some(lease.token().get()) => {
                Err(not_held("the lock node was re-created: not this grant"))
            }
            Ok(Some(stat)) if stat.ephemeral_owner != session.id => Err(LockError::new(
                ErrorKind::Unsupported,
                Operation::Renew,
                "the lock node belongs to another ZooKeeper session: it lives as long as that \
                 session and can be released, but not renewed, from here",
            )
            .with_key(lease.key())
            .with_backend(NAME)),
            Ok(Some(_)) => {
                let ttl = lease.ttl().min(session.timeout);
                // Our session's node, no longer tracked: its TTL ran out
                // while the check was in flight (the delete is on its way).
                if !self.extend(lease, node.seq, sent, ttl) {
                    return Err(not_held(
                        "the lease's TTL ran out before this renewal; its node is deleted",
                    ));
                }
                Ok(validity_deadline(sent, ttl))
            }
            Err(err) => Err(err.into_lock_error(Operation::Renew).with_key(lease.key())),
        }
    }

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        // One multi of existence checks per batch (see renew_many.rs).
        self.renew_batch(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        // A lease whose node does not carry its owner id is not ours to act
        // on: another owner's node is never touched.
        let Some(node) = self.lease_path(lease) else {
            return Ok(false);
        };
        let (path, dir) = (node.path(), node.dir());
        let session = self
            .session(Operation::Release)
            .await
            .map_err(|e| e.with_key(lease.key()))?;
        let deleted = match timed(self.op_timeout(), session.client.delete(path, None)).await {
            Ok(()) => true,
            Err(err) if err.is(&zk::Error::NoNode) => false,
            Err(err) => {
                // The local expiry stays armed: it deletes the node later.
                return Err(err
                    .into_lock_error(Operation::Release)
                    .with_key(lease.key()));
            }
        };
        self.forget_expiry(lease.owner());
        self.sweep_uncertain(&session.client, dir, lease.owner(), false)
            .await;
        self.remove_empty_dir(&session.client, dir).await;
        Ok(deleted)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let session = self
            .session(Operation::Inspect)
            .await
            .map_err(|e| e.with_key(key))?;
        let dir = self.key_path(key);
        let fail = |err: CallError| err.into_lock_error(Operation::Inspect).with_key(key);
        // The holder may release between the list and the stat: look again.
        for _ in 0..5 {
            let children = match timed(self.op_timeout(), session.client.list_children(&dir)).await
            {
                Ok(children) => children,
                Err(err) if err.is(&zk::Error::NoNode) => return Ok(None),
                Err(err) => return Err(fail(err)),
            };
            let Some((_, name)) = sorted_lock_nodes(children).into_iter().next() else {
                return Ok(None);
            };
            let path = format!("{dir}/{name}");
            let Some(stat) = timed(self.op_timeout(), session.client.check_stat(&path))
                .await
                .map_err(fail)?
            else {
                continue;
            };
            let seq = sequence_of(&name).and_then(|seq| u32::try_from(seq).ok());
            let clock = self.inner.clock;
            let remaining_ttl = owner_of(&name).and_then(|owner| {
                self.tracked(owner, |node| {
                    (Some(node.seq) == seq).then(|| clock.remaining(node.due, Instant::now()))
                })
                .flatten()
            });
            return Ok(Some(LockInfo {
                key: key.clone(),
                holder: owner_of(&name).map_or(name, OwnerId::to_hex),
                token: u64::try_from(stat.czxid).ok().map(FencingToken::new),
                remaining_ttl,
            }));
        }
        Err(LockError::new(
            ErrorKind::Unavailable,
            Operation::Inspect,
            "the holder kept changing while we looked",
        )
        .with_key(key)
        .with_backend(NAME))
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    use super::*;

    #[test]
    fn connecting_outside_a_runtime_is_a_typed_error() {
        let config = ZkConfig::new(["127.0.0.1:1"]);
        let mut connect = std::pin::pin!(ZkBackend::connect(config));
        let mut cx = Context::from_waker(Waker::noop());
        match connect.as_mut().poll(&mut cx) {
            Poll::Ready(Err(err)) => assert_eq!(err.kind(), ErrorKind::Config, "{err}"),
            other => panic!(
                "expected a config error at once, got {:?}",
                other.map(|r| r.map(|_| ()))
            ),
        }
    }
}
