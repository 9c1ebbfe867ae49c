//! Session mode's key layout: lock keys mapped onto the server's lock names: a 64-bit advisory-lock
//! key on PostgreSQL, a `GET_LOCK` name of at most 64 characters on
//! MySQL/MariaDB.
//!
//! Both are computed on the client from the table name (the namespace)
//! and the key with FNV-1a (128 bits), a fixed, documented function, so
//! every process and every version of this crate maps a key the same way.
//! Two keys that map to the same server lock only exclude each other
//! (false contention): the server never grants one lock twice, and the
//! fencing token of each key still strictly increases, because every grant
//! of a key happens while holding that server lock.

/// FNV-1a, 128 bits, over `namespace`, a NUL separator and `key`.
pub(crate) fn fnv1a_128(namespace: &str, key: &str) -> u128 {
    fnv1a_128_bytes(
        namespace
            .as_bytes()
            .iter()
            .chain(std::iter::once(&0u8))
            .chain(key.as_bytes()),
    )
}

fn fnv1a_128_bytes<'a>(bytes: impl Iterator<Item = &'a u8>) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut hash = OFFSET;
    for byte in bytes {
        hash ^= u128::from(*byte);
        hash = hash.wrapping_mul(PRIME);
    }
    hash
}

/// The PostgreSQL advisory-lock key of `key` in `namespace`: the two
/// halves of the 128-bit hash folded into one signed 64-bit value.
pub fn pg_lock_key(namespace: &str, key: &str) -> i64 {
    let hash = fnv1a_128(namespace, key);
    #[allow(clippy::cast_possible_truncation)] // folding: truncation intended
    let folded = (hash as u64) ^ ((hash >> 64) as u64);
    i64::from_ne_bytes(folded.to_ne_bytes())
}

/// How `pg_locks` shows a bigint advisory key: high half in `classid`,
/// low half in `objid` (both `oid`, unsigned 32-bit), `objsubid = 1`.
pub(crate) fn pg_lock_halves(lock_key: i64) -> (i64, i64) {
    let bits = u64::from_ne_bytes(lock_key.to_ne_bytes());
    (i64::from(bits_hi(bits)), i64::from(bits_lo(bits)))
}

fn bits_hi(bits: u64) -> u32 {
    u32::try_from(bits >> 32).unwrap_or(0)
}

fn bits_lo(bits: u64) -> u32 {
    u32::try_from(bits & 0xffff_ffff).unwrap_or(0)
}

/// MySQL/MariaDB's limit on `GET_LOCK` names.
pub(crate) const MYSQL_MAX_LOCK_NAME: usize = 64;

/// The `GET_LOCK` name of `key` in `namespace`.
///
/// `namespace:key` itself when it fits in 64 characters and uses only
/// `[a-z0-9_./:-]` (readable in `performance_schema` / `IS_USED_LOCK`, and
/// immune to the server's case-insensitive, space-padding name comparison);
/// otherwise `#` and the 32 hex digits of the 128-bit hash. No plain name
/// starts with `#` (table names start with a letter or `_`), so the two
/// forms never meet. Lock names are server-wide, not per database: the
/// same table name in two databases of one server shares lock names
/// (false contention only).
pub fn mysql_lock_name(namespace: &str, key: &str) -> String {
    let plain = format!("{namespace}:{key}");
    let safe = plain.len() <= MYSQL_MAX_LOCK_NAME
        && plain.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || matches!(b, b'_' | b'.' | b'/' | b':' | b'-')
        });
    if safe {
        plain
    } else {
        format!("#{:032x}", fnv1a_128(namespace, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_the_published_vectors() {
        assert_eq!(
            fnv1a_128_bytes(b"".iter()),
            0x6c62_272e_07bb_0142_62b8_2175_6295_c58d
        );
        assert_eq!(
            fnv1a_128_bytes(b"a".iter()),
            0xd228_cb69_6f1a_8caf_7891_2b70_4e4a_8964
        );
        // Every version of this crate must map a key to the same server
        // lock (or two versions would not exclude each other): pinned.
        assert_eq!(
            pg_lock_key("distlock_leases", "jobs/nightly"),
            4_666_325_604_457_054_933
        );
        assert_eq!(
            mysql_lock_name("distlock_leases", "Jobs/Nightly"),
            format!("#{:032x}", fnv1a_128("distlock_leases", "Jobs/Nightly"))
        );
        assert_ne!(
            pg_lock_key("distlock_leases", "a"),
            pg_lock_key("distlock_leases", "b")
        );
        assert_ne!(pg_lock_key("t1", "a"), pg_lock_key("t2", "a"));
        // The separator keeps "ab"+"c" apart from "a"+"bc".
        assert_ne!(fnv1a_128("ab", "c"), fnv1a_128("a", "bc"));
    }

    #[test]
    fn pg_halves_rebuild_the_key() {
        for key in [0_i64, 1, -1, i64::MIN, i64::MAX, pg_lock_key("t", "k")] {
            let (hi, lo) = pg_lock_halves(key);
            assert!((0..=i64::from(u32::MAX)).contains(&hi));
            assert!((0..=i64::from(u32::MAX)).contains(&lo));
            let bits = (u64::try_from(hi).unwrap() << 32) | u64::try_from(lo).unwrap();
            assert_eq!(i64::from_ne_bytes(bits.to_ne_bytes()), key);
        }
    }

    #[test]
    fn mysql_names_fit_and_never_fold_case() {
        assert_eq!(
            mysql_lock_name("distlock_leases", "jobs/a-1"),
            "distlock_leases:jobs/a-1"
        );
        let upper = mysql_lock_name("distlock_leases", "Jobs/A");
        let lower = mysql_lock_name("distlock_leases", "jobs/a");
        assert_ne!(upper, lower);
        assert!(upper.starts_with('#') && upper.len() == 33, "{upper}");
        let padded = mysql_lock_name("distlock_leases", "jobs/a ");
        assert_ne!(padded, lower);
        let long = mysql_lock_name("distlock_leases", &"k".repeat(1000));
        assert!(long.len() <= MYSQL_MAX_LOCK_NAME);
        assert_ne!(long, mysql_lock_name("distlock_leases", &"k".repeat(999)));
        let unicode = mysql_lock_name("t", "clé");
        assert!(unicode.starts_with('#'));
    }
}
