//! Fair mode (`fair=true`) and multi-locks (`try_acquire_all`) on real
//! servers: fair and unfair clients exclude each other (a client on
//! another key layout is caught not excluding); a try never jumps a queue;
//! a cancelled waiter leaves the queue at once while a killed one (its
//! withdrawal cut off) holds up the next waiter only until its entry lease
//! ends; a set with a held key grants nothing and leaves nothing behind,
//! tokens are fresh; on Cluster a one-slot set is taken by one script and a
//! spread set falls back to one key at a time; Redlock refuses both.

mod common;

use std::time::Duration;

use common::raw;
use conformance::OrSkip;
use conformance::proxy::FaultProxy;
use conformance::servers::redis::{RedisCluster, RedisServer};
use lock_core::{ErrorKind, LockBackend, LockBackendExt, LockClient, LockKey, lock_order};
use lock_redis::RedisBackend;
use redis::aio::MultiplexedConnection;
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(10);

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

/// Waiters in the fair queue of `name` (the layout of the crate docs).
async fn queued(conn: &mut MultiplexedConnection, backend: &RedisBackend, name: &str) -> i64 {
    let queue = format!("{}:fair:queue", backend.redis_key(&key(name)));
    redis::cmd("ZCARD")
        .arg(queue)
        .query_async(conn)
        .await
        .unwrap()
}

