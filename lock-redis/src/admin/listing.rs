//! `list` and `list_shared`: pages of the held locks under a prefix,
//! found by `SCAN` and read by the inspect (or holders) script.

use lock_core::{
    ErrorKind, LeaseKind, ListQuery, LockError, LockPage, LockShape, Operation, SharedLockInfo,
    SharedPage, check_list_limit,
};

use crate::admin::scan::scan_page;
use crate::connection::Servers;
use crate::error::NAME;
use crate::grants::holders::inspect_nodes;
use crate::shared::Shared;

/// The name through which `list_shared` found a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum ShareMark {
    /// `:rw:writer`: listed while a writer holds it.
    Writer,
    /// `:rw:readers`: listed while readers hold it.
    Readers,
    /// `:sem:holders`: listed while permits are held.
    Permits,
}

/// `list`: see the crate docs, *Operating locks*.
pub(crate) async fn list_page(servers: &Servers, query: &ListQuery) -> Result<LockPage, LockError> {
    let (prefix, cursor, limit) = query.parts();
    check_list_limit(limit).map_err(|e| e.with_backend(NAME))?;
    let pattern = servers.keys.lock_pattern(prefix);
    let redlock = servers.redlock;
    let (locks, cursor) = scan_page(
        servers,
        cursor,
        limit,
        &pattern,
        Some(servers.keys.lock_type()),
        |name| servers.keys.lock_key_of(name, prefix).map(|key| (key, ())),
        |key, (), target| async move {
            let (info, present) = match inspect_nodes(servers, &key).await {
                Ok(found) => found,
                // A name this topology refuses (an untagged legacy
                // key in Cluster): not one of our locks.
                Err(e) if e.kind() == ErrorKind::InvalidArgument => return Ok(None),
                Err(e) => return Err(e),
            };
            // Redlock: a lock is on several nodes; it is listed
            // with the first node that has it.
            if redlock && present.iter().position(|p| *p) != Some(target) {
                return Ok(None);
            }
            Ok(info)
        },
    )
    .await?;
    Ok(LockPage { locks, cursor })
}

/// `list_shared` of a read-write lock or a semaphore: see the crate
/// docs, *Operating locks*.
pub(crate) async fn list_shared_page(
    servers: &Servers,
    shared: &Shared,
    shape: LockShape,
    query: &ListQuery,
) -> Result<SharedPage, LockError> {
    let (prefix, cursor, limit) = query.parts();
    shared.check_listing()?;
    check_list_limit(limit).map_err(|e| e.with_backend(NAME))?;
    let base = servers.keys.tagged_pattern(prefix);
    // A held read-write lock has a writer key or a readers set (never
    // both with live holders: a writer is granted only once every
    // reader is gone, and a downgrade deletes the writer key); a held
    // semaphore has its holders set.
    let (pattern, kind, marks): (String, Option<&str>, &[(&str, ShareMark)]) = match shape {
        LockShape::Semaphore => (
            format!("{base}:sem:holders"),
            Some("zset"),
            &[(":sem:holders", ShareMark::Permits)],
        ),
        LockShape::ReadWrite => (
            format!("{base}:rw:*"),
            None,
            &[
                (":rw:writer", ShareMark::Writer),
                (":rw:readers", ShareMark::Readers),
            ],
        ),
        other => {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                Operation::Inspect,
                format!("listing {other} locks"),
            )
            .with_backend(NAME));
        }
    };
    let key_of = |name: &str| {
        marks.iter().find_map(|(suffix, mark)| {
            let key = servers
                .keys
                .lock_key_of(name.strip_suffix(suffix)?, prefix)?;
            Some((key, *mark))
        })
    };
    let (locks, cursor) = scan_page(
        servers,
        cursor,
        limit,
        &pattern,
        kind,
        key_of,
        |key, mark, _| async move {
            let holders = shared.holders(&key, shape).await?;
            // Listed through the name of what holds it now, so a
            // key is not listed once by each name.
            let writes = holders.first().map(|h| h.kind == LeaseKind::Write);
            let listed = match mark {
                ShareMark::Writer => writes == Some(true),
                ShareMark::Readers => writes == Some(false),
                ShareMark::Permits => !holders.is_empty(),
            };
            Ok(listed.then_some(SharedLockInfo { key, holders }))
        },
    )
    .await?;
    Ok(SharedPage { locks, cursor })
}
