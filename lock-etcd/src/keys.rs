//! The key layout, shared by the driver and the floor: how a [`LockKey`]
//! becomes the prefix its entries live under, the entry names, and the
//! transactions of etcd's concurrency mutex on them (the create that reads
//! the oldest entry in the same revision, and the guarded delete).

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget,
    Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use lock_core::{LockKey, OwnerId};

use crate::session::Session;

/// Escapes a lock key into one path segment: `%` and `/` are
/// percent-encoded, so `a` and `a/b` get disjoint prefixes (`a/` and
/// `a%2Fb/`). Other keys are unchanged, so `etcdctl lock <prefix>/<key>`
/// names the same lock.
pub(crate) fn escape_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

/// `<prefix>/<escaped key>/` (`<escaped key>/` without a prefix), where
/// `prefix` is normalized (no trailing separator).
pub(crate) fn key_prefix(prefix: &str, key: &LockKey) -> String {
    if prefix.is_empty() {
        format!("{}/", escape_key(key.as_str()))
    } else {
        format!("{prefix}/{}/", escape_key(key.as_str()))
    }
}

/// What the create transaction found.
pub(crate) struct Created {
    /// The create revision of our entry.
    pub(crate) my_revision: Option<i64>,
    /// Whether the entry holds this grant's owner id.
    pub(crate) ours: bool,
    /// The create revision of the oldest entry under the key.
    pub(crate) owner_revision: Option<i64>,
}

impl Created {
    pub(crate) fn from_response(response: &TxnResponse, owner: OwnerId) -> Self {
        let responses = response.op_responses();
        let owner_revision = first_kv(responses.get(1)).map(KeyValue::create_revision);
        if response.succeeded() {
            Self {
                my_revision: response.header().map(|h| h.revision()).filter(|r| *r > 0),
                ours: true,
                owner_revision,
            }
        } else {
            let existing = first_kv(responses.first());
            Self {
                my_revision: existing.map(KeyValue::create_revision).filter(|r| *r > 0),
                ours: existing.is_some_and(|kv| kv.value() == owner.to_hex().as_bytes()),
                owner_revision,
            }
        }
    }
}

/// What a lease carries of its entry's name: nothing for the session's
/// plain entry under the key (its owner id names the session, see
/// [`crate::EtcdBackend`]'s `resolve_lease`), else the last segment,
/// `<lease hex>-<n>` (the key's prefix is known from the lease's key).
pub(crate) fn lease_data<'a>(session: &Session, entry: &'a str) -> &'a str {
    let leaf = entry.rsplit('/').next().unwrap_or(entry);
    if leaf == session.hex() { "" } else { leaf }
}

/// The entry a lease's data names under `key_prefix` (the inverse of
/// [`lease_data`] for a non-empty one), with the lease id its name
/// carries, or why it names none.
///
/// The data is the entry's last segment (`<lease hex>` or
/// `<lease hex>-<n>`); the rest is the key's prefix. The whole name (as
/// earlier versions wrote it) is accepted too, if it is under the prefix.
pub(crate) fn entry_of_lease(
    mut key_prefix: String,
    data: &str,
) -> Result<(String, i64), &'static str> {
    let leaf = if data.contains('/') {
        data.strip_prefix(key_prefix.as_str())
            .ok_or("entry is not under the key's prefix")?
    } else {
        data
    };
    if leaf.is_empty() || leaf.contains('/') {
        return Err("entry name");
    }
    let lease_hex = leaf.split('-').next().unwrap_or(leaf);
    let lease_id = i64::from_str_radix(lease_hex, 16).map_err(|_| "entry name")?;
    key_prefix.push_str(leaf);
    Ok((key_prefix, lease_id))
}

/// `<key prefix><lease hex>`: the plain entry of a lease under a key, the
/// name etcd's concurrency mutex (and `etcdctl lock`) uses.
pub(crate) fn plain_entry(key_prefix: &str, lease_hex: &str) -> String {
    format!("{key_prefix}{lease_hex}")
}

/// `<key prefix><lease hex>-<n>`: a further entry of the same lease under a
/// key (a second grant of one key from one session).
pub(crate) fn numbered_entry(key_prefix: &str, lease_hex: &str, n: u64) -> String {
    format!("{key_prefix}{lease_hex}-{n}")
}

/// Reads the oldest entry under a key's prefix: its holder.
pub(crate) fn oldest_entry() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// Reads the entry just before the one created at `my_revision` under a
/// key's prefix: the newest one older than it.
pub(crate) fn predecessor_of(my_revision: i64) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_max_create_revision(my_revision - 1)
        .with_limit(1)
}

/// Reads the name of the entry created at `revision` under a key's prefix
/// (where a lease that carries no entry name finds it).
pub(crate) fn created_at(revision: i64) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_min_create_revision(revision)
        .with_max_create_revision(revision)
}

pub(crate) fn first_kv(response: Option<&TxnOpResponse>) -> Option<&KeyValue> {
    match response {
        Some(TxnOpResponse::Get(get)) => get.kvs().first(),
        _ => None,
    }
}

/// The create transaction of etcd's concurrency mutex: put `entry` (value:
/// the grant's owner id, attached to `lease_id`) if it does not exist, and
/// read the oldest entry under `key_prefix` in the same revision. On
/// failure, read the existing entry and the oldest one instead.
pub(crate) fn create_txn(key_prefix: &str, entry: &str, lease_id: i64, owner: OwnerId) -> Txn {
    let get_owner = TxnOp::get(key_prefix, Some(oldest_entry()));
    Txn::new()
        .when([Compare::create_revision(entry, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(
                entry,
                owner.to_hex(),
                Some(PutOptions::new().with_lease(lease_id)),
            ),
            get_owner.clone(),
        ])
        .or_else([TxnOp::get(entry, None), get_owner])
}

/// Deletes `entry` only if it is still the grant with this create revision
/// and owner.
pub(crate) fn guarded_delete(entry: &str, revision: i64, owner: OwnerId) -> Txn {
    Txn::new()
        .when([
            Compare::create_revision(entry, CompareOp::Equal, revision),
            Compare::value(entry, CompareOp::Equal, owner.to_hex()),
        ])
        .and_then([TxnOp::delete(entry, None::<DeleteOptions>)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_get_disjoint_prefixes() {
        assert_eq!(escape_key("a"), "a");
        assert_eq!(escape_key("a/b"), "a%2Fb");
        assert_eq!(escape_key("100%"), "100%25");
        assert!(!format!("{}/", escape_key("a/b")).starts_with(&format!("{}/", escape_key("a"))));
    }

    #[test]
    fn lease_data_names_an_entry_under_the_key_only() {
        let prefix = || "p/k/".to_owned();
        assert_eq!(
            entry_of_lease(prefix(), "1a"),
            Ok(("p/k/1a".to_owned(), 0x1a))
        );
        assert_eq!(
            entry_of_lease(prefix(), "1a-3"),
            Ok(("p/k/1a-3".to_owned(), 0x1a))
        );
        assert_eq!(
            entry_of_lease(prefix(), "p/k/1a"),
            Ok(("p/k/1a".to_owned(), 0x1a))
        );
        assert_eq!(plain_entry("p/k/", "1a"), "p/k/1a");
        assert_eq!(numbered_entry("p/k/", "1a", 3), "p/k/1a-3");
        for bad in ["", "q/k/1a", "p/k/", "p/k/a/1a", "zz", "-3"] {
            assert!(entry_of_lease(prefix(), bad).is_err(), "{bad:?}");
        }
    }
}
