//! The benchmark floor ([`RedisFloor`]) on a real server: it issues the
//! driver's scripts on the driver's key layout, so it excludes with the
//! driver on the same key, and it leaves nothing behind.

use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::redis::RedisServer;
use lock_core::{ErrorKind, LockBackend, LockError, LockKey};
use lock_redis::floor::RedisFloor;
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
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let floor = floor.clone();
            tokio::spawn(async move {
                for _ in 0..20 {
                    floor.cycle(&format!("par/{t}"), ttl).await?;
                }
                Ok::<_, LockError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(
        lock_keys(server.port()).await,
        Vec::<String>::new(),
        "the floor left locks behind"
    );

    // Bad inputs are typed errors.
    let err = floor.cycle("", ttl).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = floor
        .cycle("k", Duration::from_millis(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
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
