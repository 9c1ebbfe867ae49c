//! The read-write lock and semaphore checks of `tests/shared.rs` and
//! `tests/shared_broken.rs` that are this driver's own (the semaphore's
//! FIFO queue, the shared kinds' tokens, mixed renewal batches, the rows a
//! cancelled wait leaves): each returns the violation it saw. Exclusion,
//! overlapping readers, permit limits and limit mismatches, writer
//! preference, downgrades and a crashed holder's expiry are the suite's
//! cases (`conformance::cases::shared`), which the row-mode targets of
//! `tests/postgres.rs`, `tests/mariadb.rs` and `tests/sqlite.rs` run.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of this

use std::sync::Arc;
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
    let results = [
        (
            "semaphore_fifo",
            semaphore_fifo(&a, &b, &format!("{prefix}/fifo")).await,
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
