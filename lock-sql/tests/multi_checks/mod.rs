//! `try_acquire_all` checks (row mode), run on PostgreSQL, MariaDB and
//! SQLite by their test binaries: a free set taken whole with fresh tokens,
//! a set with one key held refused with nothing left behind, an expired
//! holder taken over, duplicates refused, fair mode refusing a set with a
//! live waiter, and overlapping sets racing without a partial grant.
//! `broken_variant` shows the refusal check failing on a backend that
//! takes the keys one by one without giving them back.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of this

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_core::{
    ErrorKind, Facets, Lease, LockBackend, LockBackendExt, LockError, LockKey, LockSets,
    LockWrapper, OwnerId, async_trait,
};
use lock_sql::SqlBackend;
use tokio::time::sleep;

use crate::common::{leak_waiter, with_options};

fn keys(what: &str, n: usize) -> Vec<LockKey> {
    let run = OwnerId::random();
    let mut keys: Vec<LockKey> = (0..n)
        .map(|i| LockKey::new(format!("multi/{what}/{run}/{i}")).expect("key"))
        .collect();
    keys.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    keys
}

async fn release_all(b: &dyn LockBackend, leases: &[Lease]) -> Result<(), String> {
    for lease in leases {
        if !b.release(lease).await.map_err(|e| e.to_string())? {
            return Err(format!("{} was not held at release", lease.key()));
        }
    }
    Ok(())
}

/// A free set (one key taken and released before, one never used) is
/// granted whole: a lease per key in order, each token above the key's
/// earlier ones, each excluding a plain try, renewing and releasing.
pub async fn free_set_is_granted(b: &dyn LockBackend) -> Result<String, String> {
    let ttl = Duration::from_secs(10);
    let set = keys("free", 3);
    let before = b
        .try_acquire(&set[0], ttl)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("first key not free")?;
    b.release(&before).await.map_err(|e| e.to_string())?;
    let leases = b
        .try_acquire_all(&set, ttl)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("a free set was refused")?;
    let got: Vec<&str> = leases.iter().map(|l| l.key().as_str()).collect();
    let want: Vec<&str> = set.iter().map(LockKey::as_str).collect();
    if got != want {
        return Err(format!("leases for {got:?}, asked {want:?}"));
    }
    if leases[0].token() <= before.token() {
        return Err("a multi-grant token did not grow past the key's earlier one".into());
    }
    for lease in &leases {
        if b.try_acquire(lease.key(), ttl)
            .await
            .map_err(|e| e.to_string())?
            .is_some()
        {
            return Err(format!(
                "{} granted again while the set held it",
                lease.key()
            ));
        }
        b.renew(lease).await.map_err(|e| format!("renew: {e}"))?;
    }
    release_all(b, &leases).await?;
    Ok(format!(
        "tokens {:?}",
        leases.iter().map(|l| l.token().get()).collect::<Vec<_>>()
    ))
}

/// A set with its middle key held is refused, and its other keys are
/// left free (each try of them is granted).
pub async fn held_key_refuses_the_set(b: &dyn LockBackend) -> Result<String, String> {
    let ttl = Duration::from_secs(10);
    let set = keys("held", 3);
    let held = b
        .try_acquire(&set[1], ttl)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("middle key not free")?;
    let answer = b
        .try_acquire_all(&set, ttl)
        .await
        .map_err(|e| e.to_string())?;
    b.release(&held).await.map_err(|e| e.to_string())?;
    if let Some(leases) = answer {
        release_all(b, &leases).await?;
        return Err("a set with a held key was granted".into());
    }
    for key in [&set[0], &set[2]] {
        match b.try_acquire(key, ttl).await.map_err(|e| e.to_string())? {
            Some(lease) => {
                b.release(&lease).await.map_err(|e| e.to_string())?;
            }
            None => return Err(format!("{key} was left held by a refused set")),
        }
    }
    Ok("refused; the other keys left free".into())
}

