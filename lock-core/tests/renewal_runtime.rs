//! Renewal while the application blocks its own runtime.

use std::time::Duration;

use lock_core as under_test;
use lock_core::LockBackendExt;
use lock_core::{
    LockBackend, LockClient, LockGuard, LockKey, LockRequest, LockState, MemoryBackend,
    RenewalPolicy, RenewalRuntime,
};
use tokio::time::Instant;

mod support;
use support::{dropped_guard_frees, free_within_a_second};

const TTL: Duration = Duration::from_millis(300);

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

/// Tries the key from a thread of its own (the application's runtime is
/// blocked), as another process would.
fn probe_from_elsewhere(
    backend: MemoryBackend,
    name: &'static str,
) -> std::thread::JoinHandle<bool> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            // Probe repeatedly during the block: any success means the lock
            // ran out under its holder.
            let until = Instant::now() + TTL * 5 / 2;
            while Instant::now() < until {
                if let Some(lease) = backend.try_acquire(&key(name), TTL).await.unwrap() {
                    backend.release(&lease).await.unwrap();
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        })
    })
}

#[tokio::test(flavor = "current_thread")]
async fn blocking_the_app_runtime_loses_the_lock_loudly_when_renewal_shares_it() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    let guard = on_app_runtime(client.lock("starved").ttl(TTL))
        .acquire()
        .await
        .unwrap();
    let probe = probe_from_elsewhere(backend.clone(), "starved");
    // A synchronous call that blocks the runtime (and its watchdog).
    std::thread::sleep(TTL * 3);
    // Looked at right away, before the runtime could run anything else.
    let state = guard.state();
    let held = guard.is_held();
    assert!(
        matches!(state, LockState::Lost(_)),
        "silent expiry: state {state:?} after the deadline"
    );
    assert!(!held);
    assert!(
        probe.join().unwrap(),
        "the key should have run out during the block"
    );
    assert!(guard.lost().await.contains("deadline"));
}

/// Renewal on the application's own runtime.
fn on_app_runtime(request: LockRequest<'_>) -> LockRequest<'_> {
    request.renewal_runtime(RenewalRuntime::current())
}

#[tokio::test(flavor = "current_thread")]
async fn blocking_the_app_runtime_keeps_the_lock_when_renewal_runs_on_its_own_thread() {
    let backend = MemoryBackend::new();
    // The default: no renewal runtime chosen.
    let client = LockClient::new(backend.clone());
    assert!(client.renewal_runtime().is_dedicated());
    let guard = client.lock("busy-app").ttl(TTL).acquire().await.unwrap();
    let first_deadline = guard.validity_deadline();
    let probe = probe_from_elsewhere(backend.clone(), "busy-app");
    std::thread::sleep(TTL * 3);
    assert_eq!(guard.state(), LockState::Held);
    assert!(guard.is_held());
    assert!(guard.validity_deadline() > first_deadline + TTL * 2);
    assert!(
        !probe.join().unwrap(),
        "another client took the key during the block"
    );
    // The guard still works from the blocked-then-resumed runtime.
    let out = guard.run(async { 7 }).await.unwrap();
    assert_eq!(out, 7);
    assert!(guard.release().await.unwrap());
    assert!(
        backend
            .try_acquire(&key("busy-app"), TTL)
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(flavor = "current_thread")]
async fn lost_signal_run_and_drop_release_work_across_runtimes() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone()).with_renewal_runtime(RenewalRuntime::dedicated());
    // Lost, signalled from the renewal thread, cancels `run` here.
    let guard = client.lock("cross").ttl(TTL).acquire().await.unwrap();
    assert!(backend.release(&guard.lease()).await.unwrap());
    let err = guard
        .run(tokio::time::sleep(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert!(err.is_lost(), "{err}");
    assert!(guard.lost().await.contains("renewal refused"));
    drop(guard);
    // Drop releases in the background.
    dropped_guard_frees(
        &client,
        &backend,
        &key("cross"),
        TTL,
        "the dropped guard's lock was released",
    )
    .await;
}

#[test]
fn a_guard_made_outside_any_runtime_renews_on_the_dedicated_thread() {
    let backend = MemoryBackend::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let lease = runtime
        .block_on(backend.try_acquire(&key("no-runtime"), TTL))
        .unwrap()
        .unwrap();
    drop(runtime);
    // Formerly a panic ("must be called within a Tokio runtime").
    let guard = LockGuard::new(
        std::sync::Arc::new(backend.clone()),
        lease,
        RenewalPolicy::default(),
    );
    std::thread::sleep(TTL * 2);
    assert_eq!(guard.state(), LockState::Held);
    // Dropped outside a runtime: released on the renewal thread.
    drop(guard);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        free_within_a_second(&backend, &key("no-runtime"), TTL, "released by the drop").await;
    });
}
