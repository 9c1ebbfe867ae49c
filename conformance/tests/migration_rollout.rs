//! The rollout simulation between two in-memory services (the same code
//! runs Redis → etcd / ZooKeeper in the facade's tests).

use lock_core::LockBackendExt;
use std::sync::Arc;
use std::time::Duration;

use conformance::MemoryTarget;
use conformance::migration::rollout_is_guarded;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_to_memory_rollout() {
    let verdicts = rollout_is_guarded(Arc::new(MemoryTarget::new()), Arc::new(MemoryTarget::new()))
        .await
        .unwrap();
    for line in verdicts.lines() {
        println!("{line}");
    }
    assert_eq!(verdicts.correct.check.stale_writes_accepted, 0);
    assert_eq!(verdicts.correct.straggler, "refused");
    assert!(verdicts.blind.check.overlap_count > 0);
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
        Ok(Arc::new(
            lock_core::MigrationBackend::new(
                self.old.client().await?,
                self.new.client().await?,
                self.phase,
            )
            // The suite's own leases are short; see `whole_suite_passes_in_every_phase`.
            .with_old_lease_max(Duration::ZERO),
        ))
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

// The whole suite in each phase of a rollout, one test per phase (they run
// side by side).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_suite_passes_in_phase_old() {
    whole_suite_passes_in(lock_core::MigrationPhase::Old).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_suite_passes_in_phase_dual() {
    whole_suite_passes_in(lock_core::MigrationPhase::Dual).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_suite_passes_in_phase_new() {
    whole_suite_passes_in(lock_core::MigrationPhase::New).await;
}

async fn whole_suite_passes_in(phase: lock_core::MigrationPhase) {
    let target = PhaseTarget {
        old: MemoryTarget::new(),
        new: MemoryTarget::new(),
        phase,
    };
    // Cut over once before the suite (the zero wait-out then passes at
    // once), so phase `new` runs as it does after a rollout.
    if phase == lock_core::MigrationPhase::New {
        let client = conformance::Target::client(&target).await.unwrap();
        let warm = lock_core::LockKey::new("warm-up").unwrap();
        let lease = client
            .try_acquire(&warm, Duration::from_secs(1))
            .await
            .unwrap()
            .unwrap();
        client.release(&lease).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let harness = conformance::Harness::new(Arc::new(target));
    conformance::run_suite(&harness).await.assert_passed();
}

/// A dual grant takes the old store, then the new one, and its release
/// gives them back in the other order: in between, a reader finds the
/// holder in the old store only (marked `old-only:`). The watch case must
/// follow grants and releases across that moment: shown here with a
/// holder whose new store answers 150 ms late, watched through the same
/// stores with no delay every 10 ms, so the watcher sees the half-way
/// holder on every grant and release (checked first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_dual_grants_across_their_half_way_moment() {
    use lock_core::{LockBackend, MemoryBackend, MigrationBackend, MigrationPhase};
    let old = MemoryBackend::new();
    let dual = |new: &str| -> Arc<dyn LockBackend> {
        let new = Arc::new(lock_slowmem::connect(new).unwrap());
        Arc::new(
            MigrationBackend::new(Arc::new(old.clone()), new, MigrationPhase::Dual)
                .with_old_lease_max(Duration::ZERO),
        )
    };
    let holder = dual("slowmem://half-way?delay=150ms");
    let watcher = dual("slowmem://half-way");
    let ttl = Duration::from_secs(5);

    let key = lock_core::LockKey::new("half-way/seen").unwrap();
    let grant = tokio::spawn({
        let (holder, key) = (holder.clone(), key.clone());
        async move { holder.try_acquire(&key, ttl).await }
    });
    tokio::time::sleep(Duration::from_millis(75)).await;
    let half_way = watcher
        .inspect(&key)
        .await
        .unwrap()
        .expect("the old side is held");
    assert!(
        lock_core::is_old_only(&half_way.holder),
        "mid-grant the dual reader saw {half_way:?}, not the old side alone"
    );
    let lease = grant.await.unwrap().unwrap().expect("a free key");
    assert!(holder.release(&lease).await.unwrap());

    let key = lock_core::LockKey::new("half-way/watched").unwrap();
    let seen = conformance::cases::watch_sees_changes(
        watcher,
        holder,
        &key,
        ttl,
        Duration::from_millis(10),
    )
    .await;
    assert!(seen.is_ok(), "{seen:?}");
    println!("{}", seen.unwrap());
}
