//! Held locks at scale on a real redis-server: client-side heap per held
//! lock and round trips per renewal period (counted by the fault proxy),
//! with the renewals pipelined per batch. `DISTLOCK_SCALE=1000,10000,100000`
//! runs more sizes.

use std::net::SocketAddr;
use std::sync::Arc;

use conformance::OrSkip;
use conformance::scale::{
    CountingAllocator, ScaleConfig, check_report, held_locks_proxied, print_report, scales_from_env,
};
use conformance::servers::redis::RedisServer;
use lock_core::{LockBackend, RENEW_BATCH};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_renews_many_held_locks_in_a_few_pipelines() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let upstream = SocketAddr::from(([127, 0, 0, 1], server.port()));
    for locks in scales_from_env(&[1_000]) {
        let report = held_locks_proxied(upstream, &ScaleConfig::new(locks), |addr| async move {
            let backend = lock_redis::connect(&format!("redis://{addr}")).await?;
            Ok(Arc::new(backend) as Arc<dyn LockBackend>)
        })
        .await
        .unwrap();
        print_report(&report);
        check_report(&report, RENEW_BATCH, 1).unwrap();
    }
}
