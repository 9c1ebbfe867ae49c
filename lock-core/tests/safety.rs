//! Inputs that used to kill the guard's watchdog or hand out a dead lease:
//! overflowing durations, renewal tasks that end unexpectedly, TTLs below the
//! drift allowance, and a first renewal scheduled from the wrong instant.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core as under_test;
use lock_core::LockBackendExt;
use lock_core::{
    Capabilities, ErrorKind, FencingToken, Lease, LockBackend, LockClient, LockError, LockGuard,
    LockKey, LockRequest, LockState, MemoryBackend, MemoryFault, RenewalPolicy, RetryPolicy,
    async_trait,
};
use tokio::time::{Instant, sleep, timeout};

mod support;
use support::{Double, Twist, grant};

const TTL: Duration = Duration::from_millis(300);

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

/// Waits (bounded) for the guard to report a terminal state and returns it.
async fn terminal_within(guard: &LockGuard, limit: Duration) -> Option<String> {
    timeout(limit, guard.lost()).await.ok()
}

/// The guard ends within `limit` (well after its deadline) and says `Lost`.
async fn assert_lost_within(guard: &LockGuard, limit: Duration) {
    let reason = terminal_within(guard, limit).await;
    assert!(
        reason.is_some(),
        "still {:?} after the deadline",
        guard.state()
    );
    assert!(matches!(guard.state(), LockState::Lost(_)));
}

/// The request's acquire fails: its error.
async fn refused(request: LockRequest<'_>) -> LockError {
    request.acquire().await.map(|g| g.state()).unwrap_err()
}

/// The default renewal policy, renewing every `interval`.
fn renewing_every(interval: Duration) -> RenewalPolicy {
    RenewalPolicy {
        interval: Some(interval),
        ..RenewalPolicy::default()
    }
}

// ---- item 1: overflow and unexpected ends of the renewal task ----

#[tokio::test]
async fn max_hold_of_duration_max_keeps_renewing() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    let guard = client
        .lock("hold-forever")
        .ttl(TTL)
        .max_hold(Duration::MAX)
        .acquire()
        .await
        .unwrap();
    sleep(TTL * 2).await;
    assert_eq!(guard.state(), LockState::Held);
    assert!(guard.is_held());
    assert!(
        backend
            .try_acquire(&key("hold-forever"), TTL)
            .await
            .unwrap()
            .is_none(),
        "the key ran out: the watchdog stopped renewing"
    );
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn huge_renewal_interval_ends_in_lost_not_a_dead_watchdog() {
    let backend = MemoryBackend::new();
    let lease = grant(&backend, &key("huge-interval"), TTL).await;
    let guard = LockGuard::new(Arc::new(backend), lease, renewing_every(Duration::MAX));
    assert_lost_within(&guard, TTL * 3).await;
}

#[tokio::test]
async fn renewal_interval_not_shorter_than_the_ttl_is_refused() {
    let client = LockClient::new(MemoryBackend::new());
    for interval in [Duration::ZERO, TTL, Duration::MAX] {
        let err = refused(
            client
                .lock("interval")
                .ttl(TTL)
                .renewal(renewing_every(interval)),
        )
        .await;
        assert_eq!(
            err.kind(),
            ErrorKind::InvalidArgument,
            "{interval:?}: {err}"
        );
    }
}

