//! `layout=redisson` against Redisson's own Lua scripts, copied as
//! Redisson 3.x has them (`RedissonLock.tryLockInnerAsync`,
//! `unlockInnerAsync`, `renewal/LockTask`), run from a second, raw Redis
//! connection with a Redisson owner field (`<uuid>:<threadId>`), and
//! waiting as Redisson's `tryLock(wait)` does: subscribed to
//! `redisson_lock__channel:{<key>}`, woken by the unlock message or at the
//! holder's PTTL. Both directions; reentrant counts on the Redisson side;
//! renewal rules on both sides; our release wakes a Redisson waiter and
//! Redisson's unlock wakes ours. Negative control: our native layout is
//! another key and gets in beside Redisson, and the check reports it.

#[path = "legacy/contender.rs"]
mod contender;

use std::time::Duration;

use async_trait::async_trait;
use conformance::OrSkip;
use conformance::servers::redis::RedisServer;
use contender::{Contender, Ours, TTL, excludes_both_ways, unique};
use futures_util::StreamExt;
use lock_core::{ErrorKind, LockBackend, LockBackendExt, LockKey, OwnerId};
use lock_redis::{RedisBackend, RedisConfig};
use redis::Value;
use redis::aio::MultiplexedConnection;
use tokio::time::{Instant, sleep};

/// `RedissonLock.tryLockInnerAsync` (KEYS: name; ARGV: leaseTime ms,
/// lockName): nil when acquired (or re-entered), else the holder's PTTL.
const REDISSON_TRY_LOCK: &str = "if ((redis.call('exists', KEYS[1]) == 0) \
    or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then \
    redis.call('hincrby', KEYS[1], ARGV[2], 1); \
    redis.call('pexpire', KEYS[1], ARGV[1]); \
    return nil; \
    end; \
    return redis.call('pttl', KEYS[1]);";

/// `RedissonLock.unlockInnerAsync` (KEYS: name, channel, unlock latch;
/// ARGV: unlock message, lease ms, lockName, publish command, latch ms):
/// nil when not held, 0 when still held (count decremented), 1 released.
const REDISSON_UNLOCK: &str = "local val = redis.call('get', KEYS[3]); \
    if val ~= false then \
    return tonumber(val);\
    end; \
    if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then \
    return nil;\
    end; \
    local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); \
    if (counter > 0) then \
    redis.call('pexpire', KEYS[1], ARGV[2]); \
    redis.call('set', KEYS[3], 0, 'px', ARGV[5]); \
    return 0; \
    else \
    redis.call('del', KEYS[1]); \
    redis.call(ARGV[4], KEYS[2], ARGV[1]); \
    redis.call('set', KEYS[3], 1, 'px', ARGV[5]); \
    return 1; \
    end; ";

/// `renewal/LockTask` (KEYS: names; ARGV: lease ms, then a lockName per
/// key): 1 per key renewed, 0 where the field is not there.
const REDISSON_RENEW: &str = "local result = {} \
    for i = 1, #KEYS, 1 do \
    if (redis.call('hexists', KEYS[i], ARGV[i + 1]) == 1) then \
    redis.call('pexpire', KEYS[i], ARGV[1]); \
    table.insert(result, 1); \
    else \
    table.insert(result, 0); \
    end; \
    end; \
    return result;";

fn redisson_channel(key: &str) -> String {
    format!("redisson_lock__channel:{{{key}}}")
}

/// One Redisson client (one `id`, one thread) as a contender.
struct Redisson {
    client: redis::Client,
    conn: MultiplexedConnection,
    lock_name: String,
}

impl Redisson {
    async fn new(port: u16, thread_id: u64) -> Self {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        // Redisson's id is a UUID; its field `<uuid>:<threadId>`.
        let uuid = OwnerId::random().to_uuid();
        Self {
            client,
            conn,
            lock_name: format!("{uuid}:{thread_id}"),
        }
    }

    /// `None` when acquired, else the holder's PTTL.
    async fn try_inner(&self, key: &str) -> Option<i64> {
        let mut conn = self.conn.clone();
        let value: Value = redis::Script::new(REDISSON_TRY_LOCK)
            .key(key)
            .arg(TTL.as_millis().to_string())
            .arg(&self.lock_name)
            .invoke_async(&mut conn)
            .await
            .expect("Redisson's tryLock script");
        match value {
            Value::Nil => None,
            Value::Int(pttl) => Some(pttl),
            other => panic!("tryLock answered {other:?}"),
        }
    }

