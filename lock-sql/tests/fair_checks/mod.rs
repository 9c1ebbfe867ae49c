//! Fair mode (`fair=true`) checks, run on PostgreSQL, MariaDB and SQLite by
//! their test binaries: the conformance cases of the mutex on a fair
//! target (the FIFO case runs there), fair and unfair clients excluding
//! each other on one key, a try refused while a waiter lives, a dead
//! waiter skipped within its lease, a cancelled waiter's row withdrawn,
//! and a releasing holder queued behind a waiter. `broken_variants` shows
//! each check failing on a variant made for it.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of this

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use conformance::{Harness, all_cases, run_cases};
use lock_core::{
    GrantRequest, Lease, LeaseKind, LockBackend, LockBackendExt, LockError, LockKey, LockWrapper,
    OwnerId, async_trait, unsupported_kind,
};
use lock_sql::SqlBackend;
use tokio::time::{Instant, sleep};

use crate::common::{
    UrlTarget, leak_waiter, poll_until_granted, wait_for_waiter, waiter_rows, with_options,
};

/// The mutex cases that need no fault injection, FIFO among them.
const FAIR_CASES: &[&str] = &[
    "bad_input_is_rejected",
    "inspect_reports_holder",
    "only_owner_can_release_or_renew",
    "stale_release_is_refused",
    "mutual_exclusion",
    "fencing_tokens_increase",
    "waiters_are_served_in_order",
    "acquire_times_out_at_deadline",
    "dropped_acquire_leaves_nothing",
    "expiry_frees_key",
    "renew_extends",
    "multi_lock_is_all_or_nothing",
    "multi_locks_never_deadlock",
];

/// The fair suite target of `name` on `url` (`fair=true` appended): the
/// mutex cases, which must pass, the FIFO one included (not skipped).
pub async fn run_fair_suite(name: &str, url: &str) {
    let target = Arc::new(UrlTarget {
        name: format!("{name}-fair"),
        url: with_options(url, "fair=true"),
        open: Arc::new(|url: String| {
            Box::pin(async move {
                Ok(Arc::new(SqlBackend::connect_url(&url).await?) as Arc<dyn LockBackend>)
            })
        }),
    });
    let cases: Vec<_> = all_cases()
        .into_iter()
        .filter(|c| FAIR_CASES.contains(&c.name))
        .collect();
    let report = run_cases(&Harness::new(target), &cases).await;
    let fifo = report
        .cases
        .iter()
        .find(|c| c.name == "waiters_are_served_in_order")
        .expect("the FIFO case ran");
    assert_eq!(
        fifo.verdict, "passed",
        "FIFO on {name}-fair: {}",
        fifo.detail
    );
    report.assert_passed();
}

fn fresh_key(what: &str) -> LockKey {
    LockKey::new(format!("fair/{what}/{}", OwnerId::random())).expect("key")
}

async fn take(b: &dyn LockBackend, key: &LockKey, ttl: Duration) -> Result<Lease, String> {
    b.try_acquire(key, ttl)
        .await
        .map_err(|e| format!("try_acquire: {e}"))?
        .ok_or_else(|| format!("{key} is not free"))
}

