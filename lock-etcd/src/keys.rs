//! The key layout: how a [`LockKey`] becomes the prefix its entries live
//! under, the entry names and values, and the transactions of etcd's
//! concurrency mutex on them (the create that reads the oldest entry in the
//! same revision, and the guarded delete).
//!
//! The public items are the layout other clients (and the benchmark floor,
//! which issues the same transactions by hand) need to take the same locks,
//! and the mutex's two transactions ([`create_txn`], [`guarded_delete`]),
//! for comparing the driver against `etcd-client` alone:
//! a mutex on `key` under the prefix `locks` is the entry
//! `locks/<escaped key>/<lease hex>` whose value starts with the owner's
//! hex ([`key_prefix`], [`plain_entry`], [`mutex_value`]); read-write locks
//! and semaphores live under [`shape_prefix`] with [`entry_value`]s.

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget,
    Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use lock_core::{HolderDetails, LeaseKind, LockKey, LockShape, OwnerId};

/// Escapes a lock key into one path segment: `%` and `/` are
/// percent-encoded, so `a` and `a/b` get disjoint prefixes (`a/` and
/// `a%2Fb/`). Other keys are unchanged, so `etcdctl lock <prefix>/<key>`
/// names the same lock.
pub fn escape_key(key: &str) -> String {
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

/// The inverse of [`escape_key`]: `None` for a segment no key escapes to
/// (a `%` not followed by `25` or `2F`, as in the shape and election tags,
/// or a `/`).
pub(crate) fn unescape_key(segment: &str) -> Option<String> {
    let mut out = String::with_capacity(segment.len());
    let mut rest = segment;
    while let Some(at) = rest.find(['%', '/']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if tail.starts_with("%25") {
            out.push('%');
        } else if tail.starts_with("%2F") {
            out.push('/');
        } else {
            return None;
        }
        rest = &tail[3..];
    }
    out.push_str(rest);
    Some(out)
}

/// `<prefix>/<escaped key>/` (`<escaped key>/` without a prefix), where
/// `prefix` is normalized (no trailing separator).
pub fn key_prefix(prefix: &str, key: &LockKey) -> String {
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
                ours: existing
                    .is_some_and(|kv| value_owner(kv.value()) == owner.to_hex().as_bytes()),
                owner_revision,
            }
        }
    }
}

