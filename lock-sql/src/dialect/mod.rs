//! What differs between the databases, behind one trait: each dialect's
//! module ([`postgres`], [`mysql`], [`sqlite`]) holds its SQL text and a
//! [`Profile`], the few behaviours that are its own as data (how a
//! statement's binds are ordered, how a grant reports its token, where
//! "now" comes from, how a batch of renewals says which rows it renewed);
//! the code that runs the lease statements by that data is written once
//! (`run.rs`, over `crate::dialect::binds`).
//!
//! The rest of the crate asks the backend's [`Dialect`] (a `&'static dyn
//! Dialect`, chosen once at connect by [`of`]) instead of matching on the
//! dialect or the connection in every function. The only matches left are
//! this registry, the connection types' own (`crate::connection`,
//! `crate::dialect::binds`) and each dialect's unwrapping of its connection
//! for its session statements.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{Lease, LockError};

use crate::config::NAME;
use crate::config::{SqlConfig, SqlDialect};
use crate::connection::{DbConn, DbOptions};
use crate::dialect::session::SessionSql;
use crate::dialect::session::{
    Granted, KillTarget, Killed, ListPage, OnSession, Publication, ServerKey, SessionGrant,
    SessionLock,
};

#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

pub(crate) mod binds;
mod run;
pub(crate) use run::{GrantValues, LeaseRow};
pub(crate) mod session;

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

/// The lease grant of PostgreSQL and SQLite on table `t` (quoted): inserts
/// the rows `source` yields (a `VALUES` list or a `SELECT`) and takes over
/// an existing row only when it expired by `now`, bumping its token; the
/// rows it wrote answer `returning`. A row still held is left as it is and
/// answers nothing.
pub(crate) fn lease_upsert(t: &str, source: &str, now: &str, returning: &str) -> String {
    format!(
        "INSERT INTO {t} AS l (name, owner, token, expires_at, details) {source} \
         ON CONFLICT (name) DO UPDATE \
         SET owner = excluded.owner, token = l.token + 1, expires_at = excluded.expires_at, \
         details = excluded.details \
         WHERE l.expires_at <= {now} \
         RETURNING {returning}"
    )
}

/// The token floor table `f` (quoted): `id` 1 is its only row.
pub(crate) fn floor_table(f: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {f} (id INTEGER NOT NULL PRIMARY KEY, token BIGINT NOT NULL)"
    )
}

/// A dialect's text of the lease table's statements, which
/// [`Statements::new`](crate::keys::Statements::new) completes (the token
/// floor table, the quoted names).
#[derive(Debug)]
pub(crate) struct LeaseSql {
    pub(crate) grant: String,
    pub(crate) release: String,
    pub(crate) renew: String,
    pub(crate) inspect: String,
    /// How waiters make the release that frees the key notify them
    /// (PostgreSQL); `None` where waiters are not notified.
    pub(crate) waiting: Option<WaitingSql>,
}

