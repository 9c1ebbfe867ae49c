//! The key layout: how a [`LockKey`] becomes ZooKeeper directories and
//! node names. Public so that other code (the benchmark floor in
//! `lock-bench`, tools that inspect an ensemble) takes exactly the
//! driver's nodes; the driver itself is used through [`crate::ZkBackend`].
//!
//!
//! - A key becomes one path component under the lock root: every byte
//!   outside `[A-Za-z0-9_-]` is percent-encoded (`%2F` for `/`, `%2E` for
//!   `.`, `%25` for `%`). The mapping is injective, never yields `.`, `..`
//!   or a `/`, so no key can leave its directory or collide with another,
//!   and `zookeeper` stays harmless because the lock root is never `/`.
//! - A lock node is `_c_<attempt id as a UUID>-lock-<sequence>`: Curator's
//!   "protected" name for its lock recipe, so nodes sort the same way for
//!   Curator, and a create whose reply was lost can be found by its id.
//! - A mutex also counts kazoo's lock nodes in its directory as
//!   contenders: `<uuid hex>__lock__<seq>` (kazoo's `Lock` and
//!   `WriteLock`) and `<uuid hex>__rlock__<seq>` (its `ReadLock`), ordered
//!   by their sequence numbers among ours and Curator's (one parent, one
//!   counter, so the numbers compare).
//! - With `nodes=kazoo` ([`ZkNodeNames::Kazoo`]) our mutex node is
//!   `<attempt id, 32 lowercase hex>__lock__<sequence>` instead: exactly
//!   kazoo's `uuid4().hex + "__lock__"` prefix, so kazoo's contender
//!   pattern (`__lock__(-?\d{10})$`) matches it. Its owner is read back
//!   from the 32 digits before `__lock__`.

use lock_core::{Lease, LockKey, OwnerId};

use crate::config::{ZkConfig, ZkLayout, ZkNodeNames};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Everything but `[A-Za-z0-9_-]` is escaped.
pub(crate) const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'_').remove(b'-');

/// Curator's protected-name prefix.
const PROTECTED_PREFIX: &str = "_c_";
/// The lock name Curator's `InterProcessMutex` uses; nodes sort on what
/// follows it.
pub const LOCK_NAME: &str = "lock-";
/// The node name of kazoo's `Lock` and `WriteLock` (`<uuid hex>__lock__<seq>`).
pub(crate) const KAZOO_LOCK_NAME: &str = "__lock__";
/// The node name of kazoo's `ReadLock` (`<uuid hex>__rlock__<seq>`).
pub(crate) const KAZOO_READ_NAME: &str = "__rlock__";
/// The read node name of Curator's `InterProcessReadWriteLock`.
pub(crate) const READ_NAME: &str = "__READ__";
/// The write node name of Curator's `InterProcessReadWriteLock`.
pub(crate) const WRITE_NAME: &str = "__WRIT__";
/// The lease node name of Curator's `InterProcessSemaphoreV2`.
pub const LEASE_NAME: &str = "lease-";
/// The candidate node name of Curator's `LeaderLatch`.
pub(crate) const LATCH_NAME: &str = "latch-";
/// Every node name this driver creates (after the protected prefix).
const NAMES: [&str; 5] = [LOCK_NAME, READ_NAME, WRITE_NAME, LEASE_NAME, LATCH_NAME];

/// The parent of every read-write lock's directory. Its name starts with
/// `.`, which an escaped key never does (`.` is escaped), so it cannot
/// collide with a mutex's directory.
pub(crate) const RW_PARENT: &str = ".rwlock";
/// The parent of every read-write lock's epoch node (see [`rw_epoch_path`]
/// and [`RW_PARENT`]).
pub(crate) const RW_EPOCH_PARENT: &str = ".rwepoch";
/// The parent of every semaphore's directory (see [`RW_PARENT`]).
pub(crate) const SEM_PARENT: &str = ".semaphore";
/// The parent of every election's latch directory (see [`RW_PARENT`]).
pub(crate) const ELECTION_PARENT: &str = ".election";

/// The latch directory of the election named `election`:
/// `<root>/.election/<escaped name>` (Curator's `LeaderLatch` path: its
/// candidates' `latch-` nodes are its children).
pub(crate) fn latch_dir(root: &str, election: &LockKey) -> String {
    latch_dir_of(root, election.as_str())
}

