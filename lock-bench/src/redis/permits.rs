//! The raw floor of one permit acquire+release (see the module docs of
//! `floor`).

use std::fmt;
use std::time::Duration;

use conformance::floor::{FloorGrant, RawFloor};
use lock_core::{LeaseKind, LockError, LockKey, Operation, OwnerId, async_trait, check_ttl};

use lock_redis::keys::{SHARED, SemNames};
use lock_redis::{MIN_TTL, RedisBackend, RedisConfig, RedisTopology};

use super::resp::Reply;
use super::{FloorNode, NAME, Target, floor_config, ttl_ms, unexpected, unsupported};

/// `count` of `limit` permits of a semaphore by hand on one bare
/// connection to one server: the floor a permit acquire+release of the
/// driver is measured against. One cycle is two requests, two round trips:
///
/// 1. `EVALSHA <semaphore acquire> 7 <prefix>{<key>}:sem:holders
///    …:counts …:tokens …:queue …:queue-expiry …:counters …:details <owner>
///    <ttl ms> <count> <limit> 0 <channel> <holder details>` (sweep expired
///    holders, check the limit, fit, `HINCRBY` of the token, add the holder
///    and its details);
/// 2. `EVALSHA <remove> 4 …:holders …:counts …:tokens …:details <owner>
///    <channel> 1` (remove the holder and its details, then `PUBLISH` to
///    waiters).
///
/// The scripts, key names and arguments are the driver's own, so the
/// floor's permits count against the driver's on the same key. Both
/// scripts are loaded at connect. Build it with
/// [`connect`](Self::connect) (a `redis://` URL) or
/// [`from_backend`](Self::from_backend), and the permits per cycle.
pub struct RedisPermitFloor {
    node: FloorNode,
    prefix: String,
    count: String,
    limit: String,
}

impl fmt::Debug for RedisPermitFloor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisPermitFloor")
            .field("server", &self.node.target.node)
            .field("prefix", &self.prefix)
            .field("count", &self.count)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl RedisPermitFloor {
    /// Connects to the one server of a `redis://` URL (as
    /// [`RedisFloor::connect`](super::RedisFloor::connect)) and takes
    /// `count` of `limit` permits per cycle.
    ///
    /// # Errors
    ///
    /// As [`RedisFloor::connect`](super::RedisFloor::connect);
    /// `InvalidArgument` for bad counts ([`LeaseKind::permits`]).
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes the half-made connection.
    pub async fn connect(url: &str, count: u32, limit: u32) -> Result<Self, LockError> {
        LeaseKind::permits(count, limit)?;
        Self::with_config(&floor_config(url)?, count, limit).await
    }

    /// A permit floor of its own (one new bare connection) to the server of
    /// an existing single-server backend, with its prefix, database,
    /// credentials and timeout.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect), less the URL errors.
    ///
    /// # Cancel safety
    ///
    /// As [`connect`](Self::connect).
    pub async fn from_backend(
        backend: &RedisBackend,
        count: u32,
        limit: u32,
    ) -> Result<Self, LockError> {
        LeaseKind::permits(count, limit)?;
        let config = backend.config();
        if config.uses_tls() {
            return Err(unsupported("TLS", "use redis://"));
        }
        Self::with_config(config, count, limit).await
    }

    async fn with_config(config: &RedisConfig, count: u32, limit: u32) -> Result<Self, LockError> {
        let RedisTopology::Single(node) = config.topology() else {
            return Err(unsupported(
                "permit variant for this topology",
                "one server, redis://",
            ));
        };
        let codes = [SHARED.sem_acquire.code, SHARED.remove.code];
        let node = FloorNode::connect_loading(Target::new(config, node), &codes).await?;
        Ok(Self {
            node,
            prefix: config.key_prefix().to_owned(),
            count: count.to_string(),
            limit: limit.to_string(),
        })
    }
}

#[async_trait]
impl RawFloor for RedisPermitFloor {
    fn name(&self) -> &'static str {
        NAME
    }

    /// `EVALSHA` semaphore acquire, `EVALSHA` remove.
    fn round_trips_per_cycle(&self) -> u32 {
        2
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        let op = Operation::TryAcquire;
        let lock_key = LockKey::new(key)?;
        check_ttl(ttl, MIN_TTL, op).map_err(|e| e.with_key(&lock_key).with_backend(NAME))?;
        let n = SemNames::new(&self.prefix, &lock_key);
        let owner = OwnerId::random().to_hex();
        let ttl = ttl_ms(ttl);
        let details = lock_core::HolderDetails::encode_current();
        let keys = [
            n.holders.as_bytes(),
            n.counts.as_bytes(),
            n.tokens.as_bytes(),
            n.queue.as_bytes(),
            n.queue_expiry.as_bytes(),
            n.counters.as_bytes(),
            n.details.as_bytes(),
        ];
        let args = [
            owner.as_bytes(),
            ttl.as_bytes(),
            self.count.as_bytes(),
            self.limit.as_bytes(),
            b"0",
            n.channel.as_bytes(),
            details.as_bytes(),
        ];
        let reply = self
            .node
            .eval(
                op,
                &SHARED.sem_acquire,
                &keys,
                &args,
                self.node.target.timeout,
            )
            .await
            .map_err(|e| e.with_key(&lock_key))?;
        if let Reply::Array(Some(items)) = &reply
            && let [Reply::Int(flag), Reply::Int(n)] = items.as_slice()
        {
            match (*flag, u64::try_from(*n)) {
                (1, Ok(token)) => {
                    return Ok(Some(FloorGrant {
                        key: key.to_owned(),
                        owner,
                        token,
                        handle: String::new(),
                    }));
                }
                (0, _) => return Ok(None),
                (-1, _) => {
                    return Err(LockError::invalid_argument(
                        op,
                        format!("the semaphore is in use with a limit of {n} permits"),
                    )
                    .with_backend(NAME)
                    .with_key(&lock_key));
                }
                _ => {}
            }
        }
        Err(unexpected(op, &reply).with_key(&lock_key))
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        let op = Operation::Release;
        let key = LockKey::new(&grant.key)?;
        let n = SemNames::new(&self.prefix, &key);
        let keys = [
            n.holders.as_bytes(),
            n.counts.as_bytes(),
            n.tokens.as_bytes(),
            n.details.as_bytes(),
        ];
        let args = [grant.owner.as_bytes(), n.channel.as_bytes(), b"1"];
        let reply = self
            .node
            .eval(op, &SHARED.remove, &keys, &args, self.node.target.timeout)
            .await
            .map_err(|e| e.with_key(&key))?;
        match reply {
            Reply::Int(1) => Ok(true),
            Reply::Int(0) => Ok(false),
            other => Err(unexpected(op, &other).with_key(&key)),
        }
    }
}
