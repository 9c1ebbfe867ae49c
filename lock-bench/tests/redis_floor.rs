//! The benchmark floors ([`RedisFloor`], [`RedlockFloor`]) on real servers:
//! they issue the driver's scripts on the driver's key layout over bare
//! connections, so they exclude with the driver on the same key, leave
//! nothing behind, and fail with typed errors.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::floor::RawFloor;
use conformance::proxy::FaultProxy;
use conformance::servers::redis::RedisServer;
use lock_bench::redis::{RedisFloor, RedlockFloor};
use lock_core::{ErrorKind, LockBackend, LockBackendExt, LockKey};
use lock_redis::{RedisBackend, RedisConfig};

async fn lock_keys(port: u16) -> Vec<String> {
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("floor:*")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    // Fencing counters stay forever, as the driver's do.
    keys.retain(|k| !k.ends_with(":token"));
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floor_uses_the_driver_layout_and_leaves_nothing_behind() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let url = format!("{}?prefix=floor:&timeout=1s", server.url());
    let ttl = Duration::from_secs(5);
    let floor = Arc::new(RedisFloor::connect(&url).await.unwrap());
    let backend = RedisBackend::connect(RedisConfig::from_url(&url).unwrap())
        .await
        .unwrap();
    let shared = RedisFloor::from_backend(&backend).await.unwrap();
    let key = LockKey::new("k").unwrap();
    assert_eq!(floor.redis_key("k").unwrap(), backend.redis_key(&key));
    for _ in 0..3 {
        floor.cycle("k", ttl).await.unwrap();
        shared.cycle("k", ttl).await.unwrap();
    }
    // The driver holds: the floor is refused and sets nothing.
    let lease = backend.try_acquire(&key, ttl).await.unwrap().unwrap();
    for floor in [&*floor, &shared] {
        let err = floor.cycle("k", ttl).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Contended, "{err}");
    }
    assert_eq!(
        backend.inspect(&key).await.unwrap().unwrap().token,
        Some(lease.token())
    );
    assert!(backend.release(&lease).await.unwrap());
    // The floor's grants take the driver's counter: tokens keep growing.
    let before = lease.token();
    floor.cycle("k", ttl).await.unwrap();
    let after = backend.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert!(
        after.token().get() >= before.get() + 2,
        "{after:?} after {before:?}"
    );
    assert!(backend.release(&after).await.unwrap());
    assert_eq!(lock_keys(server.port()).await, Vec::<String>::new());

    // Parallel cycles on distinct keys, as the benchmarks run them.
    conformance::bench::floor_cycles_in_parallel(floor.clone(), ttl, 8, 20)
        .await
        .unwrap();
    assert_eq!(
        lock_keys(server.port()).await,
        Vec::<String>::new(),
        "the floor left locks behind"
    );

    // Bad inputs are typed errors.
    conformance::bench::assert_floor_refuses_bad_input(&*floor, ttl, Duration::from_millis(1))
        .await;
    let err = RedisFloor::connect("redis://").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    for url in [
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        "redis+cluster://127.0.0.1:1",
        "redis+sentinel://127.0.0.1:1/mymaster",
    ] {
        let err = RedisFloor::connect(url).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{url}: {err}");
    }
    let err = RedisFloor::connect("redis://:secret@127.0.0.1:1?timeout=200ms")
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "{err}"
    );
    assert!(!format!("{err} {err:?}").contains("secret"), "{err:?}");
}

async fn admin(port: u16, db: i64) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://:s3cret@127.0.0.1:{port}/{db}"))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection")
}

async fn exists(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .expect("EXISTS")
        == 1
}

/// The bare connection says `AUTH` (password, or user and password) and
/// `SELECT` by hand, and survives a flushed script cache (`EVAL` on
/// `NOSCRIPT`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floor_authenticates_selects_and_survives_a_flushed_script_cache() {
    let Some(server) = RedisServer::start_with(&[
        "--requirepass",
        "s3cret",
        "--user",
        "alice",
        "on",
        ">wonder",
        "~*",
        "&*",
        "+@all",
    ])
    .await
    .or_skip() else {
        return;
    };
    let port = server.port();
    let ttl = Duration::from_secs(5);
    let floor = RedisFloor::connect(&format!("redis://:s3cret@127.0.0.1:{port}/3?prefix=floor:"))
        .await
        .unwrap();
    let grant = floor.try_grant("k", ttl).await.unwrap().expect("free");
    let lock = floor.redis_key("k").unwrap();
    assert!(
        exists(&mut admin(port, 3).await, &lock).await,
        "held in db 3"
    );
    assert!(
        !exists(&mut admin(port, 0).await, &lock).await,
        "not in db 0"
    );
    assert!(floor.release(&grant).await.unwrap());
    assert!(!floor.release(&grant).await.unwrap(), "released once only");

    let alice = RedisFloor::connect(&format!("redis://alice:wonder@127.0.0.1:{port}/2"))
        .await
        .unwrap();
    alice.cycle("k", ttl).await.unwrap();

    // The server forgets its scripts: the next cycle goes by EVAL.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut admin(port, 0).await)
        .await
        .unwrap();
    floor.cycle("k", ttl).await.unwrap();
    alice.cycle("k", ttl).await.unwrap();

    for url in [
        format!("redis://:wrong-pw@127.0.0.1:{port}"),
        format!("redis://alice:wrong-pw@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}"),
    ] {
        let err = RedisFloor::connect(&url).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(!format!("{err} {err:?}").contains("wrong-pw"), "{err:?}");
    }
}

