//! Read-write locks and semaphores on real servers, what is particular to
//! Redis: FIFO permits (one server, a 3-master Cluster, Sentinel), the
//! three shapes of a name kept apart, limit mismatch, holder details
//! beside each share (gone with it), `WAIT` for replicas; Redlock refuses
//! both kinds. The cases every backend shares (exclusion, tokens, writer
//! preference, downgrade, the permit limit) are the conformance suite's
//! (`tests/conformance.rs`). The FIFO check and its broken double live in
//! `tests/shared_checks/mod.rs`; the tests of expiry are in
//! `shared/expiry.rs`, those that count round trips in `shared/costs.rs`.

mod common;
mod shared_checks;

#[path = "shared/costs.rs"]
mod costs;
#[path = "shared/expiry.rs"]
mod expiry;

use std::sync::Arc;
use std::time::Duration;

use common::{RedisTarget, raw, waiting_for_a_replica};
use conformance::OrSkip;
use conformance::servers::redis::RedisServer;
use lock_core::{
    ErrorKind, HolderDetails, Lease, LeaseKind, ListQuery, LockBackend, LockBackendExt, LockShape,
};
use shared_checks::*;
use tokio::time::sleep;

/// Permits are granted in arrival order on one server, in a Cluster and
/// through Sentinel; the check catches a backend whose permit requests do
/// not queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semaphore_permits_are_fifo() {
    let Some((_server, backend)) = single().await else {
        return;
    };
    assert!(backend.capabilities().semaphores);
    let b: Arc<dyn LockBackend> = Arc::new(backend.clone());
    check_semaphore_fifo(b, &key("fifo")).await.unwrap();
    let err = check_semaphore_fifo(PermitsDoNotQueue::wrap(&backend), &key("broken"))
        .await
        .unwrap_err();
    assert!(err.contains("overtook"), "{err}");
    if let Some(target) = RedisTarget::cluster().await.or_skip() {
        let b: Arc<dyn LockBackend> = Arc::new(target.backend().await.expect("connect"));
        check_semaphore_fifo(b, &key("cluster-fifo")).await.unwrap();
    }
    if let Some(target) = RedisTarget::sentinel().await.or_skip() {
        let b: Arc<dyn LockBackend> = Arc::new(target.backend().await.expect("connect"));
        check_semaphore_fifo(b, &key("sentinel-fifo"))
            .await
            .unwrap();
    }
}

