//! The key layout: how a [`LockKey`] becomes Redis names, and the Lua
//! scripts that grant, release, renew and inspect under those names.
//!
//! Public so that other tools (the benchmark floors of `lock-bench`, an
//! operator's script) take the same lock as the driver on the same key:
//! [`KeyNames`] for the mutex, [`SemNames`] and [`RwNames`] for the shared
//! kinds, [`Scripts`] and [`SHARED`] for the scripts' texts and hashes.
//! The layouts of other libraries (`layout=plain|redisson`) are described
//! on [`RedisLayout`](crate::RedisLayout).

pub(crate) mod fair;
pub(crate) mod layout;
pub(crate) mod shared;

pub use shared::{RwNames, SHARED, SemNames, SharedScripts};

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use lock_core::{LockError, LockKey, Operation};
use redis::Value;
use redis::cluster_routing::Slot;

use crate::conn::Conn;
use crate::error::unexpected;

/// A Lua script with its SHA1, sent by `EVALSHA` (with an `EVAL` fallback
/// when the server lost its script cache).
#[derive(Debug)]
pub struct LuaScript {
    /// The script's text.
    pub code: &'static str,
    /// Its SHA1 in hex, as `EVALSHA` takes it.
    pub hash: String,
}

impl LuaScript {
    /// `code` and its hash.
    pub fn new(code: &'static str) -> Self {
        let hash = redis::Script::new(code).get_hash().to_owned();
        Self { code, hash }
    }
}

/// Lua helpers of every script that grants a mutex (the native, plain
/// and Redisson acquires, the fair acquire, the multi-lock acquire).
///
/// `grant_token(counter, floor)`: `INCR` of the key's token counter; a
/// counter this call created (it answered 1) starts above the token floor
/// (`floor`: the floor key, the server's or in Cluster the counter's
/// slot's, each Redlock node's own; `nil` where there is none), so a key whose counter
/// `gc` removed never hands out a token at or below one it handed out
/// before. `put_details(side, owner, details,
/// ttl)`: the holder details beside the lock (`<lock>:holder` =
/// `<owner> <details>`), with the lock's TTL; nothing without a side key.
/// `grant_again(lock, counter, side, owner, details, ttl, held_as)`: a
/// resent acquire that found our owner in `lock` (as its `held_as`, value
/// or field) returns the grant it made, the counter's token, with the TTL
/// and details set again; fails if the counter vanished (evicted), rather
/// than invent a token.
macro_rules! grant_fns {
    () => {
        r"
local function grant_token(counter, floor)
  local token = redis.call('INCR', counter)
  if token == 1 and floor then
    local f = tonumber(redis.call('GET', floor) or '0')
    if f and f > 0 then token = redis.call('INCRBY', counter, f) end
  end
  return token
end
local function put_details(side, owner, details, ttl)
  if side and details and details ~= '' then
    redis.call('SET', side, owner .. ' ' .. details, 'PX', ttl)
  end
end
local function grant_again(lock, counter, side, owner, details, ttl, held_as)
  local token = redis.call('GET', counter)
  if not token then
    return redis.error_reply('ERR distlock: the lock holds our owner ' .. held_as .. ' but its token counter is gone (evicted?)')
  end
  redis.call('PEXPIRE', lock, ttl)
  put_details(side, owner, details, ttl)
  return {1, token}
end
"
    };
}
pub(crate) use grant_fns;

