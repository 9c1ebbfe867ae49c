//! The raw floor of an acquire+release cycle, for benchmarks: ZooKeeper's
//! wire protocol written by hand on **one bare TCP connection**.
//!
//! [`ZkFloor`] does not use the driver's client (nor any ZooKeeper client
//! crate): it opens one `TcpStream`, performs the session handshake itself
//! and speaks jute (the `wire` submodule) on it. A cycle is what the driver's
//! recipe does on a free key, three requests in two round trips:
//!
//! 1. `create2` of the `EPHEMERAL_SEQUENTIAL` node
//!    `<root>/<escaped key>/_c_<attempt id>-lock-` (Curator's protected
//!    name; the server appends the sequence), carrying what the driver's
//!    node carries (the attempt id in hex and the holder details, encoded
//!    once per floor as the Redis and SQL floors do); its `czxid` is the
//!    token; and, in the same write, `getChildren` of the key directory (the
//!    server answers it after applying the create): granted when ours has
//!    the lowest sequence (otherwise the node is deleted again and the key
//!    is reported held);
//! 2. `delete` of the node (the release).
//!
//! Outside the steady state: a create answered `NoNode` creates the key
//! directory first (as a container where the server has them, like the
//! driver), and without containers the release also deletes the emptied
//! directory, as the driver does. Names and paths come from the driver's
//! own helpers (its public `keys` module), so the floor's nodes exclude with the
//! driver's (and Curator's) on the same key.
//!
//! The session: the handshake asks for the configured session timeout;
//! digest credentials from the URL are sent as an `auth` packet; a chroot
//! prefixes every path (and is created at connect when missing). A task of
//! the floor's own pings (`xid -2`) when the connection has been idle for a
//! third of the negotiated timeout, so an idle floor keeps its session; it
//! sends nothing while cycles run. Dropping the floor sends `closeSession`
//! (best effort), so its nodes go at once. The connection's own part (the
//! handshake, writing a request and reading its reply, the pings, the
//! `closeSession`) is the private `conn` submodule; the node requests and
//! the cycle are here, and [`ZkPermitFloor`] (one permit of a semaphore,
//! on a floor's connection) is the `permit` submodule.
//!
//! Each request is bounded by the operation timeout. A timeout, an I/O
//! error, a malformed packet or a call cancelled mid-request leaves the
//! connection in an unknown state: the floor then answers
//! [`ErrorKind::Unavailable`] to every later call (it never reconnects; it
//! is a measuring instrument, not a lock API: use
//! [`ZkBackend`](lock_zk::ZkBackend) for that).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use conformance::floor::{FloorGrant, RawFloor};
use lock_core::{ErrorKind, LockError, LockKey, Operation, OwnerId, check_ttl};
use tokio::sync::Mutex;

// The bare connection: handshake, request exchange, keep-alive pings.
mod conn;
// The driver's requests through the client crate alone.
mod crate_alone;
// One permit of a semaphore, by hand on the same kind of connection.
mod permit;
// ZooKeeper's wire format (jute), as much of it as the floors speak.
mod wire;
use conn::{Conn, handshake, keep_alive};
pub use crate_alone::ZkCrateAlone;
pub use permit::ZkPermitFloor;

use lock_zk::keys::{
    is_key_dir, key_dir, node_path_prefix, owner_of, sorted_lock_nodes, split_node,
};
use lock_zk::{MIN_TTL, ZkConfig};
use wire::{Decoder, Encoder, WireError, code, code_name, flags, op, xid};

/// The driver's backend name ([`lock_zk::ZkBackend`]'s `name()`), which
/// the floor's errors carry as the driver's do.
const NAME: &str = "zookeeper";

// The driver's hooks in `crate::for_driver`.
crate::floor_fn!(pub(crate) fn floor = ZkFloor::connect);
crate::floor_fn!(pub(crate) fn permit_floor = one_of_four);