/// The three shapes of one name are three locks; holders lists each
/// holder with its kind, token and TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shapes_are_separate_and_holders_are_listed() {
    let Some((_server, b)) = single().await else {
        return;
    };
    let k = key("shapes");
    let mutex = b.try_acquire(&k, TTL).await.unwrap().expect("mutex");
    let w = b
        .try_acquire_kind(&k, LeaseKind::Write, TTL)
        .await
        .unwrap()
        .expect("a write lock beside a mutex of the same name");
    let p = b
        .try_acquire_kind(&k, permits(2, 4), TTL)
        .await
        .unwrap()
        .expect("permits beside both");
    let mutex_holders = b.holders(&k, LockShape::Mutex).await.unwrap();
    assert_eq!(mutex_holders.len(), 1);
    assert_eq!(mutex_holders[0].kind, LeaseKind::Exclusive);
    let rw = b.holders(&k, LockShape::ReadWrite).await.unwrap();
    assert_eq!(rw.len(), 1, "{rw:?}");
    assert_eq!(rw[0].kind, LeaseKind::Write);
    assert_eq!(rw[0].holder, w.owner().to_hex());
    assert_eq!(rw[0].token, Some(w.token()));
    let left = rw[0].remaining_ttl.expect("ttl");
    assert!(left > Duration::from_secs(4) && left <= TTL, "{left:?}");
    let sem = b.holders(&k, LockShape::Semaphore).await.unwrap();
    assert_eq!(sem.len(), 1, "{sem:?}");
    assert_eq!(sem[0].kind, permits(2, 4));
    assert_eq!(sem[0].token, Some(p.token()));
    assert_eq!(sem[0].holder, p.owner().to_hex());
    // Downgrade: the writer becomes a reader, listed with the same token.
    let r = b.downgrade(&w).await.unwrap();
    let r2 = b
        .try_acquire_kind(&k, LeaseKind::Read, TTL)
        .await
        .unwrap()
        .expect("a reader beside the downgraded one");
    let rw = b.holders(&k, LockShape::ReadWrite).await.unwrap();
    assert_eq!(rw.len(), 2, "{rw:?}");
    assert!(
        rw.iter()
            .all(|h| h.kind == LeaseKind::Read && h.token == Some(w.token()))
    );
    // A second downgrade of the same write lease, or of a read lease: NotHeld.
    assert_eq!(
        b.downgrade(&w).await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    assert_eq!(
        b.downgrade(&r).await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    // renew_many across kinds: each lease renewed by its own kind.
    let results = b.renew_many(&[&mutex, &r, &r2, &p, &w]).await;
    for (i, result) in results.iter().take(4).enumerate() {
        assert!(result.is_ok(), "lease {i}: {result:?}");
    }
    assert_eq!(
        results[4].as_ref().unwrap_err().kind(),
        ErrorKind::NotHeld,
        "the downgraded write lease"
    );
    for lease in [&mutex, &r, &r2, &p] {
        assert!(b.release(lease).await.unwrap(), "{}", lease.kind());
        assert!(!b.release(lease).await.unwrap(), "released twice");
    }
    for shape in [LockShape::Mutex, LockShape::ReadWrite, LockShape::Semaphore] {
        assert!(b.holders(&k, shape).await.unwrap().is_empty(), "{shape}");
    }
}

/// Two holders, both this process (by the details' pid).
fn assert_two_of_ours(holders: &[lock_core::HolderInfo], pid: u32) {
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert!(
        holders
            .iter()
            .all(|h| h.details.as_ref().map(|d| d.pid) == Some(pid)),
        "{holders:?}"
    );
}

/// The holder details of shared grants live and die with their share:
/// written by the granting script beside it (readers and permit holders
/// in their shape's `:details` hash, the writer in `<writer>:holder` as
/// the mutex keeps its holder's), expiring with it, kept by renewal,
/// removed by release, swept with an expired share, moved to the readers
/// by a downgrade (same grant time), and reported by `holders`; nothing is
/// left once every share is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_details_live_and_die_with_their_share() {
    let Some((server, b)) = single().await else {
        return;
    };
    let mut conn = raw(server.port()).await;
    let k = key("details");
    let base = b.redis_key(&k);
    let (rw_details, writer_side, sem_details) = (
        format!("{base}:rw:details"),
        format!("{base}:rw:writer:holder"),
        format!("{base}:sem:details"),
    );
    let pid = std::process::id();
    let short = Duration::from_millis(300);
    let cmd = |name: &str, key: &str| {
        let mut c = redis::cmd(name);
        c.arg(key);
        c
    };
    let field = |hash: &str, lease: &Lease| {
        let mut c = redis::cmd("HGET");
        c.arg(hash).arg(lease.owner().to_hex());
        c
    };
    let decode = |text: Option<String>| text.and_then(|t| HolderDetails::decode(&t));

    // The writer: `<owner> <details>` with the writer's TTL, kept by renew.
    let w = take(&b, &k, LeaseKind::Write).await.unwrap().unwrap();
    let side: String = cmd("GET", &writer_side)
        .query_async(&mut conn)
        .await
        .unwrap();
    let (owner, text) = side.split_once(' ').expect("owner and details");
    assert_eq!(owner, w.owner().to_hex());
    let written = HolderDetails::decode(text).expect("the writer's details");
    assert_eq!(written.pid, pid);
    sleep(Duration::from_millis(300)).await;
    b.renew(&w).await.unwrap();
    let pttl: i64 = cmd("PTTL", &writer_side)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        pttl > 4_800 && pttl <= 5_000,
        "the writer's details at {pttl}"
    );
    let holders = b.holders(&k, LockShape::ReadWrite).await.unwrap();
    assert_eq!(holders[0].details.as_ref(), Some(&written), "{holders:?}");

    // Downgrade: the details move to the readers' hash, unchanged.
    let r = b.downgrade(&w).await.unwrap();
    let exists: i64 = cmd("EXISTS", &writer_side)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0, "the writer's details outlive the writer");
    let moved = decode(field(&rw_details, &r).query_async(&mut conn).await.unwrap());
    assert_eq!(moved.as_ref(), Some(&written), "downgrade kept the details");

    // A second reader that crashes, beside it: each has its field; the hash
    // expires with the readers set.
    let crashed = b
        .try_acquire_kind(&k, LeaseKind::Read, short)
        .await
        .unwrap()
        .unwrap();
    let mine = decode(
        field(&rw_details, &crashed)
            .query_async(&mut conn)
            .await
            .unwrap(),
    );
    assert_eq!(mine.map(|d| d.pid), Some(pid));
    let (set, hash): (i64, i64) = redis::pipe()
        .cmd("PTTL")
        .arg(format!("{base}:rw:readers"))
        .cmd("PTTL")
        .arg(&rw_details)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        hash > 4_000 && hash <= set,
        "details {hash} ms, readers {set} ms"
    );
    let holders = b.holders(&k, LockShape::ReadWrite).await.unwrap();
    assert_two_of_ours(&holders, pid);
    // Release takes its field; expiry sweeps the crashed one's at the next
    // grant.
    assert!(b.release(&r).await.unwrap());
    let gone: Option<String> = field(&rw_details, &r).query_async(&mut conn).await.unwrap();
    assert_eq!(gone, None, "release left the details");
    sleep(short + Duration::from_millis(100)).await;
    let r3 = take(&b, &k, LeaseKind::Read).await.unwrap().unwrap();
    let fields: Vec<String> = cmd("HKEYS", &rw_details)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        fields,
        [r3.owner().to_hex()],
        "the expired reader's details stay"
    );
    assert!(b.release(&r3).await.unwrap());

    // Permits: the same, in the semaphore's hash.
    let p1 = take(&b, &k, permits(1, 3)).await.unwrap().unwrap();
    let p2 = b
        .try_acquire_kind(&k, permits(1, 3), short)
        .await
        .unwrap()
        .unwrap();
    let holders = b.holders(&k, LockShape::Semaphore).await.unwrap();
    assert_two_of_ours(&holders, pid);
    assert!(b.release(&p1).await.unwrap());
    let gone: Option<String> = field(&sem_details, &p1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(gone, None, "release left the permit's details");
    sleep(short + Duration::from_millis(100)).await;
    let p3 = take(&b, &k, permits(1, 3)).await.unwrap().unwrap();
    let fields: Vec<String> = cmd("HKEYS", &sem_details)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(fields, [p3.owner().to_hex()], "{p2:?}'s details stay");
    assert!(b.release(&p3).await.unwrap());
    // Nothing but the counters is left.
    assert_only_counters_left(&mut conn, &k).await;
}

