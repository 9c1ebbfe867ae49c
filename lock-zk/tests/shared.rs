//! Read-write locks and semaphores against a real ZooKeeper server started
//! here: exclusion observed under contention (and the same check catching
//! a broken reader and a broken permit taker that write the recipe's nodes
//! without obeying it), readers overlapping, downgrade, tokens, limits,
//! expiry of an unrenewed holder, and cancellation. Writer preference and
//! a cancelled writer's wait are the suite's (`writers_are_not_starved`,
//! `cancelled_share_waits_leave_nothing`).

#[path = "shared/checks.rs"]
mod checks;
mod common;

use std::time::Duration;

use checks::*;
use common::{TTL, key, permits, refused, soon, spawn_wait, take, until_children};
use lock_core::{ErrorKind, LeaseKind, LockBackend, LockBackendExt, LockShape};
use tokio::time::{Instant, sleep, timeout};

/// Many readers and writers on separate sessions: no writer ever beside
/// anyone, and readers really overlap. The same check, with one contender
/// replaced by a reader that ignores writers, reports overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rw_exclusion_under_contention_and_a_broken_reader_is_caught() {
    let Some((target, bs)) = started(4).await else {
        return;
    };
    let k = key("rw-contention");
    let dir = bs[0].rwlock_path(&k);
    let actors: Vec<Actor> = (0..6).map(|i| Actor::Ours(bs[i % 4].clone())).collect();
    let history = rw_contention(actors, &k, &dir, 12).await;
    let violations = rw_violations(&history);
    let (_, readers) = peaks(&history);
    let writes = history.iter().filter(|i| i.held == Held::Write).count();
    println!(
        "{} holdings ({writes} writes), at most {readers} readers at once",
        history.len()
    );
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(readers >= 2, "readers never overlapped");
    assert!(writes >= 6);

    // The check catches a reader that does not wait for writers.
    let raw = target.raw().await;
    let k = key("rw-broken");
    let dir = bs[0].rwlock_path(&k);
    // The directory exists once one of ours has used it.
    let lease = take(&bs[0], &k, LeaseKind::Read, "granted").await;
    bs[0].release(&lease).await.unwrap();
    // Once for certain: the broken reader beside our writer...
    let w = take(&bs[0], &k, LeaseKind::Write, "granted").await;
    let history = beside_broken(&raw, &dir, "__READ__", Held::Write, Held::Read, "reader").await;
    bs[0].release(&w).await.unwrap();
    let violations = rw_violations(&history);
    assert_eq!(
        violations.len(),
        1,
        "the check missed a reader beside a writer"
    );
    // ...and under contention (where it usually shows).
    let mut actors: Vec<Actor> = (0..4).map(|i| Actor::Ours(bs[i].clone())).collect();
    actors[1] = Actor::BrokenReader(raw);
    let history = rw_contention(actors, &k, &dir, 12).await;
    let violations = rw_violations(&history);
    println!(
        "broken reader under contention: {} violations, e.g. {:?}",
        violations.len(),
        violations.first()
    );
}

/// Readers of separate sessions hold at once, and carry equal tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_writers_exclude() {
    let Some((_target, bs)) = started(3).await else {
        return;
    };
    let k = key("share");
    let r1 = take(&bs[0], &k, LeaseKind::Read, "r1").await;
    let r2 = take(&bs[1], &k, LeaseKind::Read, "r2").await;
    assert_eq!(r1.kind(), LeaseKind::Read);
    assert_eq!(r1.token(), r2.token());
    assert!(refused(&bs[2], &k, LeaseKind::Write).await);
    let holders = bs[2].holders(&k, LockShape::ReadWrite).await.unwrap();
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert!(holders.iter().all(|h| h.kind == LeaseKind::Read));
    // The mutex of the same key is another lock.
    let m = bs[2]
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .expect("mutex of the same key is free");
    assert!(bs[2].release(&m).await.unwrap());
    // Renewals of read leases (one and batched).
    bs[0].renew(&r1).await.expect("renew read");
    let renewed = bs[1].renew_many(&[&r2]).await;
    assert!(renewed[0].is_ok(), "{renewed:?}");
    assert!(bs[0].release(&r1).await.unwrap());
    assert!(!bs[0].release(&r1).await.unwrap(), "released twice");
    assert_eq!(
        bs[0].renew(&r1).await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    assert!(refused(&bs[2], &k, LeaseKind::Write).await);
    assert!(bs[1].release(&r2).await.unwrap());
    let w = take(&bs[2], &k, LeaseKind::Write, "w").await;
    assert!(refused(&bs[0], &k, LeaseKind::Read).await);
    assert!(refused(&bs[0], &k, LeaseKind::Write).await);
    let holders = bs[0].holders(&k, LockShape::ReadWrite).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].kind, LeaseKind::Write);
    assert_eq!(holders[0].token, Some(w.token()));
    assert!(bs[2].release(&w).await.unwrap());
}

