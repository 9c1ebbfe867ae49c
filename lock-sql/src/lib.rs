//! The SQL driver of the distlock family: a unique-row lease table on
//! PostgreSQL, MySQL/MariaDB and SQLite, through sqlx connections.
//!
//! SQLite (bundled, no server) is the family's embedded default: several
//! processes on one host share one database file.
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
//! `recheck`, `create_table`, `mode`, `fair`, `layout` are ours (see [`SqlConfig`]); every other option
//! goes to sqlx (`sslmode=...`, SQLite `mode=ro|rw|rwc`). Connect with
//! [`connect`] / [`SqlBackend::connect_url`], or build a [`SqlConfig`] and call
//! [`SqlBackend::connect`].
//!
//! # The table
//!
//! One row per key, deleted only by [`gc`](lock_core::LockBackend::gc)
//! (see "Operating locks"):
//!
//! | column | PostgreSQL | MySQL / MariaDB | SQLite |
//! |---|---|---|---|
//! | `name` (primary key) | `VARCHAR(1024)` | `VARBINARY(1024)` (exact, case-sensitive) | `TEXT` |
//! | `owner` (NULL when free) | `VARCHAR(64)` | `VARCHAR(64)` | `TEXT` |
//! | `token` | `BIGINT` | `BIGINT` | `INTEGER` |
//! | `expires_at` | `TIMESTAMPTZ` (µs) | `DATETIME(6)` UTC | `INTEGER` µs since the Unix epoch |
//! | `details` (NULL when free) | `VARCHAR(1216)` | `VARCHAR(1216)` | `TEXT` |
//!
//! Beside it, `<table>_floor (id INTEGER PRIMARY KEY, token BIGINT)`: at
//! most one row, the token floor of `gc`.
//!
//! The library creates it with `CREATE TABLE IF NOT EXISTS` (idempotent;
//! [`SqlBackend::schema_sql`] prints it for teams that create it themselves
//! and connect with `create_table=false`).
//!
//! # How it works
//!
//! - **Grant**: one statement inserts the row, or takes over a row whose
//!   `expires_at` has passed, setting a fresh random owner and
//!   `token = token + 1`. PostgreSQL and SQLite use
//!   `INSERT .. ON CONFLICT .. DO UPDATE .. WHERE expires_at <= now RETURNING token`.
//!   MySQL/MariaDB use `INSERT .. ON DUPLICATE KEY UPDATE` with
//!   `LAST_INSERT_ID(expr)` carrying the new token (or 0 when held) back in
//!   the OK packet: row counts cannot be trusted there, because sqlx sets
//!   `CLIENT_FOUND_ROWS` and an unchanged duplicate also reports 1.
//! - **Release** clears the owner and sets `expires_at` to now, only if the
//!   row still has our owner and token and has not expired. The row stays,
//!   so the next grant's token is larger: tokens per key strictly increase
//!   forever.
//! - **Renew** moves `expires_at` to now + TTL only while we own an
//!   unexpired row.
//! - **Time** is the database's clock (`now()` on PostgreSQL,
//!   `UTC_TIMESTAMP(6)` on MySQL/MariaDB), never the client's, with
//!   microsecond precision. **SQLite has no server: its clock is the host's
//!   wall clock** (microseconds, bound by each process); processes sharing a
//!   file share the host's clock, but stepping that clock moves expiries.
//! - **Waiting**: PostgreSQL waiters `LISTEN` (on one extra connection per
//!   database and table in the process, opened by the first waiter) on a
//!   channel that the release statement `NOTIFY`s in the same statement
//!   (`pg_notify` at commit), with a bounded re-check at
//!   the holder's expiry (at most `recheck`, default 1 s) for expiries and
//!   missed notifications. MySQL/MariaDB and SQLite waiters poll with
//!   exponential backoff and jitter (5 ms to 100 ms, back to 5 ms after a
//!   release of the key is seen); a release by any client of the same
//!   process (same URL and table) wakes its waiters at once.
//! - **Waiters first** (within a process): a client that asks for a key
//!   while other clients of the process wait for it lets them go first,
//!   until one of them reports it taken (then it waits like them) or one
//!   initial poll interval. A holder that releases and asks again at once
//!   (a worker loop) therefore does not take the row straight back from
//!   the waiters it just woke. Across processes the first grant statement
//!   to reach the row wins (no queue; `fair=true` queues them, below).
//! - **Connections**: the lock statements run on bare sqlx connections of
//!   the backend's own (at most `pool_size`), not on a sqlx pool, whose
//!   return path pings every connection (a second round trip per
//!   statement): one round trip per statement, two per acquire+release on
//!   a free key. A connection that broke (I/O error, closed socket,
//!   protocol or TLS failure, the server ending the session) is dropped,
//!   with the idle ones opened before it, and the statement runs once more
//!   on a freshly opened connection. A grant whose reply was lost runs
//!   again with the same owner (it cannot grant twice: our unexpired row
//!   is left alone), and if the row is held, one inspect says whether by
//!   us, so a committed grant is handed back rather than leaked for its
//!   TTL. A release whose reply was lost and whose retry matches nothing
//!   reports `false` (the lock is free either way). Every statement is
//!   autocommitted; no lock is tied to a session, so a connection killed
//!   leaves nothing behind but rows that expire. [`SqlBackend::pg_pool`]
//!   and friends give a (lazily opened) sqlx pool on the same database for
//!   your own statements.
//! - **SQLite** files are opened in WAL mode with `synchronous=NORMAL` and a
//!   busy timeout (default 5 s), so several processes can contend on one
//!   file. A backend's writes take turns: a call's future kept unpolled
//!   mid-statement holds the turn, and the backend's other writes end in
//!   `Timeout` until it is polled or dropped. Drop what you stop polling.
//!
//! # Session mode (`?mode=session`, PostgreSQL and MySQL/MariaDB)
//!
//! [`SqlSessionBackend`] holds the lock in a server session instead of a
//! row: PostgreSQL session-level advisory locks (the key hashed to a
//! `bigint` with FNV-1a over table name and key), MySQL/MariaDB
//! `GET_LOCK` (`table:key` when it fits 64 lowercase-safe characters, else
//! `#` + 32 hex digits of the hash). Hash collisions only make two keys
//! exclude each other; the server never grants one lock twice. The grant
//! is one round trip and takes its fencing token in the same statement:
//! PostgreSQL `nextval` of the sequence `<table>_session_seq` (`CACHE 1
//! NO CYCLE`, checked at connect; **global**: one sequence for every key,
//! so tokens strictly increase over all grants), MySQL/MariaDB a counter
//! row per key in `<table>_session_tokens` bumped by `INSERT .. SELECT ..
//! WHERE GET_LOCK(..) = 1 ON DUPLICATE KEY UPDATE` (**per key**). Either
//! counter moves only while the grant holds the server lock, so a key's
//! tokens strictly increase. Release is one round trip.
//!
//! Trade-off, as the tests measure it (`tests/session_*.rs`):
//! - **One connection per held lock** (and per waiting acquire: waiting is
//!   done by the server, `pg_advisory_lock` with `lock_timeout`,
//!   `GET_LOCK(name, seconds)`). `pool_size` caps both per backend. A
//!   lease works only through the backend that granted it (no handles).
//! - **TTL = session** ([`TtlModel::PerSession`](lock_core::TtlModel)): the
//!   server frees a lock only when the session ends. We make it end a
//!   silent session after the TTL (`idle_session_timeout`, PostgreSQL 14+;
//!   `wait_timeout`, whole seconds rounded up): a keep-alive (a query that
//!   checks the session still holds the lock) dates the holder's deadline
//!   from its send time, the server's idle timer starts after it ran.
//! - **Partition**: the server keeps the lock until the idle timeout, i.e.
//!   about the TTL after the last keep-alive it received, and frees it
//!   *after* the holder's deadline (measured: ~25 ms after, TTL 2 s; TCP
//!   keepalives cannot see a partition behind a live proxy).
//! - **Killed session** (admin kill, connection reset, server restart): the
//!   server frees the lock **at once** (measured 1-15 ms), while the holder
//!   learns it only at its next keep-alive (up to TTL/3: measured ~0.95 s
//!   with TTL 3 s). This window with two believers is the negative control
//!   the fault tests assert: only the fencing token protects the resource
//!   there. Row mode has no such window.
//! - A dropped waiting acquire closes its connection and kills the waiting
//!   session from another one (PostgreSQL keeps waiting for a closed client
//!   otherwise); nothing stays queued or held.
//! - SQLite has no server session: `mode=session` is a Config error.
//!
//! # Fair mode (`?fair=true`, row mode, every dialect)
//!
//! Mutex waiters queue in the order the database registers them; without
//! it, waiters race for a freed row (first grant statement wins).
//!
//! - A waiting acquire first tries once behind every live waiter; refused,
//!   it inserts its row into `t_waiters` (shape `mutex`, `id` from the
//!   database's sequence / `AUTO_INCREMENT` / `AUTOINCREMENT`, never a
//!   client clock) with an expiry of min(TTL, 10 s) that it refreshes
//!   every third of that while it waits.
//! - The fair grant is the mutex grant statement gated on "no live mutex
//!   waiter of the key with a smaller id" (`INSERT .. SELECT .. WHERE NOT
//!   EXISTS (..)` before the usual upsert, so a gated grant writes
//!   nothing): a grant needs the row free **and** the caller at the head
//!   of the live queue. A `try_acquire` counts every live waiter as ahead
//!   of it: it returns `None` while anyone waits, even on a free key.
//! - **Order is the order of registration.** An acquire registers one
//!   round trip after its first refused try; a grant in that window (a
//!   releasing holder asking again at once, say) goes to whoever asks, as
//!   without `fair`. In 4-contender hot loops on one key this shows as a
//!   busiest/least busy spread of 1.0-1.2 instead of exactly 1 (see the
//!   numbers below); waiters spaced further apart than a round trip are
//!   served strictly in order (the conformance FIFO case). Closing the
//!   window takes a try-or-enqueue in one exchange (a PostgreSQL CTE, a
//!   transaction elsewhere): not done.
//! - Granted, the waiter deletes its row (and the key's expired ones) in
//!   one more statement before returning the lease. Expired rows are
//!   skipped by the gate at once. A dropped (cancelled) acquire deletes
//!   its row in the background and wakes the others; one that dies leaves
//!   its row to expire (at most min(TTL, 10 s) after its last refresh).
//!   A waiter whose own row expired (stalled past it) queues again last.
//! - The mutex row is the same as unfair clients': fair and unfair clients
//!   of one key exclude each other (tested); unfair clients ignore the
//!   queue, so mixing them gives up FIFO, never exclusion.
//! - A releasing holder that asks again at once queues behind the
//!   waiters (the handoff problem of unfair polling dialects is gone).
//! - Waking is as for the mutex: PostgreSQL `NOTIFY` (plus `recheck`),
//!   elsewhere polling with backoff plus the process's own wake-ups. A
//!   dead waiter at the head holds the others until its row expires and
//!   the next waiter looks again (PostgreSQL: within `recheck`).
//! - Cost (proxy-counted, `tests/round_trips.rs`): a free key costs what
//!   it costs unfair (2 round trips per acquire+release). A queued waiter
//!   pays its first try, its registration (MariaDB: 2 statements), one
//!   grant attempt per wake-up or poll, a refresh every third of its row's
//!   TTL, and the removal of its row: 5 round trips on PostgreSQL for a
//!   waiter queued 300 ms behind a holder (MariaDB: the same plus its
//!   polls).
//! - Throughput: strict order costs handoffs. 4 contenders cycling on one
//!   key (`cargo run --release -p lock-sql --example fair_handoff`, 3 s
//!   runs, three runs on a loaded 2-core machine; handoffs/s and the
//!   busiest contender's grants over the least busy one's), each contender
//!   with its own wake-up scope as separate processes would be:
//!   MariaDB unfair 1,850-3,300/s, spread 1.2-3.5; fair 24-51/s, spread
//!   1.0. SQLite unfair 3,100-5,400/s, spread 1.5-2.9; fair 31-40/s,
//!   spread 1.1-1.7. PostgreSQL unfair 1,380-2,000/s, spread 1.1-1.5;
//!   fair 660-950/s, spread 1.0-1.05. With the polling backoff capped at
//!   20 ms ([`SqlConfig::poll_policy`]) fair MariaDB/SQLite reach 93-106/s
//!   (more polls per waiter). In one process (one wake-up scope: a release
//!   wakes the process's waiters at once): fair MariaDB 490-650/s, SQLite
//!   1,050-1,100/s, PostgreSQL 580-860/s. Across processes on the polling
//!   dialects a handoff waits for the next waiter's poll (backoff up to
//!   100 ms) where an unfair releaser takes the row straight back: use
//!   `fair=true` where starvation matters more than throughput, a shorter
//!   poll backoff, or PostgreSQL (`NOTIFY`).
//! - [`capabilities().fifo`](lock_core::Capabilities::fifo) is `true`;
//!   the driver descriptor's `fair_option` is `fair=true`.
//! - **Session mode** refuses `fair=true` at connect with
//!   [`ErrorKind::Unsupported`](lock_core::ErrorKind::Unsupported): neither
//!   advisory locks nor `GET_LOCK` document an order among waiting
//!   sessions.
//!
//! # Multi-locks (`try_acquire_all`, row mode)
//!
//! [`LockBackend::try_acquire_all`](lock_core::LockBackend::try_acquire_all)
//! (used first by `client.lock_all(..)`) takes every key of a set or none,
//! a fresh token per key (`token + 1` of its row, 1 for a new row); each
//! lease is an ordinary mutex lease. `Ok(None)` when any key is held
//! (live, by the database's clock), nothing left behind; a key twice is
//! `InvalidArgument`; in fair mode a key with a live waiter refuses the
//! set too.
//!
//! - **PostgreSQL**: one statement, one round trip: `WITH v (..) AS
//!   (VALUES ..)` and an `INSERT .. SELECT .. ON CONFLICT DO UPDATE ..
//!   RETURNING` gated on no live row of the set in the statement's
//!   snapshot; if a racing grant took one of the keys meanwhile (fewer
//!   rows returned than keys), the statement divides by zero on purpose,
//!   which rolls the whole statement back (SQLSTATE 22012, reported as
//!   `None`; the server logs it as an error).
//! - **MySQL/MariaDB** (no `RETURNING`): one transaction of 4 round trips
//!   (`BEGIN`, a multi-row `INSERT .. ON DUPLICATE KEY UPDATE` that takes
//!   the expired or new rows and locks all of them, a `SELECT .. FOR
//!   UPDATE` of their owners and tokens, `COMMIT`, or `ROLLBACK` when any
//!   is not ours); 5 in fair mode (a `LOCK IN SHARE MODE` count of the
//!   keys' live waiters first). For 1-3 keys that is more round trips
//!   than taking them one by one, but all or nothing.
//! - **SQLite**: one `BEGIN IMMEDIATE` transaction (the file's write lock
//!   from its start): a multi-row upsert `RETURNING` the granted rows,
//!   then `COMMIT` or `ROLLBACK` (3 statements; 4 in fair mode with the
//!   waiters count), in process.
//! - A connection that broke mid-exchange: once more on a fresh connection
//!   with the same owner; a set the first attempt committed is found held
//!   by us and handed back.
//! - Session mode: `Unsupported` (the default: `lock_all` takes the keys
//!   one by one).
//!
//! # Read-write locks and semaphores (row mode)
//!
//! [`LeaseKind::Read`](lock_core::LeaseKind::Read), `Write` and `Permits`
//! grants ([`LockBackend::try_acquire_kind`](lock_core::LockBackend::try_acquire_kind)
//! and friends, `client.read_lock(k)` / `write_lock(k)` / `semaphore(k, n)`)
//! live in three more tables next to the lease table `t` (created and
//! listed by [`SqlBackend::schema_sql`] with it; names are `t` with a
//! suffix on its last part):
//!
//! | table | columns | role |
//! |---|---|---|
//! | `t_keys` | `name`, `shape` (`rwlock` / `semaphore`), `token`, `epoch`; key (`name`, `shape`) | per key and shape: the fencing counter (last write or permit token) and the epoch (last write token); never deleted |
//! | `t_holders` | `name`, `shape`, `owner`, `kind` (`r`, `w`, `p<count>-<limit>`), `cnt`, `lim`, `token`, `expires_at`, `details` (nullable); key (`name`, `shape`, `owner`) | one row per lease |
//! | `t_waiters` | `id` (database sequence / auto-increment), `name`, `shape`, `owner`, `kind`, `cnt`, `lim`, `expires_at`; index (`name`, `shape`, `id`) | one row per waiting acquire, in arrival order (fair mutex waiters too, shape `mutex`) |
//!
//! A mutex, a read-write lock and a semaphore of one key are three
//! different locks (the mutex is the lease table's row; the other two
//! differ by `shape`).
//!
//! - **One transaction per grant decision**, serialised per key and shape
//!   by locking the key's `t_keys` row first (PostgreSQL `INSERT .. ON
//!   CONFLICT DO UPDATE`, MySQL/MariaDB `INSERT .. ON DUPLICATE KEY UPDATE`
//!   then `SELECT .. FOR UPDATE`, SQLite `BEGIN IMMEDIATE`), which also
//!   bumps the counter for a write or permit attempt. Readers lock it in
//!   share mode (PostgreSQL `FOR SHARE`, MySQL/MariaDB `LOCK IN SHARE
//!   MODE`, after an insert-if-missing), so readers decide side by side
//!   while writers and permits wait for them and they for writers. Then one
//!   read of the key's holders and waiters. An expired holder row is deleted by the
//!   decision that counted it as gone, by its owner; when that deletes
//!   nothing (a renewal committed in between) the transaction is rolled
//!   back and decided again, so a renewal never revives a share another
//!   grant was given.
//! - **Read**: granted when no live writer holds the key and no live writer
//!   waits ahead of it (writer preference: once a writer waits, new readers
//!   queue behind it). **Write**: granted when nobody holds the key and
//!   nobody waits ahead. **Permits** `{count, limit}`: granted when the live
//!   holders' counts plus `count` fit `limit` and nobody waits ahead (FIFO:
//!   a big request at the head is not overtaken). A request whose limit
//!   differs from a live holder's or waiter's is
//!   [`ErrorKind::InvalidArgument`](lock_core::ErrorKind::InvalidArgument);
//!   an idle semaphore takes any limit.
//! - **Tokens** ([`FencingScope::PerKey`](lock_core::FencingScope::PerKey),
//!   per key and shape): a write or permit grant gets `token + 1` of the
//!   key's counter (strictly greater than every earlier grant of the key
//!   and shape, reads included); a write grant also sets the epoch to it; a
//!   read grant carries the epoch (0 before the first write). A downgraded
//!   writer keeps its token.
//! - **Expiry** by the database clock, as for the mutex (SQLite: the host's
//!   clock as SQLite reads it, `julianday('now')`, millisecond precision).
//!   A crashed holder's share comes back when its row's `expires_at`
//!   passes; nothing else frees it.
//! - **Waiting** (`acquire_kind`): the first refused attempt inserts the
//!   waiter row in its own transaction (queued from that instant); later
//!   attempts refresh its `expires_at` (the request's TTL, at most 10 s)
//!   and come at least every third of that; while the row is fresh, an
//!   attempt first looks with one read-only `SELECT` outside any
//!   transaction and runs the transaction only when it could be granted.
//!   Granted, the row is deleted in the grant's transaction; at the
//!   deadline it is deleted before `Contended` is returned; a dropped
//!   acquire deletes it in the background; a waiter that dies stops
//!   counting when its row expires (at most 10 s). Waiters are woken as
//!   the mutex's: PostgreSQL `NOTIFY` from the release, downgrade and
//!   withdrawal statements (plus the `recheck` interval), elsewhere
//!   polling with backoff and the process's own wake-ups.
//! - **Downgrade**: one `UPDATE` turns our live `w` row into an `r` row
//!   (same owner, token, expiry): no instant without a holder. The write
//!   lease no longer renews or releases afterwards.
//! - **Renew / release** of these leases: one statement each, guarded by
//!   key, shape, owner, token and kind, like the mutex's;
//!   `renew_many` renews mutex leases in batches and these one by one.
//! - Round trips of an uncontended grant+release (counted through the
//!   fault proxy by `tests/shared_round_trips.rs`): permits 6 on PostgreSQL
//!   (BEGIN, the key row, the holders and waiters, the holder row, COMMIT;
//!   the release), 7 on MariaDB (the key row takes two statements); a write
//!   one more (its epoch); a read 7 on both (the key row in share mode
//!   takes two statements). SQLite: 6 for reads and permits, 7 for a
//!   write (its transactions take turns: no share mode). A
//!   refused try is BEGIN, the key row, the read and COMMIT; renew and
//!   downgrade one statement. The mutex path is unchanged.
//! - **Session mode** ([`SqlSessionBackend`]) has neither kind:
//!   `ErrorKind::Unsupported`.
//!
//! # ShedLock layout (`?layout=shedlock`, mutex only)
//!
//! [`SqlShedLockBackend`] (what [`connect`] returns for `layout=shedlock`,
//! as [`SqlAnyBackend::ShedLock`]; builder:
//! [`SqlConfig::layout`]`(`[`SqlLayout::ShedLock`]`)`) holds our mutex in
//! the table of [ShedLock](https://github.com/lukas-krecan/ShedLock)'s
//! `JdbcTemplateLockProvider`, so that jobs scheduled with ShedLock and
//! ours exclude each other on one database, in both directions.
//!
//! - **Table**: `shedlock` by default ([`SHEDLOCK_TABLE`]; `table=`
//!   overrides it), with ShedLock's default column names `name`,
//!   `lock_until`, `locked_at`, `locked_by` (ShedLock's `ColumnNames`
//!   customisation is not supported). The key is the ShedLock lock name
//!   as-is (no prefix), at most [`SHEDLOCK_MAX_NAME`] = 64 characters
//!   (longer: `InvalidArgument`). A row whose `lock_until` is after now is
//!   held, by anyone; rows are never deleted.
//! - **Creating it**: when missing (unless `create_table=false`) with
//!   ShedLock's README DDL for the database, `CREATE TABLE IF NOT EXISTS`;
//!   an existing table is never altered. At connect both tables are probed
//!   (`SELECT <columns> FROM t WHERE 1 = 0`): a missing table
//!   (`create_table=false`) or one without these columns is a `Config`
//!   error that names the tables and prints the DDL
//!   ([`SqlShedLockBackend::schema_sql`]).
//!
//! | column | PostgreSQL | MySQL / MariaDB | SQLite |
//! |---|---|---|---|
//! | `name` (primary key) | `VARCHAR(64)` | `VARCHAR(64)` | `VARCHAR(64)` |
//! | `lock_until` | `TIMESTAMP` (UTC wall clock, µs) | `TIMESTAMP(3)` | `TIMESTAMP` (holds epoch ms, INTEGER) |
//! | `locked_at` | `TIMESTAMP` | `TIMESTAMP(3) DEFAULT CURRENT_TIMESTAMP(3)` | `TIMESTAMP` |
//! | `locked_by` | `VARCHAR(255)` | `VARCHAR(255)` | `VARCHAR(255)` |
//!
//! - **Fencing**: ShedLock's table has no token column and we do not add
//!   one (ShedLock's `INSERT` names its four columns, so an extra nullable
//!   column would be tolerated, but changing a table another product owns
//!   breaks "never alter"; a side table also works on a table the
//!   application user may not `ALTER`). Our tokens live in
//!   **`<table>_tokens(name VARCHAR(64) PRIMARY KEY, token BIGINT)`**
//!   (SQLite `INTEGER`), one row per name, never deleted, bumped by the
//!   same statement or transaction that grants the ShedLock row, so a
//!   name's tokens strictly increase over our grants, across any number
//!   of ShedLock turns in between (tested). ShedLock's grants do not move
//!   it: **a ShedLock holder has no token**; [`LockBackend::inspect`](lock_core::LockBackend::inspect)
//!   reports its `locked_by` with `token: None`. On MySQL/MariaDB the
//!   `name` columns must share a collation (ShedLock's names compare by
//!   it: under the default case-insensitive one `Job` and `job` are one
//!   lock and share one token row, tested); connect refuses tables whose
//!   collations differ.
//! - **`locked_by`** of our grants: `<host>/distlock/<owner hex>` (host
//!   from `/proc/sys/kernel/hostname` or `HOSTNAME`, at most 128
//!   characters; the owner is 128 random bits per grant), so a row is
//!   recognisably ours and release/renew compare it exactly
//!   ([`SqlShedLockBackend::locked_by`]). ShedLock compares `locked_by` with
//!   its host name in its extend and unlock, so it never extends or
//!   unlocks ours.
//!
//! Statements (every value bound; `now` below is ShedLock's own
//! expression for the database: PostgreSQL `timezone('utc',
//! CURRENT_TIMESTAMP)`, MySQL/MariaDB `UTC_TIMESTAMP(3)`, SQLite
//! `CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)`,
//! the host clock in epoch ms; [`SqlShedLockBackend::statements_sql`]
//! lists the exact text):
//!
//! - **Grant** (take when absent or `lock_until <= now`):
//!   - PostgreSQL, one statement: ShedLock's `usingDbTime()` upsert
//!     `INSERT INTO t AS s (name, lock_until, locked_at, locked_by) VALUES
//!     ($1, now + $2 µs, now, $3) ON CONFLICT (name) DO UPDATE SET .. WHERE
//!     s.lock_until <= now RETURNING s.name` as a CTE, feeding `INSERT INTO
//!     t_tokens .. SELECT name, 1 FROM g ON CONFLICT (name) DO UPDATE SET
//!     token = token + 1 RETURNING token`.
//!   - MySQL/MariaDB (no `RETURNING`, no writing CTE). For a name whose
//!     tokens row this backend has seen: one statement, `UPDATE t AS s
//!     JOIN t_tokens AS k ON k.name = s.name SET s.lock_until =
//!     TIMESTAMPADD(MICROSECOND, ?, now), s.locked_at = now, s.locked_by =
//!     ?, k.token = LAST_INSERT_ID(k.token + 1) WHERE s.name = ? AND
//!     s.lock_until <= now` (ShedLock's update plus the token, which comes
//!     back in the OK packet); refused, `INSERT IGNORE INTO t .. VALUES (?,
//!     now, now, '')` re-creates a deleted row as a free one (then the
//!     `UPDATE` once more). For a name not seen yet: `INSERT INTO t_tokens
//!     (name, token) SELECT ?, LAST_INSERT_ID(1) FROM DUAL WHERE NOT EXISTS
//!     (SELECT 1 FROM t WHERE name = ? AND lock_until > now) ON DUPLICATE
//!     KEY UPDATE token = LAST_INSERT_ID(token + 1)` (bumps only while the
//!     name is not held: the counter never moves under a holder, so it is
//!     the holder's token), then ShedLock's insert only while the counter
//!     still holds that value, `INSERT IGNORE INTO t (..) SELECT ?, now +
//!     ?, now, ? FROM t_tokens WHERE name = ? AND token = ?`, and when the
//!     row existed, the `UPDATE`. Round trips: a grant of a known name 1,
//!     of a new name 2, a refused try 1 (new to this backend) or 2.
//!     Deadlocks between these statements (InnoDB gap locks) are rolled
//!     back by the server and retried (up to 5 times).
//!   - SQLite: `BEGIN IMMEDIATE`, `INSERT INTO t AS s .. VALUES (?1, now +
//!     ?2 ms, now, ?3) ON CONFLICT (name) DO UPDATE SET .. WHERE
//!     s.lock_until <= now`, and when it changed a row `INSERT INTO t_tokens
//!     .. ON CONFLICT (name) DO UPDATE SET token = token + 1 RETURNING
//!     token`, `COMMIT`.
//! - **Release**: `UPDATE t SET lock_until = now WHERE name = ? AND
//!   locked_by = ? AND lock_until > now` (ShedLock's unlock with
//!   `lockAtLeastFor` 0; the row stays); `false` when it matched nothing.
//! - **Renew**: ShedLock's extend, `UPDATE t SET lock_until = now + ttl
//!   WHERE name = ? AND locked_by = ? AND lock_until > now`.
//! - **Inspect**: `SELECT s.locked_by, k.token, <µs left> FROM t s LEFT JOIN
//!   t_tokens k ON k.name = s.name WHERE s.name = ? AND s.lock_until > now`.
//! - **Waiting** polls with the row mode's backoff (5 ms to 100 ms,
//!   [`SqlConfig::poll_policy`]): ShedLock never notifies.
//!
//! Time: every comparison is the database's clock, as ShedLock's
//! `usingDbTime()` statements use it. **ShedLock must be configured with
//! `usingDbTime()`** (PostgreSQL, MySQL/MariaDB), or else with
//! `withTimeZone(UTC)` and clocks in sync with the database's (ShedLock
//! then compares its own clock). Per database:
//! - PostgreSQL: `TIMESTAMP` without time zone holding UTC wall-clock
//!   time (`timezone('utc', CURRENT_TIMESTAMP)`), independent of the
//!   session's `TimeZone`; µs precision.
//! - MySQL/MariaDB: `TIMESTAMP(3)` compared with `UTC_TIMESTAMP(3)`, the
//!   way ShedLock does. MySQL converts `TIMESTAMP` values through the
//!   session time zone, so our connections in this layout keep the
//!   server's default session time zone (sqlx would set `+00:00`), like
//!   a Connector/J client that sets none. If ShedLock's JDBC URL forces
//!   another session zone (`connectionTimeZone` with
//!   `forceConnectionTimeZoneToSession`), or the server zone has DST,
//!   expiries shift: run the server in UTC. Millisecond precision: our
//!   expiries get 2 ms more on the database side, so the row never frees
//!   before the holder's deadline.
//! - SQLite: ShedLock has no `usingDbTime()` there: it binds its client
//!   clock, which sqlite-jdbc stores as epoch milliseconds (INTEGER, its
//!   default `date_class`; a ShedLock configured with `date_class=TEXT`
//!   is not compatible). Ours reads the same host clock through SQLite
//!   (ms, +2 ms pad). Processes sharing a file share the host's clock.
//!
//! Refused with typed errors: read-write locks and semaphores
//! (`Unsupported`, [`capabilities`](lock_core::LockBackend::capabilities) says
//! `shared_locks: false, semaphores: false`), `fair=true` (`Unsupported`
//! at connect: no waiter queue that ShedLock would respect), `mode=session`
//! (`Config`, from [`SqlConfig::from_url`] or at connect), and
//! [`SqlBackend`] / [`SqlSessionBackend`] opened with `layout=shedlock`
//! (`Config`). `try_acquire_all` is `Unsupported` (`lock_all` takes the
//! keys one by one). The benchmark floor ([`floor::SqlFloor`]) always
//! uses the lease layout.
//!
//! Caveats:
//! - **`lockAtLeastFor`**: ShedLock's unlock sets `lock_until =
//!   max(now, locked_at + lockAtLeastFor)`, so after a ShedLock job ends
//!   the name stays held (for ShedLock and for us) until then. Ours
//!   releases with `lockAtLeastFor` 0.
//! - **A ShedLock holder is not renewed** unless its job calls
//!   `LockExtender.extendActiveLock`: it holds until `lockAtMostFor`
//!   whether or not its job still runs, and ShedLock does not stop a job
//!   that outlives it. After that we may take the row while its job
//!   continues; and a ShedLock holder has no token to fence with. Choose
//!   `lockAtMostFor` well above the job's run time.
//! - ShedLock instances with the same `locked_by` (host name) can unlock
//!   or extend each other's rows (ShedLock's own behaviour); ours cannot
//!   be touched by them.
//! - Never delete rows of `<table>_tokens`: that restarts a name's
//!   tokens.
//!
//! Tested (`tests/shedlock.rs`, ShedLock's statements as it sends them,
//! from a plain sqlx connection of their own in `tests/shedlock_client`)
//! on PostgreSQL 15, MariaDB 10.11 and a SQLite file: while ShedLock
//! holds, our try and a 300 ms wait are refused and inspect shows its
//! host with no token; after its unlock (row kept) ours takes the row;
//! while ours holds, ShedLock's insert fails (PostgreSQL: its upsert
//! matches nothing), its update, extend and unlock match nothing; after
//! our release ShedLock's update takes it; `lockAtLeastFor` and a dead
//! ShedLock holder (free at `lockAtMostFor`); our expired lease taken by
//! ShedLock, then our renew `NotHeld`; a row deleted by an operator; a
//! refused newcomer that leaves the holder's token alone; 40
//! simultaneous races (exactly one winner each); tokens strictly
//! increasing across all of it. The shared conformance suite passes on
//! the layout on all three (PostgreSQL and MariaDB with its fault cases:
//! a paused server, a partitioned client, a deposed leader). Negative
//! controls: a ShedLock update without `lock_until <= now`, and our
//! default layout beside a ShedLock holder, each get in, and the same
//! checks report it. MariaDB also: names equal under the collation are
//! one lock and one counter; a tokens table of another collation is
//! refused.
//!
//! # Operating locks (holder details, list, force-release, gc)
//!
//! **Row mode** (every dialect, fair mode included):
//!
//! - *Holder details* ([`lock_core::HolderDetails`], `capabilities().holder_details`
//!   is true): the `details` column of the lease row, written by the grant
//!   statement itself (one more bind, no extra round trip; the fair grant
//!   too), cleared by the release and by `force_release`, hidden with the
//!   owner once the row expires and overwritten by the next grant. A table
//!   created before the column existed gets it at connect when
//!   `create_table` is on: a probe (`SELECT details .. WHERE 1 = 0`), then
//!   `ALTER TABLE .. ADD COLUMN details ..` only when missing (PostgreSQL:
//!   `ADD COLUMN IF NOT EXISTS`; elsewhere a concurrent connect's
//!   "duplicate column" is success). With `create_table=false` add the
//!   column and the floor table yourself ([`SqlBackend::schema_sql`]).
//!   Readers, writers, permit holders: `t_holders.details`, written by the
//!   row's insert (no extra round trip), kept by a downgrade, added at
//!   connect to an older table alike; `holders()` and `list_shared` show
//!   them. Multi-lock grants (`try_acquire_all`) write no details.
//! - *`list(prefix, cursor, limit)`*: one statement scanning at most
//!   `limit` rows, `WHERE name LIKE prefix% AND name > cursor ORDER BY name
//!   LIMIT limit` (`LIKE` wildcards escaped with `!`; SQLite, whose `LIKE`
//!   ignores case, uses `instr(name, prefix) = 1`); the held rows (owner
//!   set, unexpired) are returned, so a page may be short while the scan
//!   goes on. The cursor is `sql1:<hex of the last name scanned>`; anything
//!   else is `InvalidArgument`. `list_shared(rwlock | semaphore, ..)`:
//!   one statement per page on `t_holders`, the first `limit` keys of that
//!   shape under the prefix after the cursor with a live holder, each with
//!   all its live holders (a full page's cursor is its last key; same
//!   cursor format and checks); the mutex from `list`. `list_elections`:
//!   the election mutexes (`election/<prefix>`) through `list`.
//! - *`force_release(key)`*: one transaction reads the holder (row locked:
//!   `FOR UPDATE`; SQLite `BEGIN IMMEDIATE`) and sets `owner = NULL,
//!   details = NULL, expires_at = now`, keeping `token`: the next grant's
//!   token is above the broken one, the broken holder's renew is `NotHeld`
//!   and its release `false`. PostgreSQL `NOTIFY`s waiters in the same
//!   statement; elsewhere this process's waiters are woken and the others
//!   poll.
//! - *`gc(older_than)`*: one transaction that keeps every other writer off
//!   the lease table (PostgreSQL `LOCK TABLE .. IN SHARE ROW EXCLUSIVE
//!   MODE` with `lock_timeout` = the operation timeout; MySQL/MariaDB
//!   `LOCK TABLES <table> WRITE, <table>_floor WRITE`; SQLite's write
//!   lock), reads up to 1000 rows whose `expires_at` is at least
//!   `older_than` in the past (free: released or expired), raises the
//!   floor to their highest token (never lowers it) and deletes them (only
//!   rows with `token <= floor`). A grant that creates a row gives it
//!   `floor + 1` in the same statement, and waits for `gc`'s commit before
//!   reading the floor, so no key's token goes backwards. A held key is
//!   never collected. Run it again while `removed` is not zero. The shared
//!   tables' rows (`<table>_keys`) are not collected. Grants, renewals and
//!   releases wait while a batch runs (milliseconds).
//!
//! **ShedLock layout**: details in `<table>_tokens.details`
//! (`<locked_by> <encoded details>`, written by the statement or
//! transaction that bumps our token; ShedLock's table is never altered and
//! keeps exactly ShedLock's bytes). They are shown only while ShedLock's
//! row is unexpired and its `locked_by` is that grant's, so ShedLock's
//! holders never show ours. `list` scans ShedLock's table (`lock_until >
//! now` is held; ShedLock holders are listed with `token: None`, names
//! re-checked byte for byte since ShedLock's collation may ignore case);
//! `force_release` sets `lock_until = now` whoever holds it (a ShedLock
//! holder's `extend` and `unlock` then match nothing, as after its
//! `lockAtMostFor`), token counter kept. `gc` is `Unsupported`: ShedLock's
//! rows are ShedLock's, and the tokens rows are each name's only record
//! of its last token. The benchmark floor ([`floor::SqlFloor`]) refuses
//! `layout=shedlock` with a `Config` error, and the driver's descriptor
//! reports no floor for it (compare shows none rather than failing).
//!
//! **Session mode** (see the `session` module): MySQL/MariaDB report
//! holder details and `list` from the key's `<table>_session_tokens` row,
//! which the grant writes anyway (with the `GET_LOCK` name and details:
//! more binds, no extra round trip): one statement per page of at most
//! `limit` rows in key order, keeping those whose lock is held by the
//! row's last grant (`IS_USED_LOCK(lock_name) = conn`). PostgreSQL: no
//! details, `list` `Unsupported` (no per-key row). `gc`: `Unsupported`
//! (the token counters are each key's only record of its last token).
//!
//! *`force_release(key)`* in session mode **ends the holder's database
//! session**, which frees its lock: [`SqlSessionBackend`] holds each lock
//! on a connection of its own (a grant pins its connection until the
//! release, which checks the connection back in free; a connection in
//! doubt is closed, never reused), so only that lock is broken. It reads
//! the holder as `inspect` does, then:
//!
//! - PostgreSQL: one statement `SELECT pg_terminate_backend(pid, timeout)`
//!   over `pg_locks` (`locktype = 'advisory'`, the key's `classid`/`objid`
//!   halves, `objsubid = 1`, granted, this database) that terminates only
//!   if that pid still publishes the grant read (`application_name =
//!   'distlock <owner> <token>'`) and holds no other advisory lock, and
//!   waits (up to the operation timeout) for the backend to exit. Needs
//!   the holder's role, a superuser or `pg_signal_backend`.
//! - MySQL/MariaDB: `IS_USED_LOCK(name)` gives the holding connection; it
//!   is ended with `KILL CONNECTION id` only if the key's token row still
//!   names that connection, owner and token (one round trip before the
//!   `KILL`: a holder that releases and takes another key on the same
//!   connection in between would lose that lock instead), then waits for
//!   the server to free the lock. Any connection of the same user may be
//!   killed; other users' need `CONNECTION_ADMIN` (MySQL 8) / `CONNECTION
//!   ADMIN` (MariaDB 10.5+) or `SUPER`. The server cannot tell how many
//!   `GET_LOCK`s a connection holds without `performance_schema`, so a
//!   non-backend client that takes several through this crate's grant
//!   statement (the benchmark [`SessionFloor`] grants every key on its one
//!   session) would lose them all.
//!
//! It returns the holder as `inspect` reported it (owner, token), or
//! `None` when free. A holder that is not one of this crate's session
//! grants (another client's `pg_advisory_lock` / `GET_LOCK` on the same
//! server key, or a PostgreSQL session holding other advisory locks) is
//! left alone with `Unsupported`. The next grant's token comes from the
//! sequence / counter and is above the broken one; the broken holder's
//! guard reports Lost at its next keep-alive (the session's end shows as a
//! broken connection) and its renew and release fail.
//!
//! # Capability checklist
//!
//! - [x] fencing tokens, per key, strictly increasing ([`FencingScope::PerKey`](lock_core::FencingScope::PerKey))
//! - [x] tokens survive a database restart (committed rows are durable)
//! - [x] expiry by the database clock (SQLite: host clock)
//! - [x] notified waiting on PostgreSQL; polling with backoff elsewhere
//! - [x] fenced writes to your own tables in the same database ([`SqlFence`])
//! - [x] FIFO waiting for the mutex with `fair=true` (row mode); without it waiters race
//! - [x] multi-locks in one exchange (`try_acquire_all`, row mode)
//! - [x] read-write locks (writer preference, downgrade) and semaphores
//!   (FIFO waiters) in row mode, on all three databases; not in session mode
//! - [x] ShedLock's table as a layout (`layout=shedlock`, mutex only),
//!   excluding ShedLock's `JdbcTemplateLockProvider` both ways
//! - [x] holder details, `list`, `force_release` (row mode, ShedLock
//!   layout) and `gc` with a token floor (row mode); in session mode
//!   `force_release` only (it ends the holder's database session)
//!
//! # Caveats
//!
//! - Tokens can go backwards only if committed rows are lost: failing over
//!   to an *asynchronous* replica that missed the last grants, restoring a
//!   backup, or SQLite with `synchronous=NORMAL` after a power loss (not a
//!   process crash). Use synchronous replication where that matters.
//! - A TTL is enforced by the database's clock, while the holder's local
//!   deadline is measured from when the grant was *sent*, minus a drift
//!   allowance, so the holder stops believing before the database frees the
//!   row. A paused holder can still wake up late: use the token (or
//!   [`SqlFence`]) at the resource.
//! - After a database restart the first call finds its connection dead
//!   and retries once on a fresh one (dropping the other idle ones); it
//!   fails with a temporary [`ErrorKind::Unavailable`](lock_core::ErrorKind::Unavailable)
//!   only when the fresh connection fails too. A grant whose reply is lost
//!   and whose recovery fails as well (the database unreachable twice in a
//!   row) may leave the row held until its TTL.
//! - `sqlite::memory:` databases are private to one backend (one pooled
//!   connection); use a file to share locks.
//! - TLS needs the `tls-rustls` feature.
//! - The MySQL dialect is tested against MariaDB 10.11; MySQL 8 accepts the
//!   same statements (`VALUES()` in `ON DUPLICATE KEY UPDATE` is deprecated
//!   there but still works).
//!
//! # Tests
//!
//! `cargo test -p lock-sql` starts PostgreSQL 15 and MariaDB from the
//! Debian packages on free loopback ports (a missing server is a printed
//! skip locally and a failure under `CI`) and runs the shared conformance
//! suite on each and on a SQLite file, plus: several child processes (the
//! re-executed test binary) contending on one SQLite file, a holder process
//! killed mid-hold, a holder whose connections are killed and a database
//! killed and restarted mid-hold (the key frees by `expires_at`, tokens
//! never go backwards), NOTIFY wake-up latency and fenced writes. For
//! SQLite, "unreachable" is another connection holding `BEGIN EXCLUSIVE`.
//!
//! `tests/round_trips.rs` counts round trips per cycle through the fault
//! proxy on PostgreSQL and MariaDB (ours and the floor: 2; an extra
//! statement fails it), cuts and kills connections under the backend (one
//! retry on one fresh connection), loses a grant's reply (recovered by
//! owner) and checks that waiters come before a releasing holder.
//!
//! `tests/{postgres,mariadb,sqlite}.rs` also run the mutex cases on a
//! `fair=true` target (FIFO among them), the fair checks (`fair_checks`:
//! fair and unfair clients exclude each other, a try refused while a
//! waiter lives, a dead waiter skipped within its lease, a cancelled
//! waiter's row withdrawn, a releasing holder queued behind a waiter) and
//! the multi-lock checks (`multi_checks`); SQLite also shows each failing
//! on a broken variant (an unfair tryer, a never-skipping backend, a leaked
//! wait, a "fair" client on another table, an unfair releasing holder, a
//! set taken one by one without rollback, an unfair set).
//!
//! `tests/shared.rs` runs the read-write lock and semaphore checks
//! (exclusion under contention, readers overlapping, writer preference,
//! FIFO permits, downgrade, limit mismatch, a crashed holder's expiry,
//! tokens, cancelled waits, mixed `renew_many`, no row left behind) on
//! PostgreSQL, MariaDB and SQLite; `tests/shared_broken.rs` shows each
//! check failing on a broken wrapper made for it;
//! `tests/shared_round_trips.rs` counts their round trips and the permit
//! floor's ([`floor::SqlPermitFloor`]) through the fault proxy.
//!
//! The shared suite's operating cases (`holder_details_are_reported`,
//! `list_finds_held_locks`, `force_release_fences_the_old_holder`) pass on
//! PostgreSQL, MariaDB and SQLite in row mode and on the ShedLock layout,
//! and `force_release_fences_the_old_holder` in session mode on PostgreSQL
//! and MariaDB, where `tests/session_common` (`force_released`,
//! `force_release_spares_foreign_sessions`) also checks the holder's guard
//! goes Lost within the TTL, its other lock survives, and that a foreign
//! session (a raw client holding two locks; on PostgreSQL the benchmark
//! floor's session holding two keys) is refused and left alive (controls:
//! skipping the terminate fails "still held after force_release"; killing
//! foreign holders fails "the foreign session was ended"; terminating
//! sessions with other advisory locks fails the floor check);
//! `tests/admin_checks` (from `tests/postgres.rs`, `tests/mariadb.rs`,
//! `tests/sqlite.rs`) checks `gc` (tokens above the floor after re-grant,
//! a held and a young row kept; control: a row deleted by hand restarts
//! at 1 and the check reports it), the `details` column added by four
//! concurrent connects to a lease and a holders table without it
//! (control: the grants fail before), `list`'s and `list_shared`'s
//! escaped wildcards and refused cursors; `shared_holder_details_are_reported`
//! and `list_finds_shared_locks` pass in row mode (controls: no details
//! bound fails the first, a page ignoring its cursor the second);
//! `tests/shedlock.rs` checks details beside ShedLock's unchanged row
//! while ShedLock is still refused, none shown for a ShedLock holder,
//! force-releasing ShedLock's holder and ours, and the refused floor.
//!
//! `cargo run --release -p lock-sql --example sql_bench` compares our
//! acquire+release cycle, as users write it, with the same two statements
//! issued by hand on one bare connection ([`floor::SqlFloor`], also used by
//! `distlock compare`): 1 client, 8 independent clients on 8 keys, 4
//! independent clients contending on one key.
//!
//! # Example
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

#![deny(missing_docs)]
// With only some dialects compiled in, helpers of the others go unused.
#![cfg_attr(
    not(all(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code, irrefutable_let_patterns, unused_imports, unused_variables)
)]

mod admin;
mod config;
mod conn;
mod descriptor;
mod dialect;
mod driver;
mod error;
mod fence;
pub mod floor;
mod granted;
mod multi;
pub mod renew_many;
mod session;
mod shared;
mod shedlock;
mod sql;
mod wake;

pub use config::{
    DEFAULT_TABLE, MAX_TABLE_LEN, SHEDLOCK_TABLE, SqlConfig, SqlDialect, SqlLayout, SqlMode,
};
pub use descriptor::DRIVER;
pub use driver::{MIN_TTL, SqlBackend};
pub use fence::SqlFence;
pub use floor::SessionFloor;
pub use session::{MYSQL_SESSION_MIN_TTL, PG_SESSION_MIN_TTL, SqlAnyBackend, SqlSessionBackend};
pub use shedlock::{SHEDLOCK_MAX_NAME, SqlShedLockBackend};

/// The sqlx this crate uses, so fenced statements name the same types.
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