/// PostgreSQL's `NOTIFY` serialises the commits that send it (a lock on
/// the notification queue held through the commit's WAL flush), so a
/// release notifies only when someone waits for its key: a waiter retries
/// with [`grant`](Self::grant), which either takes the row or marks it
/// waited for (`waiters_until`) under the same row lock (a fair waiter
/// marks it before its tries), and the release notifies when the mark is
/// live. A release
/// either commits before the waiter's statement (which then takes the
/// row) or after it (and then sees the mark): none is missed.
#[derive(Debug)]
pub(crate) struct WaitingSql {
    /// The waiter's grant: takes the row like the plain grant, or marks it
    /// waited for until now plus [`Arg::MarkFor`]. Binds as the grant,
    /// then [`Arg::MarkFor`].
    pub(crate) grant: String,
    /// Marks the row waited for (a holder watch): binds [`Arg::Key`],
    /// [`Arg::MarkFor`].
    pub(crate) mark: String,
    /// Adds the `waiters_until` column to a table created before it.
    pub(crate) add_column: String,
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

/// The column types and table options of the shared tables in one
/// dialect: their `CREATE TABLE` statements are written once, in
/// [`shared_tables`], and each dialect gives only these words.
#[derive(Debug)]
pub(crate) struct SharedDdl {
    /// The key's name (binary in MySQL, so that names compare byte for byte).
    pub(crate) name: &'static str,
    /// The `shape`, `owner` and `kind` columns.
    pub(crate) shape: &'static str,
    pub(crate) owner: &'static str,
    pub(crate) kind: &'static str,
    /// Counts, limits and tokens.
    pub(crate) int: &'static str,
    /// `expires_at`.
    pub(crate) time: &'static str,
    /// The nullable `details` column: `VARCHAR(`[`DETAILS_LEN`]`)` and
    /// these words after it, or `TEXT` where text has no length (`None`).
    pub(crate) details: Option<&'static str>,
    /// The waiters' `id` column: an ever-growing key, so that arrival
    /// order holds.
    pub(crate) waiter_id: &'static str,
    /// After the keys' and holders' column lists.
    pub(crate) keyed_options: &'static str,
    /// After the waiters' column list.
    pub(crate) waiters_options: &'static str,
    /// Where the waiters' index on `(name, shape, id)` is declared.
    pub(crate) waiters_index: WaitersIndex,
}

/// Where a dialect declares the waiters' index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitersIndex {
    /// Inside the table's column list (MySQL's `INDEX name (...)`).
    Inline,
    /// A `CREATE INDEX` of its own, on the (schema-qualified) table.
    Separate,
    /// A `CREATE INDEX` whose name is schema-qualified, on the table's
    /// last part (SQLite qualifies the index's name, not its table's).
    QualifiedName,
}

/// How a dialect writes placeholders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Params {
    /// Numbered after this prefix (`$1`, `?1`).
    Numbered(&'static str),
    /// `?`, bound in the order they appear.
    Positional,
}

/// The nullable `details` column's type in `ddl`'s dialect.
fn details_column(ddl: &SharedDdl) -> String {
    ddl.details.map_or_else(
        || "TEXT".to_owned(),
        |after| format!("VARCHAR({DETAILS_LEN}){after}"),
    )
}

/// The lease table `t`'s `CREATE TABLE IF NOT EXISTS` in the column types
/// of `ddl` (MySQL/MariaDB and SQLite; PostgreSQL's lease table also
/// keeps its waiters' deadline). `owner` is nullable, with the words
/// `details` is declared nullable with.
pub(crate) fn lease_table(t: &str, ddl: &SharedDdl) -> String {
    let SharedDdl {
        name,
        owner,
        int,
        time,
        keyed_options,
        ..
    } = ddl;
    let nullable = ddl.details.unwrap_or("");
    let details = details_column(ddl);
    format!(
        "CREATE TABLE IF NOT EXISTS {t} (\
         name {name} NOT NULL PRIMARY KEY, \
         owner {owner}{nullable}, \
         token {int} NOT NULL, \
         expires_at {time} NOT NULL, \
         details {details}){keyed_options}"
    )
}

