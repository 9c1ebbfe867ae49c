//! Listing: `list` matches its prefix literally, and `list_shared` pages
//! through exactly the held read-write locks or semaphores, bounded in
//! `SCAN`s per call, with bad cursors and limits refused.

use std::collections::HashMap;
use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::redis::RedisServer;
use lock_core::{ErrorKind, ListQuery, LockBackend, LockBackendExt, LockKey};
use redis::aio::MultiplexedConnection;

use super::backend;
use crate::common::raw;

/// `list` matches the prefix literally: glob characters in it are
/// escaped (the control, a key the unescaped pattern would match, is not
/// listed), and a `}` in keys round-trips through the hash tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_prefix_is_literal() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let b = backend(&server.url()).await;
    let ttl = Duration::from_secs(20);
    let mut leases = Vec::new();
    for name in ["a*[b]/1", "a*[b]/}x%", "aXb/1", "a*[b]"] {
        let key = LockKey::new(name).unwrap();
        leases.push(b.try_acquire(&key, ttl).await.unwrap().unwrap());
    }
    let page = b.list(&ListQuery::new("a*[b]/", 100)).await.unwrap();
    let mut names: Vec<&str> = page.locks.iter().map(|l| l.key.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["a*[b]/1", "a*[b]/}x%"], "{page:?}");
    assert_eq!(page.cursor, None);
    for info in &page.locks {
        assert_eq!(
            info.details.as_ref().map(|d| d.pid),
            Some(std::process::id())
        );
    }
    for lease in &leases {
        assert!(b.release(lease).await.unwrap());
    }
    assert!(
        b.list(&ListQuery::new("a", 100))
            .await
            .unwrap()
            .locks
            .is_empty()
    );
}

/// The server's count of `SCAN` calls so far (`INFO commandstats`).
async fn scan_calls(conn: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_scan:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// `list_shared` pages through exactly the read-write locks (writers,
/// readers, downgraded writers) or the semaphores held under a prefix,
/// among 10,000 other keys: each key once with all its holders, at most
/// `limit` per page and at most 20 `SCAN`s per call (the server's own
/// count), so the walk takes several calls; the mutex, released locks,
/// the other shape and keys outside the prefix are not listed. Bad cursors
/// and limits are `InvalidArgument`; the legacy layouts refuse the shared
/// shapes (`Unsupported`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shared_is_bounded_and_exact() {
    use lock_core::{LeaseKind, LockShape};
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let b = backend(&server.url()).await;
    let mut conn = raw(server.port()).await;
    for chunk in 0..10 {
        let mut mset = redis::cmd("MSET");
        for i in 0..1_000 {
            mset.arg(format!("noise:{chunk}:{i}")).arg(1);
        }
        let () = mset.query_async(&mut conn).await.unwrap();
    }
    let ttl = Duration::from_secs(30);
    let permit = LeaseKind::permits(1, 3).unwrap();
    let take = |name: String, kind: LeaseKind| {
        let b = &b;
        async move {
            let key = LockKey::new(name).unwrap();
            b.try_acquire_kind(&key, kind, ttl).await.unwrap().unwrap()
        }
    };
    let mut leases = Vec::new();
    let mut rw: HashMap<String, Vec<String>> = HashMap::new();
    for i in 0..12 {
        let name = format!("ls/rw{i}");
        let owners = match i % 3 {
            0 => vec![take(name.clone(), LeaseKind::Write).await],
            1 => vec![
                take(name.clone(), LeaseKind::Read).await,
                take(name.clone(), LeaseKind::Read).await,
            ],
            _ => {
                let w = take(name.clone(), LeaseKind::Write).await;
                vec![b.downgrade(&w).await.unwrap()]
            }
        };
        rw.insert(name, owners.iter().map(|l| l.owner().to_hex()).collect());
        leases.extend(owners);
    }
    let mut sem: HashMap<String, Vec<String>> = HashMap::new();
    for i in 0..5 {
        let name = format!("ls/sem{i}");
        let owners = vec![
            take(name.clone(), permit).await,
            take(name.clone(), permit).await,
        ];
        sem.insert(name, owners.iter().map(|l| l.owner().to_hex()).collect());
        leases.extend(owners);
    }
    let gone = take("ls/gone".to_owned(), LeaseKind::Write).await;
    assert!(b.release(&gone).await.unwrap());
    let gone = take("ls/gone-sem".to_owned(), permit).await;
    assert!(b.release(&gone).await.unwrap());
    leases.push(take("lsx".to_owned(), LeaseKind::Write).await);
    leases.push(take("lsx".to_owned(), permit).await);
    leases.push(
        b.try_acquire(&LockKey::new("ls/m").unwrap(), ttl)
            .await
            .unwrap()
            .unwrap(),
    );

    for (shape, expected) in [(LockShape::ReadWrite, &rw), (LockShape::Semaphore, &sem)] {
        let mut seen = HashMap::new();
        let mut cursor: Option<String> = None;
        let mut calls = 0;
        loop {
            calls += 1;
            assert!(calls < 100, "{shape}: the walk does not end");
            let before = scan_calls(&mut conn).await;
            let page = b
                .list_shared(shape, &ListQuery::new("ls/", 4).after(cursor.as_deref()))
                .await
                .unwrap();
            let scans = scan_calls(&mut conn).await - before;
            assert!(scans <= 20, "{shape}: {scans} SCANs in one call");
            assert!(page.locks.len() <= 4, "{page:?}");
            for lock in page.locks {
                let mut owners: Vec<String> =
                    lock.holders.iter().map(|h| h.holder.clone()).collect();
                owners.sort();
                let pid = std::process::id();
                assert!(
                    lock.holders
                        .iter()
                        .all(|h| h.details.as_ref().map(|d| d.pid) == Some(pid)),
                    "{lock:?}"
                );
                assert!(
                    seen.insert(lock.key.to_string(), owners).is_none(),
                    "{} twice",
                    lock.key
                );
            }
            match page.cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        let mut want = expected.clone();
        for owners in want.values_mut() {
            owners.sort();
        }
        assert_eq!(seen, want, "{shape}");
        // 10,000 keys are more than 20 SCANs of 200 examine.
        assert!(calls >= 3, "{shape}: the walk took {calls} call(s)");
    }
    for bad in ["x", "0", "0:1:zz", "99:0", "0:0:00:1"] {
        let err = b
            .list_shared(
                LockShape::ReadWrite,
                &ListQuery::new("", 10).after(Some(bad)),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad}: {err}");
    }
    for limit in [0, lock_core::MAX_LIST_PAGE + 1] {
        let err = b
            .list_shared(LockShape::Semaphore, &ListQuery::new("", limit))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{limit}: {err}");
    }
    for lease in &leases {
        assert!(b.release(lease).await.unwrap(), "{}", lease.key());
    }
    for layout in ["plain", "redisson"] {
        let legacy = backend(&format!("{}?layout={layout}", server.url())).await;
        for shape in [LockShape::ReadWrite, LockShape::Semaphore] {
            let err = legacy
                .list_shared(shape, &ListQuery::new("", 10))
                .await
                .unwrap_err();
            assert_eq!(
                err.kind(),
                ErrorKind::Unsupported,
                "{layout} {shape}: {err}"
            );
        }
    }
}
