//! The statements of session mode, built once per backend from the
//! validated table name. Values are bound; only the (validated, quoted)
//! sequence or token-table name is spliced.

use crate::config::SqlDialect;
use crate::sql::quote_table;

/// Session-mode SQL for one dialect.
#[derive(Debug)]
pub(crate) struct SessionSql {
    /// Creates the token sequence / table if missing (idempotent).
    pub(crate) create: String,
    /// PostgreSQL: reads the sequence's cache size and cycle flag
    /// (`$1` = its quoted name). Empty on MySQL.
    pub(crate) check: String,
    /// The quoted sequence (PostgreSQL) or token table (MySQL) name.
    pub(crate) counter: String,
    /// One try (PostgreSQL) or a try/wait (MySQL, by its timeout
    /// parameter) that takes the lock and its token in one statement.
    pub(crate) grant: String,
    /// PostgreSQL: the waiting grant (`lock_timeout` set in the same
    /// statement). MySQL uses `grant` with a positive timeout.
    pub(crate) wait: String,
    /// Releases the lock (and resets the session's settings).
    pub(crate) release: String,
    /// The keep-alive: does this session still hold the lock?
    pub(crate) holds: String,
    /// Who holds the lock, and the token of its last grant.
    pub(crate) inspect: String,
    /// This session's server-side id (backend pid / connection id).
    pub(crate) session_id: &'static str,
}

/// `table` with `suffix` appended to its last part (`schema.t` ->
/// `schema.t_suffix`), quoted for `dialect`. The table name was validated
/// to at most 48 bytes, so the result fits both servers' 63/64-byte limits.
fn suffixed(dialect: SqlDialect, table: &str, suffix: &str) -> String {
    quote_table(dialect, &format!("{table}{suffix}"))
}

impl SessionSql {
    pub(crate) fn new(dialect: SqlDialect, table: &str) -> Self {
        match dialect {
            // The grant's CASE runs `nextval` only when the try-lock
            // succeeded (CASE evaluates its branches in order and only as
            // needed), and the token and the holder's identity are published
            // in `application_name` for `inspect`. OFFSET 0 keeps the
            // subquery from being flattened into the outer query, so the
            // volatile lock call is evaluated exactly once.
            SqlDialect::Postgres | SqlDialect::Sqlite => {
                let seq = suffixed(SqlDialect::Postgres, table, "_session_seq");
                let publish = "CASE WHEN g.t IS NOT NULL THEN \
                     set_config('application_name', 'distlock ' || $2 || ' ' || g.t, false) \
                     || set_config('idle_session_timeout', $3, false) END";
                Self {
                    create: format!("CREATE SEQUENCE IF NOT EXISTS {seq} AS BIGINT CACHE 1 NO CYCLE"),
                    check: "SELECT seqcache, seqcycle FROM pg_sequence WHERE seqrelid = $1::regclass"
                        .to_owned(),
                    grant: format!(
                        "SELECT g.t, {publish} FROM (SELECT CASE WHEN pg_try_advisory_lock($1) \
                         THEN nextval('{seq}') END AS t OFFSET 0) g"
                    ),
                    wait: format!(
                        "SELECT g.t, {publish} FROM (SELECT CASE \
                         WHEN set_config('lock_timeout', $4, false) IS NULL THEN NULL \
                         WHEN pg_advisory_lock($1)::text IS NULL THEN NULL \
                         ELSE nextval('{seq}') END AS t OFFSET 0) g"
                    ),
                    release: "SELECT pg_advisory_unlock($1), \
                         set_config('application_name', 'distlock', false), \
                         set_config('idle_session_timeout', '0', false)"
                        .to_owned(),
                    holds: "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
                         AND pid = pg_backend_pid() AND classid::bigint = $1 \
                         AND objid::bigint = $2 AND objsubid = 1 AND granted)"
                        .to_owned(),
                    inspect: "SELECT l.pid, a.application_name FROM pg_locks l \
                         LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
                         WHERE l.locktype = 'advisory' AND l.classid::bigint = $1 \
                         AND l.objid::bigint = $2 AND l.objsubid = 1 AND l.granted \
                         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                        .to_owned(),
                    session_id: "SELECT CAST(pg_backend_pid() AS BIGINT)",
                    counter: seq,
                }
            }
            // One row per key, never deleted: the token column is bumped
            // only by a statement whose GET_LOCK succeeded, so the grants of
            // a key are serialized by its lock and the counter strictly
            // increases. LAST_INSERT_ID(expr) carries the new token back in
            // the OK packet; no row is selected (and 0 reported) when
            // GET_LOCK returned 0 (held until the timeout) or NULL (error).
            SqlDialect::MySql => {
                let tok = suffixed(SqlDialect::MySql, table, "_session_tokens");
                Self {
                    create: format!(
                        "CREATE TABLE IF NOT EXISTS {tok} (\
                         name VARBINARY(1024) NOT NULL PRIMARY KEY, \
                         token BIGINT NOT NULL, \
                         owner VARCHAR(64) NOT NULL, \
                         conn BIGINT NOT NULL) ENGINE=InnoDB"
                    ),
                    check: String::new(),
                    grant: format!(
                        "INSERT INTO {tok} (name, token, owner, conn) \
                         SELECT ?, LAST_INSERT_ID(1), ?, CONNECTION_ID() FROM DUAL \
                         WHERE GET_LOCK(?, ?) = 1 \
                         ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), \
                         owner = VALUES(owner), conn = VALUES(conn)"
                    ),
                    wait: String::new(),
                    release: "SELECT RELEASE_LOCK(?)".to_owned(),
                    holds: "SELECT IS_USED_LOCK(?) = CONNECTION_ID()".to_owned(),
                    inspect: format!(
                        "SELECT u.c, t.token, t.owner, t.conn \
                         FROM (SELECT IS_USED_LOCK(?) AS c) u LEFT JOIN {tok} t ON t.name = ?"
                    ),
                    session_id: "SELECT CAST(CONNECTION_ID() AS SIGNED)",
                    counter: tok,
                }
            }
        }
    }
}
