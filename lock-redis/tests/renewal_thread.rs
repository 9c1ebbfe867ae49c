//! Renewal that survives an application blocking its own runtime, against a
//! real redis-server: connected on the dedicated renewal runtime
//! (`RenewalRuntime::run_on`), the backend's I/O and the guard's renewals
//! keep running while the application's current-thread runtime is blocked
//! for 3x the TTL, and another client never gets the key. Connected on the
//! application's runtime instead, the same block loses the lock, and the
//! guard says so (`Lost`) the moment the application looks again.

use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::redis::RedisServer;
use lock_core::{
    LockBackend, LockBackendExt, LockClient, LockGuard, LockKey, LockState, RenewalRuntime,
};
use tokio::time::Instant;

const TTL: Duration = Duration::from_millis(600);

/// Probes the key from a thread and runtime of its own during the block,
/// as another process would; true when it ever got the key.
fn probe(url: String, key: LockKey) -> std::thread::JoinHandle<bool> {
    std::thread::spawn(move || {
        app_runtime().block_on(async {
            let other = lock_redis::connect(&url).await.unwrap();
            let until = Instant::now() + TTL * 5 / 2;
            while Instant::now() < until {
                if let Some(lease) = other.try_acquire(&key, TTL).await.unwrap() {
                    let _ = other.release(&lease).await;
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        })
    })
}

/// Takes `name` through `client` on `app`, then blocks `app`'s only
/// thread for 3x the TTL while another client probes the key (from
/// `url`): the guard, and whether the prober ever got the key.
fn hold_through_a_block(
    app: &tokio::runtime::Runtime,
    client: &LockClient,
    url: String,
    name: &str,
) -> (LockGuard, bool) {
    let guard = app.block_on(client.lock(name).ttl(TTL).acquire()).unwrap();
    let prober = probe(url, LockKey::new(name).unwrap());
    // The application blocks its only runtime thread.
    std::thread::sleep(TTL * 3);
    (guard, prober.join().unwrap())
}

fn app_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn server() -> Option<RedisServer> {
    app_runtime().block_on(RedisServer::start()).or_skip()
}

#[test]
fn connected_on_the_renewal_thread_the_lock_survives_a_blocked_runtime() {
    let Some(server) = server() else { return };
    let url = server.url();
    let app = app_runtime();
    let renewal = RenewalRuntime::dedicated();
    let backend: Arc<dyn LockBackend> = Arc::new(
        app.block_on(renewal.run_on({
            let url = url.clone();
            async move { lock_redis::connect(&url).await }
        }))
        .unwrap()
        .unwrap(),
    );
    let client = LockClient::from_arc(backend).with_renewal_runtime(renewal);
    let (guard, got_in) = hold_through_a_block(&app, &client, url, "blocked-app/dedicated");
    assert!(!got_in, "another client got the key during the block");
    assert_eq!(guard.state(), LockState::Held);
    assert!(app.block_on(guard.release()).unwrap());
}

#[test]
fn connected_on_the_app_runtime_the_loss_is_reported_not_silent() {
    let Some(server) = server() else { return };
    let url = server.url();
    let app = app_runtime();
    let backend: Arc<dyn LockBackend> = Arc::new(app.block_on(lock_redis::connect(&url)).unwrap());
    let client = LockClient::from_arc(backend);
    let (guard, got_in) = hold_through_a_block(&app, &client, url, "blocked-app/current");
    assert!(
        got_in,
        "the key should have expired under the blocked holder"
    );
    assert!(
        matches!(guard.state(), LockState::Lost(_)),
        "state {:?} after the lock expired under the holder",
        guard.state()
    );
    assert!(!guard.is_held());
}
