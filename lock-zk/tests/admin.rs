//! Operating locks on a real server, beyond the shared suite's cases:
//! `gc` of empty key directories (age, held keys, tokens after a
//! re-grant), `list` cursors and bounds, and `list` in the path layout.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Standalone;
use lock_core::{ErrorKind, ListQuery, LockBackend, LockBackendExt, LockKey, OwnerId};
use zookeeper_client as zk;

const TTL: Duration = Duration::from_secs(5);

fn tag() -> String {
    OwnerId::random().to_hex()[..8].to_owned()
}

async fn exists(raw: &zk::Client, path: &str) -> bool {
    raw.check_stat(path).await.expect("exists").is_some()
}

async fn mkdir(raw: &zk::Client, path: &str) {
    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    raw.create(path, &[], &options).await.expect("create");
}

/// On a root of its own (persistent directories, so nothing but `gc` and
/// release removes them): two empty key directories left behind are kept
/// by `gc` with a 1 h age (the control: the age check can refuse), then
/// both removed with age 0; the held key's directory stays, the holder
/// still renews, a `.`-directory (a shape's parent) is never touched, and
/// a re-grant of a collected key gets a token above its earlier grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_removes_old_empty_directories_only() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let root = format!("/gc-{}", tag());
    let ours = target
        .backend_with(&format!("root={root}&containers=false"), "backend")
        .await;
    let raw = target.raw().await;
    let held = LockKey::new("held").unwrap();
    let left = LockKey::new("left/behind").unwrap();
    let never = LockKey::new("never-used").unwrap();

    let lease = ours.try_acquire(&held, TTL).await.unwrap().expect("free");
    let first = ours.try_acquire(&left, TTL).await.unwrap().expect("free");
    assert!(ours.release(&first).await.unwrap());
    // Leftovers: the directory of a used key and of a never-used one.
    for key in [&left, &never] {
        if !exists(&raw, &ours.key_path(key)).await {
            mkdir(&raw, &ours.key_path(key)).await;
        }
    }
    let shape_dir = format!("{root}/.rwlock");
    mkdir(&raw, &shape_dir).await;

    let young = ours.gc(Duration::from_secs(3600)).await.expect("gc 1h");
    assert_eq!(young.removed, 0, "{young:?}");
    assert_eq!(young.scanned, 3, "held, left/behind, never-used: {young:?}");
    assert!(exists(&raw, &ours.key_path(&left)).await);
    assert!(exists(&raw, &ours.key_path(&never)).await);

    let old = ours.gc(Duration::ZERO).await.expect("gc 0");
    assert_eq!(old.removed, 2, "{old:?}");
    assert_eq!(old.token_floor, None, "czxid tokens need no floor");
    assert!(!exists(&raw, &ours.key_path(&left)).await);
    assert!(!exists(&raw, &ours.key_path(&never)).await);
    assert!(
        exists(&raw, &ours.key_path(&held)).await,
        "a held key's directory was collected"
    );
    assert!(exists(&raw, &shape_dir).await, "gc removed {shape_dir}");
    ours.renew(&lease)
        .await
        .expect("the holder renews after gc");
    let info = ours.inspect(&held).await.unwrap().expect("still held");
    assert_eq!(info.token, Some(lease.token()));

    let again = ours.gc(Duration::ZERO).await.expect("gc again");
    assert_eq!(again.removed, 0, "{again:?}");
    let second = ours.try_acquire(&left, TTL).await.unwrap().expect("free");
    assert!(
        second.token() > first.token(),
        "token after gc {} not above {}",
        second.token(),
        first.token()
    );
    assert!(ours.release(&second).await.unwrap());
    assert!(ours.release(&lease).await.unwrap());
}

/// `list` refuses cursors it did not hand out and page sizes out of
/// range, lists nothing on a root that does not exist, hands out a cursor
/// exactly while more keys remain, and reports our holder details.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_cursors_and_bounds() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let ours = target
        .backend_with(&format!("root=/list-{}", tag()), "backend")
        .await;
    let empty = ours
        .list(&ListQuery::new("", 10))
        .await
        .expect("list of a missing root");
    assert!(
        empty.locks.is_empty() && empty.cursor.is_none(),
        "{empty:?}"
    );
    for bad in ["nope", "zk1:%zz", "zk1:%41"] {
        let err = ours
            .list(&ListQuery::new("", 10).after(Some(bad)))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad}: {err}");
    }
    let err = ours.list(&ListQuery::new("", 1001)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");

    let mut leases = Vec::new();
    for name in ["a/1", "a/2", "a/3", "b/1"] {
        let key = LockKey::new(name).unwrap();
        leases.push(ours.try_acquire(&key, TTL).await.unwrap().expect("free"));
    }
    let first = ours.list(&ListQuery::new("a/", 2)).await.expect("page 1");
    assert_eq!(first.locks.len(), 2, "{first:?}");
    let cursor = first.cursor.clone().expect("a cursor while a/3 remains");
    let second = ours
        .list(&ListQuery::new("a/", 2).after(Some(&cursor)))
        .await
        .expect("page 2");
    assert_eq!(second.locks.len(), 1, "{second:?}");
    assert_eq!(second.cursor, None, "nothing after the last page");
    let mut keys: Vec<_> = first
        .locks
        .iter()
        .chain(&second.locks)
        .map(|l| l.key.as_str().to_owned())
        .collect();
    keys.sort();
    assert_eq!(keys, ["a/1", "a/2", "a/3"]);
    for info in first.locks.iter().chain(&second.locks) {
        let details = info.details.as_ref().expect("details in list");
        assert_eq!(details.pid, std::process::id());
        assert!(info.remaining_ttl.is_some(), "{info:?}");
    }
    for lease in &leases {
        assert!(ours.release(lease).await.unwrap());
    }
}

/// In the path layout `list` covers the root only: the library's own keys
/// (kept under the root) are listed, a path key (outside the root) is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_in_the_path_layout_covers_the_root() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let ours = target
        .backend_with(&format!("layout=path&root=/listpath-{}", tag()), "backend")
        .await;
    let reserved = LockKey::new(format!("__distlock/cutover-{}", tag())).unwrap();
    let path = LockKey::new(format!("/app/locks/list-{}", tag())).unwrap();
    let a = ours
        .try_acquire(&reserved, TTL)
        .await
        .unwrap()
        .expect("free");
    let b = ours.try_acquire(&path, TTL).await.unwrap().expect("free");
    let page = ours.list(&ListQuery::new("", 1000)).await.expect("list");
    let keys: Vec<_> = page.locks.iter().map(|l| l.key.clone()).collect();
    assert_eq!(keys, std::slice::from_ref(&reserved), "{page:?}");
    let info = ours.inspect(&path).await.unwrap().expect("held");
    assert!(info.details.is_some(), "inspect of a path key: {info:?}");
    assert!(ours.release(&a).await.unwrap());
    assert!(ours.release(&b).await.unwrap());
}

/// `watch_holder` wakes on ZooKeeper's watches, not on its poll: with a
/// poll of a minute the shared check still sees a grant (the key's
/// directory did not exist yet), a release and the next grant within 5 s
/// each (a polling implementation would wait the minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_holder_wakes_on_zookeeper_watches() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let options = format!("root=/watch-{}", tag());
    let watcher: Arc<dyn LockBackend> = Arc::new(target.backend_with(&options, "backend").await);
    let holder: Arc<dyn LockBackend> = Arc::new(target.backend_with(&options, "backend").await);
    let seen = conformance::cases::watch_sees_changes(
        watcher,
        holder,
        &LockKey::new("jobs/w").unwrap(),
        TTL,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    println!("{seen}");
}
