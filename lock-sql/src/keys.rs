//! The key layout: how a [`LockKey`](lock_core::LockKey) becomes a row of
//! the lease table (row mode: the key is the `name` column, a bound
//! parameter), a server lock (session mode: [`pg_lock_key`],
//! [`mysql_lock_name`]) or a row of ShedLock's table, and the lock
//! statements of a backend, built once from the validated table name by its
//! dialect (the text lives in `crate::dialect`).
//!
//! Every value (key, owner, token, TTL, time) is a bound parameter; the only
//! text spliced into SQL is the table name, which
//! `validate_table` restricted to
//! `[A-Za-z_][A-Za-z0-9_]*` (optionally `schema.`) and which is quoted here.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{LockError, Operation};

use crate::config::{SqlConfig, SqlDialect};
use crate::dialect::{Dialect, first_token, floor_table, quote_with};

#[doc(hidden)]
#[cfg(feature = "postgres")]
pub use crate::connection::pooler::PooledPg;
#[doc(hidden)]
pub use crate::connection::{DbConn, DbOptions};
pub use session::{mysql_lock_name, pg_lock_key};

pub(crate) mod session;
pub(crate) mod shared;
pub(crate) mod shedlock;

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
    /// How waiters get the release that frees their key to notify them
    /// (PostgreSQL).
    pub(crate) waiting: Option<WaitingStatements>,
    /// The quoted table name.
    pub(crate) quoted_table: String,
    /// The quoted token floor table (`<table>_floor`, see crate::admin).
    pub(crate) quoted_floor: String,
}

impl Statements {
    /// The statements of `dialect` on `table` (validated, not yet quoted).
    pub(crate) fn new(dialect: &dyn Dialect, table: &str) -> Self {
        let quoted_floor = quote_with(dialect.quote(), &format!("{table}_floor"));
        let quoted_table = quote_with(dialect.quote(), table);
        let sql = dialect.statements(&quoted_table, &first_token(&quoted_floor));
        Self {
            create: vec![
                dialect.lease_create(&quoted_table).into(),
                floor_table(&quoted_floor).into(),
            ],
            grant: sql.grant.into(),
            release: sql.release.into(),
            renew: sql.renew.into(),
            inspect: sql.inspect.into(),
            waiting: sql.waiting.map(|w| WaitingStatements {
                grant: w.grant.into(),
                mark: w.mark.into(),
                add_column: w.add_column.into(),
            }),
            quoted_table,
            quoted_floor,
        }
    }
}

/// [`WaitingSql`](crate::dialect::WaitingSql) ready to send.
#[derive(Debug)]
pub(crate) struct WaitingStatements {
    /// A waiter's grant: takes the row, or marks it waited for.
    pub(crate) grant: Arc<str>,
    /// Marks a held row waited for (a holder watch).
    pub(crate) mark: Arc<str>,
    /// Adds the mark's column to a table created before it.
    pub(crate) add_column: Arc<str>,
}

/// The statement texts the driver sends for a table, as plain strings: what
/// the benchmark floors (crate `lock-bench`) check their hand-written texts
/// against.
#[doc(hidden)]
#[derive(Clone, Debug, Default)]
pub struct StatementTexts {
    /// The lease table's and token floor's `CREATE`s.
    pub create: Vec<String>,
    /// The row-mode grant.
    pub grant: String,
    /// The row-mode release.
    pub release: String,
    /// The shared tables' `CREATE`s.
    pub shared_create: Vec<String>,
    /// The shared kinds' key-row lock (and read, on MySQL).
    pub shared_lock_key: Vec<String>,
    /// `BEGIN`, `COMMIT`, `ROLLBACK` of a shared grant's transaction.
    pub shared_transaction: [String; 3],
    /// The shared kinds' state read.
    pub shared_state: String,
    /// The holder row's insert.
    pub shared_insert_holder: String,
    /// The shared kinds' release.
    pub shared_release: String,
    /// Session mode's counter `CREATE`, grant and release (none on SQLite).
    pub session: Option<[String; 3]>,
    /// Session mode's server run (PostgreSQL; MySQL dialect: the token
    /// rows, none): the durable run counter's `CREATE`, the read of
    /// whether the run is started, the counter's bump and the sequence's
    /// raise.
    pub session_run: Option<[String; 4]>,
    /// MariaDB 10.3+ session mode (MySQL dialect only): the holder
    /// table's, the run counter's and the run clock's `CREATE`s, the run's
    /// token base read, the try grant and the release.
    pub session_mariadb: Option<[String; 6]>,
    /// PostgreSQL session mode's lean statements, for a session whose
    /// idle timeout and keep-alive are armed for the TTL already: the
    /// lean grant, the lean release (the session's last lock; the
    /// settings stay armed), the release of a session that keeps other
    /// locks, the quiet grant (nothing published) and the bare unlock of
    /// a session that published nothing. `None` elsewhere.
    pub session_lean: Option<[String; 5]>,
}

/// Whether the server `SELECT VERSION()` describes takes session tokens
/// from the run clock (MariaDB 10.3 and later).
#[doc(hidden)]
#[cfg(feature = "mysql")]
pub fn mariadb_has_run_clock(version: &str) -> bool {
    crate::dialect::mysql::has_run_clock(version)
}