/// The keys, holders and waiters tables' `CREATE TABLE IF NOT EXISTS`
/// statements in the dialect that `ddl` describes.
pub(crate) fn shared_tables(names: &SharedNames, ddl: &SharedDdl) -> Vec<String> {
    let SharedNames {
        keys,
        holders,
        waiters,
        index,
        ..
    } = names;
    let SharedDdl {
        name,
        shape,
        owner,
        kind,
        int,
        time,
        waiter_id,
        keyed_options,
        waiters_options,
        waiters_index,
        details: _,
    } = ddl;
    let details = details_column(ddl);
    let waiters_extra = match waiters_index {
        WaitersIndex::Inline => format!(", INDEX {index} (name, shape, id)"),
        WaitersIndex::Separate | WaitersIndex::QualifiedName => String::new(),
    };
    let mut schema = vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {keys} (\
             name {name} NOT NULL, shape {shape} NOT NULL, \
             token {int} NOT NULL, epoch {int} NOT NULL, \
             PRIMARY KEY (name, shape)){keyed_options}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {holders} (\
             name {name} NOT NULL, shape {shape} NOT NULL, \
             owner {owner} NOT NULL, kind {kind} NOT NULL, \
             cnt {int} NOT NULL, lim {int} NOT NULL, token {int} NOT NULL, \
             expires_at {time} NOT NULL, details {details}, \
             PRIMARY KEY (name, shape, owner)){keyed_options}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {waiters} (\
             id {waiter_id}, \
             name {name} NOT NULL, shape {shape} NOT NULL, \
             owner {owner} NOT NULL, kind {kind} NOT NULL, \
             cnt {int} NOT NULL, lim {int} NOT NULL, \
             expires_at {time} NOT NULL{waiters_extra}){waiters_options}"
        ),
    ];
    let (index, on) = match waiters_index {
        WaitersIndex::Inline => return schema,
        WaitersIndex::Separate => (index, waiters),
        WaitersIndex::QualifiedName => (&names.index_qualified, &names.waiters_unqualified),
    };
    schema.push(format!(
        "CREATE INDEX IF NOT EXISTS {index} ON {on} (name, shape, id)"
    ));
    schema
}

/// What a dialect is, as data: its name, the SQL tokens the shared
/// statements and the admin code splice in, its connection defaults, and
/// how its lease statements bind their values and answer. The code that
/// reads it is written once (the accessors and the lease statements on
/// `dyn Dialect`, in `run.rs`).
#[derive(Debug)]
pub(crate) struct Profile {
    /// The backend's name (`"postgres"`, `"mysql"`, `"sqlite"`).
    pub(crate) name: &'static str,
    /// The identifier quote character.
    pub(crate) quote: char,
    /// The key column as text in a `SELECT` (MySQL stores bytes).
    pub(crate) name_text: &'static str,
    /// The suffix of a `SELECT` that locks the rows it read for the
    /// transaction (none where the transaction holds the database).
    pub(crate) for_update: &'static str,
    /// Whether releases notify waiters through the database (PostgreSQL
    /// `NOTIFY`, sent by the release statement, which then answers a row
    /// per release); otherwise waiters poll.
    pub(crate) notified: bool,
    /// Whether the database has a single writer, so the process's writing
    /// statements take turns (SQLite).
    pub(crate) single_writer: bool,
    /// The default number of connections: to a server or file, and to a
    /// database in memory.
    pub(crate) pool_size: (u32, u32),
    /// Whether connections wait out `busy_timeout` for a locked database
    /// (SQLite): the users' pool waits as long for a connection.
    pub(crate) busy_timeout: bool,
    /// The 64-bit integer type a `CAST` names.
    pub(crate) int_type: &'static str,
    /// "Now" on the database's clock, as stored in `expires_at`.
    pub(crate) now_sql: &'static str,
    /// The microseconds `expires_at` is ahead of now (a `BIGINT`).
    pub(crate) left_micros: &'static str,
    /// Opens a grant transaction (SQLite: `BEGIN IMMEDIATE`, so the
    /// transaction holds the file's write lock from its start).
    pub(crate) begin: &'static str,
    /// Whether the mutex's statements bind "now" ([`Arg::Now`]: SQLite,
    /// the process's clock, finer than SQLite's own) instead of using the
    /// database's clock.
    pub(crate) binds_now: bool,
    /// The lease statements' binds, in the order each text numbers them.
    pub(crate) binds: LeaseBinds,
    /// The shared statements' placeholders (every shared statement binds
    /// its placeholders once each, in the order they appear).
    pub(crate) params: Params,
    /// The text before and after a placeholder of microseconds that makes
    /// "now" plus that many microseconds.
    pub(crate) micros_later: [&'static str; 2],
    /// The shared tables' column types and options.
    pub(crate) shared: SharedDdl,
}

/// One value a lease statement binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arg {
    /// The key, as text.
    Key,
    /// The key, as bytes (MySQL's `VARBINARY` column).
    KeyBytes,
    /// The owner (hex).
    Owner,
    /// The lease's token.
    Token,
    /// The TTL in µs.
    Ttl,
    /// "Now" in µs on the process's clock ([`Profile::binds_now`]).
    Now,
    /// This process's encoded holder details.
    Details,
    /// The release's notification channel.
    Channel,
    /// The fair grant's waiter id (bound only by the fair grant).
    Ahead,
    /// The key as bytes once more, bound only by the fair grant (MySQL's
    /// waiter gate names it again).
    AheadKeyBytes,
    /// How long a waiter's mark lasts, in µs (bound only by a waiter's
    /// grant and a watch's mark, see [`WaitingSql`]).
    MarkFor,
}

