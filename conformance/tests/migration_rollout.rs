//! The rollout simulation between two in-memory services (the same code
//! runs Redis → etcd / ZooKeeper in the facade's tests).

use std::sync::Arc;

use conformance::MemoryTarget;
use conformance::migration::rollout_is_safe_and_wrong_rollout_is_flagged;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_to_memory_rollout() {
    let (good, wrong) = rollout_is_safe_and_wrong_rollout_is_flagged(
        Arc::new(MemoryTarget::new()),
        Arc::new(MemoryTarget::new()),
    )
    .await
    .unwrap();
    println!(
        "correct rollout: {} ; grants {:?} ; writes rejected {}",
        good.check.summary(),
        good.grants_by_phase,
        good.writes_rejected
    );
    println!("wrong rollout:   {}", wrong.check.summary());
    assert_eq!(good.check.stale_writes_accepted, 0);
}

/// The migration wrapper is itself a backend: in every phase it must pass
/// the whole suite.
struct PhaseTarget {
    old: MemoryTarget,
    new: MemoryTarget,
    phase: lock_core::MigrationPhase,
}

#[lock_core::async_trait]
impl conformance::Target for PhaseTarget {
    fn name(&self) -> String {
        format!("migration-{}", self.phase.as_str())
    }
    async fn client(&self) -> Result<Arc<dyn lock_core::LockBackend>, lock_core::LockError> {
        Ok(Arc::new(lock_core::MigrationBackend::new(
            self.old.client().await?,
            self.new.client().await?,
            self.phase,
        )))
    }
    async fn make_unreachable(&self) -> Result<bool, conformance::HarnessError> {
        self.old.make_unreachable().await?;
        self.new.make_unreachable().await
    }
    async fn heal(&self) -> Result<(), conformance::HarnessError> {
        self.old.heal().await?;
        self.new.heal().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_suite_passes_in_every_phase() {
    for phase in [
        lock_core::MigrationPhase::Old,
        lock_core::MigrationPhase::Dual,
        lock_core::MigrationPhase::New,
    ] {
        let target = PhaseTarget {
            old: MemoryTarget::new(),
            new: MemoryTarget::new(),
            phase,
        };
        let harness = conformance::Harness::new(Arc::new(target));
        conformance::run_suite(&harness).await.assert_passed();
    }
}
