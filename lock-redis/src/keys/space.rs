//! [`KeySpace`]: one backend's names for every key, in its configured
//! layout and under its prefix, and the way back from a Redis name to the
//! key (`list`, `gc`).

use lock_core::{LeaseKind, LockError, LockKey, Operation, OwnerHex, OwnerId};

use crate::keys::fair::FairNames;
use crate::keys::layout::{
    LEGACY_OWNER_MARK, RedisLayout, check_cluster_slot, legacy_names, legacy_unsupported,
};
use crate::keys::names::{
    HOLDER_SUFFIX, KeyNames, ReleaseNames, escape_tag, glob_escape, unescape_tag,
};
use crate::keys::shared::SharedNames;

/// An owner's value in the lock key ([`KeySpace::owner_value`]), read as
/// a `str`: on the stack in the native layout (no allocation per grant
/// and release).
pub(crate) enum OwnerValue {
    Native(OwnerHex),
    Legacy(String),
}

impl std::ops::Deref for OwnerValue {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            Self::Native(hex) => hex.as_str(),
            Self::Legacy(value) => value,
        }
    }
}

/// The names a backend gives its keys: its layout, prefix and (legacy
/// layouts) token suffix; in Cluster, a legacy key whose counter would land
/// in another slot is refused.
#[derive(Clone, Debug)]
pub(crate) struct KeySpace {
    layout: RedisLayout,
    prefix: String,
    token_suffix: String,
    cluster: bool,
}

impl KeySpace {
    pub(crate) fn new(
        layout: RedisLayout,
        prefix: &str,
        token_suffix: &str,
        cluster: bool,
    ) -> Self {
        Self {
            layout,
            prefix: prefix.to_owned(),
            token_suffix: token_suffix.to_owned(),
            cluster,
        }
    }

    pub(crate) fn layout(&self) -> RedisLayout {
        self.layout
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis names of `key`'s mutex in the configured layout. The
    /// library's own keys ([`LockKey::is_reserved`]: a migration's cutover
    /// marker) keep the native names (hash-tagged, so Cluster takes them)
    /// in every layout; the layout's scripts run on them unchanged.
    pub(crate) fn layout_names(&self, key: &LockKey) -> KeyNames {
        if self.layout.is_legacy() && !key.is_reserved() {
            legacy_names(self.layout, &self.prefix, &self.token_suffix, key)
        } else {
            KeyNames::new(&self.prefix, key)
        }
    }

    /// [`layout_names`](Self::layout_names), refused in Cluster when a
    /// legacy key's counter would land in another slot (checked before
    /// anything is sent).
    pub(crate) fn mutex(&self, key: &LockKey, op: Operation) -> Result<KeyNames, LockError> {
        let names = self.layout_names(key);
        if self.layout.is_legacy() && self.cluster {
            check_cluster_slot(&names, key, op)?;
        }
        Ok(names)
    }

    /// The names a release of `key`'s mutex sends (as
    /// [`mutex`](Self::mutex) names them, refused alike), in one
    /// allocation on the native layout.
    pub(crate) fn release_names(
        &self,
        key: &LockKey,
        op: Operation,
    ) -> Result<ReleaseNames, LockError> {
        if self.layout.is_legacy() {
            return Ok(ReleaseNames::of(&self.mutex(key, op)?));
        }
        Ok(ReleaseNames::native(&self.prefix, key))
    }

    /// The names of `key`'s fair mutex (its queue beside the mutex's
    /// names; the native layout only).
    pub(crate) fn fair(&self, key: &LockKey) -> FairNames {
        FairNames::new(&self.prefix, key)
    }

    /// The names of `key`'s read-write lock or semaphore (by `kind`).
    pub(crate) fn shared(&self, key: &LockKey, kind: LeaseKind) -> SharedNames {
        SharedNames::new(&self.prefix, key, kind)
    }

    /// The value that marks `owner` in the lock key (the hash field in
    /// the Redisson layout): its 32 hex digits in the native layout,
    /// `distlock:<hex>` in the legacy ones, whose other clients store 32
    /// hex digits of their own (redis-py's uuid, node-redlock's random
    /// bytes), so that `inspect` can tell our holders (and their token)
    /// from theirs.
    pub(crate) fn owner_value(&self, owner: OwnerId) -> OwnerValue {
        if self.layout.is_legacy() {
            OwnerValue::Legacy(format!("{LEGACY_OWNER_MARK}{}", owner.hex()))
        } else {
            OwnerValue::Native(owner.hex())
        }
    }

    /// Whether `holder` (a lock key's value) is one of our owner values.
    pub(crate) fn is_ours(&self, holder: &str) -> bool {
        let hex = if self.layout.is_legacy() {
            holder.strip_prefix(LEGACY_OWNER_MARK)
        } else {
            Some(holder)
        };
        hex.is_some_and(|hex| OwnerId::from_hex(hex).is_ok())
    }

    /// The refusal of a lock shape other than the mutex in a legacy layout.
    pub(crate) fn refuse_legacy(
        &self,
        op: Operation,
        what: &str,
        key: &LockKey,
    ) -> Result<(), LockError> {
        if self.layout.is_legacy() {
            return Err(legacy_unsupported(self.layout, op, what, key));
        }
        Ok(())
    }

    /// The Redis type of a lock key in this layout (`SCAN ... TYPE`).
    pub(crate) fn lock_type(&self) -> &'static str {
        if self.layout == RedisLayout::Redisson {
            "hash"
        } else {
            "string"
        }
    }

    /// The `SCAN MATCH` pattern of the lock keys under the user's `prefix`.
    pub(crate) fn lock_pattern(&self, prefix: &str) -> String {
        let base = glob_escape(&self.prefix);
        if self.layout.is_legacy() {
            format!("{base}{}*", glob_escape(prefix))
        } else {
            format!("{base}{{{}*", glob_escape(&escape_tag(prefix)))
        }
    }

    /// The `SCAN MATCH` pattern of every native name under the user's
    /// `prefix` (`<base>{<prefix>*}`), before a shape's suffix.
    pub(crate) fn tagged_pattern(&self, prefix: &str) -> String {
        format!(
            "{}{{{}*}}",
            glob_escape(&self.prefix),
            glob_escape(&escape_tag(prefix))
        )
    }

    /// The user's key of the Redis name `name` when it is a lock key of
    /// this layout under `prefix` (not a counter, a side key, a queue...).
    pub(crate) fn lock_key_of(&self, name: &str, prefix: &str) -> Option<LockKey> {
        let rest = name.strip_prefix(self.prefix.as_str())?;
        let key = if self.layout.is_legacy() {
            let suffix = self.token_suffix.as_str();
            if (!suffix.is_empty() && rest.ends_with(suffix)) || rest.ends_with(HOLDER_SUFFIX) {
                return None;
            }
            rest.to_owned()
        } else {
            let tag = rest.strip_prefix('{')?.strip_suffix('}')?;
            if tag.contains('}') {
                return None;
            }
            unescape_tag(tag)?
        };
        if !key.starts_with(prefix) {
            return None;
        }
        let key = LockKey::new(key).ok()?;
        // The name must be the one this backend gives the key (a legacy
        // name that maps elsewhere, e.g. a reserved key, is skipped).
        (self.layout_names(&key).lock == name).then_some(key)
    }
}
