//! The guard's renewal, caps, lost signal, `run`, release and drop.

use std::sync::Arc;
use std::time::Duration;

use lock_core as under_test;
use lock_core::LockBackendExt;
use lock_core::{
    ErrorKind, Lease, LockBackend, LockClient, LockKey, LockState, MemoryBackend, MemoryFault,
    SessionState, async_trait,
};
use tokio::sync::watch;
use tokio::time::{Instant, sleep};

mod support;
use support::{Double, Twist, dropped_guard_frees};

const TTL: Duration = Duration::from_millis(300);

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

#[tokio::test]
async fn renews_well_past_the_ttl() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    let guard = client.lock("renewed").ttl(TTL).acquire().await.unwrap();
    let first_deadline = guard.validity_deadline();
    sleep(TTL * 4).await;
    assert_eq!(guard.state(), LockState::Held);
    assert!(guard.is_held());
    assert!(guard.validity_deadline() > first_deadline + TTL * 3);
    assert!(
        backend
            .try_acquire(&key("renewed"), TTL)
            .await
            .unwrap()
            .is_none()
    );
    assert!(guard.release().await.unwrap());
    assert!(
        backend
            .try_acquire(&key("renewed"), TTL)
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn renewal_cap_lets_the_lease_run_out_and_says_so() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    let started = Instant::now();
    let guard = client
        .lock("capped")
        .ttl(TTL)
        .max_renewals(2)
        .acquire()
        .await
        .unwrap();
    let reason = guard.lost().await;
    let elapsed = started.elapsed();
    assert!(reason.contains("hold limit"), "{reason}");
    // Two renewals at ~TTL/3 each, then the lease runs its full TTL.
    assert!(elapsed >= TTL, "lost after {elapsed:?}");
    assert!(elapsed < TTL * 3, "lost after {elapsed:?}");
    assert!(matches!(guard.state(), LockState::Lost(_)));
    assert!(!guard.is_held());
}

#[tokio::test]
async fn max_hold_stops_renewing() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend);
    let started = Instant::now();
    let guard = client
        .lock("held-for")
        .ttl(TTL)
        .max_hold(TTL)
        .acquire()
        .await
        .unwrap();
    guard.lost().await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= TTL && elapsed < TTL * 3,
        "lost after {elapsed:?}"
    );
}

#[tokio::test]
async fn lost_fires_by_the_deadline_when_the_backend_hangs_and_run_is_cancelled() {
    let backend = MemoryBackend::with_op_timeout(Duration::from_secs(5));
    let client = LockClient::new(backend.clone());
    let guard = client.lock("hang").ttl(TTL).acquire().await.unwrap();
    backend.set_fault(MemoryFault::Hang);
    let deadline = guard.validity_deadline();
    let mut states = guard.subscribe();
    let result = guard.run(sleep(Duration::from_secs(10))).await;
    let lost_at = Instant::now();
    let err = result.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LeaseLost);
    assert!(
        lost_at <= deadline + Duration::from_millis(50),
        "late by {:?}",
        lost_at - deadline
    );
    assert!(matches!(&*states.borrow_and_update(), LockState::Lost(_)));
    backend.set_fault(MemoryFault::None);
}

#[tokio::test]
async fn unavailable_backend_makes_the_guard_suspect_first() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    let guard = client.lock("flaky").ttl(TTL).acquire().await.unwrap();
    backend.set_fault(MemoryFault::Unavailable);
    let mut states = guard.subscribe();
    let mut seen = Vec::new();
    while !states.borrow_and_update().is_terminal() {
        states.changed().await.unwrap();
        seen.push(states.borrow().clone());
    }
    assert_eq!(seen.first(), Some(&LockState::Suspect), "{seen:?}");
    assert!(matches!(seen.last(), Some(LockState::Lost(_))), "{seen:?}");
}

#[tokio::test]
async fn suspect_recovers_to_held_when_renewal_succeeds_again() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    let guard = client
        .lock("blip")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    backend.set_fault(MemoryFault::Unavailable);
    let mut states = guard.subscribe();
    while *states.borrow_and_update() != LockState::Suspect {
        states.changed().await.unwrap();
    }
    backend.set_fault(MemoryFault::None);
    while *states.borrow_and_update() != LockState::Held {
        states.changed().await.unwrap();
    }
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn taken_over_lease_is_lost_at_the_next_renewal() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    let guard = client.lock("stolen").ttl(TTL).acquire().await.unwrap();
    // Release behind the guard's back (e.g. an operator's `distlock release`).
    assert!(backend.release(&guard.lease()).await.unwrap());
    let reason = guard.lost().await;
    assert!(reason.contains("renewal refused"), "{reason}");
    assert!(
        !guard.release().await.unwrap(),
        "release of a lost lock must say not held"
    );
}

#[tokio::test]
async fn drop_releases_in_the_background() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    dropped_guard_frees(
        &client,
        &backend,
        &key("dropped"),
        TTL,
        "the dropped guard's lock was released promptly",
    )
    .await;
    assert_eq!(backend.active_keys(), 0);
}

#[tokio::test]
async fn with_lock_runs_and_releases() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    let out = client.with_lock("job", async { 7 }).await.unwrap();
    assert_eq!(out, 7);
    assert!(client.inspect("job").await.unwrap().is_none());
}

#[tokio::test]
async fn contended_try_returns_none_and_wait_times_out_typed() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend);
    let held = client
        .lock("busy")
        .ttl(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert!(client.lock("busy").try_acquire().await.unwrap().is_none());
    let started = Instant::now();
    let err = client
        .lock("busy")
        .wait(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap_err();
    assert!(err.is_contended(), "{err}");
    assert!(started.elapsed() < Duration::from_millis(400));
    assert!(held.release().await.unwrap());
}

#[tokio::test]
async fn requirements_are_checked() {
    let client = LockClient::new(MemoryBackend::new());
    let client = client
        .require(
            &lock_core::Requirements::none()
                .fencing()
                .linearizable()
                .fifo(),
        )
        .unwrap();
    assert!(client.capabilities().has_fencing());
}

/// A backend whose leases hang off a session we control.
#[derive(Debug)]
struct SessionBackend {
    session: watch::Receiver<SessionState>,
}

#[async_trait]
impl Twist for SessionBackend {
    const NAME: &'static str = "session";

    fn granted(&self, lease: Lease) -> Lease {
        lease.with_session(self.session.clone())
    }
}

#[tokio::test]
async fn session_signals_drive_the_guard() {
    let (tx, rx) = watch::channel(SessionState::Alive);
    let backend = Arc::new(Double::new(
        MemoryBackend::new(),
        SessionBackend { session: rx },
    ));
    let client = LockClient::from_arc(backend);
    let guard = client
        .lock("session")
        .ttl(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let mut states = guard.subscribe();
    tx.send(SessionState::Suspect).unwrap();
    states.changed().await.unwrap();
    assert_eq!(*states.borrow_and_update(), LockState::Suspect);
    tx.send(SessionState::Lost("expired".into())).unwrap();
    let reason = guard.lost().await;
    assert!(reason.contains("expired"), "{reason}");
}
