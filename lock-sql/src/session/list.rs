//! Holder details and `list` in session mode.
//!
//! # MySQL/MariaDB: the token row
//!
//! The grant statement (`INSERT .. SELECT .. WHERE GET_LOCK(..) = 1 ON
//! DUPLICATE KEY UPDATE`) already writes the key's row of
//! `<table>_session_tokens` (`name` = the key's bytes, `token`, `owner`,
//! `conn` = `CONNECTION_ID()`); it also writes, with more binds and no
//! extra round trip:
//!
//! - `lock_name`: the key's `GET_LOCK` name (`table:key`, or `#` and the
//!   hash for a long or mixed-case key: the server cannot compute it, so
//!   the row carries it);
//! - `details`: [`HolderDetails::encode_current`](lock_core::HolderDetails::encode_current);
//! - `details_token`: the token it was written with (assigned after the
//!   token in the same statement). A client that does not write details
//!   (an older version) bumps the token and leaves them: they are then
//!   stale, and shown by nobody.
//!
//! A table created before these columns gets them at connect when
//! `create_table` is on (each probed with `SELECT col .. WHERE 1 = 0`,
//! `ALTER TABLE .. ADD COLUMN` only when missing; a concurrent connect's
//! "duplicate column" is success). With `create_table=false` add them
//! yourself (`lock_name VARCHAR(64) NULL, details VARCHAR(1216) NULL,
//! details_token BIGINT NULL`).
//!
//! `inspect` already joins the token row to `IS_USED_LOCK(name)`: the
//! row's owner, token and details are the holder's only when the
//! connection holding the lock made the row's last grant (`conn`);
//! otherwise the holder is reported as `server session <id>`, with
//! neither token nor details. A row is not cleared at release: it is
//! each key's token counter.
//!
//! `list(prefix, cursor, limit)` is one statement per page: at most
//! `limit` token rows with `name LIKE prefix% ESCAPE '!' AND name > cursor
//! ORDER BY name LIMIT limit` (a derived table), and for each
//! `IS_USED_LOCK(lock_name)`; a row is listed when that is its `conn`
//! (held as its last grant), as `inspect` reports it: holder, token,
//! details, `remaining_ttl: None` (the lease is the session's). A page
//! may be short while the scan goes on; a full page's cursor is its last
//! row (`sql1:<hex>`, the row mode's format and checks). A row last
//! granted before the `lock_name` column existed is not listed until its
//! key's next grant. Keys and locks are read in one statement but not
//! atomically with the server's lock table: a grant or release racing
//! the page may or may not be in it.
//!
//! # PostgreSQL: none
//!
//! The grant is `pg_try_advisory_lock` with `nextval` of one global
//! sequence: there is no per-key row to carry details or to list, the
//! server names the lock only by a 64-bit hash (`pg_locks`
//! `classid`/`objid`), and `application_name` (63 bytes, already `distlock
//! <owner> <token>` for `force_release`) has no room for them. Adding a
//! table write to the grant would cost the statement its one-round-trip
//! simplicity and every grant a row lock: `holder_details` is false and
//! `list` is `Unsupported`.
//!
//! # No `gc`
//!
//! Collecting token rows would need a token floor that a row created again
//! starts above, read by the grant statement itself. MySQL/MariaDB do not
//! document when a subquery of `INSERT .. SELECT .. WHERE GET_LOCK(?, ?)`
//! is evaluated relative to `GET_LOCK`'s wait: a floor read before the
//! wait could be older than a collection made meanwhile (a token going
//! backwards), and its shared row lock (`INSERT .. SELECT` reads are
//! locking reads) held during the wait would deadlock, across InnoDB and
//! the user-lock manager, with a `gc` that holds the name and raises the
//! floor. So `gc` collects nothing (an empty report) on either database:
//! PostgreSQL's one sequence is not per key, and MySQL/MariaDB's token
//! rows all stay.

use lock_core::{
    ErrorKind, FencingToken, HolderDetails, ListQuery, LockError, LockInfo, LockKey, LockPage,
    Operation,
};
use tokio::time::{Instant, timeout};

use super::SqlSessionBackend;
use crate::admin::{encode_cursor, like_prefix, list_start};
use crate::dialect::SessionHolder;

/// A session holder as `inspect` reports it.
pub(super) fn holder_info(key: LockKey, holder: SessionHolder) -> LockInfo {
    LockInfo {
        details: holder.details.as_deref().and_then(HolderDetails::decode),
        key,
        holder: holder
            .owner
            .unwrap_or_else(|| format!("server session {}", holder.session)),
        token: holder.token.map(FencingToken::new),
        // The server frees it when the session ends, not at a time.
        remaining_ttl: None,
    }
}

impl SqlSessionBackend {
    /// `list`: one page of token rows (MySQL/MariaDB), or `Unsupported`.
    pub(super) async fn list_tokens(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        let (prefix, cursor, limit) = query.parts();
        let after = list_start(cursor, limit)?;
        let op_timeout = self.inner.config.op_timeout;
        let timed_out = || {
            LockError::new(
                ErrorKind::Timeout,
                Operation::Inspect,
                "list did not answer within the operation timeout",
            )
        };
        let mut pinned = self.checkout(Instant::now() + op_timeout).await?;
        let page = i64::try_from(limit).unwrap_or(i64::MAX);
        let pattern = like_prefix(prefix);
        let dialect = self.inner.opts.dialect;
        let rows = timeout(
            op_timeout,
            dialect.session_list(
                &mut pinned.session.conn,
                &self.inner.sql,
                &pattern,
                &after,
                page,
            ),
        )
        .await
        .map_err(|_| timed_out())?
        .map_err(|e| map_err(self, e))?;
        self.checkin(pinned);
        let Some(rows) = rows else {
            return Err(self.unsupported_admin(
                "listing session locks: a PostgreSQL advisory lock is known to the server only \
                 by a 64-bit hash of the key (pg_locks classid/objid), and the grant writes no \
                 per-key row to list (the token comes from one global sequence)",
            ));
        };
        let cursor = (rows.len() == limit)
            .then(|| rows.last())
            .flatten()
            .map(|(name, _)| encode_cursor(&String::from_utf8_lossy(name)));
        let locks = rows
            .into_iter()
            .filter_map(|(name, holder)| {
                // A name no key can have (written by hand) is skipped.
                let key = LockKey::new(String::from_utf8(name).ok()?).ok()?;
                Some(holder_info(key, holder?))
            })
            .collect();
        Ok(LockPage { locks, cursor })
    }
}

fn map_err(backend: &SqlSessionBackend, err: sqlx::Error) -> LockError {
    crate::error::map_sqlx(&backend.inner.config, Operation::Inspect, err)
}
