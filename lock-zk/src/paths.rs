//! Key escaping and lock node names.
//!
//! - A key becomes one path component under the lock root: every byte
//!   outside `[A-Za-z0-9_-]` is percent-encoded (`%2F` for `/`, `%2E` for
//!   `.`, `%25` for `%`). The mapping is injective, never yields `.`, `..`
//!   or a `/`, so no key can leave its directory or collide with another,
//!   and `zookeeper` stays harmless because the lock root is never `/`.
//! - A lock node is `_c_<attempt id as a UUID>-lock-<sequence>`: Curator's
//!   "protected" name for its lock recipe, so nodes sort the same way for
//!   Curator, and a create whose reply was lost can be found by its id.

use lock_core::{LockKey, OwnerId};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Everything but `[A-Za-z0-9_-]` is escaped.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'_').remove(b'-');

/// Curator's protected-name prefix.
const PROTECTED_PREFIX: &str = "_c_";
/// The lock name Curator's `InterProcessMutex` uses; nodes sort on what
/// follows it.
pub(crate) const LOCK_NAME: &str = "lock-";

/// The directory holding `key`'s lock nodes.
pub(crate) fn key_dir(root: &str, key: &LockKey) -> String {
    format!("{root}/{}", utf8_percent_encode(key.as_str(), COMPONENT))
}

/// The owner id written as a UUID (8-4-4-4-12 lowercase hex).
pub(crate) fn owner_uuid(owner: OwnerId) -> String {
    let hex = owner.to_hex();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The name prefix a lock node of `owner` is created with (the server
/// appends the sequence number).
pub(crate) fn node_prefix(owner: OwnerId) -> String {
    format!("{PROTECTED_PREFIX}{}-{LOCK_NAME}", owner_uuid(owner))
}

/// The owner id embedded in one of our node names, if it is one.
pub(crate) fn owner_of(name: &str) -> Option<OwnerId> {
    let rest = name.strip_prefix(PROTECTED_PREFIX)?;
    let uuid = rest.get(..36)?;
    if !rest[36..].starts_with(&format!("-{LOCK_NAME}")) {
        return None;
    }
    let hex: String = uuid.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || uuid.chars().filter(|c| *c == '-').count() != 4 {
        return None;
    }
    OwnerId::from_hex(&hex).ok()
}

/// The sequence number of a lock node: the digits after the last `lock-`
/// (Curator's `fixForSorting`). `None` for children that are not lock nodes.
pub(crate) fn sequence_of(name: &str) -> Option<i64> {
    let at = name.rfind(LOCK_NAME)?;
    let digits = &name[at + LOCK_NAME.len()..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Lock nodes among `children`, in grant order (sequence, then name).
pub(crate) fn sorted_lock_nodes(children: Vec<String>) -> Vec<(i64, String)> {
    let mut nodes: Vec<(i64, String)> = children
        .into_iter()
        .filter_map(|name| sequence_of(&name).map(|seq| (seq, name)))
        .collect();
    nodes.sort();
    nodes
}

/// Splits a lock node path into its directory and name.
pub(crate) fn split_node(path: &str) -> Option<(&str, &str)> {
    let (dir, name) = path.rsplit_once('/')?;
    if dir.is_empty() || name.is_empty() {
        return None;
    }
    Some((dir, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> LockKey {
        LockKey::new(s).unwrap()
    }

    #[test]
    fn keys_cannot_escape_or_collide() {
        let root = "/distlock";
        let cases = [
            "/",
            ".",
            "..",
            "zookeeper",
            "a/b",
            "a%2Fb",
            "../x",
            "a b",
            "ünï",
            "%",
            "-_",
            "A",
            "a",
        ];
        let mut seen = std::collections::HashSet::new();
        for name in cases {
            let dir = key_dir(root, &key(name));
            let component = dir.strip_prefix("/distlock/").unwrap();
            assert!(!component.is_empty());
            assert!(!component.contains('/'), "{dir}");
            assert!(component != "." && component != "..", "{dir}");
            assert!(
                component
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"%_-".contains(&b)),
                "{dir}"
            );
            assert!(seen.insert(dir.clone()), "collision for {name:?}: {dir}");
        }
        assert_eq!(key_dir(root, &key("a/b")), "/distlock/a%2Fb");
        assert_eq!(key_dir(root, &key("a%2Fb")), "/distlock/a%252Fb");
        assert_eq!(key_dir(root, &key("..")), "/distlock/%2E%2E");
    }

    #[test]
    fn node_names_round_trip() {
        let owner = OwnerId::random();
        let name = format!("{}0000000042", node_prefix(owner));
        assert_eq!(owner_of(&name), Some(owner));
        assert_eq!(sequence_of(&name), Some(42));
        assert_eq!(name.len(), 3 + 36 + 1 + 5 + 10);
        // Curator's own nodes sort with ours; foreign children are ignored.
        let sorted = sorted_lock_nodes(vec![
            name.clone(),
            "_c_5f1e6c8e-0000-0000-0000-000000000000-lock-0000000007".to_owned(),
            "leases".to_owned(),
            "x-lock-".to_owned(),
            "x-lock-12a".to_owned(),
        ]);
        assert_eq!(sorted.len(), 2);
        assert_eq!(sorted[0].0, 7);
        assert_eq!(sorted[1].1, name);
        assert_eq!(owner_of("lock-0000000001"), None);
        assert_eq!(owner_of("_c_zz-lock-1"), None);
        assert_eq!(split_node("/a/b"), Some(("/a", "b")));
        assert_eq!(split_node("b"), None);
    }
}
