//! The statements of session mode, built once per backend from the
//! validated table name by its [`SessionDialect`] (the text lives in
//! `crate::dialect`). Values are bound; only the (validated, quoted)
//! sequence or token-table name is spliced.

use std::sync::Arc;
use std::time::Duration;

use lock_core::FencingScope;

use crate::config::SqlDialect;
use crate::connection::DbConn;
use crate::dialect::{SessionDialect, quote_with};

/// Where a session statement runs: the session's connection and the
/// backend's session statements.
pub(crate) struct OnSession<'a> {
    pub(crate) conn: &'a mut DbConn,
    pub(crate) sql: &'a SessionSql,
    /// MariaDB's run-clock tokens: the server run's epoch shifted above
    /// the run's `UUID_SHORT()` count, less the run's origin, added to
    /// each `UUID_SHORT()` (see [`MariaSessionSql`]); 0 elsewhere, and
    /// before the session read it.
    pub(crate) run_base: i64,
}

/// A lock as session mode names it: the key as stored (MySQL's token row)
/// and as the server's lock sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SessionLock<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) server_key: &'a ServerKey,
}

/// One grant statement: a try when `wait` is `None`, else a wait of up to
/// that long on the server, for `owner` (hex) with a lease of `ttl`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SessionGrant<'a> {
    pub(crate) lock: SessionLock<'a>,
    pub(crate) owner: &'a str,
    pub(crate) ttl: Duration,
    pub(crate) wait: Option<Duration>,
}

/// A [`SessionGrant`] owning its values, for a statement that may finish
/// after its caller stopped waiting (see `connection::session::Finish`).
#[derive(Debug)]
pub(crate) struct OwnedGrant {
    key: Vec<u8>,
    server_key: ServerKey,
    owner: String,
    ttl: Duration,
    wait: Option<Duration>,
}

impl OwnedGrant {
    pub(crate) fn of(grant: &SessionGrant<'_>) -> Self {
        Self {
            key: grant.lock.key.to_vec(),
            server_key: grant.lock.server_key.clone(),
            owner: grant.owner.to_owned(),
            ttl: grant.ttl,
            wait: grant.wait,
        }
    }

    pub(crate) fn grant(&self) -> SessionGrant<'_> {
        SessionGrant {
            lock: SessionLock {
                key: &self.key,
                server_key: &self.server_key,
            },
            owner: &self.owner,
            ttl: self.ttl,
            wait: self.wait,
        }
    }
}

/// A grant's deferred holder row: its lock, owner (hex) and token.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Publication<'a> {
    pub(crate) lock: SessionLock<'a>,
    pub(crate) owner: &'a str,
    pub(crate) token: u64,
    /// The encoded holder details, as at the grant.
    pub(crate) details: &'a str,
}

/// One `list` page: at most `limit` token rows whose key matches the
/// `LIKE` pattern `prefix`, after `after`, in key order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ListPage<'a> {
    pub(crate) prefix: &'a str,
    pub(crate) after: &'a str,
    pub(crate) limit: i64,
}

/// Session-mode SQL for one dialect.
#[derive(Clone, Debug)]
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
    /// The quoted table with a row per key naming the key's last grant
    /// (MySQL: the token table; MariaDB: the `MEMORY` holder table);
    /// empty on PostgreSQL.
    pub(crate) holders: String,
    /// Where the tokens are counted: per key (MySQL's token rows) or for
    /// every key (a sequence).
    pub(crate) fencing: FencingScope,
    /// MariaDB 10.3 and later: the statements of the sequence token and
    /// the `MEMORY` holder table; `None` elsewhere.
    pub(crate) maria: Option<MariaSessionSql>,
    /// The server run's statements where tokens come from a sequence that
    /// a crash can take back (PostgreSQL, MariaDB 10.3+; see [`RunSql`]);
    /// `None` on MySQL's per-key token rows.
    pub(crate) run: Option<RunSql>,
}

