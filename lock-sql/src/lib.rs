//! The SQL driver of the distlock family: a unique-row lease table on
//! PostgreSQL, MySQL/MariaDB and SQLite, through sqlx connections.
//!
//! SQLite (bundled, no server) is the family's embedded default: several
//! processes on one host share one database file.
//!
//! ```
//! use std::time::Duration;
//! use lock_core::LockClient;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_core::LockError> {
//! let dir = tempfile::tempdir().expect("temp dir");
//! let url = format!("sqlite://{}?table=app_locks&ttl=10s", dir.path().join("locks.db").display());
//! let client = LockClient::new(lock_sql::connect(&url).await?);
//! let answer = client.with_lock("nightly-report", async { 42 }).await?;
//! assert_eq!(answer, 42);
//! # Ok(()) }
//! ```
//!
//! # URLs
//!
//! | scheme | database |
//! |---|---|
//! | `postgres://user:pw@host:5432/db`, `postgresql://...` | PostgreSQL |
//! | `mysql://user:pw@host:3306/db`, `mariadb://...` | MySQL / MariaDB |
//! | `sqlite://path/to/locks.db`, `sqlite:///abs/path.db` | SQLite file (created if missing) |
//! | `sqlite::memory:` | SQLite in memory (one process, one backend) |
//!
//! Query options `table`, `ttl`, `timeout`, `pool_size`, `busy_timeout`,
//! `recheck`, `create_table`, `mode` (`session`: advisory locks /
//! `GET_LOCK`), `fair`, `layout` (`shedlock`: ShedLock's table) are ours
//! (see [`SqlConfig`]); every other option goes to sqlx (`sslmode=...`,
//! SQLite `mode=ro|rw|rwc`). Connect with [`connect`] /
//! [`SqlBackend::connect_url`], or build a [`SqlConfig`] and call
//! [`SqlBackend::connect`]. The library creates its tables with
//! `CREATE TABLE IF NOT EXISTS`; [`SqlBackend::schema_sql`] prints them.
//!
//! # Guarantees
//!
//! - [x] Fencing tokens per key, strictly increasing: a counter column of a
//!   row that is never deleted, bumped by the granting statement
//!   ([`FencingScope::PerKey`](lock_core::FencingScope::PerKey)); tokens
//!   survive a database restart.
//! - [x] Expiry by the database's clock, never the client's (SQLite: the
//!   host's clock).
//! - [x] One statement per grant, release or renewal: two round trips per
//!   acquire+release on a free key.
//! - [x] Notified waiting on PostgreSQL (`LISTEN/NOTIFY`); polling with
//!   backoff elsewhere; FIFO with `fair=true`.
//! - [x] Writes guarded by the lease table: an ownership predicate for
//!   your own statement or transaction in the same database, row mode's
//!   mutexes ([`OwnerPredicate`]).
//! - [x] Read-write locks, semaphores and multi-locks in row mode; holder
//!   details, `list`, `force_release`, `gc` with a token floor.
//! - [x] Session mode ([`SqlSessionBackend`], PostgreSQL and MySQL/MariaDB)
//!   and ShedLock's table as a layout ([`SqlShedLockBackend`]).
//! - [x] Transaction-scoped locks in a transaction of yours
//!   ([`TransactionLocks`]): ended by its commit or rollback, the token
//!   taken by the granting statement (PostgreSQL `pg_advisory_xact_lock`,
//!   or row mode's row written in the transaction).
//!
//! # Caveats
//!
//! - Tokens can go backwards only if committed rows are lost: failing over to
//!   an asynchronous replica that missed the last grants, restoring a backup,
//!   or SQLite with `synchronous=NORMAL` after a power loss.
//! - Session mode holds many locks per connection (at most `pool_size`
//!   connections per backend); a killed session or a server restart frees
//!   every lock of that session at once while their holders learn at the
//!   session's next keep-alive: only the fencing token protects the
//!   resource then. `force_release` ends only a session holding that one
//!   lock.
//! - Session mode on PostgreSQL takes tokens from an `UNLOGGED` sequence
//!   that the first client of each server run raises to the run's durable
//!   epoch (global, rising across crashes, which reset the sequence).
//!   Upgrading from the logged `<table>_session_seq`: the new tokens
//!   start above it, but stop the old clients first (not fenced against
//!   the new ones). A grant on a session holding nothing else publishes
//!   its owner and token in `application_name` lazily, once held past
//!   `publish_delay` (10 ms): `inspect` of a younger lock waits for it,
//!   `force_release` waits that long first.
//! - Session mode on MariaDB 10.3+ takes tokens from the server's
//!   `UUID_SHORT()` counter counted from the run's start, above the
//!   server run's durable epoch (global, rising across crashes, which
//!   restart the counter) and publishes holders in a `MEMORY` table,
//!   lazily: only for a lock held past `publish_delay` (10 ms), so
//!   `inspect` of a younger lock waits for its row and `list` waits that
//!   long first; MySQL keeps a token row per key, untested here.
//!   Old-version (token-row or sequence) and new-version clients on one
//!   MariaDB database exclude each other but are not fenced against each
//!   other: stop the old ones first (the new tokens start above theirs).
//! - Session mode on MySQL/MariaDB keeps a lock through a partition only
//!   for a TTL within the server's TCP keep-alive (`tcp_keepalive_time` +
//!   `_probes` × `_interval`, GLOBAL settings, 0 meaning the server host's:
//!   about 2 h 11 min on Linux): a cut-off holder's session is ended, and
//!   its lock freed, that long after its last packet, whatever its TTL. A
//!   client cannot move them per session (PostgreSQL's it can, and does).
//! - `sqlite::memory:` databases are private to one backend; use a file to
//!   share locks. TLS needs the `tls-rustls` feature. The MySQL dialect is
//!   tested against MariaDB.
//!
//! The tables, the statements of every mode and layout, fair mode, the
//! operating calls and how each is tested are described in depth in
//! `docs/backends/sql.md` of the repository.

