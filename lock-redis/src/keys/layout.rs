//! Key layouts: ours (`native`), and the layouts of other libraries that a
//! fleet may already lock with (`plain`: redis-py `Lock`, redsync,
//! node-redlock; `redisson`: Redisson's `RLock` hash), so that a migration's
//! first phase takes the very lock those clients take.
//!
//! Every layout runs the mutex through the same four script calls (acquire,
//! release, renew, inspect) with the same KEYS and ARGV shapes; only the
//! Redis names and, for Redisson, the scripts differ.

use lock_core::{ErrorKind, LockError, LockKey, Operation};
use redis::cluster_routing::Slot;

use crate::error::NAME;
use crate::keys::names::{KeyNames, holder_key};
use crate::keys::scripts::Scripts;

/// Which Redis data layout the mutex uses (the `layout` URL option, see
/// [`RedisConfig::layout`](crate::RedisConfig::layout) and the crate docs,
/// *Legacy layouts*).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedisLayout {
    /// Ours (`layout=native`, the default): `<prefix>{<key>}` with the hash
    /// tag added by the driver, `distlock:` as the default prefix. Every
    /// lock shape (mutex, fair mutex, read-write lock, semaphore, sets).
    #[default]
    Native,
    /// `layout=plain`: `SET <key> <owner> NX PX <ttl>` at exactly the
    /// user's key (no hash tag, no default prefix), as redis-py `Lock`,
    /// redsync and node-redlock keep it. Mutex only.
    Plain,
    /// `layout=redisson`: the hash `<key> -> {<owner>: <count>}` with a
    /// `PEXPIRE`, as Redisson's `RLock` keeps it. Mutex only.
    Redisson,
}

impl RedisLayout {
    /// The option value: `native`, `plain` or `redisson`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Plain => "plain",
            Self::Redisson => "redisson",
        }
    }

    /// Reads an option value (`native`, `plain`, `redisson`).
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "native" => Some(Self::Native),
            "plain" => Some(Self::Plain),
            "redisson" => Some(Self::Redisson),
            _ => None,
        }
    }

    /// Whether this is one of the other libraries' layouts (mutex only).
    pub(crate) fn is_legacy(self) -> bool {
        self != Self::Native
    }
}

/// What our owner values start with in the legacy layouts (then 32 hex
/// digits): other clients store bare hex of their own.
pub(crate) const LEGACY_OWNER_MARK: &str = "distlock:";

/// The default suffix of a legacy layout's fencing counter: `<key>:token`.
pub const DEFAULT_TOKEN_SUFFIX: &str = ":token";

/// The channel Redisson's `RLock` publishes its unlock message on
/// (`RedissonLock.getChannelName`, `RedissonObject.prefixName`): the key in
/// braces, or as it is when it already contains `{` (its own hash tag).
pub(crate) fn redisson_channel(lock: &str) -> String {
    if lock.contains('{') {
        format!("redisson_lock__channel:{lock}")
    } else {
        format!("redisson_lock__channel:{{{lock}}}")
    }
}

/// The names of one lock in a legacy layout: the lock at `<prefix><key>`,
/// the counter at `<lock><token_suffix>`, the channel `<lock>:released`
/// (plain) or Redisson's (redisson).
pub(crate) fn legacy_names(
    layout: RedisLayout,
    prefix: &str,
    token_suffix: &str,
    key: &LockKey,
) -> KeyNames {
    let lock = format!("{prefix}{}", key.as_str());
    let channel = match layout {
        RedisLayout::Redisson => redisson_channel(&lock),
        _ => format!("{lock}:released"),
    };
    KeyNames {
        counter: format!("{lock}{token_suffix}"),
        channel,
        holder: holder_key(&lock),
        lock,
    }
}

/// In Cluster, the scripts touch the lock and its counter in one call, so
/// both must hash to one slot: refuse (before anything is sent) a key whose
/// counter lands in another slot.
pub(crate) fn check_cluster_slot(
    names: &KeyNames,
    key: &LockKey,
    op: Operation,
) -> Result<(), LockError> {
    let slot = Slot::for_key(&names.lock);
    if slot == Slot::for_key(&names.counter) && slot == Slot::for_key(&names.holder) {
        return Ok(());
    }
    Err(LockError::new(
        ErrorKind::InvalidArgument,
        op,
        format!(
            "in Redis Cluster the key {:?} and its token counter {:?} hash to different slots: \
             put a hash tag in the key (e.g. {{jobs}}:a, so the counter is {{jobs}}:a:token), \
             and use the same tagged key in the other clients",
            names.lock, names.counter
        ),
    )
    .with_backend(NAME)
    .with_key(key))
}