/// How a dialect's lease statements bind ([`Dialect::statements`] texts;
/// the grant's also for [`Dialect::fair_grant_sql`]) and answer.
#[derive(Debug)]
pub(crate) struct LeaseBinds {
    pub(crate) grant: &'static [Arg],
    pub(crate) release: &'static [Arg],
    pub(crate) renew: &'static [Arg],
    pub(crate) inspect: &'static [Arg],
    /// How the grant reports its token.
    pub(crate) grant_reply: GrantReply,
    /// How a batch renewal ([`Dialect::renew_batch_sql`]) binds its rows
    /// and says which it renewed.
    pub(crate) batch: Batch,
}

/// How a grant reports its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GrantReply {
    /// A `RETURNING token` row when granted, none when held.
    Returning,
    /// `LAST_INSERT_ID(expr)` in the OK packet, 0 when held (MySQL: row
    /// counts cannot tell, sqlx sets `CLIENT_FOUND_ROWS`).
    LastInsertId,
}

/// How a batch renewal binds its leases and answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Batch {
    /// Three arrays (PostgreSQL `unnest`): binds TTL µs, names, owners,
    /// tokens; one text for any size; returns the renewed rows.
    Arrays,
    /// Rows spliced as placeholders ([`spliced_batch`], padded to a power
    /// of two with the last lease): binds `lead`, every (key, owner,
    /// token), then every key, the key as `key` says; `returns` the
    /// renewed rows (SQLite), or only how many matched (MySQL).
    Spliced {
        lead: &'static [Arg],
        key: Arg,
        returns: bool,
    },
}