    /// Redisson's unlock: `None` not held, `Some(false)` still held
    /// (re-entered), `Some(true)` released (and published).
    async fn unlock_inner(&self, key: &str) -> Option<bool> {
        let mut conn = self.conn.clone();
        let latch = format!(
            "redisson_unlock_latch:{{{key}}}:{}",
            OwnerId::random().to_hex()
        );
        let value: Value = redis::Script::new(REDISSON_UNLOCK)
            .key(key)
            .key(redisson_channel(key))
            .key(&latch)
            .arg(0)
            .arg(TTL.as_millis().to_string())
            .arg(&self.lock_name)
            .arg("PUBLISH")
            .arg(10_000)
            .invoke_async(&mut conn)
            .await
            .expect("Redisson's unlock script");
        let _: () = redis::cmd("DEL")
            .arg(&latch)
            .query_async(&mut conn)
            .await
            .unwrap();
        match value {
            Value::Nil => None,
            Value::Int(n) => Some(n == 1),
            other => panic!("unlock answered {other:?}"),
        }
    }

    /// Redisson's watchdog renewal of this field on `key`.
    async fn renew(&self, key: &str) -> bool {
        let mut conn = self.conn.clone();
        let answer: Vec<i64> = redis::Script::new(REDISSON_RENEW)
            .key(key)
            .arg(TTL.as_millis().to_string())
            .arg(&self.lock_name)
            .invoke_async(&mut conn)
            .await
            .expect("Redisson's renewal script");
        answer == [1]
    }

    async fn hold_count(&self, key: &str) -> Option<i64> {
        let mut conn = self.conn.clone();
        redis::cmd("HGET")
            .arg(key)
            .arg(&self.lock_name)
            .query_async(&mut conn)
            .await
            .unwrap()
    }
}

#[async_trait]
impl Contender for Redisson {
    fn name(&self) -> String {
        "redisson".into()
    }

    async fn try_lock(&self, key: &str) -> Result<bool, String> {
        Ok(self.try_inner(key).await.is_none())
    }

