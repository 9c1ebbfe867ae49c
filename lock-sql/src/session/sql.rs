//! The statements of session mode, built once per backend from the
//! validated table name by its [`SessionDialect`] (the text lives in
//! `crate::dialect`). Values are bound; only the (validated, quoted)
//! sequence or token-table name is spliced.

use std::sync::Arc;

use crate::dialect::SessionDialect;
use crate::sql::quote_with;

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
    /// MySQL: one `list` page of token rows, with who holds each one's
    /// lock now. Empty on PostgreSQL (no per-key row).
    pub(crate) list: String,
    /// `force_release`'s conditional end of the holder's session
    /// (PostgreSQL: one statement; MySQL: the re-check before `KILL`).
    pub(crate) kill_holder: String,
    /// This session's server-side id (backend pid / connection id).
    pub(crate) session_id: Arc<str>,
}

/// `table` with `suffix` appended to its last part (`schema.t` ->
/// `schema.t_suffix`), quoted with `quote`. The table name was validated
/// to at most 48 bytes, so the result fits both servers' 63/64-byte limits.
pub(crate) fn suffixed(quote: char, table: &str, suffix: &str) -> String {
    quote_with(quote, &format!("{table}{suffix}"))
}

impl SessionSql {
    /// The statements of `dialect` for lease table `table` (validated).
    pub(crate) fn new(dialect: &dyn SessionDialect, table: &str) -> Self {
        dialect.session_sql(table)
    }
}
