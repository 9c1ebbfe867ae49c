//! redis-rs alone: the driver's two requests for a mutex acquire +
//! release on a free key (one server, the native layout), sent through the
//! client library the driver requires, with no lock-redis code on the
//! path but its key names and script texts.
//!
//! [`RedisCrateAlone`] opens one multiplexed connection of the crate with
//! the driver's data-connection settings
//! ([`RedisConfig::connection_config`](lock_redis::RedisConfig::connection_config):
//! the URL's operation timeout to connect, and redis-rs's own per-request
//! response timeout set to it), loads the two scripts, and sends per cycle
//! (the `redis_parts` probe's "redis-rs alone" side, written once here for
//! `distlock-compare compare`):
//!
//! 1. `EVALSHA <acquire> 4 <prefix>{<key>} <prefix>{<key>}:token
//!    <prefix>{<key>}:holder distlock:token-floor <owner> <ttl ms>
//!    <holder details>`;
//! 2. `EVALSHA <release> 2 <prefix>{<key>} <prefix>{<key>}:holder <owner>
//!    <prefix>{<key>}:released`.
//!
//! Each request is bounded by the connection's response timeout, as the
//! driver's are. Between the hand floor
//! ([`RedisFloor`](super::RedisFloor): RESP by hand on a bare socket) and
//! the driver, this is the client library's share. Single-server
//! `redis://` URLs only.

use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use async_trait::async_trait;
use conformance::bench::Contender;
use lock_core::{ErrorKind, HolderDetails, LockError, LockKey, Operation, OwnerId, with_timeout};
use lock_redis::keys::{KeyNames, Scripts};
use lock_redis::{RedisConfig, RedisNode, RedisTopology};

use super::{NAME, floor_config, unsupported};

/// The token floor key the driver's acquire names on one server (its
/// `KEYS[4]`; lock-redis's `FLOOR_KEY`, which is not exported).
const TOKEN_FLOOR_KEY: &str = "distlock:token-floor";

/// The driver's two requests of a mutex cycle on a free key (one server,
/// native layout), as redis-rs commands: `EVALSHA <acquire> 4 <lock>
/// <counter> <holder> <token floor> <owner> <ttl ms> <details>` and
/// `EVALSHA <release> 2 <lock> <holder> <owner> <channel>`.
pub fn cycle_requests(
    scripts: &Scripts,
    names: &KeyNames,
    owner: &str,
    ttl_ms: &str,
    details: &str,
) -> (::redis::Cmd, ::redis::Cmd) {
    let mut acquire = ::redis::cmd("EVALSHA");
    acquire
        .arg(&scripts.acquire.hash)
        .arg(4)
        .arg(&names.lock)
        .arg(&names.counter)
        .arg(&names.holder)
        .arg(TOKEN_FLOOR_KEY)
        .arg(owner)
        .arg(ttl_ms)
        .arg(details);
    let mut release = ::redis::cmd("EVALSHA");
    release
        .arg(&scripts.release.hash)
        .arg(2)
        .arg(&names.lock)
        .arg(&names.holder)
        .arg(owner)
        .arg(&names.channel);
    (acquire, release)
}

/// The driver's mutex cycle through redis-rs alone, on one multiplexed
/// connection of its own; see the module docs.
///
/// Calls from several tasks share the connection (the crate pipelines
/// them): eight independent clients are eight of these.
pub struct RedisCrateAlone {
    conn: MultiplexedConnection,
    scripts: Scripts,
    prefix: String,
    /// Every grant's TTL, in milliseconds as the script takes it.
    ttl_ms: String,
}

impl std::fmt::Debug for RedisCrateAlone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCrateAlone")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// A redis-rs error as a [`LockError`] of `operation` (its text only: the
/// crate's errors never carry the password).
pub(super) fn crate_error(operation: Operation, err: &::redis::RedisError) -> LockError {
    LockError::new(
        ErrorKind::Backend,
        operation,
        format!("redis-rs alone: {err}"),
    )
    .with_backend(NAME)
}