/// [`latch_dir`] of an election name's text.
pub(crate) fn latch_dir_of(root: &str, election: &str) -> String {
    format!(
        "{root}/{ELECTION_PARENT}/{}",
        utf8_percent_encode(election, COMPONENT)
    )
}

/// The directory of `key`'s read-write lock: `<root>/.rwlock/<escaped key>`.
pub(crate) fn rw_dir(root: &str, key: &LockKey) -> String {
    format!(
        "{root}/{RW_PARENT}/{}",
        utf8_percent_encode(key.as_str(), COMPONENT)
    )
}

/// The persistent node holding `key`'s write epoch (its last write grant's
/// token): `<root>/.rwepoch/<escaped key>`. Not in the lock's directory: a
/// container the server deletes once empty, where a foreign child would
/// also confuse Curator's predicates.
pub(crate) fn rw_epoch_path(root: &str, key: &LockKey) -> String {
    rw_epoch_path_of(
        root,
        &utf8_percent_encode(key.as_str(), COMPONENT).to_string(),
    )
}

/// [`rw_epoch_path`] of a key's escaped component.
pub(crate) fn rw_epoch_path_of(root: &str, escaped: &str) -> String {
    format!("{root}/{RW_EPOCH_PARENT}/{escaped}")
}

/// The directory of `key`'s semaphore: `<root>/.semaphore/<escaped key>`
/// (Curator's `InterProcessSemaphoreV2` path: its `locks` and `leases`
/// children are below it).
pub fn sem_dir(root: &str, key: &LockKey) -> String {
    format!(
        "{root}/{SEM_PARENT}/{}",
        utf8_percent_encode(key.as_str(), COMPONENT)
    )
}

/// Whether `dir` is a read-write lock's directory under `root`.
pub(crate) fn is_rw_dir(root: &str, dir: &str) -> bool {
    dir.strip_prefix(root)
        .and_then(|rest| rest.strip_prefix('/'))
        .and_then(|rest| rest.strip_prefix(RW_PARENT))
        .is_some_and(|rest| rest.starts_with('/') && !rest[1..].contains('/'))
}

/// The path of `owner`'s node named `name` (one of the names above) with
/// sequence `seq` in `dir`, as the server names it.
pub(crate) fn named_node_path(dir: &str, owner: OwnerId, name: &str, seq: u32) -> String {
    let mut path = named_prefix(dir, owner, name);
    push_sequence(&mut path, seq);
    path
}

/// Appends a sequence number as the server writes it in a sequential
/// node's name: `%010d`, and 19 digits past `i32::MAX` (as the client
/// crate formats it), without the formatting machinery.
fn push_sequence(path: &mut String, seq: u32) {
    let width = if i32::try_from(seq).is_ok() { 10 } else { 19 };
    let mut digits = [b'0'; 19];
    let mut rest = seq;
    for slot in digits[..width].iter_mut().rev() {
        // One decimal digit.
        #[allow(clippy::cast_possible_truncation)]
        let digit = (rest % 10) as u8;
        *slot = b'0' + digit;
        rest /= 10;
    }
    path.push_str(std::str::from_utf8(&digits[..width]).unwrap_or_default());
}

/// The path prefix of `owner`'s node named `name` in `dir` (the server
/// appends the sequence number to a sequential create).
pub fn named_prefix(dir: &str, owner: OwnerId, name: &str) -> String {
    let mut path = node_path_prefix(dir, owner);
    path.truncate(path.len() - LOCK_NAME.len());
    path.push_str(name);
    path
}

/// The sequence number of a node called `name` (the digits after its last
/// `name`), as Curator's `fixForSorting` reads it.
pub(crate) fn sequence_named(node: &str, name: &str) -> Option<i64> {
    if name.as_bytes().last().is_none_or(u8::is_ascii_digit) {
        // A name that ends with a digit (none of ours does) may stand
        // anywhere in the trailing digits: search for it.
        let at = node.rfind(name)?;
        let digits = &node[at + name.len()..];
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        return digits.parse().ok();
    }
    // Otherwise its last occurrence followed only by digits ends where the
    // trailing digits begin: no substring search (a cycle reads every
    // contender's name).
    let start = node
        .bytes()
        .rposition(|b| !b.is_ascii_digit())
        .map_or(0, |i| i + 1);
    let (head, digits) = node.split_at(start);
    if digits.is_empty() || !head.ends_with(name) {
        return None;
    }
    digits.parse().ok()
}

