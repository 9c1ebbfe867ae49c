//! Holder details and `list` in session mode.
//!
//! # MariaDB 10.3 and later: the holder table
//!
//! The grant writes the key's row of `<table>_session_holders`, a `MEMORY`
//! table (see `dialect::mysql`, "Session tokens on MariaDB"), with the
//! same columns as MySQL's token row below but no `details_token` (every
//! grant writes its details). `inspect`, `list` and `force_release` read
//! it as below, without a locking read: a `MEMORY` table is locked for a
//! whole statement, so a try's `GET_LOCK` and its row are seen together. A
//! waiting grant takes its lock in a statement of its own and publishes
//! after it, having deleted its session's own row of the key first: in
//! between, the key shows as held by `server session <id>`, without owner
//! or token, and `force_release` leaves it alone. A release leaves the row
//! (a row names its lock's holder only while `IS_USED_LOCK(lock_name) =
//! conn`); when the table is full, the grant deletes the rows of free
//! locks and tries again. The rows hold no token state (the sequence
//! does), so deleting them is always safe.
//!
//! # MySQL: the token row
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
//! PostgreSQL's and MariaDB's sequences are not per key, MySQL's token
//! rows all stay, and MariaDB's holder rows (no token state) are collected
//! by a grant that finds their table full.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::election::ElectionPage;
use lock_core::{
    Admin, ErrorKind, GcReport, ListQuery, Listing, LockError, LockInfo, LockKey, LockPage,
    LockShape, Operation, SharedPage,
};
use tokio::time::{Instant, timeout};

use crate::admin::{encode_cursor, like_prefix, list_mutex_only, list_start};
use crate::config::SqlDialect;
use crate::connection::session::{ConnUse, Sessions};
use crate::dialect::binds::{Bind, fetch};
use crate::dialect::session::{KillTarget, Killed, ListPage, SessionLock};
use crate::grants::session::holder_info;

/// Session mode's operating calls: the [`Admin`] facet, and the [`Listing`]
/// facet on MySQL/MariaDB.
pub(crate) struct SessionAdmin {
    inner: Arc<Sessions>,
}

#[async_trait]
impl Admin for SessionAdmin {
    /// Breaks the lock by ending the holder's server session
    /// (`pg_terminate_backend` / `KILL CONNECTION`): see the crate docs,
    /// "Operating locks". Returns the holder as [`inspect`](lock_core::LockBackendExt::inspect)
    /// reported it just before, or `None` when the key was free.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] when the holder is not a session-mode
    /// grant of this crate (another client's session, or on PostgreSQL a
    /// session that holds other advisory locks too): it is left alone;
    /// [`ErrorKind::Contended`] when the holder changed three times while
    /// it was read; [`ErrorKind::Timeout`] / [`ErrorKind::Unavailable`]
    /// as the other calls; [`ErrorKind::Backend`] without the privilege to
    /// end another session (PostgreSQL: the holder's role, a superuser or
    /// `pg_signal_backend`; MySQL/MariaDB: the same user, else
    /// `CONNECTION_ADMIN` / `CONNECTION ADMIN` or `SUPER`).
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes its session; the holder's session
    /// may or may not have been ended by then.
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.break_lock(key)
            .await
            .map_err(|e| e.with_key(key).with_backend(self.inner.name))
    }

    /// Collects nothing, by design: a session lock leaves nothing behind
    /// on the server, and the token counters (PostgreSQL's one sequence
    /// for every key, MySQL/MariaDB's row per key) are each key's only
    /// record of its last token, so none may be deleted (see this module's
    /// module docs, "No `gc`"). Answers an empty report: nothing removed,
    /// nothing to run again for.
    ///
    /// # Errors
    ///
    /// None.
    ///
    /// # Cancel safety
    ///
    /// Safe: nothing is sent.
    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError> {
        let _ = older_than;
        tracing::debug!(
            backend = self.inner.name,
            "gc in session mode: nothing to collect (the token counters are each key's only \
             record of its last token)"
        );
        Ok(GcReport::default())
    }
}

