//! The raw floors of an acquire+release cycle, for benchmarks: the same
//! grant as the driver's, written by hand on bare connections.
//!
//! [`RedisFloor`] opens **one** `tokio::net::TcpStream` to the one server of
//! a `redis://` URL and speaks RESP on it by hand (no redis-crate
//! connection, no multiplexer, no reconnecting node handle). At connect it
//! sends `AUTH` and `SELECT` when the URL has them, and `SCRIPT LOAD` of
//! the driver's acquire and release scripts. One cycle is then exactly two
//! requests, two round trips:
//!
//! 1. `EVALSHA <acquire> 3 <prefix>{<key>} <prefix>{<key>}:token
//!    <prefix>{<key>}:holder <owner> <ttl ms> <holder details>` (`SET NX PX`,
//!    `INCR` of the key's fencing counter, the holder details beside it);
//! 2. `EVALSHA <release> 2 <prefix>{<key>} <prefix>{<key>}:holder <owner>
//!    <prefix>{<key>}:released` (compare-and-delete, then `PUBLISH` to
//!    waiters).
//!
//! Script text, key names and arguments are the driver's own
//! ([`lock_redis::keys`]), so the floor makes the same grant and excludes with
//! the driver on the same key. A `NOSCRIPT` answer (the server's script
//! cache was flushed) is followed by the same call as `EVAL`.
//!
//! [`RedlockFloor`] does the same on one bare connection per node of a
//! `redlock://` URL: the acquire script goes to every node concurrently,
//! the grant stands on a majority within its validity, and the release goes
//! to every node: two round trips per node per cycle.
//!
//! [`RedisPermitFloor`] is the same bare connection for one permit of a
//! semaphore: the driver's semaphore acquire script, then its release
//! script (two round trips per cycle).
//!
//! Every call is bounded by the URL's operation timeout. A call that fails
//! or times out drops its connection (its stream may hold a late reply);
//! the next call opens a new one. TLS (`rediss://`), Sentinel and Cluster
//! have no floor: [`ErrorKind::Unsupported`].
//!
//! Not a lock API: use [`RedisBackend`] for that.

mod crate_alone;
mod permits;
mod redlock;
mod redlock_alone;
mod resp;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use conformance::floor::{FloorGrant, RawFloor};
use lock_core::{
    ErrorKind, LockError, LockKey, Operation, OwnerId, async_trait, check_ttl, with_timeout,
};
use lock_redis::keys::{KeyNames, LuaScript, Scripts};
use lock_redis::{MIN_TTL, RedisBackend, RedisConfig, RedisNode, RedisTopology};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub use crate_alone::{RedisCrateAlone, cycle_requests};
pub use permits::RedisPermitFloor;
pub use redlock::RedlockFloor;
pub use redlock_alone::RedlockCrateAlone;
use resp::Reply;

/// The backend name the floors' errors carry (the driver's).
const NAME: &str = "redis";

crate::floor_fn!(fn floor_single = RedisFloor::connect);
crate::floor_fn!(fn floor_redlock = RedlockFloor::connect);
crate::floor_fn!(fn permit_floor_single = one_of_four);

/// One permit of a semaphore of 4 per cycle (the hook's contract).
async fn one_of_four(url: &str) -> Result<RedisPermitFloor, LockError> {
    RedisPermitFloor::connect(url, 1, 4).await
}

/// The scheme of `url`, lowercased (the floors' choice of topology).
fn scheme(url: &str) -> String {
    lock_core::driver::scheme_of(url).to_ascii_lowercase()
}

/// The mutex floor of a Redis URL (`lock_bench::for_driver("redis")`):
/// [`RedisFloor`] for one server, [`RedlockFloor`] for Redlock; none for
/// Sentinel and Cluster.
pub fn floor(url: &str) -> crate::BoxFuture<'_, FloorResult> {
    match scheme(url).as_str() {
        "redis" | "rediss" => floor_single(url),
        "redlock" => floor_redlock(url),
        _ => Box::pin(async { Ok(None) }),
    }
}

/// One permit of a semaphore of 4 by hand, on one server (`redis://`; TLS
/// is refused as by the mutex floor); other topologies have none.
pub fn permit_floor(url: &str) -> crate::BoxFuture<'_, FloorResult> {
    match scheme(url).as_str() {
        "redis" | "rediss" => permit_floor_single(url),
        _ => Box::pin(async { Ok(None) }),
    }
}

