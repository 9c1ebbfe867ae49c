//! Writes guarded by the lock's own store: a caller's Lua script that the
//! server runs only if a mutex lease still holds its lock, the check and
//! the script in one `EVALSHA` (see [`RedisBackend::run_guarded`]).
//!
//! The caller's body is wrapped, not edited: the wrapper checks the lock
//! key first (`KEYS[1]` of the call, the lease's owner value in
//! `ARGV[1]`), then calls the body as
//! `local function body(KEYS, ARGV) <body> end` with the caller's part of
//! the arrays, so the body's `KEYS[i]` and `ARGV[i]` are the caller's own
//! (a local function's parameters: Redis forbids assigning globals).

use lock_core::{ErrorKind, Lease, LeaseKind, LockError, Operation};
use redis::Value;
use redis::cluster_routing::Slot;

use crate::config::RedisTopology;
use crate::connection::{Lane, Servers};
use crate::error::{NAME, unexpected};

/// A caller's Lua script for [`RedisBackend::run_guarded`]: its body,
/// wrapped once (behind the owner check) and hashed for `EVALSHA`. Cheap
/// to reuse: make it once, run it with each call's keys and arguments.
///
/// The body is ordinary Redis Lua: it reads `KEYS[i]` and `ARGV[i]` (the
/// keys and arguments given to `run_guarded`, indexed from 1 as usual),
/// calls `redis.call`, and its `return` value is the reply
/// ([`RedisGuardedReply::Ran`]). It must name every key it touches in
/// `KEYS` (Redis Cluster routes and checks the script by them).
///
/// [`RedisBackend::run_guarded`]: crate::RedisBackend::run_guarded
#[derive(Clone, Debug)]
pub struct RedisGuardedScript {
    body: String,
    code: String,
    hash: String,
}

/// The owner check before a caller's body. KEYS[1]: the lock; ARGV[1]:
/// the lease's owner value, ARGV[2]: the lock key's type in the layout
/// (`hash` for Redisson's, `string` otherwise). `pcall`: a key of another
/// type (another library's lock) is simply not ours. `{0}` when not held;
/// else `{1, <the body's reply>}` (a `nil` reply makes `{1}`), or the
/// body's error reply as the script's error.
const CHECK: &str = r"
local held
if ARGV[2] == 'hash' then
  held = redis.pcall('HEXISTS', KEYS[1], ARGV[1]) == 1
else
  held = redis.pcall('GET', KEYS[1]) == ARGV[1]
end
if not held then return {0} end
local caller_keys, caller_argv = {}, {}
for i = 2, #KEYS do caller_keys[i - 1] = KEYS[i] end
for i = 3, #ARGV do caller_argv[i - 2] = ARGV[i] end
local function body(KEYS, ARGV)
";

/// After the caller's body (its own line, so a body that ends in a
/// comment still closes).
const CALL: &str = r"
end
local reply = body(caller_keys, caller_argv)
if type(reply) == 'table' and reply.err then return reply end
return {1, reply}
";

impl RedisGuardedScript {
    /// The script whose body is `body` (Lua, as in `EVAL`; see the type's
    /// docs for what it may use).
    pub fn new(body: impl Into<String>) -> Self {
        let body = body.into();
        let code = format!("{CHECK}{body}{CALL}");
        let hash = redis::Script::new(&code).get_hash().to_owned();
        Self { body, code, hash }
    }

    /// The caller's body, as given.
    pub fn body(&self) -> &str {
        &self.body
    }
}

/// What [`RedisBackend::run_guarded`] answered: exhaustive on purpose, so
/// a `match` has to say what happens when the lock was lost.
///
/// [`RedisBackend::run_guarded`]: crate::RedisBackend::run_guarded
#[derive(Clone, Debug, PartialEq)]
pub enum RedisGuardedReply {
    /// The lease held its lock when the script ran: the body ran, and this
    /// is its reply (`Nil` for a body that returns nothing).
    Ran(Value),
    /// The lease no longer held its lock (released, expired, or the key
    /// was broken and maybe granted to another owner): the body did not
    /// run, nothing was written.
    NotHeld,
}

impl RedisGuardedReply {
    /// The body's reply when it ran; `None` when the lease no longer held
    /// its lock.
    pub fn ran(self) -> Option<Value> {
        match self {
            Self::Ran(value) => Some(value),
            Self::NotHeld => None,
        }
    }

    /// Whether the body ran.
    pub fn is_ran(&self) -> bool {
        matches!(self, Self::Ran(_))
    }
}

/// The `{...}` hash tag of the Redis name `name` as Redis Cluster reads it
/// (the text between the first `{` and the next `}`, when not empty),
/// braces included.
pub(crate) fn hash_tag(name: &str) -> Option<&str> {
    let open = name.find('{')?;
    let close = name[open..].find('}')? + open;
    (close > open + 1).then(|| &name[open..=close])
}

fn refused(kind: ErrorKind, lease: &Lease, message: String) -> LockError {
    LockError::new(kind, Operation::GuardedWrite, message)
        .with_backend(NAME)
        .with_key(lease.key())
}

