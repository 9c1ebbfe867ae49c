use super::*;
use crate::{LockClient, LockGuard, MemoryBackend, RenewalRuntime};

use crate::support::{Double, Twist};

const CYCLES: u64 = 1_000;

/// Taken by the tests that time renewals or count wake-ups on the
/// renewal thread: one at a time, so that none's load (a thousand
/// wake-ups, a 30 ms lock renewed every 10 ms) lands in another's
/// measuring window on a small machine.
static TIMING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A fresh memory backend, a client over it, and the scheduler that
/// client's guards register with: on the dedicated renewal thread, or
/// with `here`, on the test's own (current-thread) runtime.
fn setup_on(here: bool) -> (LockClient, Arc<Scheduler>) {
    let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
    let runtime = if here {
        RenewalRuntime::current()
    } else {
        RenewalRuntime::dedicated()
    };
    let scheduler = Scheduler::shared_for(&backend, &runtime.handle().unwrap());
    let client = LockClient::from_arc(backend).with_renewal_runtime(runtime);
    (client, scheduler)
}

fn setup() -> (LockClient, Arc<Scheduler>) {
    setup_on(false)
}

/// `CYCLES` acquire+release cycles of 10 s-TTL locks, each followed by
/// a pause in which the scheduler's task gets to run (a network round
/// trip would leave one): a yield on a current-thread runtime (the task
/// then runs between every two cycles, deterministically), or a short
/// sleep of the test's thread with the task on the renewal thread.
/// Returns the task's wake-ups and the notifications sent to it during
/// the loop.
async fn hot_loop(client: &LockClient, scheduler: &Scheduler, yields: bool) -> (u64, u64) {
    let cycle = || async {
        let guard = held(client, "hot", Duration::from_secs(10)).await;
        assert!(guard.release().await.unwrap());
        if yields {
            tokio::task::yield_now().await;
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    };
    // The first cycle starts the task.
    cycle().await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let wakeups = scheduler.wakeups.load(Ordering::Relaxed);
    let notifications = scheduler.notifications.load(Ordering::Relaxed);
    for _ in 0..CYCLES {
        cycle().await;
    }
    (
        scheduler.wakeups.load(Ordering::Relaxed) - wakeups,
        scheduler.notifications.load(Ordering::Relaxed) - notifications,
    )
}

/// Few wake-ups: at most one per tick (100 ms) while the loop runs,
/// plus a few, and far below one per cycle.
fn assert_few(wakeups: u64, notifications: u64, elapsed: Duration) {
    let ticks = u64::try_from(elapsed.as_millis() / 100).unwrap_or(u64::MAX);
    assert!(
        wakeups <= ticks + 5 && wakeups < CYCLES / 20,
        "{wakeups} wake-ups in {CYCLES} cycles ({elapsed:?})"
    );
    // No notification: each guard's first timer lies beyond the tick.
    assert!(
        notifications <= 2,
        "{notifications} notifications in {CYCLES} cycles"
    );
}

/// What each held lock costs in lock-core's own structures (issue #13:
/// at most 400 bytes a held lock with a driver's share on top). Before
/// the diet: a slot of 64 bytes, a guard of 32, a lease of 112 and the
/// guard's shared state of 144 (a `u128` owner aligned leases to 16
/// bytes, the TTL was a 16-byte `Duration`).
/// The lease's kind (read, write, permits) added 8 bytes to the lease and
/// its shared state: boxed, and absent for a mutex.
/// (Sizes as laid out on 64-bit Linux, where they were measured.)
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
#[test]
fn per_lock_structures_stay_small() {
    use std::mem::{align_of, size_of};
    assert_eq!(size_of::<Slot>(), 48);
    assert_eq!(size_of::<LockGuard>(), 24);
    assert_eq!(size_of::<crate::OwnerId>(), 16);
    assert_eq!(align_of::<crate::Lease>(), 8);
    assert_eq!(size_of::<crate::Lease>(), 104);
    assert_eq!(size_of::<Shared>(), 136);
}

#[tokio::test(flavor = "current_thread")]
async fn a_hot_acquire_release_loop_rarely_wakes_the_scheduler() {
    let (client, scheduler) = setup_on(true);
    let started = Instant::now();
    let (wakeups, notifications) = hot_loop(&client, &scheduler, true).await;
    let elapsed = started.elapsed();
    println!("{CYCLES} cycles in {elapsed:?}: {wakeups} wake-ups, {notifications} notifications");
    assert_few(wakeups, notifications, elapsed);

    // The behaviour before ticks (a linger of zero): the task goes to
    // an unbounded sleep whenever it finds its queue empty, and the
    // next registration wakes it: here once per cycle.
    let (client, scheduler) = setup_on(true);
    scheduler.lock().linger = 0;
    let (wakeups, notifications) = hot_loop(&client, &scheduler, true).await;
    println!("without ticks: {wakeups} wake-ups, {notifications} notifications");
    assert!(
        notifications >= CYCLES * 9 / 10 && wakeups >= CYCLES * 9 / 10,
        "without ticks: {wakeups} wake-ups, {notifications} notifications"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_loop_rarely_wakes_the_dedicated_renewal_thread() {
    let _timing = TIMING.lock().await;
    let (client, scheduler) = setup();
    let started = Instant::now();
    let (wakeups, notifications) = hot_loop(&client, &scheduler, false).await;
    let elapsed = started.elapsed();
    println!("{CYCLES} cycles in {elapsed:?}: {wakeups} wake-ups, {notifications} notifications");
    assert_few(wakeups, notifications, elapsed);
}

/// The memory backend with every grant attached to one session
/// channel, as a session backend (SQL session mode, ZooKeeper) hands
/// out the channel of the connection the lock lives in.
#[derive(Debug)]
struct OneSession {
    session: std::sync::Mutex<watch::Sender<SessionState>>,
}

impl OneSession {
    fn subscribe(&self) -> watch::Receiver<SessionState> {
        self.session.lock().unwrap().subscribe()
    }

    /// Grants from now on live on a new session (the old one stays open).
    fn new_session(&self) -> watch::Sender<SessionState> {
        let (tx, _) = watch::channel(SessionState::Alive);
        std::mem::replace(&mut *self.session.lock().unwrap(), tx)
    }
}

#[async_trait::async_trait]
impl Twist for OneSession {
    const NAME: &'static str = "one-session";

    fn granted(&self, lease: crate::Lease) -> crate::Lease {
        lease.with_session(self.subscribe())
    }
}

/// A renewal thread of the test's own (a current-thread runtime),
/// stopped when the sender is dropped: the process-wide dedicated
/// thread is shared by every test, whose load would blur timings here
/// (and this test's wake-ups theirs).
fn own_renewal_thread() -> (RenewalRuntime, tokio::sync::oneshot::Sender<()>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let handle = runtime.handle().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = runtime.block_on(stopped);
    });
    (RenewalRuntime::from_handle(handle), stop)
}

/// A client over a [`OneSession`] backend renewing on a thread of its
/// own, its scheduler and backend, and the thread's stop.
fn session_setup(
    idle_limit: usize,
) -> (
    LockClient,
    Arc<Scheduler>,
    Arc<Double<OneSession>>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (session, _) = watch::channel(SessionState::Alive);
    let one = Arc::new(Double::new(
        MemoryBackend::new(),
        OneSession {
            session: std::sync::Mutex::new(session),
        },
    ));
    let backend: Arc<dyn LockBackend> = one.clone();
    let (runtime, stop) = own_renewal_thread();
    let scheduler = Scheduler::shared_for(&backend, &runtime.handle().unwrap());
    scheduler.lock().idle_limit = idle_limit;
    let client = LockClient::from_arc(backend).with_renewal_runtime(runtime);
    (client, scheduler, one, stop)
}

/// Every guard of a hot loop lives on the same session channel: the
/// session's slot and watcher outlive its last guard, so registering the
/// next one does not wake the task. With idle sessions freed at once
/// (the previous behaviour) each cycle's guard was a new session and
/// woke the task to arm a watcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_loop_on_one_session_rarely_wakes_the_renewal_thread() {
    let _timing = TIMING.lock().await;
    let (client, scheduler, _one, _stop) = session_setup(IDLE_SESSIONS);
    let started = Instant::now();
    let (wakeups, notifications) = hot_loop(&client, &scheduler, false).await;
    let elapsed = started.elapsed();
    println!(
        "one session, {CYCLES} cycles in {elapsed:?}: {wakeups} wake-ups, {notifications} notifications"
    );
    assert_few(wakeups, notifications, elapsed);

    let (client, scheduler, _one, _stop) = session_setup(0);
    let (wakeups, notifications) = hot_loop(&client, &scheduler, false).await;
    println!("idle sessions freed: {wakeups} wake-ups, {notifications} notifications");
    assert!(
        notifications >= CYCLES * 9 / 10,
        "idle sessions freed: {notifications} notifications in {CYCLES} cycles"
    );
}