/// A semaphore's limit is fixed while it is in use (by holders or
/// waiters); an idle one takes a new limit. Bad counts are typed errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_limits_and_bad_input() {
    let Some((_server, b)) = single().await else {
        return;
    };
    let k = key("limits");
    let a = b
        .try_acquire_kind(&k, permits(1, 3), TTL)
        .await
        .unwrap()
        .unwrap();
    let err = b
        .try_acquire_kind(&k, permits(1, 4), TTL)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains('3'), "{err}");
    let err = b
        .acquire_kind(&k, permits(1, 2), TTL, soon(500))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(b.release(&a).await.unwrap());
    // Idle: a new limit takes effect.
    let c = b
        .try_acquire_kind(&k, permits(5, 5), TTL)
        .await
        .unwrap()
        .expect("5 of an idle semaphore of 5");
    assert!(c.token() > a.token());
    assert!(b.release(&c).await.unwrap());
    for bad in [
        LeaseKind::Permits { count: 0, limit: 3 },
        LeaseKind::Permits { count: 4, limit: 3 },
        LeaseKind::Permits { count: 1, limit: 0 },
        LeaseKind::Permits {
            count: 1,
            limit: lock_core::MAX_PERMITS + 1,
        },
    ] {
        let err = b.try_acquire_kind(&k, bad, TTL).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad:?}");
        let err = b.acquire_kind(&k, bad, TTL, soon(100)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad:?}");
    }
    let err = b
        .try_acquire_kind(&k, LeaseKind::Read, Duration::from_millis(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

/// Redlock refuses both kinds (and listing them), saying why; its
/// capabilities say so too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_shared_kinds() {
    let Some(servers) = RedisServer::start_many(3).await.or_skip() else {
        return;
    };
    let b = lock_redis::connect(&RedisServer::redlock_url(&servers))
        .await
        .unwrap();
    let caps = b.capabilities();
    assert!(!caps.shared_locks && !caps.semaphores);
    let k = key("redlock");
    for kind in [LeaseKind::Read, LeaseKind::Write, permits(1, 2)] {
        let err = b.try_acquire_kind(&k, kind, TTL).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{kind}");
        assert!(err.to_string().contains("majority"), "{err}");
        let err = b.acquire_kind(&k, kind, TTL, soon(100)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{kind}");
    }
    for shape in [LockShape::ReadWrite, LockShape::Semaphore] {
        let err = b.holders(&k, shape).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        let err = b
            .list_shared(shape, &ListQuery::new("", 10))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{shape}");
        assert!(err.to_string().contains("majority"), "{err}");
    }
    // The mutex still works there, and is listed as a shape of its own.
    let lease = b.try_acquire(&k, TTL).await.unwrap().expect("mutex");
    assert_eq!(b.holders(&k, LockShape::Mutex).await.unwrap().len(), 1);
    let page = b
        .list_shared(LockShape::Mutex, &ListQuery::new(k.as_str(), 10))
        .await
        .unwrap();
    assert_eq!(page.locks.len(), 1, "{page:?}");
    assert_eq!(page.locks[0].holders[0].holder, lease.owner().to_hex());
    assert!(b.release(&lease).await.unwrap());
}

/// `replicas=N`: a shared grant waits for N replicas like the mutex's, and
/// one they did not acknowledge is undone and reported as `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_grants_wait_for_replicas() {
    let Some((_master, mut replica, b)) = waiting_for_a_replica().await else {
        return;
    };
    let k = key("waited");
    let r = b
        .try_acquire_kind(&k, LeaseKind::Read, TTL)
        .await
        .unwrap()
        .expect("free");
    let mut on_replica = raw(replica.port()).await;
    let readers: Vec<String> = redis::cmd("ZRANGE")
        .arg(format!("distlock:{{{k}}}:rw:readers"))
        .arg(0)
        .arg(-1)
        .query_async(&mut on_replica)
        .await
        .unwrap();
    assert_eq!(
        readers,
        vec![r.owner().to_hex()],
        "the replica has the reader"
    );
    assert!(b.release(&r).await.unwrap());
    replica.process().pause().unwrap();
    for kind in [LeaseKind::Write, permits(1, 2)] {
        let err = b.try_acquire_kind(&k, kind, TTL).await.unwrap_err();
        assert!(err.is_unavailable(), "{kind}: {err}");
        let err = b.acquire_kind(&k, kind, TTL, soon(600)).await.unwrap_err();
        assert!(
            err.is_unavailable() || err.kind() == ErrorKind::Contended,
            "{kind}: {err}"
        );
    }
    let shapes = [LockShape::ReadWrite, LockShape::Semaphore];
    for shape in shapes {
        assert!(
            b.holders(&k, shape).await.unwrap().is_empty(),
            "{shape} left held"
        );
    }
    replica.process().resume().unwrap();
}