/// # Server runs
///
/// Where a session grant's token comes from a sequence that a crash can
/// take back (PostgreSQL's `UNLOGGED` sequence is reset to its start by
/// crash recovery; MariaDB 10.11 does not flush a sequence's writes), the
/// tokens of a server run are lifted above those of every run before by
/// the run's **epoch**: a durable counter (`<table>_session_runs`, a
/// logged / InnoDB row, one flushed commit per run) bumped by the first
/// client of a run, before any grant of the run. What marks a run as
/// started is emptied by the same crash that takes the sequence back, so
/// a new run is always started anew:
///
/// - PostgreSQL: the sequence itself. The run starts with
///   `setval(seq, epoch << 40)` (only ever raising it, under a
///   transaction-level advisory lock), so a token is `nextval` alone, and a
///   value below 2^40 means the crash reset it and no client started the
///   run yet (`dialect::postgres`, `pg_start_run`);
/// - MariaDB: a `MEMORY` row holding the epoch and the run's clock
///   origin, which each session reads once (see [`MariaSessionSql`]).
///
/// A session reads whether the run is started when it opens (in the same
/// round trip as its server id, [`open_id`](Self::open_id)), and, when not,
/// starts it on a connection of its own before its first grant: a session
/// never outlives the run it was opened in (a crash ends every session).
#[cfg_attr(not(any(feature = "mysql", feature = "postgres")), allow(dead_code))]
#[derive(Clone, Debug)]
pub(crate) struct RunSql {
    /// Creates the durable run counter (`<table>_session_runs`).
    pub(crate) create: String,
    /// The run's token base: one row when the run is started (PostgreSQL:
    /// 0, the sequence carries the epoch; MariaDB: `epoch << 40` less the
    /// run's clock origin), none before.
    pub(crate) read: String,
    /// A new session's id and [`read`](Self::read)'s base (`NULL`: not
    /// started), in one round trip.
    pub(crate) open_id: Arc<str>,
    /// The durable bump of the run counter (flushed at commit).
    pub(crate) bump: String,
    /// Makes the bumped epoch the run's (PostgreSQL: raises the sequence
    /// to `epoch << 40`; MariaDB: writes the `MEMORY` row, with
    /// `UUID_SHORT()`'s value now as the run's origin).
    pub(crate) set: String,
}

/// The first token of run `epoch`, less one: `epoch << 40`. A run hands
/// out fewer than 2^40 tokens; 2^23 runs fit a signed `BIGINT`.
pub(crate) const RUN_SHIFT: u32 = 40;

/// # Session tokens on MariaDB
///
/// MariaDB 10.3 and later (`SELECT VERSION()` at connect, see
/// [`has_run_clock`](crate::dialect::mysql::has_run_clock)) take a session
/// grant's token from the server's `UUID_SHORT()` counter instead of a
/// per-key token row, and publish the holder in a `MEMORY` table: the
/// grant writes nothing at all, so no log flush and no table opened per
/// grant.
///
/// - **Token**: `run_base + (UUID_SHORT() & (2^56 - 1))`, evaluated only
///   when `GET_LOCK` returned 1 (the `SELECT` produced a row).
///   `UUID_SHORT()` is one counter for the whole server, bumped under a
///   mutex at each call (server id in the top byte, the start time in
///   seconds above the low 24 bits, then the count), so its values rise
///   in the order they are handed out, for every key and every
///   connection; it starts again from the start time at every start of
///   the server. The run's origin is the counter's value (less the
///   server-id byte) when the run was started, and `run_base` is
///   `epoch << 40` less that origin: a run's tokens count the calls since
///   its start above the run's epoch.
/// - **Run epoch**: `epoch` counts the server's runs: a durable InnoDB
///   row (`<table>_session_runs`, bumped once per run, a flushed commit)
///   copied with the origin into a `MEMORY` row (`<table>_session_clock`),
///   which a restart empties. A session reads the `MEMORY` row before its
///   first grant (a session cannot outlive the run it was opened in); the
///   first reader of a run that finds it empty starts the run on a
///   connection of its own under a `GET_LOCK` (see
///   `dialect::mysql::start_run`): bump, then the row written with the
///   counter's value as origin. No grant of a run happens before its row
///   exists, so every token of a run is above every token of the runs
///   before, as long as a run makes fewer than 2^40 `UUID_SHORT()` calls
///   (any client's on that server: 34 years at 1,000 a second, 3.5
///   at 10,000). Neither the wall clock
///   nor the server id is relied on.
/// - **Holder**: the key's row of `<table>_session_holders`
///   (`ENGINE=MEMORY`, emptied by a restart as the locks are), written
///   only once the grant has been held for the publication delay, and
///   deleted by its release (see `grants::session`, "Lazy holder rows"):
///   the grant itself is `GET_LOCK` and `UUID_SHORT()` in one `SELECT`. A
///   `MEMORY` table is locked for a whole statement, so a statement that
///   waits in `GET_LOCK` must not touch it: the waiting grant deletes its
///   session's stale row of the key, waits in a `SELECT GET_LOCK(?, ?)` of
///   its own, then takes the token (`WHERE IS_USED_LOCK(?) =
///   CONNECTION_ID()`), three round trips instead of one.
///
/// Earlier versions took the token from a cached `SEQUENCE`
/// (`<table>_session_seq`, `NEXTVAL`), which opens the sequence's table at
/// every grant (3-5% of the throughput of a grant-and-release cycle, 8
/// clients, measured) and which MariaDB does not flush at commit (after a
/// SIGKILL it fell back and could lose its row). Their run row (`<table>_session_run`) is not
/// read any more: the first client of this version starts a new run,
/// whose epoch is above theirs, so its tokens are above every earlier
/// one; old clients still running then are not fenced against new ones
/// (stop them first).
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
#[derive(Clone, Debug)]
pub(crate) struct MariaSessionSql {
    /// The `CREATE` after the holder table's: the run clock's `MEMORY`
    /// row (the durable run counter's is [`RunSql::create`]).
    pub(crate) create_clock: String,
    /// The holder table's `MAX_DATA_LENGTH` (binds: schema or `NULL`, table).
    pub(crate) heap_size: String,
    /// The holder table's schema (`None`: the connection's database) and
    /// name, for `heap_size`.
    pub(crate) holders_name: (Option<String>, String),
    /// Rebuilds the holder table with the session's `max_heap_table_size`.
    pub(crate) heap_grow: String,
    /// The `GET_LOCK` name that serializes the start of a run.
    pub(crate) run_lock: String,
    /// The waiting grant: its session's stale row of the key, the wait,
    /// the publication.
    pub(crate) unpublish: String,
    pub(crate) wait_lock: String,
    /// The waiting grant's token, taken once `GET_LOCK` granted the lock
    /// (binds: run base, lock name).
    pub(crate) wait_token: String,
    /// The deferred publication of a grant (see `grants::session`, "Lazy
    /// holder rows"): the row written with the grant's token, only while
    /// this connection holds the lock.
    pub(crate) publish: String,
    /// The release's removal of a published row (binds: key, token).
    pub(crate) withdraw: String,
    /// Deletes the rows whose lock is not held by the session they name.
    pub(crate) collect: String,
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

/// A key as the server's lock sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ServerKey {
    /// PostgreSQL advisory-lock key.
    pub(crate) pg: i64,
    /// Its `pg_locks` halves (classid, objid).
    pub(crate) pg_halves: (i64, i64),
    /// MySQL `GET_LOCK` name.
    pub(crate) mysql: String,
}