/// One database's SQL text and behaviours.
///
/// Every value is bound; the only text spliced into SQL is the validated,
/// quoted table name.
pub(crate) trait Dialect: Send + Sync + std::fmt::Debug + 'static {
    /// What this dialect is, as data.
    fn profile(&self) -> &'static Profile;

    /// The lease table's statements for `table` (quoted), `first` the
    /// token of a row the grant inserts ([`first_token`] of the floor).
    fn statements(&self, table: &str, first: &str) -> LeaseSql;

    /// Creates the lease table `table` (quoted) if missing: the shared
    /// column types' table, or a dialect's own.
    fn lease_create(&self, table: &str) -> String {
        lease_table(table, &self.profile().shared)
    }

    /// The lease table's `details` column, for a table created before it
    /// existed (run only when a probe found it missing).
    fn add_details_sql(&self, table: &str) -> String {
        format!("ALTER TABLE {table} ADD COLUMN details VARCHAR({DETAILS_LEN})")
    }

    /// The predicate "the key starts with the bound `param`", and whether
    /// the bound value is a `LIKE` pattern (wildcards escaped with `!`).
    fn prefix_predicate(&self, param: &str) -> (String, bool) {
        (format!("name LIKE {param} ESCAPE '!'"), true)
    }

    /// How `gc` holds off every grant on `table` with floor `floor` (both
    /// quoted) while it runs, waiting at most `wait_ms` for the table.
    fn gc_lock(&self, table: &str, floor: &str, wait_ms: u128) -> GcLock {
        let _ = (table, floor, wait_ms);
        GcLock {
            begin: vec![self.profile().begin.to_owned()],
            commit: vec!["COMMIT".to_owned()],
            abort: vec!["ROLLBACK".to_owned()],
        }
    }

    /// Raises the floor to the bound token (never lowers it); returns the
    /// floor. Binds: token.
    fn raise_floor_sql(&self, floor: &str) -> String;

    /// The ownership predicate on `table` (quoted), placeholders (key,
    /// owner, token) from `first` (see `crate::guarded`).
    fn owner_predicate(&self, table: &str, first: usize) -> String;

    /// A statement that returns one row while the ownership predicate on
    /// `table` (quoted, placeholders from 1) holds, none otherwise.
    fn owner_check_sql(&self, table: &str) -> String {
        format!("SELECT 1 WHERE {}", self.owner_predicate(table, 1))
    }

    /// The batch renewal statement for `rows` leases (see `crate::renewal`).
    fn renew_batch_sql(&self, table: &str, rows: usize) -> String;

    /// sqlx's connect options for `config`.
    fn connect_options(&self, config: &SqlConfig) -> Result<DbOptions, LockError>;

    /// How a set of `n` keys is taken all or nothing on lease table `table`
    /// (quoted); with `waiters` (quoted, fair mode) only while none of the
    /// keys has a live mutex waiter; `first` as for [`statements`](Self::statements).
    /// See [`GrantAll`].
    fn grant_all_sql(&self, table: &str, first: &str, waiters: Option<&str>, n: usize) -> GrantAll;

    /// The fair grant on lease table `table` (quoted) with the waiters
    /// table `waiters` (quoted): the grant statement, gated on no live
    /// mutex waiter (`shape = 'mutex'`) of the key with a smaller id than
    /// the bound one. Binds as the grant's, with [`Arg::Ahead`] (and
    /// [`Arg::AheadKeyBytes`]) where its [`LeaseBinds::grant`] puts them;
    /// `first` as for [`statements`](Self::statements).
    fn fair_grant_sql(&self, table: &str, first: &str, waiters: &str) -> String;

    // The read-write locks' and semaphores' tables (crate::shared): the
    // statements are written once there with the tokens below and in the
    // profile, which each dialect spells its own way.

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
    /// shape, owner, kind, count, limit, TTL µs (first statement). Where
    /// waiters are notified ([`WaitingSql`]), it also marks the key's row
    /// of lease table `lease` waited for during the waiter row's TTL.
    fn insert_waiter_sql(&self, waiters: &str, lease: &str) -> Vec<String>;

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

/// The Config error of a dialect whose cargo feature is off.
fn without_feature(dialect: SqlDialect) -> LockError {
    LockError::config(format!(
        "lock-sql was built without its `{dialect}` feature"
    ))
    .with_backend(NAME)
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
    found.ok_or_else(|| without_feature(dialect))
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

/// The host's wall clock in microseconds since the Unix epoch (SQLite's
/// "database clock", bound by its mutex statements).
pub(crate) fn unix_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, micros)
}

/// Microseconds in `d`, saturating.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A remaining TTL the database reported in microseconds (none left when
/// negative).
pub(crate) fn remaining(micros: i64) -> Duration {
    Duration::from_micros(u64::try_from(micros).unwrap_or(0))
}

/// A lease's token as the database stores it.
pub(crate) fn token_of(lease: &Lease) -> i64 {
    i64::try_from(lease.token().get()).unwrap_or(i64::MAX)
}

/// The driver URL of `config` parsed as a database's sqlx connect options
/// (a Config error when sqlx refuses it).
pub(crate) fn parse_options<O>(config: &SqlConfig) -> Result<O, LockError>
where
    O: std::str::FromStr<Err = sqlx::Error>,
{
    config.driver_url().parse().map_err(bad_option(config))
}