/// The directory holding `key`'s lock nodes.
pub fn key_dir(root: &str, key: &LockKey) -> String {
    key_dir_of(root, key.as_str())
}

/// The layout `key` is kept in: `layout`, except that the library's own
/// keys (under [`lock_core::RESERVED_KEY_PREFIX`]: a migration's cutover
/// marker) stay in the escaped layout under the root, since they are no
/// lock path another client uses.
pub(crate) fn layout_of(layout: ZkLayout, key: &str) -> ZkLayout {
    if key.starts_with(lock_core::RESERVED_KEY_PREFIX) {
        ZkLayout::Escaped
    } else {
        layout
    }
}

/// The directory of a mutex key's text in `layout`: [`key_dir_of`], or
/// the key itself in the path layout (checked by [`check_path_key`]
/// before anything is created).
pub(crate) fn mutex_dir_of(root: &str, layout: ZkLayout, key: &str) -> String {
    match layout_of(layout, key) {
        ZkLayout::Escaped => key_dir_of(root, key),
        ZkLayout::Path => key.to_owned(),
    }
}

/// Whether `dir` is `key`'s mutex directory in `layout`.
pub(crate) fn is_mutex_dir(root: &str, layout: ZkLayout, key: &LockKey, dir: &str) -> bool {
    match layout_of(layout, key.as_str()) {
        ZkLayout::Escaped => is_key_dir(root, key, dir),
        ZkLayout::Path => dir == key.as_str(),
    }
}

/// In the path layout, a key must be an absolute ZooKeeper path (no empty,
/// `.` or `..` component, not `/`) outside `/zookeeper`.
pub(crate) fn check_path_key(key: &LockKey) -> Result<(), String> {
    let path = key.as_str();
    crate::config::validate_path(path, "lock path").map_err(|e| e.to_string())?;
    if path == "/zookeeper" || path.starts_with("/zookeeper/") {
        return Err(format!(
            "bad lock path {path:?}: inside /zookeeper (reserved by the server)"
        ));
    }
    Ok(())
}

/// [`key_dir`] of a key's text.
pub(crate) fn key_dir_of(root: &str, key: &str) -> String {
    // Borrowed when nothing needs escaping (the common key): one
    // allocation of the right size, no formatting.
    let escaped: std::borrow::Cow<'_, str> = utf8_percent_encode(key, COMPONENT).into();
    let mut dir = String::with_capacity(root.len() + 1 + escaped.len());
    dir.push_str(root);
    dir.push('/');
    dir.push_str(&escaped);
    dir
}

/// The key whose [`key_dir_of`] component is `name` (a child of the
/// root), or `None` for a child that is no escaped key (the shapes' `.`
/// directories, anything not in the canonical escaped form).
pub(crate) fn key_of_component(name: &str) -> Option<LockKey> {
    let key = percent_encoding::percent_decode_str(name)
        .decode_utf8()
        .ok()?;
    // Canonical only: `%41` and `A` would otherwise name one key twice.
    if utf8_percent_encode(&key, COMPONENT).to_string() != name {
        return None;
    }
    LockKey::new(key.into_owned()).ok()
}

/// The data of our mutex node: the owner id in hex (what kazoo's
/// `contenders()` lists), a newline, and the holder details
/// ([`lock_core::HolderDetails::encode_current`]).
pub(crate) fn mutex_node_data(owner: OwnerId) -> String {
    let details = lock_core::HolderDetails::encode_current();
    let mut data = String::with_capacity(32 + 1 + details.len());
    data.push_str(owner.hex().as_str());
    data.push('\n');
    data.push_str(&details);
    data
}

/// The holder details in a mutex node's data ([`mutex_node_data`]);
/// `None` for anything else (a kazoo client's identifier, Curator's IP
/// address, a node of an earlier version of ours with no data).
pub(crate) fn details_of_data(data: &[u8]) -> Option<lock_core::HolderDetails> {
    let text = std::str::from_utf8(data).ok()?;
    let (owner, details) = text.split_once('\n')?;
    OwnerId::from_hex(owner).ok()?;
    lock_core::HolderDetails::decode(details)
}

