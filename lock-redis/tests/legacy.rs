//! `layout=plain` against the real clients that keep that layout, run as
//! processes: redis-py's `Lock` (PyPI `redis`, `tests/legacy/redis_py_peer.py`)
//! and node-redlock (npm `redlock` 4.2.0 with ioredis,
//! `tests/legacy/redlock_peer.js`), both installed by
//! `scripts/legacy-clients.sh`. For each pair and each direction: while one
//! holds the key, the other's try and short wait are refused; after the
//! release, the other gets it. Negative controls: our default layout on the
//! same key name gets in beside them, and the same check reports it.
//! Also: Redlock (plain layout over 3 servers against node-redlock over the
//! same 3), Redis Cluster (a hash-tagged key works, an untagged one is
//! refused with the hint), the shapes a legacy layout refuses, and the
//! conformance suite on one server with `layout=plain`.
//!
//! Missing clients fail under CI (`CI` set) naming the installer, and skip
//! otherwise.

mod common;
#[path = "legacy/contender.rs"]
mod contender;

use std::sync::Arc;
use std::time::Duration;

use conformance::servers::redis::{RedisCluster, RedisServer};
use conformance::{Harness, OrSkip, run_suite};
use contender::{Contender, Ours, Peer, excludes_both_ways, node_dir, python, unique};
use lock_core::{ErrorKind, LeaseKind, LockBackend, LockBackendExt, LockKey};
use lock_redis::{RedisBackend, RedisConfig, RedisLayout};

async fn backend(url: &str) -> RedisBackend {
    RedisBackend::connect(RedisConfig::from_url(url).expect("url"))
        .await
        .expect("connect")
}

async fn get(port: u16, key: &str) -> Option<String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .expect("GET")
}

/// What our inspect says about a key a peer holds, and what it stores
/// while we hold it: the peer's value as it is (no token), ours with the
/// `distlock:` mark and our token.
async fn check_values(ours: &Ours, peer: &Peer, port: u16, key: &str) {
    let answer = peer.ask(&format!("try {key}")).await.expect("peer try");
    let value = answer
        .strip_prefix("ok ")
        .expect("the peer takes a free key");
    let info = ours
        .backend
        .inspect(&LockKey::new(key).unwrap())
        .await
        .unwrap()
        .expect("inspect sees the peer's lock");
    assert_eq!(info.holder, value, "inspect shows the foreign value");
    assert_eq!(info.token, None, "a foreign holder has no token of ours");
    assert!(info.remaining_ttl.is_some_and(|t| t <= contender::TTL));
    assert_eq!(
        peer.ask(&format!("release {key}")).await.unwrap(),
        "released"
    );

    assert!(ours.try_lock(key).await.unwrap());
    let lease = ours.lease(key).await.unwrap();
    let stored = get(port, key).await.expect("our lock is at the exact key");
    assert_eq!(stored, format!("distlock:{}", lease.owner().to_hex()));
    let info = ours
        .backend
        .inspect(lease.key())
        .await
        .unwrap()
        .expect("held");
    assert_eq!(info.token, Some(lease.token()));
    let counter = get(port, &format!("{key}:token")).await;
    assert_eq!(counter, Some(lease.token().get().to_string()));
    assert!(ours.unlock(key).await.unwrap());
}