/// Lets the task go to a long sleep (linger over, nothing registered),
/// then makes registrations never notify it (the
/// deliberately broken variant), takes a guard on the session, ends the
/// session, and returns how long the guard took to read `Lost` (`None`:
/// not within 500 ms). Only a watcher the task armed before can tell it.
async fn lost_unnotified(
    client: &LockClient,
    scheduler: &Scheduler,
    one: &OneSession,
) -> Option<Duration> {
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_sleeps_long(scheduler);
    scheduler.lock().never_notify = true;
    let guard = held(client, "on-session", Duration::from_secs(10)).await;
    let ended = Instant::now();
    one.session
        .lock()
        .unwrap()
        .send_replace(SessionState::Lost("connection closed".to_owned()));
    while ended.elapsed() < Duration::from_millis(500) {
        if matches!(guard.state(), crate::LockState::Lost(_)) {
            return Some(ended.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    None
}

/// A guard on a session kept idle (its watcher armed for an earlier
/// guard, now released) turns `Lost` at once when the session ends,
/// without its registration waking the task. Controls: with idle
/// sessions freed (the previous behaviour) or on a session no guard
/// used before (a new connection's), the same unnotified registration
/// is not told: there the registration's notification is what arms the
/// watcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_on_a_reused_idle_session_sees_the_session_end_at_once() {
    let _timing = TIMING.lock().await;
    for (idle_limit, same_session, expect_seen) in [
        (IDLE_SESSIONS, true, true),
        (0, true, false),
        (IDLE_SESSIONS, false, false),
    ] {
        let (client, scheduler, one, _stop) = session_setup(idle_limit);
        scheduler.lock().linger = duration_ns(Duration::from_millis(50));
        let first = held(&client, "on-session", Duration::from_secs(10)).await;
        // The task armed a watcher on the session (it runs on the
        // shared renewal thread, which other tests keep busy).
        settle_until(|| scheduler.lock().sessions.iter().any(|s| s.watched)).await;
        assert!(first.release().await.unwrap());
        let _old = (!same_session).then(|| one.new_session());
        let lost = lost_unnotified(&client, &scheduler, &one).await;
        let case = format!("idle limit {idle_limit}, same session {same_session}");
        if expect_seen {
            // At once: the task woke on the session's change (the guard's
            // 10 s TTL is far away); margin for a busy renewal thread.
            assert!(
                lost.is_some_and(|d| d < Duration::from_millis(250)),
                "{case}: lost after {lost:?}"
            );
        } else {
            assert_eq!(lost, None, "{case}: the guard saw the session end");
        }
    }
}

/// A guard on `name` with `ttl`, on `client`.
async fn held(client: &LockClient, name: &str, ttl: Duration) -> LockGuard {
    client.lock(name).ttl(ttl).acquire().await.unwrap()
}

/// The task plans its next wake-up seconds away (a 10 s lock's renewal).
fn assert_sleeps_long(scheduler: &Scheduler) {
    let planned = scheduler.lock().planned_wake;
    assert!(
        from_ns(planned) > Instant::now() + Duration::from_secs(2),
        "the task should sleep long now"
    );
}

async fn settle_until(what: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(5);
    while !what() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(what(), "condition not reached");
}

/// Watches `guard` for `span`, looking every `step`: whether it was held
/// throughout, and how many times its validity deadline moved (renewals).
async fn watch_renewals(guard: &LockGuard, span: Duration, step: Duration) -> (bool, u32) {
    let mut renewals = 0;
    let mut deadline = guard.validity_deadline();
    let until = Instant::now() + span;
    while Instant::now() < until {
        if !guard.is_held() {
            return (false, renewals);
        }
        let now = guard.validity_deadline();
        if now > deadline {
            renewals += 1;
            deadline = now;
        }
        tokio::time::sleep(step).await;
    }
    (true, renewals)
}

/// Holds a 10 s-TTL lock, lets registrations grow old (past the linger,
/// so the task sleeps until that lock's renewal, seconds away), then
/// takes a 30 ms-TTL lock and watches it for 300 ms. Returns whether it
/// was held throughout, with its renewals.
async fn short_ttl_after_a_long_sleep(never_notify: bool) -> (bool, u32) {
    let (client, scheduler) = setup();
    scheduler.lock().linger = duration_ns(Duration::from_millis(50));
    let long = held(&client, "long", Duration::from_secs(10)).await;
    // Past the linger and one more tick: the task plans its next
    // wake-up at the long lock's renewal.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_sleeps_long(&scheduler);
    scheduler.lock().never_notify = never_notify;
    let short = held(&client, "short", Duration::from_millis(30)).await;
    let (held, renewals) =
        watch_renewals(&short, Duration::from_millis(300), Duration::from_millis(1)).await;
    drop(short);
    assert!(long.release().await.unwrap());
    (held, renewals)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_ttl_lock_registered_while_the_scheduler_sleeps_long_is_renewed() {
    let _timing = TIMING.lock().await;
    let (held, renewals) = short_ttl_after_a_long_sleep(false).await;
    assert!(held, "the 30 ms lock was lost ({renewals} renewals)");
    assert!(
        renewals >= 5,
        "only {renewals} renewals in 300 ms of a 30 ms lock"
    );

    // Control: a registration that does not notify the sleeping task
    // (the deliberately broken variant) loses the short lock.
    let (held, renewals) = short_ttl_after_a_long_sleep(true).await;
    assert!(
        !held,
        "without notification the 30 ms lock was still held ({renewals})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_ttl_lock_registered_between_ticks_is_renewed_and_idle_stops_ticking() {
    let _timing = TIMING.lock().await;
    let (client, scheduler) = setup();
    scheduler.lock().linger = duration_ns(Duration::from_millis(100));
    let long = held(&client, "long", Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The task ticks (at most 100 ms); the 30 ms lock's first renewal
    // is due before the next tick.
    let short = held(&client, "short", Duration::from_millis(30)).await;
    let first = short.validity_deadline();
    settle_until(|| short.validity_deadline() > first + Duration::from_millis(60)).await;
    assert!(short.is_held());
    assert!(short.release().await.unwrap());
    assert!(long.release().await.unwrap());

    // Nothing registered and the linger over: the task sleeps until
    // notified, it does not tick.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let wakeups = scheduler.wakeups.load(Ordering::Relaxed);
    assert_eq!(scheduler.lock().planned_wake, NEVER);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(scheduler.wakeups.load(Ordering::Relaxed), wakeups);
    // And the next registration wakes it (it must arm the timers).
    let again: LockGuard = held(&client, "long", Duration::from_secs(10)).await;
    settle_until(|| scheduler.wakeups.load(Ordering::Relaxed) > wakeups).await;
    assert!(again.release().await.unwrap());
}

/// While the task ticks, takes a 600 ms lock that renews (first renewal
/// due at about 200 ms, beyond the tick) and one that does not, both kept
/// pending instead of queued, and watches them for 1.2 s. Returns whether
/// the renewed one was held throughout, its renewals, whether the task
/// announced the unrenewed one `Lost` on its channel (not a look at its
/// state past the deadline), and the notifications the two sent.
async fn pending_registrations(never_admit: bool) -> (bool, u32, bool, u64) {
    let (client, scheduler) = setup();
    let long = held(&client, "long", Duration::from_secs(10)).await;
    settle_until(|| scheduler.lock().planned_wake != NEVER).await;
    scheduler.lock().never_admit = never_admit;
    let notifications = scheduler.notifications.load(Ordering::Relaxed);
    let ttl = Duration::from_millis(600);
    let renewed = held(&client, "renewed", ttl).await;
    let unrenewed = client
        .lock("unrenewed")
        .ttl(ttl)
        .no_renewal()
        .acquire()
        .await
        .unwrap();
    let notifications = scheduler.notifications.load(Ordering::Relaxed) - notifications;
    let mut states = unrenewed.subscribe();
    let announced = tokio::spawn(async move {
        loop {
            if matches!(*states.borrow_and_update(), LockState::Lost(_)) {
                return true;
            }
            if states.changed().await.is_err() {
                return false;
            }
        }
    });
    let (held_throughout, renewals) = watch_renewals(
        &renewed,
        Duration::from_millis(1200),
        Duration::from_millis(5),
    )
    .await;
    announced.abort();
    let lost = matches!(announced.await, Ok(true));
    drop((renewed, unrenewed));
    assert!(long.release().await.unwrap());
    (held_throughout, renewals, lost, notifications)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_registrations_are_renewed_and_lost_on_time() {
    let _timing = TIMING.lock().await;
    let (held, renewals, lost, notifications) = pending_registrations(false).await;
    assert_eq!(notifications, 0, "both were kept pending, nobody woken");
    assert!(
        held,
        "the renewed 600 ms lock was lost ({renewals} renewals)"
    );
    assert!(renewals >= 3, "only {renewals} renewals in 1.2 s");
    assert!(lost, "the task did not announce the unrenewed lock lost");

    // Control: pending registrations never admitted (the deliberately
    // broken variant): the renewed lock runs out, and nobody announces
    // the unrenewed one.
    let (held, renewals, lost, _) = pending_registrations(true).await;
    println!("never admitted: held {held}, {renewals} renewals, announced lost {lost}");
    assert!(!held && renewals == 0 && !lost);
}

/// A burst of long grants keeps at most `MAX_PENDING` of them pending (the
/// rest go straight into the queue), and every one of them, pending or
/// queued, is released. Control: with no limit (the deliberately broken
/// variant) the same burst leaves more than `MAX_PENDING` pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_grants_keeps_the_pending_list_short() {
    let _timing = TIMING.lock().await;
    let longest = longest_pending(MAX_PENDING).await;
    println!(
        "longest pending list: {longest} of {} grants",
        3 * MAX_PENDING
    );
    assert!(
        longest > 0,
        "no grant was kept pending: the check sees nothing"
    );
    assert!(longest <= MAX_PENDING, "{longest} pending registrations");

    let unlimited = longest_pending(usize::MAX).await;
    println!("with no limit: {unlimited} pending");
    assert!(unlimited > MAX_PENDING, "the broken variant was not caught");
}

/// The longest pending list while a burst of `3 * MAX_PENDING` grants of
/// 30 s is taken with `limit`; then releases them all and checks nothing
/// stays registered.
async fn longest_pending(limit: usize) -> usize {
    let (client, scheduler) = setup();
    // Wake the task first so that it ticks and plans to wake before the
    // burst's first timers (its first pass may come late on a busy
    // machine: until then every registration goes into the queue).
    let first = held(&client, "first", Duration::from_secs(30)).await;
    settle_until(|| scheduler.lock().planned_wake != NEVER).await;
    scheduler.lock().pending_limit = limit;
    let burst = 3 * MAX_PENDING;
    let mut guards = Vec::with_capacity(burst);
    let mut longest = 0;
    for i in 0..burst {
        guards.push(held(&client, &format!("burst-{i}"), Duration::from_secs(30)).await);
        longest = longest.max(scheduler.lock().pending.len());
    }
    for guard in guards {
        assert!(guard.release().await.unwrap());
    }
    assert!(first.release().await.unwrap());
    let st = scheduler.lock();
    assert!(
        st.pending.is_empty() && st.live == 0,
        "a released grant stayed registered"
    );
    longest
}