/// KEYS: lock, counter, [holder details, [token floor]]. ARGV: owner,
/// ttl ms, [holder details].
/// Returns `{1, token}` when granted, `{0, pttl of the holder}` otherwise.
///
/// Idempotent for its own owner value: the same call sent again (the
/// cluster client retries a script after a lost reply or a MOVED/ASK
/// redirect) finds our owner in the key and returns the grant it made,
/// with the TTL set again as a grant would (the details too). The token is
/// the counter's value: only a grant (`SET NX` succeeding, so nobody held
/// the key) increments it, so while our owner value is in the key the
/// counter still holds our token. `pcall` because a foreign client may
/// keep another type at the key (then it is simply held). A counter that
/// vanished (evicted) cannot give our token back: fail rather than invent
/// one.
const ACQUIRE: &str = concat!(
    grant_fns!(),
    r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local token = grant_token(KEYS[2], KEYS[4])
  put_details(KEYS[3], ARGV[1], ARGV[3], ARGV[2])
  return {1, token}
end
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return grant_again(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[3], ARGV[2], 'value')
end
return {0, redis.call('PTTL', KEYS[1])}
"
);

/// KEYS: lock, [holder details]. ARGV: owner, channel. Compare-and-delete
/// (the details with the lock), then tell waiters.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if KEYS[2] then redis.call('DEL', KEYS[2]) end
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
return 0
";

/// KEYS: lock, [holder details]. ARGV: owner, ttl ms. Compare-and-pexpire
/// of the lock and its details.
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if KEYS[2] then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// KEYS: lock, counter, holder details. Returns `{}` when free, else
/// `{holder, pttl, counter, details}` (`details`: the side key's text,
/// `''` when there is none).
const INSPECT: &str = r"
local holder = redis.call('GET', KEYS[1])
if not holder then return {} end
return {holder, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or '0', redis.call('GET', KEYS[3]) or ''}
";

/// KEYS: lock, counter, holder details. ARGV: channel, release message,
/// `1` to `SPUBLISH` it too, the layout's lock type (`string`, `hash`).
/// Breaks the lock whoever holds it (any type: another library's holder
/// too): `{}` when free, else what inspect would have said (the value of
/// the layout's type, `<type>` for another), `{holder, pttl, counter, details}`, after deleting the lock
/// and its details and telling waiters. The counter is left alone, so the
/// next grant's token is above the broken one.
const FORCE_RELEASE: &str = r"
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then return {} end
local holder = '<' .. kind .. '>'
if kind == ARGV[4] and kind == 'string' then
  holder = redis.call('GET', KEYS[1])
elseif kind == ARGV[4] and kind == 'hash' then
  holder = redis.call('HKEYS', KEYS[1])[1] or ''
end
local out = {holder, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or '0', redis.pcall('GET', KEYS[3]) or ''}
if type(out[4]) ~= 'string' then out[4] = '' end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('PUBLISH', ARGV[1], ARGV[2])
if ARGV[3] == '1' then redis.pcall('SPUBLISH', ARGV[1], ARGV[2]) end
return out
";

/// KEYS: lock, counter, token floor. ARGV: idle seconds. Removes a token
/// counter nobody holds nor granted for that long (the counter's
/// `OBJECT IDLETIME`: every grant and inspect touches it), after raising
/// the floor to its value. Only a counter proper (an integer without TTL)
/// is removed. Returns 1 when removed, 0 when kept.
const GC_COUNTER: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('PTTL', KEYS[2]) ~= -1 then return 0 end
local idle = redis.pcall('OBJECT', 'IDLETIME', KEYS[2])
if type(idle) ~= 'number' or idle < tonumber(ARGV[1]) then return 0 end
local token = tonumber(redis.pcall('GET', KEYS[2]))
if not token then return 0 end
local floor = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
if token > floor then redis.call('SET', KEYS[3], string.format('%.0f', token)) end
redis.call('DEL', KEYS[2])
return 1
";

