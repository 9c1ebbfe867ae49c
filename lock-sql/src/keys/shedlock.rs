//! The ShedLock layout's SQL text per database, and the few statements
//! that run it (one match on the connection each: this layout has four
//! statements, not the lease table's dozens, so it does not go through
//! [`crate::dialect::Dialect`]).
//!
//! "Now" is written the way ShedLock's `usingDbTime()` statements write it
//! (`timezone('utc', CURRENT_TIMESTAMP)` on PostgreSQL, `UTC_TIMESTAMP(3)`
//! on MySQL/MariaDB); SQLite, where ShedLock has no `usingDbTime()`, gets
//! the host clock in epoch milliseconds (what sqlite-jdbc stores for a
//! bound timestamp by default).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::AssertSqlSafe;

use crate::config::SqlDialect;
use crate::connection::DbConn;
use crate::connection::on_conn;
use crate::dialect::binds::{Bind, Value, execute, fetch_optional};
use crate::dialect::{DETAILS_LEN, micros};

/// The tokens table's `details` column: `<locked_by> <details>` (see
/// [`side_details`]).
pub(crate) const SIDE_DETAILS_LEN: usize = DETAILS_LEN + 256 + 1;
use crate::dialect::quote_with;

const PG_NOW: &str = "timezone('utc', CURRENT_TIMESTAMP)";
const MY_NOW: &str = "UTC_TIMESTAMP(3)";
const LITE_NOW: &str = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

/// Extra time on the database side of every expiry where the columns
/// store milliseconds (MySQL `TIMESTAMP(3)`, SQLite epoch ms): "now" and
/// the stored value are each truncated by up to 1 ms, so without it the
/// row could free up to 2 ms before `sent_at + ttl`.
pub(crate) const MS_PAD: Duration = Duration::from_millis(2);

/// The statements of one table (validated, quoted here) and its side
/// table of tokens.
#[derive(Debug)]
pub(crate) struct ShedSql {
    pub(crate) dialect: SqlDialect,
    /// ShedLock's DDL for this database, then the tokens table's.
    pub(crate) create: Vec<Arc<str>>,
    /// Reads no row but fails when a table or column is missing.
    pub(crate) probe: Vec<Arc<str>>,
    grant: Arc<str>,
    /// SQLite: the token bump after a grant, in the grant's transaction;
    /// MySQL/MariaDB: the token bump of a name's first grant (below).
    token: Arc<str>,
    /// MySQL/MariaDB: a free row where the lock row is missing.
    ensure_lock_row: Arc<str>,
    /// MySQL/MariaDB: ShedLock's insert, only while the name's counter
    /// still holds the bumped value.
    first_grant: Arc<str>,
    /// MySQL/MariaDB: names whose tokens row is known to exist.
    known: Mutex<HashSet<String>>,
    release: Arc<str>,
    renew: Arc<str>,
    inspect: Arc<str>,
    pub(crate) quoted_table: String,
    pub(crate) quoted_tokens: String,
}

/// `<table>_tokens` (the suffix on the last part of a qualified name).
pub(crate) fn tokens_table(table: &str) -> String {
    format!("{table}_tokens")
}