/// Downgrade keeps the token, lets readers in, keeps a waiting writer out
/// until the read lease goes, and invalidates the write lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_without_a_gap() {
    let Some((target, bs)) = started(3).await else {
        return;
    };
    let k = key("downgrade");
    let w = take(&bs[0], &k, LeaseKind::Write, "w").await;
    let waiter = spawn_wait(&bs[1], &k, LeaseKind::Write);
    let dir = bs[0].rwlock_path(&k);
    let raw = target.raw().await;
    until_children(&raw, &dir, 2, "the writer never queued").await;
    let r = bs[0].downgrade(&w).await.expect("downgrade");
    assert_eq!(r.kind(), LeaseKind::Read);
    assert_eq!(r.token(), w.token(), "the read lease keeps the write token");
    // The write lease is gone; the read lease renews.
    assert_eq!(
        bs[0].renew(&w).await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    assert_eq!(
        bs[0].downgrade(&w).await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    assert_eq!(
        bs[0].downgrade(&r).await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    bs[0].renew(&r).await.expect("renew the read lease");
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "a writer got in after the downgrade");
    // Readers queue behind the waiting writer (writer preference), so the
    // downgraded reader is alone; its node sorts where the write node was.
    let names = raw.list_children(&dir).await.unwrap();
    assert!(names.iter().any(|n| n.contains("__READ__")), "{names:?}");
    let holders = bs[2].holders(&k, LockShape::ReadWrite).await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].kind, LeaseKind::Read);
    assert_eq!(holders[0].token, Some(w.token()));
    // The downgrade's read node carries the holder details too.
    assert_eq!(
        holders[0].details.as_ref().map(|d| d.pid),
        Some(std::process::id()),
        "{holders:?}"
    );
    assert!(
        !bs[0].release(&w).await.unwrap(),
        "the write lease was released again"
    );
    let released = Instant::now();
    assert!(bs[0].release(&r).await.unwrap());
    let (granted, w2) = timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    let w2 = w2.expect("the waiting writer");
    assert!(granted >= released);
    assert!(w2.token() > w.token());
    assert!(bs[1].release(&w2).await.unwrap());
    // A downgrade with no one waiting: another reader joins.
    let w = take(&bs[0], &k, LeaseKind::Write, "w").await;
    let r = bs[0].downgrade(&w).await.expect("downgrade");
    let r2 = take(&bs[2], &k, LeaseKind::Read, "reader joins").await;
    assert_eq!(r2.token(), w.token());
    assert!(bs[0].release(&r).await.unwrap());
    assert!(bs[2].release(&r2).await.unwrap());
}

/// Tokens: writes strictly increase (above every earlier read), reads
/// carry the last write's token (0 before any write), permits increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_as_documented() {
    let Some((_target, bs)) = started(2).await else {
        return;
    };
    let k = key("tokens");
    let r0 = take(&bs[0], &k, LeaseKind::Read, "granted").await;
    assert_eq!(r0.token().get(), 0, "a read before any write carries 0");
    bs[0].release(&r0).await.unwrap();
    let mut last_write;
    let mut last_grant = 0;
    for round in 0..4 {
        let w = take(&bs[round % 2], &k, LeaseKind::Write, "granted").await;
        assert!(
            w.token().get() > last_grant,
            "write {} after {last_grant}",
            w.token()
        );
        last_write = w.token().get();
        last_grant = last_write;
        bs[round % 2].release(&w).await.unwrap();
        let ra = take(&bs[0], &k, LeaseKind::Read, "granted").await;
        let rb = take(&bs[1], &k, LeaseKind::Read, "granted").await;
        assert_eq!(ra.token().get(), last_write);
        assert_eq!(rb.token().get(), last_write);
        bs[0].release(&ra).await.unwrap();
        bs[1].release(&rb).await.unwrap();
    }
    let s = key("tokens-sem");
    let mut last = 0;
    for round in 0..6 {
        let p = take(&bs[round % 2], &s, permits(1, 2), "granted").await;
        assert!(p.token().get() > last);
        last = p.token().get();
        if round % 2 == 1 {
            bs[round % 2].release(&p).await.unwrap();
        } else {
            // Held across the next grant.
            let q = take(&bs[1], &s, permits(1, 2), "granted").await;
            assert!(q.token() > p.token());
            last = q.token().get();
            bs[1].release(&q).await.unwrap();
            bs[round % 2].release(&p).await.unwrap();
        }
    }
}

