//! The raw floor of an acquire+release cycle, for benchmarks.
//!
//! [`ZkFloor::cycle`] issues exactly the three requests of the driver's
//! uncontended path, by hand on one ZooKeeper session: create the
//! `EPHEMERAL_SEQUENTIAL` lock node `<root>/<escaped key>/_c_<attempt
//! id>-lock-<sequence>` (Curator's protected name, the driver's layout),
//! list the key's directory (our node must have the lowest sequence), and
//! delete the node. That is three round trips per cycle, the same as
//! [`ZkBackend`](crate::ZkBackend)'s `try_acquire` + `release` once its
//! session exists, without the driver's bookkeeping (session table and
//! signal, lease objects, the armed cleanup of nodes whose create reply was
//! lost, local TTL enforcement). The key directory is created on demand
//! (as a container where the server has them) and, without containers,
//! removed after the release, as the driver does.
//!
//! Names and paths come from the driver's own helpers, so the floor's
//! nodes exclude with the driver's (and Curator's) on the same key.
//!
//! It exists so benchmarks (`distlock compare`, this crate's `bench`
//! example) can report "ours / floor" ratios measured in one run. It is not
//! a lock API: use [`ZkBackend`](crate::ZkBackend) for that.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_core::{ErrorKind, LockError, LockKey, Operation, OwnerId, check_ttl, with_timeout};
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::driver::MIN_TTL;
use crate::paths::{key_dir, node_prefix, sorted_lock_nodes};

const NAME: &str = "zookeeper";

/// Hand-issued create / list / delete requests on one ZooKeeper session of
/// its own: the floor our acquire+release cycle is measured against.
///
/// Dropping it (and its clones) closes the session, which removes any node
/// a cancelled cycle left behind.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use lock_zk::floor::ZkFloor;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let floor = ZkFloor::connect("zk://127.0.0.1:2181").await?;
/// floor.cycle("bench/0", Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
pub struct ZkFloor {
    client: zk::Client,
    root: String,
    acls: zk::Acls<'static>,
    /// Key directories as containers; cleared when the server has none.
    containers: AtomicBool,
    op_timeout: Duration,
}

impl fmt::Debug for ZkFloor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkFloor")
            .field("session_id", &self.client.session_id().0)
            .field("root", &self.root)
            .field("op_timeout", &self.op_timeout)
            .finish_non_exhaustive()
    }
}

