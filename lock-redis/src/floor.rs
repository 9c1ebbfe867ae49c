//! The raw floor of an acquire+release cycle, for benchmarks.
//!
//! [`RedisFloor::cycle`] issues exactly the two script calls of the
//! driver's uncontended path on one server, by hand on a raw multiplexed
//! connection: `EVALSHA` of the acquire script (`SET <prefix>{<key>} <owner>
//! NX PX <ttl>`, then `INCR` of the key's counter) and `EVALSHA` of the
//! release script (compare-and-delete, then `PUBLISH` to waiters), with the
//! driver's own script text, key layout and calls (falling back to `EVAL`
//! on `NOSCRIPT`, as the driver does). That is two round trips per cycle,
//! the same as [`RedisBackend`]'s `try_acquire` + `release`, without the
//! driver's bookkeeping (lease objects and validity deadlines, the armed
//! cleanup of grants whose answer was lost, the reconnecting node handle).
//!
//! Only one server (`redis://`, `rediss://`) has such a floor: Sentinel,
//! Cluster and Redlock URLs are refused with [`ErrorKind::Unsupported`].
//!
//! It exists so benchmarks (`distlock compare`, this crate's `bench`
//! example) can report "ours / floor" ratios measured in one run. It is not
//! a lock API: use [`RedisBackend`] for that.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{ErrorKind, LockError, LockKey, Operation, OwnerId, check_ttl, with_timeout};
use redis::Value;

use crate::config::{RedisConfig, RedisTopology};
use crate::conn::{Conn, NAME, conn_config, map_redis_error, open_client};
use crate::driver::{MIN_TTL, NodeGrant, RedisBackend, as_int, parse_grant};
use crate::scripts::{KeyNames, Scripts, ttl_ms};

/// Hand-issued acquire and release script calls on one raw multiplexed
/// connection to one server: the floor our acquire+release cycle is
/// measured against.
///
/// Cheap to clone (clones share the connection).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use lock_redis::floor::RedisFloor;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let floor = RedisFloor::connect("redis://127.0.0.1:6379").await?;
/// floor.cycle("bench/0", Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisFloor {
    conn: Conn,
    scripts: Arc<Scripts>,
    prefix: Arc<str>,
    /// The server, for error messages.
    label: Arc<str>,
    /// Scrubbed from error texts.
    secrets: Arc<Vec<String>>,
    timeout: Duration,
}

impl fmt::Debug for RedisFloor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFloor")
            .field("server", &self.label)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

fn unsupported(topology: &RedisTopology) -> LockError {
    let what = match topology {
        RedisTopology::Single(_) => "a single server",
        RedisTopology::Sentinel { .. } => "Sentinel",
        RedisTopology::Cluster(_) => "Redis Cluster",
        RedisTopology::Redlock(_) => "Redlock",
    };
    LockError::new(
        ErrorKind::Unsupported,
        Operation::Connect,
        format!(
            "the raw floor is defined for one server (redis:// or rediss://), not for {what}: \
             there the driver's cycle is not one pair of round trips on one connection"
        ),
    )
    .with_backend(NAME)
}

