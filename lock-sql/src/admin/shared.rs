//! [`list_shared`](lock_core::Listing::list_shared) in row mode: one
//! statement per page on the holders table.
//!
//! The statement picks the first `limit` keys of the shape under the
//! prefix after the cursor that have a live holder (in key order, the
//! order and cursor of the mutex [`list`](lock_core::Listing::list))
//! and returns every live holder of those keys, with the details their
//! grants wrote. A page holds at most `limit` keys; when it is full, its
//! cursor is its last key (the next page may then be empty). The page is
//! one statement, so each key's holders are as of one instant; keys of
//! different pages are read at different instants.

use lock_core::{ListQuery, LockError, LockKey, LockShape, Operation, SharedLockInfo, SharedPage};

use super::{Administration, encode_cursor, like_prefix, list_start};
use crate::config::NAME;
use crate::connection::{ConnSet, retry_once};
use crate::dialect::binds::{Bind, fetch};
use crate::error::timed;
use crate::shared::holders::holder_info;

impl Administration {
    /// `list_shared`: the mutex from `list`, read-write locks and
    /// semaphores from the holders table.
    pub(crate) async fn list_shares(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        let (prefix, cursor, limit) = query.parts();
        if shape == LockShape::Mutex {
            return lock_core::list_mutex_shared(
                self,
                &ListQuery::new(prefix, limit).after(cursor),
            )
            .await;
        }
        let after = list_start(cursor, limit)?;
        let inner = &self.inner;
        let sql = &inner.shared;
        let pattern = if sql.page_like {
            like_prefix(prefix)
        } else {
            prefix.to_owned()
        };
        let page = i64::try_from(limit).unwrap_or(i64::MAX);
        let binds = [
            Bind::Text(shape.as_str()),
            Bind::Text(&pattern),
            Bind::Text(&after),
            Bind::Int(page),
            Bind::Text(shape.as_str()),
        ];
        let rows = timed(&inner.config, Operation::Inspect, None, async {
            retry_once!(read, &inner.conns, |conn| fetch(
                conn,
                &sql.list_page,
                &binds,
                "tttiit"
            ))
        })
        .await?;
        let mut locks: Vec<SharedLockInfo> = Vec::new();
        let (mut scanned, mut last) = (0, None);
        for row in &rows {
            let name = row[0].text();
            if last != Some(name) {
                scanned += 1;
                last = Some(name);
                // A name no key can have (written by hand) is skipped.
                if let Ok(key) = LockKey::new(name) {
                    locks.push(SharedLockInfo {
                        key,
                        holders: Vec::new(),
                    });
                }
            }
            if let Some(lock) = locks.last_mut().filter(|l| l.key.as_str() == name) {
                let holder = holder_info(&row[1..]).map_err(|e| e.with_backend(NAME))?;
                lock.holders.push(holder);
            }
        }
        // Full: more keys may follow the last one scanned.
        let cursor = last.filter(|_| scanned >= limit).map(encode_cursor);
        Ok(SharedPage { locks, cursor })
    }
}
