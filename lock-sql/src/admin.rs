//! Operating the row-mode locks (issue 18): the lease table's `details`
//! column, [`list`](lock_core::Listing::list),
//! [`force_release`](lock_core::Admin::force_release) and
//! [`gc`](lock_core::Admin::gc) with its token floor table.
//!
//! - `details` (nullable text, at most [`lock_core::MAX_ENCODED_LEN`]
//!   bytes) is written by the grant statement itself (one more bind, no
//!   extra round trip) and cleared by the release and by `force_release`;
//!   an expired row's details are hidden with its owner (every read filters
//!   on `expires_at`) and overwritten by the next grant. The shared holders
//!   table has the same column, written by the holder row's insert and
//!   gone with the row (`crate::shared`). A table (lease or holders)
//!   created before the column existed gets it at connect (`ALTER TABLE ..
//!   ADD COLUMN`, run only when a probe finds it missing; a concurrent
//!   connect adding it first is not an error).
//! - `<table>_floor (id, token)`: at most one row. Every grant that
//!   inserts a new lease row gives it the token `floor + 1` in the same
//!   statement; `gc` raises the floor to the highest token it removes, in
//!   the same transaction as the removal, while it keeps every other
//!   writer off the lease table (PostgreSQL `LOCK TABLE .. IN SHARE ROW
//!   EXCLUSIVE MODE`, MySQL `LOCK TABLES .. WRITE`, SQLite's write lock),
//!   so a grant that creates the row again reads the raised floor.

pub(crate) mod session;
mod shared;
pub(crate) mod shedlock;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::election::ElectionPage;
use lock_core::{
    Admin, FencingToken, GcReport, HolderDetails, ListQuery, Listing, LockError, LockInfo, LockKey,
    LockPage, LockShape, Operation, SharedPage, check_list_limit, with_timeout,
};

use crate::config::{NAME, SqlConfig};
use crate::connection::table::Table;
use crate::connection::{Checkout, ConnSet};
use crate::dialect::binds::{Bind, Value, execute, fetch};
use crate::dialect::{Dialect, micros};
use crate::error::{map_sqlx, timed};

/// The most lease rows one `gc` call removes.
pub(crate) const GC_BATCH: i64 = 1000;

/// What a list cursor starts with (then the last key scanned, in hex).
const CURSOR_TAG: &str = "sql1:";

