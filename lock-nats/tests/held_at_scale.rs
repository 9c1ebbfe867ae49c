//! Held locks at scale on a real nats-server: client-side heap per held
//! lock and round trips per renewal period (counted by the fault proxy).
//! JetStream has no batch of conditioned publishes: each renewal is its
//! own publish (an update expecting the key's last revision), with up to
//! `RENEW_CONCURRENCY` (64) in flight on the one connection. So the round
//! trips per period grow with the number of locks: 1,000 renewals a
//! period took 55-63 proxy turns (16-18 publishes reach the server per
//! turn), where the batching drivers take a few per `RENEW_BATCH`. The
//! bound checked is the shared one for batches of 16 leases (93 turns at
//! 1,000 locks): a driver that renewed one lease at a time (a turn per
//! renewal, ~1,000) or read the key before each renewal (twice the turns)
//! fails it. Measured at 1,000 locks: 317-318 B of client heap per held lock
//! (debug build), under the shared 450 B. `DISTLOCK_SCALE=1000,10000`
//! runs more sizes.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use conformance::OrSkip;
use conformance::scale::{
    CountingAllocator, ScaleConfig, check_report, check_round_trips, held_locks_proxied,
    print_report, scales_from_env,
};
use conformance::servers::nats::{BUCKET, NatsServer};
use lock_core::{LockBackend, RENEW_BATCH, RENEW_CONCURRENCY};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

/// The client's pings and the server's INFO (a few per period) are the
/// background.
const BACKGROUND: usize = 4;

/// Renewals that must reach the server per proxy turn on average: a
/// quarter of the `RENEW_CONCURRENCY` window (16-18 measured).
const PER_TURN: usize = RENEW_CONCURRENCY / 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_renews_many_held_locks_one_publish_each() {
    let Some(server) = NatsServer::start().await.or_skip() else {
        return;
    };
    let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, server.port()));
    for locks in scales_from_env(&[1_000]) {
        let report = held_locks_proxied(upstream, &ScaleConfig::new(locks), |addr| async move {
            let backend = lock_nats::connect(&format!("nats://{addr}/{BUCKET}")).await?;
            Ok(Arc::new(backend) as Arc<dyn LockBackend>)
        })
        .await
        .unwrap();
        print_report(&report);
        // Renewals per period are what the scheduler asked for: every
        // lease about once, in `renew_many` calls of at most RENEW_BATCH.
        assert!(
            report.renewals_per_period >= locks as f64 * 0.5,
            "renewals per period: {report:?}"
        );
        if locks <= RENEW_BATCH {
            check_report(&report, PER_TURN, BACKGROUND).unwrap();
        } else {
            check_round_trips(&report, PER_TURN, BACKGROUND).unwrap();
        }
        // Not batched: more round trips than one per RENEW_BATCH leases
        // (what the batching drivers are held to). If this fails, the
        // driver (or the server) learned to batch: tighten the bound above.
        assert!(
            check_round_trips(&report, RENEW_BATCH, BACKGROUND).is_err(),
            "as few round trips as a batching driver: {report:?}"
        );
    }
}
