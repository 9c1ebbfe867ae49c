//! What differs between the databases, behind one trait: each dialect's
//! module ([`postgres`], [`mysql`], [`sqlite`]) holds its SQL text and the
//! few behaviours that are its own (how a statement's binds are ordered,
//! how a grant reports its token, where "now" comes from, how a batch of
//! renewals says which rows it renewed, how connections are opened).
//!
//! The rest of the crate asks the backend's [`Dialect`] (a `&'static dyn
//! Dialect`, chosen once at connect by [`of`]) instead of matching on the
//! dialect or the connection in every function. The only matches left are
//! this registry and each dialect's own unwrapping of its connection.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{Lease, LockError, LockKey};

use crate::config::{SqlConfig, SqlDialect};
use crate::conn::{DbConn, DbOptions, DbPool};
use crate::driver::NAME;
use crate::session::conn::{Granted, Killed, ServerKey};
use crate::session::sql::SessionSql;
use crate::sql::Statements;

#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

/// Rows renewed by one batch statement: (name, owner, token).
pub(crate) type Renewed = HashSet<(String, String, i64)>;

/// The current unexpired holder: (owner, token, remaining µs, holder
/// details as the grant wrote them).
pub(crate) type Holder = (Option<String>, i64, i64, Option<String>);

/// The width of the lease table's `details` column: the longest encoded
/// [`lock_core::HolderDetails`].
pub(crate) const DETAILS_LEN: usize = lock_core::MAX_ENCODED_LEN;

/// The token of a lease row the grant inserts: one above the token floor
/// that `gc` raised before it removed rows (`f`, quoted, holds at most one
/// row; none until the first collection: 1).
pub(crate) fn first_token(f: &str) -> String {
    format!("(SELECT COALESCE(MAX(token), 0) + 1 FROM {f})")
}

/// The token floor table `f` (quoted): `id` 1 is its only row.
pub(crate) fn floor_table(f: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {f} (id INTEGER NOT NULL PRIMARY KEY, token BIGINT NOT NULL)"
    )
}

/// How `gc` keeps the lease table to itself while it raises the floor and
/// removes rows: statements to start, to finish, and to abandon its run.
#[derive(Debug)]
pub(crate) struct GcLock {
    pub(crate) begin: Vec<String>,
    pub(crate) commit: Vec<String>,
    pub(crate) abort: Vec<String>,
}

/// The quoted names of the shared tables of one lease table.
#[derive(Debug)]
pub(crate) struct SharedNames {
    /// `t_keys`, `t_holders`, `t_waiters`, schema-qualified when `t` is.
    pub(crate) keys: String,
    pub(crate) holders: String,
    pub(crate) waiters: String,
    /// The waiters table's last part alone.
    pub(crate) waiters_unqualified: String,
    /// The waiters' index: its name alone, and schema-qualified.
    pub(crate) index: String,
    pub(crate) index_qualified: String,
}

