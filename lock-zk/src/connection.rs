//! Making and keeping the ZooKeeper session: [`Connection`] opens it
//! (chroot included) and opens a new one when it is lost, the state
//! watcher feeds the leases' session signal, and `synced` makes reads that
//! reflect the leader's view. Also what every component asks of the
//! connection: the request timeout, the ACLs, a key's directory.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lock_core::{Lease, LockError, LockKey, Operation, SessionState};
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::config::{ZkConfig, ZkLayout};
use crate::error::{CallError, NAME, connect_error, timed};
use crate::keys;

/// Locks a mutex of the driver's state. No code path panics while holding
/// one; recover anyway.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One ZooKeeper session and the state signal derived from it.
pub(crate) struct Session {
    pub(crate) client: zk::Client,
    pub(crate) id: i64,
    pub(crate) timeout: Duration,
    pub(crate) state: watch::Receiver<SessionState>,
    drain: tokio::task::JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.drain.abort();
    }
}

impl Session {
    pub(crate) fn is_lost(&self) -> bool {
        matches!(*self.state.borrow(), SessionState::Lost(_))
    }
}

/// Whether the session that handed `lease` out is known to be lost (and
/// the lease's nodes with it).
pub(crate) fn session_gone(lease: &Lease) -> bool {
    lease
        .session()
        .is_some_and(|s| matches!(*s.borrow(), SessionState::Lost(_)))
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
/// before either answer is awaited: one extra request, and on a follower
/// one follower-to-leader hop added to the read's latency. (The client
/// crate writes each request as it takes it, with Nagle's algorithm on,
/// so the read may wait for the `sync`'s reply to leave: a client round
/// trip the crate could save by setting `TCP_NODELAY`.) Callers create `read` after calling this
/// (the client sends a request when the call is made), e.g.
/// `synced(client, dir, t, client.list_children(dir))`.
///
/// `sync` + read is not a full linearizable read (ZOOKEEPER-1675: a leader
/// that was deposed but has not noticed yet can still answer a `sync`), but
/// such a leader steps down within `syncLimit` ticks and a new leader
/// starts every session's timeout afresh, so it cannot confirm a node that
/// a newer leader has already deleted.
pub(crate) async fn synced<T, F>(
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

/// The backend's connection to the ensemble: its configuration and the
/// current session (one per backend, replaced when lost).
pub(crate) struct Connection {
    config: ZkConfig,
    current: Mutex<Option<Arc<Session>>>,
    connecting: tokio::sync::Mutex<()>,
    /// Key directories as container nodes; cleared when the server has
    /// none.
    containers: AtomicBool,
}

impl Connection {
    pub(crate) fn new(config: ZkConfig) -> Self {
        Self {
            containers: AtomicBool::new(config.containers()),
            config,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    pub(crate) fn config(&self) -> &ZkConfig {
        &self.config
    }

    /// The current session, lost or not, if one was opened.
    pub(crate) fn current(&self) -> Option<Arc<Session>> {
        lock(&self.current).clone()
    }

    pub(crate) fn op_timeout(&self) -> Duration {
        self.config.op_timeout()
    }

    pub(crate) fn acls(&self) -> zk::Acls<'static> {
        if self.config.digest().is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }

    /// Whether key directories are made as container nodes.
    pub(crate) fn containers(&self) -> bool {
        self.containers.load(Ordering::Relaxed)
    }

    /// The server has no container nodes: plain directories from now on.
    pub(crate) fn no_containers(&self) {
        self.containers.store(false, Ordering::Relaxed);
    }

    /// The ZooKeeper path of `key`'s lock directory (inside the chroot).
    pub(crate) fn key_path(&self, key: &LockKey) -> String {
        keys::mutex_dir_of(self.config.root(), self.config.layout(), key.as_str())
    }

    /// [`Self::key_path`], refused with `InvalidArgument` when the path
    /// layout's key is not a valid lock path.
    pub(crate) fn checked_key_path(
        &self,
        key: &LockKey,
        operation: Operation,
    ) -> Result<String, LockError> {
        if keys::layout_of(self.config.layout(), key.as_str()) == ZkLayout::Path {
            keys::check_path_key(key).map_err(|why| {
                LockError::invalid_argument(operation, why)
                    .with_key(key)
                    .with_backend(NAME)
            })?;
        }
        Ok(self.key_path(key))
    }

    /// Whether `dir` is a path-layout lock directory outside the root
    /// (another library's path): never removed, never a container.
    pub(crate) fn is_foreign_dir(&self, dir: &str) -> bool {
        self.config.layout() == ZkLayout::Path
            && !dir
                .strip_prefix(self.config.root())
                .is_some_and(|rest| rest.starts_with('/'))
    }

    /// The children of `parent` (the root, or a shape's `.` directory), or
    /// none when it does not exist yet.
    pub(crate) async fn children_of(
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

    /// The live session, opening a new one when there is none or the last
    /// one is lost. Leases of a lost session stay lost: they carry that
    /// session's signal, never the new one's.
    pub(crate) async fn session(&self, operation: Operation) -> Result<Arc<Session>, LockError> {
        if let Some(session) = self.current().filter(|s| !s.is_lost()) {
            return Ok(session);
        }
        // Boxed: opening a session is rare, and its futures inline would
        // enlarge every grant's and release's future (copied into
        // async_trait's box at each call).
        Box::pin(self.reopen(operation)).await
    }

    /// [`Self::session`]'s slow path: a new session, unless another caller
    /// opened one meanwhile.
    async fn reopen(&self, operation: Operation) -> Result<Arc<Session>, LockError> {
        let _connecting = self.connecting.lock().await;
        if let Some(session) = self.current().filter(|s| !s.is_lost()) {
            return Ok(session);
        }
        let session = Arc::new(self.open_session(operation).await?);
        tracing::debug!(session = session.id, "ZooKeeper session opened");
        *lock(&self.current) = Some(session.clone());
        Ok(session)
    }

    async fn open_session(&self, operation: Operation) -> Result<Session, LockError> {
        let config = &self.config;
        // The client declares a connection dead after this long without a
        // byte from the server (and moves to another server, the session
        // living on). Its default is 2/5 of the session timeout (800 ms of
        // a 2 s session), which a loaded host's scheduling alone can
        // exceed; 3/5 is the most it accepts, near the Java client's 2/3.
        let mut connector = zk::Client::connector()
            .with_session_timeout(config.session_timeout())
            .with_connection_timeout(config.session_timeout() * 3 / 5);
        if let Some((user, password)) = config.digest() {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        let connect_string = config.connect_string();
        let client = timed(config.connect_timeout(), connector.connect(&connect_string))
            .await
            .map_err(|err| connect_error(operation, &connect_string, err))?;
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
}
