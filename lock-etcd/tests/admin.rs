//! Operating locks on a real etcd, beyond the shared suite's cases: a guard
//! broken by `force_release` goes `Lost` through the batched renewal
//! (`renew_many`) while a guard beside it stays held; `list` pages through
//! long queues and `etcdctl lock`-style entries (empty values, no details)
//! with the holder chosen by create revision, not by name; bad cursors;
//! `list_shared` and `list_elections` through queues longer than a page's
//! scan, raw entries without details, idle and waiting entries. (`gc`
//! keeping tokens rising is the suite's `gc_keeps_tokens_rising`.)

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::etcd::EtcdServer;
use lock_core::LockBackendExt;
use lock_core::{
    ErrorKind, FencingToken, HolderInfo, LeaseKind, ListQuery, LockBackend, LockClient, LockKey,
    LockShape, LockState,
};
use lock_etcd::EtcdBackend;
use tokio::time::{Instant, sleep};

mod common;
use common::{connect_for, granted, granted_kind};

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_makes_the_broken_guard_lost_and_spares_others() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let ttl = Duration::from_secs(2);
    let holder = connect_for(&server, "force", ttl).await;
    let admin = connect_for(&server, "force", ttl).await;
    let client = LockClient::new(holder.clone());
    let broken = client.lock("broken").ttl(ttl).acquire().await.unwrap();
    let kept = client.lock("kept").ttl(ttl).acquire().await.unwrap();

    let info = admin
        .force_release(&key("broken"))
        .await
        .unwrap()
        .expect("a holder to break");
    assert_eq!(info.token, Some(broken.token()));
    let details = info.details.expect("details of our grant");
    assert_eq!(details.pid, std::process::id());
    assert!(admin.inspect(&key("broken")).await.unwrap().is_none());

    // The guards renew every TTL/3 through `renew_many`: within a TTL the
    // broken one has seen its entry gone.
    let until = Instant::now() + ttl + Duration::from_secs(1);
    while !matches!(broken.state(), LockState::Lost(_)) && Instant::now() < until {
        sleep(Duration::from_millis(50)).await;
    }
    let LockState::Lost(reason) = broken.state() else {
        panic!("the broken guard is {:?}", broken.state());
    };
    println!("broken guard: {reason}");
    assert!(reason.contains("deleted"), "{reason}");
    // The control: renewed by the same batches, never broken.
    assert_eq!(kept.state(), LockState::Held);
    let shown = admin.inspect(&key("kept")).await.unwrap().expect("held");
    assert_eq!(shown.token, Some(kept.token()));

    let next = admin
        .try_acquire(&key("broken"), ttl)
        .await
        .unwrap()
        .expect("free after force_release");
    assert!(next.token() > broken.token());
    assert!(!broken.release().await.unwrap_or(false));
    assert!(admin.release(&next).await.unwrap());
    kept.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_through_queues_and_foreign_entries() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let ttl = Duration::from_secs(10);
    let backend = connect_for(&server, "lst", ttl).await;
    let mut held = HashMap::new();
    for name in ["p1", "p2", "z"] {
        let lease = granted(&backend, &key(name), ttl).await;
        held.insert(name.to_owned(), lease);
    }
    // `q`: a queue of 12 entries as `etcdctl lock` writes them (empty
    // values, no lease), created in descending name order: the holder is
    // the last name, `e11`, not the first one listed. Beside it, entries
    // of other shapes that list must skip.
    let mut kv = backend.client().kv_client();
    let mut q_token = None;
    for i in (0..12).rev() {
        let put = kv.put(format!("lst/q/e{i:02}"), "", None).await.unwrap();
        q_token.get_or_insert(put.header().unwrap().revision());
    }
    kv.put("lst/q%rw/x", "w 00", None).await.unwrap();
    kv.put("lst/q%rw-epoch", "", None).await.unwrap();
    kv.put("lst/a/b/c", "", None).await.unwrap();
    let q_token = FencingToken::new(u64::try_from(q_token.unwrap()).unwrap());

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        pages += 1;
        assert!(pages <= 20, "list did not finish");
        let page = backend
            .list(&ListQuery::new("", 1).after(cursor.as_deref()))
            .await
            .unwrap();
        assert!(page.locks.len() <= 1);
        for info in page.locks {
            if info.key.as_str() == "q" {
                assert_eq!(info.holder, "e11");
                assert_eq!(info.token, Some(q_token));
                assert_eq!(info.details, None, "an empty value has no details");
            } else {
                let lease = &held[info.key.as_str()];
                assert_eq!(info.token, Some(lease.token()));
                let details = info.details.expect("details of our grant");
                assert_eq!(details.pid, std::process::id());
            }
            seen.push(info.key.as_str().to_owned());
        }
        match page.cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    println!("listed {seen:?} in {pages} pages");
    assert_eq!(seen, ["p1", "p2", "q", "z"]);

    let all = backend.list(&ListQuery::new("", 100)).await.unwrap();
    let names: Vec<&str> = all.locks.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(names, ["p1", "p2", "q", "z"]);
    assert_eq!(all.cursor, None);
    let under_p = backend.list(&ListQuery::new("p", 100)).await.unwrap();
    let names: Vec<&str> = under_p.locks.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(names, ["p1", "p2"]);

    for (prefix, bad) in [("", "nonsense"), ("p", "etcd:z/"), ("", "etcd+:")] {
        let err = backend
            .list(&ListQuery::new(prefix, 10).after(Some(bad)))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad:?}: {err}");
    }
    for lease in held.values() {
        assert!(backend.release(lease).await.unwrap());
    }
}

