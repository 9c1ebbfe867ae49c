//! One client's acquire+release cycle on Redis at a given round-trip time
//! injected by the fault proxy (`conformance::proxy::FaultProxy`, half of
//! it each way), ours (a waiting cycle and a try cycle, through the user
//! API) beside the hand-written floor: the measurement that decides
//! whether a transport of our own beats the redis crate's multiplexed
//! connection enough to keep (issue 39: at least 20% lower p50 at 1 ms).
//!
//! ```text
//! cargo run --release -p lock-bench --example redis_rtt
//! ```
//!
//! Environment: `RTT_US` (round-trip time in microseconds, default 1000),
//! `BENCH_CYCLES` (cycles per measurement, default 500).

use std::net::SocketAddr;
use std::time::Duration;

use conformance::bench;
use conformance::proxy::FaultProxy;
use conformance::servers::redis::RedisServer;
use lock_bench::redis::RedisFloor;
use lock_core::LockClient;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TTL: Duration = Duration::from_secs(30);

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let rtt = Duration::from_micros(env("RTT_US", 1000));
    let cycles = usize::try_from(env("BENCH_CYCLES", 500))?;
    let server = RedisServer::start().await?;
    let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], server.port()))).await?;
    proxy.set_latency(rtt / 2, Duration::ZERO);
    let url = format!("redis://127.0.0.1:{}", proxy.port());
    let client = LockClient::new(lock_redis::connect(&url).await?);
    let floor = RedisFloor::connect(&url).await?;
    for i in 0..20 {
        bench::waiting_cycle(&client, &format!("warm{i}"), TTL).await;
        floor.cycle(&format!("warm-floor{i}"), TTL).await?;
    }
    println!("Redis, 1 client, {rtt:?} round trip through the proxy, {cycles} cycles:");
    for what in ["waiting", "try", "floor"] {
        let stats = bench::measure_sequential(cycles, |i| {
            let (client, floor) = (client.clone(), floor.clone());
            async move {
                let key = format!("{what}{}", i % 8);
                match what {
                    "waiting" => bench::waiting_cycle(&client, &key, TTL).await,
                    "try" => bench::try_cycle(&client, &key, TTL).await,
                    _ => floor.cycle(&key, TTL).await?,
                }
                Ok::<_, lock_core::LockError>(())
            }
        })
        .await?;
        println!(
            "  {what:<8} p50 {:>8.1} us  p99 {:>8.1} us  mean {:>8.1} us",
            stats.p50_us, stats.p99_us, stats.mean_us
        );
    }
    Ok(())
}