/// Whether `dir` is [`key_dir`]`(root, key)`, without building it.
pub fn is_key_dir(root: &str, key: &LockKey, dir: &str) -> bool {
    let Some(mut rest) = dir.strip_prefix(root).and_then(|r| r.strip_prefix('/')) else {
        return false;
    };
    for chunk in utf8_percent_encode(key.as_str(), COMPONENT) {
        match rest.strip_prefix(chunk) {
            Some(r) => rest = r,
            None => return false,
        }
    }
    rest.is_empty()
}

/// The name prefix a lock node of `owner` is created with (the server
/// appends the sequence number).
#[cfg(test)]
pub(crate) fn node_prefix(owner: OwnerId) -> String {
    let mut prefix = String::with_capacity(PREFIX_LEN);
    push_node_prefix(&mut prefix, owner);
    prefix
}

/// The path prefix of `owner`'s lock node in `dir`, built in one allocation
/// with room for the sequence number the server appends.
pub fn node_path_prefix(dir: &str, owner: OwnerId) -> String {
    let mut path = String::with_capacity(dir.len() + 1 + PREFIX_LEN + 10);
    path.push_str(dir);
    path.push('/');
    push_node_prefix(&mut path, owner);
    path
}

/// The path of `owner`'s lock node with sequence `seq` in `dir`, written as
/// the server names it (`%010d`, wider past `i32::MAX` as the client
/// crate formats it).
pub(crate) fn node_path(dir: &str, owner: OwnerId, seq: u32) -> String {
    let mut path = node_path_prefix(dir, owner);
    push_sequence(&mut path, seq);
    path
}

/// `_c_` + UUID + `-lock-`.
const PREFIX_LEN: usize = PROTECTED_PREFIX.len() + 36 + 1 + LOCK_NAME.len();

fn push_node_prefix(out: &mut String, owner: OwnerId) {
    out.push_str(PROTECTED_PREFIX);
    owner.push_uuid(out);
    out.push('-');
    out.push_str(LOCK_NAME);
}

/// The owner id embedded in one of our node names, if it is one.
pub fn owner_of(name: &str) -> Option<OwnerId> {
    let rest = name.strip_prefix(PROTECTED_PREFIX)?;
    let uuid = rest.get(..36)?;
    if !rest[36..]
        .strip_prefix('-')
        .is_some_and(|r| NAMES.iter().any(|n| r.starts_with(n)) || details_part(r).is_some())
    {
        return None;
    }
    // The 32 digits without the 4 dashes, on the stack.
    let mut hex = [0u8; 32];
    let mut len = 0;
    let mut dashes = 0;
    for b in uuid.bytes() {
        if b == b'-' {
            dashes += 1;
        } else {
            *hex.get_mut(len)? = b;
            len += 1;
        }
    }
    if len != 32 || dashes != 4 {
        return None;
    }
    OwnerId::from_hex(std::str::from_utf8(&hex).ok()?).ok()
}

/// The sequence number of a lock node: the digits after the last `lock-`
/// (Curator's `fixForSorting`). `None` for children that are not lock nodes.
#[cfg(test)]
pub(crate) fn sequence_of(name: &str) -> Option<i64> {
    sequence_named(name, LOCK_NAME)
}

/// Lock nodes among `children`, in grant order (sequence, then name).
pub fn sorted_lock_nodes(children: Vec<String>) -> Vec<(i64, String)> {
    sorted_named(children, LOCK_NAME)
}

/// Nodes called `name` among `children`, in Curator's order (sequence,
/// then name). Children without `name` and digits are not candidates.
pub(crate) fn sorted_named(children: Vec<String>, name: &str) -> Vec<(i64, String)> {
    let mut nodes: Vec<(i64, String)> = children
        .into_iter()
        .filter_map(|child| sequence_named(&child, name).map(|seq| (seq, child)))
        .collect();
    nodes.sort();
    nodes
}

/// A mutex's contenders among `children`, in grant order (sequence, then
/// name): `lock-` nodes (ours and Curator's `InterProcessMutex`) and
/// kazoo's `__lock__` and `__rlock__` nodes. A kazoo reader counts too:
/// like kazoo's `WriteLock`, a mutex does not share with readers.
pub(crate) fn sorted_mutex_contenders(children: Vec<String>) -> Vec<(i64, String)> {
    let mut nodes: Vec<(i64, String)> = children
        .into_iter()
        .filter_map(|child| mutex_sequence_of(&child).map(|seq| (seq, child)))
        .collect();
    nodes.sort();
    nodes
}

