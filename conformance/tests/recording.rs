//! The recording wrapper records what really happened: a downgrade ends
//! the write lease's promise when it is sent (not when its reply is back),
//! and a renewal batch is recorded as the batch the scheduler really sent
//! (so a driver's broken `renew_many` is judged). Grants made through the
//! facets (sets, downgrades, elections) are recorded too.

use std::sync::Arc;
use std::time::Duration;

use conformance::history::{EventKind, History, Op};
use conformance::recording::{RecordingBackend, record_lost};
use lock_core::election::{Leader, election_lock_key};
use lock_core::{
    Downgrade, Elections, Facets, Lease, LeaseKind, LockBackend, LockBackendExt, LockClient,
    LockError, LockKey, LockWrapper, MemoryBackend, WatchRequest, async_trait, validity_deadline,
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
    /// The memory service's facets, with this downgrade.
    fn facets(&self) -> Facets<'_> {
        Facets {
            downgrade: Some(self),
            ..self.0.facets()
        }
    }
}

#[async_trait]
impl Downgrade for SlowDowngradeReply {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        let read = LockBackendExt::downgrade(&self.0, lease).await;
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
    let writer: Arc<dyn LockBackend> = Arc::new(RecordingBackend::new(
        Arc::new(SlowDowngradeReply(memory.clone())),
        history.process(),
    ));
    let reader: Arc<dyn LockBackend> = Arc::new(RecordingBackend::new(
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

/// One guard through a recording client over `ReplyDatedBatch` (or, for
/// the control, over the service renewing one lease at a time, correctly),
/// renewed once by the real scheduler and then left to run out, while a
/// second client waits for the key; returns the checker's report.
async fn one_renewal_then_a_waiter(renewal_one_by_one: bool) -> conformance::history::CheckReport {
    let memory = MemoryBackend::new();
    let history = Arc::new(History::new());
    let holder: Arc<dyn LockBackend> = if renewal_one_by_one {
        // What the recorder judged before it forwarded `renew_many`: each
        // lease's own renewal (the correct path), not the broken batch.
        Arc::new(OneAtATime(memory.clone()))
    } else {
        Arc::new(ReplyDatedBatch(memory.clone()))
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
    let waiter: Arc<dyn LockBackend> = Arc::new(RecordingBackend::new(
        Arc::new(memory.clone()),
        history.process(),
    ));
    let next = waiter
        .acquire(&key, ttl, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    let _ = guard.lost().await;
    watcher.await.unwrap();
    waiter.release(&next).await.unwrap();
    history.check()
}

/// The service renewing a batch one lease at a time (each its own
/// correct renewal), as drivers without a batched path do.
#[derive(Debug)]
struct OneAtATime(MemoryBackend);

#[async_trait]
impl LockWrapper for OneAtATime {
    fn inner(&self) -> &dyn LockBackend {
        &self.0
    }
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        lock_core::renew_concurrently(leases, lock_core::RENEW_CONCURRENCY, |lease| {
            self.0.renew(lease)
        })
        .await
    }
}

/// The scheduler renews through `renew_many`; the recorder forwards that
/// batch and records each lease's renewal with the deadline the batch
/// returned, so the checker catches a batch that promises too much
/// (the holder's promise outlives the service's grant and the next holder
/// overlaps it). Renewed one lease at a time, correctly, the same run is
/// safe.
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

/// The memory service with an [`Elections`] facet of its own (the
/// default mutex election, served as a facet), to show the recorder
/// wraps an inner facet.
#[derive(Debug)]
struct WithElections(MemoryBackend);

#[async_trait]
impl LockWrapper for WithElections {
    fn inner(&self) -> &dyn LockBackend {
        &self.0
    }
    fn facets(&self) -> Facets<'_> {
        Facets {
            elections: Some(self),
            ..self.0.facets()
        }
    }
}

#[async_trait]
impl Elections for WithElections {
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.0.campaign(election, ttl, deadline).await
    }
    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        self.0.leader(election).await
    }
    async fn watch_leader(
        &self,
        request: WatchRequest<'_, Leader>,
    ) -> Result<Option<Leader>, LockError> {
        self.0.watch_leader(request).await
    }
}

/// The granted acquires recorded for `key`: `(kind code or None, token)`.
fn granted(history: &History, key: &LockKey) -> Vec<(Option<String>, Option<u64>)> {
    history
        .events()
        .into_iter()
        .filter(|e| e.kind == EventKind::Ok && e.op == Op::Acquire && e.key == key.as_str())
        .map(|e| (e.grant, e.token))
        .collect()
}

/// Every grant made through a facet is recorded: each key of a set taken
/// in one exchange (`LockSets`), the read grant of a downgrade (and the
/// write grant's release), a campaign through an inner `Elections` facet
/// and one through the mutex fallback; the recorder has exactly the inner
/// backend's facets.
#[tokio::test]
async fn grants_through_facets_are_recorded() {
    let memory = MemoryBackend::new();
    let history = Arc::new(History::new());
    let plain: Arc<dyn LockBackend> = Arc::new(RecordingBackend::new(
        Arc::new(memory.clone()),
        history.process(),
    ));
    let elected: Arc<dyn LockBackend> = Arc::new(RecordingBackend::new(
        Arc::new(WithElections(memory.clone())),
        history.process(),
    ));
    assert_eq!(plain.facets().names(), memory.facets().names());
    assert_eq!(
        elected.facets().names(),
        LockBackend::facets(&WithElections(memory.clone())).names()
    );
    assert!(elected.facets().elections.is_some());
    let ttl = Duration::from_secs(5);
    let deadline = Instant::now() + ttl;

    let set = [
        LockKey::new("set/a").unwrap(),
        LockKey::new("set/b").unwrap(),
    ];
    let leases = plain
        .try_acquire_all(&set, ttl)
        .await
        .unwrap()
        .expect("free");
    for (key, lease) in set.iter().zip(&leases) {
        assert_eq!(granted(&history, key), [(None, Some(lease.token().get()))]);
        assert!(plain.release(lease).await.unwrap());
    }

    let key = LockKey::new("downgraded").unwrap();
    let write = plain
        .try_acquire_kind(&key, LeaseKind::Write, ttl)
        .await
        .unwrap()
        .expect("free");
    let read = plain.downgrade(&write).await.unwrap();
    assert_eq!(
        granted(&history, &key),
        [
            (Some("w".to_owned()), Some(write.token().get())),
            (Some("r".to_owned()), Some(read.token().get())),
        ]
    );
    let released = history
        .events()
        .into_iter()
        .filter(|e| e.kind == EventKind::Ok && e.op == Op::Release && e.key == key.as_str())
        .count();
    assert_eq!(released, 1, "the downgrade's release of the write grant");
    assert!(plain.release(&read).await.unwrap());

    for (backend, name) in [(&plain, "fallback"), (&elected, "facet")] {
        let election = LockKey::new(format!("elect/{name}")).unwrap();
        let term = backend.campaign(&election, ttl, deadline).await.unwrap();
        let lock_key = election_lock_key(&election).unwrap();
        assert_eq!(
            granted(&history, &lock_key),
            [(None, Some(term.token().get()))],
            "campaign through the {name}"
        );
        assert!(backend.release(&term).await.unwrap());
    }
    assert!(history.check().is_exclusive());
}