/// One database's SQL text and behaviours.
///
/// Every value is bound; the only text spliced into SQL is the validated,
/// quoted table name.
#[async_trait]
pub(crate) trait Dialect: Send + Sync + std::fmt::Debug + 'static {
    /// The backend's name (`"postgres"`, `"mysql"`, `"sqlite"`).
    fn name(&self) -> &'static str;

    /// The identifier quote character.
    fn quote(&self) -> char {
        '"'
    }

    /// The lock statements for `table` with its token floor table `floor`
    /// (both already quoted).
    fn statements(&self, table: &str, floor: &str) -> Statements;

    /// The lease table's `details` column, for a table created before it
    /// existed (run only when a probe found it missing).
    fn add_details_sql(&self, table: &str) -> String {
        format!("ALTER TABLE {table} ADD COLUMN details VARCHAR({DETAILS_LEN})")
    }

    /// The key column as text in a `SELECT` (MySQL stores bytes).
    fn name_text(&self) -> &'static str {
        "name"
    }

    /// The predicate "the key starts with the bound `param`", and whether
    /// the bound value is a `LIKE` pattern (wildcards escaped with `!`).
    fn prefix_predicate(&self, param: &str) -> (String, bool) {
        (format!("name LIKE {param} ESCAPE '!'"), true)
    }

    /// "Now" bound by the statement, in the µs `expires_at` stores, where
    /// the mutex's statements bind it (SQLite: the process's clock, finer
    /// than SQLite's own); `None` where the database's clock is used.
    fn bound_now(&self) -> Option<i64> {
        None
    }

    /// The suffix of a `SELECT` that locks the rows it read for the
    /// transaction (none where the transaction holds the database).
    fn for_update(&self) -> &'static str {
        " FOR UPDATE"
    }

    /// How `gc` holds off every grant on `table` with floor `floor` (both
    /// quoted) while it runs, waiting at most `wait_ms` for the table.
    fn gc_lock(&self, table: &str, floor: &str, wait_ms: u128) -> GcLock {
        let _ = (table, floor, wait_ms);
        GcLock {
            begin: vec![self.begin_sql().to_owned()],
            commit: vec!["COMMIT".to_owned()],
            abort: vec!["ROLLBACK".to_owned()],
        }
    }

    /// Raises the floor to the bound token (never lowers it); returns the
    /// floor. Binds: token.
    fn raise_floor_sql(&self, floor: &str) -> String;

    /// Whether releases notify waiters through the database (PostgreSQL
    /// `NOTIFY`); otherwise waiters poll.
    fn notified(&self) -> bool {
        false
    }

    /// The default number of connections.
    fn default_pool_size(&self, memory: bool) -> u32 {
        let _ = memory;
        10
    }

    /// Whether the database has a single writer, so the process's writing
    /// statements take turns (SQLite).
    fn single_writer(&self) -> bool {
        false
    }

    /// The fence predicate on `table` (quoted), placeholders from `first`.
    fn fence_predicate(&self, table: &str, first: usize) -> String;

    /// The batch renewal statement for `rows` leases (see renew_many.rs).
    fn renew_batch_sql(&self, table: &str, rows: usize) -> String;

    /// How many rows a batch of `leases` is sent as (padded to a power of
    /// two where the rows are spliced as placeholders).
    fn batch_rows(&self, leases: usize) -> usize {
        leases.next_power_of_two()
    }

    /// sqlx's connect options for `config`.
    fn connect_options(&self, config: &SqlConfig) -> Result<DbOptions, LockError>;

    /// sqlx's connect options for `config` and the users' pool (opened
    /// lazily) on the same options.
    fn open(&self, config: &SqlConfig) -> Result<(DbOptions, DbPool), LockError>;

    /// The grant: `Some(token)` when the row was inserted or an expired one
    /// taken over, `None` when someone holds it. `ahead` is `Some(id)` for
    /// the fair statement ([`Dialect::fair_grant_sql`]): it grants only
    /// when no live mutex waiter with an id below `id` waits for the key.
    async fn grant(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        key: &LockKey,
        owner: &str,
        ttl: Duration,
        ahead: Option<i64>,
    ) -> Result<Option<i64>, sqlx::Error>;

    /// How a set of `n` keys is taken all or nothing on lease table `table`
    /// (quoted); with `waiters` (quoted, fair mode) only while none of the
    /// keys has a live mutex waiter. See [`GrantAll`].
    fn grant_all_sql(&self, table: &str, floor: &str, waiters: Option<&str>, n: usize) -> GrantAll;

    /// The fair grant on lease table `table` (quoted) with the waiters
    /// table `waiters` (quoted): the grant statement, gated on no live
    /// mutex waiter (`shape = 'mutex'`) of the key with a smaller id than
    /// the bound one. Binds as the grant's, then that id.
    fn fair_grant_sql(&self, table: &str, floor: &str, waiters: &str) -> String;

    /// The guarded release: whether it matched our row (PostgreSQL
    /// notifies `channel` in the same statement).
    async fn release(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        key: &LockKey,
        owner: &str,
        token: i64,
        channel: &str,
    ) -> Result<bool, sqlx::Error>;

    /// The renewal: rows matched (1 when still ours and unexpired).
    async fn renew(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        key: &LockKey,
        owner: &str,
        token: i64,
        ttl: Duration,
    ) -> Result<u64, sqlx::Error>;

    /// The current unexpired holder of `key`.
    async fn inspect(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        key: &LockKey,
    ) -> Result<Option<Holder>, sqlx::Error>;

    /// One batch renewal of `group` (`rows` placeholder rows, the last
    /// lease repeated as padding): the renewed rows, or `None` when the
    /// database only says that fewer rows than leases matched (MySQL).
    async fn renew_batch(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        group: &[&Lease],
        owners: &[String],
        ttl: Duration,
        rows: usize,
    ) -> Result<Option<Renewed>, sqlx::Error>;

    /// Runs one statement without binds (schema creation, `SELECT 1`).
    async fn plain(&self, conn: &mut DbConn, sql: &Arc<str>) -> Result<(), sqlx::Error>;

    // The read-write locks' and semaphores' tables (crate::shared): the
    // statements are written once there with the tokens below, which each
    // dialect spells its own way.

    /// The `n`th (1-based) placeholder; every shared statement binds its
    /// placeholders once each, in the order they appear.
    fn param(&self, n: usize) -> String;

    /// The 64-bit integer type a `CAST` names.
    fn int_type(&self) -> &'static str {
        "BIGINT"
    }

    /// "Now" on the database's clock, as stored in `expires_at`.
    fn now_sql(&self) -> &'static str;

    /// `now` plus `micros` (a placeholder) microseconds.
    fn plus_micros(&self, micros: &str) -> String;

    /// The microseconds `expires_at` is ahead of now (a `BIGINT`).
    fn left_micros(&self) -> &'static str;

    /// The shared tables' `CREATE .. IF NOT EXISTS` statements.
    fn shared_schema(&self, names: &SharedNames) -> Vec<String>;

    /// Opens a grant transaction (SQLite: `BEGIN IMMEDIATE`, so the
    /// transaction holds the file's write lock from its start).
    fn begin_sql(&self) -> &'static str {
        "BEGIN"
    }

    /// Makes sure the key's counter row exists, locks it for the
    /// transaction and adds a bump to its counter; the last statement
    /// returns `(token, epoch)`. Binds: name, shape, bump (the first
    /// statement), name, shape (the others).
    fn lock_key_sql(&self, keys: &str) -> Vec<String>;

    /// The same for a reader, in share mode (no bump): readers' decisions
    /// run side by side, exclusive ones wait for them. Binds: name, shape
    /// (each statement). `None` where there is no row share lock.
    fn lock_key_shared_sql(&self, keys: &str) -> Option<Vec<String>> {
        let _ = keys;
        None
    }

    /// Inserts a waiter row; the last statement returns its id. Binds: name,
    /// shape, owner, kind, count, limit, TTL µs (first statement).
    fn insert_waiter_sql(&self, waiters: &str) -> Vec<String>;

    /// A statement that changes rows of `table` (`UPDATE`/`DELETE`),
    /// extended so that the database wakes waiters of the changed key
    /// (PostgreSQL: `pg_notify(<next placeholder>, name)` of each changed
    /// row, so it returns one row per change). `None`: no notification
    /// (waiters poll; the process's own are woken locally).
    fn notifying(&self, statement: &str) -> Option<String> {
        let _ = statement;
        None
    }
}

