//! Multi-locks: all or nothing within one deadline, one global order (no
//! deadlock between overlapping sets), nothing left behind by a failure or
//! a cancelled acquire, one lost signal.

use std::time::Duration;

use lock_core::{ErrorKind, LockClient, LockState, MemoryBackend};

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