/// Replies that are not Redis, a server that never answers, a connection
/// cut under the floor, TLS: typed errors within the timeout, never a
/// panic or a hang; the call after a cut connects again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floor_errors_are_typed_and_a_cut_connection_is_replaced() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Not Redis: an HTTP-ish answer to anything.
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_port = http.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = http.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0
                        || s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                            .await
                            .is_err()
                    {
                        break;
                    }
                }
            });
        }
    });
    let err = RedisFloor::connect(&format!("redis://127.0.0.1:{http_port}?timeout=1s"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    // Silent: accepts and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let _hold = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            open.push(s);
        }
    });
    let started = tokio::time::Instant::now();
    let err = RedisFloor::connect(&format!("redis://127.0.0.1:{silent_port}?timeout=200ms"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    for url in ["rediss://127.0.0.1:1", "redis://127.0.0.1:1?tls=true"] {
        let err = RedisFloor::connect(url).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{url}: {err}");
    }
    let err = RedlockFloor::connect("redis://127.0.0.1:1")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");

    // A connection cut between calls: one call fails, the next reconnects.
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], server.port())))
        .await
        .unwrap();
    let floor = RedisFloor::connect(&format!("redis://127.0.0.1:{}?timeout=1s", proxy.port()))
        .await
        .unwrap();
    let ttl = Duration::from_secs(5);
    floor.cycle("cut", ttl).await.unwrap();
    proxy.reset();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let err = floor.cycle("cut", ttl).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    floor.cycle("cut", ttl).await.unwrap();
    assert_eq!(proxy.connections(), 2, "one new connection after the cut");
}

/// The Redlock floor grants on a majority of nodes, undoes a minority
/// grant, excludes with the driver's Redlock, and keeps working with one
/// node of three dead (not with two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_floor_grants_on_a_majority() {
    let Some(mut servers) = RedisServer::start_many(3).await.or_skip() else {
        return;
    };
    let url = format!(
        "{}?prefix=floor:&timeout=1s",
        RedisServer::redlock_url(&servers)
    );
    let floor = RedlockFloor::connect(&url).await.unwrap();
    let single: Vec<RedisFloor> = {
        let mut v = Vec::new();
        for s in &servers {
            v.push(
                RedisFloor::connect(&format!("{}?prefix=floor:", s.url()))
                    .await
                    .unwrap(),
            );
        }
        v
    };
    let ttl = Duration::from_secs(5);
    floor.cycle("k", ttl).await.unwrap();

    // Held on one node: the other two are a majority.
    let one = single[0].try_grant("k", ttl).await.unwrap().unwrap();
    let grant = floor.try_grant("k", ttl).await.unwrap().expect("2 of 3");
    assert!(floor.release(&grant).await.unwrap());
    // Held on two: no majority, and the grant on the third is undone.
    let two = single[1].try_grant("k", ttl).await.unwrap().unwrap();
    assert_eq!(floor.try_grant("k", ttl).await.unwrap(), None);
    assert_eq!(lock_keys(servers[2].port()).await, Vec::<String>::new());
    assert!(single[0].release(&one).await.unwrap());
    assert!(single[1].release(&two).await.unwrap());

    // The driver's Redlock on the same nodes excludes with the floor.
    let backend = RedisBackend::connect(RedisConfig::from_url(&url).unwrap())
        .await
        .unwrap();
    let key = LockKey::new("k").unwrap();
    let lease = backend.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert_eq!(floor.try_grant("k", ttl).await.unwrap(), None);
    assert!(backend.release(&lease).await.unwrap());
    let grant = floor.try_grant("k", ttl).await.unwrap().unwrap();
    assert!(backend.try_acquire(&key, ttl).await.unwrap().is_none());
    assert!(floor.release(&grant).await.unwrap());

    servers[2].process().kill().unwrap();
    for _ in 0..3 {
        floor.cycle("k", ttl).await.unwrap();
    }
    servers[1].process().kill().unwrap();
    let err = floor.cycle("k", ttl).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
}
