//! Operating locks: who holds a key (with the holder details stored in
//! its entry's value), the held mutexes under a prefix (`list`), breaking
//! a stuck lock (`force_release`), and `gc` (nothing to collect).

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, Txn, TxnOp, WatchOptions,
};
use lock_core::{
    ErrorKind, FencingToken, GcReport, LockError, LockInfo, LockKey, LockPage, Operation,
    check_list_limit, with_timeout,
};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use super::EtcdBackend;
use crate::error::{NAME, from_etcd};
use crate::keys::{self, escape_key, unescape_key, value_details};

/// The most entries one `list` call reads (one range request).
pub(crate) const LIST_SCAN_MAX: i64 = 2_000;

/// How many times `force_release` reads the holder and tries to delete it
/// when the holder changes in between.
const FORCE_ATTEMPTS: usize = 5;

/// How many lease reads (remaining TTLs of other processes' holders) a
/// `list` page runs at once.
const TTL_READS_AT_ONCE: usize = 32;

/// What a `list` cursor starts with: the next range read starts at the
/// rest (an entry name without the backend's prefix), inclusive...
const CURSOR_FROM: &str = "etcd:";
/// ...or just after it.
const CURSOR_AFTER: &str = "etcd+:";

/// The holder's entry of a key, as read.
pub(super) struct HolderEntry {
    pub(super) info: LockInfo,
    pub(super) entry: String,
    pub(super) revision: i64,
    pub(super) lease_id: i64,
}

/// The end of etcd's range over every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every key (etcd's "\0" range end).
    vec![0]
}

