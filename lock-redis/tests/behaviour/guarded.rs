//! Writes guarded by the store (`RedisBackend::run_guarded`): the shared
//! guarded-write cases on one server and on a 3-master Cluster, with the
//! data in the lock's own Redis; the same store without the owner check
//! (a plain `SET`) fails them. Then what the cases do not cover: the
//! body's own `KEYS`/`ARGV` indexing and replies, the legacy layouts and
//! fair mode, and the refusals (a key outside the lock's slot in Cluster,
//! a shared lease, Redlock) before anything is sent.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::OrSkip;
use conformance::fencing::guarded::{
    GUARDED_CASES, GuardedOutcome, GuardedStore, Unchecked, UncheckedWrite, assert_unchecked_fails,
    run_guarded_cases,
};
use conformance::servers::redis::{RedisCluster, RedisServer};
use lock_core::{ErrorKind, Lease, LeaseKind, LockBackend, LockBackendExt, LockKey};
use lock_redis::{RedisBackend, RedisGuardedReply, RedisGuardedScript, RedisValue};
use redis::aio::ConnectionLike;

use super::common::raw;

/// A `GuardedStore` over `run_guarded`: a resource is a Redis string
/// beside the lock, written by a guarded `SET`, read with a plain `GET`
/// on `reads` (a connection of its own, to the same server or Cluster).
struct RedisGuarded<C> {
    name: &'static str,
    backend: RedisBackend,
    reads: C,
    set: RedisGuardedScript,
}

impl<C> RedisGuarded<C> {
    fn new(name: &'static str, backend: RedisBackend, reads: C) -> Self {
        Self {
            name,
            backend,
            reads,
            set: RedisGuardedScript::new("redis.call('SET', KEYS[1], ARGV[1]) return 'written'"),
        }
    }
}

/// The resource's Redis key. The cases name a resource as they name its
/// lock key, so `{<resource>}` is the native lock's hash tag and the data
/// shares the lock's slot in Cluster (a mismatch would be refused there
/// as InvalidArgument, failing the cases, never passing them silently).
fn data_key(resource: &str) -> String {
    format!("guarded-data:{{{resource}}}")
}

#[async_trait]
impl<C: ConnectionLike + Clone + Send + Sync> GuardedStore for RedisGuarded<C> {
    fn name(&self) -> String {
        format!("redis run_guarded ({})", self.name)
    }

