//! Operating locks on a real etcd, beyond the shared suite's cases: a guard
//! broken by `force_release` goes `Lost` through the batched renewal
//! (`renew_many`) while a guard beside it stays held; `list` pages through
//! long queues and `etcdctl lock`-style entries (empty values, no details)
//! with the holder chosen by create revision, not by name; bad cursors;
//! `gc` removes nothing and never moves a token back.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::etcd::EtcdServer;
use lock_core::{ErrorKind, FencingToken, LockBackend, LockClient, LockKey, LockState};
use lock_etcd::{EtcdBackend, EtcdConfig};
use tokio::time::{Instant, sleep};

fn config_for(server: &EtcdServer, prefix: &str, ttl: Duration) -> EtcdConfig {
    EtcdConfig::new(server.endpoints())
        .prefix(prefix)
        .ttl(ttl)
        .op_timeout(Duration::from_secs(1))
}

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_makes_the_broken_guard_lost_and_spares_others() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let ttl = Duration::from_secs(2);
    let holder = EtcdBackend::connect(config_for(&server, "force", ttl))
        .await
        .unwrap();
    let admin = EtcdBackend::connect(config_for(&server, "force", ttl))
        .await
        .unwrap();
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
    let backend = EtcdBackend::connect(config_for(&server, "lst", ttl))
        .await
        .unwrap();
    let mut held = HashMap::new();
    for name in ["p1", "p2", "z"] {
        let lease = backend.try_acquire(&key(name), ttl).await.unwrap().unwrap();
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
        let page = backend.list("", cursor.as_deref(), 1).await.unwrap();
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

    let all = backend.list("", None, 100).await.unwrap();
    let names: Vec<&str> = all.locks.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(names, ["p1", "p2", "q", "z"]);
    assert_eq!(all.cursor, None);
    let under_p = backend.list("p", None, 100).await.unwrap();
    let names: Vec<&str> = under_p.locks.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(names, ["p1", "p2"]);

    for (prefix, bad) in [("", "nonsense"), ("p", "etcd:z/"), ("", "etcd+:")] {
        let err = backend.list(prefix, Some(bad), 10).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad:?}: {err}");
    }
    for lease in held.values() {
        assert!(backend.release(lease).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_removes_nothing_and_tokens_keep_rising() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let ttl = Duration::from_secs(10);
    let backend = EtcdBackend::connect(config_for(&server, "gc", ttl))
        .await
        .unwrap();
    let held = backend
        .try_acquire(&key("held"), ttl)
        .await
        .unwrap()
        .unwrap();
    let freed = backend
        .try_acquire(&key("freed"), ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(backend.release(&freed).await.unwrap());
    let report = backend.gc(Duration::from_millis(1)).await.unwrap();
    assert_eq!(report.removed, 0);
    let again = backend
        .try_acquire(&key("freed"), ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(again.token() > freed.token());
    let info = backend.inspect(&key("held")).await.unwrap().expect("held");
    assert_eq!(info.token, Some(held.token()));
    assert!(backend.release(&again).await.unwrap());
    assert!(backend.release(&held).await.unwrap());
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
    let connect = || EtcdBackend::connect(config_for(&server, "watch", ttl));
    let watcher: Arc<dyn LockBackend> = Arc::new(connect().await.unwrap());
    let holder: Arc<dyn LockBackend> = Arc::new(connect().await.unwrap());
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