/// One permit of a semaphore of 4 per cycle (the hook's contract).
async fn one_of_four(url: &str) -> Result<ZkPermitFloor, LockError> {
    ZkPermitFloor::connect(url, 4).await
}

/// Hand-written create + getChildren (one write) / delete requests on one bare TCP
/// connection with a ZooKeeper session of its own: the floor our
/// acquire+release cycle is measured against. Serves one call at a time
/// (concurrent calls queue on the connection).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use conformance::floor::RawFloor;
/// use lock_bench::zk::ZkFloor;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let floor = ZkFloor::connect("zk://127.0.0.1:2181").await?;
/// assert_eq!(floor.round_trips_per_cycle(), 2);
/// floor.cycle("bench/0", Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
pub struct ZkFloor {
    shared: Arc<Shared>,
    /// The keep-alive task, started once the session is set up.
    pinger: Option<tokio::task::JoinHandle<()>>,
}

struct Shared {
    conn: Mutex<Conn>,
    session_id: i64,
    session_timeout: Duration,
    /// Prefixed to every path sent ("" without a chroot).
    chroot: String,
    root: String,
    /// `auth:` (creator) ACLs when digest credentials were given.
    digest: bool,
    /// Key directories as containers; cleared when the server has none.
    containers: AtomicBool,
    op_timeout: Duration,
    /// The holder details the driver writes into its nodes beside the
    /// owner (encoded once, as the Redis and SQL floors do).
    details: String,
}

impl fmt::Debug for ZkFloor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkFloor")
            .field("session_id", &format_args!("{:#x}", self.shared.session_id))
            .field("session_timeout", &self.shared.session_timeout)
            .field("chroot", &self.shared.chroot)
            .field("root", &self.shared.root)
            .field("op_timeout", &self.shared.op_timeout)
            .finish_non_exhaustive()
    }
}

impl Drop for ZkFloor {
    fn drop(&mut self) {
        if let Some(pinger) = &self.pinger {
            pinger.abort();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // The server expires the session after its timeout.
            return;
        };
        let shared = self.shared.clone();
        runtime.spawn(async move {
            let patience = shared.op_timeout.min(Duration::from_secs(2));
            shared.conn.lock().await.close(patience).await;
        });
    }
}

fn wire_error(operation: Operation, err: WireError) -> LockError {
    let kind = match &err {
        WireError::TimedOut => ErrorKind::Timeout,
        WireError::Frame(_) => ErrorKind::Backend,
        WireError::Io(_) | WireError::Broken(_) => ErrorKind::Unavailable,
    };
    LockError::new(kind, operation, format!("ZooKeeper floor: {err}"))
        .with_backend(NAME)
        .with_source(err)
}

/// A reply error code as a [`LockError`], by the driver's rules.
fn server_error(operation: Operation, err: i32, what: &str) -> LockError {
    let kind = match err {
        // connection loss, operation timeout, session expired / moved,
        // not read-only, request timeout, throttled
        -4 | -7 | -112 | -118 | -119 | -122 | -127 => ErrorKind::Unavailable,
        -8 => ErrorKind::InvalidArgument,
        _ => ErrorKind::Backend,
    };
    LockError::new(
        kind,
        operation,
        format!("ZooKeeper refused {what}: {} ({err})", code_name(err)),
    )
    .with_backend(NAME)
}

fn protocol(operation: Operation, why: String) -> LockError {
    wire_error(operation, WireError::Frame(why))
}

/// A single try's key, once `ttl` passed the driver's minimum (both
/// floors' `try_grant` start here).
fn try_grant_key(key: &str, ttl: Duration) -> Result<LockKey, LockError> {
    let key = LockKey::new(key)?;
    check_ttl(ttl, MIN_TTL, Operation::TryAcquire)
        .map_err(|e| e.with_key(&key).with_backend(NAME))?;
    Ok(key)
}

/// The grant of `owner`'s node `handle` on `key`.
fn floor_grant(key: &LockKey, owner: OwnerId, token: u64, handle: String) -> FloorGrant {
    FloorGrant {
        key: key.as_str().to_owned(),
        owner: owner.to_hex(),
        token,
        handle,
    }
}

