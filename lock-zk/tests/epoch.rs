//! A read-write lock's write epoch outlives its directory. The directory
//! is a container node (Curator makes it one too): once its last node is
//! gone the server deletes it at its next container check. Readers must
//! still carry the token of the last write grant then, as the token
//! contract says (`lock_core::kind`), not 0 from a re-created directory.
//! The server here checks its containers every 100 ms instead of every
//! 60 s, so the deletion happens within the test.

use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::zookeeper::ZkServer;
use lock_core::{LeaseKind, LockBackend, LockBackendExt, LockKey, LockShape, OwnerId};
use tokio::time::sleep;

const TTL: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_carry_the_last_write_token_after_the_directory_is_reaped() {
    let Some(server) = ZkServer::start_reaping_containers(Duration::from_millis(100))
        .await
        .or_skip()
    else {
        return;
    };
    let backend = lock_zk::connect(&server.url()).await.unwrap();
    let key = LockKey::new(format!("epoch-{}", &OwnerId::random().to_hex()[..8])).unwrap();
    let take = |kind| {
        let (backend, key) = (&backend, &key);
        async move {
            backend
                .try_acquire_kind(key, kind, TTL)
                .await
                .unwrap()
                .expect("the key is free")
        }
    };

    let write = take(LeaseKind::Write).await;
    assert!(backend.release(&write).await.unwrap());
    // The directory is empty now: the server deletes it within 100 ms.
    let dir = backend.rwlock_path(&key);
    let client = zookeeper_client::Client::connect(&server.connect_string())
        .await
        .unwrap();
    let mut reaped = false;
    for _ in 0..50 {
        sleep(Duration::from_millis(100)).await;
        if client.check_stat(&dir).await.unwrap().is_none() {
            reaped = true;
            break;
        }
    }
    assert!(reaped, "the server never deleted the empty directory {dir}");

    let read = take(LeaseKind::Read).await;
    assert_eq!(
        read.token(),
        write.token(),
        "a read after the directory was re-created carries {} instead of the last write's {}",
        read.token(),
        write.token()
    );
    let holders = backend.holders(&key, LockShape::ReadWrite).await.unwrap();
    assert_eq!(
        holders.iter().map(|h| h.token).collect::<Vec<_>>(),
        vec![Some(write.token())],
        "holders report the reader's epoch: {holders:?}"
    );
    assert!(backend.release(&read).await.unwrap());

    // A later write still outgrows every earlier grant, and readers follow it.
    let next = take(LeaseKind::Write).await;
    assert!(next.token() > write.token());
    assert!(backend.release(&next).await.unwrap());
    let read = take(LeaseKind::Read).await;
    assert_eq!(read.token(), next.token());
    assert!(backend.release(&read).await.unwrap());
}