/// What a floor hook answers.
type FloorResult = Result<Option<Box<dyn RawFloor>>, LockError>;

/// A server's error text with every secret scrubbed out.
#[derive(Debug)]
struct Redacted(String);

impl Redacted {
    fn new(err: &dyn fmt::Display, secrets: &[String]) -> Self {
        let mut text = err.to_string();
        for secret in secrets {
            text = text.replace(secret.as_str(), "<redacted>");
        }
        Self(text)
    }
}

impl fmt::Display for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Redacted {}

/// The kind of a server's error reply, from its code (the first word).
fn error_reply_kind(text: &str) -> ErrorKind {
    match text.split(' ').next().unwrap_or_default() {
        "WRONGPASS" | "NOAUTH" | "NOPERM" => ErrorKind::Config,
        "LOADING" | "BUSY" | "MASTERDOWN" | "READONLY" | "TRYAGAIN" => ErrorKind::Unavailable,
        _ => ErrorKind::Backend,
    }
}

/// A script answered something it never returns.
fn unexpected(op: Operation, answer: &dyn fmt::Debug) -> LockError {
    LockError::new(
        ErrorKind::Backend,
        op,
        format!("unexpected answer from the lock script: {answer:?}"),
    )
    .with_backend(NAME)
}

/// A TTL as the scripts' `PX` argument (whole milliseconds).
fn ttl_ms(ttl: Duration) -> String {
    ttl.as_millis().to_string()
}

/// The acquire and release scripts by hand on one bare connection to one
/// server: the floor our acquire+release cycle is measured against.
///
/// Clones share the connection (calls queue on it, one at a time).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use conformance::floor::RawFloor;
/// use lock_bench::redis::RedisFloor;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let floor = RedisFloor::connect("redis://127.0.0.1:6379").await?;
/// assert_eq!(floor.round_trips_per_cycle(), 2);
/// floor.cycle("bench/0", Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisFloor {
    shared: Arc<Shared>,
}

/// What every floor keeps: the driver's scripts and key prefix.
struct Shared {
    node: FloorNode,
    scripts: Scripts,
    prefix: String,
}

impl fmt::Debug for RedisFloor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFloor")
            .field("server", &self.shared.node.target.node)
            .field("prefix", &self.shared.prefix)
            .finish_non_exhaustive()
    }
}

fn unsupported(what: &str, instead: &str) -> LockError {
    LockError::new(
        ErrorKind::Unsupported,
        Operation::Connect,
        format!("the raw floor has no {what} variant ({instead})"),
    )
    .with_backend(NAME)
}

/// The config of `url`, refused when it asks for TLS (the floors speak
/// plain TCP only).
fn floor_config(url: &str) -> Result<RedisConfig, LockError> {
    let config = RedisConfig::from_url(url)?;
    config.validate()?;
    if config.uses_tls() {
        return Err(unsupported(
            "TLS",
            "it speaks RESP on a bare TCP connection; use redis://",
        ));
    }
    Ok(config)
}

