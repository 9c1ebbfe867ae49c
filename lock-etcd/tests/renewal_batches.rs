//! Batched renewals (`renew_many`) of this backend's own grants: one
//! listing of a session's keys serves the batches of a renewal round, but
//! never for a grant created after that listing was taken (it is not in
//! it, and must not be taken for an entry deleted behind our back).

use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::etcd::EtcdServer;
use lock_core::LockBackendExt;
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

/// Locks held at once: with the longest keys, their entry names fill more
/// than one answer of 4 MiB (gRPC's default limit, which the client
/// applies to the key listing a renewal round reads).
const MANY: usize = 16_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_whose_names_overflow_one_listing_spread_over_sessions() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let a = common::connect_for(&server, "batches", TTL).await;
    // Keys of the longest length, without characters the layout escapes:
    // about 280 bytes a name, 4.4 MB for all of them.
    let tag = OwnerId::random().to_hex();
    let long = "k".repeat(lock_core::MAX_KEY_LEN - tag.len() - 9);
    let mut tasks = tokio::task::JoinSet::new();
    for part in 0..32 {
        let a = a.clone();
        let (tag, long) = (tag.clone(), long.clone());
        tasks.spawn(async move {
            let mut leases = Vec::new();
            for i in (part..MANY).step_by(32) {
                let key = LockKey::new(format!("{tag}{long}{i:08}")).expect("key");
                let lease = a.try_acquire(&key, TTL).await.expect("try_acquire");
                leases.push(lease.expect("free"));
            }
            leases
        });
    }
    let mut leases = Vec::with_capacity(MANY);
    while let Some(part) = tasks.join_next().await {
        leases.extend(part.expect("acquiring task"));
    }
    let sessions = a.session_leases(TTL);
    assert!(
        sessions.len() >= 3,
        "{MANY} locks with {}-byte keys held on {} session(s): one listing of a session's \
         keys would not fit in one answer",
        lock_core::MAX_KEY_LEN,
        sessions.len()
    );
    for batch in leases.chunks(lock_core::RENEW_BATCH) {
        let refs: Vec<_> = batch.iter().collect();
        for result in a.renew_many(&refs).await {
            result.expect("renew in a batch");
        }
    }
    let mut tasks = tokio::task::JoinSet::new();
    for part in leases.chunks(MANY / 32).map(<[_]>::to_vec) {
        let a = a.clone();
        tasks.spawn(async move {
            for lease in part {
                assert!(
                    a.release(&lease).await.expect("release"),
                    "not held at release"
                );
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("releasing task");
    }
}
