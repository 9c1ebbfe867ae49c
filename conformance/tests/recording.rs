//! The recording wrapper records what really happened: a downgrade ends
//! the write lease's promise when it is sent (not when its reply is back),
//! and a renewal batch is recorded as the batch the scheduler really sent
//! (so a driver's broken `renew_many` is judged, not `renew`).

use std::sync::Arc;
use std::time::Duration;

use conformance::history::History;
use conformance::recording::{RecordingBackend, record_lost};
use lock_core::{
    Lease, LeaseKind, LockBackend, LockClient, LockError, LockKey, LockWrapper, MemoryBackend,
    async_trait, validity_deadline,
};
use tokio::time::{Instant, sleep};

/// How long a reply takes to come back from the doubles below.
const REPLY: Duration = Duration::from_millis(150);

/// The memory service whose downgrade replies arrive [`REPLY`] after the
/// service made the change (the way back of a network call).
#[derive(Debug)]
struct SlowDowngradeReply(MemoryBackend);

#[async_trait]
impl LockWrapper for SlowDowngradeReply {
    fn inner(&self) -> &dyn LockBackend {
        &self.0
    }
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        let read = self.0.downgrade(lease).await;
        sleep(REPLY).await;
        read
    }
}

/// A queued reader gets its share the moment the service downgrades the
/// writer, before the writer's reply is back: the write lease's promise
/// must end at the downgrade's invoke, or the checker sees the reader
/// beside a writer that was no longer one.
#[tokio::test]
async fn a_downgrade_ends_the_write_promise_when_it_is_sent() {
    let memory = MemoryBackend::new();
    let history = Arc::new(History::new());
    let writer = RecordingBackend::new(
        Arc::new(SlowDowngradeReply(memory.clone())),
        history.process(),
    );
    let reader = Arc::new(RecordingBackend::new(
        Arc::new(memory.clone()),
        history.process(),
    ));
    let key = LockKey::new("downgraded").unwrap();
    let ttl = Duration::from_secs(5);
    let write = writer
        .try_acquire_kind(&key, LeaseKind::Write, ttl)
        .await
        .unwrap()
        .expect("free");
    let waiting = {
        let (reader, key) = (reader.clone(), key.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(5);
            reader
                .acquire_kind(&key, LeaseKind::Read, ttl, deadline)
                .await
        })
    };
    sleep(Duration::from_millis(20)).await;
    let read = writer.downgrade(&write).await.unwrap();
    let other = waiting.await.unwrap().unwrap();
    assert!(reader.release(&other).await.unwrap());
    assert!(writer.release(&read).await.unwrap());
    let report = history.check();
    assert!(
        report.is_exclusive(),
        "a correct downgrade was judged unsafe: {} {:?}",
        report.summary(),
        report.overlaps
    );
}

/// A driver bug in the batched path only: `renew` is right, but
/// `renew_many` dates each new deadline from the moment its reply came
/// back ([`REPLY`] after the service renewed) instead of from when the
/// batch was sent, promising more than the service keeps.
#[derive(Debug)]
struct ReplyDatedBatch(MemoryBackend);

#[async_trait]
impl LockWrapper for ReplyDatedBatch {
    fn inner(&self) -> &dyn LockBackend {
        &self.0
    }
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        let renewed = self.0.renew_many(leases).await;
        sleep(REPLY).await;
        let replied = Instant::now();
        renewed
            .into_iter()
            .zip(leases)
            .map(|(result, lease)| result.map(|_| validity_deadline(replied, lease.ttl())))
            .collect()
    }
}

/// One guard through a recording client over `ReplyDatedBatch`, renewed
/// once by the real scheduler and then left to run out, while a second
/// client waits for the key; returns the checker's report.
async fn one_renewal_then_a_waiter(
    renewal_only_by_renew: bool,
) -> conformance::history::CheckReport {
    let memory = MemoryBackend::new();
    let history = Arc::new(History::new());
    let broken: Arc<dyn LockBackend> = Arc::new(ReplyDatedBatch(memory.clone()));
    let holder: Arc<dyn LockBackend> = if renewal_only_by_renew {
        // What the recorder judged before it forwarded `renew_many`: the
        // trait's default, one `renew` per lease.
        Arc::new(OneAtATime(broken))
    } else {
        broken
    };
    let rec = history.process();
    let client = LockClient::from_arc(Arc::new(RecordingBackend::new(holder, rec.clone())));
    let key = LockKey::new("renewed-in-batches").unwrap();
    let ttl = Duration::from_millis(400);
    let guard = client
        .lock(key.as_str())
        .ttl(ttl)
        .max_renewals(1)
        .acquire()
        .await
        .unwrap();
    let watcher = record_lost(&guard, &rec);
    let waiter = RecordingBackend::new(Arc::new(memory.clone()), history.process());
    let next = waiter
        .acquire(&key, ttl, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    let _ = guard.lost().await;
    watcher.await.unwrap();
    waiter.release(&next).await.unwrap();
    history.check()
}

/// The trait's default `renew_many` over a backend: every lease through
/// its `renew`.
#[derive(Debug)]
struct OneAtATime(Arc<dyn LockBackend>);

#[async_trait]
impl LockWrapper for OneAtATime {
    fn inner(&self) -> &dyn LockBackend {
        &*self.0
    }
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        lock_core::renew_concurrently(&*self.0, leases, lock_core::RENEW_CONCURRENCY).await
    }
}

/// The scheduler renews through `renew_many`; the recorder forwards that
/// batch and records each lease's renewal with the deadline the batch
/// returned, so the checker catches a batch that promises too much
/// (the holder's promise outlives the service's grant and the next holder
/// overlaps it). Judged one `renew` at a time, the same run looks safe.
#[tokio::test]
async fn a_renew_many_that_dates_from_the_reply_is_caught() {
    let batched = one_renewal_then_a_waiter(false).await;
    assert!(
        batched.overlap_count > 0 && !batched.is_exclusive(),
        "the checker missed a renew_many dated from its reply: {}",
        batched.summary()
    );
    let one_by_one = one_renewal_then_a_waiter(true).await;
    assert!(
        one_by_one.is_exclusive(),
        "renewed one at a time (correct renew), the run should pass: {}",
        one_by_one.summary()
    );
}