impl RedisFloor {
    /// Connects to the one server of a `redis://` URL (same syntax and
    /// options as [`lock_redis::connect`]; `prefix`, `timeout` and the database
    /// and credentials are used) on one bare TCP connection, and loads the
    /// driver's acquire and release scripts.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for a bad URL or rejected credentials;
    /// [`ErrorKind::Unsupported`] for TLS, Sentinel, Cluster and Redlock
    /// URLs (see [`RedlockFloor`]); [`ErrorKind::Unavailable`] /
    /// [`ErrorKind::Timeout`] when the server does not answer within the
    /// URL's operation timeout.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes the half-made connection.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(&floor_config(url)?).await
    }

    /// A floor of its own (one new bare connection) to the server of an
    /// existing single-server backend, with its prefix, database,
    /// credentials and timeout. Never the backend's connection.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    ///
    /// # Cancel safety
    ///
    /// As [`connect`](Self::connect).
    pub async fn from_backend(backend: &RedisBackend) -> Result<Self, LockError> {
        let config = backend.config();
        if config.uses_tls() {
            return Err(unsupported("TLS", "use redis://"));
        }
        Self::with_config(config).await
    }

    async fn with_config(config: &RedisConfig) -> Result<Self, LockError> {
        let node = match config.topology() {
            RedisTopology::Single(node) => node,
            RedisTopology::Redlock(_) => {
                return Err(unsupported("single-server Redlock", "use RedlockFloor"));
            }
            RedisTopology::Sentinel { .. } => return Err(unsupported("Sentinel", "one server")),
            RedisTopology::Cluster(_) => return Err(unsupported("Cluster", "one server")),
            _ => return Err(unsupported("this topology", "one server")),
        };
        let scripts = Scripts::new();
        let node = FloorNode::connect(Target::new(config, node), &scripts).await?;
        Ok(Self {
            shared: Arc::new(Shared {
                node,
                scripts,
                prefix: config.key_prefix().to_owned(),
            }),
        })
    }

    /// The Redis key the floor's cycles on `key` use (the driver's
    /// `<prefix>{<key>}`, see [`RedisBackend::redis_key`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for a key the driver would refuse.
    pub fn redis_key(&self, key: &str) -> Result<String, LockError> {
        Ok(KeyNames::new(&self.shared.prefix, &LockKey::new(key)?).lock)
    }

    /// One grant and its release ([`RawFloor::cycle`]): two round trips.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for a key or TTL the driver would
    /// refuse; [`ErrorKind::Contended`] when someone holds `key` (nothing is
    /// set then); [`ErrorKind::NotHeld`] when the release found the grant
    /// gone; `Unavailable`, `Timeout`, `Backend` for server failures.
    ///
    /// # Cancel safety
    ///
    /// Not a lock API: dropping the future after the acquire was sent may
    /// leave `key` held by the floor until `ttl` passes.
    pub async fn cycle(&self, key: &str, ttl: Duration) -> Result<(), LockError> {
        RawFloor::cycle(self, key, ttl).await
    }
}

#[async_trait]
impl RawFloor for RedisFloor {
    fn name(&self) -> &'static str {
        NAME
    }

    /// `EVALSHA` acquire, `EVALSHA` release.
    fn round_trips_per_cycle(&self) -> u32 {
        2
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        let s = &*self.shared;
        let request = GrantRequest::new(&s.prefix, key, ttl)?;
        let reply = request
            .send(&s.node, &s.scripts, s.node.target.timeout)
            .await;
        Ok(request.granted(reply?)?.map(|token| request.grant(token)))
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        let s = &*self.shared;
        send_release(&s.node, &s.scripts, &s.prefix, grant).await
    }
}

/// One acquire request: the driver's key names, a fresh owner, the TTL.
struct GrantRequest {
    key: LockKey,
    names: KeyNames,
    owner: String,
    ttl_ms: String,
    /// The holder details the driver writes beside the lock.
    details: String,
}

impl GrantRequest {
    fn new(prefix: &str, key: &str, ttl: Duration) -> Result<Self, LockError> {
        let key = LockKey::new(key)?;
        check_ttl(ttl, MIN_TTL, Operation::TryAcquire)
            .map_err(|e| e.with_key(&key).with_backend(NAME))?;
        Ok(Self {
            names: KeyNames::new(prefix, &key),
            key,
            owner: OwnerId::random().to_hex(),
            ttl_ms: ttl_ms(ttl),
            details: lock_core::HolderDetails::encode_current(),
        })
    }

    async fn send(
        &self,
        node: &FloorNode,
        scripts: &Scripts,
        timeout: Duration,
    ) -> Result<Reply, LockError> {
        let keys = [
            self.names.lock.as_bytes(),
            self.names.counter.as_bytes(),
            self.names.holder.as_bytes(),
        ];
        let args = [
            self.owner.as_bytes(),
            self.ttl_ms.as_bytes(),
            self.details.as_bytes(),
        ];
        node.eval(
            Operation::TryAcquire,
            &scripts.acquire,
            &keys,
            &args,
            timeout,
        )
        .await
        .map_err(|e| e.with_key(&self.key))
    }