#[tokio::test]
async fn wait_of_duration_max_does_not_panic() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    // Free key.
    let guard = client
        .lock("wait-max")
        .ttl(TTL)
        .wait(Duration::MAX)
        .acquire()
        .await
        .unwrap();
    assert!(guard.release().await.unwrap());
    // Held key, freed a little later: the forever-wait gets it.
    let held = grant(&backend, &key("wait-max"), TTL).await;
    let releaser = {
        let backend = backend.clone();
        tokio::spawn(async move {
            sleep(Duration::from_millis(50)).await;
            backend.release(&held).await.unwrap()
        })
    };
    let guard = timeout(
        Duration::from_secs(2),
        client
            .lock("wait-max")
            .ttl(TTL)
            .wait(Duration::MAX)
            .acquire(),
    )
    .await
    .expect("granted after the release")
    .unwrap();
    assert!(releaser.await.unwrap());
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn retry_policy_near_duration_max_still_loses_by_the_deadline() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    let policy = RenewalPolicy {
        retry: RetryPolicy {
            initial: Duration::MAX,
            max: Duration::MAX,
            multiplier: u32::MAX,
            max_attempts: None,
        },
        ..RenewalPolicy::default()
    };
    let guard = client
        .lock("retry-max")
        .ttl(TTL)
        .renewal(policy)
        .acquire()
        .await
        .unwrap();
    backend.set_fault(MemoryFault::Unavailable);
    let deadline = guard.validity_deadline();
    assert_lost_within(&guard, TTL * 3).await;
    assert!(Instant::now() <= deadline + Duration::from_millis(100));
}

#[tokio::test]
async fn nonsense_retry_policies_are_refused() {
    let client = LockClient::new(MemoryBackend::new());
    let good = RetryPolicy::default();
    let bad = [
        RetryPolicy {
            multiplier: 0,
            ..good
        },
        RetryPolicy {
            initial: Duration::from_secs(2),
            max: Duration::from_secs(1),
            ..good
        },
        RetryPolicy {
            initial: Duration::ZERO,
            ..good
        },
    ];
    for retry in bad {
        let policy = RenewalPolicy {
            retry,
            ..RenewalPolicy::default()
        };
        let err = refused(client.lock("retry").ttl(TTL).renewal(policy)).await;
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{retry:?}: {err}");
    }
}

#[tokio::test]
async fn lease_with_a_huge_ttl_is_lost_not_left_held() {
    let backend = MemoryBackend::new();
    let granted = grant(&backend, &key("huge-ttl"), TTL).await;
    // What a handle with a forged TTL would rebuild.
    let lease = Lease::from_parts(
        granted.key().clone(),
        granted.owner(),
        granted.token(),
        Duration::MAX,
        granted.validity_deadline(),
        String::new(),
    );
    let guard = LockGuard::new(Arc::new(backend), lease, renewing_every(TTL / 3));
    assert_lost_within(&guard, TTL * 3).await;
}

