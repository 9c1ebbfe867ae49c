//! The benchmark floor ([`ZkFloor`]) on a real server: it issues the
//! driver's requests on the driver's node layout, so it excludes with the
//! driver on the same key, and it leaves no node behind.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use conformance::OrSkip;
use conformance::floor::RawFloor;
use conformance::servers::zookeeper::ZkServer;
use lock_bench::zk::ZkFloor;
use lock_core::{ErrorKind, LockBackend, LockBackendExt, LockKey};
use lock_zk::{ZkBackend, ZkConfig};
use zookeeper_client as zk;

/// Lock nodes under every key directory of `root`.
async fn nodes_under(client: &zk::Client, root: &str) -> Vec<String> {
    let mut nodes = Vec::new();
    let dirs = match client.list_children(root).await {
        Ok(dirs) => dirs,
        Err(zk::Error::NoNode) => return nodes,
        Err(err) => panic!("list {root}: {err}"),
    };
    for dir in dirs {
        match client.list_children(&format!("{root}/{dir}")).await {
            Ok(children) => nodes.extend(children.into_iter().map(|c| format!("{dir}/{c}"))),
            Err(zk::Error::NoNode) => {}
            Err(err) => panic!("list {root}/{dir}: {err}"),
        }
    }
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floor_uses_the_driver_layout_and_leaves_nothing_behind() {
    let Some(server) = ZkServer::start().await.or_skip() else {
        return;
    };
    let ttl = Duration::from_secs(5);
    let url = format!("{}/floor?session_timeout=10s&timeout=2s", server.url());
    let floor = Arc::new(ZkFloor::connect(&url).await.unwrap());
    let backend = ZkBackend::connect(ZkConfig::from_url(&url).unwrap())
        .await
        .unwrap();
    let shared = ZkFloor::from_backend(&backend).await.unwrap();
    assert_ne!(Some(shared.session_id()), backend.session_id());
    let admin = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&server.connect_string())
        .await
        .unwrap();
    let root = "/floor/distlock";
    let key = LockKey::new("k").unwrap();
    for _ in 0..3 {
        floor.cycle("k", ttl).await.unwrap();
        shared.cycle("k", ttl).await.unwrap();
    }
    // The floor used the driver's directory for the key.
    let dir = format!("/floor{}", backend.key_path(&key));
    assert!(admin.check_stat(&dir).await.unwrap().is_some(), "{dir}");

    // The driver holds: the floor is refused, and withdraws its node.
    let lease = backend.try_acquire(&key, ttl).await.unwrap().unwrap();
    for floor in [&*floor, &shared] {
        let err = floor.cycle("k", ttl).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Contended, "{err}");
    }
    assert_eq!(admin.list_children(&dir).await.unwrap().len(), 1);
    assert_eq!(
        backend.inspect(&key).await.unwrap().unwrap().token,
        Some(lease.token())
    );
    assert!(backend.release(&lease).await.unwrap());

    // The floor holds (a cycle cancelled after its create left the node
    // behind): the driver is refused until the floor's session ends.
    let stuck = ZkFloor::connect(&url).await.unwrap();
    let held = LockKey::new("held").unwrap();
    let held_dir = format!("/floor{}", backend.key_path(&held));
    {
        let mut cycle = std::pin::pin!(stuck.cycle("held", ttl));
        // Poll it one step at a time until its node exists, then drop it
        // (each poll moves it at most one request further).
        let mut created = false;
        for _ in 0..100 {
            let polled = std::future::poll_fn(|cx| Poll::Ready(cycle.as_mut().poll(cx))).await;
            assert!(polled.is_pending(), "the cycle finished: {polled:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
            if matches!(admin.list_children(&held_dir).await, Ok(c) if !c.is_empty()) {
                created = true;
                break;
            }
        }
        assert!(created, "the floor's create never landed");
    }
    assert!(backend.try_acquire(&held, ttl).await.unwrap().is_none());
    // The floor's node carries what the driver's nodes carry: the driver
    // reads this process's holder details from it.
    let details = backend.inspect(&held).await.unwrap().unwrap().details;
    assert_eq!(
        details.map(|d| d.pid),
        Some(std::process::id()),
        "the floor's node data"
    );
    let err = shared.cycle("held", ttl).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended, "{err}");
    drop(stuck);

    // Parallel cycles on distinct keys, as the benchmarks run them.
    conformance::bench::floor_cycles_in_parallel(floor.clone(), ttl, 8, 20)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        // The dropped floor's node goes with its session.
        let left = nodes_under(&admin, root).await;
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nodes left behind: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Bad inputs are typed errors.
    conformance::bench::assert_floor_refuses_bad_input(&*floor, ttl, Duration::from_millis(1))
        .await;
    let err = ZkFloor::connect("zk://").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}

/// The floor's own session: digest credentials and a chroot from the URL,
/// pings that keep an idle floor's session alive past its timeout, and a
/// session closed (its nodes gone at once) when the floor is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floor_session_credentials_pings_and_close() {
    let Some(server) = ZkServer::start().await.or_skip() else {
        return;
    };
    let ttl = Duration::from_secs(5);
    let hosts = server.connect_string();
    let url = format!("zk://floor:secret@{hosts}/authed?session_timeout=4s&timeout=2s");
    let floor = ZkFloor::connect(&url).await.unwrap();
    let backend = ZkBackend::connect(ZkConfig::from_url(&url).unwrap())
        .await
        .unwrap();
    let key = LockKey::new("k").unwrap();
    floor.cycle("k", ttl).await.unwrap();
    // The floor's grant excludes the driver with the same credentials.
    let grant = floor.try_grant("k", ttl).await.unwrap().unwrap();
    assert!(backend.try_acquire(&key, ttl).await.unwrap().is_none());
    // Its node carries the creator's ACL: another user cannot delete it.
    let admin = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .with_auth("digest", b"other:password")
        .connect(&hosts)
        .await
        .unwrap();
    let node = format!("/authed{}", grant.handle);
    assert!(matches!(
        admin.delete(&node, None).await,
        Err(zk::Error::NoAuth)
    ));
    assert!(floor.release(&grant).await.unwrap());

    // Idle for longer than the session timeout: the floor's pings keep its
    // session (a floor that never pinged would find it expired).
    let idle = floor.session_timeout() + Duration::from_secs(2);
    tokio::time::sleep(idle).await;
    floor.cycle("k", ttl).await.unwrap();

    // Dropping the floor closes its session: a node it holds goes at once,
    // not after the session timeout.
    let grant = floor.try_grant("k", ttl).await.unwrap().unwrap();
    drop(floor);
    let dropped = tokio::time::Instant::now();
    let lease = loop {
        if let Some(lease) = backend.try_acquire(&key, ttl).await.unwrap() {
            break lease;
        }
        assert!(
            dropped.elapsed() < Duration::from_secs(2),
            "the dropped floor's node {} outlived it",
            grant.handle
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(backend.release(&lease).await.unwrap());
}