impl ZkFloor {
    /// Parses `url` like [`lock_zk::connect`] (same syntax and options) and
    /// opens one TCP connection with a session of its own: session timeout,
    /// digest credentials, chroot (created when missing) and lock root as
    /// the driver uses them. The servers are tried in order.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for a bad URL or rejected credentials;
    /// [`ErrorKind::Unavailable`] when no server grants a session within
    /// the connect timeout; `Timeout` / `Backend` when the chroot cannot be
    /// created.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes the connection (the server then
    /// expires the half-opened session). A chroot created meanwhile stays.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = ZkConfig::from_url(url)?;
        // A `ZkConfig` never gives its password back: the floor reads the
        // credentials from the URL itself (`from_url` has checked them).
        let (user, password) = lock_core::endpoint::Endpoint::parse(url)?.take_credentials();
        let digest = user.zip(password.map(lock_core::endpoint::Secret::into_inner));
        Self::open(
            &config,
            digest.as_ref().map(|(u, p)| (u.as_str(), p.as_str())),
        )
        .await
    }

    /// A floor with the same configuration as `backend` (servers, chroot,
    /// root, timeouts) on a connection and session of its own: nothing of
    /// the driver's client is shared.
    ///
    /// # Errors
    ///
    /// As [`ZkFloor::connect`], less the URL errors; [`ErrorKind::Config`]
    /// for a backend with digest credentials (which its configuration does
    /// not give back: use [`ZkFloor::connect`] with the URL).
    ///
    /// # Cancel safety
    ///
    /// As [`ZkFloor::connect`].
    pub async fn from_backend(backend: &lock_zk::ZkBackend) -> Result<Self, LockError> {
        if backend.config().digest_user().is_some() {
            return Err(LockError::config(
                "the floor cannot read a backend's digest password: connect it with the URL",
            )
            .with_backend(NAME));
        }
        Self::open(backend.config(), None).await
    }

    async fn open(config: &ZkConfig, digest: Option<(&str, &str)>) -> Result<Self, LockError> {
        config.validate()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(
                LockError::config("the ZooKeeper floor needs a Tokio runtime").with_backend(NAME),
            );
        }
        let (conn, session) = handshake(config).await?;
        let shared = Arc::new(Shared {
            conn: Mutex::new(conn),
            session_id: session.session_id,
            session_timeout: Duration::from_millis(u64::try_from(session.timeout_ms).unwrap_or(1)),
            chroot: String::new(),
            root: config.root().to_owned(),
            digest: digest.is_some(),
            containers: AtomicBool::new(config.containers()),
            op_timeout: config.op_timeout(),
            details: lock_core::HolderDetails::encode_current(),
        });
        // From here on, dropping `floor` closes the session.
        let mut floor = Self {
            shared,
            pinger: None,
        };
        if let Some((user, password)) = digest {
            floor.authenticate(user, password).await?;
        }
        if let Some(chroot) = config.chroot() {
            match floor
                .mkdir(chroot, flags::PERSISTENT, Operation::Connect)
                .await
            {
                // Without permission to create it, it may still exist.
                Ok(()) | Err(Refused(code::NO_AUTH)) => {}
                Err(Refused(err)) => {
                    return Err(server_error(Operation::Connect, err, "creating the chroot"));
                }
                Err(Failed(err)) => return Err(err),
            }
            let Some(shared) = Arc::get_mut(&mut floor.shared) else {
                return Err(LockError::new(
                    ErrorKind::Backend,
                    Operation::Connect,
                    "the floor's state is shared before it was set up",
                )
                .with_backend(NAME));
            };
            chroot.clone_into(&mut shared.chroot);
        }
        floor.pinger = Some(tokio::spawn(keep_alive(
            Arc::downgrade(&floor.shared),
            floor.shared.session_timeout / 3,
        )));
        Ok(floor)
    }

    /// The id of the floor's ZooKeeper session.
    pub fn session_id(&self) -> i64 {
        self.shared.session_id
    }

    /// The session timeout the server granted.
    pub fn session_timeout(&self) -> Duration {
        self.shared.session_timeout
    }

    /// One ping and its reply: one round trip, nothing else (for
    /// measurements that need a known extra request).
    ///
    /// # Errors
    ///
    /// `Unavailable` / `Timeout` / `Backend` when the connection fails.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future mid-request makes the floor unusable.
    pub async fn ping(&self) -> Result<(), LockError> {
        let mut conn = self.shared.conn.lock().await;
        let packet = Encoder::request(xid::PING, op::PING).finish();
        let (err, _) = conn
            .exchange(packet, xid::PING, self.shared.op_timeout)
            .await
            .map_err(|e| wire_error(Operation::Inspect, e))?;
        if err != code::OK {
            return Err(server_error(Operation::Inspect, err, "a ping"));
        }
        Ok(())
    }

    /// One acquire + one release of `key`: [`RawFloor::cycle`].
    ///
    /// # Errors
    ///
    /// As [`RawFloor::cycle`].
    ///
    /// # Cancel safety
    ///
    /// As [`RawFloor::try_grant`]; a call dropped mid-request also makes
    /// the floor unusable (later calls are `Unavailable`).
    pub async fn cycle(&self, key: &str, ttl: Duration) -> Result<(), LockError> {
        RawFloor::cycle(self, key, ttl).await
    }

    async fn authenticate(&self, user: &str, password: &str) -> Result<(), LockError> {
        let mut packet = Encoder::request(xid::AUTH, op::AUTH);
        packet
            .int(0)
            .string("digest")
            .buffer(format!("{user}:{password}").as_bytes());
        let mut conn = self.shared.conn.lock().await;
        let (err, _) = conn
            .exchange(packet.finish(), xid::AUTH, self.shared.op_timeout)
            .await
            .map_err(|e| wire_error(Operation::Connect, e))?;
        match err {
            code::OK => Ok(()),
            code::AUTH_FAILED => Err(LockError::config(
                "ZooKeeper rejected the floor's digest credentials",
            )
            .with_backend(NAME)),
            err => Err(server_error(Operation::Connect, err, "the credentials")),
        }
    }

    /// One request: its reply's error code and body.
    async fn request(
        &self,
        operation: Operation,
        opcode: i32,
        body: impl FnOnce(&mut Encoder),
    ) -> Result<(i32, Vec<u8>), LockError> {
        let mut conn = self.shared.conn.lock().await;
        let xid = conn.take_xid();
        let mut packet = Encoder::request(xid, opcode);
        body(&mut packet);
        conn.exchange(packet.finish(), xid, self.shared.op_timeout)
            .await
            .map_err(|e| wire_error(operation, e))
    }

    fn server_path(&self, path: &str) -> String {
        format!("{}{path}", self.shared.chroot)
    }

    /// `create2` (or `createContainer`) of `path` with our ACL; the
    /// created path (inside the chroot) and its `czxid`.
    async fn create(
        &self,
        operation: Operation,
        path: &str,
        mode: i32,
        data: &[u8],
    ) -> Result<(String, i64), Outcome> {
        let opcode = if mode == flags::CONTAINER {
            op::CREATE_CONTAINER
        } else {
            op::CREATE2
        };
        let server_path = self.server_path(path);
        let reply = self
            .request(operation, opcode, |packet| {
                self.create_body(packet, &server_path, mode, data);
            })
            .await
            .map_err(Failed)?;
        self.created(operation, reply)
    }

    /// A create request's body: `server_path` with our ACL, in `mode`.
    fn create_body(&self, packet: &mut Encoder, server_path: &str, mode: i32, data: &[u8]) {
        let (scheme, id) = if self.shared.digest {
            ("auth", "")
        } else {
            ("world", "anyone")
        };
        packet
            .string(server_path)
            .buffer(data)
            .acl(scheme, id)
            .int(mode);
    }

    /// A create's reply (error code, body): the created path (inside the
    /// chroot) and its `czxid`.
    fn created(
        &self,
        operation: Operation,
        (err, body): (i32, Vec<u8>),
    ) -> Result<(String, i64), Outcome> {
        if err != code::OK {
            return Err(Refused(err));
        }
        let mut decoder = Decoder::new(&body);
        let decoded = decoder
            .string()
            .and_then(|created| Ok((created, decoder.stat_czxid()?)));
        let (created, czxid) = decoded.map_err(|e| Failed(wire_error(operation, e)))?;
        let created = created
            .strip_prefix(self.shared.chroot.as_str())
            .filter(|p| p.starts_with('/'))
            .ok_or_else(|| {
                Failed(protocol(
                    operation,
                    format!("created path {created:?} is outside the chroot"),
                ))
            })?;
        Ok((created.to_owned(), czxid))
    }

    /// Creates `path` and its missing ancestors (inside the chroot), like
    /// the driver's client does: walk up on `NoNode`, then down again.
    async fn mkdir(&self, path: &str, mode: i32, operation: Operation) -> Result<(), Outcome> {
        let mut end = path.len();
        loop {
            match self.create(operation, &path[..end], mode, &[]).await {
                Ok(_) | Err(Refused(code::NODE_EXISTS)) => {
                    if end >= path.len() {
                        return Ok(());
                    }
                    end = path[end + 1..]
                        .find('/')
                        .map_or(path.len(), |i| end + 1 + i);
                }
                Err(Refused(code::NO_NODE)) => match path[..end].rfind('/') {
                    Some(parent) if parent > 0 => end = parent,
                    // The top component cannot be created: the chroot is
                    // missing.
                    _ => return Err(Refused(code::NO_NODE)),
                },
                Err(other) => return Err(other),
            }
        }
    }

    /// Creates the key directory, as a container where the server has them.
    async fn ensure_dir(&self, dir: &str, operation: Operation) -> Result<(), LockError> {
        loop {
            let containers = self.shared.containers.load(Ordering::Relaxed);
            let mode = if containers {
                flags::CONTAINER
            } else {
                flags::PERSISTENT
            };
            match self.mkdir(dir, mode, operation).await {
                Ok(()) => return Ok(()),
                Err(Refused(code::UNIMPLEMENTED)) if containers => {
                    self.shared.containers.store(false, Ordering::Relaxed);
                }
                Err(Refused(err)) => {
                    return Err(server_error(operation, err, "creating the key directory"));
                }
                Err(Failed(err)) => return Err(err),
            }
        }
    }

    /// `delete` of `path` (any version): `Ok(true)` deleted, `Ok(false)`
    /// already gone.
    async fn delete(&self, operation: Operation, path: &str) -> Result<bool, LockError> {
        let server_path = self.server_path(path);
        let (err, _) = self
            .request(operation, op::DELETE, |packet| {
                packet.string(&server_path).int(-1);
            })
            .await?;
        match err {
            code::OK => Ok(true),
            code::NO_NODE => Ok(false),
            err => Err(server_error(operation, err, "a delete")),
        }
    }

    /// `create2` of an `EPHEMERAL_SEQUENTIAL` node at `prefix` in `dir`,
    /// creating `dir` when missing; `what` names the node in a refusal.
    async fn create_in(
        &self,
        operation: Operation,
        dir: &str,
        prefix: &str,
        data: &[u8],
        what: &str,
    ) -> Result<(String, i64), LockError> {
        let mut missing_dir = 0;
        loop {
            match self
                .create(operation, prefix, flags::EPHEMERAL_SEQUENTIAL, data)
                .await
            {
                Ok(created) => return Ok(created),
                Err(Refused(code::NO_NODE)) if missing_dir < 3 => {
                    missing_dir += 1;
                    self.ensure_dir(dir, operation).await?;
                }
                Err(Refused(err)) => return Err(server_error(operation, err, what)),
                Err(Failed(err)) => return Err(err),
            }
        }
    }

    /// `create2` of an `EPHEMERAL_SEQUENTIAL` node at `prefix` in `dir` with
    /// the `getChildren` of `dir` written right behind it, in one write: the
    /// server answers a session's requests in order, and the list only once
    /// the create is applied, so one round trip creates the node and shows
    /// whether it is first. The created node, and what the list answered.
    async fn create_then_list(
        &self,
        operation: Operation,
        dir: &str,
        prefix: &str,
        data: &[u8],
    ) -> Result<((String, i64), Result<Vec<String>, LockError>), Outcome> {
        let (create_path, list_path) = (self.server_path(prefix), self.server_path(dir));
        let mut conn = self.shared.conn.lock().await;
        let (create_xid, list_xid) = (conn.take_xid(), conn.take_xid());
        let mut create = Encoder::request(create_xid, op::CREATE2);
        self.create_body(&mut create, &create_path, flags::EPHEMERAL_SEQUENTIAL, data);
        let mut list = Encoder::request(list_xid, op::GET_CHILDREN);
        list.string(&list_path).boolean(false);
        let mut packets = create.finish();
        packets.extend_from_slice(&list.finish());
        let replies = conn
            .exchange_all(packets, &[create_xid, list_xid], self.shared.op_timeout)
            .await
            .map_err(|e| Failed(wire_error(operation, e)))?;
        drop(conn);
        // `exchange_all` answers one reply per xid, in order.
        let Ok([created, listed]) = <[_; 2]>::try_from(replies) else {
            return Err(Failed(protocol(operation, "a reply is missing".to_owned())));
        };
        Ok((
            self.created(operation, created)?,
            self.children_of(operation, listed),
        ))
    }

    /// An `EPHEMERAL_SEQUENTIAL` node at `prefix` in `dir` and the children
    /// of `dir` once it exists, in one round trip ([`Self::create_then_list`])
    /// where `dir` exists; otherwise `dir` is created and the node created
    /// and listed one request at a time (a key's first grant, or a
    /// container the server removed). On a failed list the node is
    /// withdrawn (best effort). `what` names the node in a refusal. The
    /// node carries what the driver's nodes carry: `owner`'s hex and the
    /// holder details.
    pub(super) async fn create_listed(
        &self,
        operation: Operation,
        dir: &str,
        (prefix, owner): (&str, OwnerId),
        what: &str,
    ) -> Result<(String, i64, Vec<String>), LockError> {
        let data = format!("{}\n{}", owner.to_hex(), self.shared.details);
        let data = data.as_bytes();
        let ((path, czxid), listed) =
            match self.create_then_list(operation, dir, prefix, data).await {
                Ok(done) => done,
                Err(Refused(code::NO_NODE)) => {
                    let (path, czxid) = self.create_in(operation, dir, prefix, data, what).await?;
                    let listed = self.children_after_create(operation, dir, &path).await?;
                    return Ok((path, czxid, listed));
                }
                Err(Refused(err)) => return Err(server_error(operation, err, what)),
                Err(Failed(err)) => return Err(err),
            };
        match listed {
            Ok(children) => Ok((path, czxid, children)),
            Err(err) => {
                let _ = self.delete(operation, &path).await;
                Err(err)
            }
        }
    }

    /// `owner`'s lock node in `dir` (the driver's name for it), created
    /// and listed in one round trip where `dir` exists
    /// ([`Self::create_listed`]): its path, its `czxid`, and whether it has
    /// the lowest sequence (`None` when it was gone before the list).
    /// `what` names the node in a refusal.
    async fn lock_node(
        &self,
        operation: Operation,
        dir: &str,
        owner: OwnerId,
        what: &str,
    ) -> Result<(String, i64, Option<bool>), LockError> {
        let prefix = node_path_prefix(dir, owner);
        let (path, czxid, children) = self
            .create_listed(operation, dir, (&prefix, owner), what)
            .await?;
        if !path.starts_with(prefix.as_str()) {
            return Err(protocol(
                operation,
                format!("created {path:?} for {prefix:?}"),
            ));
        }
        let name = &path[dir.len() + 1..];
        let first = sorted_lock_nodes(children)
            .iter()
            .position(|(_, node)| node == name)
            .map(|index| index == 0);
        Ok((path, czxid, first))
    }

    /// `getChildren` of `dir` right after our `node` was created in it: on
    /// a failure, `node` is withdrawn (best effort) and the list's failure
    /// reported.
    async fn children_after_create(
        &self,
        operation: Operation,
        dir: &str,
        node: &str,
    ) -> Result<Vec<String>, LockError> {
        let listed = self.children(operation, dir).await;
        if listed.is_err() {
            let _ = self.delete(operation, node).await;
        }
        listed
    }

    /// `getChildren` of `path`, without a watch.
    async fn children(&self, operation: Operation, path: &str) -> Result<Vec<String>, LockError> {
        let server_path = self.server_path(path);
        let reply = self
            .request(operation, op::GET_CHILDREN, |packet| {
                packet.string(&server_path).boolean(false);
            })
            .await?;
        self.children_of(operation, reply)
    }

    /// A `getChildren` reply (error code, body): the children's names.
    fn children_of(
        &self,
        operation: Operation,
        (err, body): (i32, Vec<u8>),
    ) -> Result<Vec<String>, LockError> {
        if err != code::OK {
            return Err(server_error(operation, err, "listing the key directory"));
        }
        Decoder::new(&body)
            .strings()
            .map_err(|e| wire_error(operation, e))
    }
}