    /// The acquire script's answer, read as the driver reads it: `{1,
    /// token}` granted (the token an integer, or the counter's string when
    /// a resent acquire found its own grant), `{0, pttl}` held.
    fn granted(&self, reply: Reply) -> Result<Option<u64>, LockError> {
        if let Reply::Array(Some(items)) = &reply {
            match items.as_slice() {
                [Reply::Int(1), Reply::Int(n)] => {
                    if let Ok(token) = u64::try_from(*n) {
                        return Ok(Some(token));
                    }
                }
                [Reply::Int(1), Reply::Bulk(Some(bytes))] => {
                    if let Some(token) = std::str::from_utf8(bytes)
                        .ok()
                        .and_then(|t| t.parse::<u64>().ok())
                    {
                        return Ok(Some(token));
                    }
                }
                [Reply::Int(0), Reply::Int(_)] => return Ok(None),
                _ => {}
            }
        }
        Err(unexpected(Operation::TryAcquire, &reply).with_key(&self.key))
    }

    fn grant(&self, token: u64) -> FloorGrant {
        FloorGrant {
            key: self.key.as_str().to_owned(),
            owner: self.owner.clone(),
            token,
            handle: String::new(),
        }
    }
}

/// The release script on one node: `Ok(true)` when the grant was still
/// ours there.
async fn send_release(
    node: &FloorNode,
    scripts: &Scripts,
    prefix: &str,
    grant: &FloorGrant,
) -> Result<bool, LockError> {
    let op = Operation::Release;
    let key = LockKey::new(&grant.key)?;
    let names = KeyNames::new(prefix, &key);
    let keys = [names.lock.as_bytes(), names.holder.as_bytes()];
    let args = [grant.owner.as_bytes(), names.channel.as_bytes()];
    let reply = node
        .eval(op, &scripts.release, &keys, &args, node.target.timeout)
        .await
        .map_err(|e| e.with_key(&key))?;
    match reply {
        Reply::Int(1) => Ok(true),
        Reply::Int(0) => Ok(false),
        other => Err(unexpected(op, &other).with_key(&key)),
    }
}

/// Where one bare connection goes, and how it introduces itself.
struct Target {
    node: RedisNode,
    username: Option<String>,
    password: Option<String>,
    db: i64,
    timeout: Duration,
    /// Scrubbed from server texts that reach an error.
    secrets: Vec<String>,
}

impl Target {
    fn new(config: &RedisConfig, node: &RedisNode) -> Self {
        let (username, password) = config.credentials();
        Self {
            node: node.clone(),
            username: username.map(str::to_owned),
            password: password.map(str::to_owned),
            db: config.database(),
            timeout: config.timeout(),
            secrets: password
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .into_iter()
                .collect(),
        }
    }

    fn error(&self, op: Operation, kind: ErrorKind, what: &str) -> LockError {
        LockError::new(kind, op, format!("redis node {}: {what}", self.node)).with_backend(NAME)
    }

    /// A server's error reply as a typed error (its text scrubbed).
    fn server_error(&self, op: Operation, text: &str) -> LockError {
        let kind = error_reply_kind(text);
        self.error(op, kind, "the server answered with an error")
            .with_source(Redacted::new(&text, &self.secrets))
    }
}

/// One node's bare connection, opened again on the next call after a call
/// failed or was dropped (a stream left mid-reply cannot be reused).
struct FloorNode {
    target: Target,
    /// `None` while a call is under way (it owns the connection then) or
    /// after one failed.
    wire: tokio::sync::Mutex<Option<Wire>>,
}

impl FloorNode {
    /// Opens the connection now, so bad settings fail at connect.
    async fn connect(target: Target, scripts: &Scripts) -> Result<Self, LockError> {
        Self::connect_loading(target, &[scripts.acquire.code, scripts.release.code]).await
    }

    /// Opens the connection now and loads `codes` (the permit floor loads
    /// the semaphore's scripts).
    async fn connect_loading(target: Target, codes: &[&str]) -> Result<Self, LockError> {
        let wire = with_timeout(
            target.timeout,
            Operation::Connect,
            Wire::open(&target, codes),
        )
        .await
        .map_err(|e| e.with_backend(NAME))?;
        Ok(Self {
            target,
            wire: tokio::sync::Mutex::new(Some(wire)),
        })
    }