/// Both directions against `peer`, with values checked, and the negative
/// control: our native layout (`distlock:{<key>}`) is not the peer's key,
/// gets in beside it, and the check says so.
async fn plain_against(peer: &Peer, port: u16) {
    let url = format!("redis://127.0.0.1:{port}");
    let ours = Ours::new("ours(plain)", backend(&format!("{url}?layout=plain")).await);
    let key = unique("plain");
    excludes_both_ways(&ours, peer, &key)
        .await
        .unwrap_or_else(|e| panic!("{} and layout=plain must exclude: {e}", peer.name()));
    check_values(&ours, peer, port, &unique("values")).await;

    let native = Ours::new("ours(native)", backend(&url).await);
    let err = excludes_both_ways(&native, peer, &unique("control"))
        .await
        .expect_err("the native layout is another key: the check must catch it");
    assert!(
        err.contains("got") && err.contains("while"),
        "the control's report names the overlap: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_lock_and_plain_layout_exclude_both_ways() {
    let Some(python) = python() else { return };
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let peer = Peer::redis_py(&python, server.port()).await;
    plain_against(&peer, server.port()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_redlock_and_plain_layout_exclude_both_ways() {
    let Some(dir) = node_dir() else { return };
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let peer = Peer::redlock(&dir, &[server.port()]).await;
    plain_against(&peer, server.port()).await;
}

/// Through Sentinel (the scripts run on the master it resolves): the
/// same exclusion against redis-py on the master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_and_plain_layout_through_sentinel() {
    let Some(python) = python() else { return };
    let Some(target) = common::RedisTarget::sentinel().await.or_skip() else {
        return;
    };
    let master_port = match &*target.fleet() {
        common::Fleet::Sentinel { master, .. } => master.port(),
        common::Fleet::Cluster(_) => unreachable!("a sentinel target"),
    };
    let url = common::with_option(&target.url, "layout=plain");
    let ours = Ours::new("ours(sentinel, plain)", backend(&url).await);
    let peer = Peer::redis_py(&python, master_port).await;
    excludes_both_ways(&ours, &peer, &unique("sentinel"))
        .await
        .expect("redis-py on the master and layout=plain through Sentinel must exclude");
}

/// Any string at the key holds it (a hand-written `SET NX PX` lock, or a
/// value without a TTL): refused, shown by inspect, never deleted by us.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_foreign_value_holds_a_plain_key() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let ours = backend(&format!("{}?layout=plain&recheck=100ms", server.url())).await;
    let key = LockKey::new(unique("foreign")).unwrap();
    server
        .cli(&["SET", key.as_str(), "worker 7 on host-a", "PX", "600"])
        .unwrap();
    assert!(
        ours.try_acquire(&key, contender::TTL)
            .await
            .unwrap()
            .is_none()
    );
    let info = ours.inspect(&key).await.unwrap().expect("held");
    assert_eq!(info.holder, "worker 7 on host-a");
    assert_eq!(info.token, None);
    // Its TTL ends: a waiting acquire gets it then (no release message).
    let lease = ours
        .acquire(
            &key,
            contender::TTL,
            tokio::time::Instant::now() + Duration::from_secs(3),
        )
        .await
        .expect("granted at the foreign TTL");
    assert!(ours.release(&lease).await.unwrap());
}

/// Redlock over three servers with `layout=plain` against node-redlock over
/// the same three: the same exclusion both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_redlock_and_plain_redlock_exclude_both_ways() {
    let Some(dir) = node_dir() else { return };
    let Some(servers) = RedisServer::start_many(3).await.or_skip() else {
        return;
    };
    let ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    let url = format!("{}?layout=plain", RedisServer::redlock_url(&servers));
    let ours = Ours::new("ours(redlock, plain)", backend(&url).await);
    let peer = Peer::redlock(&dir, &ports).await;
    excludes_both_ways(&ours, &peer, &unique("redlock"))
        .await
        .expect("node-redlock and our Redlock with layout=plain must exclude");
    let native = Ours::new(
        "ours(redlock, native)",
        backend(&RedisServer::redlock_url(&servers)).await,
    );
    excludes_both_ways(&native, &peer, &unique("control"))
        .await
        .expect_err("the native layout is another key: the check must catch it");
}

