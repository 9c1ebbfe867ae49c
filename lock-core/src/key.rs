//! Validated lock names.

use std::fmt;

use crate::error::{ErrorKind, LockError, Operation};

/// The longest key accepted, in bytes.
///
/// Chosen so that every backend can store it with its own prefix and suffix:
/// etcd and Redis keys, ZooKeeper path components (escaped, up to 3x) and a
/// SQL `VARCHAR(1024)` primary key all fit.
pub const MAX_KEY_LEN: usize = 256;

/// The prefix of the keys the library itself takes (a migration's cutover
/// markers, [`CUTOVER_KEY_PREFIX`](crate::CUTOVER_KEY_PREFIX)).
///
/// A driver layout that maps a key onto another client's exact name (Redis
/// `layout=plain`, ZooKeeper `layout=path`, the SQL ShedLock table) keeps
/// these keys in its default layout instead, where they need no shape the
/// other client imposes (a path, a hash tag, a length).
pub const RESERVED_KEY_PREFIX: &str = "__distlock/";

/// A validated lock name.
///
/// A key is non-empty, at most [`MAX_KEY_LEN`] bytes of UTF-8, and contains no
/// NUL or other control characters. Everything else (including `/`, spaces
/// and non-ASCII text) is allowed: each driver maps the key into its own
/// namespace safely (hash tags, path escaping, bound parameters).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(Box<str>);

impl LockKey {
    /// Validates `name` and wraps it.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] when the name is empty, longer than
    /// [`MAX_KEY_LEN`] bytes, or contains a control character.
    pub fn new(name: impl Into<String>) -> Result<Self, LockError> {
        let name = name.into();
        let invalid = |why: String| {
            Err(LockError::new(
                ErrorKind::InvalidArgument,
                Operation::Validate,
                why,
            ))
        };
        if name.is_empty() {
            return invalid("lock key must not be empty".to_owned());
        }
        if name.len() > MAX_KEY_LEN {
            return invalid(format!(
                "lock key is {} bytes long; the limit is {MAX_KEY_LEN}",
                name.len()
            ));
        }
        if !printable_ascii(&name)
            && let Some(c) = name.chars().find(|c| c.is_control())
        {
            return invalid(format!("lock key contains the control character {:?}", c));
        }
        // Boxed: no spare capacity kept per key (many keys are held at once).
        Ok(Self(name.into_boxed_str()))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the key is one the library itself takes (it starts with
    /// [`RESERVED_KEY_PREFIX`]).
    pub fn is_reserved(&self) -> bool {
        self.0.starts_with(RESERVED_KEY_PREFIX)
    }
}

/// Whether `name` is printable ASCII only (the usual key), which holds no
/// control character: read a byte at a time, where looking for one decodes
/// each character (every key of every request is checked).
fn printable_ascii(name: &str) -> bool {
    name.bytes().all(|b| (0x20..0x7f).contains(&b))
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockKey({:?})", self.0)
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<&str> for LockKey {
    type Error = LockError;
    fn try_from(value: &str) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl TryFrom<String> for LockKey {
    type Error = LockError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl std::str::FromStr for LockKey {
    type Err = LockError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutover_markers_are_reserved_keys() {
        let marker = LockKey::new(format!("{}billing", crate::CUTOVER_KEY_PREFIX)).unwrap();
        assert!(marker.is_reserved());
        assert!(!LockKey::new("jobs/a").unwrap().is_reserved());
        assert!(!LockKey::new("/__distlock/x").unwrap().is_reserved());
    }

    #[test]
    fn accepts_ordinary_names() {
        for name in [
            "a",
            "jobs/nightly",
            "ünïcode key",
            "a.b:c",
            &"x".repeat(MAX_KEY_LEN),
        ] {
            assert_eq!(LockKey::new(name).unwrap().as_str(), name);
        }
    }

    /// What the byte scan lets through holds no control character.
    #[test]
    fn printable_ascii_holds_no_control_character() {
        let samples = (0u32..0x300)
            .chain([0x2028, 0xfeff, 0x1_0000])
            .filter_map(char::from_u32);
        for c in samples {
            for name in [c.to_string(), format!("a{c}b")] {
                if printable_ascii(&name) {
                    assert!(!name.chars().any(char::is_control), "{name:?}");
                }
            }
        }
        assert!(printable_ascii("jobs/nightly 1"));
        assert!(!printable_ascii("ünïcode"));
    }

    #[test]
    fn rejects_bad_names_with_a_typed_error() {
        for name in [
            "",
            "a\0b",
            "tab\there",
            "new\nline",
            "\u{7f}",
            "c1 \u{85} next line",
            "\u{9f}",
            &"x".repeat(MAX_KEY_LEN + 1),
        ] {
            let err = LockKey::new(name).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{name:?}");
        }
    }
}