/// A multi-key grant (`try_acquire_all`), all or nothing, as a dialect runs it.
#[derive(Debug)]
pub(crate) enum GrantAll {
    /// One statement (PostgreSQL): binds owner, TTL µs, the number of keys,
    /// every name, then the holder details; returns `(name, token)` of every key or no row, and
    /// fails with SQLSTATE 22012 (rolled back) when only some were free.
    One(String),
    /// One transaction: `begin`; `check` (fair mode; binds every name)
    /// counts the keys' live waiters, any means none granted; `upsert`
    /// (binds as `rows` says) takes every free key and, when `returns`, its
    /// `(name, token)` rows are the grants; otherwise `read` (binds every
    /// name) returns `(name, owner, token)` of the keys, locked, ours where
    /// granted. Anything short of every key rolls back.
    Transaction {
        begin: &'static str,
        check: Option<String>,
        upsert: String,
        rows: UpsertBinds,
        returns: bool,
        read: Option<String>,
    },
}

/// The binds of a [`GrantAll::Transaction`] upsert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UpsertBinds {
    /// (name, owner, TTL µs, holder details) per key (MySQL's positional `?`).
    PerRow,
    /// now (µs), TTL µs, owner, every name, then the holder details
    /// (SQLite's `?n`).
    NowTtlOwnerNames,
}

