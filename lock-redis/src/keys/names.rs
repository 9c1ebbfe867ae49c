//! How a [`LockKey`] becomes Redis names in the native layout: the lock,
//! its token counter, its channel and its holder details, all under one
//! hash tag; the token floor keys of `gc`.

use std::collections::HashMap;
use std::sync::OnceLock;

use lock_core::LockKey;
use redis::cluster_routing::Slot;

/// The token floor key: one per server, `distlock:token-floor`, for every
/// prefix and layout (a counter created by any of them starts above every
/// token any `gc` removed; never a native name, which has `{` right after
/// its prefix).
pub(crate) const FLOOR_KEY: &str = "distlock:token-floor";

/// The number of Redis Cluster hash slots.
pub(crate) const SLOTS: usize = 16384;

/// The Cluster token floor keys, one per slot: `distlock:token-floor:{<n>%}`
/// for the smallest `n` whose tag `<n>%` hashes to that slot (found once,
/// by trying `n` = 0, 1, ...: 65 778 tries cover every slot). The trailing
/// `%` is never made by [`escape_tag`], so no native name of any prefix is
/// a floor key.
pub(crate) fn slot_floors() -> &'static HashMap<Slot, Box<str>> {
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
    with_suffix(lock, HOLDER_SUFFIX)
}

/// `name` followed by `suffix`, in one allocation of the exact size (names
/// are made on every acquire and release: no formatting machinery).
fn with_suffix(name: &str, suffix: &str) -> String {
    let mut out = String::with_capacity(name.len() + suffix.len());
    out.push_str(name);
    out.push_str(suffix);
    out
}

/// What follows a lock's Redis name in its release channel's name.
const CHANNEL_SUFFIX: &str = ":released";

/// What follows a lock's Redis name in its holder details' key.
pub(crate) const HOLDER_SUFFIX: &str = ":holder";

/// A key as it stands inside the native layout's hash tag: `%` and `}`
/// percent-encoded (any prefix of a key escapes to a prefix of its escape).
pub(crate) fn escape_tag(key: &str) -> String {
    let mut escaped = String::with_capacity(key.len());
    push_escaped(&mut escaped, key);
    escaped
}

/// Appends [`escape_tag`]`(key)` to `out`.
fn push_escaped(out: &mut String, key: &str) {
    if !key.contains(['%', '}']) {
        out.push_str(key);
        return;
    }
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

/// The native lock name `<prefix>{<escaped key>}` of `key`, in a string
/// with room for `extra` more bytes.
fn native_lock(prefix: &str, key: &LockKey, extra: usize) -> String {
    let key = key.as_str();
    let mut lock = String::with_capacity(prefix.len() + key.len() + 2 + extra);
    lock.push_str(prefix);
    lock.push('{');
    push_escaped(&mut lock, key);
    lock.push('}');
    lock
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
        let lock = native_lock(prefix, key, 0);
        Self {
            counter: with_suffix(&lock, ":token"),
            channel: with_suffix(&lock, CHANNEL_SUFFIX),
            holder: holder_key(&lock),
            lock,
        }
    }

    /// The names a release sends.
    pub(crate) fn release_keys(&self) -> ReleaseKeys<'_> {
        ReleaseKeys {
            lock: &self.lock,
            holder: &self.holder,
            channel: &self.channel,
        }
    }
}

/// The names a mutex release sends: the lock, its holder details' key
/// (the script's keys) and the channel it publishes on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReleaseKeys<'a> {
    pub(crate) lock: &'a str,
    pub(crate) holder: &'a str,
    pub(crate) channel: &'a str,
}

/// A mutex's [`ReleaseKeys`] in one allocation, `<lock>:holder<channel>`
/// (a release builds no counter name and no string per name).
#[derive(Clone, Debug)]
pub(crate) struct ReleaseNames {
    buf: String,
    lock_end: usize,
    holder_end: usize,
}

impl ReleaseNames {
    /// The native layout's names of `key` under `prefix` (as
    /// [`KeyNames::new`] makes them).
    pub(crate) fn native(prefix: &str, key: &LockKey) -> Self {
        let extra = HOLDER_SUFFIX.len() + CHANNEL_SUFFIX.len();
        // Room for the lock name twice: the channel repeats it.
        let mut buf = native_lock(prefix, key, extra + prefix.len() + key.as_str().len() + 8);
        let lock_end = buf.len();
        buf.push_str(HOLDER_SUFFIX);
        let holder_end = buf.len();
        buf.extend_from_within(..lock_end);
        buf.push_str(CHANNEL_SUFFIX);
        Self {
            buf,
            lock_end,
            holder_end,
        }
    }

    /// The same names as `names` (any layout).
    pub(crate) fn of(names: &KeyNames) -> Self {
        debug_assert!(names.holder.starts_with(&names.lock));
        let mut buf = String::with_capacity(names.holder.len() + names.channel.len());
        buf.push_str(&names.holder);
        let holder_end = buf.len();
        buf.push_str(&names.channel);
        Self {
            buf,
            lock_end: names.lock.len(),
            holder_end,
        }
    }

    pub(crate) fn keys(&self) -> ReleaseKeys<'_> {
        ReleaseKeys {
            lock: &self.buf[..self.lock_end],
            holder: &self.buf[..self.holder_end],
            channel: &self.buf[self.holder_end..],
        }
    }
}
