mod common;
use conformance::OrSkip;
use lock_core::{LockBackend, LockKey};
use lock_sql::SqlBackend;
use std::time::Duration;

async fn smoke(url: &str) {
    let a = SqlBackend::connect_url(url).await.unwrap();
    let b = if url.contains("memory") {
        a.clone()
    } else {
        SqlBackend::connect_url(url).await.unwrap()
    };
    let key = LockKey::new("smoke/Key").unwrap();
    let ttl = Duration::from_millis(300);
    let l1 = a.try_acquire(&key, ttl).await.unwrap().expect("free");
    println!("l1 {:?}", l1);
    assert!(b.try_acquire(&key, ttl).await.unwrap().is_none());
    let info = b.inspect(&key).await.unwrap().unwrap();
    println!("info {info:?}");
    a.renew(&l1).await.unwrap();
    assert!(a.release(&l1).await.unwrap());
    assert!(!a.release(&l1).await.unwrap());
    let l2 = b.try_acquire(&key, ttl).await.unwrap().expect("free");
    assert!(l2.token() > l1.token());
    assert!(a.renew(&l1).await.is_err());
    let other = LockKey::new("smoke/key").unwrap();
    let l3 = a
        .try_acquire(&other, ttl)
        .await
        .unwrap()
        .expect("case sensitive");
    tokio::time::sleep(Duration::from_millis(350)).await;
    let l4 = a.try_acquire(&key, ttl).await.unwrap().expect("expired");
    assert!(l4.token() > l2.token());
    assert!(!b.release(&l2).await.unwrap());
    let t0 = tokio::time::Instant::now();
    let l5 = b
        .acquire(&key, ttl, t0 + Duration::from_secs(2))
        .await
        .unwrap();
    println!("waited {:?} token {}", t0.elapsed(), l5.token());
    let _ = l3;
}

#[tokio::test(flavor = "multi_thread")]
async fn smoke_all() {
    let dir = tempfile::tempdir().unwrap();
    smoke(&format!("sqlite://{}", dir.path().join("x.db").display())).await;
    smoke("sqlite::memory:").await;
    if let Some(t) = common::PgTarget::start().await.or_skip() {
        smoke(&t.url).await;
    }
    if let Some(t) = common::MariaTarget::start().await.or_skip() {
        smoke(&t.url).await;
    }
}
