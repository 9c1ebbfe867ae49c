//! `gc` of token counters under the token floor: on one server (a
//! removed key's next token is above every earlier one, a held key's
//! counter stays; the control: a counter deleted by hand, without the
//! floor, does restart at 1, so the check can fail), on Cluster under one
//! floor key per slot (the same fence and controls), on Redlock under one
//! floor per node, and refused with the legacy layouts.

use std::collections::HashMap;
use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::redis::{RedisCluster, RedisServer};
use lock_core::{ErrorKind, Lease, ListQuery, LockBackend, LockBackendExt, LockKey};
use lock_redis::RedisBackend;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;

use super::{backend, exists};
use crate::common::raw;

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
    let mut conn = raw(server.port()).await;
    let b = backend(&format!("{}?prefix=gc:", server.url())).await;
    let (freed, held, control) = (
        LockKey::new("freed").unwrap(),
        LockKey::new("held").unwrap(),
        LockKey::new("control").unwrap(),
    );
    let freed_token = cycle(&b, &freed, 3).await;
    let control_token = cycle(&b, &control, 3).await;
    let lease = hold(&b, &held).await;
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
    // The legacy layouts' counters live among application keys: gc
    // collects nothing there, and the counter stays.
    let plain = backend(&format!("{}?layout=plain", server.url())).await;
    let plain_key = LockKey::new("plain-kept").unwrap();
    cycle(&plain, &plain_key, 1).await;
    let report = plain.gc(Duration::ZERO).await.unwrap();
    assert_eq!(report, lock_core::GcReport::default());
    assert!(exists(&mut conn, "plain-kept:token").await);
}

/// Takes `key` for 30 s: a held key, whose counter gc must keep.
async fn hold(b: &RedisBackend, key: &LockKey) -> Lease {
    b.try_acquire(key, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap()
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
        let mut raw = raw(node.port()).await;
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
            .query_async(&mut raw(node.port()).await)
            .await
            .unwrap();
        assert!(size > 0, "master {} holds no counter", node.port());
    }
    let held = LockKey::new("held").unwrap();
    let lease = hold(&b, &held).await;
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
            !exists(&mut conn, &format!("gc:{{{key}}}:token")).await,
            "{key}: idle counter kept"
        );
    }
    assert!(
        exists(&mut conn, "gc:{held}:token").await,
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
    // The legacy layouts collect nothing in Cluster either.
    let plain = backend(&format!("{}?layout=plain", cluster.url())).await;
    let report = plain.gc(Duration::ZERO).await.unwrap();
    assert_eq!(report, lock_core::GcReport::default());
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
        conns.push(raw(server.port()).await);
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
    let lease = hold(&b, &held).await;
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
    // The legacy layout on Redlock collects nothing.
    let plain = backend(&format!(
        "{}?layout=plain",
        RedisServer::redlock_url(&servers)
    ))
    .await;
    let report = plain.gc(Duration::ZERO).await.unwrap();
    assert_eq!(report, lock_core::GcReport::default());
}