#![deny(missing_docs)]
// With only some dialects compiled in, helpers of the others go unused.
#![cfg_attr(
    not(all(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code, irrefutable_let_patterns, unused_imports, unused_variables)
)]

mod admin;
mod backend;
mod config;
mod connection;
mod descriptor;
mod dialect;
mod error;
mod grants;
mod guarded;
pub mod keys;
mod renewal;
mod sets;
mod shared;
mod transaction;
mod waiting;

pub use backend::session::SqlSessionBackend;
pub use backend::shedlock::SqlShedLockBackend;
pub use backend::{SqlAnyBackend, SqlBackend};
pub use config::{
    DEFAULT_TABLE, MAX_TABLE_LEN, MIN_TTL, MYSQL_SESSION_MIN_TTL, PG_SESSION_MIN_TTL,
    SHEDLOCK_TABLE, SqlConfig, SqlDialect, SqlLayout, SqlMode,
};
pub use descriptor::DRIVER;
pub use guarded::OwnerPredicate;
pub use keys::shedlock::SHEDLOCK_MAX_NAME;
pub use renewal::RENEW_ROWS_PER_STATEMENT;
pub use transaction::{TransactionGuard, TransactionLockKind, TransactionLocks, TxDatabase};

/// The sqlx this crate uses, so guarded statements name the same types.
pub use sqlx;

/// URL schemes this crate accepts.
pub const URL_SCHEMES: &[&str] = &["postgres", "postgresql", "mysql", "mariadb", "sqlite"];

/// Connects to the database named by `url` (see the crate docs), in row
/// mode or, with `mode=session`, in session mode.
///
/// # Errors
///
/// As [`SqlConfig::from_url`], [`SqlBackend::connect`] and
/// [`SqlSessionBackend::connect`].
///
/// # Cancel safety
///
/// Safe: dropping the future closes whatever was opened.
pub async fn connect(url: &str) -> Result<SqlAnyBackend, lock_core::LockError> {
    SqlAnyBackend::connect(SqlConfig::from_url(url)?).await
}

/// Opens the backend of a parsed URL, meeting `requirements` where the
/// driver has a setting for them (what the facade's `distlock::connect`
/// calls, through [`DRIVER`]).
///
/// # Errors
///
/// As [`connect`].
///
/// # Cancel safety
///
/// As [`connect`].
pub async fn open(
    endpoint: lock_core::endpoint::Endpoint,
    _requirements: lock_core::Requirements,
) -> Result<SqlAnyBackend, lock_core::LockError> {
    SqlAnyBackend::connect(SqlConfig::from_endpoint(endpoint)?).await
}
