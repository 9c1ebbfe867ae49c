//! The blocking API on the in-memory backend, on SQLite (a file, as
//! several processes would share it) and on a real redis-server: the same
//! exclusion, renewal and lost signal as the async API, from threads that
//! run no async code.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use conformance::OrSkip;
use distlock::blocking::Client;
use lock_core::{ErrorKind, ListQuery, LockShape, LockState};

/// Threads take one lock in turn: never two inside, every one gets in.
fn exclusion_and_renewal(url: &str) {
    let client = Client::connect(url).expect("connect");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (client, inside, most) = (client.clone(), inside.clone(), most.clone());
            thread::spawn(move || {
                for _ in 0..5 {
                    let guard = client
                        .lock("blocking/exclusion")
                        .ttl(Duration::from_secs(2))
                        .wait(Duration::from_secs(30))
                        .acquire()
                        .expect("acquire");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(5));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert!(guard.release().expect("release"));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "{url}: two threads inside");
    // A guard outlives its TTL by renewing on its own thread, while this
    // thread blocks.
    let guard = client
        .lock("blocking/renewed")
        .ttl(Duration::from_millis(600))
        .acquire()
        .expect("acquire");
    thread::sleep(Duration::from_millis(1500));
    assert!(
        guard.is_held(),
        "{url}: lost while renewed: {:?}",
        guard.state()
    );
    assert!(
        client
            .lock("blocking/renewed")
            .try_acquire()
            .expect("try")
            .is_none(),
        "{url}: another request got a held lock"
    );
    assert!(guard.release().expect("release"));
    // Without renewal the lock is lost at its deadline, and wait_lost says so.
    let short = client
        .lock("blocking/short")
        .ttl(Duration::from_millis(400))
        .no_renewal()
        .acquire()
        .expect("acquire");
    let reason = short.wait_lost(Duration::from_secs(5)).expect("wait_lost");
    assert!(reason.is_some(), "{url}: no lost signal");
    assert!(matches!(short.state(), LockState::Lost(_)));
    // A set and an election, blocking.
    let set = client
        .lock_all(
            ["blocking/a", "blocking/b"],
            Duration::from_secs(2),
            Duration::ZERO,
        )
        .expect("lock_all");
    assert_eq!(set.tokens().len(), 2);
    assert!(set.release().expect("release set"));
    let leading = client
        .elect("blocking", Duration::from_secs(2), Duration::from_secs(5))
        .expect("elect");
    let leader = client
        .leader("blocking")
        .expect("leader")
        .expect("a leader");
    assert_eq!(leader.term, Some(leading.token()), "{url}");
    assert!(leading.release().expect("resign"));
}

/// The operator's calls, blocking: list the held lock with its holder
/// details, break it, and the next grant's token is above it.
fn operating(url: &str) {
    let client = Client::connect(url).expect("connect");
    let guard = client
        .lock("blocking-ops/a")
        .ttl(Duration::from_secs(5))
        .acquire()
        .expect("acquire");
    let page = client
        .list(&ListQuery::new("blocking-ops/", 10))
        .expect("list");
    assert_eq!(page.locks.len(), 1, "{url}: {page:?}");
    let info = &page.locks[0];
    assert_eq!(info.token, Some(guard.token()), "{url}");
    let details = info.details.as_ref().expect("holder details");
    assert_eq!(details.pid, std::process::id(), "{url}");
    let broken = client
        .force_release("blocking-ops/a")
        .expect("force_release")
        .expect("a holder to break");
    assert_eq!(broken.token, Some(guard.token()));
    let next = client
        .lock("blocking-ops/a")
        .try_acquire()
        .expect("try")
        .expect("free after the break");
    assert!(next.token() > guard.token(), "{url}");
    assert!(next.release().expect("release"));
    assert!(
        client
            .force_release("blocking-ops/a")
            .expect("free")
            .is_none()
    );
    // The library's own keys (a migration's cutover marker) are broken
    // only when asked for by name.
    let marker = "__distlock/migration-cutover/blocking-ops";
    let held = client
        .lock(marker)
        .ttl(Duration::from_secs(5))
        .acquire()
        .expect("acquire the marker");
    let refused = client.force_release(marker).unwrap_err();
    assert_eq!(
        refused.kind(),
        ErrorKind::InvalidArgument,
        "{url}: {refused}"
    );
    let broken = client
        .force_release_reserved(marker)
        .expect("force_release_reserved")
        .expect("a holder to break");
    assert_eq!(broken.token, Some(held.token()), "{url}");
    drop(held);

    // Readers and leaders are listed with their details too.
    let reader = client
        .read_lock("blocking-ops/rw")
        .ttl(Duration::from_secs(5))
        .acquire()
        .expect("read");
    let holders = client
        .holders("blocking-ops/rw", LockShape::ReadWrite)
        .expect("holders");
    assert_eq!(holders.len(), 1, "{url}: {holders:?}");
    assert_eq!(
        holders[0].details.as_ref().map(|d| d.pid),
        Some(std::process::id()),
        "{url}"
    );
    let page = client
        .list_shared(LockShape::ReadWrite, &ListQuery::new("blocking-ops/", 10))
        .expect("list_shared");
    assert_eq!(page.locks.len(), 1, "{url}: {page:?}");
    assert_eq!(page.locks[0].holders.len(), 1, "{url}");
    assert!(reader.release().expect("release"));
    let leading = client
        .elect(
            "blocking-ops/boss",
            Duration::from_secs(5),
            Duration::from_secs(5),
        )
        .expect("elect");
    let page = client
        .list_elections(&ListQuery::new("blocking-ops/", 10))
        .expect("list_elections");
    assert_eq!(page.elections.len(), 1, "{url}: {page:?}");
    assert_eq!(
        page.elections[0].leader.term,
        Some(leading.token()),
        "{url}"
    );
    assert!(leading.release().expect("resign"));
}

#[test]
fn blocking_memory() {
    exclusion_and_renewal("memory://blocking-test");
    operating("memory://blocking-ops");
}

#[test]
fn blocking_sqlite_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    exclusion_and_renewal(&format!("sqlite://{}/locks.db", dir.path().display()));
    operating(&format!("sqlite://{}/ops.db", dir.path().display()));
}

#[test]
fn blocking_redis() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let Some(server) = rt
        .block_on(conformance::servers::redis::RedisServer::start())
        .or_skip()
    else {
        return;
    };
    exclusion_and_renewal(&server.url());
    // Stopped inside its runtime.
    rt.block_on(async move { drop(server) });
}

/// Inside an async runtime the blocking calls refuse with a typed error
/// instead of stalling (or panicking) the runtime's thread.
#[tokio::test]
async fn refused_inside_an_async_runtime() {
    let err = Client::connect("memory://inside").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let client = thread::spawn(|| Client::connect("memory://inside").expect("connect"))
        .join()
        .expect("thread");
    let err = client.lock("k").acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    // Dropping a client here is fine.
    drop(client);
}

/// Bad input is a typed error, as in the async API.
#[test]
fn bad_input_is_typed() {
    assert_eq!(
        Client::connect("nosuch://x").unwrap_err().kind(),
        ErrorKind::Config
    );
    let client = Client::connect("memory://bad").expect("connect");
    let err = client.lock("").acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = client
        .lock("k")
        .ttl(Duration::from_nanos(1))
        .acquire()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}