/// A request's failure as a [`LockError`], by the driver's rules: a
/// broken connection or a gone session is `Unavailable`, the client's own
/// timeout `Timeout`, bad arguments `InvalidArgument`, the rest `Backend`.
fn zk_error(op: Operation, err: zk::Error) -> LockError {
    let kind = match &err {
        zk::Error::ConnectionLoss
        | zk::Error::Custom(_)
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
    LockError::new(kind, op, format!("ZooKeeper: {err}"))
        .with_backend(NAME)
        .with_source(err)
}

impl ZkFloor {
    /// Parses `url` like [`crate::connect`] (same syntax and options) and
    /// opens a session of its own: session timeout, digest credentials,
    /// chroot (created when missing) and lock root as the driver uses them.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for a bad URL or rejected credentials;
    /// [`ErrorKind::Unavailable`] / [`ErrorKind::Timeout`] when no session
    /// can be opened within the connect timeout.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes the half-opened session. A chroot
    /// created meanwhile stays (as the driver leaves it).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::open(&ZkConfig::from_url(url)?).await
    }

    /// A floor with the same configuration as `backend` (servers, chroot,
    /// root, credentials, timeouts), on a session of its own: the driver's
    /// session is not shared, so the floor measures the same requests
    /// without contending on the driver's state.
    ///
    /// # Errors
    ///
    /// As [`ZkFloor::connect`], less the URL errors.
    ///
    /// # Cancel safety
    ///
    /// As [`ZkFloor::connect`].
    pub async fn from_backend(backend: &crate::ZkBackend) -> Result<Self, LockError> {
        Self::open(backend.config()).await
    }

    async fn open(config: &ZkConfig) -> Result<Self, LockError> {
        config.validate()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(
                LockError::config("the ZooKeeper floor needs a Tokio runtime").with_backend(NAME),
            );
        }
        let op = Operation::Connect;
        let mut connector = zk::Client::connector().with_session_timeout(config.session_timeout());
        if let Some((user, password)) = config.digest() {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        let acls = if config.digest().is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        };
        let connect_string = config.connect_string();
        let client = match tokio::time::timeout(
            config.connect_timeout(),
            connector.connect(&connect_string),
        )
        .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(err)) => {
                let kind = match err {
                    zk::Error::BadArguments(_) | zk::Error::AuthFailed => ErrorKind::Config,
                    _ => ErrorKind::Unavailable,
                };
                return Err(LockError::new(
                    kind,
                    op,
                    format!("cannot open a ZooKeeper session with {connect_string}: {err}"),
                )
                .with_backend(NAME)
                .with_source(err));
            }
            Err(_) => {
                return Err(LockError::new(
                    ErrorKind::Unavailable,
                    op,
                    format!(
                        "no ZooKeeper session with {connect_string} within {:?}",
                        config.connect_timeout()
                    ),
                )
                .with_backend(NAME));
            }
        };
        let client = match config.chroot() {
            None => client,
            Some(chroot) => {
                let options = zk::CreateMode::Persistent.with_acls(acls);
                let made =
                    tokio::time::timeout(config.op_timeout(), client.mkdir(chroot, &options)).await;
                match made {
                    // Without permission to create it, it may still exist.
                    Ok(Ok(()) | Err(zk::Error::NoAuth)) => {}
                    Ok(Err(err)) => return Err(zk_error(op, err)),
                    Err(_) => {
                        return Err(LockError::new(
                            ErrorKind::Timeout,
                            op,
                            "ZooKeeper did not create the chroot in time",
                        )
                        .with_backend(NAME));
                    }
                }
                client.chroot(chroot.to_owned()).map_err(|_| {
                    LockError::config(format!("bad ZooKeeper chroot {chroot:?}")).with_backend(NAME)
                })?
            }
        };
        Ok(Self {
            client,
            root: config.root().to_owned(),
            acls,
            containers: AtomicBool::new(config.containers()),
            op_timeout: config.op_timeout(),
        })
    }

    /// The id of the floor's ZooKeeper session.
    pub fn session_id(&self) -> i64 {
        self.client.session_id().0
    }

    /// One request, bounded by the operation timeout.
    async fn call<T>(
        &self,
        op: Operation,
        request: impl Future<Output = Result<T, zk::Error>>,
    ) -> Result<Result<T, zk::Error>, LockError> {
        with_timeout(self.op_timeout, op, async { Ok(request.await) })
            .await
            .map_err(|e| e.with_backend(NAME))
    }

    /// Creates the key directory (and missing ancestors), as a container
    /// where the server has them.
    async fn ensure_dir(&self, dir: &str, op: Operation) -> Result<(), LockError> {
        loop {
            let containers = self.containers.load(Ordering::Relaxed);
            let mode = if containers {
                zk::CreateMode::Container
            } else {
                zk::CreateMode::Persistent
            };
            let options = mode.with_acls(self.acls);
            match self.call(op, self.client.mkdir(dir, &options)).await? {
                Ok(()) => return Ok(()),
                Err(zk::Error::Unimplemented) if containers => {
                    self.containers.store(false, Ordering::Relaxed);
                }
                Err(err) => return Err(zk_error(op, err)),
            }
        }
    }

    /// One acquire + one release of `key` by hand: create our ephemeral
    /// sequential node, list the directory (ours must come first), delete
    /// the node; each request bounded by the configured operation timeout.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for a key or TTL the driver would
    /// refuse; [`ErrorKind::Contended`] when an earlier node holds `key`
    /// (ours is deleted again: the floor never waits);
    /// [`ErrorKind::LeaseLost`] / [`ErrorKind::NotHeld`] when our node
    /// vanished before the list / the delete (deleted by someone else, or
    /// the session expired); `Unavailable` / `Timeout` / `Backend` for
    /// ZooKeeper failures.
    ///
    /// # Cancel safety
    ///
    /// Not a lock API: dropping the future after the create was sent may
    /// leave our node behind; later cycles on `key` then fail with
    /// `Contended` until the floor is dropped (its session closes and the
    /// server deletes the node). Nothing else is left behind.
    pub async fn cycle(&self, key: &str, ttl: Duration) -> Result<(), LockError> {
        let key = LockKey::new(key)?;
        let op = Operation::TryAcquire;
        check_ttl(ttl, MIN_TTL, op).map_err(|e| e.with_key(&key).with_backend(NAME))?;
        let dir = key_dir(&self.root, &key);
        let prefix = format!("{dir}/{}", node_prefix(OwnerId::random()));
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.acls);
        let mut missing_dir = 0;
        let path = loop {
            match self
                .call(op, self.client.create(&prefix, &[], &options))
                .await
                .map_err(|e| e.with_key(&key))?
            {
                Ok((_, sequence)) => break format!("{prefix}{sequence}"),
                Err(zk::Error::NoNode) if missing_dir < 3 => {
                    missing_dir += 1;
                    self.ensure_dir(&dir, op)
                        .await
                        .map_err(|e| e.with_key(&key))?;
                }
                Err(err) => return Err(zk_error(op, err).with_key(&key)),
            }
        };
        let name = &path[dir.len() + 1..];
        let listed = self
            .call(op, self.client.list_children(&dir))
            .await
            .and_then(|r| r.map_err(|e| zk_error(op, e)));
        let first = match listed {
            // Whether ours has the lowest sequence; `None` when it is gone.
            Ok(children) => sorted_lock_nodes(children)
                .iter()
                .position(|(_, node)| node == name)
                .map(|index| index == 0),
            Err(err) => {
                // Withdraw, best effort, and report the list's failure.
                let _ = self.call(op, self.client.delete(&path, None)).await;
                return Err(err.with_key(&key));
            }
        };
        let op = match first {
            Some(true) => Operation::Release,
            _ => op,
        };
        let deleted = self
            .call(op, self.client.delete(&path, None))
            .await
            .map_err(|e| e.with_key(&key))?;
        let refused = |kind: ErrorKind, why: &str| {
            Err(LockError::new(kind, op, why.to_owned())
                .with_key(&key)
                .with_backend(NAME))
        };
        match (first, deleted) {
            (None, _) => {
                return refused(
                    ErrorKind::LeaseLost,
                    "the floor's node was gone before the list (deleted, or the session expired)",
                );
            }
            (Some(false), Ok(()) | Err(zk::Error::NoNode)) => {
                return refused(
                    ErrorKind::Contended,
                    "the floor's key is held by another owner",
                );
            }
            (Some(true), Err(zk::Error::NoNode)) => {
                return refused(
                    ErrorKind::NotHeld,
                    "the floor's node was gone at release (deleted, or the session expired)",
                );
            }
            (_, Err(err)) => return Err(zk_error(op, err).with_key(&key)),
            (Some(true), Ok(())) => {}
        }
        if !self.containers.load(Ordering::Relaxed) {
            // The driver's remove_empty_dir: refused while others wait.
            let _ = self.call(op, self.client.delete(&dir, None)).await;
        }
        Ok(())
    }
}