/// The bad-option error of a driver URL sqlx refused.
fn bad_option(config: &SqlConfig) -> impl Fn(sqlx::Error) -> LockError + '_ {
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
pub(crate) trait SessionDialect: Dialect {
    /// What this dialect's session mode is, as data.
    fn session_profile(&self) -> &'static SessionProfile;

    /// The session statements of lease table `table` (validated, not
    /// quoted); the token counter is named with the profile's
    /// `counter_suffix`.
    fn session_sql(&self, table: &str) -> SessionSql;

    /// How to open a session: the driver URL plus the per-session settings
    /// that travel in the handshake.
    fn session_options(&self, config: &SqlConfig) -> Result<DbOptions, LockError>;

    /// The idle timeout, in whole seconds, that makes the server end the
    /// session after `ttl` of silence, no earlier, where that takes a
    /// statement of its own ([`arm_idle_timeout`](Self::arm_idle_timeout),
    /// MySQL `SET wait_timeout`); `None` where the grant statement sets it
    /// (PostgreSQL). Plain data, so a grant that needs no statement does
    /// not build and box a future to find out.
    fn idle_timeout_secs(&self, ttl: Duration) -> Option<u64>;

    /// Sets the idle timeout [`idle_timeout_secs`](Self::idle_timeout_secs)
    /// asked for (the caller skips it when the session has it already).
    /// Never called where `idle_timeout_secs` is always `None` (the grant
    /// statement sets it): there, nothing to do.
    async fn arm_idle_timeout(&self, conn: &mut DbConn, secs: u64) -> SqlxResult<()> {
        let _ = (conn, secs);
        Ok(())
    }

    /// One grant statement (a try, or a wait on the server, as `grant`
    /// says); the token in the same statement.
    async fn session_grant(
        &self,
        on: OnSession<'_>,
        grant: &SessionGrant<'_>,
    ) -> SqlxResult<Granted>;

