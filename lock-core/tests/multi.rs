//! Multi-locks: all or nothing within one deadline, one global order (no
//! deadlock between overlapping sets), nothing left behind by a failure or
//! a cancelled acquire, one lost signal.

use std::time::Duration;

use async_trait::async_trait;
use lock_core as under_test;
use lock_core::{ErrorKind, Lease, LockClient, LockError, LockState, MemoryBackend};
use tokio::time::Instant;

mod support;
use support::{Double, Twist};

fn client() -> LockClient {
    LockClient::new(MemoryBackend::new())
}

async fn free(c: &LockClient, key: &str) -> bool {
    match c.lock(key).try_acquire().await.unwrap() {
        Some(guard) => {
            guard.release().await.unwrap();
            true
        }
        None => false,
    }
}

#[tokio::test]
async fn all_or_nothing() {
    let c = client();
    let held = c.lock("k2").acquire().await.unwrap();
    assert!(
        c.lock_all(["k3", "k1", "k2"])
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        free(&c, "k1").await && free(&c, "k3").await,
        "a partial grant was left"
    );
    let err = c
        .lock_all(["k1", "k2"])
        .wait(Duration::from_millis(150))
        .acquire()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended);
    assert!(free(&c, "k1").await, "the waiting multi-lock left k1 held");
    held.release().await.unwrap();
    let all = c
        .lock_all(["k3", "k1", "k2", "k1"])
        .acquire()
        .await
        .unwrap();
    let keys: Vec<String> = all.keys().iter().map(|k| k.as_str().to_owned()).collect();
    assert_eq!(keys, ["k1", "k2", "k3"]);
    assert!(!free(&c, "k2").await);
    assert!(all.release().await.unwrap());
    assert!(free(&c, "k2").await);
    for bad in [Vec::<&str>::new(), vec!["ok", ""]] {
        let err = c.lock_all(bad).acquire().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_sets_never_deadlock() {
    let c = client();
    let mut tasks = Vec::new();
    for t in 0..4 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let set: &[&str] = if t % 2 == 0 {
                &["a", "b", "c"]
            } else {
                &["c", "b", "a"]
            };
            for _ in 0..50 {
                let guard = c
                    .lock_all(set.iter().copied())
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .unwrap();
                tokio::task::yield_now().await;
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("deadlock: overlapping multi-locks did not finish")
            .unwrap();
    }
}

#[tokio::test]
async fn a_cancelled_acquire_leaves_nothing() {
    let c = client();
    let held = c.lock("z").acquire().await.unwrap();
    let waiting = c
        .lock_all(["x", "y", "z"])
        .wait(Duration::from_secs(30))
        .acquire();
    assert!(
        tokio::time::timeout(Duration::from_millis(100), waiting)
            .await
            .is_err()
    );
    // Released in the background right after the drop.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        free(&c, "x").await && free(&c, "y").await,
        "the cancelled multi-lock left keys held"
    );
    held.release().await.unwrap();
}

#[tokio::test]
async fn one_lost_signal_for_the_set() {
    let c = client();
    let all = c
        .lock_all(["p", "q"])
        .ttl(Duration::from_millis(200))
        .no_renewal()
        .acquire()
        .await
        .unwrap();
    assert_eq!(all.state(), LockState::Held);
    let reason = all.lost().await;
    assert!(
        reason.starts_with("p:") || reason.starts_with("q:"),
        "{reason}"
    );
    assert!(matches!(all.state(), LockState::Lost(_)));
    let err = all.run(async {}).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LeaseLost);
}

/// Issue 37: while `lock_all` waits for a later key, the keys it already
/// took are renewed, so none of them expires on the server, nobody else
/// takes it, and the set is handed out whole and held.
#[tokio::test]
async fn keys_taken_first_are_renewed_while_later_ones_are_waited_for() {
    let c = client();
    let ttl = Duration::from_millis(200);
    let k2 = c.lock("k2").ttl(ttl).acquire().await.unwrap();
    let releaser = tokio::spawn(async move {
        // Held for several TTLs of the multi-lock.
        tokio::time::sleep(Duration::from_millis(700)).await;
        k2.release().await.unwrap();
    });
    let thief = {
        let c = c.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let until = tokio::time::Instant::now() + Duration::from_millis(900);
            while tokio::time::Instant::now() < until {
                if let Some(stolen) = c.lock("k1").ttl(ttl).try_acquire().await.unwrap() {
                    return Some(stolen);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            None
        })
    };
    let all = c
        .lock_all(["k1", "k2"])
        .ttl(ttl)
        .wait(Duration::from_secs(10))
        .acquire()
        .await;
    let stolen = thief.await.unwrap();
    releaser.await.unwrap();
    assert!(
        stolen.is_none(),
        "another client took k1 while lock_all was waiting for k2"
    );
    let all = all.unwrap();
    assert!(
        all.is_held(),
        "lock_all returned a set that is not held: {:?}",
        all.state()
    );
    assert!(
        all.release().await.unwrap(),
        "a key of the set was no longer ours"
    );
}

/// A memory service whose renewals never get through (the server is
/// unreachable for them).
#[derive(Debug)]
struct RenewalsFail;

#[async_trait]
impl Twist for RenewalsFail {
    const NAME: &'static str = "renewals-fail";

    async fn renew(&self, _memory: &MemoryBackend, lease: &Lease) -> Result<Instant, LockError> {
        Err(LockError::new(
            ErrorKind::Unavailable,
            lock_core::Operation::Renew,
            "injected: the renewal did not get through",
        )
        .with_key(lease.key()))
    }
}

/// Issue 37: when a key taken first runs out while `lock_all` still waits
/// (its renewals fail), the acquire fails with `LeaseLost` and leaves
/// nothing held, instead of handing out a set that is already lost.
#[tokio::test]
async fn a_set_whose_first_key_ran_out_is_never_handed_out() {
    let c = LockClient::from_arc(std::sync::Arc::new(Double::new(
        MemoryBackend::new(),
        RenewalsFail,
    )));
    let k2 = c
        .lock("k2")
        .ttl(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        k2.release().await.unwrap();
    });
    let started = Instant::now();
    let err = c
        .lock_all(["k1", "k2"])
        .ttl(Duration::from_millis(150))
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .map(|set| set.state())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "the acquire went on after k1 ran out: {:?}",
        started.elapsed()
    );
    releaser.await.unwrap();
    assert!(free(&c, "k1").await && free(&c, "k2").await);
}
