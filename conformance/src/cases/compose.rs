//! Cases on locks composed in lock-core over any backend's mutex:
//! multi-locks (all or nothing, no partial grant left by a failure or a
//! cancelled acquire; `LockClient` takes a set key by key where the
//! backend has no [`LockSets`](lock_core::LockSets) facet, so these run on
//! every backend), sets taken in one exchange (the facet's atomicity,
//! where the backend has it) and reentrancy by scope (nested, no second
//! grant, never across tasks).

use std::sync::Arc;
use std::time::Duration;

use lock_core::{Facets, GrantRequest, LockClient, LockError, LockSets, LockWrapper};
use tokio::sync::watch;
use tokio::time::{Instant, timeout};

use crate::harness::Harness;

use super::*;

/// Whether `key` can be taken right now by `client` (and gives it back).
async fn is_free(client: &dyn LockBackend, key: &LockKey, ttl: Duration) -> Result<bool, String> {
    match client.try_acquire(key, ttl).await.map_err(fmt_err("try"))? {
        Some(lease) => {
            client.release(&lease).await.map_err(fmt_err("release"))?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// A multi-lock takes every key or none: refused while one key is held,
/// cancelled half way, or timed out, it leaves none of its keys held (by
/// its keys' TTL at the latest); two clients with overlapping sets in
/// opposite orders both finish.
pub async fn multi_lock_is_all_or_nothing(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let ttl = h.ttl_for(&a.capabilities()).max(Duration::from_secs(2));
    let margin = h.config().margin;
    let keys = [h.key("multi-a"), h.key("multi-b"), h.key("multi-c")];
    let names: Vec<&str> = keys.iter().map(LockKey::as_str).collect();
    let (ca, cb) = (
        LockClient::from_arc(a.clone()),
        LockClient::from_arc(b.clone()),
    );
    let blocker = take_free(&*b, &keys[2], ttl * 10).await?;
    // Refused: the free keys stay free.
    let refused = ca
        .lock_all(names.iter().copied())
        .ttl(ttl)
        .try_acquire()
        .await
        .map_err(fmt_err("try lock_all"))?;
    ensure!(refused.is_none(), "lock_all granted a set with a held key");
    for key in &keys[..2] {
        ensure!(
            is_free(&*b, key, ttl).await?,
            "a refused lock_all left {key} held"
        );
    }
    // Cancelled half way, then timed out.
    let waiting = ca
        .lock_all(names.iter().copied())
        .ttl(ttl)
        .wait(Duration::from_secs(30))
        .acquire();
    ensure!(
        timeout(Duration::from_millis(300), waiting).await.is_err(),
        "lock_all finished while a key was held"
    );
    let timed_out = ca
        .lock_all(names.iter().copied())
        .ttl(ttl)
        .wait(Duration::from_millis(300))
        .acquire()
        .await;
    ensure!(
        matches!(&timed_out, Err(e) if e.is_contended()),
        "a timed-out lock_all gave {:?}",
        timed_out.map(|g| g.keys())
    );
    let by = Instant::now() + ttl + margin;
    for key in &keys[..2] {
        let lease = b
            .acquire(key, ttl, by)
            .await
            .map_err(|e| format!("{key} still held after cancelled lock_alls: {e}"))?;
        b.release(&lease).await.map_err(fmt_err("release"))?;
    }
    b.release(&blocker).await.map_err(fmt_err("release"))?;
    // Overlapping sets in opposite orders both finish.
    let reversed: Vec<&str> = names.iter().rev().copied().collect();
    let run = |c: LockClient, set: Vec<String>| async move {
        for _ in 0..5 {
            let guard = c
                .lock_all(set.iter())
                .ttl(ttl)
                .wait(Duration::from_secs(20))
                .acquire()
                .await?;
            guard.release().await?;
        }
        Ok::<(), lock_core::LockError>(())
    };
    let set_a: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
    let set_b: Vec<String> = reversed.iter().map(|s| (*s).to_owned()).collect();
    let both = timeout(
        Duration::from_secs(60),
        futures_join(run(ca, set_a), run(cb, set_b)),
    )
    .await
    .map_err(|_| "two overlapping lock_alls deadlocked".to_owned())?;
    both.0.map_err(fmt_err("lock_all a"))?;
    both.1.map_err(fmt_err("lock_all b"))?;
    Ok(Outcome::Passed(
        "refused, cancelled and timed-out sets left nothing; overlapping sets finished".into(),
    ))
}

/// A set taken in one exchange (the [`LockSets`](lock_core::LockSets)
/// facet, where the backend has it) is all or nothing: refused while one
/// key is held, it grants none of the others; granted, every key is held
/// with its own lease (in the order asked, each with a token above that
/// key's last one where the backend fences) that renews and releases like any other; and two
/// clients racing for overlapping sets never both win, nor leave the
/// loser's other key held. A set the facet refuses as a whole
/// (`Unsupported`, allowed for a set it cannot take in one exchange) skips
/// the case, saying so.
pub async fn lock_sets_are_atomic(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    if a.facets().lock_sets.is_none() {
        return Ok(super::without_facet(
            "LockSets",
            "try_acquire_all; multi-locks are taken key by key",
        ));
    }
    let caps = a.capabilities();
    let ttl = h.ttl_for(&caps).max(Duration::from_secs(5));
    let keys = lock_core::lock_order(&[h.key("set-a"), h.key("set-b"), h.key("set-c")]);
    // Refused while one key is held: none of the others taken.
    let blocker = take_free(&*b, &keys[2], ttl).await?;
    match a.try_acquire_all(&keys, ttl).await {
        Ok(None) => {}
        Ok(Some(leases)) => {
            for lease in &leases {
                let _ = a.release(lease).await;
            }
            let _ = b.release(&blocker).await;
            return Err(format!(
                "a set was granted while {} was held by another client",
                keys[2]
            ));
        }
        Err(e) if e.kind() == lock_core::ErrorKind::Unsupported => {
            let _ = b.release(&blocker).await;
            return Ok(Outcome::Skipped(format!(
                "the LockSets facet refused this set as a whole: {e}"
            )));
        }
        Err(e) => return Err(format!("try_acquire_all: {e}")),
    }
    // Each key's last token before the set: the blocker's, and those of a
    // grant of each other key (free, or the refused set left it held).
    let mut last = vec![blocker.token()];
    for key in keys[..2].iter().rev() {
        let probe = b
            .try_acquire(key, ttl)
            .await
            .map_err(fmt_err("try_acquire"))?
            .ok_or_else(|| format!("a refused set left {key} held"))?;
        b.release(&probe).await.map_err(fmt_err("release"))?;
        last.insert(0, probe.token());
    }
    ensure!(
        b.release(&blocker).await.map_err(fmt_err("release"))?,
        "the blocker's release said not held"
    );
    // Granted: every key held, in order, renewable and releasable.
    let leases = served(
        a.try_acquire_all(&keys, ttl).await,
        "LockSets",
        "try_acquire_all",
    )?
    .ok_or("a set of free keys was refused")?;
    let asked: Vec<&LockKey> = keys.iter().collect();
    let granted: Vec<&LockKey> = leases.iter().map(Lease::key).collect();
    ensure!(
        granted == asked,
        "a set of {asked:?} was granted as {granted:?}"
    );
    // A fresh token per key (keys of one set may share a value: one
    // transaction's revision, or per-key counters).
    if caps.has_fencing() {
        for (lease, before) in leases.iter().zip(&last) {
            ensure!(
                lease.token() > *before,
                "{} of the set got token {}, not above its last {before}",
                lease.key(),
                lease.token()
            );
        }
    }
    for lease in &leases {
        let info = b
            .inspect(lease.key())
            .await
            .map_err(fmt_err("inspect"))?
            .ok_or_else(|| format!("{} of a granted set has no holder", lease.key()))?;
        if let Some(token) = info.token {
            ensure!(
                token == lease.token(),
                "{} shows token {token}, the set's lease has {}",
                lease.key(),
                lease.token()
            );
        }
        ensure!(
            b.try_acquire(lease.key(), ttl)
                .await
                .map_err(fmt_err("try_acquire"))?
                .is_none(),
            "another client took {} of a granted set",
            lease.key()
        );
    }
    let refs: Vec<&Lease> = leases.iter().collect();
    for (lease, renewed) in leases.iter().zip(a.renew_many(&refs).await) {
        renewed.map_err(|e| format!("renewal of {} of the set: {e}", lease.key()))?;
    }
    for lease in &leases {
        ensure!(
            a.release(lease).await.map_err(fmt_err("release"))?,
            "{} of the set: release said not held",
            lease.key()
        );
    }
    // Racing for overlapping sets: [a, b] against [b, c].
    let (set_a, set_b) = (
        vec![keys[0].clone(), keys[1].clone()],
        vec![keys[1].clone(), keys[2].clone()],
    );
    let mut wins = [0u32; 2];
    for round in 0..20 {
        // Sent together, first one side then the other first.
        let (first, second) = (
            a.try_acquire_all(&set_a, ttl),
            b.try_acquire_all(&set_b, ttl),
        );
        let (got_a, got_b) = if round % 2 == 0 {
            tokio::join!(first, second)
        } else {
            let (got_b, got_a) = tokio::join!(second, first);
            (got_a, got_b)
        };
        let got_a = served(got_a, "LockSets", "try_acquire_all")?;
        let got_b = served(got_b, "LockSets", "try_acquire_all")?;
        let both = got_a.is_some() && got_b.is_some();
        // The loser's key outside the overlap must be free.
        let loser_key = match (&got_a, &got_b) {
            (Some(_), None) => Some(&keys[2]),
            (None, Some(_)) => Some(&keys[0]),
            _ => None,
        };
        let free = match loser_key {
            Some(key) => is_free(&*a, key, ttl).await?,
            None => true,
        };
        for (client, got) in [(&a, &got_a), (&b, &got_b)] {
            for lease in got.iter().flatten() {
                let _ = client.release(lease).await;
            }
        }
        ensure!(!both, "round {round}: both overlapping sets were granted");
        ensure!(
            free,
            "round {round}: the losing set left {} held",
            loser_key.map_or("?", |k| k.as_str())
        );
        wins[0] += u32::from(got_a.is_some());
        wins[1] += u32::from(got_b.is_some());
    }
    ensure!(
        wins[0] + wins[1] > 0,
        "20 races for overlapping free sets: no set was ever granted"
    );
    Ok(Outcome::Passed(format!(
        "refused set took nothing; granted set held, renewed, released; races won {wins:?}, never both"
    )))
}

/// A client that says when it is granted `key`: the multi-lock's client in
/// [`multi_lock_keeps_its_first_keys_while_waiting`], so that the other
/// client contends for the first key only once the multi-lock holds it.
#[derive(Debug)]
struct SaysWhenGranted {
    inner: Arc<dyn LockBackend>,
    key: LockKey,
    granted: watch::Sender<bool>,
}

impl SaysWhenGranted {
    fn saw<'a>(&self, mut leases: impl Iterator<Item = &'a Lease>) {
        if leases.any(|lease| *lease.key() == self.key) {
            self.granted.send_replace(true);
        }
    }
}

/// Every grant a multi-lock takes a key with (through the kernel, or a
/// whole set through the LockSets facet); everything else goes to the
/// inner client unchanged (its batched `renew_many` included).
#[lock_core::async_trait]
impl LockWrapper for SaysWhenGranted {
    fn inner(&self) -> &dyn LockBackend {
        &*self.inner
    }
    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let granted = self.inner.grant(request).await?;
        self.saw(granted.iter());
        Ok(granted)
    }
    fn facets(&self) -> Facets<'_> {
        let inner = self.inner.facets();
        Facets {
            lock_sets: inner.lock_sets.map(|_| self as &dyn LockSets),
            ..inner
        }
    }
}

