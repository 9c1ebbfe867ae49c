//! SQLite: no server, so "now" is the host's wall clock in microseconds
//! since the Unix epoch, bound by each statement; `?n` placeholders; one
//! writer per database file (the process's writing statements take turns);
//! files opened in WAL mode with `synchronous=NORMAL` and a busy timeout.

use lock_core::LockError;

use super::{
    Arg, Batch, Dialect, GrantAll, GrantReply, LeaseBinds, LeaseSql, Params, Profile, SharedDdl,
    UpsertBinds, WaitersIndex, lease_upsert, parse_options, spliced_batch,
};
use crate::config::SqlConfig;
use crate::connection::DbOptions;

/// SQLite's "now" in SQL: the host clock in microseconds since the Unix
/// epoch, as SQLite reads it (millisecond precision, fixed within one
/// statement). The shared tables use it; the mutex's statements bind the
/// same clock from the process ([`super::unix_micros`]).
const SQLITE_NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)";

/// The microseconds `expires_at` is ahead of [`SQLITE_NOW`].
const SQLITE_LEFT: &str =
    "(expires_at - CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER))";

/// SQLite.
#[derive(Debug)]
pub(crate) struct Sqlite;

fn options(config: &SqlConfig) -> Result<sqlx::sqlite::SqliteConnectOptions, LockError> {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    // `sqlite::memory:` parses to a uniquely named shared-cache in-memory
    // database: the users' pool, built from the same options, opens the
    // same one.
    let mut options: SqliteConnectOptions = parse_options(config)?;
    options = options.busy_timeout(config.busy_timeout);
    if !config.is_memory() {
        // WAL: readers never block the writer, and several processes share
        // the file; NORMAL sync is durable across process crashes (not
        // power loss).
        options = options
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal);
    }
    Ok(options)
}

/// The host's clock bound as "now" by the mutex's statements (`?n`
/// placeholders), one writer, `BEGIN IMMEDIATE`.
static PROFILE: Profile = Profile {
    name: "sqlite",
    quote: '"',
    name_text: "name",
    // BEGIN IMMEDIATE holds the file's write lock for the transaction.
    for_update: "",
    notified: false,
    single_writer: true,
    // A file: 4; in memory: 1, the one connection that keeps the database
    // alive.
    pool_size: (4, 1),
    busy_timeout: true,
    int_type: "BIGINT",
    // SQLite's own reading of the host clock (fixed within a statement),
    // in microseconds since the Unix epoch (millisecond precision).
    now_sql: SQLITE_NOW,
    left_micros: SQLITE_LEFT,
    begin: "BEGIN IMMEDIATE",
    binds_now: true,
    binds: LeaseBinds {
        grant: &[
            Arg::Key,
            Arg::Owner,
            Arg::Now,
            Arg::Ttl,
            Arg::Ahead,
            Arg::Details,
        ],
        release: &[Arg::Key, Arg::Owner, Arg::Token, Arg::Now],
        renew: &[Arg::Key, Arg::Owner, Arg::Token, Arg::Now, Arg::Ttl],
        inspect: &[Arg::Key, Arg::Now],
        grant_reply: GrantReply::Returning,
        // ?1 is now, ?2 the TTL.
        batch: Batch::Spliced {
            lead: &[Arg::Now, Arg::Ttl],
            key: Arg::Key,
            returns: true,
        },
    },
    params: Params::Numbered("?"),
    // `({SQLITE_NOW} + micros)`.
    micros_later: [
        "(CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER) + ",
        ")",
    ],
    shared: SharedDdl {
        name: "TEXT",
        shape: "TEXT",
        owner: "TEXT",
        kind: "TEXT",
        int: "INTEGER",
        time: "INTEGER",
        details: None,
        // AUTOINCREMENT: ids are never reused, so arrival order holds.
        waiter_id: "INTEGER PRIMARY KEY AUTOINCREMENT",
        keyed_options: " WITHOUT ROWID",
        waiters_options: "",
        waiters_index: WaitersIndex::QualifiedName,
    },
};

impl Dialect for Sqlite {
    // "now" is bound as ?3 / ?4.
    fn statements(&self, t: &str, first: &str) -> LeaseSql {
        LeaseSql {
            grant: lease_upsert(
                t,
                &format!("VALUES (?1, ?2, {first}, ?3 + ?4, ?5)"),
                "?3",
                "token",
            ),
            release: format!(
                "UPDATE {t} SET owner = NULL, details = NULL, expires_at = ?4 \
                 WHERE name = ?1 AND owner = ?2 AND token = ?3 AND expires_at > ?4"
            ),
            renew: format!(
                "UPDATE {t} SET expires_at = ?4 + ?5 \
                 WHERE name = ?1 AND owner = ?2 AND token = ?3 AND expires_at > ?4"
            ),
            inspect: format!(
                "SELECT owner, token, expires_at - ?2, details \
                 FROM {t} WHERE name = ?1 AND owner IS NOT NULL AND expires_at > ?2"
            ),
            // Waiters poll: nothing to notify.
            waiting: None,
        }
    }

