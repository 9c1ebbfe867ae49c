//! Reentrancy by scope: nested guards share the outer grant, cost no
//! round trip, never leak to other tasks, and see `Lost` with the outer.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lock_core as under_test;
use lock_core::{LockClient, LockState, MemoryBackend};

mod support;
use support::{Double, Twist};

/// The memory service, counting the grant requests that reach it.
#[derive(Debug)]
struct Counting {
    grants: AtomicUsize,
}

#[async_trait]
impl Twist for Counting {
    const NAME: &'static str = "counting";

    async fn before_grant(&self) {
        self.grants.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting() -> (LockClient, Arc<Double<Counting>>) {
    let backend = Arc::new(Double::new(
        MemoryBackend::new(),
        Counting {
            grants: AtomicUsize::new(0),
        },
    ));
    (LockClient::from_arc(backend.clone()), backend)
}

#[tokio::test]
async fn nested_guards_share_the_grant_and_the_outer_one_releases() {
    let (client, backend) = counting();
    let outer = client.lock("k").acquire().await.unwrap();
    let inner = outer.reenter();
    assert!(inner.is_nested() && !outer.is_nested());
    assert_eq!(inner.token(), outer.token());
    assert_eq!(backend.grants.load(Ordering::SeqCst), 1);
    // Ending the nesting keeps the lock.
    assert!(inner.release().await.unwrap());
    assert!(outer.is_held());
    assert!(client.lock("k").try_acquire().await.unwrap().is_none());
    let inner = outer.reenter();
    drop(outer);
    assert_eq!(inner.state(), LockState::Released);
    assert!(!inner.is_held());
    // The outer guard's drop released in the background.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(client.lock("k").try_acquire().await.unwrap().is_some());
}

#[tokio::test]
async fn inside_a_scope_the_same_lock_is_nested_and_free_of_round_trips() {
    let (client, backend) = counting();
    let outer = client.lock("k").acquire().await.unwrap();
    let before = backend.grants.load(Ordering::SeqCst);
    let token = outer.token();
    let c = client.clone();
    let (nested_token, nested, spawned) = outer
        .scope(async move {
            let again = c.lock("k").acquire().await.unwrap();
            // Deeper still, and a nested scope.
            let deeper = again
                .scope(async { c.lock("k").acquire().await.unwrap() })
                .await;
            assert!(deeper.is_nested());
            // Another task is not in the scope: it waits like anyone.
            let c2 = c.clone();
            let spawned = tokio::spawn(async move { c2.lock("k").try_acquire().await })
                .await
                .unwrap()
                .unwrap();
            (again.token(), again.is_nested(), spawned.is_some())
        })
        .await;
    assert_eq!(nested_token, token);
    assert!(nested);
    assert!(!spawned, "a task spawned inside the scope got the lock");
    // Only the spawned task's try reached the backend.
    assert_eq!(backend.grants.load(Ordering::SeqCst), before + 1);
    // Outside the scope, asking again is a real request (and is refused).
    assert!(client.lock("k").try_acquire().await.unwrap().is_none());
    // Another key inside the scope is a real grant.
    let c = client.clone();
    let other = outer
        .scope(async move { c.lock("other").acquire().await.unwrap() })
        .await;
    assert!(!other.is_nested());
    other.release().await.unwrap();
    outer.release().await.unwrap();
}

#[tokio::test]
async fn a_read_under_a_write_scope_is_nested_a_write_under_a_read_is_not() {
    let client = LockClient::new(MemoryBackend::new());
    let write = client.write_lock("doc").acquire().await.unwrap();
    let c = client.clone();
    let read = write
        .scope(async move { c.read_lock("doc").acquire().await.unwrap() })
        .await;
    assert!(read.is_nested());
    assert!(read.downgrade_is_refused().await);
    write.release().await.unwrap();
    let read = client.read_lock("doc").acquire().await.unwrap();
    let c = client.clone();
    let refused = read
        .scope(async move { c.write_lock("doc").try_acquire().await.unwrap() })
        .await;
    assert!(refused.is_none(), "a write was nested under a read");
    read.release().await.unwrap();
}

#[tokio::test]
async fn lost_reaches_every_nested_guard_at_once() {
    let client = LockClient::new(MemoryBackend::new());
    let outer = client
        .lock("k")
        .ttl(Duration::from_millis(200))
        .no_renewal()
        .acquire()
        .await
        .unwrap();
    let inner = outer.reenter();
    let deeper = inner.reenter();
    let (a, b, c) = tokio::join!(outer.lost(), inner.lost(), deeper.lost());
    assert_eq!(a, b);
    assert_eq!(b, c);
    assert!(matches!(deeper.state(), LockState::Lost(_)));
}

trait RefusesDowngrade {
    async fn downgrade_is_refused(self) -> bool;
}

impl RefusesDowngrade for lock_core::LockGuard {
    async fn downgrade_is_refused(mut self) -> bool {
        self.downgrade().await.is_err()
    }
}

/// Whether `client` hands out `key` right now, and nested: `Some(true)`
/// nested (the key is in the current scope), `Some(false)` a real grant
/// (given back), `None` refused.
async fn nested_here(client: &LockClient, key: &str) -> Option<bool> {
    let guard = client.lock(key).try_acquire().await.unwrap()?;
    let nested = guard.is_nested();
    guard.release().await.unwrap();
    Some(nested)
}

/// Issue 37: two scopes running at once in one task (`join!`, `select!`)
/// each see their own lock and their parents', never each other's, and one
/// ending (or dropped half way) takes nothing of the other's with it.
#[tokio::test]
async fn sibling_scopes_in_one_task_keep_their_own_entries() {
    use tokio::time::sleep;
    let client = LockClient::new(MemoryBackend::new());
    let outer = client.lock("outer").acquire().await.unwrap();
    let a = client.lock("a").acquire().await.unwrap();
    let b = client.lock("b").acquire().await.unwrap();
    let c = &client;
    let (in_a, in_b) = outer
        .scope(async {
            tokio::join!(
                a.scope(async {
                    // Ends first.
                    sleep(Duration::from_millis(10)).await;
                    (
                        nested_here(c, "a").await,
                        nested_here(c, "b").await,
                        nested_here(c, "outer").await,
                    )
                }),
                b.scope(async {
                    sleep(Duration::from_millis(50)).await;
                    (
                        nested_here(c, "b").await,
                        nested_here(c, "a").await,
                        nested_here(c, "outer").await,
                    )
                }),
            )
        })
        .await;
    assert_eq!(in_a, (Some(true), None, Some(true)), "inside a's scope");
    assert_eq!(in_b, (Some(true), None, Some(true)), "inside b's scope");
    // A scope dropped half way by `select!` beside one that goes on.
    let in_b = outer
        .scope(async {
            let ((), in_b) = tokio::join!(
                async {
                    tokio::select! {
                        () = a.scope(std::future::pending::<()>()) => {}
                        () = sleep(Duration::from_millis(10)) => {}
                    }
                },
                b.scope(async {
                    sleep(Duration::from_millis(50)).await;
                    (
                        nested_here(c, "b").await,
                        nested_here(c, "a").await,
                        nested_here(c, "outer").await,
                    )
                }),
            );
            in_b
        })
        .await;
    assert_eq!(
        in_b,
        (Some(true), None, Some(true)),
        "beside a dropped scope"
    );
    for guard in [outer, a, b] {
        assert!(guard.release().await.unwrap());
    }
}
