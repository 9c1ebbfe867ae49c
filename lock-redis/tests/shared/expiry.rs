//! Expiry of the dead: a crashed reader or permit holder frees its share
//! at its TTL, and a crashed, cancelled or timed-out waiting writer stops
//! keeping readers out (nothing of theirs is left behind).

use std::time::Duration;

use lock_core::{ErrorKind, LeaseKind, LockBackend, LockBackendExt};
use tokio::time::{Instant, sleep};

use super::shared_checks::*;
use crate::common::raw;

/// A crashed reader or permit holder (never renewed nor released) frees its
/// share when its TTL ends: a waiting writer / permit request gets in then,
/// and the dead member never keeps a key alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_holders_free_their_share_at_their_ttl() {
    let Some((server, b)) = single().await else {
        return;
    };
    let short = Duration::from_millis(300);
    let k = key("crash");
    // A long-lived reader that leaves, and a crashed short one.
    let long = b
        .try_acquire_kind(&k, LeaseKind::Read, TTL)
        .await
        .unwrap()
        .unwrap();
    let _crashed = b
        .try_acquire_kind(&k, LeaseKind::Read, short)
        .await
        .unwrap()
        .unwrap();
    assert!(b.release(&long).await.unwrap());
    let start = Instant::now();
    let w = b
        .acquire_kind(&k, LeaseKind::Write, TTL, soon(3_000))
        .await
        .expect("the writer gets in when the crashed reader's TTL ends");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(900),
        "{took:?}"
    );
    assert!(b.release(&w).await.unwrap());
    // Permits: 2 of 2 held by a crashed holder.
    let _crashed = b
        .try_acquire_kind(&k, permits(2, 2), short)
        .await
        .unwrap()
        .unwrap();
    let start = Instant::now();
    let p = b
        .acquire_kind(&k, permits(1, 2), TTL, soon(3_000))
        .await
        .expect("the permit comes back at the crashed holder's TTL");
    assert!(start.elapsed() < Duration::from_millis(900));
    assert!(b.release(&p).await.unwrap());
    // Only the counters are left (kept forever, like the mutex's).
    assert_only_counters_left(&mut raw(server.port()).await, &k).await;
}

/// A waiting writer that crashed (its entry never refreshed nor withdrawn)
/// blocks new readers only until its entry's TTL ends; one that is
/// cancelled (future dropped) stops blocking them at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_or_cancelled_waiting_writers_stop_blocking_readers() {
    let Some((server, b)) = single().await else {
        return;
    };
    let k = key("waiter");
    let names_base = format!("distlock:{{{k}}}:rw");
    let mut conn = raw(server.port()).await;
    // A crashed waiting writer, as its script left it: in the queue with an
    // expiry 400 ms from now (server time).
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let expiry = secs * 1000 + micros / 1000 + 400;
    let _: () = redis::pipe()
        .cmd("ZADD")
        .arg(format!("{names_base}:queue"))
        .arg(1)
        .arg("dead-writer")
        .ignore()
        .cmd("ZADD")
        .arg(format!("{names_base}:queue-expiry"))
        .arg(expiry)
        .arg("dead-writer")
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        b.try_acquire_kind(&k, LeaseKind::Read, TTL)
            .await
            .unwrap()
            .is_none(),
        "a live waiting writer keeps readers out"
    );
    let start = Instant::now();
    let r = b
        .acquire_kind(&k, LeaseKind::Read, TTL, soon(3_000))
        .await
        .expect("the reader gets in when the dead waiter's entry expires");
    let took = start.elapsed();
    assert!(took < Duration::from_millis(900), "{took:?}");
    // A writer waiting behind that reader is cancelled: readers go on.
    let waiting = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move {
            b.acquire_kind(&k, LeaseKind::Write, TTL, soon(10_000))
                .await
        })
    };
    sleep(Duration::from_millis(150)).await;
    assert!(
        b.try_acquire_kind(&k, LeaseKind::Read, TTL)
            .await
            .unwrap()
            .is_none(),
        "the waiting writer keeps readers out"
    );
    // Its entry expires soon (three re-check intervals at most), not with
    // its lease's TTL: a writer that dies waiting blocks readers briefly.
    let entries: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(format!("{names_base}:queue-expiry"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await
        .unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = (secs * 1000 + micros / 1000) as f64;
    assert_eq!(entries.len(), 1, "{entries:?}");
    let left = entries[0].1 - now_ms;
    assert!(
        left > 0.0 && left <= 1_500.0 && TTL > Duration::from_millis(1_500),
        "the waiting entry lives {left} ms (lease TTL {TTL:?})"
    );
    waiting.abort();
    let _ = waiting.await;
    let start = Instant::now();
    let r2 = loop {
        if let Some(r2) = b.try_acquire_kind(&k, LeaseKind::Read, TTL).await.unwrap() {
            break r2;
        }
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "the cancelled writer still blocks readers"
        );
        sleep(Duration::from_millis(5)).await;
    };
    let queued: u64 = redis::cmd("ZCARD")
        .arg(format!("{names_base}:queue"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(queued, 0, "the cancelled waiter left its entry");
    // A writer whose wait reaches its deadline withdraws before returning.
    let err = b
        .acquire_kind(&k, LeaseKind::Write, TTL, soon(200))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended);
    let r3 = b
        .try_acquire_kind(&k, LeaseKind::Read, TTL)
        .await
        .unwrap()
        .expect("no entry left by the timed-out writer");
    for r in [&r, &r2, &r3] {
        assert!(b.release(r).await.unwrap());
    }
}
