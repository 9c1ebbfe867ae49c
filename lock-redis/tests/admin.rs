//! Operating locks on real servers: `gc` of token counters under the
//! token floor (a removed key's next token is above every earlier one, a
//! held key's counter stays; the control: a counter deleted by hand,
//! without the floor, does restart at 1, so the check can fail), `gc` on
//! Cluster under one floor key per slot (the same fence and controls),
//! `gc` on Redlock under one floor per node, `gc` refused with the legacy
//! layouts, holder details beside the legacy
//! layouts' values (the value other clients compare is unchanged, the
//! side key goes with the lock), `force_release` of another library's
//! holder, and bad list cursors.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::cases::watch_across;
use conformance::servers::redis::{RedisCluster, RedisServer};
use lock_core::{ErrorKind, HolderDetails, ListQuery, LockBackend, LockKey};
use lock_redis::{RedisBackend, RedisConfig};
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;

async fn backend(url: &str) -> RedisBackend {
    RedisBackend::connect(RedisConfig::from_url(url).unwrap())
        .await
        .unwrap()
}

async fn raw(server: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn exists(conn: &mut MultiplexedConnection, name: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(name)
        .query_async::<i64>(conn)
        .await
        .unwrap()
        == 1
}

/// Takes and releases `key` `times` times; the last token.
async fn cycle(b: &RedisBackend, key: &LockKey, times: usize) -> u64 {
    let mut token = 0;
    for _ in 0..times {
        let lease = b
            .try_acquire(key, Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        token = lease.token().get();
        assert!(b.release(&lease).await.unwrap());
    }
    token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_removes_idle_counters_and_tokens_stay_above() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let mut conn = raw(&server).await;
    let b = backend(&format!("{}?prefix=gc:", server.url())).await;
    let (freed, held, control) = (
        LockKey::new("freed").unwrap(),
        LockKey::new("held").unwrap(),
        LockKey::new("control").unwrap(),
    );
    let freed_token = cycle(&b, &freed, 3).await;
    let control_token = cycle(&b, &control, 3).await;
    let lease = b
        .try_acquire(&held, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    // Nothing is idle for an hour: nothing goes.
    let report = b.gc(Duration::from_secs(3600)).await.unwrap();
    assert_eq!(report.removed, 0, "{report:?}");
    assert!(exists(&mut conn, "gc:{freed}:token").await);

    // The control: a counter removed without the floor restarts, so the
    // check below would see a token go backwards.
    let _: i64 = redis::cmd("DEL")
        .arg("gc:{control}:token")
        .query_async(&mut conn)
        .await
        .unwrap();
    let restarted = cycle(&b, &control, 1).await;
    assert!(
        restarted <= control_token,
        "control: a counter deleted by hand gave {restarted} after {control_token}"
    );

    let mut removed = 0;
    let mut floor = None;
    for _ in 0..10 {
        let report = b.gc(Duration::ZERO).await.unwrap();
        assert!(report.scanned >= report.removed, "{report:?}");
        floor = report.token_floor;
        removed += report.removed;
        if report.removed == 0 {
            break;
        }
    }
    assert!(
        removed >= 2,
        "gc removed {removed} counters (freed, control)"
    );
    assert!(
        !exists(&mut conn, "gc:{freed}:token").await,
        "idle counter kept"
    );
    assert!(
        exists(&mut conn, "gc:{held}:token").await,
        "the counter of a held key was collected"
    );
    let floor = floor.expect("a floor on one server").get();
    assert!(floor >= freed_token, "floor {floor} below {freed_token}");
    let again = cycle(&b, &freed, 1).await;
    assert!(
        again > freed_token && again > floor,
        "after gc {freed} got token {again}: was {freed_token}, floor {floor}"
    );
    let info = b.inspect(&held).await.unwrap().expect("still held");
    assert_eq!(info.token, Some(lease.token()));
    assert!(b.release(&lease).await.unwrap());
    // The floor is one per server: a counter made under another prefix
    // (or layout) after the gc starts above it too.
    let other = backend(&format!("{}?prefix=gc2:", server.url())).await;
    let fresh = cycle(&other, &LockKey::new("fresh").unwrap(), 1).await;
    assert!(fresh > floor, "a new counter under another prefix: {fresh}");
    // The legacy layouts' counters live among application keys: refused.
    let plain = backend(&format!("{}?layout=plain", server.url())).await;
    let err = plain.gc(Duration::ZERO).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
}

/// Whether every key's token after gc (`after`) is above its token
/// before (`before`): the fence gc must keep. `Err` names the first key
/// whose token went back.
fn tokens_above(before: &[(String, u64)], after: &[(String, u64)]) -> Result<(), String> {
    for ((key, old), (_, new)) in before.iter().zip(after) {
        if new <= old {
            return Err(format!("{key}: token {new} after gc, {old} before"));
        }
    }
    Ok(())
}

/// A key's hash slot, as the server computes it.
async fn slot_of(conn: &mut ClusterConnection, name: &str) -> i64 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(name)
        .query_async(conn)
        .await
        .unwrap()
}

/// The token floor keys of a Cluster by slot (every master scanned), with
/// their values.
async fn slot_floors(cluster: &mut RedisCluster) -> HashMap<i64, (String, u64)> {
    let mut conn = cluster_conn(cluster).await;
    let mut floors = HashMap::new();
    for node in cluster.nodes().iter() {
        let mut raw = raw(node).await;
        let names: Vec<String> = redis::cmd("KEYS")
            .arg("distlock:token-floor*")
            .query_async(&mut raw)
            .await
            .unwrap();
        for name in names {
            let value: u64 = redis::cmd("GET")
                .arg(&name)
                .query_async(&mut raw)
                .await
                .unwrap();
            let slot = slot_of(&mut conn, &name).await;
            assert!(floors.insert(slot, (name, value)).is_none(), "two floors");
        }
    }
    floors
}

async fn cluster_conn(cluster: &mut RedisCluster) -> ClusterConnection {
    let urls: Vec<String> = cluster.nodes().iter().map(RedisServer::url).collect();
    redis::cluster::ClusterClient::new(urls)
        .unwrap()
        .get_async_connection()
        .await
        .unwrap()
}

/// gc on a 3-master Cluster: counters in slots of every master are
/// removed, each after raising the floor key of its own slot, and every
/// key's next token is above its last. The controls: a counter deleted by
/// hand (no floor raised), and a removed counter whose slot's floor key is
/// deleted by hand, restart at 1, which the same check reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_on_cluster_keeps_tokens_above_per_slot() {
    let Some(mut cluster) = RedisCluster::start(3).await.or_skip() else {
        return;
    };
    let mut conn = cluster_conn(&mut cluster).await;
    let b = backend(&format!("{}?prefix=gc:", cluster.url())).await;
    let names: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    let keys: Vec<LockKey> = names
        .iter()
        .map(|n| LockKey::new(n.clone()).unwrap())
        .collect();
    let mut before = Vec::new();
    let mut slots = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        before.push((key.to_string(), cycle(&b, key, 2 + i % 3).await));
        slots.push(slot_of(&mut conn, &format!("gc:{{{key}}}:token")).await);
    }
    let mut distinct = slots.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        keys.len(),
        "the keys share slots: {slots:?}"
    );
    // Every master holds some of the counters: gc must scan them all.
    for node in cluster.nodes().iter() {
        let size: i64 = redis::cmd("DBSIZE")
            .query_async(&mut raw(node).await)
            .await
            .unwrap();
        assert!(size > 0, "master {} holds no counter", node.port());
    }
    let held = LockKey::new("held").unwrap();
    let lease = b
        .try_acquire(&held, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let report = b.gc(Duration::from_secs(3600)).await.unwrap();
    assert_eq!(report.removed, 0, "nothing idle for an hour: {report:?}");

    // Control 1: a counter removed without its floor restarts at 1, and
    // the check sees it.
    let control = LockKey::new("control").unwrap();
    let control_before = vec![("control".to_owned(), cycle(&b, &control, 3).await)];
    let _: i64 = redis::cmd("DEL")
        .arg("gc:{control}:token")
        .query_async(&mut conn)
        .await
        .unwrap();
    let restarted = vec![("control".to_owned(), cycle(&b, &control, 1).await)];
    assert_eq!(restarted[0].1, 1);
    assert!(
        tokens_above(&control_before, &restarted).is_err(),
        "control: the check missed a counter deleted by hand"
    );

    let mut removed = 0;
    for _ in 0..20 {
        let report = b.gc(Duration::ZERO).await.unwrap();
        assert!(report.scanned >= report.removed, "{report:?}");
        assert_eq!(report.token_floor, None, "one floor per slot: {report:?}");
        removed += report.removed;
        if report.removed == 0 && removed > 0 {
            break;
        }
    }
    assert!(
        removed >= 13,
        "gc removed {removed} counters (12 keys, control)"
    );
    for key in &keys {
        assert!(
            !exists_in(&mut conn, &format!("gc:{{{key}}}:token")).await,
            "{key}: idle counter kept"
        );
    }
    assert!(
        exists_in(&mut conn, "gc:{held}:token").await,
        "the counter of a held key was collected"
    );
    // Each removed counter raised the floor key of its own slot.
    let floors = slot_floors(&mut cluster).await;
    for ((key, token), slot) in before.iter().zip(&slots) {
        let (name, floor) = floors.get(slot).expect("a floor in the key's slot");
        assert!(
            floor >= token,
            "{key}: floor {name} = {floor} below {token}"
        );
    }

    // Control 2: the floor key of k0's slot deleted by hand: k0 restarts.
    let (k0_floor, _) = &floors[&slots[0]];
    let _: i64 = redis::cmd("DEL")
        .arg(k0_floor)
        .query_async(&mut conn)
        .await
        .unwrap();
    let k0_after = vec![(names[0].clone(), cycle(&b, &keys[0], 1).await)];
    assert_eq!(k0_after[0].1, 1, "control: k0 without its floor");
    assert!(
        tokens_above(&before[..1], &k0_after).is_err(),
        "control: the check missed a token that went back"
    );

    let mut after = vec![(names[0].clone(), u64::MAX)];
    for key in &keys[1..] {
        after.push((key.to_string(), cycle(&b, key, 1).await));
    }
    tokens_above(&before, &after).unwrap();
    let info = b.inspect(&held).await.unwrap().expect("still held");
    assert_eq!(info.token, Some(lease.token()));
    assert!(b.release(&lease).await.unwrap());

    // list works there too, and a bad cursor is refused.
    for bad in ["x", "0", "0:1:zz", "99:0", "0:0:00:1"] {
        let err = b
            .list(&ListQuery::new("", 10).after(Some(bad)))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad}: {err}");
    }
    // The legacy layouts stay refused in Cluster.
    let plain = backend(&format!("{}?layout=plain", cluster.url())).await;
    let err = plain.gc(Duration::ZERO).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
}

