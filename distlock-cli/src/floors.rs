//! Raw floors: the same round trips a driver's acquire+release makes,
//! issued by hand with the driver's own client, so the comparison can print
//! "ours / floor" ratios measured in one run.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use conformance::bench::{self, LatencyStats};
use lock_core::LockError;

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
    #[allow(dead_code)] // constructed per driver as floors are wired in
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

/// The floor for the backend at `url`, where its driver offers one.
pub(crate) async fn floor(url: &str) -> Option<Floor> {
    let _ = url;
    None
}
