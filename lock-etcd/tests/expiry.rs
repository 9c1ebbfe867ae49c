//! Each lock stops being held on the server when its own TTL runs out,
//! although the session lease that all locks of a backend hang off is kept
//! alive: a holder that stopped renewing (never renewed, renewal disabled,
//! renewals capped) does not block the key for as long as its process
//! lives.

use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::etcd::EtcdServer;
use lock_core::LockBackendExt;
use lock_core::{ErrorKind, Lease, LockBackend, LockClient, LockKey, OwnerId};
use lock_etcd::EtcdBackend;
use tokio::time::Instant;

mod common;

const TTL: Duration = Duration::from_secs(2);

/// Time for the entry's deletion to reach a watching waiter.
const MARGIN: Duration = Duration::from_millis(1500);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("{name}-{}", &OwnerId::random().to_hex()[..8])).expect("key")
}

/// `b` waits for `key`, which `a` holds with `lease` (granted at
/// `granted`) and no longer renews: `b` must get it after `a`'s validity
/// deadline and within the TTL plus a margin.
async fn taken_over(
    what: &str,
    b: &EtcdBackend,
    key: &LockKey,
    lease: &Lease,
    granted: Instant,
    renewing_until: Instant,
) -> Duration {
    let next = b
        .acquire(key, TTL, renewing_until + TTL + MARGIN)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{what}: the key was not freed within TTL {TTL:?} + {MARGIN:?} of the last \
                 renewal: {e}"
            )
        });
    let got_at = Instant::now();
    assert!(
        got_at >= lease.validity_deadline(),
        "{what}: granted {:?} before the holder's validity deadline",
        lease.validity_deadline() - got_at
    );
    assert!(
        next.token() > lease.token(),
        "{what}: token did not increase"
    );
    b.release(&next).await.expect("release");
    got_at - granted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_expire_with_their_own_ttl_while_the_session_lives() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let config = common::config_for(&server, "expiry", TTL);
    let a = EtcdBackend::connect(config.clone()).await.expect("a");
    let b = EtcdBackend::connect(config).await.expect("b");
    let session = a.session_lease(TTL).expect("a's session");

    // A raw lease, never renewed (kept, so it is not an abandoned grant).
    let raw_key = key("raw");
    let raw = a
        .try_acquire(&raw_key, TTL)
        .await
        .expect("try_acquire")
        .expect("free");
    let raw_at = Instant::now();

    // A guard with renewal disabled.
    let client = LockClient::new(a.clone());
    let quiet_key = key("no-renewal");
    let quiet = client
        .lock(quiet_key.as_str())
        .ttl(TTL)
        .no_renewal()
        .acquire()
        .await
        .expect("guard without renewal");
    let quiet_at = Instant::now();

    // A guard whose renewals stop after 3 s of holding.
    let capped_key = key("max-hold");
    let max_hold = Duration::from_secs(3);
    let capped = client
        .lock(capped_key.as_str())
        .ttl(TTL)
        .max_hold(max_hold)
        .acquire()
        .await
        .expect("guard with max_hold");
    let capped_at = Instant::now();

    let (quiet_lease, capped_lease) = (quiet.lease(), capped.lease());
    let (raw_took, quiet_took, capped_took) = tokio::join!(
        taken_over("never renewed", &b, &raw_key, &raw, raw_at, raw_at),
        taken_over(
            "renewal disabled",
            &b,
            &quiet_key,
            &quiet_lease,
            quiet_at,
            quiet_at
        ),
        taken_over(
            "renewals capped",
            &b,
            &capped_key,
            &capped_lease,
            capped_at,
            capped_at + max_hold
        ),
    );
    println!(
        "taken over after: never renewed {raw_took:?}, renewal disabled {quiet_took:?}, \
         max_hold {max_hold:?} {capped_took:?} (TTL {TTL:?})"
    );
    assert!(
        capped_took >= max_hold,
        "the capped guard lost its key before max_hold"
    );

    // The session lived throughout: the locks went by their own TTL.
    assert_eq!(
        a.session_lease(TTL),
        Some(session),
        "a's session changed or died: this test is about locks expiring while it lives"
    );
    // A lock whose TTL ran out is not revived by a late renewal, and its
    // release reports it was no longer held.
    let err = a.renew(&raw).await.expect_err("renew after expiry");
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(!a.release(&raw).await.expect("release after expiry"));
    drop((quiet, capped));

    // Renewals still keep a lock past its TTL.
    let renewed_key = key("renewed");
    let renewed = a
        .try_acquire(&renewed_key, TTL)
        .await
        .expect("try_acquire")
        .expect("free");
    for _ in 0..6 {
        tokio::time::sleep(TTL / 3).await;
        a.renew(&renewed).await.expect("renew within the TTL");
    }
    assert!(
        b.try_acquire(&renewed_key, TTL)
            .await
            .expect("try_acquire")
            .is_none(),
        "a renewed lock was freed"
    );
    assert!(a.release(&renewed).await.expect("release"));
}