impl ShedSql {
    pub(crate) fn new(dialect: SqlDialect, table: &str) -> Self {
        let quote = if dialect == SqlDialect::MySql {
            '`'
        } else {
            '"'
        };
        let t = quote_with(quote, table);
        let k = quote_with(quote, &tokens_table(table));
        let arc = |s: String| -> Arc<str> { Arc::from(s) };
        let probe = vec![
            arc(format!(
                "SELECT name, lock_until, locked_at, locked_by FROM {t} WHERE 1 = 0"
            )),
            arc(format!("SELECT name, token, details FROM {k} WHERE 1 = 0")),
        ];
        // ShedLock's DDL on PostgreSQL (and on SQLite, where it has none).
        let shedlock_ddl = format!(
            "CREATE TABLE IF NOT EXISTS {t} (name VARCHAR(64) NOT NULL, \
             lock_until TIMESTAMP NOT NULL, locked_at TIMESTAMP NOT NULL, \
             locked_by VARCHAR(255) NOT NULL, PRIMARY KEY (name))"
        );
        // ShedLock's unlock and extend, and the read of the holder, in the
        // dialect's "now", "now + the TTL", "µs left" and placeholders for
        // (name, locked_by).
        let rows = |now: &str, until: &str, left: &str, (name, by): (&str, &str)| {
            let update = |set: &str| {
                arc(format!(
                    "UPDATE {t} SET lock_until = {set} \
                     WHERE name = {name} AND locked_by = {by} AND lock_until > {now}"
                ))
            };
            let inspect = arc(format!(
                "SELECT s.locked_by, k.token, {left}, k.details \
                 FROM {t} s LEFT JOIN {k} k ON k.name = s.name \
                 WHERE s.name = {name} AND s.lock_until > {now}"
            ));
            (update(now), update(until), inspect)
        };
        let mut first_grant = arc(String::new());
        let (create, grant, token, ensure_lock_row, (release, renew, inspect)) = match dialect {
            SqlDialect::Postgres => {
                let now = PG_NOW;
                (
                    vec![
                        arc(shedlock_ddl.clone()),
                        arc(format!(
                            "CREATE TABLE IF NOT EXISTS {k} (name VARCHAR(64) NOT NULL \
                             PRIMARY KEY, token BIGINT NOT NULL, details VARCHAR({SIDE_DETAILS_LEN}))"
                        )),
                    ],
                    // ShedLock's own upsert (its usingDbTime insert), then
                    // the token of the granted row, in one statement.
                    arc(format!(
                        "WITH g AS (INSERT INTO {t} AS s (name, lock_until, locked_at, locked_by) \
                         VALUES ($1, {now} + $2 * INTERVAL '1 microsecond', {now}, $3) \
                         ON CONFLICT (name) DO UPDATE SET lock_until = EXCLUDED.lock_until, \
                         locked_at = EXCLUDED.locked_at, locked_by = EXCLUDED.locked_by \
                         WHERE s.lock_until <= {now} RETURNING s.name) \
                         INSERT INTO {k} AS k (name, token, details) SELECT name, 1, $4 FROM g \
                         ON CONFLICT (name) DO UPDATE SET token = k.token + 1, \
                         details = EXCLUDED.details \
                         RETURNING k.token"
                    )),
                    arc(String::new()),
                    arc(String::new()),
                    rows(
                        now,
                        &format!("{now} + $3 * INTERVAL '1 microsecond'"),
                        &format!(
                            "CAST(EXTRACT(EPOCH FROM (s.lock_until - {now})) * 1000000 AS BIGINT)"
                        ),
                        ("$1", "$2"),
                    ),
                )
            }
            SqlDialect::MySql => {
                let now = MY_NOW;
                // The read of the counter takes a shared lock on its row: no
                // bump can come between the check and the insert.
                first_grant = arc(format!(
                    "INSERT IGNORE INTO {t} (name, lock_until, locked_at, locked_by) \
                     SELECT ?, TIMESTAMPADD(MICROSECOND, ?, {now}), {now}, ? FROM {k} \
                     WHERE name = ? AND token = ?"
                ));
                (
                    vec![
                        arc(format!(
                            "CREATE TABLE IF NOT EXISTS {t} (name VARCHAR(64) NOT NULL, \
                             lock_until TIMESTAMP(3) NOT NULL, \
                             locked_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), \
                             locked_by VARCHAR(255) NOT NULL, PRIMARY KEY (name))"
                        )),
                        arc(format!(
                            "CREATE TABLE IF NOT EXISTS {k} (name VARCHAR(64) NOT NULL, \
                             token BIGINT NOT NULL, details VARCHAR({SIDE_DETAILS_LEN}) NULL, \
                             PRIMARY KEY (name)) ENGINE=InnoDB"
                        )),
                    ],
                    // Both rows exist (below): ShedLock's update and the
                    // token bump in one two-table UPDATE; the new token
                    // comes back as LAST_INSERT_ID in the OK packet.
                    arc(format!(
                        "UPDATE {t} AS s JOIN {k} AS k ON k.name = s.name \
                         SET s.lock_until = TIMESTAMPADD(MICROSECOND, ?, {now}), \
                         s.locked_at = {now}, s.locked_by = ?, \
                         k.token = LAST_INSERT_ID(k.token + 1), k.details = ? \
                         WHERE s.name = ? AND s.lock_until <= {now}"
                    )),
                    // Only while the name is not held (the read locks the
                    // lock row in share mode until the bump commits): the
                    // counter moves only while the row is free, so it is
                    // the holder's token whenever the row is held.
                    arc(format!(
                        "INSERT INTO {k} (name, token, details) SELECT ?, LAST_INSERT_ID(1), ? FROM DUAL \
                         WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE name = ? AND lock_until > {now}) \
                         ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), \
                         details = VALUES(details)"
                    )),
                    // A free row, as ShedLock's unlock leaves one.
                    arc(format!(
                        "INSERT IGNORE INTO {t} (name, lock_until, locked_at, locked_by) \
                         VALUES (?, {now}, {now}, '')"
                    )),
                    rows(
                        now,
                        &format!("TIMESTAMPADD(MICROSECOND, ?, {now})"),
                        "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), s.lock_until)",
                        ("?", "?"),
                    ),
                )
            }
            SqlDialect::Sqlite => {
                let now = LITE_NOW;
                (
                    vec![
                        arc(shedlock_ddl),
                        arc(format!(
                            "CREATE TABLE IF NOT EXISTS {k} (name VARCHAR(64) NOT NULL \
                             PRIMARY KEY, token INTEGER NOT NULL, details TEXT)"
                        )),
                    ],
                    arc(format!(
                        "INSERT INTO {t} AS s (name, lock_until, locked_at, locked_by) \
                         VALUES (?1, {now} + ?2, {now}, ?3) \
                         ON CONFLICT (name) DO UPDATE SET lock_until = excluded.lock_until, \
                         locked_at = excluded.locked_at, locked_by = excluded.locked_by \
                         WHERE s.lock_until <= {now}"
                    )),
                    arc(format!(
                        "INSERT INTO {k} AS k (name, token, details) VALUES (?1, 1, ?2) \
                         ON CONFLICT (name) DO UPDATE SET token = k.token + 1, \
                         details = excluded.details RETURNING token"
                    )),
                    arc(String::new()),
                    rows(
                        now,
                        &format!("{now} + ?3"),
                        &format!("(s.lock_until - {now}) * 1000"),
                        ("?1", "?2"),
                    ),
                )
            }
        };
        Self {
            dialect,
            create,
            probe,
            grant,
            token,
            ensure_lock_row,
            first_grant,
            known: Mutex::new(HashSet::new()),
            release,
            renew,
            inspect,
            quoted_table: t,
            quoted_tokens: k,
        }
    }

