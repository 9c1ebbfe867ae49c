//! Tests of the migration wrapper, with test doubles around
//! [`MemoryBackend`] that delay grants, fail releases or refuse renewals.

use async_trait::async_trait;
use tokio::time::Instant;

use super::*;
use crate::error::{ErrorKind, Operation};
use crate::types::{FencingToken, Lease, LockInfo};
use crate::{LockBackendExt, MemoryBackend};

use crate::support::{Double, Twist, grant};

fn pair() -> (Arc<dyn LockBackend>, Arc<dyn LockBackend>) {
    (
        Arc::new(MemoryBackend::new()),
        Arc::new(MemoryBackend::new()),
    )
}

#[tokio::test]
async fn adjacent_phases_exclude_each_other() {
    let (old, new) = pair();
    let key = LockKey::new("k").unwrap();
    let ttl = Duration::from_secs(5);
    let on_old = MigrationBackend::new(old.clone(), new.clone(), MigrationPhase::Old);
    let on_dual = on_old.with_phase(MigrationPhase::Dual);
    let on_new = on_old.with_phase(MigrationPhase::New);

    let held = grant(&on_old, &key, ttl).await;
    assert!(on_dual.try_acquire(&key, ttl).await.unwrap().is_none());
    // The failed dual attempt left nothing in the new store.
    assert!(new.inspect(&key).await.unwrap().is_none());
    assert!(on_old.release(&held).await.unwrap());

    let dual = grant(&on_dual, &key, ttl).await;
    assert!(on_old.try_acquire(&key, ttl).await.unwrap().is_none());
    assert!(on_new.try_acquire(&key, ttl).await.unwrap().is_none());
    assert!(dual.token().get() > NEW_EPOCH);
    on_dual.renew(&dual).await.unwrap();
    assert!(on_dual.release(&dual).await.unwrap());
    assert!(!on_dual.release(&dual).await.unwrap());

    let newest = grant(&on_new, &key, ttl).await;
    assert!(on_dual.try_acquire(&key, ttl).await.unwrap().is_none());
    assert!(newest.token() > dual.token());
    assert!(on_new.release(&newest).await.unwrap());
}

#[tokio::test]
async fn inspect_flags_old_only_holders_during_dual() {
    let (old, new) = pair();
    let key = LockKey::new("k").unwrap();
    let on_old = MigrationBackend::new(old, new, MigrationPhase::Old);
    let held = grant(&on_old, &key, Duration::from_secs(5)).await;
    let info = on_old
        .with_phase(MigrationPhase::Dual)
        .inspect(&key)
        .await
        .unwrap()
        .unwrap();
    assert!(info.holder.starts_with("old-only:"), "{}", info.holder);
    on_old.release(&held).await.unwrap();
}

#[test]
fn phases_parse() {
    assert_eq!(MigrationPhase::parse("Dual").unwrap(), MigrationPhase::Dual);
    assert_eq!(
        MigrationPhase::parse("x").unwrap_err().kind(),
        ErrorKind::Config
    );
}

// ---- dual-phase rules (bug 3) ----

/// A backend whose grants arrive `delay` late (a slow new side).
#[derive(Debug)]
struct SlowGrant {
    delay: Duration,
}

#[async_trait]
impl Twist for SlowGrant {
    const NAME: &'static str = "slow-grant";

    async fn before_grant(&self) {
        tokio::time::sleep(self.delay).await;
    }
}

/// A backend whose releases fail (unreachable at release time), or
/// whose renewals are refused.
#[derive(Debug)]
struct Faulty {
    fail_release: bool,
    refuse_renew: bool,
}

#[async_trait]
impl Twist for Faulty {
    const NAME: &'static str = "faulty";

    async fn renew(&self, memory: &MemoryBackend, lease: &Lease) -> Result<Instant, LockError> {
        if self.refuse_renew {
            return Err(LockError::new(
                ErrorKind::NotHeld,
                Operation::Renew,
                "refused by the test double",
            ));
        }
        memory.renew(lease).await
    }