#[lock_core::async_trait]
impl LockSets for SaysWhenGranted {
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        let granted = self.inner.try_acquire_all(keys, ttl).await?;
        self.saw(granted.iter().flatten());
        Ok(granted)
    }
}

/// While a multi-lock waits for a later key, the keys it already took stay
/// its own: once the multi-lock holds its first key, another client that
/// holds the later key for 2.5 TTLs and keeps trying the first one never
/// gets it, and the set is handed out held (the keys taken first are
/// renewed while the later ones are waited for).
pub async fn multi_lock_keeps_its_first_keys_while_waiting(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    // At least 2 s: the first key lives on its renewals alone, which must
    // keep up on a loaded machine (each is due a third of a TTL early).
    let ttl = h.ttl_for(&a.capabilities()).max(Duration::from_secs(2));
    let margin = h.config().margin;
    // In lock order: `first` is taken, then `later` is waited for.
    let (first, later) = (h.key("keep-a"), h.key("keep-b"));
    let hold = ttl * 5 / 2;
    // How long the multi-lock may take to be granted its (free) first key;
    // a few round trips normally, more on a loaded machine.
    let settle = ttl * 5;
    let blocker = take_free(&*b, &later, settle + hold + ttl * 4).await?;
    let (granted, mut first_granted) = watch::channel(false);
    let ca = LockClient::from_arc(Arc::new(SaysWhenGranted {
        inner: a.clone(),
        key: first.clone(),
        granted,
    }));
    let waiting = ca
        .lock_all([first.as_str(), later.as_str()])
        .ttl(ttl)
        .wait(settle + hold + ttl * 2 + margin)
        .acquire();
    let contender = async {
        // Trying the first key before the multi-lock has it would take the
        // free key ahead of the multi-lock, which then only waits for it:
        // that says nothing about keeping a key.
        let seen = matches!(
            timeout(settle, first_granted.wait_for(|granted| *granted)).await,
            Ok(Ok(_))
        );
        if !seen {
            b.release(&blocker).await.map_err(fmt_err("release"))?;
            return Err(format!(
                "the multi-lock was not granted {first}, its first key in lock order, within {settle:?}"
            ));
        }
        let until = Instant::now() + hold;
        let mut stolen = None;
        while stolen.is_none() && Instant::now() < until {
            stolen = b
                .try_acquire(&first, ttl)
                .await
                .map_err(fmt_err("try the first key"))?;
            tokio::time::sleep(ttl / 10).await;
        }
        b.release(&blocker).await.map_err(fmt_err("release"))?;
        Ok::<_, String>(stolen)
    };
    let (set, stolen) = futures_join(waiting, contender).await;
    if let Some(stolen) = stolen? {
        let _ = b.release(&stolen).await;
        let outcome = match set {
            Ok(set) => {
                let _ = set.release().await;
                "granted".to_owned()
            }
            Err(e) => format!("failed: {e}"),
        };
        return Err(format!(
            "another client took {first} while the multi-lock that held it waited for {later} (the multi-lock {outcome})"
        ));
    }
    let set = set.map_err(fmt_err("lock_all"))?;
    let state = set.state();
    let held = set.is_held();
    let released = set.release().await.map_err(fmt_err("release the set"))?;
    ensure!(
        held,
        "lock_all handed out a set that is not held: {state:?}"
    );
    ensure!(
        released,
        "a key of the set was no longer ours at its release"
    );
    for key in [&first, &later] {
        ensure!(
            is_free(&*b, key, ttl).await?,
            "{key} was left held after the set's release"
        );
    }
    Ok(Outcome::Passed(format!(
        "the first key stayed ours through a {hold:?} wait for the second"
    )))
}

