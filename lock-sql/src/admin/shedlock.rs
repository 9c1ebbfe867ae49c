//! Operating the ShedLock layout (issue 18): holder details in the tokens
//! table, `list` of ShedLock's table, `force_release`. No `gc`: the rows
//! are ShedLock's (it keeps them, freed, for ever) and never deleted here.
//!
//! - `details` (`<table>_tokens.details`) holds `<locked_by> <encoded
//!   details>`, written by our grant in the statement (or, on SQLite and
//!   MySQL/MariaDB, the transaction or UPDATE) that bumps the token. It is
//!   shown only while ShedLock's row is unexpired and its `locked_by` is
//!   that grant's, so a ShedLock grant that follows ours never shows our
//!   details; ShedLock's table is never altered.
//! - `list`: one statement scanning at most `limit` rows of ShedLock's
//!   table after the cursor in name order (`LIKE` prefix, wildcards
//!   escaped, re-checked byte for byte: ShedLock's `name` may have a
//!   case-insensitive collation); rows with `lock_until > now` are held,
//!   ShedLock's holders included (their token is `None`).
//! - `force_release`: one transaction reads the holder (row locked) and
//!   sets `lock_until = now`, whoever holds it (a ShedLock holder too: its
//!   unlock then matches nothing, as after its `lockAtMostFor`). The token
//!   counter is kept: our next grant's token is above the broken one.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::election::ElectionPage;
use lock_core::{
    Admin, FencingToken, GcReport, ListQuery, Listing, LockError, LockInfo, LockKey, LockPage,
    LockShape, SharedPage,
};

use crate::admin::{
    ReadAndClear, like_prefix, list_mutex_only, list_page, list_start, read_and_clear,
};
use crate::config::SqlDialect;
use crate::connection::shedlock::ShedTable;
use crate::dialect::binds::{Bind, Value};
use crate::keys::shedlock::{MS_PAD, details_of, is_ours};

/// The per-database spelling of the admin statements.
struct Spelling {
    now: &'static str,
    left: &'static str,
    params: [&'static str; 3],
    lock: &'static str,
    begin: &'static str,
}

fn spelling(dialect: SqlDialect) -> Spelling {
    match dialect {
        SqlDialect::Postgres => Spelling {
            now: "timezone('utc', CURRENT_TIMESTAMP)",
            left: "CAST(EXTRACT(EPOCH FROM (s.lock_until - timezone('utc', CURRENT_TIMESTAMP))) \
                   * 1000000 AS BIGINT)",
            params: ["$1", "$2", "$3"],
            lock: " FOR UPDATE OF s",
            begin: "BEGIN",
        },
        SqlDialect::MySql => Spelling {
            now: "UTC_TIMESTAMP(3)",
            left: "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), s.lock_until)",
            params: ["?", "?", "?"],
            lock: " FOR UPDATE",
            begin: "BEGIN",
        },
        SqlDialect::Sqlite => Spelling {
            now: "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)",
            left: "((s.lock_until - CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) \
                   AS INTEGER)) * 1000)",
            params: ["?1", "?2", "?3"],
            lock: "",
            begin: "BEGIN IMMEDIATE",
        },
    }
}

/// A holder row `(locked_by, token, µs left, details)` as [`LockInfo`].
/// `pad` is what the grant added to the TTL on the database side (the
/// millisecond columns' [`MS_PAD`]): not time the holder can count on.
fn info(key: LockKey, row: &[Value], pad: Duration) -> LockInfo {
    let by = row[0].text().to_owned();
    LockInfo {
        key,
        token: match row[1] {
            Value::Int(Some(t)) if is_ours(&by) => u64::try_from(t).ok().map(FencingToken::new),
            _ => None,
        },
        remaining_ttl: Some(
            Duration::from_micros(u64::try_from(row[2].int()).unwrap_or(0)).saturating_sub(pad),
        ),
        details: match &row[3] {
            Value::Text(text) => details_of(&by, text.as_deref()),
            Value::Int(_) => None,
        },
        holder: by,
    }
}

fn pad_of(dialect: SqlDialect) -> Duration {
    match dialect {
        SqlDialect::Postgres => Duration::ZERO,
        SqlDialect::MySql | SqlDialect::Sqlite => MS_PAD,
    }
}

/// The ShedLock layout's operating calls: the [`Admin`] and [`Listing`]
/// facets.
pub(crate) struct ShedAdmin {
    inner: Arc<ShedTable>,
    /// The backend's name, for `Unsupported` answers.
    name: &'static str,
}

#[async_trait]
impl Admin for ShedAdmin {
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.force_release_row(key).await
    }