/// Each node's counters of `keys`, as that node holds them (0: none).
async fn node_counters(
    conns: &mut [MultiplexedConnection],
    keys: &[LockKey],
) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for (n, conn) in conns.iter_mut().enumerate() {
        for key in keys {
            let value: Option<u64> = redis::cmd("GET")
                .arg(format!("gc:{{{key}}}:token"))
                .query_async(conn)
                .await
                .unwrap();
            out.push((format!("node {n} {key}"), value.unwrap_or(0)));
        }
    }
    out
}

/// gc on Redlock: each node's idle counters go, each after raising that
/// node's own floor (`distlock:token-floor` on every node), so every
/// node's counter of a key stays strictly increasing, as it was without
/// gc, and so does the token (the highest node counter; still no fence,
/// `FencingScope::None`). A held key's counters stay on every node; a node
/// that does not answer is passed over. The control: a node's counter
/// deleted by hand (no floor raised) restarts at 1, which the same check
/// reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_on_redlock_keeps_every_nodes_counters_above() {
    let Some(mut servers) = RedisServer::start_many(3).await.or_skip() else {
        return;
    };
    let url = format!("{}?prefix=gc:", RedisServer::redlock_url(&servers));
    let b = backend(&url).await;
    let mut conns = Vec::new();
    for server in &servers {
        conns.push(raw(server).await);
    }
    let keys: Vec<LockKey> = ["a", "b", "c", "control"]
        .into_iter()
        .map(|k| LockKey::new(k).unwrap())
        .collect();
    let mut tokens = Vec::new();
    for key in &keys {
        tokens.push((key.to_string(), cycle(&b, key, 3).await));
    }
    let held = LockKey::new("held").unwrap();
    let lease = b
        .try_acquire(&held, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let (control, keys) = keys.split_last().unwrap();
    let before = node_counters(&mut conns, keys).await;
    assert!(before.iter().all(|(_, n)| *n == 3), "{before:?}");

    // The control: node 0's counter deleted by hand, without the floor.
    let control_before = node_counters(&mut conns[..1], std::slice::from_ref(control)).await;
    let _: i64 = redis::cmd("DEL")
        .arg(format!("gc:{{{control}}}:token"))
        .query_async(&mut conns[0])
        .await
        .unwrap();
    cycle(&b, control, 1).await;
    let control_after = node_counters(&mut conns[..1], std::slice::from_ref(control)).await;
    assert!(
        tokens_above(&control_before, &control_after).is_err(),
        "control: the check missed a node counter that restarted: {control_after:?}"
    );

    let report = b.gc(Duration::ZERO).await.unwrap();
    // a, b, c and control on 3 nodes; held's 3 are kept.
    assert_eq!((report.removed, report.scanned), (12, 15), "{report:?}");
    assert_eq!(report.token_floor, None, "one floor per node, no one value");
    for (n, conn) in conns.iter_mut().enumerate() {
        for key in keys {
            assert!(
                !exists(conn, &format!("gc:{{{key}}}:token")).await,
                "node {n}: {key}"
            );
        }
        assert!(
            exists(conn, "gc:{held}:token").await,
            "node {n}: the held key's counter went"
        );
        let floor: u64 = redis::cmd("GET")
            .arg("distlock:token-floor")
            .query_async(conn)
            .await
            .unwrap();
        assert!(floor >= 3, "node {n}: floor {floor}");
    }
    let mut after_tokens = Vec::new();
    for key in keys {
        after_tokens.push((key.to_string(), cycle(&b, key, 1).await));
    }
    let after = node_counters(&mut conns, keys).await;
    tokens_above(&before, &after).unwrap();
    tokens_above(&tokens, &after_tokens).unwrap();
    let info = b.inspect(&held).await.unwrap().expect("still held");
    assert_eq!(info.holder, lease.owner().to_hex());
    assert!(b.release(&lease).await.unwrap());

    // A node down: gc passes it over and collects on the others.
    for key in keys {
        cycle(&b, key, 1).await;
    }
    drop(servers.pop());
    let report = b.gc(Duration::ZERO).await.unwrap();
    assert!(report.removed >= 6, "{report:?}");
    // The legacy layout on Redlock stays refused.
    let plain = backend(&format!(
        "{}?layout=plain",
        RedisServer::redlock_url(&servers)
    ))
    .await;
    let err = plain.gc(Duration::ZERO).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
}