/// What a lease carries of its entry's name: nothing for the session's
/// plain entry under the key (its owner id names the session, see
/// [`crate::EtcdBackend`]'s `resolve_lease`), else the last segment,
/// `<lease hex>-<n>` (the key's prefix is known from the lease's key).
pub(crate) fn lease_data<'a>(session_hex: &str, entry: &'a str) -> &'a str {
    let leaf = entry.rsplit('/').next().unwrap_or(entry);
    if leaf == session_hex { "" } else { leaf }
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
pub fn plain_entry(key_prefix: &str, lease_hex: &str) -> String {
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

/// The create transaction of etcd's concurrency mutex: put `entry` (with
/// `value`, [`mutex_value`] or an election candidate's owner hex, attached
/// to `lease_id`) if it does not exist, and read the oldest entry under
/// `key_prefix` in the same revision. On failure, read the existing entry
/// and the oldest one instead.
///
/// The driver's acquire sends exactly this. Public for comparing against
/// the client library alone: a benchmark sends the driver's requests
/// through `etcd-client` with no other code of this crate (with
/// [`key_prefix`], [`plain_entry`] and [`mutex_value`] for the arguments,
/// and [`guarded_delete`] for the release).
pub fn create_txn(key_prefix: &str, entry: &str, lease_id: i64, value: String) -> Txn {
    let get_owner = TxnOp::get(key_prefix, Some(oldest_entry()));
    Txn::new()
        .when([Compare::create_revision(entry, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(entry, value, Some(PutOptions::new().with_lease(lease_id))),
            get_owner.clone(),
        ])
        .or_else([TxnOp::get(entry, None), get_owner])
}

/// The value of a mutex entry or an election candidate:
/// `<owner hex> <holder details>` (the details of this process and this
/// instant, [`HolderDetails::encode_current`]). `etcdctl lock` writes an
/// empty value and never reads it; `etcdctl elect -l` prints a candidate's
/// whole value as its proposal.
pub fn mutex_value(owner: OwnerId) -> String {
    format!("{} {}", owner.to_hex(), HolderDetails::encode_current())
}

/// The owner part of an entry's value: up to the first space (the whole
/// value when it has none: an older version's mutex entry or election
/// candidate).
pub(crate) fn value_owner(value: &[u8]) -> &[u8] {
    value.split(|b| *b == b' ').next().unwrap_or(value)
}

/// The holder details in a mutex entry's or an election candidate's value
/// ([`mutex_value`]), if any.
pub(crate) fn value_details(value: &[u8]) -> Option<HolderDetails> {
    let text = std::str::from_utf8(value).ok()?;
    let (_, details) = text.split_once(' ')?;
    HolderDetails::decode(details)
}

/// The compares that say `entry` (a mutex entry or an election candidate,
/// `<owner hex> <details>`) holds `owner`'s value: a value above `<owner
/// hex>` and below `<owner hex>!`, i.e. the owner followed by a space (or
/// a lower byte) and more (etcd compares values as bytes).
pub(crate) fn owner_compares(entry: &str, owner: OwnerId) -> Vec<Compare> {
    owner_part_compares(entry, &owner.to_hex())
}

/// The compares that say `entry`'s value is `part`, one space (or a lower
/// byte) and more: above `part`, below `part!`.
fn owner_part_compares(entry: &str, part: &str) -> Vec<Compare> {
    let above = format!("{part}!");
    vec![
        Compare::value(entry, CompareOp::Greater, part),
        Compare::value(entry, CompareOp::Less, above),
    ]
}

/// Deletes `entry` only if it is still the grant with this create revision
/// and owner: its value above `<owner hex>` and below `<owner hex>!`, i.e.
/// the owner followed by a space and the details ([`mutex_value`]).
///
/// An entry of a read-write lock or a semaphore (its prefix's last
/// segment ends with a shape tag, see [`shape_prefix`]) stores its kind
/// beside the owner ([`entry_value`]), which the session's cleanups do not
/// know: theirs is compared on the create revision alone (the name carries
/// our lease id, and the create revision names one incarnation of it). An
/// explicit release of such an entry compares the kind and owner too
/// (another transaction of the driver's).
///
/// The driver's release of a mutex sends exactly this. Public for
/// comparing against the client library alone (see [`create_txn`]).
pub fn guarded_delete(entry: &str, revision: i64, owner: OwnerId) -> Txn {
    if is_shared_entry(entry) {
        return Txn::new()
            .when([Compare::create_revision(entry, CompareOp::Equal, revision)])
            .and_then([TxnOp::delete(entry, None::<DeleteOptions>)]);
    }
    let mut compares = vec![Compare::create_revision(entry, CompareOp::Equal, revision)];
    compares.extend(owner_compares(entry, owner));
    Txn::new()
        .when(compares)
        .and_then([TxnOp::delete(entry, None::<DeleteOptions>)])
}

/// The tag after the escaped key of a read-write lock's prefix.
pub(crate) const RW_TAG: &str = "%rw";
/// The tag after the escaped key of a semaphore's prefix.
pub(crate) const SEM_TAG: &str = "%sem";

/// Where the grants of `shape` on `key` live: `<prefix>/<escaped key>%rw/`
/// or `<prefix>/<escaped key>%sem/` (the mutex's `<prefix>/<escaped
/// key>/` for [`LockShape::Mutex`]). An escaped key never holds a `%`
/// that is not followed by `25` or `2F`, so these prefixes are disjoint
/// from every mutex prefix and from each other.
pub fn shape_prefix(prefix: &str, key: &LockKey, shape: LockShape) -> String {
    let tag = match shape {
        LockShape::ReadWrite => RW_TAG,
        LockShape::Semaphore => SEM_TAG,
        _ => return key_prefix(prefix, key),
    };
    if prefix.is_empty() {
        format!("{}{tag}/", escape_key(key.as_str()))
    } else {
        format!("{prefix}/{}{tag}/", escape_key(key.as_str()))
    }
}

/// `<prefix>/<escaped key>%rw-epoch`: the read-write lock's epoch key, put
/// (without a lease) in the transaction that grants a writer; its mod
/// revision is that writer's token, which later readers carry.
pub(crate) fn epoch_key(prefix: &str, key: &LockKey) -> String {
    if prefix.is_empty() {
        format!("{}{RW_TAG}-epoch", escape_key(key.as_str()))
    } else {
        format!("{prefix}/{}{RW_TAG}-epoch", escape_key(key.as_str()))
    }
}

/// The tag after the escaped name of an election's prefix.
pub(crate) const ELECTION_TAG: &str = "%elect";

/// What an election lease's data starts with (followed by its entry's
/// leaf, `<lease hex>` or `<lease hex>-<n>`): a mutex lease's data is empty
/// or starts with a lease id in hex, so the two never mix.
pub(crate) const ELECTION_DATA: &str = "elect:";

/// The name `etcdctl elect` and Go's `concurrency.NewElection` take for
/// the election `election`: `<prefix>/<escaped name>%elect`
/// (`<escaped name>%elect` without a prefix). Their candidates live under
/// that name plus the separator. An escaped key never holds a `%` that is
/// not followed by `25` or `2F`, so this is disjoint from every mutex
/// prefix (`<prefix>/<escaped key>/`, including the mutex of the key
/// `election/<name>` that the generic election takes) and from the
/// read-write and semaphore prefixes.
pub(crate) fn election_name(prefix: &str, election: &LockKey) -> String {
    if prefix.is_empty() {
        format!("{}{ELECTION_TAG}", escape_key(election.as_str()))
    } else {
        format!("{prefix}/{}{ELECTION_TAG}", escape_key(election.as_str()))
    }
}

/// Where an election's candidates live: [`election_name`] and the
/// separator.
pub(crate) fn election_prefix(prefix: &str, election: &LockKey) -> String {
    format!("{}/", election_name(prefix, election))
}

/// What an election lease carries: [`ELECTION_DATA`] and its entry's
/// leaf (always, also for the session's plain entry: the lease's key,
/// `election/<name>`, would otherwise name a mutex).
pub(crate) fn election_lease_data(entry: &str) -> String {
    let leaf = entry.rsplit('/').next().unwrap_or(entry);
    format!("{ELECTION_DATA}{leaf}")
}

/// Whether `entry` is a grant of a read-write lock or a semaphore: the
/// segment before its leaf ends with a shape tag (an escaped key cannot).
pub(crate) fn is_shared_entry(entry: &str) -> bool {
    entry
        .rsplit('/')
        .nth(1)
        .is_some_and(|segment| segment.ends_with(RW_TAG) || segment.ends_with(SEM_TAG))
}

/// The value of an entry of a read-write lock or a semaphore:
/// `<kind code> <owner hex> <holder details>` (`r ..`, `w ..`,
/// `p<count>-<limit> ..`, then [`HolderDetails::encode_current`]); the
/// mutex's [`mutex_value`] for [`LeaseKind::Exclusive`].
pub fn entry_value(kind: LeaseKind, owner: OwnerId) -> String {
    match kind {
        LeaseKind::Exclusive => mutex_value(owner),
        other => format!(
            "{} {}",
            shared_owner_part(other, owner),
            HolderDetails::encode_current()
        ),
    }
}

/// `<kind code> <owner hex>`: what a shared entry's value starts with.
pub fn shared_owner_part(kind: LeaseKind, owner: OwnerId) -> String {
    format!("{} {}", kind.code(), owner.to_hex())
}

/// A shared entry's value as read: its kind, its owner (hex) and the
/// holder details when it carries them (an earlier version wrote
/// `<kind code> <owner hex>` alone).
#[derive(Debug)]
pub struct SharedValue<'a> {
    /// The grant's kind (never [`LeaseKind::Exclusive`]).
    pub kind: LeaseKind,
    /// The owner id, in hex.
    pub owner: &'a str,
    /// The holder details, when the value carries them.
    pub details: Option<HolderDetails>,
}

/// Reads an entry value of a shared kind ([`entry_value`]).
pub fn parse_shared_value(value: &[u8]) -> Option<SharedValue<'_>> {
    let text = std::str::from_utf8(value).ok()?;
    let (code, rest) = text.split_once(' ')?;
    let kind = LeaseKind::from_code(code).ok()?;
    if kind == LeaseKind::Exclusive {
        return None;
    }
    let (owner, details) = match rest.split_once(' ') {
        Some((owner, details)) => (owner, HolderDetails::decode(details)),
        None => (rest, None),
    };
    Some(SharedValue {
        kind,
        owner,
        details,
    })
}

