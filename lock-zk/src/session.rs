//! The backend's ZooKeeper session: opening it (chroot included), the
//! state watcher feeding the lease's session signal, and reads that
//! reflect the leader's view (`synced`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{Lease, LockError, Operation, SessionState};
use tokio::sync::watch;
use zookeeper_client as zk;

use super::{ZkBackend, lock};
use crate::error::{CallError, NAME, connect_error, timed};
use crate::nodelay;

/// One ZooKeeper session and the state signal derived from it.
pub(super) struct Session {
    pub(super) client: zk::Client,
    pub(super) id: i64,
    pub(super) timeout: Duration,
    pub(super) state: watch::Receiver<SessionState>,
    drain: tokio::task::JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.drain.abort();
    }
}

impl Session {
    pub(super) fn is_lost(&self) -> bool {
        matches!(*self.state.borrow(), SessionState::Lost(_))
    }
}

/// Whether the session that handed `lease` out is known to be lost (and
/// the lease's nodes with it).
pub(super) fn session_gone(lease: &Lease) -> bool {
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
/// whole life of the session. Each time the session is connected again
/// (on a new connection), that connection gets `TCP_NODELAY` (see
/// `nodelay.rs`).
async fn drain_states(
    mut watcher: zk::StateWatcher,
    tx: watch::Sender<SessionState>,
    peers: Vec<SocketAddr>,
) {
    loop {
        let state = watcher.changed().await;
        tracing::debug!(%state, "ZooKeeper session state");
        if state == zk::SessionState::SyncConnected {
            nodelay::set_on_connections_to(&peers);
        }
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
/// before either answer is awaited: one extra request, no extra client
/// round trip (the client may write them as two packets, which leave at
/// once since the connection has `TCP_NODELAY`, see `nodelay.rs`; with
/// Nagle on, the read waited for the `sync`'s reply about every other
/// time on loopback), and on a follower one follower-to-leader hop added
/// to the read's latency. Callers create `read` after calling this
/// (the client sends a request when the call is made), e.g.
/// `synced(client, dir, t, client.list_children(dir))`.
///
/// `sync` + read is not a full linearizable read (ZOOKEEPER-1675: a leader
/// that was deposed but has not noticed yet can still answer a `sync`), but
/// such a leader steps down within `syncLimit` ticks and a new leader
/// starts every session's timeout afresh, so it cannot confirm a node that
/// a newer leader has already deleted.
pub(super) async fn synced<T, F>(
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

impl ZkBackend {
    /// The live session, opening a new one when there is none or the last
    /// one is lost. Leases of a lost session stay lost: they carry that
    /// session's signal, never the new one's.
    pub(super) async fn session(&self, operation: Operation) -> Result<Arc<Session>, LockError> {
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
        let peers = nodelay::resolve(config.hosts(), config.connect_timeout()).await;
        let client = timed(config.connect_timeout(), connector.connect(&connect_string))
            .await
            .map_err(|err| connect_error(operation, &connect_string, err))?;
        nodelay::set_on_connections_to(&peers);
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
        let drain = tokio::spawn(drain_states(watcher, tx, peers));
        Ok(Session {
            id: client.session_id().0,
            timeout: client.session_timeout(),
            client,
            state: rx,
            drain,
        })
    }
}