async fn futures_join<A: std::future::Future, B: std::future::Future>(
    a: A,
    b: B,
) -> (A::Output, B::Output) {
    tokio::join!(a, b)
}

/// Inside a guard's scope, asking for the same lock gives a nested guard
/// with the same token and no second grant; a task spawned there waits
/// like any other client.
pub async fn reentrant_scope_nests(h: &Harness) -> CaseResult {
    let (a, _) = two_clients(h).await?;
    let ttl = h.ttl_for(&a.capabilities()).max(Duration::from_secs(2));
    let key = h.key("reentrant");
    let client = LockClient::from_arc(a);
    let outer = client
        .lock(key.as_str())
        .ttl(ttl)
        .acquire()
        .await
        .map_err(fmt_err("lock"))?;
    let c = client.clone();
    let name = key.as_str().to_owned();
    let (token, nested, other_task) = outer
        .scope(async move {
            let again = c.lock(&name).ttl(ttl).acquire().await?;
            let c2 = c.clone();
            let spawned = tokio::spawn(async move { c2.lock(&name).ttl(ttl).try_acquire().await })
                .await
                .map_err(|e| lock_core::LockError::config(e.to_string()))??;
            Ok::<_, lock_core::LockError>((again.token(), again.is_nested(), spawned.is_some()))
        })
        .await
        .map_err(fmt_err("inside the scope"))?;
    ensure!(nested, "the same lock inside the scope was not nested");
    ensure!(token == outer.token(), "the nested guard has another token");
    ensure!(
        !other_task,
        "a task spawned inside the scope got the held lock"
    );
    ensure!(
        outer.release().await.map_err(fmt_err("release"))?,
        "the outer guard no longer held after the nesting"
    );
    Ok(Outcome::Passed(
        "nested without a second grant; other tasks excluded".into(),
    ))
}