/// The mutex's scripts, hashed once per backend.
#[derive(Debug)]
pub struct Scripts {
    /// KEYS: lock, counter, [holder details, [token floor]]. ARGV: owner,
    /// ttl ms, [holder details]. `SET NX PX` and `INCR` of the counter:
    /// `{1, token}` when granted, `{0, pttl of the holder}` otherwise.
    pub acquire: LuaScript,
    /// KEYS: lock, [holder details]. ARGV: owner, channel.
    /// Compare-and-delete, then `PUBLISH` to waiters: 1 when released.
    pub release: LuaScript,
    /// KEYS: lock, [holder details]. ARGV: owner, ttl ms.
    /// Compare-and-`PEXPIRE`.
    pub renew: LuaScript,
    /// KEYS: lock, counter, holder details: `{}` when free, else
    /// `{holder, pttl, counter, details}`.
    pub inspect: LuaScript,
    /// KEYS: lock, counter, holder details. Breaks the lock whoever holds
    /// it (the same in every layout).
    pub force_release: LuaScript,
    /// KEYS: lock, counter, token floor. Removes an idle token counter
    /// after raising the floor to its value.
    pub gc_counter: LuaScript,
}

impl Scripts {
    /// The native layout's scripts (also those of `layout=plain`, which
    /// only names its keys differently).
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Self::for_layout(crate::RedisLayout::Native)
    }

    /// The mutex scripts of `layout`: the same KEYS and ARGV shapes in
    /// every layout, so every caller stays layout-blind.
    pub(crate) fn for_layout(layout: crate::RedisLayout) -> Self {
        let [acquire, release, renew, inspect] = match layout {
            crate::RedisLayout::Redisson => crate::keys::layout::redisson_scripts(),
            _ => [ACQUIRE, RELEASE, RENEW, INSPECT],
        };
        Self {
            acquire: LuaScript::new(acquire),
            release: LuaScript::new(release),
            renew: LuaScript::new(renew),
            inspect: LuaScript::new(inspect),
            force_release: LuaScript::new(FORCE_RELEASE),
            gc_counter: LuaScript::new(GC_COUNTER),
        }
    }

    pub(crate) fn all(&self) -> [&LuaScript; 4] {
        [&self.acquire, &self.release, &self.renew, &self.inspect]
    }

    /// The acquire call on one connection: the driver's and the floor's.
    /// `ttl_ms` comes from [`ttl_ms`]; `details` is
    /// [`HolderDetails::encode_current`](lock_core::HolderDetails::encode_current);
    /// `floor` the token floor key where `gc` keeps one.
    pub(crate) async fn call_acquire(
        &self,
        conn: &mut Conn,
        names: &KeyNames,
        grant: &GrantArgs<'_>,
    ) -> redis::RedisResult<Value> {
        let mut keys = vec![
            names.lock.as_str(),
            names.counter.as_str(),
            names.holder.as_str(),
        ];
        keys.extend(grant.floor);
        conn.eval(
            &self.acquire,
            &keys,
            &[grant.owner, grant.ttl_ms, grant.details],
        )
        .await
    }

    /// The release call (compare-and-delete, then publish) on one
    /// connection: the driver's and the floor's.
    pub(crate) async fn call_release(
        &self,
        conn: &mut Conn,
        names: &KeyNames,
        owner: &str,
    ) -> redis::RedisResult<Value> {
        conn.eval(
            &self.release,
            &[&names.lock, &names.holder],
            &[owner, &names.channel],
        )
        .await
    }
}

/// The ARGV (and the optional floor key) of one acquire call.
pub(crate) struct GrantArgs<'a> {
    pub(crate) owner: &'a str,
    pub(crate) ttl_ms: &'a str,
    pub(crate) details: &'a str,
    pub(crate) floor: Option<&'a str>,
}

/// The token floor key: one per server, `distlock:token-floor`, for every
/// prefix and layout (a counter created by any of them starts above every
/// token any `gc` removed; never a native name, which has `{` right after
/// its prefix).
pub(crate) const FLOOR_KEY: &str = "distlock:token-floor";

/// The number of Redis Cluster hash slots.
const SLOTS: usize = 16384;

