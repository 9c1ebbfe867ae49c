//! Listing under a prefix: one bounded range read per page, its entries
//! grouped by the lock (or election) they belong to, for each listed
//! shape: the held mutexes (`list`), the read-write locks and semaphores
//! with all their holders (`list_shared`), the elections with their
//! leaders (`list_elections`). One cursor format and one set of bounds
//! serve all of them.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{GetOptions, KeyValue};
use lock_core::election::{ElectionInfo, ElectionPage};
use lock_core::{
    HolderInfo, ListQuery, LockError, LockKey, LockPage, LockShape, Operation, SharedLockInfo,
    SharedPage, check_list_limit, with_timeout,
};
use tokio::task::JoinSet;

use super::Admin;
use crate::elections::leader_of_entry;
use crate::error::{NAME, from_etcd};
use crate::grants::holder_entry;
use crate::keys::{ELECTION_TAG, RW_TAG, SEM_TAG, escape_key, unescape_key};
use crate::shared::{Share, granted_shares};

/// The most entries one listing call reads (one range request).
pub(crate) const LIST_SCAN_MAX: i64 = 2_000;

/// How many lease reads (remaining TTLs of other processes' holders) a
/// page runs at once.
const TTL_READS_AT_ONCE: usize = 32;

/// What a cursor starts with: the next range read starts at the rest (an
/// entry name without the backend's prefix), inclusive...
const CURSOR_FROM: &str = "etcd:";
/// ...or just after it.
const CURSOR_AFTER: &str = "etcd+:";

/// What a page lists: which entries under the prefix belong to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Listed {
    /// Mutex entries `<escaped key>/<leaf>` (ours and `etcdctl lock`'s).
    Mutex,
    /// Entries `<escaped key>%rw/<leaf>` and the epoch keys
    /// `<escaped key>%rw-epoch`.
    ReadWrite,
    /// Entries `<escaped key>%sem/<leaf>`.
    Semaphore,
    /// Candidates `<escaped name>%elect/<leaf>` (ours, `etcdctl elect`'s).
    Election,
}

/// An entry of a listed group.
struct Member {
    /// The name's segment all of the group's entries share.
    segment: String,
    key: LockKey,
    /// A read-write lock's epoch key (not a grant).
    epoch: bool,
}

impl Listed {
    fn tag(self) -> &'static str {
        match self {
            Self::Mutex => "",
            Self::ReadWrite => RW_TAG,
            Self::Semaphore => SEM_TAG,
            Self::Election => ELECTION_TAG,
        }
    }

    /// What `name` is to this listing: `None` for anything else under the
    /// root (other shapes' entries, epoch keys of a listing other than the
    /// read-write locks', names with more segments).
    fn member(self, root: &str, name: &[u8]) -> Option<Member> {
        let rest = std::str::from_utf8(name).ok()?.strip_prefix(root)?;
        if self == Self::ReadWrite
            && let Some(base) = rest.strip_suffix("-epoch")
            && base.ends_with(RW_TAG)
            && !base.contains('/')
        {
            let key = key_of(base.strip_suffix(RW_TAG)?)?;
            return Some(Member {
                segment: base.to_owned(),
                key,
                epoch: true,
            });
        }
        let (segment, leaf) = rest.split_once('/')?;
        if leaf.is_empty() || leaf.contains('/') {
            return None;
        }
        // An escaped key holds no `%` other than `%25` and `%2F`, so a
        // mutex segment never ends with a tag, and unescaping refuses one.
        let escaped = segment.strip_suffix(self.tag())?;
        Some(Member {
            segment: segment.to_owned(),
            key: key_of(escaped)?,
            epoch: false,
        })
    }
}

fn key_of(escaped: &str) -> Option<LockKey> {
    LockKey::new(unescape_key(escaped)?).ok()
}

/// The entries of one lock (or election) on a page.
struct Group {
    /// The segment its entries share.
    segment: String,
    key: LockKey,
    /// Indexes of its grant entries (not the epoch key), in key order.
    entries: Vec<usize>,
    /// Index of its epoch key, if read.
    epoch: Option<usize>,
    /// Index of its first entry on the page (the epoch key sorts before
    /// the grants: `-` < `/`).
    first: usize,
    /// Index of its last entry.
    last: usize,
    /// Its entries fill the whole scan: the caller reads the lock on its
    /// own, and the page goes on after its entries.
    fills_scan: bool,
}

impl Group {
    /// The entry with the lowest create revision: a mutex's holder, an
    /// election's leader.
    fn oldest<'a>(&self, kvs: &'a [KeyValue]) -> Option<(usize, &'a KeyValue)> {
        self.entries
            .iter()
            .map(|&i| (i, &kvs[i]))
            .min_by_key(|(_, kv)| kv.create_revision())
    }
}