impl ServerKey {
    /// A 128-bit name of this server lock, for a backend's table of held
    /// locks: the advisory key itself, or the hash of the `GET_LOCK` name
    /// (two names with one hash would only wait for each other locally).
    pub(crate) fn id(&self) -> u128 {
        if self.mysql.is_empty() {
            u128::from(u64::from_ne_bytes(self.pg.to_ne_bytes()))
        } else {
            crate::keys::session::fnv1a_128("", &self.mysql)
        }
    }

    /// `key`'s name on `dialect` only; the other database's fields stay
    /// empty (`0`, `""`): each [`SessionDialect`] reads only its own. The
    /// `GET_LOCK` name a PostgreSQL grant does not need cost a `format!`
    /// and an allocation per grant (about 1,300 instructions), the
    /// advisory-lock hash a MySQL grant does not need about 260.
    pub(crate) fn of(dialect: SqlDialect, namespace: &str, key: &str) -> Self {
        match dialect {
            SqlDialect::Postgres => {
                let pg = crate::keys::session::pg_lock_key(namespace, key);
                Self {
                    pg,
                    pg_halves: crate::keys::session::pg_lock_halves(pg),
                    mysql: String::new(),
                }
            }
            SqlDialect::MySql | SqlDialect::Sqlite => Self {
                pg: 0,
                pg_halves: (0, 0),
                mysql: crate::keys::session::mysql_lock_name(namespace, key),
            },
        }
    }
}

/// `ttl` in whole milliseconds, rounded up from the nanosecond
/// (PostgreSQL's `idle_session_timeout`): the server never ends the
/// session earlier.
pub(crate) fn pg_idle_timeout(ttl: Duration) -> String {
    let ms = ttl.as_nanos().div_ceil(1_000_000).max(1);
    ms.to_string()
}

/// `ttl` in whole seconds, rounded up from the nanosecond (MySQL's
/// `wait_timeout`; rounded from the millisecond, a TTL of 1.0005 s got 1 s).
pub(crate) fn mysql_wait_timeout(ttl: Duration) -> u64 {
    let secs = ttl.as_nanos().div_ceil(1_000_000_000).max(1);
    u64::try_from(secs).unwrap_or(u64::MAX).min(31_536_000)
}

/// What a grant statement returned.
pub(crate) enum Granted {
    /// The lock and this token.
    Token(u64),
    /// Someone else holds it (at the end of the wait, for a wait).
    Held,
}

/// What `force_release`'s conditional kill did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Killed {
    /// The holder's session was ended.
    Ended,
    /// Not held any more as the grant read before (nothing ended).
    Changed,
    /// Spared: the session holds this many other locks (PostgreSQL).
    HoldsOthers(i64),
}

/// The grant `force_release` ends: session `victim`, holding `lock` as
/// grant `owner`/`token` when `inspect` read it; `wait` is how long to wait
/// for the server to free the lock once the session is ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KillTarget<'a> {
    pub(crate) lock: SessionLock<'a>,
    pub(crate) victim: i64,
    pub(crate) owner: &'a str,
    pub(crate) token: u64,
    pub(crate) wait: Duration,
}

/// A grant statement's token: `Held` when none (or not positive).
pub(crate) fn token_of(raw: Option<i64>) -> Granted {
    match raw.and_then(|t| u64::try_from(t).ok()) {
        Some(t) if t > 0 => Granted::Token(t),
        _ => Granted::Held,
    }
}