/// A request the server refused (its error code), or one that failed.
enum Outcome {
    Refused(i32),
    Failed(LockError),
}
use Outcome::{Failed, Refused};

#[async_trait]
impl RawFloor for ZkFloor {
    fn name(&self) -> &'static str {
        NAME
    }

    /// create2 with getChildren written behind it, then delete.
    fn round_trips_per_cycle(&self) -> u32 {
        2
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        let key = try_grant_key(key, ttl)?;
        let op = Operation::TryAcquire;
        let dir = key_dir(&self.shared.root, &key);
        let owner = OwnerId::random();
        let (path, czxid, first) = self
            .lock_node(op, &dir, owner, "the lock node")
            .await
            .map_err(|e| e.with_key(&key))?;
        match first {
            Some(true) => {}
            Some(false) => {
                self.delete(op, &path).await.map_err(|e| e.with_key(&key))?;
                return Ok(None);
            }
            None => {
                return Err(LockError::new(
                    ErrorKind::LeaseLost,
                    op,
                    "the floor's node was gone before the list (deleted, or the session expired)",
                )
                .with_key(&key)
                .with_backend(NAME));
            }
        }
        let token = u64::try_from(czxid)
            .map_err(|_| protocol(op, format!("negative czxid {czxid}")).with_key(&key))?;
        Ok(Some(floor_grant(&key, owner, token, path)))
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        let op = Operation::Release;
        let key = LockKey::new(grant.key.as_str())?;
        // Only a node of this key carrying the grant's owner is touched
        // (the driver's `lease_path` check).
        let Some((dir, _)) = split_node(&grant.handle).filter(|(node_dir, name)| {
            is_key_dir(&self.shared.root, &key, node_dir)
                && owner_of(name).map(OwnerId::to_hex).as_deref() == Some(&grant.owner)
        }) else {
            return Ok(false);
        };
        let deleted = self
            .delete(op, &grant.handle)
            .await
            .map_err(|e| e.with_key(&key))?;
        if deleted && !self.shared.containers.load(Ordering::Relaxed) {
            // The driver's remove_empty_dir: refused while others wait.
            let _ = self.delete(op, dir).await;
        }
        Ok(deleted)
    }
}