    async fn release(&self, memory: &MemoryBackend, lease: &Lease) -> Result<bool, LockError> {
        if self.fail_release {
            return Err(LockError::new(
                ErrorKind::Unavailable,
                Operation::Release,
                "unreachable (test double)",
            ));
        }
        memory.release(lease).await
    }
}

fn key() -> LockKey {
    LockKey::new("dual/k").unwrap()
}

#[tokio::test]
async fn dual_acquire_keeps_the_old_side_while_the_new_side_is_slow() {
    let old = MemoryBackend::new();
    let new = SlowGrant {
        delay: Duration::from_millis(450),
    };
    let dual = MigrationBackend::new(
        Arc::new(old.clone()),
        Arc::new(Double::new(MemoryBackend::new(), new)),
        MigrationPhase::Dual,
    );
    let ttl = Duration::from_millis(200);
    let lease = dual
        .acquire(&key(), ttl, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        lease.validity_deadline() > Instant::now(),
        "handed out an expired lease: {lease:?}"
    );
    // The old side is still ours (renewed while the new side was slow).
    assert!(
        old.inspect(&key()).await.unwrap().is_some(),
        "old side lapsed"
    );
    assert!(dual.release(&lease).await.unwrap());
}

#[tokio::test]
async fn dual_try_refuses_a_composed_lease_already_over() {
    let old = MemoryBackend::new();
    let new = MemoryBackend::new();
    let slow = SlowGrant {
        delay: Duration::from_millis(300),
    };
    let dual = MigrationBackend::new(
        Arc::new(old.clone()),
        Arc::new(Double::new(new.clone(), slow)),
        MigrationPhase::Dual,
    );
    let result = dual.try_acquire(&key(), Duration::from_millis(200)).await;
    match result {
        Ok(Some(lease)) => panic!("handed out {lease:?} although its old side ran out"),
        Ok(None) => panic!("not contended"),
        Err(e) => assert!(e.is_lost(), "{e}"),
    }
    // Both sides were given back.
    assert!(old.inspect(&key()).await.unwrap().is_none());
    assert!(new.inspect(&key()).await.unwrap().is_none());
}

#[tokio::test]
async fn dual_release_releases_both_sides_whatever_fails() {
    for failing_new in [true, false] {
        let old = MemoryBackend::new();
        let new = MemoryBackend::new();
        let faulty = |inner: &MemoryBackend, fail| -> Arc<dyn LockBackend> {
            Arc::new(Double::new(
                inner.clone(),
                Faulty {
                    fail_release: fail,
                    refuse_renew: false,
                },
            ))
        };
        let dual = MigrationBackend::new(
            faulty(&old, !failing_new),
            faulty(&new, failing_new),
            MigrationPhase::Dual,
        );
        let lease = grant(&dual, &key(), Duration::from_secs(5)).await;
        let err = dual.release(&lease).await.unwrap_err();
        assert!(err.is_unavailable(), "{err}");
        let (left, other) = if failing_new {
            (&old, "old")
        } else {
            (&new, "new")
        };
        assert!(
            left.inspect(&key()).await.unwrap().is_none(),
            "the {other} side stayed held after the other side's release failed"
        );
    }
}