/// Never more than `limit` permits held, observed under contention with
/// requests of 1 and 2 permits; the same check catches a taker that
/// ignores the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semaphore_limit_under_contention_and_a_broken_taker_is_caught() {
    let Some((target, bs)) = started(4).await else {
        return;
    };
    let k = key("sem");
    let dir = bs[0].semaphore_path(&k);
    let actors: Vec<Actor> = (0..6).map(|i| Actor::Ours(bs[i % 4].clone())).collect();
    let started = Instant::now();
    let history = permit_contention(actors, &k, &dir, 3, 10).await;
    let (peak, _) = peaks(&history);
    println!(
        "{} permit holdings in {:?}, peak {peak} of 3",
        history.len(),
        started.elapsed()
    );
    assert!(peak <= 3, "more than the limit held");
    assert!(peak >= 2, "permits never overlapped");

    let raw = target.raw().await;
    let k = key("sem-broken");
    let dir = bs[0].semaphore_path(&k);
    let p = take(&bs[0], &k, permits(1, 3), "granted").await;
    bs[0].release(&p).await.unwrap();
    // Once for certain: a broken taker beside our 3 of 3...
    let all = take(&bs[0], &k, permits(3, 3), "granted").await;
    let leases = format!("{dir}/leases");
    let history = beside_broken(
        &raw,
        &leases,
        "lease-",
        Held::Permits(3),
        Held::Permits(1),
        "taker",
    )
    .await;
    bs[0].release(&all).await.unwrap();
    let (peak, _) = peaks(&history);
    assert_eq!(peak, 4, "the check missed a semaphore past its limit");
    // ...and under contention (where it usually shows).
    let mut actors: Vec<Actor> = (0..5).map(|i| Actor::Ours(bs[i % 4].clone())).collect();
    actors[1] = Actor::BrokenPermit(raw.clone());
    actors[3] = Actor::BrokenPermit(raw);
    let history = permit_contention(actors, &k, &dir, 3, 10).await;
    let (peak, _) = peaks(&history);
    println!("with broken takers under contention: peak {peak} of 3");
}

/// Counts are taken atomically, a request waits at the head (no
/// starvation by smaller later ones), limits must agree, bad counts are
/// typed errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_counts_limits_and_fifo() {
    let Some((_target, bs)) = started(3).await else {
        return;
    };
    let k = key("sem-counts");
    let a = take(&bs[0], &k, permits(2, 3), "2 of 3").await;
    assert!(refused(&bs[1], &k, permits(2, 3)).await);
    let err = bs[1]
        .try_acquire_kind(&k, permits(1, 4), TTL)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = bs[1]
        .acquire_kind(&k, permits(1, 4), TTL, soon(500))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    for bad in [
        LeaseKind::Permits { count: 0, limit: 3 },
        LeaseKind::Permits { count: 4, limit: 3 },
        LeaseKind::Permits { count: 1, limit: 0 },
    ] {
        let err = bs[1].try_acquire_kind(&k, bad, TTL).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad:?}: {err}");
    }
    let holders = bs[2].holders(&k, LockShape::Semaphore).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].kind, permits(2, 3));
    assert_eq!(holders[0].token, Some(a.token()));
    // Created in one transaction, the lease nodes carry the details too.
    assert_eq!(
        holders[0].details.as_ref().map(|d| d.pid),
        Some(std::process::id()),
        "{holders:?}"
    );
    bs[0].renew(&a).await.expect("renew 2 permits");
    // A request for 2 waits at the head; a later request for 1 (which
    // would fit) waits behind it.
    let big = spawn_wait(&bs[1], &k, permits(2, 3));
    sleep(Duration::from_millis(300)).await;
    assert!(
        refused(&bs[2], &k, permits(1, 3)).await,
        "a small request overtook the waiting big one"
    );
    let small = spawn_wait(&bs[2], &k, permits(1, 3));
    sleep(Duration::from_millis(300)).await;
    assert!(!big.is_finished() && !small.is_finished());
    bs[0].release(&a).await.unwrap();
    let (t_big, l_big) = timeout(Duration::from_secs(5), big).await.unwrap().unwrap();
    let (t_small, l_small) = timeout(Duration::from_secs(5), small)
        .await
        .unwrap()
        .unwrap();
    let (l_big, l_small) = (l_big.expect("big"), l_small.expect("small"));
    assert!(t_big <= t_small, "FIFO");
    assert!(l_small.token() > l_big.token());
    let holders = bs[0].holders(&k, LockShape::Semaphore).await.unwrap();
    assert_eq!(
        holders
            .iter()
            .map(|h| match h.kind {
                LeaseKind::Permits { count, .. } => count,
                _ => 0,
            })
            .sum::<u32>(),
        3
    );
    bs[1].release(&l_big).await.unwrap();
    bs[2].release(&l_small).await.unwrap();
    // Idle: a new limit takes effect.
    let p = take(&bs[0], &k, permits(4, 5), "idle: new limit").await;
    bs[0].release(&p).await.unwrap();
}