    /// Every statement text, for the docs' and tests' listing.
    pub(crate) fn lock_statements(&self) -> Vec<(&'static str, &str)> {
        let mut out = vec![("grant", &*self.grant)];
        match self.dialect {
            SqlDialect::MySql => {
                out.push(("grant: first, token", &*self.token));
                out.push(("grant: first, row", &*self.first_grant));
                out.push(("grant: missing row", &*self.ensure_lock_row));
            }
            SqlDialect::Sqlite => out.push(("grant: token", &*self.token)),
            SqlDialect::Postgres => {}
        }
        out.push(("release", &*self.release));
        out.push(("renew", &*self.renew));
        out.push(("inspect", &*self.inspect));
        out
    }
}

/// The TTL as the database adds it: microseconds (PostgreSQL), padded
/// microseconds (MySQL), padded milliseconds rounded up (SQLite).
fn ttl_value(dialect: SqlDialect, ttl: Duration) -> i64 {
    match dialect {
        SqlDialect::Postgres => micros(ttl),
        SqlDialect::MySql => micros(ttl + MS_PAD),
        SqlDialect::Sqlite => {
            let ms = (ttl + MS_PAD).as_micros().div_ceil(1000);
            i64::try_from(ms).unwrap_or(i64::MAX)
        }
    }
}

