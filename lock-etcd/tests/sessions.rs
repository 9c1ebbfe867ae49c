//! A session started for a TTL other than the configured one is revoked
//! once it has had no entry for three of its TTLs (at least 10 s); one
//! with a held lock, and the configured TTL's, stay. The TTL's next grant
//! starts a new session.

use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::etcd::EtcdServer;
use lock_core::LockBackendExt;
use lock_core::{LockBackend, LockClient, LockKey};
use tokio::time::{Instant, sleep};

async fn leases(backend: &lock_etcd::EtcdBackend) -> usize {
    let mut client = backend.client().clone();
    client.leases().await.unwrap().leases().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_of_other_ttls_are_retired() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let backend = lock_etcd::connect(&server.url("sessions", "ttl=30s&timeout=2s"))
        .await
        .unwrap();
    assert_eq!(leases(&backend).await, 1, "the configured TTL's session");
    // A grant of 2 s, released at once: its session goes idle.
    let key = LockKey::new("brief").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let lease = backend
        .acquire(&key, Duration::from_secs(2), deadline)
        .await
        .unwrap();
    assert!(backend.release(&lease).await.unwrap());
    // A lock of 3 s, held (and renewed) throughout.
    let client = LockClient::new(backend.clone());
    let held = client
        .lock("held")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    assert_eq!(leases(&backend).await, 3);
    let until = Instant::now() + Duration::from_secs(30);
    while leases(&backend).await > 2 {
        assert!(
            Instant::now() < until,
            "the idle 2 s session was not retired within 30 s"
        );
        sleep(Duration::from_millis(500)).await;
    }
    // The held lock's session stayed: the lock is still ours.
    assert_eq!(held.state(), lock_core::LockState::Held);
    let info = backend.inspect(&held.key()).await.unwrap().unwrap();
    assert_eq!(info.token, Some(held.token()));
    // The 2 s TTL works again, on a new session.
    let lease = backend
        .acquire(
            &key,
            Duration::from_secs(2),
            Instant::now() + Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert!(backend.release(&lease).await.unwrap());
    assert_eq!(leases(&backend).await, 3);
    held.release().await.unwrap();
}