/// `redis://[user:password@]host:port/db` for the one server of `config`.
fn connection_url(config: &RedisConfig) -> Result<String, LockError> {
    let RedisTopology::Single(node) = config.topology() else {
        return Err(unsupported(
            "Sentinel, Cluster or Redlock",
            "redis-rs alone is measured on one server",
        ));
    };
    Ok(node_url(config, node))
}

/// `redis://[user:password@]host:port/db` for `node` with `config`'s
/// credentials and database.
pub(super) fn node_url(config: &RedisConfig, node: &RedisNode) -> String {
    let auth = match config.credentials() {
        (user, Some(password)) => format!("{}:{password}@", user.unwrap_or_default()),
        _ => String::new(),
    };
    format!("redis://{auth}{node}/{}", config.database())
}

/// One multiplexed connection of the crate to `url` with the driver's
/// data-connection settings (`settings`), the driver's two scripts
/// loaded on it, within `budget`.
pub(super) async fn connect_loaded(
    url: String,
    settings: &::redis::AsyncConnectionConfig,
    scripts: &Scripts,
    budget: Duration,
) -> Result<MultiplexedConnection, LockError> {
    let op = Operation::Connect;
    let client = ::redis::Client::open(url).map_err(|e| crate_error(op, &e))?;
    with_timeout(budget, op, async {
        let mut conn = client
            .get_multiplexed_async_connection_with_config(settings)
            .await
            .map_err(|e| crate_error(op, &e))?;
        for code in [scripts.acquire.code, scripts.release.code] {
            let _: String = ::redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(code)
                .query_async(&mut conn)
                .await
                .map_err(|e| crate_error(op, &e))?;
        }
        Ok(conn)
    })
    .await
}

impl RedisCrateAlone {
    /// Connects one multiplexed connection of the crate to the one server
    /// of a `redis://` URL (same syntax and options as
    /// [`lock_redis::connect`]; its prefix, database, credentials and
    /// timeout are used) and loads the driver's two scripts; every grant
    /// asks for `ttl`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for a bad URL; [`ErrorKind::Unsupported`] for
    /// TLS, Sentinel, Cluster and Redlock URLs; [`ErrorKind::Backend`] when
    /// the server refuses; `Timeout` past the operation timeout.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes the half-made connection.
    pub async fn connect(url: &str, ttl: Duration) -> Result<Self, LockError> {
        let config = floor_config(url)?;
        let url = connection_url(&config)?;
        // The driver's own data-connection settings (its connect timeout
        // and redis-rs's per-request response timeout).
        let settings = config.connection_config();
        let scripts = Scripts::new();
        let conn = connect_loaded(url, &settings, &scripts, config.timeout() * 2).await?;
        Ok(Self {
            conn,
            scripts,
            prefix: config.key_prefix().to_owned(),
            ttl_ms: ttl.as_millis().to_string(),
        })
    }

    /// The grant and the release of the free `key`, with a fresh owner and
    /// the holder details, as the driver makes them per grant.
    async fn exchange(&self, key: &LockKey) -> Result<(), LockError> {
        let names = KeyNames::new(&self.prefix, key);
        let owner = OwnerId::random().to_hex();
        let details = HolderDetails::encode_current();
        let mut conn = self.conn.clone();
        let (acquire, release) =
            cycle_requests(&self.scripts, &names, &owner, &self.ttl_ms, &details);
        let (granted, _token): (i64, i64) = acquire
            .query_async(&mut conn)
            .await
            .map_err(|e| crate_error(Operation::Acquire, &e))?;
        if granted != 1 {
            return Err(LockError::new(
                ErrorKind::Contended,
                Operation::Acquire,
                "redis-rs alone: the key was held",
            ));
        }
        let released: i64 = release
            .query_async(&mut conn)
            .await
            .map_err(|e| crate_error(Operation::Release, &e))?;
        if released != 1 {
            return Err(LockError::new(
                ErrorKind::NotHeld,
                Operation::Release,
                "redis-rs alone: the grant was gone at release",
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl Contender for RedisCrateAlone {
    /// One acquire + release of the free `key`: two requests.
    async fn cycle(&self, key: &str) -> Result<(), LockError> {
        let key = LockKey::new(key)?;
        self.exchange(&key)
            .await
            .map_err(|e| e.with_key(&key).with_backend(NAME))
    }
}