pub(crate) fn encode_cursor(name: &str) -> String {
    let mut out = String::with_capacity(CURSOR_TAG.len() + 2 * name.len());
    out.push_str(CURSOR_TAG);
    for b in name.bytes() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Checks a `list` call's page size and reads its cursor: the name to
/// scan after (empty for the first page).
///
/// # Errors
///
/// `InvalidArgument` for a bad page size or a cursor this driver did not
/// hand out.
pub(crate) fn list_start(cursor: Option<&str>, limit: usize) -> Result<String, LockError> {
    check_list_limit(limit).map_err(|e| e.with_backend(NAME))?;
    match cursor {
        None => Ok(String::new()),
        Some(c) => decode_cursor(c).ok_or_else(|| {
            LockError::invalid_argument(
                Operation::Inspect,
                "not a cursor of this backend's list (it starts with `sql1:`)",
            )
            .with_backend(NAME)
        }),
    }
}

/// The last key a page scanned, or `None` for a cursor we did not hand out.
pub(crate) fn decode_cursor(cursor: &str) -> Option<String> {
    let hex = cursor.strip_prefix(CURSOR_TAG)?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok().filter(|s| !s.is_empty())
}

/// `prefix` as a `LIKE` pattern escaped with `!`.
pub(crate) fn like_prefix(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '!' | '%' | '_') {
            out.push('!');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// A holder's token, time left and details from three columns (token,
/// µs left, encoded details) as the holder statements read them.
pub(crate) fn holder_columns(
    columns: &[Value],
) -> (
    Option<FencingToken>,
    Option<Duration>,
    Option<HolderDetails>,
) {
    let token = u64::try_from(columns[0].int()).ok().map(FencingToken::new);
    let remaining_ttl = Some(crate::dialect::remaining(columns[1].int()));
    let details = match &columns[2] {
        Value::Text(Some(text)) => HolderDetails::decode(text),
        _ => None,
    };
    (token, remaining_ttl, details)
}

fn info(key: LockKey, row: &[Value]) -> LockInfo {
    let (token, remaining_ttl, details) = holder_columns(&row[1..]);
    LockInfo {
        key,
        holder: row[0].text().to_owned(),
        token,
        remaining_ttl,
        details,
    }
}

/// Ends a transaction: `end`'s statements on success, `abort`'s on an
/// error. The connection goes back to the set only when they all ran;
/// otherwise it is dropped (closed), never reused mid-transaction.
pub(crate) async fn finish<T>(
    mut checkout: Checkout<'_>,
    result: Result<T, sqlx::Error>,
    end: &[String],
    abort: &[String],
) -> Result<T, sqlx::Error> {
    let statements = if result.is_ok() { end } else { abort };
    let mut ended = Ok(());
    for statement in statements {
        if let Err(e) = execute(checkout.conn(), &Arc::from(statement.as_str()), &[]).await {
            ended = Err(e);
            break;
        }
    }
    match ended {
        Ok(()) => {
            checkout.finish(&result);
            result
        }
        Err(e) => {
            drop(checkout);
            result.and(Err(e))
        }
    }
}

/// One `list` page: `sql` with `binds` on a reader connection of `conns`,
/// within the operation timeout, its rows read as `spec` (the key's name
/// first), and the cursor after the last row when the page is full
/// (`limit` rows).
pub(crate) async fn list_page(
    conns: &ConnSet,
    config: &SqlConfig,
    sql: &Arc<str>,
    binds: &[Bind<'_>],
    spec: &str,
    limit: usize,
) -> Result<(Vec<Vec<Value>>, Option<String>), LockError> {
    let rows = timed(config, Operation::Inspect, None, async {
        let mut checkout = conns.checkout_reader(false).await?;
        let rows = fetch(checkout.conn(), sql, binds, spec).await;
        checkout.finish(&rows);
        rows
    })
    .await?;
    let cursor = (rows.len() == limit)
        .then(|| rows.last().map(|r| encode_cursor(r[0].text())))
        .flatten();
    Ok((rows, cursor))
}

/// The statements of `force_release`'s transaction, each with its binds.
pub(crate) struct ReadAndClear<'a> {
    /// Opens the transaction.
    pub(crate) begin: &'a Arc<str>,
    /// Reads the holder's row, locked: holder, token, µs left, details.
    pub(crate) read: (&'a Arc<str>, &'a [Bind<'a>]),
    /// Frees the row; its rows are fetched when `clear_answers` (a
    /// statement that notifies).
    pub(crate) clear: (&'a Arc<str>, &'a [Bind<'a>]),
    pub(crate) clear_answers: bool,
}

/// `force_release`'s transaction on `key`, within the operation timeout:
/// `begin`, then `read` and, only when it found the holder's row, `clear`;
/// COMMIT, or ROLLBACK after an error. The holder's row.
pub(crate) async fn read_and_clear(
    conns: &ConnSet,
    config: &SqlConfig,
    key: &LockKey,
    statements: ReadAndClear<'_>,
) -> Result<Option<Vec<Value>>, LockError> {
    let ReadAndClear {
        begin,
        read: (read, read_binds),
        clear: (clear, clear_binds),
        clear_answers,
    } = statements;
    timed(config, Operation::Release, Some(key), async {
        let mut checkout = conns.checkout(false).await?;
        let body = async {
            let conn = checkout.conn();
            execute(conn, begin, &[]).await?;
            let held = fetch(conn, read, read_binds, "tiit").await?;
            let Some(row) = held.into_iter().next() else {
                return Ok(None);
            };
            if clear_answers {
                fetch(conn, clear, clear_binds, "").await?;
            } else {
                execute(conn, clear, clear_binds).await?;
            }
            Ok(Some(row))
        }
        .await;
        finish(
            checkout,
            body,
            &["COMMIT".to_owned()],
            &["ROLLBACK".to_owned()],
        )
        .await
    })
    .await
}

/// "Now" and the µs left before `expires_at` in a statement: the
/// database's clock, or the bound one (placeholder `n`) where the dialect
/// binds it.
fn clock(d: &dyn Dialect, bound: Option<i64>, n: usize) -> (String, String) {
    match bound {
        Some(_) => {
            let p = d.param(n);
            (p.clone(), format!("(expires_at - {p})"))
        }
        None => (d.now_sql().to_owned(), d.left_micros().to_owned()),
    }
}

/// `list_shared` of a backend whose only shape is the mutex (session mode,
/// the ShedLock layout): the mutex from `list`, `Unsupported` for the
/// others.
pub(crate) async fn list_mutex_only<L: Listing>(
    listing: &L,
    name: &'static str,
    shape: LockShape,
    query: &ListQuery,
) -> Result<SharedPage, LockError> {
    match shape {
        LockShape::Mutex => lock_core::list_mutex_shared(listing, query).await,
        other => Err(LockError::new(
            lock_core::ErrorKind::Unsupported,
            Operation::Inspect,
            format!("{name} does not support listing {other} locks"),
        )
        .with_backend(name)),
    }
}

/// Row mode's operating calls: the [`Admin`] and [`Listing`] facets.
pub(crate) struct Administration {
    inner: Arc<Table>,
}

#[async_trait]
impl Admin for Administration {
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.force_release_row(key).await
    }

    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError> {
        self.gc_rows(older_than).await
    }
}

#[async_trait]
impl Listing for Administration {
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        self.list_rows(query).await
    }

    /// The mutex from `list`, read-write locks and semaphores from the
    /// holders table (`crate::admin::shared`).
    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        self.list_shares(shape, query).await
    }

    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        lock_core::election::list_mutex_elections(self, query).await
    }
}

impl Administration {
    pub(crate) fn new(inner: Arc<Table>) -> Self {
        Self { inner }
    }

    fn admin_err(&self, operation: Operation) -> impl Fn(sqlx::Error) -> LockError + '_ {
        move |e| map_sqlx(&self.inner.config, operation, e)
    }

    /// [`Listing::list`](lock_core::Listing::list) in row mode: one
    /// statement scanning at most `limit` rows of keys under `prefix`
    /// after the cursor, in key order; the held ones are returned.
    async fn list_rows(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        let (prefix, cursor, limit) = query.parts();
        let after = list_start(cursor, limit)?;
        let inner = &self.inner;
        let d = inner.dialect;
        let (predicate, like) = d.prefix_predicate(&d.param(1));
        let bound = d.bound_now();
        let (now, left) = clock(d, bound, 4);
        let sql: Arc<str> = Arc::from(format!(
            "SELECT {name}, owner, token, \
             CASE WHEN owner IS NOT NULL AND expires_at > {now} THEN {left} ELSE -1 END, details \
             FROM {t} WHERE {predicate} AND name > {p2} ORDER BY name LIMIT {p3}",
            name = d.name_text(),
            t = inner.statements.quoted_table,
            p2 = d.param(2),
            p3 = d.param(3),
        ));
        let pattern = if like {
            like_prefix(prefix)
        } else {
            prefix.to_owned()
        };
        let page = i64::try_from(limit).unwrap_or(1);
        let mut binds = vec![Bind::Text(&pattern), Bind::Text(&after), Bind::Int(page)];
        binds.extend(bound.map(Bind::Int));
        let (rows, cursor) =
            list_page(&inner.conns, &inner.config, &sql, &binds, "ttiit", limit).await?;
        let locks = rows
            .iter()
            .filter(|r| r[3].int() >= 0)
            .filter_map(|r| Some(info(LockKey::new(r[0].text()).ok()?, &r[1..])))
            .collect();
        Ok(LockPage { locks, cursor })
    }

    /// [`Admin::force_release`](lock_core::Admin::force_release)
    /// in row mode: one transaction reads the holder (locking its row) and
    /// frees the row (owner and details cleared, expired now, token kept);
    /// PostgreSQL notifies waiters in the same statement, elsewhere this
    /// process's waiters are woken and the others poll.
    async fn force_release_row(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let inner = &self.inner;
        let d = inner.dialect;
        let t = &inner.statements.quoted_table;
        let (now, p1) = (d.now_sql(), d.param(1));
        let bound = d.bound_now();
        let (read_now, left) = clock(d, bound, 2);
        let read: Arc<str> = Arc::from(format!(
            "SELECT owner, token, {left}, details FROM {t} \
             WHERE name = {p1} AND owner IS NOT NULL AND expires_at > {read_now}{lock}",
            lock = d.for_update(),
        ));
        let mut read_binds = vec![Bind::Text(key.as_str())];
        read_binds.extend(bound.map(Bind::Int));
        let clear = format!(
            "UPDATE {t} SET owner = NULL, details = NULL, expires_at = {now} WHERE name = {p1}"
        );
        let clear: Arc<str> = Arc::from(d.notifying(&clear).unwrap_or(clear));
        let begin: Arc<str> = Arc::from(d.begin_sql());
        let channel = inner.channel.as_str();
        let name = key.as_str();
        // The notifying statement also binds the channel.
        let clear_binds = [Bind::Text(name), Bind::Text(channel)];
        let clear_binds = &clear_binds[..if d.notified() { 2 } else { 1 }];
        let statements = ReadAndClear {
            begin: &begin,
            read: (&read, &read_binds),
            clear: (&clear, clear_binds),
            clear_answers: d.notified(),
        };
        let found = read_and_clear(&inner.conns, &inner.config, key, statements).await?;
        let Some(row) = found else {
            return Ok(None);
        };
        if !d.notified() {
            inner.waits.released(name);
        }
        tracing::warn!(
            key = name,
            holder = row[0].text(),
            token = row[1].int(),
            "force-released a lock"
        );
        Ok(Some(info(key.clone(), &row)))
    }

    /// [`Admin::gc`](lock_core::Admin::gc) in row mode: with
    /// the lease table held against other writers, reads up to
    /// [`GC_BATCH`] rows that expired (or were released) at least
    /// `older_than` ago, raises the floor to their highest token and
    /// deletes them.
    async fn gc_rows(&self, older_than: Duration) -> Result<GcReport, LockError> {
        let inner = &self.inner;
        let d = inner.dialect;
        let (t, f) = (
            &inner.statements.quoted_table,
            &inner.statements.quoted_floor,
        );
        let timeout = inner.config.op_timeout;
        let lock = d.gc_lock(t, f, timeout.as_millis());
        let arc = |s: String| -> Arc<str> { Arc::from(s) };
        let old = d.plus_micros(&d.param(1));
        let scan = arc(format!(
            "SELECT {name}, token FROM {t} WHERE expires_at <= {old} ORDER BY name LIMIT {p2}",
            name = d.name_text(),
            p2 = d.param(2),
        ));
        let raise = arc(d.raise_floor_sql(f));
        let floor_sql = arc(format!("SELECT COALESCE(MAX(token), 0) FROM {f}"));
        let delete = arc(format!(
            "DELETE FROM {t} WHERE expires_at <= {old} AND name >= {} AND name <= {} \
             AND token <= {}",
            d.param(2),
            d.param(3),
            d.param(4)
        ));
        let back = -micros(older_than);
        let report = async {
            let mut checkout = inner.conns.checkout(false).await?;
            let body = async {
                let conn = checkout.conn();
                for statement in &lock.begin {
                    execute(conn, &Arc::from(statement.as_str()), &[]).await?;
                }
                let rows =
                    fetch(conn, &scan, &[Bind::Int(back), Bind::Int(GC_BATCH)], "ti").await?;
                let scanned = u64::try_from(rows.len()).unwrap_or(0);
                let mut removed = 0;
                if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
                    let top = rows.iter().map(|r| r[1].int()).max().unwrap_or(0);
                    execute(conn, &raise, &[Bind::Int(top)]).await?;
                    let floor = fetch(conn, &floor_sql, &[], "i").await?;
                    let floor = floor.first().map_or(top, |r| r[0].int());
                    let binds = [
                        Bind::Int(back),
                        Bind::Text(first[0].text()),
                        Bind::Text(last[0].text()),
                        Bind::Int(floor),
                    ];
                    removed = execute(conn, &delete, &binds).await?;
                }
                let floor = fetch(conn, &floor_sql, &[], "i").await?;
                let floor = floor.first().map_or(0, |r| r[0].int());
                Ok(GcReport {
                    removed,
                    scanned,
                    token_floor: u64::try_from(floor)
                        .ok()
                        .filter(|&f| f > 0)
                        .map(FencingToken::new),
                })
            }
            .await;
            finish(checkout, body, &lock.commit, &lock.abort).await
        };
        let report = with_timeout(timeout.saturating_mul(3), Operation::Release, async {
            report.await.map_err(self.admin_err(Operation::Release))
        })
        .await
        .map_err(|e| e.with_backend(NAME))?;
        tracing::info!(
            removed = report.removed,
            scanned = report.scanned,
            "collected stale lease rows"
        );
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_foreign_ones_are_refused() {
        for name in ["a", "jobs/ä:1", "x%_!"] {
            assert_eq!(decode_cursor(&encode_cursor(name)).as_deref(), Some(name));
        }
        for bad in ["", "sql1:", "sql1:6", "sql1:zz", "other:61", "sql1:ff"] {
            assert_eq!(decode_cursor(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn like_wildcards_are_escaped() {
        assert_eq!(like_prefix("a%b_c!"), "a!%b!_c!!%");
        assert_eq!(like_prefix(""), "%");
    }
}
