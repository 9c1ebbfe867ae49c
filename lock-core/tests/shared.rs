//! Read-write locks, semaphores and segments through the user API, on the
//! memory backend.

use std::time::Duration;

use lock_core::LockBackendExt;
use lock_core::{ErrorKind, LeaseKind, LockBackend, LockClient, LockKey, LockShape, MemoryBackend};

fn client() -> LockClient {
    LockClient::new(MemoryBackend::new())
}

const TTL: Duration = Duration::from_secs(10);

#[tokio::test]
async fn readers_share_and_writers_exclude() {
    let c = client();
    let r1 = c.read_lock("doc").ttl(TTL).acquire().await.unwrap();
    let r2 = c.read_lock("doc").ttl(TTL).acquire().await.unwrap();
    assert_eq!(r1.kind(), LeaseKind::Read);
    assert!(c.write_lock("doc").try_acquire().await.unwrap().is_none());
    // The mutex of the same name is another lock.
    let m = c.lock("doc").acquire().await.unwrap();
    assert!(r1.release().await.unwrap());
    assert!(r2.release().await.unwrap());
    let w = c.write_lock("doc").ttl(TTL).acquire().await.unwrap();
    assert!(c.read_lock("doc").try_acquire().await.unwrap().is_none());
    assert!(w.release().await.unwrap());
    m.release().await.unwrap();
}

#[tokio::test]
async fn a_waiting_writer_keeps_new_readers_out() {
    let c = client();
    let r1 = c.read_lock("doc").ttl(TTL).acquire().await.unwrap();
    let c2 = c.clone();
    let writer = tokio::spawn(async move {
        c2.write_lock("doc")
            .ttl(TTL)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(c.read_lock("doc").try_acquire().await.unwrap().is_none());
    assert!(r1.release().await.unwrap());
    let w = writer.await.unwrap().unwrap();
    assert!(w.token().get() > 0);
    w.release().await.unwrap();
    assert!(c.read_lock("doc").try_acquire().await.unwrap().is_some());
}

#[tokio::test]
async fn read_tokens_carry_the_write_epoch_and_downgrade_keeps_it() {
    let c = client();
    let r0 = c.read_lock("epoch").acquire().await.unwrap();
    assert_eq!(r0.token().get(), 0);
    r0.release().await.unwrap();
    let mut w = c.write_lock("epoch").acquire().await.unwrap();
    let token = w.token();
    w.upgrade().unwrap_err();
    w.downgrade().await.unwrap();
    assert_eq!(w.kind(), LeaseKind::Read);
    assert_eq!(w.token(), token);
    let r = c.read_lock("epoch").acquire().await.unwrap();
    assert_eq!(r.token(), token);
    let err = r.upgrade().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WouldDeadlock);
    assert_eq!(
        w.downgrade().await.unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert!(c.write_lock("epoch").try_acquire().await.unwrap().is_none());
    w.release().await.unwrap();
    r.release().await.unwrap();
    let w2 = c.write_lock("epoch").acquire().await.unwrap();
    assert!(w2.token() > token);
}

#[tokio::test]
async fn semaphores_count_permits_and_refuse_another_limit() {
    let c = client();
    let a = c.semaphore("pool", 3).permits(2).acquire().await.unwrap();
    let b = c.semaphore("pool", 3).acquire().await.unwrap();
    assert!(
        c.semaphore("pool", 3)
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    let err = c.semaphore("pool", 4).try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let holders = c
        .backend()
        .holders(&LockKey::new("pool").unwrap(), LockShape::Semaphore)
        .await
        .unwrap();
    assert_eq!(holders.len(), 2);
    assert!(b.token() > a.token());
    a.release().await.unwrap();
    b.release().await.unwrap();
    // Idle again: a new limit takes effect.
    c.semaphore("pool", 4)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for (count, limit) in [(0, 3), (4, 3), (1, 0)] {
        let err = c
            .semaphore("pool", limit)
            .permits(count)
            .acquire()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{count} of {limit}");
    }
    let err = c.lock("pool").permits(2).acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[tokio::test]
async fn a_crashed_permit_holder_frees_its_permit_at_expiry() {
    let backend = MemoryBackend::new();
    let key = LockKey::new("pool").unwrap();
    let kind = LeaseKind::permits(1, 1).unwrap();
    let _crashed = backend
        .try_acquire_kind(&key, kind, Duration::from_millis(300))
        .await
        .unwrap()
        .unwrap();
    let start = tokio::time::Instant::now();
    let lease = backend
        .acquire_kind(&key, kind, TTL, start + Duration::from_secs(5))
        .await
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(backend.release(&lease).await.unwrap());
}

#[tokio::test]
async fn a_cancelled_waiter_leaves_nothing() {
    let backend = MemoryBackend::new();
    let key = LockKey::new("doc").unwrap();
    let r = backend
        .try_acquire_kind(&key, LeaseKind::Read, TTL)
        .await
        .unwrap()
        .unwrap();
    let waiting = backend.acquire_kind(
        &key,
        LeaseKind::Write,
        TTL,
        tokio::time::Instant::now() + Duration::from_secs(5),
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(50), waiting)
            .await
            .is_err()
    );
    // The writer gave up: readers come in again.
    assert!(
        backend
            .try_acquire_kind(&key, LeaseKind::Read, TTL)
            .await
            .unwrap()
            .is_some()
    );
    backend.release(&r).await.unwrap();
}

#[tokio::test]
async fn segments_hand_out_distinct_parts_then_wait() {
    let c = client();
    let (i, a) = c.segments("stock", 2).acquire_any().await.unwrap();
    let (j, b) = c.segments("stock", 2).acquire_any().await.unwrap();
    assert_ne!(i, j);
    let err = c.segments("stock", 2).acquire_any().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended);
    let c2 = c.clone();
    let waiter = tokio::spawn(async move {
        c2.segments("stock", 2)
            .wait(Duration::from_secs(5))
            .acquire_any()
            .await
            .map(|(index, guard)| (index, guard.key()))
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    b.release().await.unwrap();
    let (k, key) = waiter.await.unwrap().unwrap();
    assert_eq!(k, j);
    assert_eq!(key.as_str(), format!("stock/{j}"));
    a.release().await.unwrap();
    for bad in [0, lock_core::MAX_SEGMENTS + 1] {
        let err = c.segments("stock", bad).acquire_any().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    }
}