async fn wait_queued(conn: &mut MultiplexedConnection, backend: &RedisBackend, name: &str, n: i64) {
    let until = Instant::now() + Duration::from_secs(5);
    while queued(conn, backend, name).await != n {
        assert!(Instant::now() < until, "{name}: the queue never held {n}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// Whether `b` is refused a key `a` holds.
async fn excludes(a: &RedisBackend, b: &RedisBackend, name: &str) -> bool {
    let lease = a.try_acquire(&key(name), TTL).await.unwrap().expect("free");
    let other = b.try_acquire(&key(name), TTL).await.unwrap();
    if let Some(other) = &other {
        b.release(other).await.unwrap();
    }
    assert!(a.release(&lease).await.unwrap());
    other.is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_and_unfair_clients_exclude_each_other() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let url = server.url();
    let fair = lock_redis::connect(&format!("{url}?fair=true&recheck=10s"))
        .await
        .unwrap();
    let unfair = lock_redis::connect(&url).await.unwrap();
    assert!(fair.capabilities().fifo && !unfair.capabilities().fifo);
    assert!(
        excludes(&fair, &unfair, "x").await,
        "a fair holder, an unfair try"
    );
    assert!(
        excludes(&unfair, &fair, "x").await,
        "an unfair holder, a fair try"
    );
    // The broken double: a fair client on another key layout (another
    // prefix) is granted the "same" lock; the check above sees it.
    let elsewhere = lock_redis::connect(&format!("{url}?fair=true&prefix=elsewhere:"))
        .await
        .unwrap();
    assert!(
        !excludes(&unfair, &elsewhere, "x").await,
        "the check must see this"
    );

    // A fair waiter behind an unfair holder is woken by its release (the
    // re-check is 10 s: a grant within a second is the notification), and
    // the token counter is shared.
    let mut conn = raw(server.port()).await;
    let held = unfair.try_acquire(&key("x"), TTL).await.unwrap().unwrap();
    let task = {
        let fair = fair.clone();
        tokio::spawn(async move {
            let lease = fair
                .acquire(&key("x"), TTL, Instant::now() + Duration::from_secs(8))
                .await;
            (lease, Instant::now())
        })
    };
    wait_queued(&mut conn, &fair, "x", 1).await;
    sleep(Duration::from_millis(50)).await;
    let released_at = Instant::now();
    assert!(unfair.release(&held).await.unwrap());
    let (lease, granted_at) = task.await.unwrap();
    let lease = lease.expect("granted after the unfair release");
    assert!(granted_at - released_at < Duration::from_secs(1));
    assert!(lease.token() > held.token(), "one counter for both");
    assert!(fair.release(&lease).await.unwrap());
    assert_eq!(queued(&mut conn, &fair, "x").await, 0, "no entry left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_never_jumps_the_queue() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let fair = lock_redis::connect(&format!("{}?fair=true&recheck=10s", server.url()))
        .await
        .unwrap();
    let mut conn = raw(server.port()).await;
    let held = fair.try_acquire(&key("q"), TTL).await.unwrap().unwrap();
    let task = {
        let fair = fair.clone();
        tokio::spawn(async move {
            fair.acquire(&key("q"), TTL, Instant::now() + Duration::from_secs(8))
                .await
        })
    };
    wait_queued(&mut conn, &fair, "q", 1).await;
    // Past the waiter's re-try after subscribing (it then sleeps for 3 s).
    let channel = format!("{}:released", fair.redis_key(&key("q")));
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let subs: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut conn)
            .await
            .unwrap();
        if subs.first().is_some_and(|(_, n)| *n > 0) {
            break;
        }
        assert!(Instant::now() < until, "the waiter never subscribed");
        sleep(Duration::from_millis(5)).await;
    }
    sleep(Duration::from_millis(100)).await;
    // The holder's key goes without a release notification (as when it
    // expires): the key is free, and the waiter is the queue's head.
    let lock = fair.redis_key(&key("q"));
    let _: i64 = redis::cmd("DEL")
        .arg(&lock)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        fair.try_acquire(&key("q"), TTL).await.unwrap().is_none(),
        "a try took a free key a waiter queues for"
    );
    let unfair = lock_redis::connect(&server.url()).await.unwrap();
    let sets = fair
        .try_acquire_all(&lock_order(&[key("p"), key("q")]), TTL)
        .await
        .unwrap();
    assert!(sets.is_none(), "a fair set took a key a waiter queues for");
    // Unfair clients ignore the queue (the broken variant of both checks):
    // they take the key, and the waiter gets it after them.
    let jumped = unfair.try_acquire(&key("q"), TTL).await.unwrap();
    let jumped = jumped.expect("an unfair try does not look at the queue");
    assert!(unfair.release(&jumped).await.unwrap());
    let lease = task.await.unwrap().expect("the head is granted");
    assert!(lease.token() > jumped.token() && jumped.token() > held.token());
    assert!(fair.release(&lease).await.unwrap());
}

/// A cancelled waiter withdraws its queue entry (in the background) at
/// once: the waiter behind it is granted right after the release. A
/// killed waiter (its connection cut, so the withdrawal never arrives)
/// leaves its entry behind, and the next waiter is held up until that
/// entry's lease ends (1.5 s with `recheck=500ms`), no longer: the first
/// check fails on it, the second bounds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_leaves_at_once_a_killed_one_within_its_entry_lease() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let options = "fair=true&recheck=500ms";
    let url = format!("{}?{options}", server.url());
    let backend = lock_redis::connect(&url).await.unwrap();
    let mut conn = raw(server.port()).await;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], server.port()));
    let mut gaps = Vec::new();
    for killed in [false, true] {
        let name = if killed { "killed" } else { "cancelled" };
        let proxy = FaultProxy::start(addr).await.unwrap();
        let doomed = lock_redis::connect(&format!("redis://127.0.0.1:{}?{options}", proxy.port()))
            .await
            .unwrap();
        let held = backend.try_acquire(&key(name), TTL).await.unwrap().unwrap();
        let first = {
            let doomed = doomed.clone();
            tokio::spawn(async move {
                doomed
                    .acquire(&key(name), TTL, Instant::now() + Duration::from_secs(20))
                    .await
            })
        };
        wait_queued(&mut conn, &backend, name, 1).await;
        let second = {
            let backend = backend.clone();
            tokio::spawn(async move {
                let lease = backend
                    .acquire(&key(name), TTL, Instant::now() + Duration::from_secs(20))
                    .await;
                (lease, Instant::now())
            })
        };
        wait_queued(&mut conn, &backend, name, 2).await;
        if killed {
            proxy.blackhole();
        }
        first.abort();
        let _ = first.await;
        if killed {
            sleep(Duration::from_millis(100)).await;
            assert_eq!(
                queued(&mut conn, &backend, name).await,
                2,
                "the entry stays"
            );
        } else {
            wait_queued(&mut conn, &backend, name, 1).await;
        }
        let released_at = Instant::now();
        assert!(backend.release(&held).await.unwrap());
        let (lease, granted_at) = second.await.unwrap();
        let lease = lease.expect("the second waiter is granted");
        gaps.push(granted_at - released_at);
        assert!(backend.release(&lease).await.unwrap());
        assert_eq!(
            queued(&mut conn, &backend, name).await,
            0,
            "{name}: queue left"
        );
    }
    let (cancelled, killed) = (gaps[0], gaps[1]);
    println!("next waiter granted after the release: cancelled {cancelled:?}, killed {killed:?}");
    assert!(
        cancelled < Duration::from_millis(400),
        "after a cancelled waiter: granted {cancelled:?} after the release"
    );
    assert!(
        killed >= Duration::from_millis(400),
        "the killed waiter's entry must hold up the next (the check above would fail): {killed:?}"
    );
    assert!(
        killed < Duration::from_millis(2500),
        "a killed waiter held up the queue beyond its 1.5 s entry lease: {killed:?}"
    );
}

