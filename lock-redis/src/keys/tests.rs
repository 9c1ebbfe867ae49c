//! The key layout's and the mutex scripts' own tests.

use std::time::Duration;

use lock_core::LockKey;
use redis::Value;
use redis::cluster_routing::Slot;

use super::layout::{RedisLayout, legacy_names, scripts_for};
use super::names::{
    FLOOR_KEY, KeyNames, ReleaseNames, SLOTS, TokenFloor, escape_tag, glob_escape, slot_floors,
    unescape_tag,
};
use super::replies::{NodeGrant, details_of, parse_grant};
use super::scripts::Scripts;
use crate::connection::Conn;
use crate::test_redis::broken;

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

/// Whether the holder details of `names` expire at another instant than
/// the lock, and whether after it: `(misaligned, outlived)`, by their
/// `PEXPIRETIME` (Redis 7.0+; absolute, so no clock passes between the
/// two readings).
async fn details_expiry_miss(conn: &mut Conn, names: &KeyNames) -> (bool, bool) {
    let mut expires_at = async |key: &str| -> i64 {
        conn.query(redis::cmd("PEXPIRETIME").arg(key))
            .await
            .unwrap()
    };
    let lock = expires_at(&names.lock).await;
    let side = expires_at(&names.holder).await;
    assert!(lock > 0 && side > 0, "lock at {lock}, details at {side}");
    (side != lock, side > lock)
}

/// How many of `rounds` grants with holder details, and of their
/// renewals, left the details of `names` expiring at another instant than
/// the lock, and how many of those had the details outlive it: `[grants,
/// renewals]`, each `(misaligned, outlived)`.
async fn details_expiry_misses(
    conn: &mut Conn,
    scripts: &Scripts,
    names: &KeyNames,
    rounds: usize,
) -> [(usize, usize); 2] {
    let details = lock_core::HolderDetails::encode_current();
    let mut misses = [(0, 0); 2];
    let mut count = |at: usize, (misaligned, outlived): (bool, bool)| {
        misses[at].0 += usize::from(misaligned);
        misses[at].1 += usize::from(outlived);
    };
    for _ in 0..rounds {
        let owner = lock_core::OwnerId::random().to_hex();
        let granted = conn
            .eval(
                &scripts.acquire,
                &[&names.lock, &names.counter, &names.holder],
                &[&owner, "30000", &details],
            )
            .await
            .unwrap();
        assert!(grant(&granted).is_some(), "{granted:?}");
        count(0, details_expiry_miss(conn, names).await);
        let renewed = conn
            .eval(
                &scripts.renew,
                &[&names.lock, &names.holder],
                &[&owner, "30000"],
            )
            .await
            .unwrap();
        assert_eq!(renewed, Value::Int(1));
        count(1, details_expiry_miss(conn, names).await);
        let _: i64 = conn
            .query(redis::cmd("DEL").arg(&names.lock).arg(&names.holder))
            .await
            .unwrap();
    }
    misses
}

/// Lua that spins until the server's clock has moved on by a millisecond:
/// put between a lock's expiry and its details' in the scripts below, it
/// makes every round show what a clock tick there does.
const TICK: &str = r"
local function tick()
  local t = redis.call('TIME')
  local from = tonumber(t[1]) * 1000000 + tonumber(t[2])
  repeat
    t = redis.call('TIME')
  until tonumber(t[1]) * 1000000 + tonumber(t[2]) - from >= 1000
end
";

/// `scripts`' acquire and renew with a clock tick ([`TICK`]) between
/// setting the lock's expiry and its details'; `relative`: with the
/// details' expiry as it was, a relative `PX` / `PEXPIRE` per key.
fn ticked(scripts: &Scripts, relative: bool) -> Scripts {
    let define = "local function expire_together(";
    let tick_fn = format!("{TICK}{define}");
    let put = "local function put_details(lock, side, owner, details, ttl)\n";
    let acquire = broken(scripts.acquire.code, put, &format!("{put}  tick()\n"));
    let acquire = broken(acquire.code, define, &tick_fn);
    let (acquire, renew) = if relative {
        let acquire = broken(acquire.code, "    expire_together(lock, side, ttl)\n", "");
        let renew = broken(
            scripts.renew.code,
            "  return expire_together(KEYS[1], KEYS[2], ARGV[2])",
            "  redis.call('PEXPIRE', KEYS[2], ARGV[2])\n  tick()\n  return redis.call('PEXPIRE', KEYS[1], ARGV[2])",
        );
        (acquire, renew)
    } else {
        let side = "  redis.call('PEXPIREAT', side, at)\n";
        let renew = broken(scripts.renew.code, side, &format!("{side}  tick()\n"));
        (acquire, renew)
    };
    Scripts {
        acquire,
        renew: broken(renew.code, define, &tick_fn),
        ..Scripts::new()
    }
}

/// The mutex's holder details expire at their lock's own instant, after a
/// grant and after a renewal, in the native and the Redisson layout (the
/// fair, multi-key and writer grants call the same `put_details`): in
/// plain rounds, and in rounds where the server's clock ticks between the
/// lock's expiry and the details'. The broken variant (the scripts as they
/// were: a relative `PX` / `PEXPIRE` per key, each counted from the
/// server's clock at its own call, which Redis 7.0 does not freeze inside
/// a script) has a grant's details outlive their lock, and a renewal's die
/// before it, on such a tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_details_expire_with_their_lock() {
    let Some((_server, mut conn)) = crate::test_redis::server_and_conn().await else {
        return;
    };
    for layout in [RedisLayout::Native, RedisLayout::Redisson] {
        let key = LockKey::new(format!("details-{}", layout.as_str())).unwrap();
        let names = match layout {
            RedisLayout::Native => KeyNames::new("t:", &key),
            _ => legacy_names(layout, "t:", ":token", &key),
        };
        let real = scripts_for(layout);
        for (what, scripts, rounds) in [
            ("plain rounds", &real, 300),
            ("rounds with a tick", &ticked(&real, false), 30),
        ] {
            let misses = details_expiry_misses(&mut conn, scripts, &names, rounds).await;
            assert_eq!(
                misses,
                [(0, 0); 2],
                "{layout:?}, {rounds} {what}: [grants, renewals] whose details expire \
                 (apart from, after) their lock"
            );
        }
        let misses = details_expiry_misses(&mut conn, &ticked(&real, true), &names, 30).await;
        assert!(
            misses[0].1 > 0 && misses[1].0 > 0,
            "{layout:?}: the broken variant (relative expiries) was not caught: {misses:?}"
        );
        eprintln!("{layout:?}: the broken variant in 30 rounds with a tick: {misses:?}");
    }
}
