//! The whole conformance suite on `slowmem://`, opened through the facade
//! (`distlock::backend::open`), where the driver is registered by its descriptor.

use std::sync::Arc;

use async_trait::async_trait;
use conformance::{Harness, Target, run_suite};
use lock_core::{LockBackend, LockError};

#[derive(Debug)]
struct UrlTarget(String);

#[async_trait]
impl Target for UrlTarget {
    fn name(&self) -> String {
        "slowmem".into()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        distlock::backend::open(&self.0).await
    }

    fn url(&self) -> Option<String> {
        Some(self.0.clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_suite_passes_through_the_facade() {
    assert!(distlock::supported_schemes().contains(&"slowmem"));
    let target = UrlTarget("slowmem://suite?delay=1ms".into());
    assert_eq!(target.client().await.unwrap().name(), "slowmem");
    run_suite(&Harness::new(Arc::new(target)))
        .await
        .assert_passed();
}

#[tokio::test]
async fn bad_urls_are_config_errors() {
    for url in [
        "slowmem:x",
        "slowmem://x?delay=forever",
        "slowmem://x?delay=2s",
        "slowmem://x?latency=1ms",
    ] {
        let err = distlock::backend::open(url).await.unwrap_err();
        assert_eq!(err.kind(), lock_core::ErrorKind::Config, "{url}: {err}");
    }
}
