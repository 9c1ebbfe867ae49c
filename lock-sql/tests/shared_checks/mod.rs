//! The read-write lock and semaphore checks of `tests/shared.rs` and
//! `tests/shared_broken.rs`: each returns the violation it saw.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of this

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lock_core::{
    ErrorKind, FencingToken, LeaseKind, LockBackend, LockBackendExt, LockError, LockKey, LockShape,
};
use lock_sql::SqlBackend;
use tokio::time::{Instant, sleep};

pub type Backend = Arc<dyn LockBackend>;
pub type Checked = Result<(), String>;

pub const TTL: Duration = Duration::from_secs(10);

pub fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

pub fn permits(count: u32, limit: u32) -> LeaseKind {
    LeaseKind::permits(count, limit).unwrap()
}

fn secs(s: u64) -> Instant {
    Instant::now() + Duration::from_secs(s)
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

fn fail(what: &str) -> impl FnOnce(LockError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

// ---------------------------------------------------------------- checks

/// Writers and readers of one key from several tasks and clients: never a
/// writer beside anyone (counted in the process around each hold).
pub async fn rw_exclusion(clients: &[Backend], name: &str) -> Checked {
    let k = key(name);
    let readers = Arc::new(AtomicU32::new(0));
    let writers = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (b, k) = (clients[i % clients.len()].clone(), k.clone());
        let (readers, writers) = (readers.clone(), writers.clone());
        tasks.push(tokio::spawn(async move {
            let kind = if i % 2 == 0 {
                LeaseKind::Write
            } else {
                LeaseKind::Read
            };
            for _ in 0..4 {
                let lease = b
                    .acquire_kind(&k, kind, TTL, secs(20))
                    .await
                    .map_err(fail("acquire"))?;
                let seen = if kind == LeaseKind::Write {
                    let w = writers.fetch_add(1, Ordering::SeqCst) + 1;
                    (w, readers.load(Ordering::SeqCst))
                } else {
                    let r = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    (writers.load(Ordering::SeqCst), r)
                };
                let bad = seen.0 > 1 || (seen.0 == 1 && seen.1 > 0);
                sleep(Duration::from_millis(15)).await;
                if kind == LeaseKind::Write {
                    writers.fetch_sub(1, Ordering::SeqCst);
                } else {
                    readers.fetch_sub(1, Ordering::SeqCst);
                }
                b.release(&lease).await.map_err(fail("release"))?;
                if bad {
                    return Err(format!(
                        "{kind} held beside {} writer(s) and {} reader(s)",
                        seen.0, seen.1
                    ));
                }
            }
            Ok::<(), String>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// Two readers hold at once (observed through `holders`), a writer is
/// refused beside them.
pub async fn readers_overlap(a: &Backend, b: &Backend, name: &str) -> Checked {
    let k = key(name);
    let r1 = a
        .try_acquire_kind(&k, LeaseKind::Read, TTL)
        .await
        .map_err(fail("r1"))?;
    let r2 = b
        .try_acquire_kind(&k, LeaseKind::Read, TTL)
        .await
        .map_err(fail("r2"))?;
    let (Some(r1), Some(r2)) = (r1, r2) else {
        return Err("a second reader was refused beside the first".into());
    };
    let holders = a
        .holders(&k, LockShape::ReadWrite)
        .await
        .map_err(fail("holders"))?;
    ensure!(
        holders.len() == 2 && holders.iter().all(|h| h.kind == LeaseKind::Read),
        "holders: {holders:?}"
    );
    let w = b
        .try_acquire_kind(&k, LeaseKind::Write, TTL)
        .await
        .map_err(fail("w"))?;
    ensure!(w.is_none(), "a writer was granted beside two readers");
    ensure!(a.release(&r1).await.unwrap_or(false), "r1 release");
    ensure!(b.release(&r2).await.unwrap_or(false), "r2 release");
    Ok(())
}

/// Permit holders from several tasks: never more than the limit in total.
pub async fn semaphore_limit(clients: &[Backend], name: &str) -> Checked {
    const LIMIT: u32 = 3;
    let k = key(name);
    let in_use = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (b, k, in_use) = (
            clients[i % clients.len()].clone(),
            k.clone(),
            in_use.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                let lease = b
                    .acquire_kind(&k, permits(1, LIMIT), TTL, secs(20))
                    .await
                    .map_err(fail("acquire"))?;
                let now = in_use.fetch_add(1, Ordering::SeqCst) + 1;
                sleep(Duration::from_millis(15)).await;
                in_use.fetch_sub(1, Ordering::SeqCst);
                b.release(&lease).await.map_err(fail("release"))?;
                if now > LIMIT {
                    return Err(format!("{now} permits of {LIMIT} held at once"));
                }
            }
            Ok::<(), String>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// A big request waiting at the head is not overtaken by later small ones
/// (FIFO), and takes its permits atomically.
pub async fn semaphore_fifo(a: &Backend, b: &Backend, name: &str) -> Checked {
    let k = key(name);
    let one = a
        .try_acquire_kind(&k, permits(1, 3), TTL)
        .await
        .map_err(fail("one"))?;
    let one = one.ok_or("the first permit was refused")?;
    let big = tokio::spawn({
        let (b, k) = (b.clone(), k.clone());
        async move { b.acquire_kind(&k, permits(3, 3), TTL, secs(10)).await }
    });
    sleep(Duration::from_millis(400)).await;
    // Two permits are free, but the waiting request for three is ahead.
    let small = a
        .try_acquire_kind(&k, permits(1, 3), TTL)
        .await
        .map_err(fail("small"))?;
    ensure!(
        small.is_none(),
        "a later small request overtook a waiting big one"
    );
    ensure!(a.release(&one).await.unwrap_or(false), "release one");
    let big = big.await.map_err(|e| e.to_string())?.map_err(fail("big"))?;
    ensure!(big.kind() == permits(3, 3), "kind {:?}", big.kind());
    let total: u32 = a
        .holders(&k, LockShape::Semaphore)
        .await
        .map_err(fail("holders"))?
        .iter()
        .map(|h| match h.kind {
            LeaseKind::Permits { count, .. } => count,
            _ => 0,
        })
        .sum();
    ensure!(total == 3, "{total} permits listed");
    ensure!(b.release(&big).await.unwrap_or(false), "release big");
    Ok(())
}

/// Once a writer waits, new readers (try and wait) queue behind it; the
/// writer gets the key when the reader leaves.
pub async fn writer_preference(a: &Backend, b: &Backend, name: &str) -> Checked {
    let k = key(name);
    let r1 = a
        .try_acquire_kind(&k, LeaseKind::Read, TTL)
        .await
        .map_err(fail("r1"))?;
    let r1 = r1.ok_or("first reader refused")?;
    let writer = tokio::spawn({
        let (b, k) = (b.clone(), k.clone());
        async move { b.acquire_kind(&k, LeaseKind::Write, TTL, secs(10)).await }
    });
    sleep(Duration::from_millis(400)).await;
    let r2 = a
        .try_acquire_kind(&k, LeaseKind::Read, TTL)
        .await
        .map_err(fail("r2"))?;
    if let Some(r2) = &r2 {
        let _ = a.release(r2).await;
        let _ = a.release(&r1).await;
        if let Ok(Ok(w)) = writer.await {
            let _ = b.release(&w).await;
        }
        return Err("a new reader went ahead of a waiting writer".into());
    }
    let waited = a
        .acquire_kind(
            &k,
            LeaseKind::Read,
            TTL,
            Instant::now() + Duration::from_millis(300),
        )
        .await;
    ensure!(
        matches!(&waited, Err(e) if e.kind() == ErrorKind::Contended),
        "a waiting reader went ahead of a waiting writer: {waited:?}"
    );
    ensure!(a.release(&r1).await.unwrap_or(false), "release r1");
    let w = writer
        .await
        .map_err(|e| e.to_string())?
        .map_err(fail("writer"))?;
    ensure!(
        w.token() > r1.token(),
        "write token {:?} after read {:?}",
        w.token(),
        r1.token()
    );
    ensure!(b.release(&w).await.unwrap_or(false), "release w");
    Ok(())
}

/// A writer becomes a reader with the same token, in place: a waiting
/// writer does not get in, the write lease is dead afterwards.
pub async fn downgrade(a: &Backend, b: &Backend, name: &str) -> Checked {
    let k = key(name);
    let w = a
        .try_acquire_kind(&k, LeaseKind::Write, TTL)
        .await
        .map_err(fail("w"))?;
    let w = w.ok_or("writer refused on a free key")?;
    let other = tokio::spawn({
        let (b, k) = (b.clone(), k.clone());
        async move { b.acquire_kind(&k, LeaseKind::Write, TTL, secs(10)).await }
    });
    sleep(Duration::from_millis(300)).await;
    let r = a.downgrade(&w).await.map_err(fail("downgrade"))?;
    ensure!(r.kind() == LeaseKind::Read, "downgraded to {:?}", r.kind());
    ensure!(
        r.token() == w.token(),
        "token {:?} -> {:?}",
        w.token(),
        r.token()
    );
    sleep(Duration::from_millis(300)).await;
    let holders = a
        .holders(&k, LockShape::ReadWrite)
        .await
        .map_err(fail("holders"))?;
    let only_us = holders.len() == 1
        && holders[0].kind == LeaseKind::Read
        && holders[0].token == Some(w.token());
    ensure!(
        !other.is_finished() && only_us,
        "after downgrade: {holders:?}"
    );
    ensure!(
        matches!(a.renew(&w).await, Err(e) if e.kind() == ErrorKind::NotHeld),
        "the write lease still renews"
    );
    ensure!(
        !a.release(&w).await.unwrap_or(true),
        "the write lease still releases"
    );
    a.renew(&r).await.map_err(fail("renew read"))?;
    ensure!(a.release(&r).await.unwrap_or(false), "release read");
    let next = other
        .await
        .map_err(|e| e.to_string())?
        .map_err(fail("other"))?;
    ensure!(next.token() > w.token(), "next writer's token");
    ensure!(b.release(&next).await.unwrap_or(false), "release next");
    Ok(())
}

/// A limit other than the one in use is refused; an idle semaphore takes
/// a new one.
pub async fn limit_mismatch(a: &Backend, b: &Backend, name: &str) -> Checked {
    let k = key(name);
    let p = a
        .try_acquire_kind(&k, permits(1, 3), TTL)
        .await
        .map_err(fail("p"))?;
    let p = p.ok_or("first permit refused")?;
    let tried = b.try_acquire_kind(&k, permits(1, 4), TTL).await;
    ensure!(
        matches!(&tried, Err(e) if e.kind() == ErrorKind::InvalidArgument),
        "try with another limit: {tried:?}"
    );
    let waited = b.acquire_kind(&k, permits(1, 4), TTL, secs(2)).await;
    ensure!(
        matches!(&waited, Err(e) if e.kind() == ErrorKind::InvalidArgument),
        "acquire with another limit: {waited:?}"
    );
    ensure!(a.release(&p).await.unwrap_or(false), "release");
    let fresh = b
        .try_acquire_kind(&k, permits(1, 4), TTL)
        .await
        .map_err(fail("idle"))?;
    let fresh = fresh.ok_or("an idle semaphore refused a new limit")?;
    ensure!(b.release(&fresh).await.unwrap_or(false), "release fresh");
    let bad = a
        .try_acquire_kind(&k, LeaseKind::Permits { count: 0, limit: 3 }, TTL)
        .await;
    ensure!(
        matches!(&bad, Err(e) if e.kind() == ErrorKind::InvalidArgument),
        "0 permits: {bad:?}"
    );
    Ok(())
}

/// A holder that crashed (never renews, never releases) keeps its share
/// until its TTL by the database's clock, and not longer: writer after a
/// crashed writer, writer after a crashed reader, permits after a crashed
/// permit holder.
pub async fn crashed_holder_expires(a: &Backend, b: &Backend, name: &str) -> Checked {
    let ttl = Duration::from_millis(1500);
    for (i, (crashed, next)) in [
        (LeaseKind::Write, LeaseKind::Write),
        (LeaseKind::Read, LeaseKind::Write),
        (permits(2, 2), permits(1, 2)),
    ]
    .into_iter()
    .enumerate()
    {
        let k = key(&format!("{name}/{i}"));
        let start = Instant::now();
        let gone = a
            .try_acquire_kind(&k, crashed, ttl)
            .await
            .map_err(fail("crashed"))?;
        ensure!(gone.is_some(), "{crashed} refused on a free key");
        // The holder "crashes" here: its lease is never renewed.
        sleep(ttl / 2).await;
        let early = b
            .try_acquire_kind(&k, next, TTL)
            .await
            .map_err(fail("early"))?;
        ensure!(
            early.is_none(),
            "{next} granted beside a live crashed {crashed}"
        );
        let lease = b
            .acquire_kind(&k, next, TTL, secs(6))
            .await
            .map_err(fail("after expiry"))?;
        let after = start.elapsed();
        ensure!(
            after >= ttl - Duration::from_millis(100) && after < ttl + Duration::from_secs(3),
            "{next} granted {after:?} after a crashed {crashed} of TTL {ttl:?}"
        );
        ensure!(b.release(&lease).await.unwrap_or(false), "release");
    }
    Ok(())
}

/// Tokens as documented: reads carry the last write's token (0 before any
/// write), write and permit tokens grow past every earlier grant.
pub async fn tokens(a: &Backend, b: &Backend, name: &str) -> Checked {
    let k = key(name);
    let grant = |backend: &Backend, kind| {
        let (backend, k) = (backend.clone(), k.clone());
        async move {
            backend
                .try_acquire_kind(&k, kind, TTL)
                .await
                .map_err(fail("grant"))?
                .ok_or_else(|| format!("{kind} refused"))
        }
    };
    let r0 = grant(a, LeaseKind::Read).await?;
    ensure!(
        r0.token() == FencingToken::new(0),
        "read before any write: {:?}",
        r0.token()
    );
    a.release(&r0).await.map_err(fail("release"))?;
    let mut last = 0;
    for round in 0..3 {
        let w = grant(a, LeaseKind::Write).await?;
        ensure!(
            w.token().get() > last,
            "round {round}: write token {:?} after {last}",
            w.token()
        );
        last = w.token().get();
        a.release(&w).await.map_err(fail("release"))?;
        let r1 = grant(a, LeaseKind::Read).await?;
        let r2 = grant(b, LeaseKind::Read).await?;
        ensure!(
            r1.token().get() == last && r2.token().get() == last,
            "round {round}: readers carry {:?}, {:?}, epoch {last}",
            r1.token(),
            r2.token()
        );
        a.release(&r1).await.map_err(fail("release"))?;
        b.release(&r2).await.map_err(fail("release"))?;
    }
    let w = grant(b, LeaseKind::Write).await?;
    let r = b.downgrade(&w).await.map_err(fail("downgrade"))?;
    ensure!(
        r.token() == w.token() && w.token().get() > last,
        "downgraded token"
    );
    b.release(&r).await.map_err(fail("release"))?;
    // Permits: strictly increasing, and the namespaces are separate.
    let sk = key(&format!("{name}/sem"));
    let mut previous = 0;
    for _ in 0..3 {
        let p = a
            .try_acquire_kind(&sk, permits(1, 2), TTL)
            .await
            .map_err(fail("permit"))?
            .ok_or("permit refused")?;
        ensure!(
            p.token().get() > previous,
            "permit token {:?} after {previous}",
            p.token()
        );
        previous = p.token().get();
        a.release(&p).await.map_err(fail("release"))?;
    }
    let m = a.try_acquire(&k, TTL).await.map_err(fail("mutex"))?;
    ensure!(m.is_some(), "the mutex of the same key is a different lock");
    a.release(&m.expect("checked"))
        .await
        .map_err(fail("release"))?;
    Ok(())
}

/// A waiting writer that is dropped stops blocking readers at once (long
/// before its TTL), and nothing stays held.
pub async fn cancel_leaves_nothing(a: &Backend, b: &Backend, name: &str) -> Checked {
    let k = key(name);
    let r = a
        .try_acquire_kind(&k, LeaseKind::Read, TTL)
        .await
        .map_err(fail("r"))?;
    let r = r.ok_or("reader refused")?;
    let writer = tokio::spawn({
        let (b, k) = (b.clone(), k.clone());
        async move {
            b.acquire_kind(&k, LeaseKind::Write, Duration::from_secs(30), secs(30))
                .await
        }
    });
    sleep(Duration::from_millis(400)).await;
    let blocked = a
        .try_acquire_kind(&k, LeaseKind::Read, TTL)
        .await
        .map_err(fail("blocked"))?;
    ensure!(blocked.is_none(), "the waiting writer did not queue");
    writer.abort();
    let _ = writer.await;
    let cancelled = Instant::now();
    let reader = loop {
        if let Some(lease) = a
            .try_acquire_kind(&k, LeaseKind::Read, TTL)
            .await
            .map_err(fail("after"))?
        {
            break lease;
        }
        ensure!(
            cancelled.elapsed() < Duration::from_secs(3),
            "a dropped waiting writer still blocks readers after 3 s"
        );
        sleep(Duration::from_millis(50)).await;
    };
    a.release(&reader).await.map_err(fail("release"))?;
    a.release(&r).await.map_err(fail("release"))?;
    sleep(Duration::from_millis(300)).await;
    let left = a
        .holders(&k, LockShape::ReadWrite)
        .await
        .map_err(fail("holders"))?;
    ensure!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}

/// `renew_many` over leases of every kind at once (what the shared renewal
/// scheduler sends): each renewed by its own row, a released one NotHeld.
pub async fn renew_many_mixed(a: &Backend, name: &str) -> Checked {
    let k = key(name);
    let m = a
        .try_acquire(&k, TTL)
        .await
        .map_err(fail("mutex"))?
        .ok_or("mutex refused")?;
    let r = a
        .try_acquire_kind(&k, LeaseKind::Read, TTL)
        .await
        .map_err(fail("read"))?
        .ok_or("read refused")?;
    let p = a
        .try_acquire_kind(&k, permits(2, 3), TTL)
        .await
        .map_err(fail("permits"))?
        .ok_or("permits refused")?;
    let gone = a
        .try_acquire_kind(&key(&format!("{name}/gone")), LeaseKind::Write, TTL)
        .await
        .map_err(fail("write"))?
        .ok_or("write refused")?;
    a.release(&gone).await.map_err(fail("release"))?;
    let results = a.renew_many(&[&m, &r, &gone, &p]).await;
    ensure!(results.len() == 4, "{} results for 4 leases", results.len());
    ensure!(
        results[0].is_ok() && results[1].is_ok() && results[3].is_ok(),
        "renew_many: {results:?}"
    );
    ensure!(
        matches!(&results[2], Err(e) if e.kind() == ErrorKind::NotHeld),
        "a released write lease renewed: {:?}",
        results[2]
    );
    for lease in [&m, &r, &p] {
        ensure!(
            a.release(lease).await.unwrap_or(false),
            "release after renew_many"
        );
    }
    Ok(())
}

/// Rows left in the waiters and holders tables (default table names) for
/// keys `LIKE pattern`, counted with the backend's users' pool.
pub async fn leftover_rows(backend: &SqlBackend, pattern: &str) -> (i64, i64) {
    use lock_sql::sqlx;
    let mut counts = [0i64; 2];
    for (i, table) in ["distlock_leases_waiters", "distlock_leases_holders"]
        .into_iter()
        .enumerate()
    {
        let mysql = format!("SELECT COUNT(*) FROM {table} WHERE name LIKE ?");
        let pg = format!("SELECT COUNT(*) FROM {table} WHERE name LIKE $1");
        counts[i] = if let Some(pool) = backend.pg_pool() {
            sqlx::query_scalar(sqlx::AssertSqlSafe(pg))
                .bind(pattern)
                .fetch_one(pool)
                .await
                .unwrap()
        } else if let Some(pool) = backend.mysql_pool() {
            sqlx::query_scalar(sqlx::AssertSqlSafe(mysql))
                .bind(pattern)
                .fetch_one(pool)
                .await
                .unwrap()
        } else {
            let pool = backend.sqlite_pool().expect("one of the three");
            sqlx::query_scalar(sqlx::AssertSqlSafe(mysql))
                .bind(pattern)
                .fetch_one(pool)
                .await
                .unwrap()
        };
    }
    (counts[0], counts[1])
}

/// Every check, on two clients of one database.
pub async fn all_checks(url: &str, prefix: &str) {
    let sql = SqlBackend::connect_url(url).await.unwrap();
    let a: Backend = Arc::new(sql.clone());
    let b: Backend = Arc::new(SqlBackend::connect_url(url).await.unwrap());
    let caps = a.capabilities();
    assert!(caps.shared_locks && caps.semaphores, "{caps:?}");
    let clients = [a.clone(), b.clone()];
    let results = [
        (
            "rw_exclusion",
            rw_exclusion(&clients, &format!("{prefix}/excl")).await,
        ),
        (
            "readers_overlap",
            readers_overlap(&a, &b, &format!("{prefix}/overlap")).await,
        ),
        (
            "semaphore_limit",
            semaphore_limit(&clients, &format!("{prefix}/sem")).await,
        ),
        (
            "semaphore_fifo",
            semaphore_fifo(&a, &b, &format!("{prefix}/fifo")).await,
        ),
        (
            "writer_preference",
            writer_preference(&a, &b, &format!("{prefix}/pref")).await,
        ),
        (
            "downgrade",
            downgrade(&a, &b, &format!("{prefix}/down")).await,
        ),
        (
            "limit_mismatch",
            limit_mismatch(&a, &b, &format!("{prefix}/limit")).await,
        ),
        (
            "crashed_holder_expires",
            crashed_holder_expires(&a, &b, &format!("{prefix}/crash")).await,
        ),
        ("tokens", tokens(&a, &b, &format!("{prefix}/tokens")).await),
        (
            "cancel_leaves_nothing",
            cancel_leaves_nothing(&a, &b, &format!("{prefix}/cancel")).await,
        ),
        (
            "renew_many_mixed",
            renew_many_mixed(&a, &format!("{prefix}/many")).await,
        ),
    ];
    let failed: Vec<String> = results
        .iter()
        .filter_map(|(name, r)| r.as_ref().err().map(|e| format!("{name}: {e}")))
        .collect();
    assert!(failed.is_empty(), "{prefix}: {failed:#?}");
    // Every wait withdrew or was granted, every lease was released or its
    // expired row deleted by the next decision: no row is left.
    assert_eq!(
        leftover_rows(&sql, prefix).await,
        (0, 0),
        "{prefix}: rows left"
    );
}