    /// As `RedissonLock.tryLock(waitTime)`: one try; subscribe to the
    /// unlock channel; then try again after each unlock message, or after
    /// the holder's PTTL, until the wait is used up (a release that
    /// publishes nothing on Redisson's channel is only seen at the PTTL).
    async fn wait_lock(&self, key: &str, ms: u64) -> Result<bool, String> {
        let deadline = Instant::now() + Duration::from_millis(ms);
        if self.try_inner(key).await.is_none() {
            return Ok(true);
        }
        let mut pubsub = self.client.get_async_pubsub().await.unwrap();
        pubsub.subscribe(redisson_channel(key)).await.unwrap();
        let mut messages = pubsub.into_on_message();
        loop {
            let Some(pttl) = self.try_inner(key).await else {
                return Ok(true);
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let wait = u64::try_from(pttl).map_or(left, |p| Duration::from_millis(p).min(left));
            if let Ok(Some(message)) = tokio::time::timeout(wait, messages.next()).await {
                let payload: String = message.get_payload().unwrap();
                assert_eq!(payload, "0", "Redisson's unlock message is 0");
            }
        }
    }

    async fn unlock(&self, key: &str) -> Result<bool, String> {
        Ok(self.unlock_inner(key).await == Some(true))
    }
}

async fn backend(url: &str) -> RedisBackend {
    RedisBackend::connect(RedisConfig::from_url(url).unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_scripts_and_redisson_layout_exclude_both_ways() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    // A long recheck: a waiter of ours wakes on the unlock message, or late.
    let url = format!("{}?layout=redisson&recheck=5s", server.url());
    let ours = Ours::new("ours(redisson)", backend(&url).await);
    let redisson = Redisson::new(server.port(), 1).await;
    excludes_both_ways(&ours, &redisson, &unique("both"))
        .await
        .expect("Redisson's scripts and layout=redisson must exclude");

    // Negative control: the native layout is `distlock:{<key>}`, another key.
    let native = Ours::new("ours(native)", backend(&server.url()).await);
    let err = excludes_both_ways(&native, &redisson, &unique("control"))
        .await
        .expect_err("the native layout gets in beside Redisson: the check must say so");
    assert!(err.contains("while"), "{err}");
}

/// Redisson holds, re-enters (count 2), unlocks once (count 1, still held):
/// we are refused throughout, inspect shows its field; its last unlock
/// publishes and our waiting acquire (recheck 5 s, holder TTL 5 s) is
/// granted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_reentry_holds_and_its_unlock_wakes_our_waiter() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let url = format!("{}?layout=redisson&recheck=5s", server.url());
    let ours = backend(&url).await;
    let redisson = Redisson::new(server.port(), 7).await;
    let key = unique("reentry");
    let lock_key = LockKey::new(key.as_str()).unwrap();
    assert_eq!(redisson.try_inner(&key).await, None);
    assert_eq!(redisson.try_inner(&key).await, None, "Redisson re-enters");
    assert_eq!(redisson.hold_count(&key).await, Some(2));
    assert!(ours.try_acquire(&lock_key, TTL).await.unwrap().is_none());
    let info = ours.inspect(&lock_key).await.unwrap().expect("held");
    assert_eq!(info.holder, redisson.lock_name);
    assert_eq!(info.token, None, "Redisson's holder has no token of ours");
    assert_eq!(
        redisson.unlock_inner(&key).await,
        Some(false),
        "count 2 -> 1"
    );
    assert!(ours.try_acquire(&lock_key, TTL).await.unwrap().is_none());

    let waiter = {
        let ours = ours.clone();
        let lock_key = lock_key.clone();
        tokio::spawn(async move {
            let lease = ours
                .acquire(&lock_key, TTL, Instant::now() + Duration::from_secs(8))
                .await;
            (lease, Instant::now())
        })
    };
    sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "our waiter waits while Redisson holds"
    );
    let unlocked_at = Instant::now();
    assert_eq!(
        redisson.unlock_inner(&key).await,
        Some(true),
        "count 1 -> 0"
    );
    let (lease, granted_at) = waiter.await.unwrap();
    let lease = lease.expect("granted after Redisson's unlock");
    let after = granted_at - unlocked_at;
    assert!(
        after < Duration::from_millis(1000),
        "woken by Redisson's unlock message, not by the 5 s recheck: {after:?}"
    );
    // Redisson is refused now; its renewal of a field that is not its own
    // fails; our release publishes its unlock message.
    assert!(redisson.try_inner(&key).await.is_some());
    assert!(
        !redisson.renew(&key).await,
        "Redisson renews only its own field"
    );
    assert!(ours.renew(&lease).await.is_ok());
    let client = redis::Client::open(server.url()).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe(redisson_channel(&key)).await.unwrap();
    let mut messages = pubsub.into_on_message();
    assert!(ours.release(&lease).await.unwrap());
    let message = tokio::time::timeout(Duration::from_secs(2), messages.next())
        .await
        .expect("our release publishes on Redisson's channel")
        .expect("message");
    assert_eq!(message.get_payload::<String>().unwrap(), "0");
    assert_eq!(redisson.try_inner(&key).await, None);
    assert_eq!(redisson.unlock_inner(&key).await, Some(true));
}

/// Our lease expires; Redisson takes the key; our renewal and our release
/// then fail (`NotHeld` / `false`) and leave Redisson's hash as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_renewal_fails_once_redisson_holds() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let ours = backend(&format!("{}?layout=redisson", server.url())).await;
    let redisson = Redisson::new(server.port(), 3).await;
    let key = unique("renewal");
    let lock_key = LockKey::new(key.as_str()).unwrap();
    let lease = ours
        .try_acquire(&lock_key, Duration::from_millis(200))
        .await
        .unwrap()
        .expect("free");
    assert!(redisson.try_inner(&key).await.is_some(), "we hold it");
    sleep(Duration::from_millis(400)).await;
    assert_eq!(redisson.try_inner(&key).await, None, "ours expired");
    let err = ours.renew(&lease).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(!ours.release(&lease).await.unwrap());
    assert_eq!(redisson.hold_count(&key).await, Some(1));
    assert!(redisson.renew(&key).await, "Redisson renews its own field");
    assert_eq!(redisson.unlock_inner(&key).await, Some(true));
}