/// The sequence number of a mutex contender (see
/// [`sorted_mutex_contenders`]): a `lock-`, `__lock__` or `__rlock__` node.
pub(crate) fn mutex_sequence_of(name: &str) -> Option<i64> {
    [LOCK_NAME, KAZOO_LOCK_NAME, KAZOO_READ_NAME]
        .iter()
        .find_map(|n| sequence_named(name, n))
}

/// The path prefix of `owner`'s mutex node in `dir` named as `nodes` says
/// (the server appends the sequence number).
pub(crate) fn mutex_node_prefix(dir: &str, owner: OwnerId, nodes: ZkNodeNames) -> String {
    match nodes {
        ZkNodeNames::Curator => node_path_prefix(dir, owner),
        ZkNodeNames::Kazoo => {
            let mut path = String::with_capacity(dir.len() + 1 + 32 + KAZOO_LOCK_NAME.len() + 10);
            path.push_str(dir);
            path.push('/');
            path.push_str(owner.hex().as_str());
            path.push_str(KAZOO_LOCK_NAME);
            path
        }
    }
}

/// The path of `owner`'s mutex node with sequence `seq` in `dir`, named as
/// `nodes` says, as the server names it (see [`node_path`]).
pub(crate) fn mutex_node_path(dir: &str, owner: OwnerId, nodes: ZkNodeNames, seq: u32) -> String {
    let mut path = mutex_node_prefix(dir, owner, nodes);
    push_sequence(&mut path, seq);
    path
}

/// The owner id of a kazoo-named node (`<32 lowercase hex>__lock__<digits>`,
/// what `nodes=kazoo` creates and kazoo's `Lock` names its own nodes).
pub(crate) fn kazoo_owner_of(name: &str) -> Option<OwnerId> {
    let hex = name.get(..32)?;
    let digits = name[32..].strip_prefix(KAZOO_LOCK_NAME)?;
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    OwnerId::from_hex(hex).ok()
}

/// The owner id in a mutex node name of either naming ([`owner_of`] or
/// [`kazoo_owner_of`]): for finding and deleting the nodes of one attempt
/// (attempt ids are random, so a kazoo client's id never equals ours).
pub(crate) fn mutex_owner_of(name: &str) -> Option<OwnerId> {
    owner_of(name).or_else(|| kazoo_owner_of(name))
}

/// Splits a lock node path into its directory and name.
pub fn split_node(path: &str) -> Option<(&str, &str)> {
    let (dir, name) = path.rsplit_once('/')?;
    if dir.is_empty() || name.is_empty() {
        return None;
    }
    Some((dir, name))
}

// ---- Latch node names ----
//
// The names of our election candidates' latch nodes, which carry the
// holder details.
//
// A latch node's data is Curator's participant id: `LeaderLatch`'s
// `getLeader()` and `getParticipants()` read the whole data as the id
// (`new String(bytes, UTF-8)`), so nothing can follow our owner hex there
// without changing the id Curator reports. The details go in the name
// instead: `_c_<owner id as a UUID>-<escaped details>-latch-<sequence>`.
// Curator sorts latch nodes on the text after the *last* `latch-`
// (`fixForSorting`), so these names rank by their sequence number among
// Curator's `_c_<uuid>-latch-<sequence>` nodes; our own order (the digits
// after the last `latch-`) is the same. The details are
// [`HolderDetails::encode_current`]'s text percent-encoded as a key
// component (`[A-Za-z0-9_-]` kept, so the name holds no `/`), a few
// hundred bytes at most. A plain `_c_<uuid>-latch-<seq>` (Curator's, or an
// earlier version of ours) has no details.

/// The separator between the details and the latch name.
const DETAILED_LATCH: &str = "-latch-";

/// This process's details for a candidacy starting now, escaped for a
/// node name.
pub(crate) fn details_component() -> String {
    utf8_percent_encode(&lock_core::HolderDetails::encode_current(), COMPONENT).to_string()
}

/// What follows `_c_<uuid>-` in a latch node's name before the sequence:
/// `latch-` without details, `<details>-latch-` with them.
pub(crate) fn latch_name(details: &str) -> String {
    if details.is_empty() {
        LATCH_NAME.to_owned()
    } else {
        format!("{details}{DETAILED_LATCH}")
    }
}

/// Whether `text` is escaped details as [`details_component`] writes them
/// (possibly empty).
pub(crate) fn is_details_component(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'%'))
}