#[tokio::test]
async fn dual_acquire_gives_up_when_the_old_side_is_lost_while_waiting() {
    let old = MemoryBackend::new();
    let new = MemoryBackend::new();
    let other = grant(&new, &key(), Duration::from_secs(5)).await;
    let refusing = Faulty {
        fail_release: false,
        refuse_renew: true,
    };
    let dual = MigrationBackend::new(
        Arc::new(Double::new(old.clone(), refusing)),
        Arc::new(new.clone()),
        MigrationPhase::Dual,
    );
    let started = Instant::now();
    let err = dual
        .acquire(
            &key(),
            Duration::from_millis(300),
            Instant::now() + Duration::from_secs(3),
        )
        .await
        .unwrap_err();
    assert!(err.is_lost(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        old.inspect(&key()).await.unwrap().is_none(),
        "old side kept"
    );
    assert!(new.release(&other).await.unwrap());
    // The withdrawn new-side waiter left nothing behind.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(new.inspect(&key()).await.unwrap().is_none());
}

#[tokio::test]
async fn dual_renew_reports_a_lost_side() {
    let old = MemoryBackend::new();
    let new = MemoryBackend::new();
    let dual = MigrationBackend::new(
        Arc::new(old.clone()),
        Arc::new(new.clone()),
        MigrationPhase::Dual,
    );
    let lease = grant(&dual, &key(), Duration::from_secs(5)).await;
    dual.renew(&lease).await.unwrap();
    // Someone frees the new side behind our back.
    let (_, new_part) = MigrationBackend::split(&lease, Operation::Renew).unwrap();
    assert!(new.release(&new_part.unwrap()).await.unwrap());
    assert!(dual.renew(&lease).await.unwrap_err().is_not_held());
    let _ = dual.release(&lease).await;
    assert!(old.inspect(&key()).await.unwrap().is_none());
}

/// A first migration (kept in phase `New`) whose new side has handed
/// out many tokens, and a fresh backend for the second migration.
async fn first_migration() -> (MigrationBackend, MemoryBackend, FencingToken) {
    let (a, b) = (MemoryBackend::new(), MemoryBackend::new());
    for _ in 0..50 {
        let warm = LockKey::new("warm").unwrap();
        let l = grant(&b, &warm, Duration::from_secs(5)).await;
        b.release(&l).await.unwrap();
    }
    let first = MigrationBackend::new(Arc::new(a), Arc::new(b), MigrationPhase::New)
        .with_old_lease_max(Duration::ZERO);
    // Cut over and let the (zero) wait-out pass.
    let seen = loop {
        if let Some(lease) = first
            .try_acquire(&key(), Duration::from_secs(5))
            .await
            .unwrap()
        {
            break lease;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    first.release(&seen).await.unwrap();
    (first, MemoryBackend::new(), seen.token())
}

#[tokio::test]
async fn nesting_without_stacking_is_refused_in_every_phase_that_sees_old_tokens() {
    let (first, c, seen) = first_migration().await;
    for phase in [MigrationPhase::Old, MigrationPhase::Dual] {
        let second = MigrationBackend::new(Arc::new(first.clone()), Arc::new(c.clone()), phase);
        for result in [
            second
                .try_acquire(&key(), Duration::from_secs(5))
                .await
                .map(|l| l.map(|l| l.token())),
            second
                .acquire(
                    &key(),
                    Duration::from_secs(5),
                    Instant::now() + Duration::from_secs(1),
                )
                .await
                .map(|l| Some(l.token())),
        ] {
            let err = result
                .map(|t| format!("granted {t:?} after {seen}"))
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{phase:?}: {err}");
            assert!(err.message().contains("stacked"), "{err}");
        }
        // Nothing was left held on any side.
        assert!(first.inspect(&key()).await.unwrap().is_none());
        assert!(c.inspect(&key()).await.unwrap().is_none());
    }
}

#[tokio::test]
async fn stacked_migrations_keep_tokens_increasing() {
    let (first, c, seen) = first_migration().await;
    let second = MigrationBackend::stacked(first.clone(), Arc::new(c), MigrationPhase::Old)
        .unwrap()
        .with_old_lease_max(Duration::ZERO);
    assert_eq!(second.epoch(), 2);
    assert_ne!(second.cutover_key(), first.cutover_key());
    let mut last = seen;
    for phase in [
        MigrationPhase::Old,
        MigrationPhase::Dual,
        MigrationPhase::New,
    ] {
        let backend = second.with_phase(phase);
        let lease = loop {
            if let Some(lease) = backend
                .try_acquire(&key(), Duration::from_secs(5))
                .await
                .unwrap()
            {
                break lease;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert!(
            lease.token() > last,
            "{phase:?}: {} after {last}",
            lease.token()
        );
        last = lease.token();
        assert!(backend.release(&lease).await.unwrap());
    }
    // Epoch 255 is the last.
    let mut top = first;
    top.epoch = 255;
    assert_eq!(
        MigrationBackend::stacked(top, Arc::new(MemoryBackend::new()), MigrationPhase::Old)
            .unwrap_err()
            .kind(),
        ErrorKind::Config
    );
}

// ---- the cutover guard (stragglers on `old`) ----

fn phases(
    old: &MemoryBackend,
    new: &MemoryBackend,
    wait_out: Duration,
) -> (MigrationBackend, MigrationBackend, MigrationBackend) {
    let on_old = MigrationBackend::new(
        Arc::new(old.clone()),
        Arc::new(new.clone()),
        MigrationPhase::Old,
    )
    .with_old_lease_max(wait_out);
    // Each its own process: no shared cutover state.
    let fresh = |phase| {
        MigrationBackend::new(Arc::new(old.clone()), Arc::new(new.clone()), phase)
            .with_old_lease_max(wait_out)
    };
    (
        on_old,
        fresh(MigrationPhase::Dual),
        fresh(MigrationPhase::New),
    )
}

/// `acquire`s `key` for 1 s through `backend`, waiting up to 5 s: the
/// lease and how long the grant took.
async fn timed_acquire(backend: &MigrationBackend, key: &LockKey) -> (Lease, Duration) {
    let started = Instant::now();
    let lease = backend
        .acquire(
            key,
            Duration::from_secs(1),
            Instant::now() + Duration::from_secs(5),
        )
        .await
        .unwrap();
    (lease, started.elapsed())
}

#[tokio::test]
async fn a_waiting_old_straggler_is_refused_once_new_has_started() {
    let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    let (on_old, on_dual, on_new) = phases(&old, &new, Duration::from_secs(5));
    let key = LockKey::new("jobs/straggle").unwrap();
    let ttl = Duration::from_secs(2);
    let far = || Instant::now() + Duration::from_secs(10);
    let dual = on_dual.acquire(&key, ttl, far()).await.unwrap();
    // The straggler waits behind the dual holder in the old backend.
    let straggler = tokio::spawn({
        let (on_old, key) = (on_old.clone(), key.clone());
        async move { on_old.acquire(&key, ttl, far()).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let newcomer = tokio::spawn({
        let (on_new, key) = (on_new.clone(), key.clone());
        async move {
            let lease = on_new.acquire(&key, ttl, far()).await?;
            Ok::<_, LockError>((lease, Instant::now()))
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // `new` announced the cutover in the old backend.
    assert!(old.inspect(on_new.cutover_key()).await.unwrap().is_some());
    assert!(on_dual.release(&dual).await.unwrap());
    let refused = straggler.await.unwrap().unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Config, "{refused}");
    assert!(
        refused.message().contains("moved to the new backend"),
        "{refused}"
    );
    let (lease, _) = newcomer.await.unwrap().unwrap();
    // The new process did not wait out the 5 s: it took the key once in
    // the old backend instead.
    assert!(lease.token().get() > NEW_EPOCH);
    // The refused grant was given back.
    assert!(old.inspect(&key).await.unwrap().is_none());
    assert!(on_new.release(&lease).await.unwrap());
    // A later straggler is refused at once, and leaves nothing.
    let err = on_old.try_acquire(&key, ttl).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(old.inspect(&key).await.unwrap().is_none());
}

#[tokio::test]
async fn new_waits_for_an_old_holder_until_the_wait_out() {
    let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    let wait_out = Duration::from_millis(300);
    let (on_old, _, on_new) = phases(&old, &new, wait_out);
    let key = LockKey::new("jobs/holder").unwrap();
    // An old holder from before the cutover, holding a long lease (longer
    // than the configured wait-out: a misconfiguration the wait-out bounds).
    let held = grant(&on_old, &key, Duration::from_secs(5)).await;
    assert!(
        on_new
            .try_acquire(&key, Duration::from_secs(1))
            .await
            .unwrap()
            .is_none()
    );
    let (lease, waited) = timed_acquire(&on_new, &key).await;
    assert!(
        waited >= Duration::from_millis(200),
        "granted beside an old holder after {waited:?}"
    );
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    // The old holder cannot renew past the cutover: its guard goes `Lost`.
    let err = on_old.renew(&held).await.unwrap_err();
    assert!(err.is_lost(), "{err}");
    // ... and its lease is left to expire, not released under its holder.
    assert!(old.inspect(&key).await.unwrap().is_some());
    on_new.release(&lease).await.unwrap();
}

#[tokio::test]
async fn an_old_guard_reports_lost_after_the_cutover() {
    let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    let (on_old, _, on_new) = phases(&old, &new, Duration::from_millis(100));
    let client = crate::LockClient::new(on_old);
    let guard = client
        .lock("jobs/guarded")
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    // `new` starts (on another key): the cutover is announced.
    let other = LockKey::new("jobs/other").unwrap();
    let _ = on_new
        .try_acquire(&other, Duration::from_secs(1))
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("the guard never reported the cutover");
    assert!(reason.contains("moved to the new backend"), "{reason}");
}

#[tokio::test]
async fn a_restarted_new_process_does_not_wait_again() {
    let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    let wait_out = Duration::from_millis(150);
    let (_, _, first) = phases(&old, &new, wait_out);
    let key = LockKey::new("jobs/restart").unwrap();
    // A try before the wait-out passed still goes through (the key is free
    // in the old backend).
    let lease = grant(&first, &key, Duration::from_secs(1)).await;
    first.release(&lease).await.unwrap();
    tokio::time::sleep(wait_out + Duration::from_millis(50)).await;
    // A restart: new cutover state, same backends. The marker's age comes
    // from the old backend, so it needs no look at `key` there: even with
    // the key held in the old backend (by a client outside the migration),
    // it grants at once.
    let (_, _, restarted) = phases(&old, &new, wait_out);
    let leftover = grant(&old, &key, Duration::from_secs(5)).await;
    let lease = restarted
        .try_acquire(&key, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(lease.is_some(), "the restarted process waited again");
    old.release(&leftover).await.unwrap();
}

#[tokio::test]
async fn the_marker_key_cannot_be_locked_through_the_wrapper() {
    let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    let (on_old, on_dual, on_new) = phases(&old, &new, Duration::ZERO);
    let marker = on_old.cutover_key().clone();
    for backend in [&on_old, &on_dual, &on_new] {
        let err = backend
            .try_acquire(&marker, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    }
    let named = on_old.clone().with_name("fleet-a").unwrap();
    assert_eq!(
        named.cutover_key().as_str(),
        "__distlock/migration-cutover/fleet-a"
    );
    for bad in ["", "  ", "a\u{0}b"] {
        assert_eq!(
            on_old.clone().with_name(bad).unwrap_err().kind(),
            ErrorKind::Config,
            "{bad:?}"
        );
    }
}

#[tokio::test]
async fn an_unreadable_marker_refuses_old_grants() {
    let old = MemoryBackend::new();
    let new = MemoryBackend::new();
    let (on_old, _, _) = phases(&old, &new, Duration::ZERO);
    let key = LockKey::new("jobs/unreadable").unwrap();
    old.set_fault(crate::MemoryFault::Unavailable);
    assert!(
        on_old
            .try_acquire(&key, Duration::from_secs(1))
            .await
            .unwrap_err()
            .is_unavailable()
    );
    old.set_fault(crate::MemoryFault::None);
    assert!(
        on_old
            .try_acquire(&key, Duration::from_secs(1))
            .await
            .unwrap()
            .is_some()
    );
}

// ---- keeping the marker while `new` runs (issue 37, bug 2) ----

/// A `new` process of its own that checks the marker every 50 ms.
fn kept_new(
    old: Arc<dyn LockBackend>,
    new: &MemoryBackend,
    wait_out: Duration,
) -> MigrationBackend {
    MigrationBackend::new(old, Arc::new(new.clone()), MigrationPhase::New)
        .with_old_lease_max(wait_out)
        .with_marker_refresh(Duration::from_millis(50))
}

/// Waits (at most 2 s) until the old store shows the marker `key`.
async fn marker_in(old: &MemoryBackend, key: &LockKey) -> Option<LockInfo> {
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        if let Some(info) = old.inspect(key).await.unwrap() {
            return Some(info);
        }
        if Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A straggler on `old` tries `key`: it must be refused as moved.
async fn assert_straggler_refused(on_old: &MigrationBackend, key: &LockKey) {
    match on_old.try_acquire(key, Duration::from_secs(1)).await {
        Err(e) if e.kind() == ErrorKind::Config && e.message().contains("moved") => {}
        other => panic!(
            "a straggler on `old` was not refused while a `new` process holds {key}: {other:?}"
        ),
    }
}

#[tokio::test]
async fn a_vanished_marker_is_set_again_while_new_runs() {
    let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    let (on_old, _, _) = phases(&old, &new, Duration::from_millis(50));
    let on_new = kept_new(Arc::new(old.clone()), &new, Duration::from_millis(50));
    let key = LockKey::new("jobs/kept").unwrap();
    let held = grant(&on_new, &key, Duration::from_secs(5)).await;
    // Past the wait-out: `new` grants no longer look at the old store.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let other = grant(
        &on_new,
        &LockKey::new("jobs/other").unwrap(),
        Duration::from_secs(1),
    )
    .await;
    on_new.release(&other).await.unwrap();
    // The marker disappears (an operator's force-release, a restarted
    // store, an ended session).
    let marker = on_new.cutover_key().clone();
    assert!(old.force_release(&marker).await.unwrap().is_some());
    // Within a few refresh intervals it is set again...
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ... so a straggler on `old` is refused beside the `new` holder.
    assert_straggler_refused(&on_old, &key).await;
    assert!(old.inspect(&marker).await.unwrap().is_some());
    on_new.release(&held).await.unwrap();
}

/// The old store with every reserved key's TTL cut to 400 ms (the 24 h
/// TTL of the marker, running out within a test).
#[derive(Debug)]
struct ShortMarkers(MemoryBackend);

const SHORT_MARKER_TTL: Duration = Duration::from_millis(400);

#[async_trait]
impl crate::wrapper::LockWrapper for ShortMarkers {
    fn inner(&self) -> &dyn LockBackend {
        &self.0
    }

    fn name(&self) -> &'static str {
        "short-markers"
    }

    async fn grant(&self, request: crate::GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let ttl = if request.key.is_reserved() {
            request.ttl.min(SHORT_MARKER_TTL)
        } else {
            request.ttl
        };
        self.0.grant(crate::GrantRequest { ttl, ..request }).await
    }
}

#[tokio::test]
async fn the_marker_is_renewed_before_its_ttl_runs_out() {
    let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    let (on_old, _, _) = phases(&old, &new, Duration::ZERO);
    let on_new = kept_new(Arc::new(ShortMarkers(old.clone())), &new, Duration::ZERO);
    let key = LockKey::new("jobs/renewed").unwrap();
    let held = grant(&on_new, &key, Duration::from_secs(5)).await;
    let marker = on_new.cutover_key().clone();
    let first = old.inspect(&marker).await.unwrap().expect("announced");
    tokio::time::sleep(SHORT_MARKER_TTL * 3).await;
    let now = old.inspect(&marker).await.unwrap();
    assert!(
        now.as_ref().is_some_and(|now| now.token == first.token),
        "the marker was not kept past its TTL (first {first:?}, now {now:?})"
    );
    assert_straggler_refused(&on_old, &key).await;
    on_new.release(&held).await.unwrap();
}

#[tokio::test]
async fn a_marker_set_again_restarts_the_wait_out() {
    let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    let wait_out = Duration::from_millis(600);
    let processes = [
        kept_new(Arc::new(old.clone()), &new, wait_out),
        kept_new(Arc::new(old.clone()), &new, wait_out),
    ];
    let key = LockKey::new("jobs/gap").unwrap();
    let warm = LockKey::new("jobs/warm").unwrap();
    for process in &processes {
        let lease = grant(process, &warm, Duration::from_secs(1)).await;
        process.release(&lease).await.unwrap();
    }
    tokio::time::sleep(wait_out + Duration::from_millis(100)).await;
    for process in &processes {
        // Past the wait-out now.
        let lease = grant(process, &warm, Duration::from_secs(1)).await;
        process.release(&lease).await.unwrap();
    }
    let marker = processes[0].cutover_key().clone();
    let before = old.force_release(&marker).await.unwrap().expect("set");
    // While the marker is gone, a process on the old store takes `key`
    // (a straggler on `old` would be admitted here).
    let straggler = grant(&old, &key, Duration::from_secs(5)).await;
    // A `new` process that starts now announces the cutover again.
    let starting = kept_new(Arc::new(old.clone()), &new, wait_out);
    let lease = grant(&starting, &warm, Duration::from_secs(1)).await;
    starting.release(&lease).await.unwrap();
    let again = marker_in(&old, &marker).await.expect("announced again");
    assert_ne!(again.token, before.token);
    // Every `new` process notices within a refresh and waits the old
    // leases out again: none grants `key` beside the straggler.
    tokio::time::sleep(Duration::from_millis(150)).await;
    for (i, process) in processes.iter().chain([&starting]).enumerate() {
        let granted = process
            .try_acquire(&key, Duration::from_secs(1))
            .await
            .unwrap();
        assert!(
            granted.is_none(),
            "`new` process {i} granted {key} beside a lease taken in the old store while the marker was gone"
        );
    }
    old.release(&straggler).await.unwrap();
}

#[tokio::test]
async fn the_wait_out_is_the_longest_recorded_old_ttl() {
    let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    let (on_old, _, careful) = phases(&old, &new, Duration::from_secs(1));
    // A process configured with a shorter `old_ttl` than the fleet's.
    let (_, _, hasty) = phases(&old, &new, Duration::from_millis(100));
    let key = LockKey::new("jobs/recorded").unwrap();
    let held = grant(&on_old, &key, Duration::from_secs(5)).await;
    // The first `new` process announces the cutover with its 1 s.
    let other = grant(
        &careful,
        &LockKey::new("jobs/other").unwrap(),
        Duration::from_secs(1),
    )
    .await;
    careful.release(&other).await.unwrap();
    let (lease, waited) = timed_acquire(&hasty, &key).await;
    assert!(
        waited >= Duration::from_millis(800),
        "granted beside an old holder after {waited:?}: the local 100 ms, not the recorded 1 s"
    );
    hasty.release(&lease).await.unwrap();
    let _ = on_old.release(&held).await;
}

#[tokio::test]
async fn a_longer_old_ttl_recorded_during_the_wait_out_extends_it() {
    let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    let (on_old, _, hasty) = phases(&old, &new, Duration::from_millis(100));
    let key = LockKey::new("jobs/recorded-later").unwrap();
    let held = grant(&on_old, &key, Duration::from_secs(5)).await;
    // The hasty process announces first, with its 100 ms...
    let other = LockKey::new("jobs/other").unwrap();
    let lease = grant(&hasty, &other, Duration::from_secs(1)).await;
    hasty.release(&lease).await.unwrap();
    // ... then a process configured with 1 s records it.
    let (_, _, careful) = phases(&old, &new, Duration::from_secs(1));
    let lease = grant(&careful, &other, Duration::from_secs(1)).await;
    careful.release(&lease).await.unwrap();
    let (lease, waited) = timed_acquire(&hasty, &key).await;
    assert!(
        waited >= Duration::from_millis(800),
        "granted beside an old holder after {waited:?}: the 1 s recorded during the wait-out was not read"
    );
    hasty.release(&lease).await.unwrap();
    let _ = on_old.release(&held).await;
}

#[tokio::test]
async fn the_marker_is_not_force_released_by_accident() {
    let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    let (_, _, on_new) = phases(&old, &new, Duration::ZERO);
    let lease = grant(
        &on_new,
        &LockKey::new("jobs/a").unwrap(),
        Duration::from_secs(1),
    )
    .await;
    on_new.release(&lease).await.unwrap();
    let marker = on_new.cutover_key().as_str().to_owned();
    let admin = crate::LockClient::new(old.clone());
    match admin.force_release(&marker).await {
        Err(e) if e.kind() == ErrorKind::InvalidArgument => {
            assert!(e.message().contains("force_release_reserved"), "{e}");
        }
        other => panic!("force_release broke the reserved key {marker}: {other:?}"),
    }
    assert!(admin.inspect(&marker).await.unwrap().is_some());
    // Ordinary keys are broken as before.
    let ordinary = grant(
        &old,
        &LockKey::new("jobs/b").unwrap(),
        Duration::from_secs(5),
    )
    .await;
    let broken = admin.force_release("jobs/b").await.unwrap().expect("held");
    assert_eq!(broken.token, Some(ordinary.token()));
    // Asked for explicitly, the marker is broken.
    assert!(
        admin
            .force_release_reserved(&marker)
            .await
            .unwrap()
            .is_some()
    );
    assert!(admin.inspect(&marker).await.unwrap().is_none());
}

// ---- elections (each store's own layout) ----

/// A store whose elections live apart from its mutexes (as etcd's and
/// ZooKeeper's do): a campaign takes the mutex `native/<name>`.
#[derive(Debug)]
struct NativeElections;

impl NativeElections {
    fn key(election: &LockKey) -> LockKey {
        LockKey::new(format!("native/{election}")).unwrap()
    }
}

#[async_trait]
impl Twist for NativeElections {
    const NAME: &'static str = "native";
    const ELECTIONS: bool = true;

    async fn campaign(
        &self,
        memory: &MemoryBackend,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        memory.acquire(&Self::key(election), ttl, deadline).await
    }

    async fn leader(
        &self,
        memory: &MemoryBackend,
        election: &LockKey,
    ) -> Result<Option<crate::election::Leader>, LockError> {
        Ok(memory
            .inspect(&Self::key(election))
            .await?
            .map(crate::election::Leader::from_info))
    }
}

/// Plain old-store candidates, and candidates in every phase, see one
/// election: each phase campaigns in the stores it decides in, on their
/// own layouts (the generic mutex election would let a plain candidate
/// and a phase-`old` one lead together).
#[tokio::test]
async fn elections_exclude_across_adjacent_phases_on_native_layouts() {
    let old: Arc<dyn LockBackend> = Arc::new(Double::new(MemoryBackend::new(), NativeElections));
    let new: Arc<dyn LockBackend> = Arc::new(Double::new(MemoryBackend::new(), NativeElections));
    let name = LockKey::new("jobs").unwrap();
    let ttl = Duration::from_secs(5);
    let soon = || Instant::now() + Duration::from_millis(50);
    let on_old = MigrationBackend::new(old.clone(), new.clone(), MigrationPhase::Old);
    let on_dual = on_old.with_phase(MigrationPhase::Dual);
    let on_new = on_old.with_phase(MigrationPhase::New);
    let refused = |r: Result<Lease, LockError>| matches!(r, Err(e) if e.is_contended());

    // A plain old-store leader keeps phase `old` and `dual` out.
    let plain = old.campaign(&name, ttl, soon()).await.unwrap();
    assert!(refused(on_old.campaign(&name, ttl, soon()).await));
    assert!(refused(on_dual.campaign(&name, ttl, soon()).await));
    assert!(
        new.leader(&name).await.unwrap().is_none(),
        "dual left a new-side candidate"
    );
    assert!(old.release(&plain).await.unwrap());

    // A dual leader keeps out old, new and plain candidates of both stores.
    let dual = on_dual.campaign(&name, ttl, soon()).await.unwrap();
    assert!(refused(old.campaign(&name, ttl, soon()).await));
    assert!(refused(new.campaign(&name, ttl, soon()).await));
    assert!(refused(on_new.campaign(&name, ttl, soon()).await));
    let seen = on_dual.leader(&name).await.unwrap().unwrap();
    assert_eq!(seen.term, Some(dual.token()));
    on_dual.renew(&dual).await.unwrap();
    assert!(on_dual.release(&dual).await.unwrap());

    // Phase `new` (cut over) and plain new-store candidates exclude each other.
    let newest = on_new.campaign(&name, ttl, soon()).await.unwrap();
    assert!(newest.token() > dual.token());
    assert!(refused(new.campaign(&name, ttl, soon()).await));
    assert!(on_new.release(&newest).await.unwrap());
    let plain_new = new.campaign(&name, ttl, soon()).await.unwrap();
    assert!(refused(on_new.campaign(&name, ttl, soon()).await));
    assert!(new.release(&plain_new).await.unwrap());
}
