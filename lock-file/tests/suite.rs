//! The whole conformance suite on `file://<temporary directory>`, opened
//! through the facade, where the driver is registered by its descriptor.

use std::sync::Arc;

use async_trait::async_trait;
use std::time::Duration;

use conformance::{Harness, Target, run_suite};
use lock_core::{LockBackend, LockBackendExt, LockError, LockKey};

#[derive(Debug)]
struct UrlTarget(String);

#[async_trait]
impl Target for UrlTarget {
    fn name(&self) -> String {
        "file".into()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        distlock::backend::open(&self.0).await
    }

    fn url(&self) -> Option<String> {
        Some(self.0.clone())
    }
}

fn target(dir: &std::path::Path) -> UrlTarget {
    UrlTarget(format!("file://{}", dir.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_suite_passes_through_the_facade() {
    assert!(distlock::supported_schemes().contains(&"file"));
    let dir = tempfile::tempdir().unwrap();
    let target = target(dir.path());
    assert_eq!(target.client().await.unwrap().name(), "file");
    run_suite(&Harness::new(Arc::new(target)))
        .await
        .assert_passed();
}

/// The per-process model: a lease dropped without a release stays granted
/// until its backend value (its open files) is dropped, TTL or not.
#[tokio::test]
async fn an_unreleased_lease_lasts_as_long_as_its_backend() {
    let dir = tempfile::tempdir().unwrap();
    let target = target(dir.path());
    let (a, b) = (
        target.client().await.unwrap(),
        target.client().await.unwrap(),
    );
    let key = LockKey::new("forgotten").unwrap();
    let ttl = Duration::from_millis(50);
    drop(a.try_acquire(&key, ttl).await.unwrap().expect("free"));
    tokio::time::sleep(ttl * 4).await;
    assert!(
        b.try_acquire(&key, ttl).await.unwrap().is_none(),
        "freed by its TTL"
    );
    drop(a);
    let lease = b
        .try_acquire(&key, ttl)
        .await
        .unwrap()
        .expect("freed with its backend");
    assert!(b.release(&lease).await.unwrap());
}