/// Redisson layout, acquire. KEYS: lock, counter, [holder details, [token
/// floor]]. ARGV: owner field, ttl ms, [holder details].
/// Returns `{1, token}` / `{0, pttl}` like the native acquire (details and
/// floor as there: `scripts::grant_fns`).
///
/// Redisson's `tryLockInnerAsync` grants when the key does not exist or
/// its own field is in the hash (reentry: `HINCRBY` +1). Ours grants a key
/// that does not exist (`HINCRBY` field 1, `PEXPIRE`, `INCR` of the
/// counter); finding our own field is a resent script of ours (the cluster
/// client resends after a lost reply), answered with the grant it made and
/// the TTL set again, never a second count. `pcall` because a foreign
/// client may keep another type at the key (then it is simply held).
const REDISSON_ACQUIRE: &str = concat!(
    crate::keys::scripts::grant_fns!(),
    r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local token = grant_token(KEYS[2], KEYS[4])
  put_details(KEYS[1], KEYS[3], ARGV[1], ARGV[3], ARGV[2])
  return {1, token}
end
if redis.pcall('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return grant_again(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[3], ARGV[2], 'field')
end
return {0, redis.call('PTTL', KEYS[1])}
"
);

/// Redisson layout, release. KEYS: lock, [holder details]. ARGV: owner
/// field, channel.
///
/// As Redisson's `unlockInnerAsync`: nothing unless our field is in the
/// hash; `HINCRBY -1`; at 0 `DEL` and publish Redisson's unlock message
/// (`LockPubSub.UNLOCK_MESSAGE`, `0`) on its channel, by `PUBLISH` and, where
/// the server has it (7.0+), `SPUBLISH` too (Redisson in Cluster listens
/// on sharded channels). Our count never goes above 1 (reentry is by scope
/// in lock-core), so the `> 0` branch only keeps the rule Redisson's has.
const REDISSON_RELEASE: &str = r"
if redis.pcall('HEXISTS', KEYS[1], ARGV[1]) ~= 1 then
  return 0
end
local count = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if count > 0 then
  return 1
end
redis.call('DEL', KEYS[1])
if KEYS[2] then redis.call('DEL', KEYS[2]) end
redis.call('PUBLISH', ARGV[2], '0')
redis.pcall('SPUBLISH', ARGV[2], '0')
return 1
";

/// Redisson layout, renew. KEYS: lock, [holder details]. ARGV: owner
/// field, ttl ms. As Redisson's renewal (`LockTask`): `HEXISTS` before
/// `PEXPIRE` (of the details too, at the same instant:
/// `scripts::expiry_fns`).
const REDISSON_RENEW: &str = concat!(
    crate::keys::scripts::expiry_fns!(),
    r"
if redis.pcall('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return expire_together(KEYS[1], KEYS[2], ARGV[2])
end
return 0
"
);

/// Redisson layout, inspect. KEYS: lock, counter, holder details. `{}`
/// when free, else `{holder, pttl, counter, details}`: the hash's (first)
/// field, or `<type>` for a foreign key of another type; `details` the
/// side key's text or `''`.
const REDISSON_INSPECT: &str = r"
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then return {} end
local holder = '<' .. kind .. '>'
if kind == 'hash' then
  holder = redis.call('HKEYS', KEYS[1])[1] or ''
end
return {holder, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or '0', redis.call('GET', KEYS[3]) or ''}
";

/// The mutex scripts of `layout` (Redisson's own acquire, release, renew
/// and inspect; the native ones otherwise: `layout=plain` only names its
/// keys differently).
pub(crate) fn scripts_for(layout: RedisLayout) -> Scripts {
    match layout {
        RedisLayout::Redisson => Scripts::with_texts([
            REDISSON_ACQUIRE,
            REDISSON_RELEASE,
            REDISSON_RENEW,
            REDISSON_INSPECT,
        ]),
        _ => Scripts::new(),
    }
}

/// The typed refusal of a lock shape a legacy layout does not have.
pub(crate) fn legacy_unsupported(
    layout: RedisLayout,
    op: Operation,
    what: &str,
    key: &LockKey,
) -> LockError {
    LockError::new(
        ErrorKind::Unsupported,
        op,
        format!(
            "layout={} has the mutex only: {what} need layout=native (no other client \
             shares those keys)",
            layout.as_str()
        ),
    )
    .with_backend(NAME)
    .with_key(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(layout: RedisLayout, prefix: &str, key: &str) -> KeyNames {
        legacy_names(
            layout,
            prefix,
            DEFAULT_TOKEN_SUFFIX,
            &LockKey::new(key).unwrap(),
        )
    }

    #[test]
    fn legacy_names_are_the_exact_key() {
        let plain = names(RedisLayout::Plain, "", "jobs/a");
        assert_eq!(plain.lock, "jobs/a");
        assert_eq!(plain.counter, "jobs/a:token");
        assert_eq!(plain.channel, "jobs/a:released");
        let prefixed = names(RedisLayout::Plain, "app:", "x");
        assert_eq!(prefixed.lock, "app:x");
        let redisson = names(RedisLayout::Redisson, "", "orders");
        assert_eq!(redisson.lock, "orders");
        assert_eq!(redisson.channel, "redisson_lock__channel:{orders}");
        let tagged = names(RedisLayout::Redisson, "", "{jobs}:a");
        assert_eq!(tagged.channel, "redisson_lock__channel:{jobs}:a");
        let custom = legacy_names(
            RedisLayout::Plain,
            "",
            ".fence",
            &LockKey::new("k").unwrap(),
        );
        assert_eq!(custom.counter, "k.fence");
    }

    #[test]
    fn untagged_keys_are_refused_in_cluster() {
        let op = Operation::TryAcquire;
        let key = LockKey::new("jobs:a").unwrap();
        let err = check_cluster_slot(&names(RedisLayout::Plain, "", "jobs:a"), &key, op)
            .expect_err("jobs:a and jobs:a:token are in different slots");
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.to_string().contains("hash tag"), "{err}");
        let tagged = LockKey::new("{jobs}:a").unwrap();
        check_cluster_slot(&names(RedisLayout::Plain, "", "{jobs}:a"), &tagged, op)
            .expect("a tagged key shares its counter's slot");
    }

    #[test]
    fn layout_names_round_trip() {
        for layout in [
            RedisLayout::Native,
            RedisLayout::Plain,
            RedisLayout::Redisson,
        ] {
            assert_eq!(RedisLayout::parse(layout.as_str()), Some(layout));
        }
        assert_eq!(RedisLayout::parse("Plain"), None);
    }
}