    /// `EVALSHA` of `script` (then `EVAL` on `NOSCRIPT`), bounded by
    /// `timeout` (which also bounds a reconnect).
    async fn eval(
        &self,
        op: Operation,
        script: &LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
        timeout: Duration,
    ) -> Result<Reply, LockError> {
        let call = async {
            let mut slot = self.wire.lock().await;
            // Taken out for the call: dropped with the future if the call
            // does not finish, so no later call reads this call's reply.
            let mut wire = match slot.take() {
                Some(wire) => wire,
                // A reconnect loads nothing: a missing script goes as `EVAL`.
                None => Wire::open(&self.target, &[]).await?,
            };
            let numkeys = keys.len().to_string();
            let mut request: Vec<&[u8]> = Vec::with_capacity(3 + keys.len() + args.len());
            request.extend([&b"EVALSHA"[..], script.hash.as_bytes(), numkeys.as_bytes()]);
            request.extend_from_slice(keys);
            request.extend_from_slice(args);
            let mut reply = wire.call(&self.target, op, &request).await?;
            if matches!(&reply, Reply::Error(e) if e.starts_with("NOSCRIPT")) {
                request[0] = b"EVAL";
                request[1] = script.code.as_bytes();
                reply = wire.call(&self.target, op, &request).await?;
            }
            *slot = Some(wire);
            match reply {
                Reply::Error(text) => Err(self.target.server_error(op, &text)),
                reply => Ok(reply),
            }
        };
        with_timeout(timeout, op, call)
            .await
            .map_err(|e| e.with_backend(NAME))
    }
}

/// One bare TCP connection and its read buffer.
struct Wire {
    stream: TcpStream,
    read: Vec<u8>,
    write: Vec<u8>,
}

impl Wire {
    /// Connects, then `AUTH` and `SELECT` when configured, then `SCRIPT
    /// LOAD` of `scripts` (one round trip each, at connect only).
    async fn open(target: &Target, scripts: &[&str]) -> Result<Self, LockError> {
        let op = Operation::Connect;
        let node = &target.node;
        let stream = TcpStream::connect((node.host.as_str(), node.port))
            .await
            .map_err(|e| {
                target
                    .error(op, ErrorKind::Unavailable, "cannot connect")
                    .with_source(e)
            })?;
        // Requests are single small writes: send each at once.
        let _ = stream.set_nodelay(true);
        let mut wire = Self {
            stream,
            read: Vec::with_capacity(512),
            write: Vec::with_capacity(512),
        };
        if let Some(password) = &target.password {
            let mut auth: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(user) = &target.username {
                auth.push(user.as_bytes());
            }
            auth.push(password.as_bytes());
            wire.expect_ok(target, &auth).await?;
        }
        if target.db != 0 {
            let db = target.db.to_string();
            wire.expect_ok(target, &[b"SELECT", db.as_bytes()]).await?;
        }
        for code in scripts {
            match wire
                .call(target, op, &[b"SCRIPT", b"LOAD", code.as_bytes()])
                .await?
            {
                Reply::Bulk(Some(_)) => {}
                Reply::Error(text) => return Err(target.server_error(op, &text)),
                other => return Err(unexpected(op, &other)),
            }
        }
        Ok(wire)
    }

    async fn expect_ok(&mut self, target: &Target, request: &[&[u8]]) -> Result<(), LockError> {
        let op = Operation::Connect;
        match self.call(target, op, request).await? {
            Reply::Simple(ok) if ok == "OK" => Ok(()),
            Reply::Error(text) => Err(target.server_error(op, &text)),
            other => Err(unexpected(op, &other)),
        }
    }

    /// One request and its reply (an error reply is a reply here).
    async fn call(
        &mut self,
        target: &Target,
        op: Operation,
        request: &[&[u8]],
    ) -> Result<Reply, LockError> {
        let io = |e: std::io::Error| {
            target
                .error(op, ErrorKind::Unavailable, "connection failed")
                .with_source(e)
        };
        self.write.clear();
        resp::encode(&mut self.write, request);
        self.stream.write_all(&self.write).await.map_err(io)?;
        loop {
            match resp::parse(&self.read) {
                Ok(Some((reply, used))) => {
                    self.read.drain(..used);
                    return Ok(reply);
                }
                Ok(None) => {}
                Err(resp::Malformed(what)) => {
                    return Err(target.error(op, ErrorKind::Backend, what));
                }
            }
            let mut chunk = [0u8; 1024];
            let n = self.stream.read(&mut chunk).await.map_err(io)?;
            if n == 0 {
                return Err(target.error(
                    op,
                    ErrorKind::Unavailable,
                    "the server closed the connection",
                ));
            }
            self.read.extend_from_slice(&chunk[..n]);
        }
    }
}