    async fn write(
        &self,
        lease: &Lease,
        resource: &str,
        value: &str,
    ) -> Result<GuardedOutcome, String> {
        let reply = self
            .backend
            .run_guarded(lease, &self.set, &[&data_key(resource)], &[value])
            .await
            .map_err(|e| e.to_string())?;
        match reply {
            RedisGuardedReply::Ran(RedisValue::BulkString(b)) if b == b"written" => {
                Ok(GuardedOutcome::Written)
            }
            RedisGuardedReply::NotHeld => Ok(GuardedOutcome::Refused),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, String> {
        redis::cmd("GET")
            .arg(data_key(resource))
            .query_async(&mut self.reads.clone())
            .await
            .map_err(|e| e.to_string())
    }
}

#[async_trait]
impl<C: ConnectionLike + Clone + Send + Sync> UncheckedWrite for RedisGuarded<C> {
    async fn write_unchecked(&self, resource: &str, value: &str) -> Result<(), String> {
        redis::cmd("SET")
            .arg(data_key(resource))
            .arg(value)
            .query_async(&mut self.reads.clone())
            .await
            .map_err(|e| e.to_string())
    }
}

/// The cases pass on `run_guarded` and catch the unchecked store, run
/// side by side (each waits out a lease in its expiry case).
async fn cases_pass_and_catch_the_unchecked<C>(name: &'static str, backend: RedisBackend, reads: C)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let leases: Arc<dyn LockBackend> = Arc::new(backend.clone());
    let checked = Arc::new(RedisGuarded::new(name, backend.clone(), reads.clone()));
    let broken = Arc::new(Unchecked::new(RedisGuarded::new(name, backend, reads)));
    let (report, broken) = tokio::join!(
        run_guarded_cases(leases.clone(), checked),
        assert_unchecked_fails(leases, broken),
    );
    report.assert_passed();
    assert_eq!(report.passed().len(), GUARDED_CASES.len(), "{report:?}");
    for case in [
        "released_lease_is_refused",
        "taken_over_lease_is_refused",
        "expired_lease_is_refused",
    ] {
        assert!(broken.failed().contains(&case), "{case}: {broken:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_writes_pass_the_cases_on_one_server() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let backend = lock_redis::connect(&server.url()).await.unwrap();
    cases_pass_and_catch_the_unchecked("one server", backend, raw(server.port()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_writes_pass_the_cases_in_cluster_and_refuse_other_slots() {
    let Some(mut cluster) = RedisCluster::start(3).await.or_skip() else {
        return;
    };
    let urls: Vec<String> = cluster.nodes().iter().map(RedisServer::url).collect();
    let reads = redis::cluster::ClusterClient::new(urls)
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    let backend = lock_redis::connect(&cluster.url()).await.unwrap();

    // A key outside the lock's slot is refused before anything is sent;
    // a key with the lock's hash tag is accepted.
    let key = LockKey::new("accounts/7").unwrap();
    let lease = backend
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let set = RedisGuardedScript::new("return redis.call('SET', KEYS[1], ARGV[1])");
    let err = backend
        .run_guarded(&lease, &set, &["accounts/7:balance"], &["1"])
        .await
        .expect_err("another slot");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("{accounts/7}"), "{err}");
    let tag = backend.hash_tag(&key).unwrap();
    assert_eq!(tag, "{accounts/7}");
    let balance = format!("{tag}:balance");
    let reply = backend
        .run_guarded(&lease, &set, &[&balance], &["1"])
        .await
        .unwrap();
    assert_eq!(reply, RedisGuardedReply::Ran(RedisValue::Okay));
    backend.release(&lease).await.unwrap();

    cases_pass_and_catch_the_unchecked("cluster", backend, reads).await;
}

/// The body sees the caller's `KEYS` and `ARGV` from index 1 (not the
/// lock's), its reply comes back as it is (`nil` as `Nil`, a table as an
/// array), an error reply of the body is an error; the leases of the
/// legacy layouts and of fair mode are checked as their owner is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_bodies_see_their_own_keys_and_replies() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let backend = lock_redis::connect(&server.url()).await.unwrap();
    let key = LockKey::new("guarded-bodies").unwrap();
    let lease = backend
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let echo = RedisGuardedScript::new("return {#KEYS, #ARGV, KEYS[1], ARGV[1], ARGV[2]}");
    let reply = backend
        .run_guarded(&lease, &echo, &["k1"], &["a1", "a2"])
        .await
        .unwrap();
    let bulk = |s: &str| RedisValue::BulkString(s.as_bytes().to_vec());
    assert_eq!(
        reply,
        RedisGuardedReply::Ran(RedisValue::Array(vec![
            RedisValue::Int(1),
            RedisValue::Int(2),
            bulk("k1"),
            bulk("a1"),
            bulk("a2"),
        ]))
    );
    let nothing = RedisGuardedScript::new("local x = 1");
    let reply = backend.run_guarded(&lease, &nothing, &[], &[]).await;
    assert_eq!(reply.unwrap(), RedisGuardedReply::Ran(RedisValue::Nil));
    let failing = RedisGuardedScript::new("return redis.error_reply('ERR no funds')");
    let err = backend
        .run_guarded(&lease, &failing, &[], &[])
        .await
        .expect_err("the body's error reply");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    backend.release(&lease).await.unwrap();
    let reply = backend.run_guarded(&lease, &echo, &["k1"], &["a1"]).await;
    assert_eq!(reply.unwrap(), RedisGuardedReply::NotHeld);

    // The other layouts and fair mode: the owner is a `distlock:` value
    // (plain), a hash field (redisson), or the native value set by the
    // fair script.
    let set = RedisGuardedScript::new("return redis.call('SET', KEYS[1], ARGV[1])");
    let mut conn = raw(server.port()).await;
    for option in ["layout=redisson", "layout=plain", "fair=true"] {
        let other = lock_redis::connect(&format!("{}?{option}", server.url()))
            .await
            .unwrap();
        let key = LockKey::new(format!("{{guarded}}:{option}")).unwrap();
        let lease = other
            .try_acquire(&key, Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        let data = format!("{}:data:{option}", other.hash_tag(&key).unwrap());
        let reply = other.run_guarded(&lease, &set, &[&data], &["v"]).await;
        assert_eq!(
            reply.unwrap(),
            RedisGuardedReply::Ran(RedisValue::Okay),
            "{option}"
        );
        other.release(&lease).await.unwrap();
        let reply = other.run_guarded(&lease, &set, &[&data], &["late"]).await;
        assert_eq!(reply.unwrap(), RedisGuardedReply::NotHeld, "{option}");
        let stored: String = redis::cmd("GET")
            .arg(&data)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(stored, "v", "{option}");
    }
}

/// A read-write lease and a Redlock lease are refused with `Unsupported`
/// (nothing is sent: no one server can check a Redlock majority).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_writes_refuse_shared_and_redlock_leases() {
    let Some(servers) = RedisServer::start_many(3).await.or_skip() else {
        return;
    };
    let set = RedisGuardedScript::new("return redis.call('SET', KEYS[1], ARGV[1])");
    let key = LockKey::new("guarded-refusals").unwrap();
    let ttl = Duration::from_secs(5);

    let one = lock_redis::connect(&servers[0].url()).await.unwrap();
    let read = one
        .try_acquire_kind(&key, LeaseKind::Read, ttl)
        .await
        .unwrap()
        .unwrap();
    let err = one
        .run_guarded(&read, &set, &["data"], &["v"])
        .await
        .expect_err("a read lease");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    one.release(&read).await.unwrap();

    let redlock = lock_redis::connect(&RedisServer::redlock_url(&servers))
        .await
        .unwrap();
    let lease = redlock.try_acquire(&key, ttl).await.unwrap().unwrap();
    let err = redlock
        .run_guarded(&lease, &set, &["data"], &["v"])
        .await
        .expect_err("Redlock");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("Redlock"), "{err}");
    redlock.release(&lease).await.unwrap();
}