/// One page's range read, grouped.
struct Scan {
    kvs: Vec<KeyValue>,
    /// At most `limit` groups, each with at least one grant entry.
    groups: Vec<Group>,
    cursor: Option<String>,
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

impl Admin {
    /// What every entry name of this backend starts with: the prefix and
    /// the separator (nothing without a prefix).
    fn root(&self) -> String {
        if self.conn.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.conn.prefix)
        }
    }

    /// One page of `listed` under the user's `prefix`: one range read, in
    /// key order, from `<root><escaped prefix>` (or the cursor) to the end
    /// of that prefix, of at most `2 * limit + 8` entries (never more than
    /// [`LIST_SCAN_MAX`]), grouped by lock (a lock's entries are
    /// contiguous: they share `<escaped key><tag>`). When the scan stops
    /// inside the last group, that group is left to the next page (which
    /// starts with it); a group that fills the whole scan is marked
    /// ([`Group::fills_scan`]) and the page goes on after it.
    async fn scan_page(
        &self,
        listed: Listed,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Scan, LockError> {
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
        let mut kv = self.conn.client.kv_client();
        let mut response = with_timeout(self.conn.config.op_timeout, op, async {
            kv.get(
                start_key,
                Some(GetOptions::new().with_range(end).with_limit(scan)),
            )
            .await
            .map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_backend(NAME))?;
        let more = response.more();
        let kvs = response.take_kvs();

        let mut groups: Vec<Group> = Vec::new();
        for (i, kv) in kvs.iter().enumerate() {
            let Some(member) = listed.member(&root, kv.key()) else {
                continue;
            };
            let group = match groups.last_mut() {
                Some(group) if group.segment == member.segment => group,
                _ => {
                    groups.push(Group {
                        segment: member.segment,
                        key: member.key,
                        entries: Vec::new(),
                        epoch: None,
                        first: i,
                        last: i,
                        fills_scan: false,
                    });
                    groups.last_mut().expect("just pushed")
                }
            };
            group.last = i;
            if member.epoch {
                group.epoch = Some(i);
            } else {
                group.entries.push(i);
            }
        }
        let name_at = |i: usize| {
            let name = String::from_utf8_lossy(kvs[i].key());
            name.strip_prefix(root.as_str()).unwrap_or(&name).to_owned()
        };
        let mut next = None;
        if more {
            next = kvs
                .last()
                .map(|_| format!("{CURSOR_AFTER}{}", name_at(kvs.len() - 1)));
            // The last lock's entries may go on past the scan.
            if let Some(last) = groups.last()
                && last.last + 1 == kvs.len()
            {
                if groups.len() > 1 || last.first > 0 {
                    // Left to the next page, which starts with it.
                    let cut = groups.pop().map_or(0, |g| g.first);
                    next = Some(format!("{CURSOR_FROM}{}", name_at(cut)));
                } else if let Some(group) = groups.last_mut() {
                    // One lock's entries fill the whole scan: the caller
                    // reads it on its own; go on after its entries (`0`
                    // follows `/`, and `-` of the epoch key, in byte order).
                    group.fills_scan = true;
                    next = Some(format!("{CURSOR_FROM}{}0", group.segment));
                }
            }
        }
        // An epoch key alone is an idle read-write lock.
        groups.retain(|g| g.fills_scan || !g.entries.is_empty());
        if groups.len() > limit {
            next = Some(format!("{CURSOR_FROM}{}", name_at(groups[limit].first)));
            groups.truncate(limit);
        }
        Ok(Scan {
            kvs,
            groups,
            cursor: next,
        })
    }

    /// See [`lock_core::Listing::list`] and the crate docs: one range
    /// read ([`scan_page`](Self::scan_page)) of the mutex entries, each
    /// key's holder the entry with the lowest create revision, plus one
    /// lease read per other process's lease among the holders (and one
    /// holder read when a single key's queue fills the whole scan).
    pub(super) async fn list_locks(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        let op = Operation::Inspect;
        let (scan, ttls) = self.scan_with_holder_ttls(Listed::Mutex, query).await?;
        let mut page = LockPage {
            locks: Vec::with_capacity(scan.groups.len()),
            cursor: scan.cursor,
        };
        for group in &scan.groups {
            if group.fills_scan {
                page.locks.extend(
                    self.grants
                        .read_holder(&group.key, op)
                        .await?
                        .map(|h| h.info),
                );
                continue;
            }
            let Some((i, holder)) = group.oldest(&scan.kvs) else {
                continue;
            };
            let ttl = ttls.get(&i).copied().flatten();
            let key_prefix = self.conn.key_prefix(&group.key);
            page.locks
                .push(holder_entry(&group.key, &key_prefix, holder, ttl).info);
        }
        Ok(page)
    }

    /// See [`lock_core::Listing::list_shared`] and the crate docs: one
    /// range read ([`scan_page`](Self::scan_page)) of the read-write lock
    /// (with their epoch keys) or semaphore entries, each key with every
    /// holder as `holders` reports them, plus one lease read per other
    /// process's lease among the holders (and one `holders` read when a
    /// single key's entries fill the whole scan).
    pub(super) async fn list_shared_locks(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        let (prefix, cursor, limit) = query.parts();
        let op = Operation::Inspect;
        let listed = match shape {
            LockShape::ReadWrite => Listed::ReadWrite,
            LockShape::Semaphore => Listed::Semaphore,
            _ => {
                return lock_core::list_mutex_shared(
                    self,
                    &ListQuery::new(prefix, limit).after(cursor),
                )
                .await;
            }
        };
        let scan = self.scan_page(listed, prefix, cursor, limit).await?;
        // Per group: its holders (its entries oldest first, those whose
        // turn has come), by index in the scan, their TTLs read below.
        let mut granted: Vec<Vec<(usize, HolderInfo)>> = Vec::new();
        for group in &scan.groups {
            let mut entries: Vec<usize> = group.entries.clone();
            entries.sort_by_key(|&i| scan.kvs[i].create_revision());
            let shares: Vec<Share> = entries.iter().map(|&i| Share::of(&scan.kvs[i])).collect();
            let epoch = group.epoch.map_or(0, |i| scan.kvs[i].mod_revision());
            let held = granted_shares(shape, &shares, epoch)
                .into_iter()
                .map(|(n, kind, token)| (entries[n], shares[n].holder_info(kind, token, None)))
                .collect();
            granted.push(held);
        }
        let holders: Vec<usize> = scan
            .groups
            .iter()
            .zip(&granted)
            .filter(|(g, _)| !g.fills_scan)
            .flat_map(|(_, held)| held.iter().map(|(i, _)| *i))
            .collect();
        let ttls = self.remaining_ttls(&holders, &scan.kvs, op).await;
        let mut page = SharedPage {
            locks: Vec::with_capacity(scan.groups.len()),
            cursor: scan.cursor,
        };
        for (group, held) in scan.groups.iter().zip(granted) {
            let holders: Vec<HolderInfo> = if group.fills_scan {
                self.shared.shared_holders(&group.key, shape).await?
            } else {
                held.into_iter()
                    .map(|(i, mut info)| {
                        info.remaining_ttl = ttls.get(&i).copied().flatten();
                        info
                    })
                    .collect()
            };
            if !holders.is_empty() {
                page.locks.push(SharedLockInfo {
                    key: group.key.clone(),
                    holders,
                });
            }
        }
        Ok(page)
    }

    /// See [`lock_core::Listing::list_elections`] and the crate docs:
    /// one range read ([`scan_page`](Self::scan_page)) of the election
    /// candidates (`<escaped name>%elect/<leaf>`, ours and `etcdctl
    /// elect`'s), each election's leader the candidate with the lowest
    /// create revision, as `leader` reports it, plus one lease read per
    /// other process's lease among the leaders (and one `leader` read when
    /// a single election's candidates fill the whole scan).
    pub(super) async fn list_led_elections(
        &self,
        query: &ListQuery,
    ) -> Result<ElectionPage, LockError> {
        let (scan, ttls) = self.scan_with_holder_ttls(Listed::Election, query).await?;
        let mut page = ElectionPage {
            elections: Vec::with_capacity(scan.groups.len()),
            cursor: scan.cursor,
        };
        for group in &scan.groups {
            let leader = if group.fills_scan {
                self.elections.election_leader(&group.key).await?
            } else {
                group.oldest(&scan.kvs).map(|(i, kv)| {
                    let ttl = ttls.get(&i).copied().flatten();
                    leader_of_entry(kv, ttl)
                })
            };
            if let Some(leader) = leader {
                page.elections.push(ElectionInfo {
                    election: group.key.clone(),
                    leader,
                });
            }
        }
        Ok(page)
    }

    /// The remaining TTL of each listed holder, by its index in `kvs`: our
    /// own grants' deadlines, and one lease read per other lease
    /// ([`TTL_READS_AT_ONCE`] at a time).
    /// One page of `listed` entries ([`scan_page`](Self::scan_page)) and
    /// the remaining TTLs of each group's holder (its oldest entry), for
    /// the groups that do not fill the whole scan.
    async fn scan_with_holder_ttls(
        &self,
        listed: Listed,
        query: &ListQuery,
    ) -> Result<(Scan, HashMap<usize, Option<Duration>>), LockError> {
        let (prefix, cursor, limit) = query.parts();
        let scan = self.scan_page(listed, prefix, cursor, limit).await?;
        let holders: Vec<usize> = scan
            .groups
            .iter()
            .filter(|g| !g.fills_scan)
            .filter_map(|g| g.oldest(&scan.kvs).map(|(i, _)| i))
            .collect();
        let ttls = self
            .remaining_ttls(&holders, &scan.kvs, Operation::Inspect)
            .await;
        Ok((scan, ttls))
    }

    async fn remaining_ttls(
        &self,
        holders: &[usize],
        kvs: &[KeyValue],
        op: Operation,
    ) -> HashMap<usize, Option<Duration>> {
        let mut out = HashMap::new();
        let mut foreign: HashMap<i64, Vec<usize>> = HashMap::new();
        for &i in holders {
            let holder = &kvs[i];
            let entry = String::from_utf8_lossy(holder.key());
            let own = self
                .conn
                .session_by_lease(holder.lease())
                .and_then(|s| s.due(&entry));
            match own {
                Some(due) => {
                    let left = due.saturating_duration_since(tokio::time::Instant::now());
                    out.insert(i, Some(left));
                }
                None => foreign.entry(holder.lease()).or_default().push(i),
            }
        }
        let leases: Vec<(i64, Vec<usize>)> = foreign.into_iter().collect();
        for chunk in leases.chunks(TTL_READS_AT_ONCE) {
            let mut reads = JoinSet::new();
            for (lease_id, holders) in chunk {
                let conn = self.conn.clone();
                let (lease_id, holders) = (*lease_id, holders.clone());
                reads.spawn(async move { (holders, conn.lease_ttl(lease_id, op).await) });
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

    fn member(listed: Listed, root: &str, name: &[u8]) -> Option<(String, String, bool)> {
        listed
            .member(root, name)
            .map(|m| (m.segment, m.key.as_str().to_owned(), m.epoch))
    }

    #[test]
    fn only_mutex_entries_are_listed_as_mutexes() {
        let it = |segment: &str, key: &str| Some((segment.to_owned(), key.to_owned(), false));
        assert_eq!(
            member(Listed::Mutex, "p/", b"p/a%2Fb/1a"),
            it("a%2Fb", "a/b")
        );
        assert_eq!(member(Listed::Mutex, "", b"a/1a-2"), it("a", "a"));
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
            assert_eq!(member(Listed::Mutex, "p/", other), None, "{other:?}");
        }
    }

    #[test]
    fn each_shape_lists_its_own_entries() {
        for (listed, prefix, key, expected) in [
            (
                Listed::ReadWrite,
                "p/",
                &b"p/a%2Fb%rw/1a"[..],
                ("a%2Fb%rw", "a/b", false),
            ),
            (
                Listed::ReadWrite,
                "p/",
                b"p/a%rw-epoch",
                ("a%rw", "a", true),
            ),
            (
                Listed::Semaphore,
                "p/",
                b"p/a%sem/1a-2",
                ("a%sem", "a", false),
            ),
            (
                Listed::Election,
                "",
                b"a%25rw%elect/1a",
                ("a%25rw%elect", "a%rw", false),
            ),
        ] {
            let (segment, name, epoch) = expected;
            assert_eq!(
                member(listed, prefix, key),
                Some((segment.to_owned(), name.to_owned(), epoch)),
                "{key:?}"
            );
        }
        for (listed, other) in [
            (Listed::ReadWrite, &b"p/a/1a"[..]),
            (Listed::ReadWrite, b"p/a%sem/1a"),
            (Listed::ReadWrite, b"p/a%25rw/1a"),
            (Listed::ReadWrite, b"p/a%rw/"),
            (Listed::ReadWrite, b"p/a%rw/x/y"),
            (Listed::ReadWrite, b"p/x/a%rw-epoch"),
            (Listed::Semaphore, b"p/a%rw/1a"),
            (Listed::Semaphore, b"p/a%rw-epoch"),
            (Listed::Semaphore, b"p/a%elect/1a"),
            (Listed::Election, b"p/a/1a"),
            (Listed::Election, b"p/a%sem/1a"),
            (Listed::Election, b"p/a%rw%elect/1a"),
        ] {
            assert_eq!(member(listed, "p/", other), None, "{listed:?} {other:?}");
        }
    }
}