/// Two clients lock `[a, b]` and `[b, a]` (and a third key each) in a loop
/// for the suite's loop time, each through its own recorded client: no
/// round ever waits out its deadline (no deadlock), both make progress, the
/// recorded history has no overlap on any key (a multi-lock is a set of
/// mutexes), and afterwards every key is free (no partial grant left).
pub async fn multi_locks_never_deadlock(h: &Harness) -> CaseResult {
    let history = std::sync::Arc::new(crate::history::History::new());
    let (a, b) = two_clients(h).await?;
    let caps = a.capabilities();
    let ttl = h.ttl_for(&caps).max(Duration::from_secs(2));
    let keys = [h.key("loop-a"), h.key("loop-b"), h.key("loop-c")];
    let name = |k: &LockKey| k.as_str().to_owned();
    let sets = [
        vec![name(&keys[0]), name(&keys[1])],
        vec![name(&keys[1]), name(&keys[0]), name(&keys[2])],
    ];
    let run = h.config().loop_run;
    let end = Instant::now() + run;
    let mut tasks = Vec::new();
    for (client, set) in [a.clone(), b.clone()].into_iter().zip(sets) {
        let recorded = std::sync::Arc::new(crate::recording::RecordingBackend::new(
            client,
            history.process(),
        ));
        let client = LockClient::from_arc(recorded);
        tasks.push(tokio::spawn(async move {
            let mut rounds = 0u64;
            while Instant::now() < end {
                let guard = client
                    .lock_all(set.iter())
                    .ttl(ttl)
                    .wait(Duration::from_secs(20))
                    .acquire()
                    .await
                    .map_err(|e| format!("round {rounds}: {e}"))?;
                tokio::task::yield_now().await;
                guard.release().await.map_err(|e| format!("release: {e}"))?;
                rounds += 1;
            }
            Ok::<u64, String>(rounds)
        }));
    }
    let mut rounds = Vec::new();
    for task in tasks {
        let done = timeout(run + Duration::from_secs(60), task)
            .await
            .map_err(|_| "the multi-lock loop deadlocked".to_owned())?
            .map_err(|e| format!("loop task: {e}"))??;
        rounds.push(done);
    }
    ensure!(
        rounds.iter().all(|r| *r > 0),
        "a client made no progress: {rounds:?} rounds"
    );
    let summary = check_history(
        &history,
        caps.has_fencing(),
        "a key had two holders",
        "tokens",
    )?;
    for key in &keys {
        ensure!(
            is_free(&*b, key, ttl).await?,
            "{key} was left held after the loop"
        );
    }
    Ok(Outcome::Passed(format!(
        "{rounds:?} rounds in {run:?}, no deadlock, all keys free; {summary}"
    )))
}
