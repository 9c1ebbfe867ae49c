//! Raw floors: the same round trips a driver's acquire+release makes,
//! issued by hand with the driver's own client, so the comparison can print
//! "ours / floor" ratios measured in one run.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{self, LatencyStats};
use distlock::lock_etcd::floor::EtcdFloor;
use distlock::lock_redis::floor::RedisFloor;
use distlock::lock_sql::floor::SqlFloor;
use distlock::lock_zk::floor::ZkFloor;
use lock_core::{LockError, OwnerId};

type CycleFn = Arc<
    dyn Fn(usize, usize) -> Pin<Box<dyn Future<Output = Result<(), LockError>> + Send>>
        + Send
        + Sync,
>;

/// A raw acquire+release cycle for one backend.
pub(crate) struct Floor {
    cycle: CycleFn,
}

impl Floor {
    pub(crate) fn new(cycle: CycleFn) -> Self {
        Self { cycle }
    }

    pub(crate) async fn warm_up(&self) -> Result<(), LockError> {
        for i in 0..20 {
            (self.cycle)(0, i).await?;
        }
        Ok(())
    }

    pub(crate) async fn sequential(&self, n: usize) -> Result<LatencyStats, LockError> {
        let cycle = self.cycle.clone();
        bench::measure_sequential(n, move |i| cycle(0, i)).await
    }

    pub(crate) async fn parallel(
        &self,
        tasks: usize,
        per_task: usize,
    ) -> Result<LatencyStats, LockError> {
        let cycle = self.cycle.clone();
        bench::measure_parallel(tasks, per_task, move |t, i| cycle(t, i)).await
    }

    /// Handoff has no hand-written equivalent: it is the backend's waiting
    /// mechanism itself.
    pub(crate) fn handoffs_per_s(&self) -> Option<f64> {
        None
    }
}

/// The TTL of the floors' grants: the comparison's, for every backend whose
/// minimum TTL is below it.
const FLOOR_TTL: Duration = Duration::from_secs(10);

/// The floor for the backend at `url`, where its driver offers one.
///
/// Each task cycles on its own key (`floor-<run>/<task>`, with a random run
/// id), as the comparison's own throughput run does, so parallel tasks never
/// contend. A floor that cannot connect is reported on stderr and left out
/// (the ratio columns stay empty).
pub(crate) async fn floor(url: &str) -> Option<Floor> {
    let scheme = url
        .split(':')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let run: Arc<str> = Arc::from(&OwnerId::random().to_hex()[..8]);
    let connected = match scheme.as_str() {
        "postgres" | "postgresql" | "mysql" | "mariadb" | "sqlite" => {
            SqlFloor::connect(url).await.map(|floor| {
                let floor = Arc::new(floor);
                Floor::new(Arc::new(move |task, _| {
                    let floor = floor.clone();
                    let key = floor_key(&run, task);
                    Box::pin(async move { floor.cycle(&key, FLOOR_TTL).await })
                }))
            })
        }
        "etcd" | "etcds" => EtcdFloor::connect(url).await.map(|floor| {
            let floor = Arc::new(floor);
            Floor::new(Arc::new(move |task, _| {
                let floor = floor.clone();
                let key = floor_key(&run, task);
                Box::pin(async move { floor.cycle(&key, FLOOR_TTL).await })
            }))
        }),
        // One server only: Sentinel, Cluster and Redlock URLs have no
        // single pair of round trips to compare with (ratios left empty).
        "redis" | "rediss" => RedisFloor::connect(url).await.map(|floor| {
            Floor::new(Arc::new(move |task, _| {
                let floor = floor.clone();
                let key = floor_key(&run, task);
                Box::pin(async move { floor.cycle(&key, FLOOR_TTL).await })
            }))
        }),
        "zk" | "zookeeper" => ZkFloor::connect(url).await.map(|floor| {
            let floor = Arc::new(floor);
            Floor::new(Arc::new(move |task, _| {
                let floor = floor.clone();
                let key = floor_key(&run, task);
                Box::pin(async move { floor.cycle(&key, FLOOR_TTL).await })
            }))
        }),
        _ => return None,
    };
    match connected {
        Ok(floor) => Some(floor),
        Err(err) => {
            eprintln!(
                "floor for {}: cannot connect ({err}); ratios left out",
                distlock::redact_url(url)
            );
            None
        }
    }
}

fn floor_key(run: &str, task: usize) -> String {
    format!("floor-{run}/{task}")
}
