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
    format!("{lock}{HOLDER_SUFFIX}")
}

/// What follows a lock's Redis name in its holder details' key.
pub(crate) const HOLDER_SUFFIX: &str = ":holder";

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