#[async_trait]
impl Listing for SessionAdmin {
    /// MySQL/MariaDB: one statement per page over the token rows, each
    /// listed while the connection of its last grant holds its lock (see
    /// the module docs, "Holder details and listing").
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] on PostgreSQL; `InvalidArgument` for a
    /// bad page size or cursor; `Timeout` / `Unavailable` / `Backend` as
    /// `inspect`.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only (a dropped call closes its connection).
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        self.list_tokens(query)
            .await
            .map_err(|e| e.with_backend(self.inner.name))
    }

    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        list_mutex_only(self, self.inner.name, shape, query).await
    }

    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        lock_core::election::list_mutex_elections(self, query).await
    }
}

/// The Timeout error of an admin call (`what`) whose statement did not
/// answer within the operation timeout.
fn admin_timeout(what: &str) -> LockError {
    LockError::new(
        ErrorKind::Timeout,
        Operation::Inspect,
        format!("{what} did not answer within the operation timeout"),
    )
}

impl SessionAdmin {
    pub(crate) fn new(inner: Arc<Sessions>) -> Self {
        Self { inner }
    }

    /// `list`: one page of token rows (MySQL/MariaDB), or `Unsupported`.
    async fn list_tokens(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        let (prefix, cursor, limit) = query.parts();
        let after = list_start(cursor, limit)?;
        let op_timeout = self.inner.config.op_timeout;
        let timed_out = || admin_timeout("list");
        // MariaDB: every lock granted before this call has its row
        // (PostgreSQL lists nothing: no wait).
        if let Some(lag) = self.inner.publication_lag()
            && self.inner.sql.maria.is_some()
        {
            tokio::time::sleep(lag).await;
        }
        let mut used = self.inner.any(Instant::now() + op_timeout).await?;
        let pattern = like_prefix(prefix);
        let page = ListPage {
            prefix: &pattern,
            after: &after,
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
        };
        let session = used.session().ok_or_else(closed)?;
        let (dialect, on) = session.on(&self.inner.sql);
        let rows = timeout(op_timeout, dialect.session_list(on, page)).await;
        let rows = session
            .settled(rows)
            .map_err(|_| timed_out())?
            .map_err(|e| map_err(self, e))?;
        drop(used);
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

    /// `force_release`: reads the holder as `inspect` does, then ends its
    /// server session only if it still holds the lock as that grant (and,
    /// on PostgreSQL, holds no other advisory lock), and waits (up to the
    /// operation timeout) for the server to free it. A holder that changed
    /// in between is read again (three times at most).
    async fn break_lock(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let op_timeout = self.inner.config.op_timeout;
        let server_key = self.inner.server_key(key);
        let lock = SessionLock {
            key: key.as_str().as_bytes(),
            server_key: &server_key,
        };
        let sql = &self.inner.sql;
        let timed_out = || admin_timeout("force_release");
        // MariaDB: the holder's other locks granted before this call have
        // their rows (twice the lag: the count of them is what spares a
        // session holding more than this lock). PostgreSQL: a quiet grant
        // made before this call is published (the lag once: the kill
        // statement counts the session's locks itself).
        if let Some(lag) = self.inner.publication_lag() {
            let factor = if self.inner.sql.maria.is_some() { 2 } else { 1 };
            tokio::time::sleep(lag * factor).await;
        }
        let mut used = self.inner.any(Instant::now() + op_timeout).await?;
        for _ in 0..3 {
            let session = used.session().ok_or_else(closed)?;
            let (dialect, on) = session.on(sql);
            let found = timeout(op_timeout, dialect.session_inspect(on, lock)).await;
            let found = session
                .settled(found)
                .map_err(|_| timed_out())?
                .map_err(|e| self.inner.err(Operation::Inspect, key, e))?;
            let Some(holder) = found else {
                return Ok(None);
            };
            let victim = holder.session;
            let (Some(owner), Some(token)) = (holder.owner.clone(), holder.token) else {
                return Err(LockError::new(
                    ErrorKind::Unsupported,
                    Operation::Inspect,
                    format!(
                        "{key} is held by server session {victim}, which is not a distlock \
                         session-mode grant alone on its session (another client's, or one of \
                         several locks of one session): ending it could break other locks \
                         and transactions, so it is left alone (end it yourself if you must)"
                    ),
                ));
            };
            // MySQL/MariaDB: the session's other locks, from their token
            // rows (PostgreSQL counts them in the kill statement).
            if let Some(others) = self.others_of(&mut used, key, victim).await?
                && others > 0
            {
                return Err(holds_others(key, victim, others));
            }
            let session = used.session().ok_or_else(closed)?;
            let (dialect, on) = session.on(sql);
            let ended = timeout(
                op_timeout.saturating_mul(2),
                dialect.kill_holder(
                    on,
                    KillTarget {
                        lock,
                        victim,
                        owner: &owner,
                        token,
                        wait: op_timeout,
                    },
                ),
            )
            .await;
            let ended = session
                .settled(ended)
                .map_err(|_| timed_out())?
                .map_err(|e| self.inner.err(Operation::Inspect, key, e))?;
            match ended {
                Killed::Ended => return Ok(Some(holder_info(key.clone(), holder))),
                Killed::HoldsOthers(others) => return Err(holds_others(key, victim, others)),
                Killed::Changed => {}
            }
        }
        Err(LockError::new(
            ErrorKind::Contended,
            Operation::Inspect,
            "the holder changed three times while force_release read it",
        ))
    }

    /// MySQL/MariaDB: how many other keys' locks session `victim` holds,
    /// by their holder (token) rows (each names its `GET_LOCK` name and the session
    /// of its last grant); `None` on PostgreSQL.
    async fn others_of(
        &self,
        used: &mut ConnUse,
        key: &LockKey,
        victim: i64,
    ) -> Result<Option<i64>, LockError> {
        if self.inner.config.dialect != SqlDialect::MySql {
            return Ok(None);
        }
        let statement = format!(
            "SELECT COUNT(*) FROM {} WHERE conn = ? AND name <> ? AND lock_name IS NOT NULL \
             AND IS_USED_LOCK(lock_name) = ?",
            self.inner.sql.holders
        );
        let session = used.session().ok_or_else(closed)?;
        let statement: std::sync::Arc<str> = statement.into();
        let binds = [
            Bind::Int(victim),
            Bind::Bytes(key.as_str().as_bytes()),
            Bind::Int(victim),
        ];
        let counted = fetch(session.conn_for_statement(), &statement, &binds, "i");
        let rows = timeout(self.inner.config.op_timeout, counted).await;
        let rows = session
            .settled(rows)
            .map_err(|_| admin_timeout("force_release"))?
            .map_err(|e| self.inner.err(Operation::Inspect, key, e))?;
        Ok(Some(rows.first().map_or(0, |row| row[0].int())))
    }

    fn unsupported_admin(&self, what: &str) -> LockError {
        LockError::new(
            ErrorKind::Unsupported,
            Operation::Inspect,
            format!("{} does not support {what}", self.inner.name),
        )
        .with_backend(self.inner.name)
    }
}

/// `force_release` refused: ending `victim` would break `others` more locks.
fn holds_others(key: &LockKey, victim: i64, others: i64) -> LockError {
    LockError::new(
        ErrorKind::Unsupported,
        Operation::Inspect,
        format!(
            "{key} is held by server session {victim}, which also holds {others} other lock(s) \
             (a session-mode backend holds many locks per session): ending it would break \
             those too, so it is left alone"
        ),
    )
}

fn closed() -> LockError {
    LockError::new(
        ErrorKind::Unavailable,
        Operation::Inspect,
        "the session closed",
    )
}

fn map_err(backend: &SessionAdmin, err: sqlx::Error) -> LockError {
    crate::error::map_sqlx(&backend.inner.config, Operation::Inspect, err)
}