/// The compares that say the shared entry `entry` holds `kind` for
/// `owner`: its value is `<kind code> <owner hex>`, a space and the
/// details (above `<kind code> <owner hex>`, below `<kind code> <owner
/// hex>!`), whatever the details say; so a downgraded entry (`r <new
/// owner>`) no longer matches its write lease.
pub(crate) fn shared_owner_compares(entry: &str, kind: LeaseKind, owner: OwnerId) -> Vec<Compare> {
    owner_part_compares(entry, &shared_owner_part(kind, owner))
}

/// Deletes the shared entry `entry` only if it still has this create
/// revision and holds `kind` for `owner` ([`shared_owner_compares`]).
pub(crate) fn shared_delete(entry: &str, revision: i64, kind: LeaseKind, owner: OwnerId) -> Txn {
    let mut compares = vec![Compare::create_revision(entry, CompareOp::Equal, revision)];
    compares.extend(shared_owner_compares(entry, kind, owner));
    Txn::new()
        .when(compares)
        .and_then([TxnOp::delete(entry, None::<DeleteOptions>)])
}

/// What a shared lease carries: `<leaf>@<create revision>` (its token is
/// not its entry's create revision).
pub(crate) fn shared_lease_data(leaf: &str, create_revision: i64) -> String {
    format!("{leaf}@{create_revision}")
}