/// An expired holder's key is taken over with the rest of the set; a set
/// with a key twice is InvalidArgument.
pub async fn expired_taken_and_duplicates_refused(b: &dyn LockBackend) -> Result<String, String> {
    let set = keys("expired", 2);
    let short = Duration::from_millis(200);
    let old = b
        .try_acquire(&set[0], short)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("key not free")?;
    sleep(Duration::from_millis(300)).await;
    let leases = b
        .try_acquire_all(&set, Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?
        .ok_or("a set whose holder expired was refused")?;
    if leases[0].token() <= old.token() {
        return Err("the expired key's token did not grow".into());
    }
    release_all(b, &leases).await?;
    let twice = [set[0].clone(), set[0].clone()];
    match b.try_acquire_all(&twice, Duration::from_secs(10)).await {
        Err(e) if e.kind() == ErrorKind::InvalidArgument => {}
        other => return Err(format!("a duplicate key gave {other:?}")),
    }
    Ok("expired key taken over; duplicates InvalidArgument".into())
}

/// Two tasks race overlapping sets {0,1} and {1,2} 40 times each: never
/// both inside (key 1), and every key free at the end (no partial grant
/// left behind by a set refused halfway).
pub async fn overlapping_sets_race(
    a: Arc<dyn LockBackend>,
    b: Arc<dyn LockBackend>,
) -> Result<String, String> {
    let ttl = Duration::from_secs(10);
    let set = keys("race", 3);
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (backend, mine) in [
        (a.clone(), vec![set[0].clone(), set[1].clone()]),
        (b, vec![set[1].clone(), set[2].clone()]),
    ] {
        let (inside, overlaps, refused) = (inside.clone(), overlaps.clone(), refused.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..40 {
                match backend.try_acquire_all(&mine, ttl).await? {
                    Some(leases) => {
                        if inside.fetch_add(1, Ordering::SeqCst) > 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        for lease in &leases {
                            backend.release(lease).await?;
                        }
                    }
                    None => {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            Ok::<_, LockError>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    if overlaps.load(Ordering::SeqCst) > 0 {
        return Err("two overlapping sets were held at once".into());
    }
    for key in &set {
        if a.inspect(key).await.map_err(|e| e.to_string())?.is_some() {
            return Err(format!("{key} left held after the race"));
        }
    }
    Ok(format!(
        "80 attempts, {} refused, no overlap, all free",
        refused.load(Ordering::SeqCst)
    ))
}

/// Fair mode: a set one of whose keys has a live waiter (free key) is
/// refused. The waiter is `waiter`'s, queued in `rows`' table and leaked
/// with `waiter` (a backend of its own).
pub async fn fair_set_waits_for_waiters(
    holder: &dyn LockBackend,
    waiter: Arc<dyn LockBackend>,
    rows: &SqlBackend,
    fair: &dyn LockBackend,
) -> Result<String, String> {
    let set = keys("fair", 2);
    let ttl = Duration::from_secs(1);
    let held = holder
        .try_acquire(&set[1], Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?
        .ok_or("key not free")?;
    // A waiter that dies while queued: its row lives up to its 1 s TTL.
    leak_waiter(waiter, rows, &set[1], ttl).await;
    holder.release(&held).await.map_err(|e| e.to_string())?;
    if let Some(leases) = fair
        .try_acquire_all(&set, ttl)
        .await
        .map_err(|e| e.to_string())?
    {
        release_all(fair, &leases).await?;
        return Err("a fair set was granted past a live waiter".into());
    }
    Ok("refused while a waiter lived".into())
}

/// A backend that takes a set one key at a time and, on a held key,
/// answers None without giving back the keys it took (the broken variant
/// of [`held_key_refuses_the_set`]).
#[derive(Debug)]
pub struct OneByOneNoRollback {
    pub inner: SqlBackend,
}

/// Its own lock sets, beside the inner backend's other facets.
impl LockWrapper for OneByOneNoRollback {
    fn inner(&self) -> &dyn LockBackend {
        &self.inner
    }

    fn name(&self) -> &'static str {
        "one-by-one-no-rollback"
    }

    fn facets(&self) -> Facets<'_> {
        Facets {
            lock_sets: Some(self),
            ..self.inner.facets()
        }
    }
}

#[async_trait]
impl LockSets for OneByOneNoRollback {
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        let mut leases = Vec::new();
        for key in keys {
            match self.inner.try_acquire(key, ttl).await? {
                Some(lease) => leases.push(lease),
                None => return Ok(None),
            }
        }
        Ok(Some(leases))
    }
}

/// PostgreSQL's count of rolled-back transactions in this database (the
/// statistics collector's, which lags by up to half a second).
async fn rollbacks(b: &SqlBackend) -> Option<i64> {
    let pool = b.pg_pool()?;
    sleep(Duration::from_millis(600)).await;
    lock_sql::sqlx::query_scalar(
        "SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await
    .ok()
}

/// Every check on `url` (unfair) and the fair one on `url` + `fair=true`;
/// panics on a failure.
pub async fn multi_checks(url: &str) {
    let a = Arc::new(SqlBackend::connect_url(url).await.expect("connect"));
    let b = Arc::new(SqlBackend::connect_url(url).await.expect("connect"));
    let fair_url = with_options(url, "fair=true");
    let fair = SqlBackend::connect_url(&fair_url).await.expect("connect");
    let fair_waiter = Arc::new(SqlBackend::connect_url(&fair_url).await.expect("connect"));
    let results = [
        ("free set granted", free_set_is_granted(&*a).await),
        (
            "held key refuses the set",
            held_key_refuses_the_set(&*a).await,
        ),
        (
            "expired and duplicates",
            expired_taken_and_duplicates_refused(&*a).await,
        ),
        (
            "overlapping sets race",
            overlapping_sets_race(a.clone(), b.clone()).await,
        ),
        (
            "fair set waits",
            fair_set_waits_for_waiters(&*a, fair_waiter, &fair, &fair).await,
        ),
        ("fair free set granted", free_set_is_granted(&fair).await),
    ];
    for (name, result) in results {
        match result {
            Ok(detail) => println!("multi check {name}: {detail}"),
            Err(e) => panic!("multi check {name} failed: {e}"),
        }
    }
}

/// The refusal check failing on [`OneByOneNoRollback`], and the fair one
/// on an unfair backend.
pub async fn broken_variant(url: &str) {
    let a = SqlBackend::connect_url(url).await.expect("connect");
    let broken = OneByOneNoRollback { inner: a.clone() };
    let caught = held_key_refuses_the_set(&broken).await;
    match caught {
        Err(e) => println!("broken variant one-by-one caught: {e}"),
        Ok(detail) => panic!("broken variant one-by-one passed: {detail}"),
    }
    let fair_waiter = SqlBackend::connect_url(&with_options(url, "fair=true"))
        .await
        .expect("connect");
    match fair_set_waits_for_waiters(&a, Arc::new(fair_waiter), &a, &a).await {
        Err(e) => println!("broken variant unfair set caught: {e}"),
        Ok(detail) => panic!("broken variant unfair set passed: {detail}"),
    }
}
