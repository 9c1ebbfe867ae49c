//! The `zookeeper-client` crate alone: the driver's requests for a mutex
//! acquire + release on a free key, sent through the client library the
//! driver requires, with no lock-zk code on the path but its key layout.
//!
//! [`ZkCrateAlone`] opens one `zookeeper_client::Client` with the driver's
//! session settings (the URL's session timeout, a connection timeout of
//! 3/5 of it, digest credentials, chroot) and sends, per cycle, what the
//! driver's recipe sends on a free key (the `zk_bench_parts` probe's
//! "crate alone" side, written once here for `distlock-compare compare`):
//!
//! 1. `create` of the `EPHEMERAL_SEQUENTIAL` node
//!    `<root>/<escaped key>/_c_<attempt id>-lock-` carrying `<owner
//!    hex>\n<holder details>`, and the `getChildren` of the key directory
//!    made right behind it, before the create's reply is awaited (the
//!    crate sends a request when the call is made): granted when ours has
//!    the lowest sequence;
//! 2. `delete` of the node.
//!
//! A create answered `NoNode` creates the key directory first (a container
//! node, as the driver makes it on a server that has them) and tries
//! again. The whole cycle is bounded by the URL's operation timeout.
//!
//! Between the [`ZkFloor`](super::ZkFloor) (the same requests in jute by
//! hand on a bare socket) and the driver, this is the client library's
//! share: crate alone over floor is the library's, ours over crate alone
//! the driver's.

use std::time::Duration;

use async_trait::async_trait;
use conformance::bench::Contender;
use lock_core::{ErrorKind, HolderDetails, LockError, LockKey, Operation, OwnerId, with_timeout};
use lock_zk::ZkConfig;
use lock_zk::keys::{key_dir, node_path_prefix, sorted_lock_nodes};
use lock_zk::zookeeper_client as zk;

use super::NAME;

/// The driver's mutex cycle through `zookeeper-client` alone, on one
/// client (one session) of its own; see the module docs.
///
/// Calls from several tasks share the client (the crate pipelines them on
/// its one socket): eight independent clients are eight of these.
pub struct ZkCrateAlone {
    client: zk::Client,
    root: String,
    digest: bool,
    op_timeout: Duration,
}

impl std::fmt::Debug for ZkCrateAlone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkCrateAlone")
            .field("session_id", &self.client.session_id().0)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// A `zookeeper-client` error as a [`LockError`] of `operation`.
fn crate_error(operation: Operation, what: &str, err: &zk::Error) -> LockError {
    LockError::new(
        ErrorKind::Backend,
        operation,
        format!("zookeeper-client alone: {what}: {err}"),
    )
    .with_backend(NAME)
}

impl ZkCrateAlone {
    /// Parses `url` like [`lock_zk::connect`] and opens one client of the
    /// crate with the driver's session settings (and its chroot, created
    /// when missing, and the lock root).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for a bad URL; [`ErrorKind::Backend`] when the
    /// ensemble refuses the session or the chroot; `Timeout` past the
    /// URL's connect timeout.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future drops the client being opened (the server
    /// expires its session).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = ZkConfig::from_url(url)?;
        config.validate()?;
        // A `ZkConfig` never gives its password back: read the URL's.
        let (user, password) = lock_core::endpoint::Endpoint::parse(url)?.take_credentials();
        let digest = user.zip(password.map(lock_core::endpoint::Secret::into_inner));
        let op = Operation::Connect;
        let mut connector = zk::Client::connector()
            .with_session_timeout(config.session_timeout())
            .with_connection_timeout(config.session_timeout() * 3 / 5);
        if let Some((user, password)) = &digest {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        let connect_string = config.connect_string();
        let client = with_timeout(config.connect_timeout(), op, async {
            connector
                .connect(&connect_string)
                .await
                .map_err(|e| crate_error(op, "connect", &e))
        })
        .await?;
        let alone = Self {
            client,
            root: config.root().to_owned(),
            digest: digest.is_some(),
            op_timeout: config.op_timeout(),
        };
        let client = match config.chroot() {
            None => alone.client.clone(),
            Some(chroot) => {
                alone.mkdir(chroot, zk::CreateMode::Persistent, op).await?;
                alone
                    .client
                    .clone()
                    .chroot(chroot.to_owned())
                    .map_err(|_| {
                        LockError::config(format!("bad ZooKeeper chroot {chroot:?}"))
                            .with_backend(NAME)
                    })?
            }
        };
        let alone = Self { client, ..alone };
        alone
            .mkdir(&alone.root, zk::CreateMode::Persistent, op)
            .await?;
        Ok(alone)
    }

    fn acls(&self) -> zk::Acls<'static> {
        if self.digest {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }

    /// `mkdir` of `path` (and its parents), an existing one being fine.
    async fn mkdir(
        &self,
        path: &str,
        mode: zk::CreateMode,
        operation: Operation,
    ) -> Result<(), LockError> {
        let options = mode.with_acls(self.acls());
        with_timeout(self.op_timeout, operation, async {
            match self.client.mkdir(path, &options).await {
                Ok(()) | Err(zk::Error::NodeExists) => Ok(()),
                Err(e) => Err(crate_error(operation, "mkdir", &e)),
            }
        })
        .await
    }

    /// The driver's three requests on the free `key` (see the module docs).
    async fn exchange(&self, key: &LockKey) -> Result<(), LockError> {
        let op = Operation::Acquire;
        let dir = key_dir(&self.root, key);
        let owner = OwnerId::random();
        let prefix = node_path_prefix(&dir, owner);
        let details = HolderDetails::encode_current();
        let mut data = String::with_capacity(33 + details.len());
        data.push_str(owner.hex().as_str());
        data.push('\n');
        data.push_str(&details);
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let mut missing_dir = false;
        let (sequence, children) = loop {
            // Both requests are made now, in this order, and awaited
            // together, as the driver's.
            let created = self.client.create(&prefix, data.as_bytes(), &options);
            let listed = self.client.list_children(&dir);
            let (created, listed) = tokio::join!(created, listed);
            match created {
                Ok((_, sequence)) => {
                    break (
                        sequence,
                        listed.map_err(|e| crate_error(op, "getChildren", &e))?,
                    );
                }
                Err(zk::Error::NoNode) if !missing_dir => {
                    missing_dir = true;
                    self.mkdir(&dir, zk::CreateMode::Container, op).await?;
                }
                Err(e) => return Err(crate_error(op, "create", &e)),
            }
        };
        let path = format!("{prefix}{sequence}");
        let ours = path.rsplit('/').next().unwrap_or_default();
        let lowest = sorted_lock_nodes(children).into_iter().next();
        if lowest.as_ref().map(|(_, name)| name.as_str()) != Some(ours) {
            // Not in the steady state (each benchmark task has a key of its
            // own): withdraw and say so.
            let _ = self.client.delete(&path, None).await;
            return Err(LockError::new(
                ErrorKind::Contended,
                op,
                "zookeeper-client alone: the key was held",
            )
            .with_key(key)
            .with_backend(NAME));
        }
        self.client
            .delete(&path, None)
            .await
            .map_err(|e| crate_error(Operation::Release, "delete", &e))
    }
}

#[async_trait]
impl Contender for ZkCrateAlone {
    /// One acquire + release of the free `key`: three requests, two round
    /// trips.
    async fn cycle(&self, key: &str) -> Result<(), LockError> {
        let key = LockKey::new(key)?;
        with_timeout(self.op_timeout, Operation::Acquire, self.exchange(&key))
            .await
            .map_err(|e| e.with_key(&key).with_backend(NAME))
    }
}