/// Pages of `list_shared(shape, "", ..)` of `limit`: (key, holders) in
/// page order, and the number of pages.
async fn shared_pages(
    backend: &EtcdBackend,
    shape: LockShape,
    limit: usize,
) -> (Vec<(String, Vec<HolderInfo>)>, usize) {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        pages += 1;
        assert!(pages <= 20, "list_shared({shape}) did not finish");
        let page = backend
            .list_shared(shape, &ListQuery::new("", limit).after(cursor.as_deref()))
            .await
            .unwrap();
        assert!(page.locks.len() <= limit);
        seen.extend(
            page.locks
                .into_iter()
                .map(|l| (l.key.as_str().to_owned(), l.holders)),
        );
        match page.cursor {
            Some(next) => cursor = Some(next),
            None => return (seen, pages),
        }
    }
}

/// `list_shared` and `list_elections` over the range `list` reads, with
/// queues longer than a page's scan (12 raw readers, 12 raw `etcdctl
/// elect`-style candidates: one key's entries fill the scan of a page of
/// 1), an idle read-write lock (its epoch key alone), a waiting writer, our
/// own grants with details and raw entries without, and every other
/// shape's entries beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shared_and_elections_page_through_long_queues() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let ttl = Duration::from_secs(10);
    let backend = connect_for(&server, "lsh", ttl).await;
    let other = connect_for(&server, "lsh", ttl).await;
    let read =
        async |b: &EtcdBackend, name| granted_kind(b, &key(name), LeaseKind::Read, ttl).await;
    let write =
        async |b: &EtcdBackend, name| granted_kind(b, &key(name), LeaseKind::Write, ttl).await;
    let a1 = read(&backend, "a").await;
    let a2 = read(&other, "a").await;
    let c = write(&backend, "c").await;
    // A writer waiting behind `c` is not a holder.
    let waiting = {
        let other = other.clone();
        tokio::spawn(async move {
            other
                .acquire_kind(
                    &key("c"),
                    LeaseKind::Write,
                    ttl,
                    Instant::now() + Duration::from_secs(20),
                )
                .await
        })
    };
    let gone = write(&backend, "g").await;
    assert!(backend.release(&gone).await.unwrap());
    let permit = LeaseKind::permits(1, 3).unwrap();
    let s1 = granted_kind(&backend, &key("s"), permit, ttl).await;
    let s2 = granted_kind(&other, &key("s"), permit, ttl).await;
    let m = granted(&backend, &key("m"), ttl).await;
    let f = backend
        .campaign(&key("f"), ttl, Instant::now() + ttl)
        .await
        .unwrap();
    // Raw entries as an earlier version (readers: `r <owner>`, no details)
    // and `etcdctl elect` (proposal `p`) write them, without a lease.
    let mut kv = backend.client().kv_client();
    let mut e_term = None;
    for i in 0..12 {
        kv.put(format!("lsh/b%rw/e{i:02}"), format!("r {i:032x}"), None)
            .await
            .unwrap();
        let put = kv
            .put(format!("lsh/e%elect/{:x}", 0x100 - i), "p", None)
            .await
            .unwrap();
        e_term.get_or_insert(put.header().unwrap().revision());
    }
    let why = "a second writer was granted";
    common::assert_waiting(&waiting, Duration::from_millis(200), why).await;

    let here = std::process::id();
    let (rw, pages) = shared_pages(&backend, LockShape::ReadWrite, 1).await;
    println!(
        "rwlocks {:?} in {pages} pages",
        rw.iter().map(|(k, h)| (k, h.len())).collect::<Vec<_>>()
    );
    let names: Vec<&str> = rw.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    let mut a_tokens: Vec<_> = rw[0].1.iter().map(|h| h.token).collect();
    a_tokens.sort();
    let mut granted = vec![Some(a1.token()), Some(a2.token())];
    granted.sort();
    assert_eq!(a_tokens, granted);
    assert!(rw[0].1.iter().all(|h| h.kind == LeaseKind::Read
        && h.details.as_ref().is_some_and(|d| d.pid == here)));
    assert_eq!(rw[1].1.len(), 12, "every raw reader of b");
    assert!(rw[1].1.iter().all(|h| h.kind == LeaseKind::Read
        && h.details.is_none()
        && h.token == Some(FencingToken::new(0))));
    assert_eq!(
        rw[2].1.len(),
        1,
        "c's writer, not its waiter: {:?}",
        rw[2].1
    );
    assert_eq!(rw[2].1[0].kind, LeaseKind::Write);
    assert_eq!(rw[2].1[0].token, Some(c.token()));
    assert_eq!(rw[2].1[0].holder, c.owner().to_hex());
    assert!(rw[2].1[0].details.as_ref().is_some_and(|d| d.pid == here));
    assert!(rw[2].1[0].remaining_ttl.is_some_and(|t| t > Duration::ZERO));

    let (sem, _) = shared_pages(&backend, LockShape::Semaphore, 1).await;
    assert_eq!(sem.len(), 1, "{sem:?}");
    assert_eq!(sem[0].0, "s");
    let mut tokens: Vec<_> = sem[0].1.iter().map(|h| h.token).collect();
    tokens.sort();
    let mut granted = vec![Some(s1.token()), Some(s2.token())];
    granted.sort();
    assert_eq!(tokens, granted);
    assert!(
        sem[0]
            .1
            .iter()
            .all(|h| h.kind == permit && h.details.is_some())
    );
    let (all, pages) = shared_pages(&backend, LockShape::ReadWrite, 100).await;
    assert_eq!((all.len(), pages), (3, 1), "one page of 100");

    let mut elections = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..20 {
        let page = backend
            .list_elections(&ListQuery::new("", 1).after(cursor.as_deref()))
            .await
            .unwrap();
        assert!(page.elections.len() <= 1);
        elections.extend(page.elections);
        cursor = page.cursor;
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(cursor, None, "list_elections did not finish");
    let names: Vec<&str> = elections.iter().map(|e| e.election.as_str()).collect();
    assert_eq!(names, ["e", "f"]);
    let e_term = FencingToken::new(u64::try_from(e_term.unwrap()).unwrap());
    assert_eq!(elections[0].leader.holder, "p");
    assert_eq!(
        elections[0].leader.term,
        Some(e_term),
        "the oldest candidate"
    );
    assert_eq!(elections[0].leader.details, None);
    assert_eq!(elections[1].leader.holder, f.owner().to_hex());
    assert_eq!(elections[1].leader.term, Some(f.token()));
    assert!(
        elections[1]
            .leader
            .details
            .as_ref()
            .is_some_and(|d| d.pid == here)
    );
    let under_e = backend
        .list_elections(&ListQuery::new("e", 10))
        .await
        .unwrap();
    assert_eq!(under_e.elections.len(), 1);

    // `list` still sees the mutex alone.
    let mutexes = backend.list(&ListQuery::new("", 100)).await.unwrap();
    let names: Vec<&str> = mutexes.locks.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(names, ["m"]);
    for bad in ["nonsense", "etcd:"] {
        let err = backend
            .list_shared(
                LockShape::Semaphore,
                &ListQuery::new("x", 10).after(Some(bad)),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad:?}: {err}");
    }
    let err = backend
        .list_elections(&ListQuery::new("", 0))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);

    assert!(backend.release(&c).await.unwrap());
    let second = waiting.await.unwrap().unwrap();
    for (b, lease) in [
        (&backend, a1),
        (&other, a2),
        (&other, second),
        (&backend, s1),
        (&other, s2),
        (&backend, m),
        (&backend, f),
    ] {
        assert!(b.release(&lease).await.unwrap());
    }
}

/// `watch_holder` wakes on etcd's watch, not on its poll: with a poll of a
/// minute the shared check still sees a grant, a release and the next
/// grant within 5 s each (a polling implementation would wait the minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_holder_wakes_on_the_store_watch() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let ttl = Duration::from_secs(5);
    let watcher: Arc<dyn LockBackend> = Arc::new(connect_for(&server, "watch", ttl).await);
    let holder: Arc<dyn LockBackend> = Arc::new(connect_for(&server, "watch", ttl).await);
    let seen = conformance::cases::watch_sees_changes(
        watcher,
        holder,
        &key("jobs/w"),
        ttl,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    println!("{seen}");
}
