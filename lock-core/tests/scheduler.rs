//! The renewal scheduler with many guards: session signals reach exactly
//! the guards of that session (one channel shared by all, or one channel
//! per grant as etcd has), and many guards renew in few `renew_many` calls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core as under_test;
use lock_core::{
    Lease, LockBackend, LockClient, LockError, LockState, MemoryBackend, SessionState, async_trait,
};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout};

mod support;
use support::{Double, Twist};

/// Grants carry a session channel: one shared by all (`per_grant` false)
/// or a fresh one per grant, whose senders are kept in `senders`.
#[derive(Debug)]
struct Sessions {
    shared: watch::Sender<SessionState>,
    per_grant: bool,
    senders: Mutex<Vec<watch::Sender<SessionState>>>,
    renew_calls: AtomicU64,
}

#[async_trait]
impl Twist for Sessions {
    const NAME: &'static str = "sessions";

    fn granted(&self, lease: Lease) -> Lease {
        if self.per_grant {
            let (tx, rx) = watch::channel(SessionState::Alive);
            self.senders.lock().unwrap().push(tx);
            lease.with_session(rx)
        } else {
            lease.with_session(self.shared.subscribe())
        }
    }

    async fn renew_many(
        &self,
        memory: &MemoryBackend,
        leases: &[&Lease],
    ) -> Vec<Result<Instant, LockError>> {
        self.renew_calls.fetch_add(1, Ordering::Relaxed);
        memory.renew_many(leases).await
    }
}

fn backend(per_grant: bool) -> Arc<Double<Sessions>> {
    Arc::new(Double::new(
        MemoryBackend::new(),
        Sessions {
            shared: watch::channel(SessionState::Alive).0,
            per_grant,
            senders: Mutex::new(Vec::new()),
            renew_calls: AtomicU64::new(0),
        },
    ))
}

const GUARDS: usize = 200;

async fn settle_until(what: impl Fn() -> bool) {
    timeout(Duration::from_secs(2), async {
        while !what() {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the scheduler applied the session signal");
}

#[tokio::test]
async fn a_shared_session_moves_every_guard_and_many_guards_renew_in_few_calls() {
    let backend = backend(false);
    let client = LockClient::from_arc(backend.clone());
    let ttl = Duration::from_millis(600);
    let mut guards = Vec::new();
    for i in 0..GUARDS {
        guards.push(
            client
                .lock(format!("s/{i}"))
                .ttl(ttl)
                .acquire()
                .await
                .unwrap(),
        );
    }
    // Two renewal periods: every guard renewed, in a handful of calls.
    sleep(ttl * 2 / 3 + Duration::from_millis(50)).await;
    assert!(guards.iter().all(|g| g.state() == LockState::Held));
    let calls = backend.renew_calls.load(Ordering::Relaxed);
    assert!(
        (1..=12).contains(&calls),
        "{calls} renew_many calls for {GUARDS} guards"
    );
    backend.shared.send(SessionState::Suspect).unwrap();
    settle_until(|| guards.iter().all(|g| g.state() == LockState::Suspect)).await;
    backend.shared.send(SessionState::Alive).unwrap();
    settle_until(|| guards.iter().all(|g| g.state() == LockState::Held)).await;
    backend
        .shared
        .send(SessionState::Lost("expired".into()))
        .unwrap();
    settle_until(|| {
        guards
            .iter()
            .all(|g| matches!(g.state(), LockState::Lost(_)))
    })
    .await;
}

#[tokio::test]
async fn a_session_per_grant_moves_only_its_own_guard() {
    let backend = backend(true);
    let client = LockClient::from_arc(backend.clone());
    let mut guards = Vec::new();
    for i in 0..GUARDS {
        let guard = client
            .lock(format!("p/{i}"))
            .ttl(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        guards.push(guard);
    }
    // Release a few so their session slots are reused by later grants.
    for guard in guards.drain(..10) {
        assert!(guard.release().await.unwrap());
    }
    for i in 0..10 {
        guards.push(
            client
                .lock(format!("q/{i}"))
                .ttl(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap(),
        );
    }
    let senders = backend.senders.lock().unwrap().clone();
    // Grant 57's channel (the 47th held guard: the first 10 were released).
    senders[57].send(SessionState::Lost("gone".into())).unwrap();
    settle_until(|| matches!(guards[47].state(), LockState::Lost(_))).await;
    // The last grant (on a reused slot) hears its own channel.
    senders[GUARDS + 9].send(SessionState::Suspect).unwrap();
    settle_until(|| guards[GUARDS - 1].state() == LockState::Suspect).await;
    sleep(Duration::from_millis(50)).await;
    for (i, guard) in guards.iter().enumerate() {
        if i != 47 && i != GUARDS - 1 {
            assert_eq!(guard.state(), LockState::Held, "guard {i}");
        }
    }
    // A released grant's channel moves nothing. The scheduler keeps the
    // channels of a few sessions without guards (for the next grant on the
    // same session) and lets go of older ones: of the 10 released grants'
    // channels, the oldest have no receiver left.
    settle_until(|| senders[0].receiver_count() == 0).await;
    senders[3].send_replace(SessionState::Lost("old".into()));
    sleep(Duration::from_millis(50)).await;
    assert_eq!(guards[0].state(), LockState::Held);
}