impl RedisFloor {
    /// Connects to the one server of a `redis://` or `rediss://` URL (same
    /// syntax and options as [`crate::connect`]) on a raw multiplexed
    /// connection, and loads the driver's scripts, as the driver does.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for a bad URL or rejected credentials;
    /// [`ErrorKind::Unsupported`] for Sentinel, Cluster and Redlock URLs;
    /// [`ErrorKind::Unavailable`] / [`ErrorKind::Timeout`] when the server
    /// does not answer within the URL's operation timeout.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future drops the half-made connection. Loaded
    /// scripts stay in the server's script cache (harmless).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = RedisConfig::from_url(url)?;
        config.validate()?;
        let RedisTopology::Single(node) = &config.topology else {
            return Err(unsupported(&config.topology));
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(
                LockError::config("the Redis floor needs a Tokio runtime").with_backend(NAME)
            );
        }
        let secrets = Arc::new(config.secrets());
        let label: Arc<str> = Arc::from(node.to_string());
        let tls = config.tls_certificates()?;
        let client = open_client(&config.node_url(node), tls.as_ref(), &secrets)?;
        let op = Operation::Connect;
        let timeout = config.operation_timeout;
        let scripts = Arc::new(Scripts::new());
        let conn = with_timeout(timeout, op, async {
            let mut conn = Conn::Plain(
                client
                    .get_multiplexed_async_connection_with_config(&conn_config(timeout))
                    .await
                    .map_err(|e| map_redis_error(&label, &secrets, op, e))?,
            );
            for script in scripts.all() {
                let _: String = conn
                    .query(redis::cmd("SCRIPT").arg("LOAD").arg(script.code))
                    .await
                    .map_err(|e| map_redis_error(&label, &secrets, op, e))?;
            }
            Ok(conn)
        })
        .await
        .map_err(|e| e.with_backend(NAME))?;
        Ok(Self {
            conn,
            scripts,
            prefix: Arc::from(config.prefix.as_str()),
            label,
            secrets,
            timeout,
        })
    }

    /// The floor on an existing single-server backend: its shared
    /// connection (connected now if it is not), its scripts, its prefix and
    /// operation timeout, so ours and the floor share the connection.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] for a Sentinel, Cluster or Redlock
    /// backend; [`ErrorKind::Unavailable`] / [`ErrorKind::Timeout`] when the
    /// backend has no connection and cannot make one in time.
    ///
    /// # Cancel safety
    ///
    /// Safe: a connection made meanwhile stays the backend's.
    pub async fn from_backend(backend: &RedisBackend) -> Result<Self, LockError> {
        let config = backend.config();
        let RedisTopology::Single(node) = &config.topology else {
            return Err(unsupported(&config.topology));
        };
        let (nodes, scripts) = backend.parts();
        let [shared] = nodes else {
            return Err(unsupported(&config.topology));
        };
        let conn = shared
            .run(Operation::Connect, config.operation_timeout, |conn| async {
                Ok(conn)
            })
            .await?;
        Ok(Self {
            conn,
            scripts: scripts.clone(),
            prefix: Arc::from(config.prefix.as_str()),
            label: Arc::from(node.to_string()),
            secrets: Arc::new(config.secrets()),
            timeout: config.operation_timeout,
        })
    }

    /// The Redis key the floor's cycles on `key` use (the driver's
    /// `<prefix>{<key>}`, see [`RedisBackend::redis_key`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for a key the driver would refuse.
    pub fn redis_key(&self, key: &str) -> Result<String, LockError> {
        Ok(KeyNames::new(&self.prefix, &LockKey::new(key)?).lock)
    }

    /// One acquire + one release of `key` by hand: `EVALSHA` of the
    /// driver's acquire script (must grant) and `EVALSHA` of its release
    /// script, each bounded by the configured operation timeout.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for a key or TTL the driver would
    /// refuse; [`ErrorKind::Contended`] when someone holds `key` (the floor
    /// never waits, and sets nothing then); [`ErrorKind::NotHeld`] when the
    /// release found the key no longer ours (the TTL ran out mid-cycle, or
    /// someone deleted it); the driver's kinds (`Unavailable`, `Timeout`,
    /// `Backend`) for server failures.
    ///
    /// # Cancel safety
    ///
    /// Not a lock API: dropping the future after the acquire script was
    /// sent may leave `key` held by the floor until `ttl` passes (later
    /// cycles on `key` fail with `Contended` until then). Nothing else is
    /// left behind (the fencing counter is kept forever, as the driver
    /// keeps it).
    pub async fn cycle(&self, key: &str, ttl: Duration) -> Result<(), LockError> {
        let key = LockKey::new(key)?;
        let op = Operation::TryAcquire;
        check_ttl(ttl, MIN_TTL, op).map_err(|e| e.with_key(&key).with_backend(NAME))?;
        let names = KeyNames::new(&self.prefix, &key);
        let owner = OwnerId::random().to_hex();
        let ttl_ms = ttl_ms(ttl);
        let mut conn = self.conn.clone();
        let answer = self
            .call(op, async {
                self.scripts
                    .call_acquire(&mut conn, &names, &owner, &ttl_ms)
                    .await
            })
            .await
            .map_err(|e| e.with_key(&key))?;
        match parse_grant(&answer).map_err(|e| e.with_key(&key))? {
            NodeGrant::Granted(_) => {}
            NodeGrant::Held(_) => {
                return Err(LockError::new(
                    ErrorKind::Contended,
                    op,
                    "the floor's key is held by another owner",
                )
                .with_key(&key)
                .with_backend(NAME));
            }
        }
        let op = Operation::Release;
        let answer = self
            .call(op, async {
                self.scripts.call_release(&mut conn, &names, &owner).await
            })
            .await
            .map_err(|e| e.with_key(&key))?;
        if as_int(&answer, op).map_err(|e| e.with_key(&key))? == 1 {
            Ok(())
        } else {
            Err(LockError::new(
                ErrorKind::NotHeld,
                op,
                "the floor's key was no longer its own at release (expired or deleted)",
            )
            .with_key(&key)
            .with_backend(NAME))
        }
    }

    /// One script call, bounded by the operation timeout, its error mapped
    /// as the driver maps them.
    async fn call(
        &self,
        op: Operation,
        call: impl Future<Output = redis::RedisResult<Value>>,
    ) -> Result<Value, LockError> {
        with_timeout(self.timeout, op, async {
            call.await
                .map_err(|e| map_redis_error(&self.label, &self.secrets, op, e))
        })
        .await
        .map_err(|e| e.with_backend(NAME))
    }
}