/// The statement texts of `dialect` on validated table `table`.
///
/// # Errors
///
/// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for a dialect
/// whose cargo feature is off or a bad table name.
#[doc(hidden)]
pub fn statement_texts(dialect: SqlDialect, table: &str) -> Result<StatementTexts, LockError> {
    crate::config::validate_table(table)?;
    let driver = crate::dialect::of(dialect)?;
    let texts = |v: &[Arc<str>]| v.iter().map(|t| t.to_string()).collect::<Vec<_>>();
    let row = Statements::new(driver, table);
    let shared = crate::keys::shared::SharedSql::new(driver, table);
    let session_sql = crate::dialect::session_of(dialect)
        .map(|d| crate::dialect::session::SessionSql::new(d, table));
    let session_run = session_sql
        .as_ref()
        .ok()
        .and_then(|s| s.run.clone())
        .map(|r| [r.create, r.read, r.bump, r.set]);
    let session_lean = session_sql
        .as_ref()
        .ok()
        .filter(|_| dialect == SqlDialect::Postgres)
        .map(|s| {
            use crate::connection::session::{
                PG_LEAN_RELEASE, PG_QUIET_RELEASE, kept_release, pg_lean_grant, pg_quiet_grant,
            };
            [
                pg_lean_grant(&s.counter),
                PG_LEAN_RELEASE.to_owned(),
                kept_release(dialect, &s.release),
                pg_quiet_grant(&s.counter),
                PG_QUIET_RELEASE.to_owned(),
            ]
        });
    let session = session_sql.ok().map(|s| [s.create, s.grant, s.release]);
    Ok(StatementTexts {
        create: texts(&row.create),
        grant: row.grant.to_string(),
        release: row.release.to_string(),
        shared_create: texts(&shared.create),
        shared_lock_key: texts(&shared.lock_key),
        shared_transaction: [
            shared.begin.to_string(),
            shared.commit.to_string(),
            shared.rollback.to_string(),
        ],
        shared_state: shared.state.to_string(),
        shared_insert_holder: shared.insert_holder.to_string(),
        shared_release: shared.release.to_string(),
        session,
        session_run,
        session_mariadb: mariadb_texts(dialect, table),
        session_lean,
    })
}

/// [`StatementTexts::session_mariadb`].
fn mariadb_texts(dialect: SqlDialect, table: &str) -> Option<[String; 6]> {
    #[cfg(feature = "mysql")]
    if dialect == SqlDialect::MySql {
        let s = crate::dialect::mysql::mariadb_session_sql(table);
        let (m, r) = (s.maria?, s.run?);
        return Some([
            s.create,
            r.create,
            m.create_clock,
            r.read,
            s.grant,
            s.release,
        ]);
    }
    let _ = (dialect, table);
    None
}

/// The connect options the driver opens its row-mode connections with
/// (SQLite's busy timeout and WAL included), for a floor's one bare
/// connection.
///
/// # Errors
///
/// As [`SqlBackend::connect`](crate::SqlBackend::connect) for bad options.
#[doc(hidden)]
pub fn connect_options(config: &SqlConfig) -> Result<DbOptions, LockError> {
    crate::dialect::of(config.dialect)?.connect_options(config)
}

/// Session mode's connect options (the session settings PostgreSQL gets in
/// the startup packet), its backend name and its shortest TTL.
///
/// # Errors
///
/// [`ErrorKind::Config`](lock_core::ErrorKind::Config) on SQLite (no
/// session locks) or for bad options.
#[doc(hidden)]
pub fn session_connect_options(
    config: &SqlConfig,
) -> Result<(DbOptions, &'static str, Duration), LockError> {
    let session = crate::dialect::session_of(config.dialect)?;
    let options = session.session_options(config)?;
    Ok((options, session.session_name(), session.session_min_ttl()))
}

/// `ttl` as session mode's PostgreSQL grant binds it
/// (`idle_session_timeout`, whole milliseconds rounded up).
#[doc(hidden)]
pub fn pg_idle_timeout(ttl: Duration) -> String {
    crate::dialect::session::pg_idle_timeout(ttl)
}

/// A sqlx error as the driver reports it (kind, backend, no password).
#[doc(hidden)]
pub fn map_error(config: &SqlConfig, operation: Operation, err: sqlx::Error) -> LockError {
    crate::error::map_sqlx(config, operation, err).with_backend(crate::config::NAME)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SqlDialect;

    #[test]
    fn table_names_are_quoted_per_dialect() {
        assert_eq!(quote_with('"', "app.locks"), "\"app\".\"locks\"");
        assert_eq!(quote_with('`', "locks"), "`locks`");
        assert_eq!(
            crate::dialect::pg_channel("app.locks"),
            "distlock_app_locks"
        );
        let dialect = crate::dialect::of(SqlDialect::Sqlite).expect("sqlite compiled in");
        let s = Statements::new(dialect, "x");
        assert!(s.grant.contains("INSERT INTO \"x\""));
    }
}