/// The Cluster token floor keys, one per slot: `distlock:token-floor:{<n>%}`
/// for the smallest `n` whose tag `<n>%` hashes to that slot (found once,
/// by trying `n` = 0, 1, ...: 65 778 tries cover every slot). The trailing
/// `%` is never made by [`escape_tag`], so no native name of any prefix is
/// a floor key.
fn slot_floors() -> &'static HashMap<Slot, Box<str>> {
    static FLOORS: OnceLock<HashMap<Slot, Box<str>>> = OnceLock::new();
    FLOORS.get_or_init(|| {
        let mut floors = HashMap::with_capacity(SLOTS);
        let mut n: u32 = 0;
        while floors.len() < SLOTS {
            let tag = format!("{n}%");
            floors
                .entry(Slot::for_key(&tag))
                .or_insert_with(|| format!("{FLOOR_KEY}:{{{tag}}}").into_boxed_str());
            n = n.wrapping_add(1);
        }
        floors
    })
}

/// Where the token floor of a counter is kept (see the crate docs,
/// *Operating locks*, `gc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenFloor {
    /// No floor, no `gc`: the legacy layouts in Cluster.
    Absent,
    /// One server or Sentinel: [`FLOOR_KEY`], one key for every prefix;
    /// Redlock: the same key on each node, the floor of that node's
    /// counters.
    Server,
    /// Cluster: one key per slot, in the counter's slot, so every script
    /// stays within one slot.
    PerSlot,
}

impl TokenFloor {
    /// The floor key of the counter `counter` (`None`: no floor).
    pub(crate) fn key_for(self, counter: &str) -> Option<&'static str> {
        match self {
            Self::Absent => None,
            Self::Server => Some(FLOOR_KEY),
            Self::PerSlot => slot_floors().get(&Slot::for_key(counter)).map(|k| &**k),
        }
    }

    /// Builds what [`key_for`](Self::key_for) needs now (the Cluster table),
    /// so no acquire pays for it.
    pub(crate) fn prepare(self) {
        if self == Self::PerSlot {
            slot_floors();
        }
    }
}

/// The side key that holds the holder details of the lock at `lock`.
pub(crate) fn holder_key(lock: &str) -> String {
    format!("{lock}{HOLDER_SUFFIX}")
}

/// What follows a lock's Redis name in its holder details' key.
pub(crate) const HOLDER_SUFFIX: &str = ":holder";

/// The holder details a side key's text `<owner> <details>` names for the
/// holder `holder` (`None` for another holder's leftovers or no details).
pub(crate) fn details_of(holder: &str, side: &str) -> Option<lock_core::HolderDetails> {
    let (owner, details) = side.split_once(' ')?;
    if owner != holder {
        return None;
    }
    lock_core::HolderDetails::decode(details)
}

/// What one node said to an acquire script.
pub(crate) enum NodeGrant {
    Granted(u64),
    Held(i64),
}

/// One element of an acquire answer, from either reply reader (the redis
/// crate's `Value` in the driver, the floors' own RESP reader).
pub(crate) enum Answer<'a> {
    Int(i64),
    Text(&'a [u8]),
    Other,
}

/// The acquire script's answer `{flag, answer}` (see [`ACQUIRE`]): `{1,
/// token}` granted, the token an integer, or the counter's string when a
/// retried acquire found its own grant; `{0, pttl of the holder}` held;
/// `None` for anything else. The driver's and the floors' reading.
pub(crate) fn grant_of(flag: i64, answer: Answer<'_>) -> Option<NodeGrant> {
    match (flag, answer) {
        (1, Answer::Int(n)) => u64::try_from(n).ok().map(NodeGrant::Granted),
        (1, Answer::Text(bytes)) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|t| t.parse::<u64>().ok())
            .map(NodeGrant::Granted),
        (0, Answer::Int(n)) => Some(NodeGrant::Held(n)),
        _ => None,
    }
}