/// `n` placeholders `?`, comma-separated.
pub(crate) fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// The dialect of `dialect`, or a Config error when its cargo feature is
/// off.
pub(crate) fn of(dialect: SqlDialect) -> Result<&'static dyn Dialect, LockError> {
    let found: Option<&'static dyn Dialect> = match dialect {
        #[cfg(feature = "postgres")]
        SqlDialect::Postgres => Some(&postgres::Postgres),
        #[cfg(feature = "mysql")]
        SqlDialect::MySql => Some(&mysql::MySql),
        #[cfg(feature = "sqlite")]
        SqlDialect::Sqlite => Some(&sqlite::Sqlite),
        #[allow(unreachable_patterns)] // with every feature on
        _ => None,
    };
    found.ok_or_else(|| {
        LockError::config(format!(
            "lock-sql was built without its `{dialect}` feature"
        ))
        .with_backend(NAME)
    })
}

/// The SQL text of a statement (sqlx takes ownership of it; an `Arc` is
/// not copied).
pub(crate) fn text(sql: &Arc<str>) -> sqlx::AssertSqlSafe<Arc<str>> {
    sqlx::AssertSqlSafe(Arc::clone(sql))
}

/// The error of a connection handed to another dialect's code (never
/// happens: a backend's connections are opened from its dialect's
/// options).
pub(crate) fn wrong_conn(dialect: &str) -> sqlx::Error {
    sqlx::Error::Protocol(format!("not a {dialect} connection"))
}

/// Microseconds in `d`, saturating.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A lease's token as the database stores it.
pub(crate) fn token_of(lease: &Lease) -> i64 {
    i64::try_from(lease.token().get()).unwrap_or(i64::MAX)
}

/// The bad-option error of a driver URL sqlx refused.
pub(crate) fn bad_option(config: &SqlConfig) -> impl Fn(sqlx::Error) -> LockError + '_ {
    move |e| {
        LockError::config(config.scrub(&format!(
            "the {} driver rejected {}: {e}",
            config.dialect,
            config.redacted_url()
        )))
        .with_backend(NAME)
    }
}

/// `(set, now)` of a renewal statement, and the `WHERE (name, owner, token)
/// IN (...)` form with its rows spliced as placeholders `param()` (bound
/// in this order: every (name, owner, token), then every name).
pub(crate) fn spliced_batch(
    table: &str,
    set: &str,
    now: &str,
    rows: usize,
    values: &str,
    returning: &str,
    mut param: impl FnMut() -> String,
) -> String {
    let triples: Vec<String> = (0..rows)
        .map(|_| {
            let (name, owner, token) = (param(), param(), param());
            format!("({name}, {owner}, {token})")
        })
        .collect();
    let names: Vec<String> = (0..rows).map(|_| param()).collect();
    format!(
        "UPDATE {table} SET expires_at = {set} \
         WHERE (name, owner, token) IN ({values}{}) AND name IN ({}) AND expires_at > {now}{returning}",
        triples.join(", "),
        names.join(", ")
    )
}