fn text(sql: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(sql))
}

/// The current unexpired holder: (`locked_by`, our token counter, µs left,
/// the details of our last grant as [`side_details`] wrote them).
pub(crate) type ShedHolder = (String, Option<i64>, i64, Option<String>);

/// What the grant writes into the tokens table's `details` column:
/// `<locked_by> <encoded details>`, so that a reader shows them only
/// while that grant's `locked_by` holds the row (ShedLock's own grants
/// never touch the column, and ShedLock's unlock does not clear it).
pub(crate) fn side_details(locked_by: &str) -> String {
    format!("{locked_by} {}", lock_core::HolderDetails::encode_current())
}

/// The holder details in `column` when they belong to `locked_by`.
pub(crate) fn details_of(
    locked_by: &str,
    column: Option<&str>,
) -> Option<lock_core::HolderDetails> {
    let (by, encoded) = column?.split_once(' ')?;
    (by == locked_by)
        .then(|| lock_core::HolderDetails::decode(encoded))
        .flatten()
}

/// Whether `err` is a conflict the database rolled back (deadlock,
/// serialization failure): running the statement again is safe.
pub(crate) fn is_conflict(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db)
        if matches!(db.code().as_deref(), Some("40001" | "40P01")))
}

impl ShedSql {
    /// Runs one statement without binds (schema, probes), unprepared.
    pub(crate) async fn plain(&self, conn: &mut DbConn, sql: &Arc<str>) -> Result<(), sqlx::Error> {
        use sqlx::Executor;
        on_conn!(conn, |c| c.execute(text(sql)).await.map(drop))
    }

    /// MySQL/MariaDB: the collations of the `name` columns of `table` and
    /// its tokens table (unquoted, optionally `schema.`), when they differ.
    /// Names equal under ShedLock's collation (`Job` and `job` under a
    /// case-insensitive one) are one lock; they must be one token counter.
    pub(crate) async fn collation_mismatch(
        &self,
        conn: &mut DbConn,
        table: &str,
    ) -> Result<Option<(String, String)>, sqlx::Error> {
        #[cfg(feature = "mysql")]
        if let DbConn::MySql(c) = conn {
            let (schema, name) = match table.split_once('.') {
                Some((schema, name)) => (Some(schema), name),
                None => (None, table),
            };
            let sql = "SELECT TABLE_NAME, COALESCE(COLLATION_NAME, '') FROM information_schema.COLUMNS \
                       WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME IN (?, ?) \
                       AND COLUMN_NAME = 'name'";
            let rows: Vec<(String, String)> = sqlx::query_as(sql)
                .bind(schema)
                .bind(name)
                .bind(tokens_table(name))
                .fetch_all(&mut *c)
                .await?;
            let lock = rows.iter().find(|(t, _)| t == name).map(|r| r.1.clone());
            let tokens = rows.iter().find(|(t, _)| t != name).map(|r| r.1.clone());
            return Ok(match (lock, tokens) {
                (Some(lock), Some(tokens)) if lock != tokens => Some((lock, tokens)),
                _ => None,
            });
        }
        let _ = (conn, table);
        Ok(None)
    }

