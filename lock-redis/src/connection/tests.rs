//! The lanes keep what one connection per node gave for free: the undo of
//! a grant whose answer was not seen (and a fair waiter's withdrawal) is
//! processed after the grant, and a grant's `WAIT` counts the grant's own
//! writes. Each check runs against a real server with the pinning on and
//! with its deliberately broken variant ([`Unpinned`]), which it must
//! catch.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::redis::RedisServer;
use lock_core::{LockBackend, LockBackendExt, LockKey, Operation};
use redis::Value;

use crate::connection::{Lane, Servers};
use crate::test_redis::{plain_conn, server};

const LANES: usize = 2;

/// Whether `key`'s lock exists on the server behind `conn`.
async fn held(conn: &mut crate::connection::Conn, redis_key: &str) -> bool {
    let exists: i64 = conn
        .query(redis::cmd("EXISTS").arg(redis_key))
        .await
        .unwrap();
    exists == 1
}

/// Blocks lane `lane`'s connection on the server (`BLPOP` of `list`):
/// the requests sent on it after this one wait in the server's queue until
/// an `LPUSH` to `list` wakes it.
fn block_lane(servers: &Arc<Servers>, lane: usize, list: String) {
    let servers = servers.clone();
    tokio::spawn(async move {
        let timeout = servers.timeout();
        servers
            .first()
            .run_on(
                Lane::nth(lane),
                Operation::Inspect,
                timeout,
                |mut conn| async move {
                    conn.query::<Value>(redis::cmd("BLPOP").arg(&list).arg(0))
                        .await
                },
            )
            .await
    });
}

/// A try of `key` sent while every lane is blocked, dropped (cancelled)
/// before its answer; then the lanes are woken one at a time, and after
/// each the lock is looked at. Returns whether it was ever seen held: a
/// grant and its undo on one lane run back to back (never seen); an undo
/// on another lane runs before or after the grant, and one of the looks
/// falls between them.
async fn cancelled_try_seen_held(server: &RedisServer, options: &str, unpinned: bool) -> bool {
    let url = format!(
        "redis://127.0.0.1:{}?connections={LANES}&timeout=10s{options}",
        server.port()
    );
    let b = crate::connect(&url).await.unwrap();
    let servers = b.servers();
    let k = LockKey::new(format!("lanes-undo-{unpinned}{options}")).unwrap();
    let ttl = Duration::from_secs(30);
    // Every lane connected, the scripts loaded.
    for _ in 0..4 * LANES {
        let lease = b.try_acquire(&k, ttl).await.unwrap().expect("free");
        assert!(b.release(&lease).await.unwrap());
    }
    servers.unpinned.undo.store(unpinned, Ordering::Relaxed);
    let lists: Vec<String> = (0..LANES).map(|i| format!("lanes-block-{i}")).collect();
    for (lane, list) in lists.iter().enumerate() {
        block_lane(servers, lane, list.clone());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let attempt = tokio::time::timeout(Duration::from_millis(100), b.try_acquire(&k, ttl)).await;
    assert!(
        attempt.is_err(),
        "the try was answered through a blocked lane"
    );
    // The dropped try's undo (or withdrawal) is sent in the background.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut plain = plain_conn(server.port()).await;
    let lock = b.redis_key(&k);
    let mut seen = false;
    for list in &lists {
        let _: i64 = plain
            .query(redis::cmd("LPUSH").arg(list).arg("wake"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        seen |= held(&mut plain, &lock).await;
    }
    seen
}

/// A cancelled try's cleanup goes on the connection of its grant, so the
/// server runs it right after the grant: no look ever sees the lock held.
/// For a mutex the cleanup is the undo of the grant; for a fair mutex, the
/// withdrawal of every trace of its owner. The broken variant (the cleanup
/// on the next lane) is caught in both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_of_a_cancelled_try_goes_on_the_grants_connection() {
    let Some(server) = server().await else {
        return;
    };
    for (options, cleanup) in [
        ("", "the undo of a cancelled grant"),
        ("&fair=true", "the withdrawal of a cancelled fair try"),
    ] {
        assert!(
            !cancelled_try_seen_held(&server, options, false).await,
            "{cleanup} ran before its grant: the lock stays held until its TTL"
        );
        assert!(
            cancelled_try_seen_held(&server, options, true).await,
            "the broken variant ({cleanup} on another connection) was not caught"
        );
    }
}

/// With `replicas=1` and the replica frozen, a grant's `WAIT` on its own
/// connection sees no acknowledgement and the grant is refused. The broken
/// variant sends `WAIT` on another lane, whose writes the replica had all
/// acknowledged before it froze: it confirms a grant no replica has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_runs_on_the_grants_connection() {
    let Some((master, mut replica)) = RedisServer::start_with_synced_replica().await.or_skip()
    else {
        return;
    };
    let url = format!(
        "redis://127.0.0.1:{}?connections={LANES}&replicas=1&wait_timeout=200ms",
        master.port()
    );
    let b = crate::connect(&url).await.unwrap();
    let ttl = Duration::from_secs(30);
    let mut confirmed = Vec::new();
    for (round, unpinned) in [false, true].into_iter().enumerate() {
        let k = LockKey::new(format!("lanes-wait-{round}")).unwrap();
        for _ in 0..4 * LANES {
            let lease = b.try_acquire(&k, ttl).await.unwrap().expect("free");
            assert!(b.release(&lease).await.unwrap());
        }
        // The replica acknowledges what it has every second.
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        replica.process().pause().unwrap();
        b.servers().unpinned.wait.store(unpinned, Ordering::Relaxed);
        let result = b.try_acquire(&k, ttl).await;
        b.servers().unpinned.wait.store(false, Ordering::Relaxed);
        replica.process().resume().unwrap();
        confirmed.push(match result {
            Ok(lease) => lease.is_some(),
            Err(err) => {
                assert!(err.message().contains("replicas"), "{err}");
                false
            }
        });
    }
    assert!(
        !confirmed[0],
        "a grant no replica acknowledged was confirmed (WAIT on another connection)"
    );
    assert!(
        confirmed[1],
        "the broken variant (WAIT on another lane) was not caught"
    );
}
