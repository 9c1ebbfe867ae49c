//! A dropped client lets go of what it holds at once: its session's
//! keep-alive task ends when the session is dropped, not at its next
//! keep-alive (TTL/3 later, 10 s with a 30 s TTL), so the client's
//! connection and buffers (about 110 kB each) are freed within moments.

use std::time::Duration;

use conformance::OrSkip;
use conformance::scale::{CountingAllocator, live_bytes};
use conformance::servers::etcd::EtcdServer;
use lock_core::LockClient;

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_clients_free_their_memory_at_once() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    // Keep-alives every 10 s: a task that waits for its next one keeps its
    // client well past the check below.
    let url = server.url("dropped", "ttl=30s");
    let warm = LockClient::new(lock_etcd::connect(&url).await.unwrap());
    warm.lock("warm")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base = live_bytes();
    let mut clients = Vec::new();
    for i in 0..5 {
        let client = LockClient::new(lock_etcd::connect(&url).await.unwrap());
        let guard = client.lock(format!("k{i}")).acquire().await.unwrap();
        guard.release().await.unwrap();
        clients.push(client);
    }
    let holding = live_bytes() - base;
    assert!(holding > 100_000, "5 clients hold only {holding} B");
    drop(clients);
    let mut left = holding;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = live_bytes() - base;
        if left < holding / 5 {
            break;
        }
    }
    assert!(
        left < holding / 5,
        "2 s after the drop 5 clients still hold {left} B of the {holding} B they held"
    );
    drop(warm);
}
