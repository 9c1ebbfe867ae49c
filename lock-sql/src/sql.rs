//! The statements of each dialect, built once per backend from the
//! validated table name.
//!
//! Every value (key, owner, token, TTL, time) is a bound parameter; the only
//! text spliced into SQL is the table name, which
//! [`validate_table`](crate::config::validate_table) restricted to
//! `[A-Za-z_][A-Za-z0-9_]*` (optionally `schema.`) and which is quoted here.

use std::sync::Arc;

use crate::config::SqlDialect;

/// SQL text for one backend. `Arc<str>` so that issuing a statement does not
/// copy it (sqlx takes ownership of the SQL of each query).
#[derive(Debug)]
pub(crate) struct Statements {
    /// Creates the table if missing (idempotent).
    pub(crate) create: Vec<Arc<str>>,
    /// Inserts or takes over an expired row, bumping the token.
    pub(crate) grant: Arc<str>,
    /// Clears the owner and expires the row, if still ours and unexpired.
    pub(crate) release: Arc<str>,
    /// Extends the expiry, if still ours and unexpired.
    pub(crate) renew: Arc<str>,
    /// Reads the current unexpired holder.
    pub(crate) inspect: Arc<str>,
    /// The quoted table name.
    pub(crate) quoted_table: String,
}

/// Quotes a validated (schema-qualified) table name for `dialect`.
pub(crate) fn quote_table(dialect: SqlDialect, table: &str) -> String {
    let quote = match dialect {
        SqlDialect::MySql => '`',
        SqlDialect::Postgres | SqlDialect::Sqlite => '"',
    };
    table
        .split('.')
        .map(|part| format!("{quote}{part}{quote}"))
        .collect::<Vec<_>>()
        .join(".")
}

/// The PostgreSQL notification channel for releases on `table`.
pub(crate) fn pg_channel(table: &str) -> String {
    format!("distlock_{}", table.replace('.', "_"))
}

impl Statements {
    pub(crate) fn new(dialect: SqlDialect, table: &str) -> Self {
        let t = quote_table(dialect, table);
        let arc = |s: String| -> Arc<str> { Arc::from(s) };
        match dialect {
            // `now()` is the transaction start; each statement here is its
            // own transaction. TTLs travel as microseconds.
            SqlDialect::Postgres => Self {
                create: vec![arc(format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\
                     name VARCHAR(1024) PRIMARY KEY, \
                     owner VARCHAR(64), \
                     token BIGINT NOT NULL, \
                     expires_at TIMESTAMPTZ NOT NULL)"
                ))],
                grant: arc(format!(
                    "INSERT INTO {t} AS l (name, owner, token, expires_at) \
                     VALUES ($1, $2, 1, now() + $3 * INTERVAL '1 microsecond') \
                     ON CONFLICT (name) DO UPDATE \
                     SET owner = EXCLUDED.owner, token = l.token + 1, expires_at = EXCLUDED.expires_at \
                     WHERE l.expires_at <= now() \
                     RETURNING token"
                )),
                // The notification is sent at commit, in the same statement.
                release: arc(format!(
                    "WITH r AS (UPDATE {t} SET owner = NULL, expires_at = now() \
                     WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > now() \
                     RETURNING name) \
                     SELECT pg_notify($4, name) FROM r"
                )),
                renew: arc(format!(
                    "UPDATE {t} SET expires_at = now() + $4 * INTERVAL '1 microsecond' \
                     WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > now()"
                )),
                inspect: arc(format!(
                    "SELECT owner, token, \
                     CAST(EXTRACT(EPOCH FROM (expires_at - now())) * 1000000 AS BIGINT) \
                     FROM {t} WHERE name = $1 AND owner IS NOT NULL AND expires_at > now()"
                )),
                quoted_table: t,
            },
            // `UTC_TIMESTAMP(6)` is fixed for the duration of a statement.
            // The grant reports its outcome through LAST_INSERT_ID(expr),
            // which the server returns in the OK packet: the new token when
            // the row was inserted or taken over, 0 when it was held. Row
            // counts cannot tell (sqlx sets CLIENT_FOUND_ROWS, so an
            // unchanged duplicate also reports 1). MySQL applies the
            // assignments left to right, so `expires_at` comes last and the
            // conditions before it see the old value.
            SqlDialect::MySql => Self {
                create: vec![arc(format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\
                     name VARBINARY(1024) NOT NULL PRIMARY KEY, \
                     owner VARCHAR(64) NULL, \
                     token BIGINT NOT NULL, \
                     expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB"
                ))],
                grant: arc(format!(
                    "INSERT INTO {t} (name, owner, token, expires_at) \
                     VALUES (?, ?, LAST_INSERT_ID(1), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
                     ON DUPLICATE KEY UPDATE \
                     token = IF(expires_at <= UTC_TIMESTAMP(6), LAST_INSERT_ID(token + 1), token + LAST_INSERT_ID(0)), \
                     owner = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(owner), owner), \
                     expires_at = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(expires_at), expires_at)"
                )),
                release: arc(format!(
                    "UPDATE {t} SET owner = NULL, expires_at = UTC_TIMESTAMP(6) \
                     WHERE name = ? AND owner = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)"
                )),
                renew: arc(format!(
                    "UPDATE {t} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                     WHERE name = ? AND owner = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)"
                )),
                inspect: arc(format!(
                    "SELECT owner, token, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
                     FROM {t} WHERE name = ? AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)"
                )),
                quoted_table: t,
            },
            // SQLite has no server: "now" is the host's clock in
            // microseconds since the Unix epoch, bound as ?3 / ?4.
            SqlDialect::Sqlite => Self {
                create: vec![arc(format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\
                     name TEXT NOT NULL PRIMARY KEY, \
                     owner TEXT, \
                     token INTEGER NOT NULL, \
                     expires_at INTEGER NOT NULL) WITHOUT ROWID"
                ))],
                grant: arc(format!(
                    "INSERT INTO {t} AS l (name, owner, token, expires_at) \
                     VALUES (?1, ?2, 1, ?3 + ?4) \
                     ON CONFLICT (name) DO UPDATE \
                     SET owner = excluded.owner, token = l.token + 1, expires_at = excluded.expires_at \
                     WHERE l.expires_at <= ?3 \
                     RETURNING token"
                )),
                release: arc(format!(
                    "UPDATE {t} SET owner = NULL, expires_at = ?4 \
                     WHERE name = ?1 AND owner = ?2 AND token = ?3 AND expires_at > ?4"
                )),
                renew: arc(format!(
                    "UPDATE {t} SET expires_at = ?4 + ?5 \
                     WHERE name = ?1 AND owner = ?2 AND token = ?3 AND expires_at > ?4"
                )),
                inspect: arc(format!(
                    "SELECT owner, token, expires_at - ?2 \
                     FROM {t} WHERE name = ?1 AND owner IS NOT NULL AND expires_at > ?2"
                )),
                quoted_table: t,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_quoted_per_dialect() {
        assert_eq!(
            quote_table(SqlDialect::Postgres, "app.locks"),
            "\"app\".\"locks\""
        );
        assert_eq!(quote_table(SqlDialect::MySql, "locks"), "`locks`");
        assert_eq!(pg_channel("app.locks"), "distlock_app_locks");
        let s = Statements::new(SqlDialect::Sqlite, "x");
        assert!(s.grant.contains("INSERT INTO \"x\""));
    }
}