    fn add_details_sql(&self, t: &str) -> String {
        format!("ALTER TABLE {t} ADD COLUMN details TEXT")
    }

    // LIKE is case-insensitive on SQLite: a plain prefix test instead.
    fn prefix_predicate(&self, param: &str) -> (String, bool) {
        (format!("instr(name, {param}) = 1"), false)
    }

    fn raise_floor_sql(&self, f: &str) -> String {
        format!(
            "INSERT INTO {f} AS x (id, token) VALUES (1, ?1) \
             ON CONFLICT (id) DO UPDATE SET token = max(x.token, excluded.token) \
             RETURNING token"
        )
    }

    fn owner_predicate(&self, t: &str, n: usize) -> String {
        format!(
            "EXISTS (SELECT 1 FROM {t} WHERE name = ?{} AND owner = ?{} AND token = ?{} \
             AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER))",
            n,
            n + 1,
            n + 2
        )
    }

    fn renew_batch_sql(&self, table: &str, rows: usize) -> String {
        // ?1 is now, ?2 the TTL; a row-value list only from a subquery.
        let mut n = 2;
        spliced_batch(
            table,
            "?1 + ?2",
            "?1",
            rows,
            "VALUES ",
            " RETURNING name, owner, token",
            || {
                n += 1;
                format!("?{n}")
            },
        )
    }

    fn connect_options(&self, config: &SqlConfig) -> Result<DbOptions, LockError> {
        Ok(DbOptions::Sqlite(options(config)?))
    }

    // BEGIN IMMEDIATE holds the file's write lock: the check and the
    // upsert see one state.
    fn grant_all_sql(&self, t: &str, first: &str, w: Option<&str>, n: usize) -> GrantAll {
        let names: Vec<String> = (0..n).map(|i| format!("?{}", i + 1)).collect();
        let details = n + 4;
        let rows: Vec<String> = (0..n)
            .map(|i| format!("(?{}, ?3, {first}, ?1 + ?2, ?{details})", i + 4))
            .collect();
        GrantAll::Transaction {
            begin: "BEGIN IMMEDIATE",
            check: w.map(|w| {
                format!(
                    "SELECT COUNT(*) FROM {w} WHERE name IN ({}) AND shape = 'mutex' \
                     AND expires_at > {SQLITE_NOW}",
                    names.join(", ")
                )
            }),
            upsert: lease_upsert(
                t,
                &format!("VALUES {}", rows.join(", ")),
                "?1",
                "name, token",
            ),
            rows: UpsertBinds::NowTtlOwnerNames,
            returns: true,
            read: None,
        }
    }

    // As PostgreSQL's: an earlier live waiter leaves the SELECT empty.
    // SQLite's waiter rows expire by its own reading of the same host
    // clock (millisecond precision), compared with the bound now (?3).
    fn fair_grant_sql(&self, t: &str, first: &str, w: &str) -> String {
        let source = format!(
            "SELECT ?1, ?2, {first}, ?3 + ?4, ?6 \
             WHERE NOT EXISTS (SELECT 1 FROM {w} WHERE name = ?1 AND shape = 'mutex' \
             AND expires_at > ?3 AND id < ?5)"
        );
        lease_upsert(t, &source, "?3", "token")
    }

    fn lock_key_sql(&self, keys: &str) -> Vec<String> {
        vec![format!(
            "INSERT INTO {keys} AS k (name, shape, token, epoch) VALUES (?1, ?2, ?3, 0) \
             ON CONFLICT (name, shape) DO UPDATE SET token = k.token + excluded.token \
             RETURNING token, epoch"
        )]
    }

    fn insert_waiter_sql(&self, waiters: &str, _lease: &str) -> Vec<String> {
        vec![format!(
            "INSERT INTO {waiters} (name, shape, owner, kind, cnt, lim, expires_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, {SQLITE_NOW} + ?7) RETURNING id"
        )]
    }

    fn profile(&self) -> &'static Profile {
        &PROFILE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared statements' "now plus µs" reads the clock as [`SQLITE_NOW`].
    #[test]
    fn micros_later_is_sqlite_now_plus() {
        assert_eq!(PROFILE.micros_later[0], format!("({SQLITE_NOW} + "));
    }

    /// The lease table's schema text, as deployed tables were created.
    #[test]
    fn lease_table_text_is_unchanged() {
        assert_eq!(
            Sqlite.lease_create("t"),
            "CREATE TABLE IF NOT EXISTS t (name TEXT NOT NULL PRIMARY KEY, owner TEXT, \
             token INTEGER NOT NULL, expires_at INTEGER NOT NULL, details TEXT) WITHOUT ROWID"
        );
    }
}