/// The escaped details in what follows `_c_<uuid>-` in a node's name
/// (`<details>-latch-<digits>`): `None` when it is no detailed latch name.
pub(crate) fn details_part(rest: &str) -> Option<&str> {
    let at = rest.rfind(DETAILED_LATCH)?;
    let digits = &rest[at + DETAILED_LATCH.len()..];
    let details = &rest[..at];
    (!details.is_empty()
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && is_details_component(details))
    .then_some(details)
}

/// The escaped details in a latch node `name` of ours (`""` for a plain
/// latch name, Curator's or an earlier version of ours).
pub(crate) fn details_of_name(name: &str) -> &str {
    name.strip_prefix("_c_")
        .and_then(|rest| rest.get(37..))
        .and_then(details_part)
        .unwrap_or("")
}

/// The holder details a latch node's name carries, if any.
pub(crate) fn holder_details(name: &str) -> Option<lock_core::HolderDetails> {
    let escaped = details_of_name(name);
    if escaped.is_empty() {
        return None;
    }
    lock_core::HolderDetails::decode(
        &percent_encoding::percent_decode_str(escaped)
            .decode_utf8()
            .ok()?,
    )
}

// ---- Leases: the node a lease names ----

/// The `backend_data` prefix of an election (latch node) lease.
pub(crate) const LATCH_DATA: &str = "latch:";

/// The `backend_data` prefix of a mutex lease on a kazoo-named node.
pub(crate) const KAZOO_DATA: &str = "kazoo:";

/// A lease's lock node (see [`lease_node`]).
pub(crate) struct NodeRef {
    pub(crate) path: String,
    pub(crate) dir_len: usize,
    pub(crate) seq: u32,
}

impl NodeRef {
    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    pub(crate) fn dir(&self) -> &str {
        &self.path[..self.dir_len]
    }
}

/// The lock node of `lease`: its key's directory, a name carrying the
/// lease's owner id, and the sequence number the lease stores (its
/// `backend_data`, the digits alone: the rest of the path follows from
/// the key and the owner, so a held lease keeps a few bytes instead of
/// the whole path). A full path (what earlier versions stored) is
/// accepted when it is a lock node of the lease's key and owner.
/// Anything else is not a lease of ours and is never acted on.
pub(crate) fn lease_node(config: &ZkConfig, lease: &Lease) -> Option<NodeRef> {
    let data = lease.backend_data();
    let root = config.root();
    if let Some(latch) = data.strip_prefix(LATCH_DATA) {
        // An election's latch node (see elections.rs), its name with the
        // details (`latch:<seq>;<details>`) or without (`latch:<seq>`,
        // an earlier version's).
        let election = lease.key().as_str().strip_prefix("election/")?;
        let (seq, details) = latch.split_once(';').unwrap_or((latch, ""));
        if seq.is_empty()
            || !seq.bytes().all(|b| b.is_ascii_digit())
            || !is_details_component(details)
        {
            return None;
        }
        let seq: u32 = seq.parse().ok()?;
        let dir = latch_dir_of(root, election);
        let name = latch_name(details);
        return Some(NodeRef {
            dir_len: dir.len(),
            path: named_node_path(&dir, lease.owner(), &name, seq),
            seq,
        });
    }
    if data.starts_with('/') {
        let (node_dir, name) = split_node(data)?;
        let seq = u32::try_from(mutex_sequence_of(name)?).ok()?;
        return (is_mutex_dir(root, config.layout(), lease.key(), node_dir)
            && mutex_owner_of(name) == Some(lease.owner()))
        .then(|| NodeRef {
            path: data.to_owned(),
            dir_len: node_dir.len(),
            seq,
        });
    }
    // A kazoo-named node (`nodes=kazoo`) says so in its data, so any
    // backend on the key's directory finds it whatever its own setting.
    let (nodes, data) = match data.strip_prefix(KAZOO_DATA) {
        Some(seq) => (ZkNodeNames::Kazoo, seq),
        None => (ZkNodeNames::Curator, data),
    };
    if data.is_empty() || !data.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let seq: u32 = data.parse().ok()?;
    let dir = mutex_dir_of(root, config.layout(), lease.key().as_str());
    Some(NodeRef {
        dir_len: dir.len(),
        path: mutex_node_path(&dir, lease.owner(), nodes, seq),
        seq,
    })
}

#[cfg(test)]
mod tests;