/// A lease that is not renewed is freed at its TTL (the holder lives on but
/// stopped renewing): for a writer, a reader and permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrenewed_shared_leases_are_freed_at_their_ttl() {
    let Some((_target, bs)) = started(2).await else {
        return;
    };
    let ttl = Duration::from_millis(600);
    let k = key("ttl");
    let w = bs[0]
        .try_acquire_kind(&k, LeaseKind::Write, ttl)
        .await
        .unwrap()
        .unwrap();
    let start = Instant::now();
    let r = bs[1]
        .acquire_kind(&k, LeaseKind::Read, TTL, soon(5_000))
        .await
        .expect("freed");
    let waited = start.elapsed();
    println!("reader granted {waited:?} after an unrenewed writer's grant (TTL {ttl:?})");
    assert!(waited < Duration::from_secs(2));
    assert_eq!(
        bs[0].renew(&w).await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    let _ = r;
    let start = Instant::now();
    let w2 = bs[0]
        .acquire_kind(&k, LeaseKind::Write, TTL, soon(10_000))
        .await;
    // `r` has the 3 s TTL and is not renewed either.
    assert!(w2.is_ok(), "{w2:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    let s = key("ttl-sem");
    let _p = bs[0]
        .try_acquire_kind(&s, permits(2, 2), ttl)
        .await
        .unwrap()
        .unwrap();
    let q = bs[1]
        .acquire_kind(&s, permits(2, 2), TTL, soon(5_000))
        .await
        .expect("permits freed");
    assert!(bs[1].release(&q).await.unwrap());
}

/// Dropped waits (reader, writer, permits) leave no node behind, and the
/// semaphore's mutex is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_leaves_nothing() {
    let Some((target, bs)) = started(2).await else {
        return;
    };
    let raw = target.raw().await;
    let k = key("cancel");
    let dir = bs[0].rwlock_path(&k);
    let w = take(&bs[0], &k, LeaseKind::Write, "granted").await;
    for kind in [LeaseKind::Read, LeaseKind::Write] {
        let wait = bs[1].acquire_kind(&k, kind, TTL, soon(10_000));
        assert!(timeout(Duration::from_millis(200), wait).await.is_err());
    }
    let sem = key("cancel-sem");
    let sdir = bs[0].semaphore_path(&sem);
    let p = take(&bs[0], &sem, permits(1, 1), "granted").await;
    let wait = bs[1].acquire_kind(&sem, permits(1, 1), TTL, soon(10_000));
    assert!(timeout(Duration::from_millis(300), wait).await.is_err());
    timeout(Duration::from_secs(3), async {
        loop {
            let rw = raw.list_children(&dir).await.unwrap();
            let leases = raw.list_children(&format!("{sdir}/leases")).await.unwrap();
            let locks = raw.list_children(&format!("{sdir}/locks")).await.unwrap();
            if rw.len() == 1 && leases.len() == 1 && locks.is_empty() {
                return;
            }
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a dropped wait left nodes behind");
    assert!(bs[0].release(&w).await.unwrap());
    assert!(bs[0].release(&p).await.unwrap());
    // Everything free.
    let r = take(&bs[1], &k, LeaseKind::Write, "free").await;
    let q = take(&bs[1], &sem, permits(1, 1), "free").await;
    bs[1].release(&r).await.unwrap();
    bs[1].release(&q).await.unwrap();
    assert!(raw.list_children(&dir).await.unwrap().is_empty());
}
