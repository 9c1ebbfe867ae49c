//! The mutex's Lua scripts (the native layout's; `layout.rs` has
//! Redisson's) and the Lua helpers every granting script shares.

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
/// before. `put_details(lock, side, owner, details, ttl)`: the holder
/// details beside the lock (`<lock>:holder` = `<owner> <details>`),
/// expiring with it ([`expiry_fns`]); nothing without a side key.
/// `grant_again(lock, counter, side, owner, details, ttl, held_as)`: a
/// resent acquire that found our owner in `lock` (as its `held_as`, value
/// or field) returns the grant it made, the counter's token, with the TTL
/// and details set again; fails if the counter vanished (evicted), rather
/// than invent a token.
macro_rules! grant_fns {
    () => {
        concat!(
            $crate::keys::scripts::expiry_fns!(),
            r"
local function grant_token(counter, floor)
  local token = redis.call('INCR', counter)
  if token == 1 and floor then
    local f = tonumber(redis.call('GET', floor) or '0')
    if f and f > 0 then token = redis.call('INCRBY', counter, f) end
  end
  return token
end
local function put_details(lock, side, owner, details, ttl)
  if side and details and details ~= '' then
    redis.call('SET', side, owner .. ' ' .. details, 'PX', ttl)
    expire_together(lock, side, ttl)
  end
end
local function grant_again(lock, counter, side, owner, details, ttl, held_as)
  local token = redis.call('GET', counter)
  if not token then
    return redis.error_reply('ERR distlock: the lock holds our owner ' .. held_as .. ' but its token counter is gone (evicted?)')
  end
  redis.call('PEXPIRE', lock, ttl)
  put_details(lock, side, owner, details, ttl)
  return {1, token}
end
"
        )
    };
}
pub(crate) use grant_fns;

/// The Lua helper of every script that sets a mutex's TTL (grants and
/// renewals). `expire_together(lock, side, ttl)`: `lock` expires in `ttl`
/// ms and its holder details `side` (where given) at the same instant:
/// one absolute `PEXPIREAT` from one `TIME` for both. A relative `PX` or
/// `PEXPIRE` per key is counted from the server's clock at each call,
/// which Redis 7.0 does not freeze inside a script, so details written a
/// millisecond after their lock outlived it (as a share's did: see
/// `keep` in `shared.rs`). Returns what the lock's expiry call returned
/// (1: set, 0: no such key).
macro_rules! expiry_fns {
    () => {
        r"
local function expire_together(lock, side, ttl)
  if not side then return redis.call('PEXPIRE', lock, ttl) end
  local t = redis.call('TIME')
  local at = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ttl))
  redis.call('PEXPIREAT', side, at)
  return redis.call('PEXPIREAT', lock, at)
end
"
    };
}
pub(crate) use expiry_fns;

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
  put_details(KEYS[1], KEYS[3], ARGV[1], ARGV[3], ARGV[2])
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
/// of the lock and its details (at one instant: `expiry_fns`).
const RENEW: &str = concat!(
    expiry_fns!(),
    r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return expire_together(KEYS[1], KEYS[2], ARGV[2])
end
return 0
"
);

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
        Self::with_texts([ACQUIRE, RELEASE, RENEW, INSPECT])
    }

    /// The mutex scripts with these acquire, release, renew and inspect
    /// texts (a layout's; the same KEYS and ARGV shapes in every layout,
    /// so every caller stays layout-blind) and the operators' scripts.
    pub(crate) fn with_texts([acquire, release, renew, inspect]: [&'static str; 4]) -> Self {
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
}