/// The inverse of [`shared_lease_data`]: (leaf, create revision).
pub(crate) fn parse_shared_lease_data(data: &str) -> Option<(&str, i64)> {
    let (leaf, revision) = data.rsplit_once('@')?;
    let revision: i64 = revision.parse().ok()?;
    (revision > 0 && !leaf.is_empty()).then_some((leaf, revision))
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
    fn unescaping_inverts_escaping_and_refuses_tags() {
        for key in ["a", "a/b", "100%", "%2F/%25", "é/x"] {
            assert_eq!(unescape_key(&escape_key(key)).as_deref(), Some(key));
        }
        for bad in ["a%rw", "a%sem", "a%elect", "a/b", "a%2", "%"] {
            assert_eq!(unescape_key(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn mutex_values_carry_the_owner_then_the_details() {
        let owner = OwnerId::from_u128(0xabc);
        let value = mutex_value(owner);
        assert_eq!(value_owner(value.as_bytes()), owner.to_hex().as_bytes());
        let details = value_details(value.as_bytes()).expect("details");
        assert_eq!(details.pid, std::process::id());
        assert_eq!(
            value_owner(owner.to_hex().as_bytes()),
            owner.to_hex().as_bytes()
        );
        assert_eq!(value_details(owner.to_hex().as_bytes()), None);
        // `etcdctl lock`'s empty value.
        assert_eq!(value_details(b""), None);
        assert_eq!(owner_compares("p/a%elect/1a", owner).len(), 2);
        assert_eq!(owner_compares("p/a/1a", owner).len(), 2);
    }

    #[test]
    fn shape_prefixes_are_disjoint_from_mutex_prefixes() {
        let k = |s: &str| LockKey::new(s).unwrap();
        let rw = shape_prefix("p", &k("a"), LockShape::ReadWrite);
        let sem = shape_prefix("p", &k("a"), LockShape::Semaphore);
        assert_eq!(rw, "p/a%rw/");
        assert_eq!(sem, "p/a%sem/");
        assert_eq!(shape_prefix("p", &k("a"), LockShape::Mutex), "p/a/");
        assert_eq!(epoch_key("p", &k("a")), "p/a%rw-epoch");
        assert_eq!(shape_prefix("", &k("a"), LockShape::ReadWrite), "a%rw/");
        // A mutex key spelled like the tag escapes its `%`.
        let tricky = key_prefix("p", &k("a%rw"));
        assert_eq!(tricky, "p/a%25rw/");
        for mutex in [key_prefix("p", &k("a")), tricky] {
            for shared in [&rw, &sem] {
                assert!(!shared.starts_with(&mutex) && !mutex.starts_with(shared.as_str()));
            }
        }
        assert!(!epoch_key("p", &k("a")).starts_with(&rw));
        assert!(is_shared_entry("p/a%rw/1a"));
        assert!(is_shared_entry("p/a%sem/1a-2"));
        assert!(!is_shared_entry("p/a/1a"));
        assert!(!is_shared_entry("p/a%25rw/1a"));
    }

    #[test]
    fn election_prefixes_are_disjoint_from_lock_prefixes() {
        let k = |s: &str| LockKey::new(s).unwrap();
        assert_eq!(election_name("p", &k("leader")), "p/leader%elect");
        assert_eq!(election_prefix("p", &k("leader")), "p/leader%elect/");
        assert_eq!(election_prefix("", &k("a/b")), "a%2Fb%elect/");
        let election = election_prefix("p", &k("a"));
        // The generic election's mutex (`election/a`), a mutex spelled like
        // the tag, and the other shapes of `a`.
        let others = [
            key_prefix("p", &k("a")),
            key_prefix("p", &k("election/a")),
            key_prefix("p", &k("a%elect")),
            shape_prefix("p", &k("a"), LockShape::ReadWrite),
            shape_prefix("p", &k("a"), LockShape::Semaphore),
        ];
        for other in &others {
            assert!(
                !other.starts_with(&election) && !election.starts_with(other.as_str()),
                "{other} and {election}"
            );
        }
        assert!(!is_shared_entry("p/a%elect/1a"));
    }

    #[test]
    fn shared_values_and_lease_data_round_trip() {
        let owner = OwnerId::from_u128(0xabc);
        let kind = LeaseKind::permits(2, 5).unwrap();
        let value = entry_value(kind, owner);
        let parsed = parse_shared_value(value.as_bytes()).expect("a shared value");
        assert_eq!(parsed.kind, kind);
        assert_eq!(parsed.owner, owner.to_hex());
        let details = parsed.details.expect("details");
        assert_eq!(details.pid, std::process::id());
        assert!(value.starts_with(&format!("p2-5 {} h=", owner.to_hex())));
        // An earlier version's value: no details.
        let old = format!("r {}", owner.to_hex());
        let parsed = parse_shared_value(old.as_bytes()).expect("an older value");
        assert_eq!(
            (parsed.kind, parsed.owner),
            (LeaseKind::Read, &*owner.to_hex())
        );
        assert!(parsed.details.is_none());
        assert_eq!(
            entry_value(LeaseKind::Exclusive, owner).split(' ').next(),
            Some(&*owner.to_hex())
        );
        assert!(parse_shared_value(owner.to_hex().as_bytes()).is_none());
        assert!(parse_shared_value(b"x 00").is_none());
        assert_eq!(shared_owner_compares("p/a%sem/1a", kind, owner).len(), 2);
        assert_eq!(parse_shared_lease_data("1a-2@17"), Some(("1a-2", 17)));
        assert_eq!(shared_lease_data("1a", 9), "1a@9");
        for bad in ["", "1a", "@3", "1a@0", "1a@x"] {
            assert_eq!(parse_shared_lease_data(bad), None, "{bad:?}");
        }
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