/// Tokens of `names`' counters (`None`: never granted).
async fn counters(
    conn: &mut MultiplexedConnection,
    backend: &RedisBackend,
    names: &[&str],
) -> Vec<Option<u64>> {
    let mut out = Vec::new();
    for name in names {
        let counter = format!("{}:token", backend.redis_key(&key(name)));
        out.push(
            redis::cmd("GET")
                .arg(counter)
                .query_async(conn)
                .await
                .unwrap(),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_is_taken_whole_or_not_at_all_with_fresh_tokens() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let backend = lock_redis::connect(&server.url()).await.unwrap();
    let other = lock_redis::connect(&server.url()).await.unwrap();
    let mut conn = raw(server.port()).await;
    let names = ["a", "b", "c"];
    let set = lock_order(&names.map(key));
    let held = other.try_acquire(&key("b"), TTL).await.unwrap().unwrap();
    assert!(backend.try_acquire_all(&set, TTL).await.unwrap().is_none());
    // Nothing behind: a and c free, their counters untouched; only b's
    // lock, counter and holder details exist.
    assert!(backend.inspect(&key("a")).await.unwrap().is_none());
    assert!(backend.inspect(&key("c")).await.unwrap().is_none());
    assert_eq!(
        counters(&mut conn, &backend, &names).await,
        [None, Some(1), None]
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert!(keys.iter().all(|k| k.contains("{b}")), "{keys:?}");
    assert!(other.release(&held).await.unwrap());

    let mut last = [0, 1, 0];
    for round in 0..3 {
        let leases = backend
            .try_acquire_all(&set, TTL)
            .await
            .unwrap()
            .expect("free");
        assert_eq!(leases.len(), 3);
        for (i, lease) in leases.iter().enumerate() {
            assert_eq!(lease.key(), &set[i]);
            assert!(
                lease.token().get() > last[i],
                "round {round}: {:?}",
                lease.key()
            );
            last[i] = lease.token().get();
            let info = other.inspect(lease.key()).await.unwrap().expect("held");
            assert_eq!(info.holder, lease.owner().to_hex());
            assert_eq!(info.token, Some(lease.token()));
            // A plain lock of a key of the set is refused.
            assert!(other.try_acquire(lease.key(), TTL).await.unwrap().is_none());
        }
        assert_ne!(leases[0].owner(), leases[1].owner(), "an owner per grant");
        // Renewed and released like any mutex lease.
        let refs: Vec<&lock_core::Lease> = leases.iter().collect();
        assert!(backend.renew_many(&refs).await.iter().all(Result::is_ok));
        for lease in &leases {
            assert!(backend.release(lease).await.unwrap());
        }
    }
    // The user API: lock_all through the one exchange.
    let client = LockClient::new(backend.clone());
    let guard = client
        .lock_all(names)
        .ttl(TTL)
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    assert!(
        guard
            .tokens()
            .iter()
            .zip(last)
            .all(|((_, t), l)| t.get() > l)
    );
    assert!(guard.release().await.unwrap());
}

/// On Cluster, a set whose keys share one slot is taken by the script; a
/// set spread over slots is `Unsupported` there (nothing sent) and
/// `lock_all` takes it one key at a time. Redlock refuses both the set
/// exchange and fair mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_sets_need_one_slot_and_redlock_refuses() {
    let Some(cluster) = RedisCluster::start(3).await.or_skip() else {
        return;
    };
    let backend = lock_redis::connect(&cluster.url()).await.unwrap();
    let slot = |name: &str| redis::cluster_routing::Slot::for_key(backend.redis_key(&key(name)));
    let mate = (1..200_000)
        .map(|i| format!("k{i}"))
        .find(|name| slot(name) == slot("k0"))
        .expect("a key in k0's slot");
    let spread = (1..)
        .map(|i| format!("k{i}"))
        .find(|n| slot(n) != slot("k0"))
        .unwrap();
    let same = lock_order(&[key("k0"), key(&mate)]);
    let leases = backend
        .try_acquire_all(&same, TTL)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(leases.len(), 2);
    for lease in &leases {
        assert!(backend.release(lease).await.unwrap());
    }
    let apart = lock_order(&[key("k0"), key(&spread)]);
    let err = backend.try_acquire_all(&apart, TTL).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let client = LockClient::new(backend.clone());
    let guard = client
        .lock_all(["k0", spread.as_str()])
        .ttl(TTL)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("taken one key at a time");
    assert_eq!(guard.keys().len(), 2);
    assert!(guard.release().await.unwrap());

    let servers = RedisServer::start_many(3).await.unwrap();
    let url = RedisServer::redlock_url(&servers);
    let redlock = lock_redis::connect(&url).await.unwrap();
    let err = redlock.try_acquire_all(&same, TTL).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let err = lock_redis::connect(&format!("{url}?fair=true"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
}