/// The call behind [`RedisBackend::run_guarded`]: refusals before
/// anything is sent, then the one script call.
///
/// [`RedisBackend::run_guarded`]: crate::RedisBackend::run_guarded
pub(crate) async fn run(
    servers: &Servers,
    lease: &Lease,
    script: &RedisGuardedScript,
    keys: &[&str],
    args: &[&str],
) -> Result<RedisGuardedReply, LockError> {
    if servers.redlock {
        return Err(refused(
            ErrorKind::Unsupported,
            lease,
            "Redlock has no guarded writes: its lock is a majority of independent \
             servers, and no one server can check that majority in the same step as a \
             write (a write checked on one node still lands where the lock was lost)"
                .to_owned(),
        ));
    }
    if lease.kind() != LeaseKind::Exclusive {
        return Err(refused(
            ErrorKind::Unsupported,
            lease,
            format!(
                "guarded writes take a mutex lease, not a {:?} one",
                lease.kind()
            ),
        ));
    }
    // A legacy key whose counter is in another Cluster slot: refused
    // before anything is sent, as its grant was.
    let names = servers.keys.mutex(lease.key(), Operation::GuardedWrite)?;
    let op = Operation::GuardedWrite;
    if matches!(servers.config.topology, RedisTopology::Cluster(_)) {
        let slot = Slot::for_key(&names.lock);
        if let Some(key) = keys.iter().find(|k| Slot::for_key(k) != slot) {
            let tag = hash_tag(&names.lock).map_or_else(
                || "none: the lock's name has no hash tag; put one in the key".to_owned(),
                |tag| format!("{tag}, e.g. {tag}:data"),
            );
            return Err(refused(
                ErrorKind::InvalidArgument,
                lease,
                format!(
                    "in Redis Cluster a guarded script's keys must share the lock's slot: \
                     {key:?} is not in the slot of {:?} (use the lock's hash tag: {tag})",
                    names.lock
                ),
            ));
        }
    }
    let owner = servers.keys.owner_value(lease.owner());
    let mut all_keys = Vec::with_capacity(keys.len() + 1);
    all_keys.push(names.lock.as_str());
    all_keys.extend_from_slice(keys);
    let mut all_args = Vec::with_capacity(args.len() + 2);
    all_args.push(&*owner);
    all_args.push(servers.keys.lock_type());
    all_args.extend_from_slice(args);
    let (all_keys, all_args) = (&all_keys, &all_args);
    let value = servers
        .first()
        .run_on(Lane::ANY, op, servers.timeout(), |mut conn| async move {
            conn.eval_text(&script.code, &script.hash, all_keys, all_args)
                .await
        })
        .await
        .map_err(|e| e.with_key(lease.key()))?;
    parse_reply(value).map_err(|e| e.with_key(lease.key()))
}

/// The wrapper's answer: `{0}` not held, `{1}` ran and returned nothing,
/// `{1, reply}` ran.
fn parse_reply(value: Value) -> Result<RedisGuardedReply, LockError> {
    if let Value::Array(mut items) = value {
        match items.first() {
            Some(Value::Int(0)) if items.len() == 1 => return Ok(RedisGuardedReply::NotHeld),
            Some(Value::Int(1)) if items.len() <= 2 => {
                let reply = if items.len() == 2 {
                    items.swap_remove(1)
                } else {
                    Value::Nil
                };
                return Ok(RedisGuardedReply::Ran(reply));
            }
            _ => return Err(unexpected(Operation::GuardedWrite, &items)),
        }
    }
    Err(unexpected(Operation::GuardedWrite, &value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_tags_as_cluster_reads_them() {
        assert_eq!(hash_tag("distlock:{jobs}"), Some("{jobs}"));
        assert_eq!(hash_tag("a{b}c{d}"), Some("{b}"));
        assert_eq!(hash_tag("a{}b{c}"), None);
        assert_eq!(hash_tag("plain"), None);
        assert_eq!(hash_tag("open{only"), None);
        for name in ["distlock:{jobs}", "x{{y}z"] {
            let tag = hash_tag(name).unwrap();
            let data = format!("{tag}:data");
            assert_eq!(Slot::for_key(&data), Slot::for_key(name), "{name}");
        }
    }

    #[test]
    fn the_body_sits_in_a_local_function() {
        let script = RedisGuardedScript::new("return KEYS[1] -- a trailing comment");
        assert!(script.code.contains(
            "local function body(KEYS, ARGV)\nreturn KEYS[1] -- a trailing comment\nend"
        ));
        assert_eq!(script.hash, redis::Script::new(&script.code).get_hash());
    }

    #[test]
    fn replies_are_told_apart() {
        let not_held = Value::Array(vec![Value::Int(0)]);
        assert_eq!(parse_reply(not_held).unwrap(), RedisGuardedReply::NotHeld);
        let nothing = Value::Array(vec![Value::Int(1)]);
        assert_eq!(
            parse_reply(nothing).unwrap(),
            RedisGuardedReply::Ran(Value::Nil)
        );
        let zero = Value::Array(vec![Value::Int(1), Value::Int(0)]);
        assert_eq!(
            parse_reply(zero).unwrap(),
            RedisGuardedReply::Ran(Value::Int(0))
        );
        assert!(parse_reply(Value::Int(0)).is_err());
    }
}
