//! The key layout's and the mutex scripts' own tests.

use std::time::Duration;

use lock_core::LockKey;
use redis::Value;
use redis::cluster_routing::Slot;

use super::layout::{RedisLayout, legacy_names};
use super::names::{
    FLOOR_KEY, KeyNames, ReleaseNames, SLOTS, TokenFloor, escape_tag, glob_escape, slot_floors,
    unescape_tag,
};
use super::replies::{NodeGrant, details_of, parse_grant};
use super::scripts::Scripts;
use crate::connection::Conn;

fn slot_tag(key: &str) -> &str {
    // The cluster rule: the text between the first '{' and the next '}'.
    if let Some(open) = key.find('{')
        && let Some(len) = key[open + 1..].find('}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

#[test]
fn lock_and_counter_share_a_hash_tag() {
    for name in ["a", "jobs/x", "}", "{", "a}b{c}", "%7D", "}{}"] {
        let names = KeyNames::new("distlock:", &LockKey::new(name).unwrap());
        let tag = slot_tag(&names.lock);
        assert!(!tag.is_empty());
        assert_eq!(tag, slot_tag(&names.counter), "{name}");
        assert_ne!(tag, names.lock, "{name}: the tag must apply");
    }
    // Distinct keys never map to the same Redis key.
    let a = KeyNames::new("p:", &LockKey::new("}").unwrap());
    let b = KeyNames::new("p:", &LockKey::new("%7D").unwrap());
    assert_ne!(a.lock, b.lock);
    assert_eq!(
        KeyNames::new("p:", &LockKey::new("x").unwrap()).lock,
        "p:{x}"
    );
}

#[test]
fn release_names_are_the_mutex_names() {
    for key in ["a", "jobs/7", "50%}off", "}{", "%25"] {
        let key = LockKey::new(key).unwrap();
        for prefix in ["", "app:", "x{y}:"] {
            let names = KeyNames::new(prefix, &key);
            for release in [ReleaseNames::native(prefix, &key), ReleaseNames::of(&names)] {
                let got = release.keys();
                assert_eq!(
                    (got.lock, got.holder, got.channel),
                    (&*names.lock, &*names.holder, &*names.channel),
                    "{prefix:?} {key}"
                );
            }
            for layout in [RedisLayout::Plain, RedisLayout::Redisson] {
                let legacy = legacy_names(layout, prefix, ":token", &key);
                let got = ReleaseNames::of(&legacy);
                let got = got.keys();
                assert_eq!(
                    (got.lock, got.holder, got.channel),
                    (&*legacy.lock, &*legacy.holder, &*legacy.channel)
                );
            }
        }
    }
}

#[test]
fn tags_unescape_and_globs_escape() {
    for key in ["a", "}", "%", "%7D", "a}b%c{", ""] {
        assert_eq!(unescape_tag(&escape_tag(key)).as_deref(), Some(key));
    }
    // Text escape_tag never makes is not a key of ours.
    assert_eq!(unescape_tag("a}b"), None);
    assert_eq!(unescape_tag("%41"), None);
    assert_eq!(glob_escape("a*?[]\\b{"), "a\\*\\?\\[\\]\\\\b{");
    let side = format!("owner {}", lock_core::HolderDetails::encode_current());
    assert!(details_of("owner", &side).is_some());
    assert!(
        details_of("other", &side).is_none(),
        "another holder's leftovers"
    );
    assert!(details_of("owner", "owner").is_none());
}

/// Every slot has a floor key, in that slot (the Cluster client's own
/// hash, as the server's), of a name no native lock name can be.
#[test]
fn every_slot_has_a_floor_key_in_it() {
    let floors = slot_floors();
    assert_eq!(floors.len(), SLOTS);
    let mut names = std::collections::HashSet::new();
    for (slot, key) in floors {
        assert_eq!(Slot::for_key(&**key), *slot, "{key}");
        let tag = slot_tag(key);
        assert!(tag.ends_with('%') && unescape_tag(tag).is_none(), "{key}");
        assert!(names.insert(key.clone()));
    }
    // The floor of a lock's counter shares the lock's slot.
    for name in ["a", "jobs/x", "}", "%", "b"] {
        let names = KeyNames::new("distlock:", &LockKey::new(name).unwrap());
        let floor = TokenFloor::PerSlot.key_for(&names.counter).unwrap();
        assert_eq!(Slot::for_key(floor), Slot::for_key(&names.lock), "{name}");
        assert!(floor.starts_with("distlock:token-floor:{"), "{floor}");
    }
    // "0%": CRC16 (XMODEM) 0x7152, slot 12626, as `CLUSTER KEYSLOT 0%` says.
    assert_eq!(Slot::for_key("0%"), Slot::new(12626).unwrap());
    assert_eq!(TokenFloor::Server.key_for("x"), Some(FLOOR_KEY));
    assert_eq!(TokenFloor::Absent.key_for("x"), None);
}

/// The native acquire script on `conn` (no details, no token floor).
async fn acquire(
    conn: &mut Conn,
    scripts: &Scripts,
    names: &KeyNames,
    owner: &str,
    ttl_ms: &str,
) -> redis::RedisResult<Value> {
    conn.eval(
        &scripts.acquire,
        &[&names.lock, &names.counter, &names.holder],
        &[owner, ttl_ms, ""],
    )
    .await
}

fn grant(value: &Value) -> Option<u64> {
    match parse_grant(value).unwrap() {
        NodeGrant::Granted(token) => Some(token),
        NodeGrant::Held(_) => None,
    }
}

/// Bug 7: a retried acquire script (the cluster client resends it after
/// a lost reply or a MOVED/ASK redirect) finds our own value in the key.
/// It must answer with the grant it made, not "held", and extend the TTL
/// as a grant would; anyone else still finds the key held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_acquire_returns_its_own_grant() {
    let Some((_server, mut conn)) = crate::test_redis::server_and_conn().await else {
        return;
    };
    let scripts = Scripts::new();
    let names = KeyNames::new("t:", &LockKey::new("retried").unwrap());
    let owner = lock_core::OwnerId::random().to_hex();
    let first = acquire(&mut conn, &scripts, &names, &owner, "2000")
        .await
        .unwrap();
    let token = grant(&first).expect("the first call grants");
    // Time passes before the retry: its PX must be applied again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let retried = acquire(&mut conn, &scripts, &names, &owner, "5000")
        .await
        .unwrap();
    assert_eq!(
        grant(&retried),
        Some(token),
        "the retried acquire must return the same grant, got {retried:?}"
    );
    let pttl: i64 = conn
        .query(redis::cmd("PTTL").arg(&names.lock))
        .await
        .unwrap();
    assert!(pttl > 4000, "the retry must extend the TTL: pttl {pttl}");
    let value: String = conn
        .query(redis::cmd("GET").arg(&names.lock))
        .await
        .unwrap();
    assert_eq!(value, owner, "the lock key stays a plain owner string");
    // Someone else is still excluded, and the counter did not move.
    let other = lock_core::OwnerId::random().to_hex();
    let held = acquire(&mut conn, &scripts, &names, &other, "2000")
        .await
        .unwrap();
    assert_eq!(grant(&held), None);
    let counter: u64 = conn
        .query(redis::cmd("GET").arg(&names.counter))
        .await
        .unwrap();
    assert_eq!(counter, token);
    // A lock whose counter vanished (evicted) is not granted a made-up
    // token: the script fails loudly.
    let _: () = conn
        .query(redis::cmd("DEL").arg(&names.counter))
        .await
        .unwrap();
    let err = acquire(&mut conn, &scripts, &names, &owner, "2000")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("counter"), "{err}");
}