    /// The grant: `Some(token)` when `name` was free (no row, or
    /// `lock_until <= now`) and is now `locked_by`'s, `None` when held.
    pub(crate) async fn grant(
        &self,
        conn: &mut DbConn,
        name: &str,
        ttl: Duration,
        locked_by: &str,
    ) -> Result<Option<i64>, sqlx::Error> {
        let ttl = ttl_value(self.dialect, ttl);
        let details = side_details(locked_by);
        let details = details.as_str();
        match conn {
            #[cfg(feature = "postgres")]
            DbConn::Postgres(c) => {
                sqlx::query_scalar::<_, i64>(text(&self.grant))
                    .bind(name)
                    .bind(ttl)
                    .bind(locked_by)
                    .bind(details)
                    .fetch_optional(&mut *c)
                    .await
            }
            // The layout refuses `pooler=transaction` (`SqlConfig`).
            #[cfg(feature = "postgres")]
            DbConn::PostgresPooled(_) => Err(crate::dialect::wrong_conn("direct postgres")),
            #[cfg(feature = "mysql")]
            DbConn::MySql(c) => self.grant_mysql(c, name, ttl, locked_by, details).await,
            #[cfg(feature = "sqlite")]
            DbConn::Sqlite(c) => {
                use sqlx::Executor;
                // One write transaction: the row and its token together.
                c.execute("BEGIN IMMEDIATE").await?;
                let result = async {
                    let granted = sqlx::query(text(&self.grant))
                        .bind(name)
                        .bind(ttl)
                        .bind(locked_by)
                        .execute(&mut *c)
                        .await?;
                    if granted.rows_affected() == 0 {
                        return Ok(None);
                    }
                    sqlx::query_scalar::<_, i64>(text(&self.token))
                        .bind(name)
                        .bind(details)
                        .fetch_one(&mut *c)
                        .await
                        .map(Some)
                }
                .await;
                let end = match &result {
                    Ok(_) => c.execute("COMMIT").await.map(drop),
                    Err(_) => Err(sqlx::Error::RowNotFound),
                };
                if let Err(err) = end {
                    // Never hand the connection back inside a transaction.
                    let _ = c.execute("ROLLBACK").await;
                    if result.is_ok() {
                        return Err(err);
                    }
                }
                result
            }
        }
    }

    /// MySQL/MariaDB. A name whose tokens row we know: ShedLock's update
    /// joined with the token bump (1 round trip); refused, a free row is
    /// inserted in case the lock row was deleted (then the update once
    /// more). A name we do not know: the counter is bumped first, only
    /// while the name is not held (held: refused, 1 round trip), then
    /// ShedLock's insert is made only while the counter still holds that
    /// value (2 round trips for a new name; an existing free row falls
    /// back to the joined update). Every grant's token is thus bumped
    /// after every earlier grant of the name, and the counter never moves
    /// while the row is held.
    #[cfg(feature = "mysql")]
    async fn grant_mysql(
        &self,
        c: &mut sqlx::MySqlConnection,
        name: &str,
        ttl: i64,
        locked_by: &str,
        details: &str,
    ) -> Result<Option<i64>, sqlx::Error> {
        let update = async |c: &mut sqlx::MySqlConnection| -> Result<Option<i64>, sqlx::Error> {
            let done = sqlx::query(text(&self.grant))
                .bind(ttl)
                .bind(locked_by)
                .bind(details)
                .bind(name)
                .execute(&mut *c)
                .await?;
            if done.rows_affected() == 0 {
                return Ok(None);
            }
            match i64::try_from(done.last_insert_id()) {
                Ok(token) if token > 0 => Ok(Some(token)),
                _ => Err(sqlx::Error::Protocol(
                    "the ShedLock grant returned no token".into(),
                )),
            }
        };
        let known = self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(name);
        if known {
            if let Some(token) = update(&mut *c).await? {
                return Ok(Some(token));
            }
            let inserted = sqlx::query(text(&self.ensure_lock_row))
                .bind(name)
                .execute(&mut *c)
                .await?;
            if inserted.rows_affected() == 0 {
                return Ok(None);
            }
            return update(&mut *c).await;
        }
        let bumped = sqlx::query(text(&self.token))
            .bind(name)
            .bind(details)
            .bind(name)
            .execute(&mut *c)
            .await?;
        if bumped.rows_affected() == 0 {
            // Held: nothing moved.
            return Ok(None);
        }
        let token = i64::try_from(bumped.last_insert_id()).unwrap_or(0);
        {
            let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
            if known.len() >= 65_536 {
                known.clear();
            }
            known.insert(name.to_owned());
        }
        let inserted = sqlx::query(text(&self.first_grant))
            .bind(name)
            .bind(ttl)
            .bind(locked_by)
            .bind(name)
            .bind(token)
            .execute(&mut *c)
            .await?;
        if inserted.rows_affected() == 1 && token > 0 {
            return Ok(Some(token));
        }
        update(&mut *c).await
    }

