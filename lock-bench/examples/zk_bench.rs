//! Benchmark (not a test): our acquire+release cycle as users write it
//! (`client.lock(k).ttl(30s).wait(60s).acquire()`, then `guard.release()`)
//! against the raw floor ([`lock_bench::zk::ZkFloor`]: create / getChildren
//! / delete written by hand on one bare TCP connection), measured in one run
//! against a ZooKeeper server this program starts.
//!
//! `cargo run --release -p lock-bench --example zk_bench [-- <cycles>]`
//!
//! Prints [`conformance::bench::StandardFigures`], ours and the floor
//! interleaved so that machine load hits both alike: 1 client (p50/p99 per
//! cycle), 8 independent clients on 8 keys (each its own `connect()`, each
//! floor its own connection; throughput), 4 independent clients on one key
//! (handoffs per second: the floor polls with `try_grant`, ours waits on
//! its predecessor's watch; and the busiest client's grants over the least
//! busy one's).

use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{Contender, FloorCycle, Ours, StandardRun, standard_figures};
use conformance::process::HarnessError;
use conformance::servers::zookeeper::ZkServer;
use lock_bench::zk::ZkFloor;
use lock_core::LockClient;

const TTL: Duration = Duration::from_secs(30);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let cycles: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let server = match ZkServer::start().await {
        Ok(server) => server,
        Err(err @ HarnessError::MissingBinary { .. }) => {
            eprintln!("cannot run the benchmark: {err}");
            return Ok(());
        }
        Err(err) => return Err(err.into()),
    };
    let url = format!("{}?session_timeout=10s", server.url());
    println!("ZooKeeper 3.8 on loopback, {cycles} cycles per side");
    let (mut ours, mut floors) = (Vec::new(), Vec::new());
    for _ in 0..8 {
        let client = LockClient::new(lock_zk::connect(&url).await?);
        ours.push(Arc::new(Ours::new(client, TTL)) as Arc<dyn Contender>);
        let floor = Box::new(ZkFloor::connect(&url).await?);
        floors.push(Arc::new(FloorCycle::new(floor, TTL)) as Arc<dyn Contender>);
    }
    standard_figures(&ours, &floors, &StandardRun::new(cycles))
        .await?
        .print(
            "zookeeper",
            "lock-zk (waiting acquire + release)",
            "raw floor (bare connection, by hand)",
        );
    drop(server);
    Ok(())
}