    /// Collects nothing, by design: ShedLock's rows are ShedLock's (it
    /// keeps freed rows for ever), and our tokens rows are the only record
    /// of each name's last fencing token (ShedLock's grants could not
    /// start above a floor of ours), so no row is ever deletable. Answers
    /// an empty report: nothing removed, nothing to run again for.
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
            "gc on the ShedLock layout: nothing to collect (ShedLock's rows are ShedLock's, \
             the tokens rows are each name's only record of its last token)"
        );
        Ok(GcReport::default())
    }
}

#[async_trait]
impl Listing for ShedAdmin {
    /// [`Listing::list`](lock_core::Listing::list) on ShedLock's
    /// table (see the module docs).
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        let (prefix, cursor, limit) = query.parts();
        let after = list_start(cursor, limit)?;
        let inner = &self.inner;
        let sp = spelling(inner.config.dialect);
        let [p1, p2, p3] = sp.params;
        let sql: Arc<str> = Arc::from(format!(
            "SELECT s.name, s.locked_by, k.token, \
             CASE WHEN s.lock_until > {now} THEN {left} ELSE -1 END, k.details \
             FROM {t} s LEFT JOIN {k} k ON k.name = s.name \
             WHERE s.name LIKE {p1} ESCAPE '!' AND s.name > {p2} ORDER BY s.name LIMIT {p3}",
            now = sp.now,
            left = sp.left,
            t = inner.sql.quoted_table,
            k = inner.sql.quoted_tokens,
        ));
        let pattern = like_prefix(prefix);
        let page = i64::try_from(limit).unwrap_or(1);
        let binds = [Bind::Text(&pattern), Bind::Text(&after), Bind::Int(page)];
        let (rows, cursor) =
            list_page(&inner.conns, &inner.config, &sql, &binds, "ttiit", limit).await?;
        let pad = pad_of(inner.config.dialect);
        let locks = rows
            .iter()
            .filter(|r| r[3].int() >= 0 && r[0].text().starts_with(prefix))
            .filter_map(|r| Some(info(LockKey::new(r[0].text()).ok()?, &r[1..], pad)))
            .collect();
        Ok(LockPage { locks, cursor })
    }

    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        list_mutex_only(self, self.name, shape, query).await
    }

    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        lock_core::election::list_mutex_elections(self, query).await
    }
}

impl ShedAdmin {
    pub(crate) fn new(inner: Arc<ShedTable>, name: &'static str) -> Self {
        Self { inner, name }
    }

    /// [`Admin::force_release`](lock_core::Admin::force_release)
    /// on ShedLock's table (see the module docs).
    async fn force_release_row(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let inner = &self.inner;
        let sp = spelling(inner.config.dialect);
        let (t, k, now, p1) = (
            &inner.sql.quoted_table,
            &inner.sql.quoted_tokens,
            sp.now,
            sp.params[0],
        );
        let read: Arc<str> = Arc::from(format!(
            "SELECT s.locked_by, k.token, {left}, k.details \
             FROM {t} s LEFT JOIN {k} k ON k.name = s.name \
             WHERE s.name = {p1} AND s.lock_until > {now}{lock}",
            left = sp.left,
            lock = sp.lock,
        ));
        let clear: Arc<str> = Arc::from(format!(
            "UPDATE {t} SET lock_until = {now} WHERE name = {p1}"
        ));
        let begin: Arc<str> = Arc::from(sp.begin);
        let name = key.as_str();
        let by_name = [Bind::Text(name)];
        let statements = ReadAndClear {
            begin: &begin,
            read: (&read, &by_name),
            clear: (&clear, &by_name),
            clear_answers: false,
        };
        let found = read_and_clear(&inner.conns, &inner.config, key, statements).await?;
        let Some(row) = found else {
            return Ok(None);
        };
        let pad = pad_of(inner.config.dialect);
        tracing::warn!(
            key = name,
            holder = row[0].text(),
            "force-released a ShedLock lock"
        );
        Ok(Some(info(key.clone(), &row, pad)))
    }
}
