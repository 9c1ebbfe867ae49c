//! How a [`LockKey`] becomes a KV key, and what the entry's value holds.
//!
//! NATS KV keys are `[-/_=.a-zA-Z0-9]+` and `.` separates subject tokens.
//! A lock key keeps `[A-Za-z0-9_/-]` as it is and escapes every other byte
//! (`.` and `=` included) as `=XX` (upper-case hex), so `jobs/nightly` is
//! the KV key `jobs/nightly` (what another NATS client creating that key
//! takes), `a.b` is `a=2Eb`, and no two lock keys share a KV key.

use lock_core::{FencingToken, HolderDetails, LockKey, OwnerId};

/// The KV key of `key`'s mutex.
pub fn kv_key(key: &LockKey) -> String {
    let mut out = String::with_capacity(key.as_str().len());
    for byte in key.as_str().bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'/' | b'-') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("={byte:02X}"));
        }
    }
    out
}

/// What a grant of ours stores: the owner on the first line, the grant's
/// fencing token on the second (0 at the create, whose token is the
/// entry's revision; a renewal writes the create's revision there, since
/// the update gets a revision of its own), holder details on the third.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Value {
    pub(crate) owner: String,
    pub(crate) token: Option<FencingToken>,
    pub(crate) details: Option<HolderDetails>,
}

impl Value {
    /// The value a grant (token unknown yet) or a renewal writes.
    pub(crate) fn encode(owner: OwnerId, token: Option<FencingToken>) -> bytes::Bytes {
        let token = token.map_or(0, FencingToken::get);
        format!(
            "{}\n{token}\n{}",
            owner.to_hex(),
            HolderDetails::encode_current()
        )
        .into()
    }

    /// Reads any value: another client's value is its owner, whole.
    pub(crate) fn decode(value: &[u8]) -> Self {
        let text = String::from_utf8_lossy(value);
        let mut lines = text.splitn(3, '\n');
        let first = lines.next().unwrap_or_default();
        if OwnerId::from_hex(first).is_ok() {
            let token = lines
                .next()
                .and_then(|t| t.parse::<u64>().ok())
                .filter(|t| *t > 0)
                .map(FencingToken::new);
            let details = lines.next().and_then(HolderDetails::decode);
            return Self {
                owner: first.to_owned(),
                token,
                details,
            };
        }
        Self {
            owner: text.into_owned(),
            token: None,
            details: None,
        }
    }

    /// Whether this value is `owner`'s.
    pub(crate) fn is(&self, owner: OwnerId) -> bool {
        self.owner == owner.to_hex()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_escaped_apart() {
        let k = |s: &str| kv_key(&LockKey::new(s).unwrap());
        assert_eq!(k("jobs/nightly"), "jobs/nightly");
        assert_eq!(k("a.b"), "a=2Eb");
        assert_eq!(k("a=2Eb"), "a=3D2Eb");
        assert_eq!(k("ü"), "=C3=BC");
        assert_ne!(k("a.b"), k("a=2Eb"));
    }

    #[test]
    fn values_round_trip() {
        let owner = OwnerId::random();
        let v = Value::decode(&Value::encode(owner, Some(FencingToken::new(7))));
        assert!(v.is(owner));
        assert_eq!(v.token, Some(FencingToken::new(7)));
        let v = Value::decode(&Value::encode(owner, None));
        assert_eq!(v.token, None);
        let other = Value::decode(b"python-holder");
        assert_eq!(other.owner, "python-holder");
        assert!(!other.is(owner));
    }
}
