//! Operating locks on real servers: `gc` of token counters under the
//! token floor (a removed key's next token is above every earlier one, a
//! held key's counter stays; the control: a counter deleted by hand,
//! without the floor, does restart at 1, so the check can fail), `gc` on
//! Cluster under one floor key per slot (the same fence and controls),
//! `gc` on Redlock under one floor per node, `gc` collecting nothing with
//! the legacy layouts, holder details beside the legacy
//! layouts' values (the value other clients compare is unchanged, the
//! side key goes with the lock), `force_release` of another library's
//! holder, and bad list cursors. The gc tests are in `admin/gc.rs`, the
//! listing tests in `admin/listing.rs`.

mod common;

#[path = "admin/gc.rs"]
mod gc;
#[path = "admin/listing.rs"]
mod listing;

use std::sync::Arc;
use std::time::Duration;

use common::raw;
use conformance::OrSkip;
use conformance::cases::watch_across;
use conformance::servers::redis::RedisServer;
use lock_core::{HolderDetails, LockBackend, LockBackendExt, LockKey};
use lock_redis::{RedisBackend, RedisConfig};
use redis::aio::MultiplexedConnection;

async fn backend(url: &str) -> RedisBackend {
    RedisBackend::connect(RedisConfig::from_url(url).unwrap())
        .await
        .unwrap()
}

/// Whether the key `name` exists (on one server, or in a Cluster).
async fn exists(conn: &mut impl redis::aio::ConnectionLike, name: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(name)
        .query_async::<i64>(conn)
        .await
        .unwrap()
        == 1
}

/// Another client's `SET name foreign NX PX 5000`: `None` when refused.
async fn foreign_set_nx(conn: &mut MultiplexedConnection, name: &str) -> Option<String> {
    redis::cmd("SET")
        .arg(name)
        .arg("foreign")
        .arg("NX")
        .arg("PX")
        .arg(5000)
        .query_async(conn)
        .await
        .unwrap()
}

/// The key `name`'s remaining TTL in milliseconds (`PTTL`).
async fn pttl_of(conn: &mut MultiplexedConnection, name: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(name)
        .query_async(conn)
        .await
        .unwrap()
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
    let mut conn = raw(server.port()).await;
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
        let other = foreign_set_nx(&mut conn, &name).await;
        assert!(other.is_none(), "{layout}: SET NX got in beside us");
        let control = foreign_set_nx(&mut conn, &format!("{name}-other")).await;
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
        let pttl = pttl_of(&mut conn, &format!("{name}:holder")).await;
        assert!(pttl > 15_000, "{layout}: the details' TTL is {pttl}");
        // Renewal keeps the details as long as the lock.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        b.renew(&lease).await.unwrap();
        let pttl = pttl_of(&mut conn, &format!("{name}:holder")).await;
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
    let mut conn = raw(server.port()).await;
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
    let mut conn = raw(server.port()).await;
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