/// An acquire answer as the redis crate read it.
pub(crate) fn parse_grant(value: &Value) -> Result<NodeGrant, LockError> {
    if let Value::Array(items) = value
        && let [Value::Int(flag), answer] = items.as_slice()
    {
        let answer = match answer {
            Value::Int(n) => Answer::Int(*n),
            Value::BulkString(bytes) => Answer::Text(bytes),
            _ => Answer::Other,
        };
        if let Some(grant) = grant_of(*flag, answer) {
            return Ok(grant);
        }
    }
    Err(unexpected(Operation::Acquire, value))
}

pub(crate) fn as_int(value: &Value, op: Operation) -> Result<i64, LockError> {
    match value {
        Value::Int(n) => Ok(*n),
        other => Err(unexpected(op, other)),
    }
}

pub(crate) fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

pub(crate) fn pttl(ms: i64) -> Option<Duration> {
    u64::try_from(ms)
        .ok()
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

/// A TTL as the acquire script's `PX` argument (whole milliseconds).
pub(crate) fn ttl_ms(ttl: Duration) -> String {
    ttl.as_millis().to_string()
}

/// A key as it stands inside the native layout's hash tag: `%` and `}`
/// percent-encoded (any prefix of a key escapes to a prefix of its escape).
pub(crate) fn escape_tag(key: &str) -> String {
    let mut escaped = String::with_capacity(key.len());
    for c in key.chars() {
        match c {
            '%' => escaped.push_str("%25"),
            '}' => escaped.push_str("%7D"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// The key back from [`escape_tag`]; `None` for text it never makes.
pub(crate) fn unescape_tag(escaped: &str) -> Option<String> {
    let mut out = String::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some(at) = rest.find(['%', '}']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("%25") {
            out.push('%');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("%7D") {
            out.push('}');
            rest = after;
        } else {
            return None;
        }
    }
    out.push_str(rest);
    Some(out)
}

/// `text` matched literally in a `SCAN MATCH` pattern.
pub(crate) fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The Redis names of one lock.
///
/// `lock` = `<prefix>{<key>}`: the hash tag makes the lock and its counter
/// `<prefix>{<key>}:token` share a cluster slot. In the key, `%` and `}`
/// are percent-encoded so the tag always ends where we put its brace and is
/// never empty. The lock key holds the owner value as a plain string, so
/// any client doing `SET <prefix>{<key>} <random> NX PX <ttl>` excludes
/// with us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyNames {
    /// `<prefix>{<key>}`: the owner value, with the lease's TTL.
    pub lock: String,
    /// `<lock>:token`: the key's fencing token counter.
    pub counter: String,
    /// `<lock>:released`: the channel a release publishes on.
    pub channel: String,
    /// `<lock>:holder`: the holder details of our grant (see the crate
    /// docs, *Operating locks*).
    pub holder: String,
}

impl KeyNames {
    /// The names of `key`'s mutex under `prefix` in the native layout.
    pub fn new(prefix: &str, key: &LockKey) -> Self {
        let escaped = escape_tag(key.as_str());
        let lock = format!("{prefix}{{{escaped}}}");
        Self {
            counter: format!("{lock}:token"),
            channel: format!("{lock}:released"),
            holder: holder_key(&lock),
            lock,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn args<'a>(owner: &'a str, ttl_ms: &'a str) -> GrantArgs<'a> {
        GrantArgs {
            owner,
            ttl_ms,
            details: "",
            floor: None,
        }
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
        let first = scripts
            .call_acquire(&mut conn, &names, &args(&owner, "2000"))
            .await
            .unwrap();
        let token = grant(&first).expect("the first call grants");
        // Time passes before the retry: its PX must be applied again.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let retried = scripts
            .call_acquire(&mut conn, &names, &args(&owner, "5000"))
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
        let held = scripts
            .call_acquire(&mut conn, &names, &args(&other, "2000"))
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
        let err = scripts
            .call_acquire(&mut conn, &names, &args(&owner, "2000"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("counter"), "{err}");
    }
}