/// Fair and unfair clients of one key exclude each other: each refuses
/// the other's held key, and 2 fair + 2 unfair tasks never overlap.
pub async fn fair_and_unfair_exclude(
    fair: Arc<dyn LockBackend>,
    unfair: Arc<dyn LockBackend>,
) -> Result<String, String> {
    let key = fresh_key("mixed");
    let ttl = Duration::from_secs(10);
    for (holder, other, stolen) in [
        (
            &fair,
            &unfair,
            "an unfair client took a key a fair one holds",
        ),
        (
            &unfair,
            &fair,
            "a fair client took a key an unfair one holds",
        ),
    ] {
        let held = take(&**holder, &key, ttl).await?;
        if other
            .try_acquire(&key, ttl)
            .await
            .map_err(|e| e.to_string())?
            .is_some()
        {
            return Err(stolen.into());
        }
        holder.release(&held).await.map_err(|e| e.to_string())?;
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for b in [fair.clone(), fair, unfair.clone(), unfair] {
        let (key, inside, overlaps) = (key.clone(), inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..8 {
                let lease = b
                    .acquire(&key, ttl, Instant::now() + Duration::from_secs(20))
                    .await?;
                if inside.fetch_add(1, Ordering::SeqCst) > 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                sleep(Duration::from_millis(3)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                b.release(&lease).await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    match overlaps.load(Ordering::SeqCst) {
        0 => Ok("2 fair + 2 unfair tasks x 8 grants, no overlap".into()),
        n => Err(format!("{n} grants overlapped another holder")),
    }
}

/// A try is refused while a waiter lives, the key free: a waiter of
/// `dying` (a backend of its own, leaked with it) queued with a 1 s TTL
/// keeps `tryer` out, and `next` (waiting) is granted within that lease
/// plus a margin (the dead waiter skipped).
pub async fn dead_waiter_is_skipped(
    holder: &SqlBackend,
    dying: Arc<dyn LockBackend>,
    tryer: &dyn LockBackend,
    next: &dyn LockBackend,
) -> Result<String, String> {
    let key = fresh_key("dead");
    let ttl = Duration::from_secs(1);
    let held = take(holder, &key, Duration::from_secs(10)).await?;
    leak_waiter(dying, holder, &key, ttl).await;
    let died = Instant::now();
    holder.release(&held).await.map_err(|e| e.to_string())?;
    if let Some(lease) = tryer
        .try_acquire(&key, ttl)
        .await
        .map_err(|e| e.to_string())?
    {
        tryer.release(&lease).await.map_err(|e| e.to_string())?;
        return Err("try_acquire was granted while a waiter lived".into());
    }
    let lease = next
        .acquire(&key, ttl, Instant::now() + Duration::from_secs(5))
        .await
        .map_err(|e| format!("after a dead waiter: {e}"))?;
    let after = died.elapsed();
    next.release(&lease).await.map_err(|e| e.to_string())?;
    // Its row lives at most its 1 s TTL from its last refresh; the next
    // waiter looks again within the poll or re-check interval.
    if after > Duration::from_millis(2500) {
        return Err(format!(
            "granted {after:?} after the waiter died (lease 1 s)"
        ));
    }
    Ok(format!(
        "try refused while it lived; next granted {after:?} after it died"
    ))
}

/// A cancelled (dropped) waiter's row is withdrawn in the background: no
/// row is left, and a try succeeds at once after the holder releases
/// (`cancel` drops or, in the broken variant, leaks the wait).
pub async fn cancelled_waiter_withdraws<C, F>(
    holder: &dyn LockBackend,
    waiter: Arc<dyn LockBackend>,
    tryer: &dyn LockBackend,
    rows: &SqlBackend,
    cancel: C,
) -> Result<String, String>
where
    C: FnOnce(Arc<dyn LockBackend>, LockKey) -> F,
    F: Future<Output = ()>,
{
    let key = fresh_key("cancelled");
    let ttl = Duration::from_secs(30);
    let held = take(holder, &key, ttl).await?;
    cancel(waiter, key.clone()).await;
    sleep(Duration::from_millis(300)).await;
    let left = waiter_rows(rows, &key).await;
    holder.release(&held).await.map_err(|e| e.to_string())?;
    let lease = tryer
        .try_acquire(&key, ttl)
        .await
        .map_err(|e| e.to_string())?;
    if let Some(lease) = &lease {
        tryer.release(lease).await.map_err(|e| e.to_string())?;
    }
    if left != 0 {
        return Err(format!("{left} waiter row(s) left by a cancelled wait"));
    }
    if lease.is_none() {
        return Err("the key stayed blocked after the cancelled waiter".into());
    }
    Ok("no row left; the next try was granted at once".into())
}

/// Drops a waiting acquire after 300 ms (the correct cancellation).
pub async fn drop_wait(b: Arc<dyn LockBackend>, key: LockKey) {
    let task = tokio::spawn(async move {
        b.acquire(
            &key,
            Duration::from_secs(30),
            Instant::now() + Duration::from_secs(30),
        )
        .await
    });
    sleep(Duration::from_millis(300)).await;
    task.abort();
    let _ = task.await;
}

/// Leaks a waiting acquire once it is queued in `rows`' table (the broken
/// "cancellation"), `b` with it (a backend of its own).
pub async fn leak_wait(rows: Arc<SqlBackend>, b: Arc<dyn LockBackend>, key: LockKey) {
    leak_waiter(b, &rows, &key, Duration::from_secs(30)).await;
}

/// Handoffs [`releasing_holder_queues_behind`] makes: an unfair holder
/// wins only the race between its re-acquire and the woken waiter's try,
/// about half of them, so one handoff alone let its broken variant pass
/// now and then.
const HANDOFF_ROUNDS: usize = 12;

/// A holder that releases and asks again at once comes after the waiter
/// that was queued (its row in `rows`' table): the waiter's grant comes
/// first (its token is lower), in each of [`HANDOFF_ROUNDS`] handoffs.
pub async fn releasing_holder_queues_behind(
    holder: &dyn LockBackend,
    waiter: Arc<dyn LockBackend>,
    rows: &SqlBackend,
) -> Result<String, String> {
    let ttl = Duration::from_secs(10);
    for round in 1..=HANDOFF_ROUNDS {
        let key = fresh_key("handoff");
        let held = take(holder, &key, ttl).await?;
        let task = tokio::spawn({
            let (key, waiter) = (key.clone(), waiter.clone());
            async move {
                let lease = waiter
                    .acquire(&key, ttl, Instant::now() + Duration::from_secs(10))
                    .await?;
                sleep(Duration::from_millis(50)).await;
                waiter.release(&lease).await?;
                Ok::<_, LockError>(lease.token())
            }
        });
        wait_for_waiter(rows, &key).await;
        holder.release(&held).await.map_err(|e| e.to_string())?;
        let again = holder
            .acquire(&key, ttl, Instant::now() + Duration::from_secs(10))
            .await
            .map_err(|e| e.to_string())?;
        holder.release(&again).await.map_err(|e| e.to_string())?;
        let waiter_token = task
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        if again.token() < waiter_token {
            return Err(format!(
                "handoff {round}: the releasing holder took the key back first (token {} before the waiter's {})",
                again.token(),
                waiter_token
            ));
        }
    }
    Ok(format!(
        "the queued waiter went first in {HANDOFF_ROUNDS} of {HANDOFF_ROUNDS} handoffs"
    ))
}

/// A fair backend that never skips a dead waiter: its acquire waits while
/// any mutex waiter row of the key exists, live or not (the broken variant
/// of [`dead_waiter_is_skipped`]).
#[derive(Debug)]
pub struct NeverSkipsDead {
    pub inner: SqlBackend,
}

/// Only the mutex's grant is broken: a campaign (the default renewed
/// mutex, as the inner backend's) reaches it through this grant; the
/// shared kinds are refused, as the hand-written impl this replaces did;
/// everything else, facets included, is the inner backend's.
#[async_trait]
impl LockWrapper for NeverSkipsDead {
    fn inner(&self) -> &dyn LockBackend {
        &self.inner
    }

    fn name(&self) -> &'static str {
        "never-skips-dead"
    }

    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let GrantRequest {
            key,
            kind,
            ttl,
            deadline,
        } = request;
        if kind != LeaseKind::Exclusive {
            return Err(unsupported_kind(
                LockWrapper::name(self),
                key,
                kind,
                request.operation(),
            ));
        }
        match deadline {
            None => self.try_take(key, ttl).await,
            Some(deadline) => poll_until_granted(deadline, "a waiter row is there", || {
                self.try_take(key, ttl)
            })
            .await
            .map(Some),
        }
    }
}

impl NeverSkipsDead {
    async fn try_take(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        if waiter_rows(&self.inner, key).await > 0 {
            return Ok(None);
        }
        self.inner.try_acquire(key, ttl).await
    }
}

async fn connect(url: &str) -> Arc<SqlBackend> {
    Arc::new(SqlBackend::connect_url(url).await.expect("connect"))
}

/// Every check on `url` (no `fair` option in it), printed; panics on a
/// failure.
pub async fn fair_checks(url: &str) {
    let fair_url = with_options(url, "fair=true");
    let (a, b, c, d) = (
        connect(&fair_url).await,
        connect(&fair_url).await,
        connect(&fair_url).await,
        connect(&fair_url).await,
    );
    assert!(a.capabilities().fifo);
    let unfair = connect(url).await;
    assert!(!unfair.capabilities().fifo);
    let results = [
        (
            "fair and unfair exclude",
            fair_and_unfair_exclude(a.clone(), unfair.clone()).await,
        ),
        (
            "dead waiter skipped",
            dead_waiter_is_skipped(&a, connect(&fair_url).await, &*c, &*d).await,
        ),
        (
            "cancelled waiter withdraws",
            cancelled_waiter_withdraws(&*a, b.clone(), &*c, &a, drop_wait).await,
        ),
        (
            "releasing holder queues",
            releasing_holder_queues_behind(&*a, b.clone(), &a).await,
        ),
    ];
    for (name, result) in results {
        match result {
            Ok(detail) => println!("fair check {name}: {detail}"),
            Err(e) => panic!("fair check {name} failed: {e}"),
        }
    }
}

/// Each check failing on its broken variant: an unfair tryer (try refused
/// while a waiter lives), a backend that never skips dead waiters, a leaked
/// instead of dropped wait, a "fair" client on another table (no
/// exclusion), an unfair holder releasing and asking again (it takes the
/// key back before the queued waiter).
pub async fn broken_variants(url: &str) {
    let fair_url = with_options(url, "fair=true");
    let (a, c) = (connect(&fair_url).await, connect(&fair_url).await);
    let unfair = connect(url).await;
    let elsewhere = connect(&with_options(&fair_url, "table=fair_elsewhere")).await;
    let never = NeverSkipsDead {
        inner: (*c).clone(),
    };
    let caught = [
        (
            "unfair tryer",
            dead_waiter_is_skipped(&a, connect(&fair_url).await, &*unfair, &*c).await,
        ),
        (
            "never skips dead",
            dead_waiter_is_skipped(&a, connect(&fair_url).await, &*c, &never).await,
        ),
        (
            "leaked wait",
            cancelled_waiter_withdraws(&*a, connect(&fair_url).await, &*c, &a, |b, key| {
                leak_wait(a.clone(), b, key)
            })
            .await,
        ),
        (
            "other table",
            fair_and_unfair_exclude(a.clone(), elsewhere).await,
        ),
        (
            "unfair releasing holder",
            releasing_holder_queues_behind(&*unfair, c.clone(), &a).await,
        ),
    ];
    for (name, result) in caught {
        match result {
            Err(e) => println!("broken variant {name} caught: {e}"),
            Ok(detail) => panic!("broken variant {name} passed: {detail}"),
        }
    }
}