#[tokio::test]
async fn handles_with_a_ttl_above_the_maximum_are_refused() {
    let lease = Lease::granted(
        key("handle"),
        lock_core::OwnerId::random(),
        FencingToken::new(1),
        TTL,
        Instant::now(),
        String::new(),
    )
    .unwrap();
    let handle = lease.to_handle();
    let mut parts: Vec<String> = handle.split('.').map(str::to_owned).collect();
    parts[3] = u64::MAX.to_string();
    let err = Lease::from_handle(&parts.join(".")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}

/// A backend whose renew panics: the renewal task dies mid-flight.
#[derive(Debug)]
struct PanicOnRenew;

#[async_trait]
impl Twist for PanicOnRenew {
    const NAME: &'static str = "panic-on-renew";

    async fn renew(&self, _memory: &MemoryBackend, _lease: &Lease) -> Result<Instant, LockError> {
        panic!("deliberately broken backend: renew panics")
    }
}

#[tokio::test]
async fn a_panicking_renewal_task_reports_lost_at_once() {
    let client = LockClient::new(Double::new(MemoryBackend::new(), PanicOnRenew));
    let ttl = Duration::from_secs(3);
    let guard = client.lock("panics").ttl(ttl).acquire().await.unwrap();
    // The first renewal comes at about ttl/3 = 1 s and panics; Lost must
    // follow right then, not at the 3 s deadline (and never "Held").
    let reason = terminal_within(&guard, Duration::from_millis(1_800)).await;
    assert!(reason.is_some(), "still {:?}", guard.state());
    let LockState::Lost(reason) = guard.state() else {
        panic!("{:?}", guard.state())
    };
    assert!(reason.contains("renewal task"), "{reason}");
    assert!(!guard.is_held());
}

#[test]
fn a_renewal_task_stopped_by_its_runtime_shutting_down_reports_lost() {
    let backend = MemoryBackend::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = runtime.block_on(async {
        let client = LockClient::new(backend.clone());
        let request = client.lock("shutdown").ttl(Duration::from_secs(30));
        request_on_current_runtime(request).acquire().await.unwrap()
    });
    drop(runtime);
    assert!(
        matches!(guard.state(), LockState::Lost(_)),
        "{:?}",
        guard.state()
    );
    assert!(!guard.is_held());
}

// ---- item 2: TTLs below the drift allowance ----

#[tokio::test]
async fn memory_refuses_ttls_below_the_floor() {
    let backend = MemoryBackend::new();
    let client = LockClient::new(backend.clone());
    for ttl in [Duration::from_millis(1), Duration::from_millis(5)] {
        let err = backend.try_acquire(&key("short"), ttl).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{ttl:?}: {err}");
        let err = backend
            .acquire(&key("short"), ttl, Instant::now() + TTL)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{ttl:?}: {err}");
        let err = refused(client.lock("short").ttl(ttl)).await;
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{ttl:?}: {err}");
    }
    assert!(backend.capabilities().min_ttl >= Duration::from_millis(10));
    assert!(Capabilities::minimal().min_ttl >= Duration::from_millis(10));
    // The shortest accepted TTL gives a lease that is alive when returned.
    let min = backend.capabilities().min_ttl;
    let lease = grant(&backend, &key("short"), min).await;
    assert!(lease.validity_deadline() > Instant::now());
}

// ---- item 3: renewals scheduled from the lease's deadline ----

/// A backend whose acquire reply arrives late (the grant happened `delay`
/// before the caller sees it), recording when each renewal is sent.
#[derive(Debug)]
struct SlowReply {
    delay: Duration,
    renewals: Mutex<Vec<Instant>>,
}

impl SlowReply {
    /// A memory backend whose grants reach the caller `delay` late.
    fn backend(delay: Duration) -> Arc<Double<Self>> {
        Arc::new(Double::new(
            MemoryBackend::new(),
            Self {
                delay,
                renewals: Mutex::new(Vec::new()),
            },
        ))
    }
}

#[async_trait]
impl Twist for SlowReply {
    const NAME: &'static str = "slow-reply";

    async fn after_grant(&self) {
        sleep(self.delay).await;
    }

    async fn renew(&self, memory: &MemoryBackend, lease: &Lease) -> Result<Instant, LockError> {
        self.renewals.lock().unwrap().push(Instant::now());
        memory.renew(lease).await
    }
}

#[tokio::test]
async fn a_slow_acquire_is_renewed_relative_to_its_deadline() {
    let ttl = Duration::from_millis(600);
    let backend = SlowReply::backend(Duration::from_millis(300));
    let client = LockClient::from_arc(backend.clone());
    let guard = client.lock("slow").ttl(ttl).acquire().await.unwrap();
    let started = Instant::now();
    // Half the promised validity went by on the wire. The old schedule
    // renewed at reply + ttl/3 (200 ms after the reply, 500 ms after the
    // grant); a third of the validity is long gone, so renew right away.
    sleep(Duration::from_millis(250)).await;
    let first = backend.renewals.lock().unwrap().first().copied();
    let first = first.expect("no renewal within 250 ms of a reply that came 300 ms late");
    let lag = first - started;
    assert!(
        lag < Duration::from_millis(100),
        "first renewal {lag:?} after the reply"
    );
    assert_eq!(guard.state(), LockState::Held);
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn renewals_follow_the_deadline_of_the_previous_renewal() {
    // A lease granted earlier than the guard started (as a handle read in
    // another process, or a reply delayed on the wire).
    let ttl = Duration::from_millis(900);
    let backend = SlowReply::backend(Duration::ZERO);
    let granted = grant(backend.memory(), &key("cadence"), ttl).await;
    sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let guard = LockGuard::new(backend.clone(), granted, RenewalPolicy::default());
    sleep(Duration::from_millis(750)).await;
    let renewals = backend.renewals.lock().unwrap().clone();
    assert!(renewals.len() >= 2, "{renewals:?}");
    let first = renewals[0] - started;
    // Grant + 300 ms - drift = about 100 ms after start (old: 300 ms).
    assert!(
        first < Duration::from_millis(200),
        "first renewal at {first:?}"
    );
    let gap = renewals[1] - renewals[0];
    assert!(
        gap >= Duration::from_millis(250) && gap <= Duration::from_millis(400),
        "gap {gap:?}"
    );
    assert!(guard.release().await.unwrap());
}

/// Renewal on the application's own runtime (the behaviour under test).
fn request_on_current_runtime(request: lock_core::LockRequest<'_>) -> lock_core::LockRequest<'_> {
    request.renewal_runtime(lock_core::RenewalRuntime::current())
}

/// Renews, but never past a fixed cap below a full TTL (as etcd caps a
/// lock's deadline by its session lease's): counts the renewals.
#[derive(Debug)]
struct CappedRenewals {
    renewals: std::sync::atomic::AtomicU64,
}

#[async_trait]
impl Twist for CappedRenewals {
    const NAME: &'static str = "capped";

    async fn renew(&self, memory: &MemoryBackend, lease: &Lease) -> Result<Instant, LockError> {
        self.renewals
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        memory.renew(lease).await?;
        // Always half a TTL left: below the schedule's wish of 2/3.
        Ok(Instant::now() + lease.ttl() / 2)
    }
}

#[tokio::test]
async fn a_deadline_capped_below_a_full_ttl_does_not_make_renewal_spin() {
    let backend = Arc::new(Double::new(
        MemoryBackend::new(),
        CappedRenewals {
            renewals: std::sync::atomic::AtomicU64::new(0),
        },
    ));
    let ttl = Duration::from_millis(600);
    let guard = LockClient::from_arc(backend.clone())
        .lock("capped")
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let renewals = backend.renewals.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(guard.state(), lock_core::LockState::Held);
    // A gap of a quarter interval (50 ms) allows about 20 in a second;
    // spinning made thousands.
    assert!(
        renewals <= 30,
        "{renewals} renewals in 1 s with a 600 ms TTL"
    );
    assert!(guard.release().await.unwrap());
}

/// Issue 37: a lease handed off to a waiter (by the holder's release) is
/// checked when the waiter takes it. A waiter whose task only runs again
/// after the lease's deadline (here: the runtime's one thread blocked for
/// longer than the TTL) gets `LeaseLost`, never a lease that is already
/// over; the key is not left to that dead grant. For the mutex and for a
/// write share alike.
#[tokio::test(flavor = "current_thread")]
async fn a_handed_off_lease_past_its_deadline_is_never_returned() {
    use lock_core::LeaseKind;
    for kind in [LeaseKind::Exclusive, LeaseKind::Write] {
        let backend = MemoryBackend::new();
        let k = key("handed-off");
        let held = backend
            .try_acquire_kind(&k, kind, TTL)
            .await
            .unwrap()
            .expect("free");
        let waiter = {
            let (backend, k) = (backend.clone(), k.clone());
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(10);
                let result = backend.acquire_kind(&k, kind, TTL, deadline).await;
                (result, Instant::now())
            })
        };
        // The waiter queues.
        sleep(Duration::from_millis(20)).await;
        assert!(backend.release(&held).await.unwrap());
        // The hand-off is made; the waiter cannot run until well past its
        // lease's deadline.
        std::thread::sleep(TTL + Duration::from_millis(100));
        let (result, returned_at) = waiter.await.unwrap();
        match result {
            Ok(lease) => assert!(
                lease.validity_deadline() > returned_at,
                "{kind}: acquire returned a lease {:?} past its deadline",
                returned_at - lease.validity_deadline()
            ),
            Err(err) => assert_eq!(err.kind(), ErrorKind::LeaseLost, "{kind}: {err}"),
        }
        let again = backend.try_acquire_kind(&k, kind, TTL).await.unwrap();
        assert!(again.is_some(), "{kind}: the dead hand-off kept the key");
    }
}