    /// Releases the lock; `true` when this session held it.
    async fn session_release(&self, on: OnSession<'_>, key: &ServerKey) -> SqlxResult<bool>;

    /// Publishes a grant once it has been held for the publication delay,
    /// only while this session holds the lock: MariaDB writes its holder
    /// row (see `grants::session`, "Lazy holder rows"; whether it was
    /// written, for the release to delete), PostgreSQL sets
    /// `application_name` for a quiet grant ("Published grants"; `false`).
    /// Nothing where the grant publishes itself (MySQL's token rows):
    /// `false`.
    async fn session_publish(
        &self,
        on: OnSession<'_>,
        publication: &Publication<'_>,
    ) -> SqlxResult<bool>;

    /// Deletes the holder row a publication wrote for the grant `token`
    /// of `key` (run by its release, on the same session).
    async fn session_withdraw(&self, on: OnSession<'_>, key: &[u8], token: u64) -> SqlxResult<()>;

    /// The keep-alive: does this session still hold the lock?
    async fn session_holds(&self, on: OnSession<'_>, key: &ServerKey) -> SqlxResult<bool>;

    /// Who holds the lock: `(server session id, owner hex, token)`; owner
    /// and token only when the holder is one of ours.
    async fn session_inspect(
        &self,
        on: OnSession<'_>,
        lock: SessionLock<'_>,
    ) -> SqlxResult<Option<SessionHolder>>;

    /// Ends session `victim`, waiting for a grant to `owner`, on the server
    /// from `conn`. Where the server reuses session ids (PostgreSQL's are
    /// process ids) the session must also still show `owner` as waiting,
    /// so that a new session that took over the id is never ended.
    async fn kill_session(&self, conn: &mut DbConn, victim: i64, owner: &str) -> SqlxResult<()>;

    /// `force_release`: ends the target's session only if it still holds
    /// the lock as the grant `inspect` reported and, where the server can
    /// tell (PostgreSQL), holds no other lock; then waits (up to the
    /// target's `wait`) for the server to free the lock.
    async fn kill_holder(&self, on: OnSession<'_>, target: KillTarget<'_>) -> SqlxResult<Killed>;

    /// One `list` page (see [`ListPage`] and [`SessionListed`]); `None`
    /// where the server keeps no per-key row to list (PostgreSQL).
    async fn session_list(
        &self,
        on: OnSession<'_>,
        page: ListPage<'_>,
    ) -> SqlxResult<Option<Vec<SessionListed>>> {
        let _ = (on, page);
        Ok(None)
    }

    /// The base this session adds to its tokens, read once before its
    /// first grant (see [`RunSql`](crate::dialect::session::RunSql)):
    /// MariaDB's `epoch << 40`; 0 on PostgreSQL (the sequence carries the
    /// epoch) and MySQL's token rows; `None` when the server's current run
    /// has not been started yet ([`start_run`](Self::start_run)).
    async fn session_run(&self, on: OnSession<'_>) -> SqlxResult<Option<i64>>;

    /// Starts the server's current run, on a connection the caller opened
    /// for it alone and drops afterwards; nothing without runs (MySQL's
    /// token rows).
    async fn start_run(&self, on: OnSession<'_>) -> SqlxResult<()>;

    /// Whether `err` says a table or sequence does not exist (yet: the
    /// first connect creates them after its first session opened).
    fn is_missing_relation(&self, err: &sqlx::Error) -> bool;

    /// Creates the token counter (when `create`) and checks it: a problem
    /// found is returned as text.
    async fn prepare_session_schema(
        &self,
        on: OnSession<'_>,
        create: bool,
    ) -> SqlxResult<Option<String>>;
}

/// What a sqlx call returns.
pub(crate) type SqlxResult<T> = Result<T, sqlx::Error>;

/// A dialect's session mode, as data.
#[derive(Debug)]
pub(crate) struct SessionProfile {
    /// The backend's name in session mode (`"postgres-session"`, ...).
    pub(crate) name: &'static str,
    /// The shortest TTL the server's idle timeout can express.
    pub(crate) min_ttl: Duration,
    /// Where the session tokens are counted (the statements'
    /// [`SessionSql::fencing`](crate::dialect::session::SessionSql::fencing)
    /// starts from it; MariaDB's sequence counts for every key).
    pub(crate) fencing: lock_core::FencingScope,
    /// Whether the grant writes holder details that `session_inspect`
    /// reads back (MySQL/MariaDB: the token row).
    pub(crate) details: bool,
    /// Appended to the lease table's name, the token counter's (a
    /// sequence on PostgreSQL, a table on MySQL).
    pub(crate) counter_suffix: &'static str,
}

impl dyn SessionDialect {
    /// The backend's name in session mode.
    pub(crate) fn session_name(&self) -> &'static str {
        self.session_profile().name
    }

    /// The shortest TTL the server's idle timeout can express.
    pub(crate) fn session_min_ttl(&self) -> Duration {
        self.session_profile().min_ttl
    }

    /// Whether the grant writes holder details that `session_inspect`
    /// reads back.
    pub(crate) fn session_details(&self) -> bool {
        self.session_profile().details
    }
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
    /// Held by a session that shows no grant of ours yet: a grant whose
    /// publication is still to come (MariaDB's holder row, PostgreSQL's
    /// quiet grant), or another client's lock.
    pub(crate) unpublished: bool,
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
    found.ok_or_else(|| without_feature(dialect))
}

/// The connections' size: `pool_size`, or the dialect's default (10;
/// SQLite file: 4; in memory: 1, the one connection that keeps the database
/// alive).
pub(crate) fn pool_size(config: &SqlConfig) -> u32 {
    let default =
        of(config.dialect).map_or(10, |dialect| dialect.default_pool_size(config.is_memory()));
    config.pool_size.unwrap_or(default)
}

/// Quotes each part of a validated (schema-qualified) name with `quote`.
pub(crate) fn quote_with(quote: char, table: &str) -> String {
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
