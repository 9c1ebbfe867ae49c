//! Batched renewals (`renew_many`) of this backend's own grants: one
//! listing of a session's keys serves the batches of a renewal round, but
//! never for a grant created after that listing was taken (it is not in
//! it, and must not be taken for an entry deleted behind our back).

use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::etcd::EtcdServer;
use lock_core::{LockBackend, LockKey, OwnerId};

mod common;

/// Long enough that the round's listing is reused between the two
/// batches below (it is, for a sixth of the TTL).
const TTL: Duration = Duration::from_secs(30);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("{name}-{}", &OwnerId::random().to_hex()[..8])).expect("key")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_renews_grants_newer_than_the_rounds_listing() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let a = common::connect_for(&server, "batches", TTL).await;
    let first = a
        .try_acquire(&key("first"), TTL)
        .await
        .expect("try_acquire")
        .expect("free");
    // This batch lists the session's keys: `first` only.
    for result in a.renew_many(&[&first]).await {
        result.expect("renew the first grant");
    }
    let second = a
        .try_acquire(&key("second"), TTL)
        .await
        .expect("try_acquire")
        .expect("free");
    // The next batch, within the same round: `second` was created after
    // the listing and must still renew (it was reported deleted before).
    for result in a.renew_many(&[&first, &second]).await {
        result.expect("renew a grant newer than the round's listing");
    }
    assert!(a.release(&first).await.expect("release"));
    assert!(a.release(&second).await.expect("release"));
}