/// Cluster: a key with a hash tag works (lock and counter in one slot);
/// one without is refused before anything is sent, saying what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_needs_a_hash_tag_in_a_plain_key() {
    let Some(cluster) = RedisCluster::start(3).await.or_skip() else {
        return;
    };
    for layout in ["plain", "redisson"] {
        let url = format!("{}?layout={layout}", cluster.url());
        let ours = Ours::new("ours(cluster)", backend(&url).await);
        let other = Ours::new("other(cluster)", backend(&url).await);
        let tagged = format!("{{jobs}}:{}", unique(layout));
        excludes_both_ways(&ours, &other, &tagged)
            .await
            .expect("a tagged key works in Cluster");
        assert!(ours.try_lock(&tagged).await.unwrap());
        let info = ours
            .backend
            .inspect(&LockKey::new(tagged.as_str()).unwrap())
            .await
            .unwrap()
            .expect("held");
        assert_eq!(info.token, Some(ours.lease(&tagged).await.unwrap().token()));
        assert!(ours.unlock(&tagged).await.unwrap());

        let untagged = LockKey::new(format!("jobs:{}", unique(layout))).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        let errors = [
            ours.backend
                .try_acquire(&untagged, contender::TTL)
                .await
                .map(|_| ())
                .unwrap_err(),
            ours.backend
                .acquire(&untagged, contender::TTL, deadline)
                .await
                .map(|_| ())
                .unwrap_err(),
            ours.backend
                .inspect(&untagged)
                .await
                .map(|_| ())
                .unwrap_err(),
        ];
        for err in errors {
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
            let text = err.to_string();
            assert!(
                text.contains("hash tag") && text.contains("{jobs}:a"),
                "the refusal says what to do: {text}"
            );
        }
    }
    // The library's own keys (a migration's cutover marker) keep the
    // native, tagged names in every layout, so Cluster takes them.
    for layout in ["plain", "redisson"] {
        let url = format!("{}?layout={layout}", cluster.url());
        let ours = backend(&url).await;
        let marker = LockKey::new(format!(
            "{}{}",
            lock_core::CUTOVER_KEY_PREFIX,
            unique(layout)
        ))
        .unwrap();
        assert_eq!(ours.redis_key(&marker), format!("{{{}}}", marker.as_str()));
        let lease = ours
            .try_acquire(&marker, contender::TTL)
            .await
            .unwrap()
            .expect("a free marker");
        assert!(ours.inspect(&marker).await.unwrap().is_some());
        assert!(ours.release(&lease).await.unwrap());
    }
    // Negative control: the native layout adds its own tag, so the same
    // untagged name is accepted there.
    let native = backend(&cluster.url()).await;
    let key = LockKey::new(format!("jobs:{}", unique("native"))).unwrap();
    let lease = native
        .try_acquire(&key, contender::TTL)
        .await
        .unwrap()
        .expect("free");
    assert!(native.release(&lease).await.unwrap());
}

/// The legacy layouts have the mutex only: the other shapes are refused
/// with a typed error, and so is fair mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_layouts_refuse_other_shapes() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    for layout in [RedisLayout::Plain, RedisLayout::Redisson] {
        let config = RedisConfig::from_url(&server.url()).unwrap().layout(layout);
        let ours = RedisBackend::connect(config.clone()).await.unwrap();
        let caps = ours.capabilities();
        assert!(!caps.shared_locks && !caps.semaphores && !caps.fifo);
        let key = LockKey::new(unique("shapes")).unwrap();
        for kind in [
            LeaseKind::Read,
            LeaseKind::Write,
            LeaseKind::Permits { count: 1, limit: 2 },
        ] {
            let err = ours
                .try_acquire_kind(&key, kind, contender::TTL)
                .await
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
            assert!(err.to_string().contains("mutex only"), "{err}");
        }
        let err = ours
            .try_acquire_all(std::slice::from_ref(&key), contender::TTL)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        let err = RedisBackend::connect(config.fair(true)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    }
}

/// Suites run one at a time: they measure timing on a shared machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The whole conformance suite with each legacy layout on one server
/// (multi-locks go one key at a time; the shapes they lack are skipped by
/// capability).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_single_node_legacy_layouts() {
    for option in ["layout=plain", "layout=redisson"] {
        let Some(target) = common::deployed_with("redis", option).await else {
            return;
        };
        let _serial = SERIAL.lock().await;
        let harness = Harness::new(Arc::new(target));
        run_suite(&harness).await.assert_passed();
    }
}