/// What differs between the databases in session mode (PostgreSQL and
/// MySQL/MariaDB; SQLite has no server session): the session statements'
/// text and binds, the session settings, the name, shortest TTL and
/// fencing scope. Implemented by the same per-database types as
/// [`Dialect`], in their modules.
#[async_trait]
pub(crate) trait SessionDialect: Send + Sync + std::fmt::Debug + 'static {
    /// The backend's name in session mode (`"postgres-session"`, ...).
    fn session_name(&self) -> &'static str;

    /// The shortest TTL the server's idle timeout can express.
    fn session_min_ttl(&self) -> Duration;

    /// Where the session tokens are counted.
    fn session_fencing(&self) -> lock_core::FencingScope;

    /// The session statements for lease table `table` (validated).
    fn session_sql(&self, table: &str) -> SessionSql;

    /// How to open a session: the driver URL plus the per-session settings
    /// that travel in the handshake.
    fn session_options(&self, config: &SqlConfig) -> Result<DbOptions, LockError>;

    /// Makes the server end the session after `ttl` of silence, no earlier,
    /// where that takes a statement of its own (MySQL `SET wait_timeout`,
    /// only when `armed`, the value set before, differs).
    async fn arm_idle_timeout(
        &self,
        conn: &mut DbConn,
        armed: &mut Option<u64>,
        ttl: Duration,
    ) -> Result<(), sqlx::Error>;

    /// One grant statement: a try when `wait` is `None`, else a wait of up
    /// to that long on the server; the token in the same statement.
    #[allow(clippy::too_many_arguments)]
    async fn session_grant(
        &self,
        conn: &mut DbConn,
        sql: &SessionSql,
        key: &[u8],
        server_key: &ServerKey,
        owner: &str,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Granted, sqlx::Error>;

    /// Releases the lock; `true` when this session held it.
    async fn session_release(
        &self,
        conn: &mut DbConn,
        sql: &SessionSql,
        server_key: &ServerKey,
    ) -> Result<bool, sqlx::Error>;

    /// The keep-alive: does this session still hold the lock?
    async fn session_holds(
        &self,
        conn: &mut DbConn,
        sql: &SessionSql,
        server_key: &ServerKey,
    ) -> Result<bool, sqlx::Error>;

    /// Who holds the lock: `(server session id, owner hex, token)`; owner
    /// and token only when the holder is one of ours.
    async fn session_inspect(
        &self,
        conn: &mut DbConn,
        sql: &SessionSql,
        key: &[u8],
        server_key: &ServerKey,
    ) -> Result<Option<SessionHolder>, sqlx::Error>;

    /// Ends session `victim` on the server from `conn`.
    async fn kill_session(&self, conn: &mut DbConn, victim: i64) -> Result<(), sqlx::Error>;

    /// `force_release`: ends session `victim` only if it still holds the
    /// lock of `server_key` as the grant `inspect` reported (`token`) and,
    /// where the server can tell (PostgreSQL), holds no other lock; then
    /// waits (up to `wait`) for the server to free the lock.
    #[allow(clippy::too_many_arguments)]
    async fn kill_holder(
        &self,
        conn: &mut DbConn,
        sql: &SessionSql,
        key: &[u8],
        server_key: &ServerKey,
        victim: i64,
        owner: &str,
        token: u64,
        wait: Duration,
    ) -> Result<Killed, sqlx::Error>;

    /// Whether the grant writes holder details that `session_inspect`
    /// reads back (MySQL/MariaDB: the token row).
    fn session_details(&self) -> bool {
        false
    }

    /// One `list` page: at most `limit` token rows whose key starts with
    /// `prefix`, after `after`, in key order (see [`SessionListed`]);
    /// `None` where the server keeps no per-key row to list (PostgreSQL).
    async fn session_list(
        &self,
        conn: &mut DbConn,
        sql: &SessionSql,
        prefix: &str,
        after: &str,
        limit: i64,
    ) -> Result<Option<Vec<SessionListed>>, sqlx::Error> {
        let _ = (conn, sql, prefix, after, limit);
        Ok(None)
    }

    /// Creates the token counter (when `create`) and checks it: a problem
    /// found is returned as text.
    async fn prepare_session_schema(
        &self,
        conn: &mut DbConn,
        sql: &SessionSql,
        create: bool,
    ) -> Result<Option<String>, sqlx::Error>;
}

/// A session lock's holder.
#[derive(Clone, Debug, Default)]
pub(crate) struct SessionHolder {
    /// The server session id holding the lock.
    pub(crate) session: i64,
    /// Owner hex and token: only when the holder is one of our grants.
    pub(crate) owner: Option<String>,
    pub(crate) token: Option<u64>,
    /// The encoded holder details its grant wrote (MySQL/MariaDB).
    pub(crate) details: Option<String>,
}

/// One token row of a session-mode `list` page: the key as stored, and
/// its holder when the lock is held by the connection of the row's last
/// grant (`None`: scanned, not held as that grant).
pub(crate) type SessionListed = (Vec<u8>, Option<SessionHolder>);

/// The session half of `dialect`, or a Config error (SQLite, or a
/// dialect whose cargo feature is off).
pub(crate) fn session_of(dialect: SqlDialect) -> Result<&'static dyn SessionDialect, LockError> {
    let found: Option<&'static dyn SessionDialect> = match dialect {
        #[cfg(feature = "postgres")]
        SqlDialect::Postgres => Some(&postgres::Postgres),
        #[cfg(feature = "mysql")]
        SqlDialect::MySql => Some(&mysql::MySql),
        SqlDialect::Sqlite => {
            return Err(LockError::config(
                "mode=session needs a database server (PostgreSQL or MySQL/MariaDB): \
                 SQLite has no server session to hold a lock",
            )
            .with_backend("sqlite"));
        }
        #[allow(unreachable_patterns)] // with every feature on
        _ => None,
    };
    found.ok_or_else(|| {
        LockError::config(format!(
            "lock-sql was built without its `{dialect}` feature"
        ))
        .with_backend(NAME)
    })
}