impl EtcdBackend {
    /// What every entry name of this backend starts with: the prefix and
    /// the separator (nothing without a prefix).
    fn root(&self) -> String {
        if self.inner.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.inner.prefix)
        }
    }

    /// The holder of `key` (its oldest entry), as `inspect` reports it.
    pub(super) async fn read_holder(
        &self,
        key: &LockKey,
        op: Operation,
    ) -> Result<Option<HolderEntry>, LockError> {
        Ok(self.read_holder_at(key, op).await?.0)
    }

    /// Waits until the mutex's holder is no longer `seen` (or `deadline`),
    /// waking on an etcd watch of the key's entries from the revision after
    /// the read, so a change between the read and the watch is not missed.
    /// No polling.
    pub(super) async fn watch_holder_of(
        &self,
        key: &LockKey,
        seen: Option<&LockInfo>,
        deadline: Instant,
    ) -> Result<Option<LockInfo>, LockError> {
        loop {
            let (holder, revision) = self.read_holder_at(key, Operation::Inspect).await?;
            let now = holder.map(|h| h.info);
            if !LockInfo::same_holder(now.as_ref(), seen) || Instant::now() >= deadline {
                return Ok(now);
            }
            let options = WatchOptions::new()
                .with_prefix()
                .with_start_revision(revision + 1);
            tokio::select! {
                () = sleep_until(deadline) => {}
                () = self.wait_change(self.key_prefix(key).into_bytes(), options, revision + 1) => {}
            }
        }
    }

    /// The holder and the store's revision of the read.
    async fn read_holder_at(
        &self,
        key: &LockKey,
        op: Operation,
    ) -> Result<(Option<HolderEntry>, i64), LockError> {
        let key_prefix = self.key_prefix(key);
        let mut kv = self.inner.client.kv_client();
        let response = with_timeout(self.inner.config.op_timeout, op, async {
            kv.get(key_prefix.as_str(), Some(keys::oldest_entry()))
                .await
                .map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_key(key).with_backend(NAME))?;
        let revision = response.header().map_or(0, |h| h.revision());
        let Some(holder) = response.kvs().first() else {
            return Ok((None, revision));
        };
        let remaining_ttl = self
            .remaining_ttl(&String::from_utf8_lossy(holder.key()), holder.lease(), op)
            .await;
        Ok((
            Some(holder_entry(key, &key_prefix, holder, remaining_ttl)),
            revision,
        ))
    }

    /// See [`lock_core::LockBackend::force_release`]: deletes the holder's
    /// entry in a transaction comparing its create revision (the holder
    /// read just before; read again if it changed in between).
    pub(super) async fn break_lock(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let op = Operation::Release;
        for _ in 0..FORCE_ATTEMPTS {
            let Some(holder) = self.read_holder(key, op).await? else {
                return Ok(None);
            };
            let txn = Txn::new()
                .when([Compare::create_revision(
                    holder.entry.as_str(),
                    CompareOp::Equal,
                    holder.revision,
                )])
                .and_then([TxnOp::delete(holder.entry.as_str(), None::<DeleteOptions>)]);
            let deleted = self
                .txn(op, txn)
                .await
                .map_err(|e| e.with_key(key))?
                .succeeded();
            if deleted {
                if let Some(session) = self.session_by_lease(holder.lease_id) {
                    session.forget_grant(&holder.entry, holder.revision);
                }
                tracing::warn!(
                    %key,
                    holder = %holder.info.holder,
                    token = holder.revision,
                    "lock force-released"
                );
                return Ok(Some(holder.info));
            }
        }
        Err(LockError::new(
            ErrorKind::Contended,
            op,
            format!("the holder changed during each of {FORCE_ATTEMPTS} attempts to break it"),
        )
        .with_key(key)
        .with_backend(NAME))
    }

    /// See [`lock_core::LockBackend::list`] and the crate docs: one range
    /// read of at most [`LIST_SCAN_MAX`] entries from the cursor, grouped
    /// by key, plus one lease read per other process's lease among the
    /// holders (and one holder read when a single key's queue fills the
    /// whole scan).
    pub(super) async fn list_locks(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage, LockError> {
        check_list_limit(limit).map_err(|e| e.with_backend(NAME))?;
        let op = Operation::Inspect;
        let root = self.root();
        let scope = escape_key(prefix);
        let start = match cursor {
            None => format!("{root}{scope}"),
            Some(text) => {
                let (rest, after) = match (
                    text.strip_prefix(CURSOR_FROM),
                    text.strip_prefix(CURSOR_AFTER),
                ) {
                    (Some(rest), _) => (rest, false),
                    (_, Some(rest)) => (rest, true),
                    _ => return Err(bad_cursor(text)),
                };
                if !rest.starts_with(&scope) || (after && rest.is_empty()) {
                    return Err(bad_cursor(text));
                }
                let mut start = format!("{root}{rest}");
                if after {
                    start.push('\0');
                }
                start
            }
        };
        let end = prefix_end(format!("{root}{scope}").as_bytes());
        // etcd refuses an empty key; "\0" with the end "\0" is every key.
        let start_key = if start.is_empty() {
            vec![0]
        } else {
            start.into_bytes()
        };
        let scan = i64::try_from(limit.saturating_mul(2).saturating_add(8))
            .unwrap_or(LIST_SCAN_MAX)
            .min(LIST_SCAN_MAX);
        let mut kv = self.inner.client.kv_client();
        let response = with_timeout(self.inner.config.op_timeout, op, async {
            kv.get(
                start_key,
                Some(GetOptions::new().with_range(end).with_limit(scan)),
            )
            .await
            .map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_backend(NAME))?;
        let kvs = response.kvs();

        // Consecutive entries of one mutex (a key's entries are contiguous
        // in key order: they share `<root><escaped key>/`).
        let mut groups: Vec<Group> = Vec::new();
        for (i, kv) in kvs.iter().enumerate() {
            let Some((segment, key)) = mutex_entry(&root, kv.key()) else {
                continue;
            };
            match groups.last_mut() {
                Some(group) if group.segment == segment => {
                    group.last = i;
                    if kv.create_revision() < kvs[group.holder].create_revision() {
                        group.holder = i;
                    }
                }
                _ => groups.push(Group {
                    segment,
                    key,
                    holder: i,
                    last: i,
                    completed: None,
                }),
            }
        }
        let cursor_from = |name: String| {
            let rest = name.strip_prefix(root.as_str()).unwrap_or(&name).to_owned();
            format!("{CURSOR_FROM}{rest}")
        };
        let mut next = None;
        if response.more() {
            next = kvs.last().map(|last| {
                let name = String::from_utf8_lossy(last.key());
                let rest = name.strip_prefix(root.as_str()).unwrap_or(&name);
                format!("{CURSOR_AFTER}{rest}")
            });
            // The last key's queue may go on past the scan.
            if let Some(last) = groups.last()
                && last.last + 1 == kvs.len()
            {
                if groups.len() > 1 {
                    let cut = groups.pop().map(|g| g.segment).unwrap_or_default();
                    next = Some(cursor_from(format!("{root}{cut}/")));
                } else if let Some(group) = groups.last_mut() {
                    // One key's entries fill the whole scan: read its holder
                    // on its own, and go on after the key's entries.
                    let holder = self.read_holder(&group.key, op).await?;
                    group.completed = Some(holder.map(|h| h.info));
                    next = Some(cursor_from(format!("{root}{}0", group.segment)));
                }
            }
        }
        if groups.len() > limit {
            next = Some(cursor_from(format!("{root}{}/", groups[limit].segment)));
            groups.truncate(limit);
        }

        let ttls = self.remaining_ttls(&groups, kvs, op).await;
        let mut page = LockPage {
            locks: Vec::with_capacity(groups.len()),
            cursor: next,
        };
        for group in groups {
            if let Some(completed) = group.completed {
                page.locks.extend(completed);
                continue;
            }
            let holder = &kvs[group.holder];
            let key_prefix = self.key_prefix(&group.key);
            let ttl = ttls.get(&group.holder).copied().flatten();
            page.locks
                .push(holder_entry(&group.key, &key_prefix, holder, ttl).info);
        }
        Ok(page)
    }

    /// The remaining TTL of each group's holder, by the holder's index:
    /// our own grants' deadlines, and one lease read per other lease
    /// ([`TTL_READS_AT_ONCE`] at a time).
    async fn remaining_ttls(
        &self,
        groups: &[Group],
        kvs: &[KeyValue],
        op: Operation,
    ) -> HashMap<usize, Option<Duration>> {
        let mut out = HashMap::new();
        let mut foreign: HashMap<i64, Vec<usize>> = HashMap::new();
        for group in groups.iter().filter(|g| g.completed.is_none()) {
            let holder = &kvs[group.holder];
            let entry = String::from_utf8_lossy(holder.key());
            let own = self
                .session_by_lease(holder.lease())
                .and_then(|s| s.due(&entry));
            match own {
                Some(due) => {
                    let left = due.saturating_duration_since(tokio::time::Instant::now());
                    out.insert(group.holder, Some(left));
                }
                None => foreign
                    .entry(holder.lease())
                    .or_default()
                    .push(group.holder),
            }
        }
        let leases: Vec<(i64, Vec<usize>)> = foreign.into_iter().collect();
        for chunk in leases.chunks(TTL_READS_AT_ONCE) {
            let mut reads = JoinSet::new();
            for (lease_id, holders) in chunk {
                let backend = self.clone();
                let (lease_id, holders) = (*lease_id, holders.clone());
                reads.spawn(async move { (holders, backend.lease_ttl(lease_id, op).await) });
            }
            while let Some(read) = reads.join_next().await {
                if let Ok((holders, ttl)) = read {
                    for holder in holders {
                        out.insert(holder, ttl);
                    }
                }
            }
        }
        out
    }

    /// See [`lock_core::LockBackend::gc`]: nothing to collect.
    pub(super) fn collect_garbage(&self) -> GcReport {
        GcReport::default()
    }
}

/// The entries of one mutex on a `list` page.
struct Group {
    /// The escaped key.
    segment: String,
    key: LockKey,
    /// Index of the entry with the lowest create revision.
    holder: usize,
    /// Index of its last entry.
    last: usize,
    /// The holder read on its own (a queue longer than the scan).
    completed: Option<Option<LockInfo>>,
}

/// (escaped key, key) of a mutex entry `<root><escaped key>/<leaf>`;
/// `None` for anything else under the root (read-write lock, semaphore
/// and election entries, epoch keys, other names).
fn mutex_entry(root: &str, name: &[u8]) -> Option<(String, LockKey)> {
    let name = std::str::from_utf8(name).ok()?;
    let rest = name.strip_prefix(root)?;
    let (segment, leaf) = rest.split_once('/')?;
    if leaf.is_empty() || leaf.contains('/') {
        return None;
    }
    let key = LockKey::new(unescape_key(segment)?).ok()?;
    Some((segment.to_owned(), key))
}

fn holder_entry(
    key: &LockKey,
    key_prefix: &str,
    holder: &KeyValue,
    remaining_ttl: Option<Duration>,
) -> HolderEntry {
    let name = String::from_utf8_lossy(holder.key()).into_owned();
    let holder_name = name.strip_prefix(key_prefix).unwrap_or(&name).to_owned();
    let token = u64::try_from(holder.create_revision())
        .ok()
        .map(FencingToken::new);
    HolderEntry {
        info: LockInfo {
            key: key.clone(),
            holder: holder_name,
            token,
            remaining_ttl,
            details: value_details(holder.value()),
        },
        entry: name,
        revision: holder.create_revision(),
        lease_id: holder.lease(),
    }
}

fn bad_cursor(text: &str) -> LockError {
    LockError::invalid_argument(
        Operation::Inspect,
        format!("not a list cursor of this etcd backend and prefix: {text:?}"),
    )
    .with_backend(NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_end_after_every_key_of_the_prefix() {
        assert_eq!(prefix_end(b"p/a"), b"p/b".to_vec());
        assert_eq!(prefix_end(b"p\xff"), b"q".to_vec());
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn only_mutex_entries_are_listed() {
        let key = |s: &str| LockKey::new(s).unwrap();
        assert_eq!(
            mutex_entry("p/", b"p/a%2Fb/1a"),
            Some(("a%2Fb".to_owned(), key("a/b")))
        );
        assert_eq!(mutex_entry("", b"a/1a-2"), Some(("a".to_owned(), key("a"))));
        for other in [
            &b"p/a%rw/1a"[..],
            b"p/a%sem/1a",
            b"p/a%elect/1a",
            b"p/a%rw-epoch",
            b"p/a/b/1a",
            b"p/a/",
            b"q/a/1a",
            b"p/\xff/1a",
        ] {
            assert_eq!(mutex_entry("p/", other), None, "{other:?}");
        }
    }
}
