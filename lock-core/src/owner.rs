//! Owner ids: the 128-bit random value naming one grant, its hex digits,
//! and the hasher for maps keyed by such random values.

use std::fmt;

use crate::error::{LockError, Operation};

/// A 128-bit random value that identifies one grant (not a thread or a
/// process). Release and renew succeed only for the current owner.
///
/// Kept as its high and low halves (ordered like the `u128`): a `u128`
/// field aligns every lease, and each struct holding one, to 16 bytes,
/// which padded a held lock's state by 16 bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId([u64; 2]);

/// A hasher for map keys that are already random: owner ids from the
/// operating system's generator, or keyed hashes. Folding their words is
/// as good a hash as SipHash, for a fraction of the instructions (three
/// owner-id lookups a cycle cost about 700 with SipHash). Only for keys
/// an outsider cannot choose.
///
/// ```
/// use std::collections::HashMap;
/// use lock_core::{OwnerId, RandomKeys};
///
/// let mut held: HashMap<OwnerId, u32, RandomKeys> = HashMap::default();
/// held.insert(OwnerId::random(), 1);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct RandomKeyHasher(u64);

/// Builds [`RandomKeyHasher`]s, for `HashMap<K, V, RandomKeys>`.
pub type RandomKeys = std::hash::BuildHasherDefault<RandomKeyHasher>;

impl std::hash::Hasher for RandomKeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        // A single `u64` key hashes to itself.
        self.0 = self.0.rotate_left(29) ^ n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// An owner id's 32 lowercase hex digits on the stack ([`OwnerId::hex`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct OwnerHex([u8; 32]);

impl OwnerHex {
    /// The digits.
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits: never the fallback.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for OwnerHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for OwnerHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// The 8 lowercase hex digits of `value` (below 2^32), most significant
/// first in big-endian byte order: each nibble spread into a byte of its
/// own, then shifted to `'0'..='9'` or, when above 9, `'a'..='f'`.
fn hex_digits(value: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let mut x = ((value & 0xffff_0000) << 16) | (value & 0xffff);
    x = ((x & 0x0000_ff00_0000_ff00) << 8) | (x & 0x0000_00ff_0000_00ff);
    x = ((x & 0x00f0_00f0_00f0_00f0) << 4) | (x & 0x000f_000f_000f_000f);
    // 1 in each byte whose nibble is 10 or more.
    let letters = ((x + 6 * ONES) >> 4) & ONES;
    x + u64::from(b'0') * ONES + letters * u64::from(b'a' - b'0' - 10)
}

impl OwnerId {
    /// A fresh random owner id from the operating system's generator.
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        if getrandom::fill(&mut bytes).is_err() {
            // The OS generator failing is exceedingly rare; fall back to a
            // value that is still unique within this process and very likely
            // across processes, rather than panicking.
            return Self::from_u128(fallback_random());
        }
        Self::from_u128(u128::from_le_bytes(bytes))
    }

    /// The raw value.
    pub fn as_u128(self) -> u128 {
        (u128::from(self.0[0]) << 64) | u128::from(self.0[1])
    }

    /// Wraps a raw value (e.g. read back from a backend).
    pub fn from_u128(value: u128) -> Self {
        // The halves of a u128: truncation is the point.
        #[allow(clippy::cast_possible_truncation)]
        Self([(value >> 64) as u64, value as u64])
    }

    /// 32 lowercase hex digits: the form stored in backends.
    pub fn to_hex(self) -> String {
        self.hex().as_str().to_owned()
    }

    /// The 32 lowercase hex digits of [`Self::to_hex`], on the stack: for a
    /// name or a statement built at every grant (`format!` with its
    /// padding machinery and a `String` cost about 500 instructions).
    ///
    /// ```
    /// use lock_core::OwnerId;
    ///
    /// let owner = OwnerId::from_u128(0xabc);
    /// assert_eq!(owner.hex().as_str(), format!("{:032x}", 0xabc));
    /// ```
    pub fn hex(self) -> OwnerHex {
        // Eight digits at a time in a u64 (two per grant and release on
        // the SQL drivers' path, where a table lookup per nibble cost
        // about 225 instructions an id).
        let [high, low] = self.0;
        let mut hex = [0u8; 32];
        hex[..8].copy_from_slice(&hex_digits(high >> 32).to_be_bytes());
        hex[8..16].copy_from_slice(&hex_digits(high & 0xffff_ffff).to_be_bytes());
        hex[16..24].copy_from_slice(&hex_digits(low >> 32).to_be_bytes());
        hex[24..].copy_from_slice(&hex_digits(low & 0xffff_ffff).to_be_bytes());
        OwnerHex(hex)
    }

    /// Appends [`Self::to_uuid`]'s form to `out`.
    pub fn push_uuid(self, out: &mut String) {
        let hex = self.hex();
        let hex = hex.as_str();
        for (i, part) in [
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..],
        ]
        .into_iter()
        .enumerate()
        {
            if i > 0 {
                out.push('-');
            }
            out.push_str(part);
        }
    }

    /// The 32 hex digits laid out as a UUID (8-4-4-4-12, lowercase), the
    /// form in which Curator's node names and Redisson's hash fields carry
    /// a client id.
    ///
    /// ```
    /// use lock_core::OwnerId;
    ///
    /// let owner = OwnerId::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    /// assert_eq!(owner.to_uuid(), "01234567-89ab-cdef-0123-456789abcdef");
    /// ```
    pub fn to_uuid(self) -> String {
        let mut out = String::with_capacity(36);
        self.push_uuid(&mut out);
        out
    }

    /// Parses the 32-hex-digit form.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) when `text` is not 32 hex digits.
    pub fn from_hex(text: &str) -> Result<Self, LockError> {
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(LockError::invalid_argument(
                Operation::Validate,
                format!("owner id must be 32 hex digits, got {text:?}"),
            ));
        }
        u128::from_str_radix(text, 16)
            .map(Self::from_u128)
            .map_err(|e| {
                LockError::invalid_argument(Operation::Validate, "bad owner id").with_source(e)
            })
    }
}

fn fallback_random() -> u128 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut a = RandomState::new().build_hasher();
    a.write_u64(count);
    a.write_u128(nanos);
    a.write_u32(std::process::id());
    let mut b = RandomState::new().build_hasher();
    b.write_u64(a.finish());
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerId({})", self.to_hex())
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_random_and_round_trip() {
        let a = OwnerId::random();
        let b = OwnerId::random();
        assert_ne!(a, b);
        assert_eq!(OwnerId::from_hex(&a.to_hex()).unwrap(), a);
        assert!(OwnerId::from_hex("xyz").is_err());
        assert_ne!(fallback_random(), fallback_random());
    }

    /// The stack digits and the UUID form are what `format!` writes.
    #[test]
    fn hex_digits_and_uuids_are_formats() {
        let values = [0, 1, 0xabc, u128::MAX, u128::MAX >> 4, 1 << 127];
        let random = (0..100).map(|_| OwnerId::random().as_u128());
        for value in values.into_iter().chain(random) {
            let owner = OwnerId::from_u128(value);
            assert_eq!(owner.hex().as_str(), format!("{value:032x}"));
            assert_eq!(owner.to_hex(), format!("{value:032x}"));
            assert_eq!(
                owner.to_uuid(),
                format!(
                    "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                    value >> 96,
                    (value >> 80) & 0xffff,
                    (value >> 64) & 0xffff,
                    (value >> 48) & 0xffff,
                    value & 0xffff_ffff_ffff
                )
            );
        }
    }
}