    /// Ours `locked_by` and unexpired: `lock_until = now` (the row stays).
    pub(crate) async fn release(
        &self,
        conn: &mut DbConn,
        name: &str,
        locked_by: &str,
    ) -> Result<bool, sqlx::Error> {
        let binds = [Bind::Text(name), Bind::Text(locked_by)];
        Ok(execute(conn, &self.release, &binds).await? > 0)
    }

    /// ShedLock's extend: `lock_until = now + ttl` while ours and unexpired.
    pub(crate) async fn renew(
        &self,
        conn: &mut DbConn,
        name: &str,
        locked_by: &str,
        ttl: Duration,
    ) -> Result<bool, sqlx::Error> {
        let ttl = Bind::Int(ttl_value(self.dialect, ttl));
        let (name, locked_by) = (Bind::Text(name), Bind::Text(locked_by));
        // MySQL's positional `?`: the TTL comes first in the text.
        let binds = if self.dialect == SqlDialect::MySql {
            [ttl, name, locked_by]
        } else {
            [name, locked_by, ttl]
        };
        Ok(execute(conn, &self.renew, &binds).await? > 0)
    }

    /// The unexpired holder of `name`, by anyone.
    pub(crate) async fn inspect(
        &self,
        conn: &mut DbConn,
        name: &str,
    ) -> Result<Option<ShedHolder>, sqlx::Error> {
        let row = fetch_optional(conn, &self.inspect, &[Bind::Text(name)], "tiit").await?;
        Ok(row.map(|row| {
            let mut columns = row.into_iter();
            let mut next = || columns.next().unwrap_or(Value::Int(None));
            let by = next().into_text().unwrap_or_default();
            let token = match next() {
                Value::Int(token) => token,
                Value::Text(_) => None,
            };
            (by, token, next().int(), next().into_text())
        }))
    }
}

/// The longest ShedLock lock name (its `name VARCHAR(64)` column).
pub const SHEDLOCK_MAX_NAME: usize = 64;

/// What `locked_by` holds for our grants: `<host>/distlock/<owner hex>`.
const OURS: &str = "/distlock/";

/// What our grant by `owner` on `host` writes into `locked_by`.
pub(crate) fn locked_by(host: &str, owner: lock_core::OwnerId) -> String {
    format!("{host}{OURS}{}", owner.to_hex())
}

/// This host's name, as ShedLock writes it into `locked_by` (at most 128
/// printable characters; `localhost` when unknown).
pub(crate) fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let host: String = raw
        .trim()
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(128)
        .collect();
    if host.is_empty() {
        "localhost".to_owned()
    } else {
        host
    }
}

/// Whether `locked_by` has the shape of one of our grants.
pub(crate) fn is_ours(locked_by: &str) -> bool {
    locked_by
        .rsplit_once(OURS)
        .is_some_and(|(_, owner)| owner.len() == 32 && owner.bytes().all(|b| b.is_ascii_hexdigit()))
}