async fn exists_in(conn: &mut ClusterConnection, name: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(name)
        .query_async::<i64>(conn)
        .await
        .unwrap()
        == 1
}

/// Holder details beside the legacy values: the lock key keeps exactly
/// the value other clients compare (`distlock:<hex>` string in plain, the
/// `{field: 1}` hash in redisson), the side key `<key>:holder` has the
/// lock's TTL and goes with it; a foreign holder has no details and is
/// broken by force_release (its value removed, the counter kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn details_beside_legacy_values() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let mut conn = raw(&server).await;
    for layout in ["plain", "redisson"] {
        let b = backend(&format!("{}?layout={layout}", server.url())).await;
        let name = format!("legacy-{layout}");
        let key = LockKey::new(name.clone()).unwrap();
        let lease = b
            .try_acquire(&key, Duration::from_secs(20))
            .await
            .unwrap()
            .unwrap();
        let owner = format!("distlock:{}", lease.owner().to_hex());
        let value: redis::Value = redis::cmd(if layout == "plain" { "GET" } else { "HGETALL" })
            .arg(&name)
            .query_async(&mut conn)
            .await
            .unwrap();
        let expected = if layout == "plain" {
            redis::Value::BulkString(owner.clone().into_bytes())
        } else {
            redis::Value::Map(vec![(
                redis::Value::BulkString(owner.clone().into_bytes()),
                redis::Value::BulkString(b"1".to_vec()),
            )])
        };
        let same = value == expected
            || matches!(
                (&value, layout),
                (redis::Value::Array(items), "redisson") if items.len() == 2
                    && items[0] == redis::Value::BulkString(owner.clone().into_bytes())
            );
        assert!(same, "{layout}: the lock key holds {value:?}");
        // Another client doing SET NX on the key is excluded; on another
        // key (the control) it gets in.
        let other: Option<String> = redis::cmd("SET")
            .arg(&name)
            .arg("foreign")
            .arg("NX")
            .arg("PX")
            .arg(5000)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(other.is_none(), "{layout}: SET NX got in beside us");
        let control: Option<String> = redis::cmd("SET")
            .arg(format!("{name}-other"))
            .arg("foreign")
            .arg("NX")
            .arg("PX")
            .arg(5000)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(control.is_some(), "control: SET NX on another key failed");
        let side: String = redis::cmd("GET")
            .arg(format!("{name}:holder"))
            .query_async(&mut conn)
            .await
            .unwrap();
        let (side_owner, details) = side.split_once(' ').expect("owner and details");
        assert_eq!(side_owner, owner, "{layout}");
        assert_eq!(
            HolderDetails::decode(details).map(|d| d.pid),
            Some(std::process::id())
        );
        let pttl: i64 = redis::cmd("PTTL")
            .arg(format!("{name}:holder"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(pttl > 15_000, "{layout}: the details' TTL is {pttl}");
        // Renewal keeps the details as long as the lock.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        b.renew(&lease).await.unwrap();
        let pttl: i64 = redis::cmd("PTTL")
            .arg(format!("{name}:holder"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(pttl > 19_000, "{layout}: renew left the details at {pttl}");
        let info = b.inspect(&key).await.unwrap().unwrap();
        assert_eq!(
            info.details.map(|d| d.pid),
            Some(std::process::id()),
            "{layout}"
        );
        assert!(b.release(&lease).await.unwrap());
        assert!(
            !exists(&mut conn, &format!("{name}:holder")).await,
            "{layout}"
        );

        // A foreign holder: no details, broken by force_release.
        let _: () = redis::cmd("SET")
            .arg(&name)
            .arg("foreign")
            .arg("PX")
            .arg(10_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let info = b.inspect(&key).await.unwrap().expect("the foreign holder");
        assert_eq!(info.details, None);
        let broken = b.force_release(&key).await.unwrap().expect("broken");
        assert_eq!(broken.holder, info.holder, "{layout}: broke another holder");
        assert_eq!(broken.details, None);
        let shown = if layout == "plain" {
            "foreign"
        } else {
            "<string>"
        };
        assert_eq!(broken.holder, shown, "{layout}");
        assert!(
            !exists(&mut conn, &name).await,
            "{layout}: foreign value kept"
        );
        assert!(
            exists(&mut conn, &format!("{name}:token")).await,
            "{layout}: force_release removed the counter"
        );
        assert!(b.force_release(&key).await.unwrap().is_none());
    }
}

/// `force_release` publishes the release: a waiter whose re-check is
/// 5 s away gets the key at once. The control: the same lock deleted by
/// hand (no message) keeps the waiter waiting past a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_wakes_waiters() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let mut conn = raw(&server).await;
    let url = format!("{}?recheck=5s", server.url());
    let (holder, waiter, admin) = (
        backend(&url).await,
        backend(&url).await,
        backend(&url).await,
    );
    for (name, by_hand) in [("woken", false), ("control", true)] {
        let key = LockKey::new(name).unwrap();
        let _held = holder
            .try_acquire(&key, Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        let wait = {
            let (waiter, key) = (waiter.clone(), key.clone());
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                let lease = waiter
                    .acquire(&key, Duration::from_secs(5), deadline)
                    .await
                    .unwrap();
                (tokio::time::Instant::now(), lease)
            })
        };
        // Let the waiter find the key held and subscribe.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let broken_at = tokio::time::Instant::now();
        if by_hand {
            let _: i64 = redis::cmd("DEL")
                .arg(format!("distlock:{{{name}}}"))
                .query_async(&mut conn)
                .await
                .unwrap();
        } else {
            assert!(admin.force_release(&key).await.unwrap().is_some());
        }
        let (got_at, lease) = wait.await.unwrap();
        let took = got_at - broken_at;
        if by_hand {
            assert!(took > Duration::from_secs(1), "control: woken in {took:?}");
        } else {
            assert!(took < Duration::from_secs(1), "waiter took {took:?}");
        }
        assert!(waiter.release(&lease).await.unwrap());
    }
}

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

/// `watch_holder` on a held key wakes on the release channel: with a poll
/// of a minute, a release (ours, and a `force_release`) is seen within 5 s.
/// The control: a holder's key deleted by hand publishes nothing, so the
/// same watch only sees it when it reads again at its 2 s deadline (so the
/// early wake-ups above came from the channel, not from a read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_holder_wakes_on_the_release_channel() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let mut conn = raw(&server).await;
    let url = format!("{}?prefix=watch:", server.url());
    let (holder, watcher) = (backend(&url).await, backend(&url).await);
    let poll = Duration::from_secs(60);
    let ttl = Duration::from_secs(30);
    for how in ["release", "force_release", "by hand"] {
        let key = LockKey::new(format!("w-{}", how.replace(' ', "-"))).unwrap();
        let lease = holder.try_acquire(&key, ttl).await.unwrap().unwrap();
        let name = format!("watch:{{{}}}", key.as_str());
        let act = async {
            match how {
                "release" => assert!(holder.release(&lease).await.unwrap()),
                "force_release" => assert!(watcher.force_release(&key).await.unwrap().is_some()),
                _ => {
                    let gone: i64 = redis::cmd("DEL")
                        .arg(&name)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    assert_eq!(gone, 1);
                }
            }
        };
        let limit = Duration::from_secs(2);
        let (now, waited) = watch_across(Arc::new(watcher.clone()), &key, poll, limit, act)
            .await
            .unwrap();
        println!("{how}: seen free after {waited:?}");
        if how == "by hand" {
            assert!(
                waited >= Duration::from_secs(2),
                "{how}: woke after {waited:?}"
            );
            // Nothing woke it: the change is read at the deadline.
            assert!(now.is_none(), "{how}: still held at the deadline");
        } else {
            assert!(now.is_none(), "{how}: still held");
            assert!(
                waited < Duration::from_secs(1),
                "{how}: woke after {waited:?}"
            );
        }
    }
}

/// Observers follow a Redis election through the release channel: with an
/// observation interval of a minute, a resignation is seen within 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_wake_when_the_leader_resigns() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let url = format!("{}?prefix=elect:", server.url());
    let (a, b) = (backend(&url).await, backend(&url).await);
    conformance::cases::observer_sees_resignation(Arc::new(a), Arc::new(b))
        .await
        .unwrap();
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
    let mut conn = raw(&server).await;
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
