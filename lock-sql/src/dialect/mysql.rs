//! MySQL / MariaDB: `UTC_TIMESTAMP(6)` (fixed for the duration of a
//! statement), keys bound as bytes (`VARBINARY`: exact, case-sensitive),
//! positional `?` placeholders, and a grant that reports its outcome
//! through `LAST_INSERT_ID(expr)` in the OK packet (row counts cannot tell:
//! sqlx sets `CLIENT_FOUND_ROWS`, so an unchanged duplicate also reports
//! 1). No `RETURNING` on `UPDATE`: a batch renewal only says how many rows
//! matched.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{FencingScope, HolderDetails, LockError};
use sqlx::{AssertSqlSafe, Row};

use super::{
    Arg, Batch, DETAILS_LEN, Dialect, GcLock, GrantAll, GrantReply, LeaseBinds, LeaseSql, Params,
    Profile, SessionDialect, SessionHolder, SessionListed, SessionProfile, SharedDdl, SqlxResult,
    UpsertBinds, WaitersIndex, marks, parse_options, spliced_batch, wrong_conn,
};
use crate::config::SqlConfig;
use crate::connection::{DbConn, DbOptions};
use crate::dialect::session::{
    Granted, KillTarget, Killed, ListPage, OnSession, Publication, ServerKey, SessionGrant,
    SessionLock, mysql_wait_timeout, token_of as session_token,
};
use crate::dialect::session::{MariaSessionSql, RunSql, SessionSql};
use crate::error::{is_duplicate_column, is_missing_column};

/// MySQL and MariaDB.
#[derive(Debug)]
pub(crate) struct MySql;

/// The session token table's columns written by the grant beside the
/// counter (added at connect to a table created before them): the
/// `GET_LOCK` name (`list` asks the server who holds it), the encoded
/// holder details, and the token they were written with.
fn session_columns() -> [(&'static str, String); 3] {
    [
        ("lock_name", "VARCHAR(64) NULL".to_owned()),
        ("details", format!("VARCHAR({DETAILS_LEN}) NULL")),
        ("details_token", "BIGINT NULL".to_owned()),
    ]
}

/// "Now" on MySQL's clock (fixed for the duration of a statement).
const NOW: &str = "UTC_TIMESTAMP(6)";

/// The `ON DUPLICATE KEY UPDATE` of the lease grants: an existing row is
/// taken over only when it expired by [`NOW`], its token bumped. MySQL
/// applies the assignments left to right, so `expires_at` comes last and
/// the conditions before it see the old value. When `reported`,
/// `LAST_INSERT_ID(expr)` carries the new token in the OK packet, and 0
/// when the row is still held.
fn take_over_expired(reported: bool) -> String {
    let (bumped, kept) = if reported {
        ("LAST_INSERT_ID(token + 1)", "token + LAST_INSERT_ID(0)")
    } else {
        ("token + 1", "token")
    };
    format!(
        "ON DUPLICATE KEY UPDATE \
         token = IF(expires_at <= {NOW}, {bumped}, {kept}), \
         owner = IF(expires_at <= {NOW}, VALUES(owner), owner), \
         details = IF(expires_at <= {NOW}, VALUES(details), details), \
         expires_at = IF(expires_at <= {NOW}, VALUES(expires_at), expires_at)"
    )
}

/// A token row's details, only when written by its last grant.
const DETAILS_OF_GRANT: &str = "CASE WHEN t.details_token = t.token THEN t.details END";

/// What session mode is on this database, as data.
static SESSION: SessionProfile = SessionProfile {
    name: "mysql-session",
    min_ttl: crate::config::MYSQL_SESSION_MIN_TTL,
    // A counter row per key.
    fencing: FencingScope::PerKey,
    // The token row carries them.
    details: true,
    counter_suffix: "_session_tokens",
};

/// `UTC_TIMESTAMP(6)` in SQL, keys bound as bytes, the grant's token in
/// the OK packet, a batch renewal that only says how many rows matched.
static PROFILE: Profile = Profile {
    name: "mysql",
    quote: '`',
    name_text: "CONVERT(name USING utf8mb4)",
    for_update: " FOR UPDATE",
    notified: false,
    single_writer: false,
    pool_size: (10, 10),
    busy_timeout: false,
    int_type: "SIGNED",
    now_sql: NOW,
    left_micros: "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)",
    begin: "BEGIN",
    binds_now: false,
    binds: LeaseBinds {
        grant: &[
            Arg::KeyBytes,
            Arg::Owner,
            Arg::Ttl,
            Arg::Details,
            Arg::AheadKeyBytes,
            Arg::Ahead,
        ],
        release: &[Arg::KeyBytes, Arg::Owner, Arg::Token],
        // CLIENT_FOUND_ROWS: matched rows, and the WHERE clause is the
        // ownership check.
        renew: &[Arg::Ttl, Arg::KeyBytes, Arg::Owner, Arg::Token],
        inspect: &[Arg::KeyBytes],
        grant_reply: GrantReply::LastInsertId,
        batch: Batch::Spliced {
            lead: &[Arg::Ttl],
            key: Arg::KeyBytes,
            returns: false,
        },
    },
    params: Params::Positional,
    micros_later: ["UTC_TIMESTAMP(6) + INTERVAL ", " MICROSECOND"],
    shared: SharedDdl {
        name: "VARBINARY(1024)",
        shape: "VARCHAR(16)",
        owner: "VARCHAR(64)",
        kind: "VARCHAR(32)",
        int: "BIGINT",
        time: "DATETIME(6)",
        details: Some(" NULL"),
        waiter_id: "BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
        keyed_options: " ENGINE=InnoDB",
        waiters_options: " ENGINE=InnoDB",
        waiters_index: WaitersIndex::Inline,
    },
};

impl Dialect for MySql {
    fn statements(&self, t: &str, first: &str) -> LeaseSql {
        LeaseSql {
            grant: format!(
                "INSERT INTO {t} (name, owner, token, expires_at, details) \
                 VALUES (?, ?, LAST_INSERT_ID({first}), {NOW} + INTERVAL ? MICROSECOND, ?) {}",
                take_over_expired(true)
            ),
            release: format!(
                "UPDATE {t} SET owner = NULL, details = NULL, expires_at = UTC_TIMESTAMP(6) \
                 WHERE name = ? AND owner = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)"
            ),
            renew: format!(
                "UPDATE {t} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                 WHERE name = ? AND owner = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)"
            ),
            inspect: format!(
                "SELECT owner, token, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), details \
                 FROM {t} WHERE name = ? AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)"
            ),
            // Waiters poll: nothing to notify.
            waiting: None,
        }
    }

    fn add_details_sql(&self, t: &str) -> String {
        format!("ALTER TABLE {t} ADD COLUMN details VARCHAR({DETAILS_LEN}) NULL")
    }

    // LOCK TABLES makes every other session's statement on the two tables
    // wait (it waits itself for the running ones): a grant reads the
    // floor after gc committed. InnoDB wants autocommit off around it.
    fn gc_lock(&self, t: &str, f: &str, wait_ms: u128) -> GcLock {
        let restore = vec![
            "UNLOCK TABLES".to_owned(),
            "SET autocommit = 1, SESSION lock_wait_timeout = DEFAULT".to_owned(),
        ];
        GcLock {
            begin: vec![
                format!(
                    "SET autocommit = 0, SESSION lock_wait_timeout = {}",
                    wait_ms.div_ceil(1000).max(1)
                ),
                format!("LOCK TABLES {t} WRITE, {f} WRITE"),
            ],
            commit: std::iter::once("COMMIT".to_owned())
                .chain(restore.iter().cloned())
                .collect(),
            abort: std::iter::once("ROLLBACK".to_owned())
                .chain(restore)
                .collect(),
        }
    }

    fn raise_floor_sql(&self, f: &str) -> String {
        format!(
            "INSERT INTO {f} (id, token) VALUES (1, ?) \
             ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token))"
        )
    }

    fn owner_predicate(&self, t: &str, _first: usize) -> String {
        format!(
            "EXISTS (SELECT 1 FROM {t} WHERE name = ? AND owner = ? AND token = ? \
             AND expires_at > UTC_TIMESTAMP(6) LOCK IN SHARE MODE)"
        )
    }

    // A WHERE needs a FROM on MySQL before 8.0.
    fn owner_check_sql(&self, t: &str) -> String {
        format!("SELECT 1 FROM DUAL WHERE {}", self.owner_predicate(t, 1))
    }

    fn renew_batch_sql(&self, table: &str, rows: usize) -> String {
        let set = format!("{NOW} + INTERVAL ? MICROSECOND");
        spliced_batch(table, &set, NOW, rows, "", "", || "?".to_owned())
    }

    fn connect_options(&self, config: &SqlConfig) -> Result<DbOptions, LockError> {
        Ok(DbOptions::MySql(parse_options(config)?))
    }

    // No RETURNING: the upsert takes the free rows (and locks every row),
    // then a locking read says which are ours. The waiters check locks
    // their index range in share mode: no waiter registers meanwhile.
    fn grant_all_sql(&self, t: &str, first: &str, w: Option<&str>, n: usize) -> GrantAll {
        let rows = vec![format!("(?, ?, {first}, {NOW} + INTERVAL ? MICROSECOND, ?)"); n];
        GrantAll::Transaction {
            begin: "BEGIN",
            check: w.map(|w| {
                format!(
                    "SELECT COUNT(*) FROM {w} WHERE name IN ({}) AND shape = 'mutex' \
                     AND expires_at > {NOW} LOCK IN SHARE MODE",
                    marks(n)
                )
            }),
            upsert: format!(
                "INSERT INTO {t} (name, owner, token, expires_at, details) VALUES {} {}",
                rows.join(", "),
                take_over_expired(false)
            ),
            rows: UpsertBinds::PerRow,
            returns: false,
            read: Some(format!(
                "SELECT CONVERT(name USING utf8mb4), owner, token FROM {t} \
                 WHERE name IN ({}) FOR UPDATE",
                marks(n)
            )),
        }
    }

    // An earlier live waiter leaves the SELECT empty: nothing is inserted,
    // LAST_INSERT_ID(expr) never runs and the OK packet reports 0.
    fn fair_grant_sql(&self, t: &str, first: &str, w: &str) -> String {
        format!(
            "INSERT INTO {t} (name, owner, token, expires_at, details) \
             SELECT ?, ?, LAST_INSERT_ID({first}), {NOW} + INTERVAL ? MICROSECOND, ? FROM DUAL \
             WHERE NOT EXISTS (SELECT 1 FROM {w} WHERE name = ? AND shape = 'mutex' \
             AND expires_at > {NOW} AND id < ?) {}",
            take_over_expired(true)
        )
    }

    /// The upsert takes the row's exclusive lock and bumps the counter; the
    /// locking read returns the latest committed values.
    fn lock_key_sql(&self, keys: &str) -> Vec<String> {
        vec![
            format!(
                "INSERT INTO {keys} (name, shape, token, epoch) VALUES (?, ?, ?, 0) \
                 ON DUPLICATE KEY UPDATE token = token + VALUES(token)"
            ),
            format!("SELECT token, epoch FROM {keys} WHERE name = ? AND shape = ? FOR UPDATE"),
        ]
    }

    /// `INSERT IGNORE` of an existing row takes a shared lock on it.
    fn lock_key_shared_sql(&self, keys: &str) -> Option<Vec<String>> {
        Some(vec![
            format!("INSERT IGNORE INTO {keys} (name, shape, token, epoch) VALUES (?, ?, 0, 0)"),
            format!(
                "SELECT token, epoch FROM {keys} WHERE name = ? AND shape = ? LOCK IN SHARE MODE"
            ),
        ])
    }

    fn insert_waiter_sql(&self, waiters: &str, _lease: &str) -> Vec<String> {
        vec![
            format!(
                "INSERT INTO {waiters} (name, shape, owner, kind, cnt, lim, expires_at) \
                 VALUES (?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)"
            ),
            "SELECT CAST(LAST_INSERT_ID() AS SIGNED)".to_owned(),
        ]
    }

    fn profile(&self) -> &'static Profile {
        &PROFILE
    }
}

/// Session mode: `GET_LOCK`, tokens from a counter row per key.

#[async_trait]
impl SessionDialect for MySql {
    fn session_profile(&self) -> &'static SessionProfile {
        &SESSION
    }

    // One row per key, never deleted: the token column is bumped only by a
    // statement whose GET_LOCK succeeded, so the grants of a key are
    // serialized by its lock and the counter strictly increases.
    // LAST_INSERT_ID(expr) carries the new token back in the OK packet; no
    // row is selected (and 0 reported) when GET_LOCK returned 0 (held until
    // the timeout) or NULL (error).
    fn session_sql(&self, table: &str) -> SessionSql {
        let tok = &crate::dialect::session::suffixed('`', table, SESSION.counter_suffix);
        SessionSql {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {tok} (\
                 name VARBINARY(1024) NOT NULL PRIMARY KEY, \
                 token BIGINT NOT NULL, \
                 owner VARCHAR(64) NOT NULL, \
                 conn BIGINT NOT NULL, \
                 {cols}) ENGINE=InnoDB",
                cols = session_columns()
                    .map(|(c, ty)| format!("{c} {ty}"))
                    .join(", "),
            ),
            check: String::new(),
            // `details_token = token` comes after the token's assignment,
            // so it is the new token: details written by a client that
            // does not write them (an older version) are told stale.
            grant: format!(
                "INSERT INTO {tok} (name, token, owner, conn, lock_name, details, details_token) \
                 SELECT ?, LAST_INSERT_ID(1), ?, CONNECTION_ID(), ?, ?, 1 FROM DUAL \
                 WHERE GET_LOCK(?, ?) = 1 \
                 ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), \
                 owner = VALUES(owner), conn = VALUES(conn), lock_name = VALUES(lock_name), \
                 details = VALUES(details), details_token = token"
            ),
            wait: String::new(),
            release: "SELECT RELEASE_LOCK(?)".to_owned(),
            holds: "SELECT IS_USED_LOCK(?) = CONNECTION_ID()".to_owned(),
            // A locking read of the token row: a grant whose GET_LOCK has
            // succeeded but whose row update is not committed yet (same
            // statement) would otherwise show its lock with the row of the
            // grant before it, the same connection's when that released and
            // granted again: the last token reported for the new holder.
            inspect: format!(
                "SELECT u.c, t.token, t.owner, t.conn, {DETAILS_OF_GRANT} \
                 FROM (SELECT IS_USED_LOCK(?) AS c) u LEFT JOIN {tok} t ON t.name = ? \
                 LOCK IN SHARE MODE"
            ),
            list: list_holder_rows(tok, DETAILS_OF_GRANT),
            kill_holder: kill_holder_check(tok),
            session_id: Arc::from("SELECT CAST(CONNECTION_ID() AS SIGNED)"),
            counter: tok.to_owned(),
            holders: tok.to_owned(),
            fencing: SESSION.fencing,
            maria: None,
            run: None,
        }
    }

    fn session_options(&self, config: &SqlConfig) -> Result<DbOptions, LockError> {
        Ok(DbOptions::MySql(parse_options(config)?))
    }

    /// `wait_timeout`, the TTL in whole seconds rounded up: see
    /// `server_may_end_session_after` for the liveness rule.
    fn idle_timeout_secs(&self, ttl: Duration) -> Option<u64> {
        Some(mysql_wait_timeout(ttl))
    }

    async fn arm_idle_timeout(&self, conn: &mut DbConn, secs: u64) -> SqlxResult<()> {
        sqlx::query("SET SESSION wait_timeout = ?")
            .bind(secs)
            .execute(my(conn)?)
            .await?;
        Ok(())
    }

    async fn session_grant(
        &self,
        on: OnSession<'_>,
        grant: &SessionGrant<'_>,
    ) -> SqlxResult<Granted> {
        // GET_LOCK(name, 0) tries; a positive timeout waits.
        let seconds = grant.wait.map_or(0.0, |w| w.as_secs_f64().max(0.001));
        if let Some(maria) = &on.sql.maria {
            return maria_grant(on.conn, &on.sql.grant, maria, grant, on.run_base, seconds).await;
        }
        let lock_name = grant.lock.server_key.mysql.as_str();
        let done = sqlx::query(AssertSqlSafe(on.sql.grant.as_str()))
            .bind(grant.lock.key)
            .bind(grant.owner)
            .bind(lock_name)
            .bind(HolderDetails::encode_current())
            .bind(lock_name)
            .bind(seconds)
            .execute(my(on.conn)?)
            .await?;
        Ok(session_token(i64::try_from(done.last_insert_id()).ok()))
    }

    async fn session_release(&self, on: OnSession<'_>, key: &ServerKey) -> SqlxResult<bool> {
        answers_one(on.conn, &on.sql.release, key).await
    }

    async fn session_publish(
        &self,
        on: OnSession<'_>,
        publication: &Publication<'_>,
    ) -> SqlxResult<bool> {
        match &on.sql.maria {
            Some(maria) => publish_holder(my(on.conn)?, maria, publication).await,
            None => Ok(false),
        }
    }

    async fn session_withdraw(&self, on: OnSession<'_>, key: &[u8], token: u64) -> SqlxResult<()> {
        let Some(maria) = &on.sql.maria else {
            return Ok(());
        };
        sqlx::query(AssertSqlSafe(maria.withdraw.as_str()))
            .bind(key)
            .bind(i64::try_from(token).unwrap_or(i64::MAX))
            .execute(my(on.conn)?)
            .await
            .map(drop)
    }

    async fn session_holds(&self, on: OnSession<'_>, key: &ServerKey) -> SqlxResult<bool> {
        answers_one(on.conn, &on.sql.holds, key).await
    }

    async fn session_inspect(
        &self,
        on: OnSession<'_>,
        lock: SessionLock<'_>,
    ) -> SqlxResult<Option<SessionHolder>> {
        let row = sqlx::query(AssertSqlSafe(on.sql.inspect.as_str()))
            .bind(lock.server_key.mysql.as_str())
            .bind(lock.key)
            .fetch_one(my(on.conn)?)
            .await?;
        let Some(holder) = row.try_get::<Option<i64>, _>(0)? else {
            return Ok(None);
        };
        Ok(Some(ours(holder, &row, 1)?.unwrap_or(SessionHolder {
            session: holder,
            unpublished: true,
            ..SessionHolder::default()
        })))
    }

    async fn session_list(
        &self,
        on: OnSession<'_>,
        page: ListPage<'_>,
    ) -> SqlxResult<Option<Vec<SessionListed>>> {
        let rows = sqlx::query(AssertSqlSafe(on.sql.list.as_str()))
            .bind(page.prefix)
            .bind(page.after.as_bytes())
            .bind(page.limit)
            .fetch_all(my(on.conn)?)
            .await?;
        let mut page = Vec::with_capacity(rows.len());
        for row in &rows {
            let name: Vec<u8> = row.try_get(0)?;
            let holder = match row.try_get::<Option<i64>, _>(5)? {
                Some(holder) => ours(holder, row, 1)?,
                None => None,
            };
            page.push((name, holder));
        }
        Ok(Some(page))
    }

    // KILL takes no placeholder; the id is our own integer. Connection ids
    // only grow while the server runs (never reused), so the id alone
    // names the waiting session.
    async fn kill_session(&self, conn: &mut DbConn, victim: i64, _owner: &str) -> SqlxResult<()> {
        sqlx::query(AssertSqlSafe(format!("KILL {victim}")))
            .execute(my(conn)?)
            .await
            .map(drop)
    }

    // Two round trips: no statement both checks and kills. A holder that
    // releases and regrants another key on the same connection between
    // them loses that lock (crate docs, "Operating locks").
    async fn kill_holder(&self, on: OnSession<'_>, target: KillTarget<'_>) -> SqlxResult<Killed> {
        let KillTarget {
            lock: SessionLock { key, server_key },
            victim,
            owner,
            token,
            wait,
        } = target;
        let conn = my(on.conn)?;
        let still: i64 = sqlx::query_scalar(AssertSqlSafe(on.sql.kill_holder.as_str()))
            .bind(key)
            .bind(i64::try_from(token).unwrap_or(i64::MAX))
            .bind(owner)
            .bind(victim)
            .bind(server_key.mysql.as_str())
            .fetch_one(&mut *conn)
            .await?;
        if still == 0 {
            return Ok(Killed::Changed);
        }
        match sqlx::query(AssertSqlSafe(format!("KILL CONNECTION {victim}")))
            .execute(&mut *conn)
            .await
        {
            Ok(_) => {}
            // ER_NO_SUCH_THREAD: it ended meanwhile (its lock with it).
            Err(sqlx::Error::Database(db))
                if db.code().as_deref() == Some("HY000")
                    && db
                        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                        .is_some_and(|e| e.number() == 1094) => {}
            Err(e) => return Err(e),
        }
        // KILL only flags the connection: wait until the server has freed
        // the lock (the victim's thread cleans up asynchronously).
        let until = tokio::time::Instant::now() + wait;
        loop {
            let holder: Option<i64> = sqlx::query_scalar("SELECT IS_USED_LOCK(?)")
                .bind(server_key.mysql.as_str())
                .fetch_one(&mut *conn)
                .await?;
            if holder != Some(victim) || tokio::time::Instant::now() >= until {
                return Ok(Killed::Ended);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn session_run(&self, on: OnSession<'_>) -> SqlxResult<Option<i64>> {
        let Some(run) = &on.sql.run else {
            return Ok(Some(0));
        };
        sqlx::query_scalar(AssertSqlSafe(run.read.as_str()))
            .fetch_optional(my(on.conn)?)
            .await
    }

    async fn start_run(&self, on: OnSession<'_>) -> SqlxResult<()> {
        let (Some(maria), Some(run)) = (&on.sql.maria, &on.sql.run) else {
            return Ok(());
        };
        start_run(my(on.conn)?, maria, run).await
    }

    fn is_missing_relation(&self, err: &sqlx::Error) -> bool {
        is_missing_table(err)
    }

    // A table created before the grant wrote them gets the columns here
    // (each probed, added only when missing; a concurrent connect adding
    // it first is not an error).
    async fn prepare_session_schema(
        &self,
        on: OnSession<'_>,
        create: bool,
    ) -> SqlxResult<Option<String>> {
        if let Some(maria) = &on.sql.maria {
            if create {
                let conn = my(on.conn)?;
                sqlx::query(AssertSqlSafe(HOLDERS_HEAP_SIZE.as_str()))
                    .execute(&mut *conn)
                    .await?;
                let created = async {
                    sqlx::query(AssertSqlSafe(on.sql.create.as_str()))
                        .execute(&mut *conn)
                        .await?;
                    let run = on.sql.run.iter().map(|run| &run.create);
                    for create in std::iter::once(&maria.create_clock).chain(run) {
                        sqlx::query(AssertSqlSafe(create.as_str()))
                            .execute(&mut *conn)
                            .await?;
                    }
                    grow_holders(conn, maria).await
                }
                .await;
                sqlx::query("SET SESSION max_heap_table_size = DEFAULT")
                    .execute(&mut *conn)
                    .await?;
                created?;
            }
            return Ok(None);
        }
        if create {
            let (conn, sql) = (my(on.conn)?, on.sql);
            sqlx::query(AssertSqlSafe(sql.create.as_str()))
                .execute(&mut *conn)
                .await?;
            let tok = &sql.counter;
            for (column, ty) in session_columns() {
                let probe = format!("SELECT {column} FROM {tok} WHERE 1 = 0");
                match sqlx::query(AssertSqlSafe(probe)).execute(&mut *conn).await {
                    Err(e) if is_missing_column(&e) => {}
                    other => {
                        other?;
                        continue;
                    }
                }
                tracing::info!(table = tok, column, "adding a session token column");
                let alter = format!("ALTER TABLE {tok} ADD COLUMN {column} {ty}");
                match sqlx::query(AssertSqlSafe(alter)).execute(&mut *conn).await {
                    Err(e) if is_duplicate_column(&e) => {}
                    other => {
                        other?;
                    }
                }
            }
        }
        Ok(None)
    }
}

// The MariaDB session statements (`MariaSessionSql`) are described
// where they are declared, in `dialect::session`.

/// The `max_heap_table_size` the holder table is created (and grown) with:
/// 256 MiB, about 150,000 keys (a row is about 1.7 KB, fixed length).
pub(crate) const HOLDERS_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// Sets [`HOLDERS_MAX_BYTES`] for this session.
static HOLDERS_HEAP_SIZE: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("SET SESSION max_heap_table_size = {HOLDERS_MAX_BYTES}"));

/// The base of the run's tokens in SQL: `epoch << 40` less the run's
/// clock origin, signed (an overflow past `BIGINT` is an error, not a
/// wrap). See [`MariaSessionSql`].
const RUN_BASE: &str = "epoch * 1099511627776 - origin";

/// `UUID_SHORT()` without its server-id byte, as a signed `BIGINT` (below
/// 2^56): the run clock's reading (see [`MariaSessionSql`]).
const RUN_CLOCK: &str = "CAST(UUID_SHORT() & 72057594037927935 AS SIGNED)";

/// Whether the server `SELECT VERSION()` describes takes session tokens
/// from the run clock ([`MariaSessionSql`]): MariaDB 10.3 or later, the
/// layout tested here; MySQL and earlier MariaDB keep a token row per key.
pub(crate) fn has_run_clock(version: &str) -> bool {
    if !version.to_ascii_lowercase().contains("mariadb") {
        return false;
    }
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= (10, 3)
}

/// Session mode's listing on MySQL/MariaDB: at most `limit` rows of the
/// holder (token) table `table` (the derived table), each with its
/// details (`details`, an expression of the row `t`), then who holds each
/// one's lock now.
fn list_holder_rows(table: &str, details: &str) -> String {
    format!(
        "SELECT p.name, p.token, p.owner, p.conn, p.details, IS_USED_LOCK(p.lock_name) \
         FROM (SELECT name, token, owner, conn, lock_name, {details} AS details \
         FROM {table} t WHERE name LIKE ? ESCAPE '!' AND name > ? ORDER BY name LIMIT ?) p \
         ORDER BY p.name"
    )
}

/// The check before `KILL CONNECTION`: the grant inspect saw still holds
/// it (the same connection holds the lock and made the key's last grant in
/// holder table `table`, with this token).
fn kill_holder_check(table: &str) -> String {
    format!(
        "SELECT COUNT(*) FROM {table} t WHERE t.name = ? AND t.token = ? \
         AND t.owner = ? AND t.conn = ? AND IS_USED_LOCK(?) = t.conn"
    )
}

/// MariaDB's session statements for lease table `table` (validated).
pub(crate) fn mariadb_session_sql(table: &str) -> SessionSql {
    use crate::dialect::session::suffixed;
    let q = |suffix: &str| suffixed('`', table, suffix);
    let (h, runs, clock) = (
        q("_session_holders"),
        q("_session_runs"),
        q("_session_clock"),
    );
    let holders_name = match format!("{table}_session_holders").split_once('.') {
        Some((schema, name)) => (Some(schema.to_owned()), name.to_owned()),
        None => (None, format!("{table}_session_holders")),
    };
    // The token is the grant's (bound), written only while this
    // connection holds the lock.
    let publish = format!(
        "INSERT INTO {h} (name, token, owner, conn, lock_name, details) \
         SELECT ?, ?, ?, CONNECTION_ID(), ?, ? FROM DUAL \
         WHERE IS_USED_LOCK(?) = CONNECTION_ID() \
         ON DUPLICATE KEY UPDATE token = VALUES(token), owner = VALUES(owner), \
         conn = VALUES(conn), lock_name = VALUES(lock_name), details = VALUES(details)"
    );
    let run_sql = RunSql {
        create: format!(
            "CREATE TABLE IF NOT EXISTS {runs} (id TINYINT NOT NULL PRIMARY KEY, \
             epoch BIGINT NOT NULL) ENGINE=InnoDB"
        ),
        read: format!("SELECT {RUN_BASE} FROM {clock} WHERE id = 1"),
        open_id: Arc::from(format!(
            "SELECT CAST(CONNECTION_ID() AS SIGNED), (SELECT {RUN_BASE} FROM {clock} WHERE id = 1)"
        )),
        bump: format!(
            "INSERT INTO {runs} (id, epoch) VALUES (1, LAST_INSERT_ID(1)) \
             ON DUPLICATE KEY UPDATE epoch = LAST_INSERT_ID(epoch + 1)"
        ),
        set: format!("INSERT IGNORE INTO {clock} (id, epoch, origin) VALUES (1, ?, {RUN_CLOCK})"),
    };
    let maria = MariaSessionSql {
        create_clock: format!(
            "CREATE TABLE IF NOT EXISTS {clock} (id TINYINT NOT NULL PRIMARY KEY, \
             epoch BIGINT NOT NULL, origin BIGINT NOT NULL) ENGINE=MEMORY"
        ),
        heap_size: "SELECT CAST(MAX_DATA_LENGTH AS SIGNED) FROM information_schema.TABLES \
                    WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?"
            .to_owned(),
        holders_name,
        heap_grow: format!("ALTER TABLE {h} ENGINE=MEMORY"),
        run_lock: format!("{table}!run"),
        unpublish: format!("DELETE FROM {h} WHERE name = ? AND conn = CONNECTION_ID()"),
        wait_lock: "SELECT GET_LOCK(?, ?)".to_owned(),
        wait_token: format!(
            "SELECT ? + {RUN_CLOCK} FROM DUAL WHERE IS_USED_LOCK(?) = CONNECTION_ID()"
        ),
        publish,
        withdraw: format!(
            "DELETE FROM {h} WHERE name = ? AND conn = CONNECTION_ID() AND token = ?"
        ),
        collect: format!("DELETE FROM {h} WHERE NOT (IS_USED_LOCK(lock_name) <=> conn)"),
    };
    SessionSql {
        // Fixed-length rows (MEMORY): a key is at most 256 bytes, owners,
        // lock names and encoded details are ASCII. A B-tree key, for
        // `list`'s range scan in key order (MEMORY's default is a hash).
        create: format!(
            "CREATE TABLE IF NOT EXISTS {h} (\
             name VARBINARY({key_len}) NOT NULL, \
             token BIGINT NOT NULL, \
             owner VARCHAR(64) CHARACTER SET ascii NOT NULL, \
             conn BIGINT NOT NULL, \
             lock_name VARCHAR(64) CHARACTER SET ascii NOT NULL, \
             details VARCHAR({DETAILS_LEN}) CHARACTER SET ascii NULL, \
             PRIMARY KEY USING BTREE (name)) ENGINE=MEMORY",
            key_len = lock_core::MAX_KEY_LEN
        ),
        check: String::new(),
        // The clock read only when GET_LOCK returned 1 (CASE evaluates as
        // needed).
        grant: format!("SELECT CASE WHEN GET_LOCK(?, 0) = 1 THEN ? + {RUN_CLOCK} END"),
        wait: String::new(),
        release: "SELECT RELEASE_LOCK(?)".to_owned(),
        holds: "SELECT IS_USED_LOCK(?) = CONNECTION_ID()".to_owned(),
        // No locking read needed: a MEMORY table is locked for the whole
        // statement, so a try's GET_LOCK and its row are seen together; a
        // waiting grant between its GET_LOCK and its publication shows
        // its lock with a row naming another connection (its own stale
        // row was deleted before the wait): the holder without token.
        inspect: format!(
            "SELECT u.c, t.token, t.owner, t.conn, t.details \
             FROM (SELECT IS_USED_LOCK(?) AS c) u LEFT JOIN {h} t ON t.name = ?"
        ),
        list: list_holder_rows(&h, "t.details"),
        kill_holder: kill_holder_check(&h),
        session_id: Arc::from("SELECT CAST(CONNECTION_ID() AS SIGNED)"),
        counter: clock,
        holders: h,
        fencing: FencingScope::Global,
        maria: Some(maria),
        run: Some(run_sql),
    }
}

/// MariaDB's grant (see [`MariaSessionSql`]): the lock and its token, no
/// holder row (written later, see `grants::session`, "Lazy holder rows").
/// A try is one statement; a wait three (the session's stale row of the
/// key deleted, the wait, the token). `try_statement` is the try.
async fn maria_grant(
    conn: &mut DbConn,
    try_statement: &str,
    maria: &MariaSessionSql,
    grant: &SessionGrant<'_>,
    run_base: i64,
    seconds: f64,
) -> SqlxResult<Granted> {
    let conn = my(conn)?;
    let lock_name = grant.lock.server_key.mysql.as_str();
    if grant.wait.is_none() {
        let token: Option<i64> = sqlx::query_scalar(AssertSqlSafe(try_statement))
            .bind(lock_name)
            .bind(run_base)
            .fetch_one(&mut *conn)
            .await?;
        return Ok(session_token(token));
    }
    sqlx::query(AssertSqlSafe(maria.unpublish.as_str()))
        .bind(grant.lock.key)
        .execute(&mut *conn)
        .await?;
    let got: Option<i64> = sqlx::query_scalar(AssertSqlSafe(maria.wait_lock.as_str()))
        .bind(lock_name)
        .bind(seconds)
        .fetch_one(&mut *conn)
        .await?;
    if got != Some(1) {
        return Ok(Granted::Held);
    }
    let token: Option<i64> = sqlx::query_scalar(AssertSqlSafe(maria.wait_token.as_str()))
        .bind(run_base)
        .bind(lock_name)
        .fetch_optional(&mut *conn)
        .await?
        .flatten();
    match session_token(token) {
        Granted::Token(token) => Ok(Granted::Token(token)),
        // No token: this connection does not hold the lock it was just
        // granted. Never reported as held.
        Granted::Held => {
            release_lock(conn, lock_name).await?;
            Err(sqlx::Error::Protocol(
                "the lock was not held by its session right after GET_LOCK granted it".into(),
            ))
        }
    }
}

/// Writes a grant's holder row (see `grants::session`, "Lazy holder
/// rows"), only while this connection holds the lock: whether it was
/// written. A full holder table (error 1114) is collected (rows whose
/// lock their session no longer holds) and the row written once more.
async fn publish_holder(
    conn: &mut sqlx::MySqlConnection,
    maria: &MariaSessionSql,
    publication: &Publication<'_>,
) -> SqlxResult<bool> {
    let lock_name = publication.lock.server_key.mysql.as_str();
    let token = i64::try_from(publication.token)
        .map_err(|_| sqlx::Error::Protocol("token out of range".into()))?;
    let mut collected = false;
    loop {
        let done = sqlx::query(AssertSqlSafe(maria.publish.as_str()))
            .bind(publication.lock.key)
            .bind(token)
            .bind(publication.owner)
            .bind(lock_name)
            .bind(publication.details)
            .bind(lock_name)
            .execute(&mut *conn)
            .await;
        match done {
            Ok(done) => return Ok(done.rows_affected() > 0),
            Err(e) if is_table_full(&e) && !collected => {
                collected = true;
                let gone = sqlx::query(AssertSqlSafe(maria.collect.as_str()))
                    .execute(&mut *conn)
                    .await?;
                tracing::warn!(
                    rows = gone.rows_affected(),
                    "session holder table full: collected the rows of free locks"
                );
            }
            Err(e) => return Err(e),
        }
    }
}

async fn release_lock(conn: &mut sqlx::MySqlConnection, lock_name: &str) -> SqlxResult<()> {
    sqlx::query("SELECT RELEASE_LOCK(?)")
        .bind(lock_name)
        .execute(conn)
        .await
        .map(drop)
}

/// ER_RECORD_FILE_FULL: the `MEMORY` table reached its size.
fn is_table_full(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db)
        if db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|e| e.number() == 1114))
}

/// ER_NO_SUCH_TABLE: the run table is not created yet (the first connect).
pub(crate) fn is_missing_table(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db)
        if db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|e| e.number() == 1146))
}

/// Starts a server run's tokens (see [`MariaSessionSql`]) on `conn`, a
/// connection of its own that the caller drops afterwards: dropped
/// mid-way, it takes its `GET_LOCK` with it. Under the run lock, when no
/// one started the run meanwhile: the durable run counter bumped, the
/// `MEMORY` row written with the epoch and the clock's origin, and the
/// holder table grown back to its size (a restart brings a `MEMORY`
/// table down to the server's `max_heap_table_size`).
async fn start_run(
    conn: &mut sqlx::MySqlConnection,
    maria: &MariaSessionSql,
    run: &RunSql,
) -> SqlxResult<()> {
    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 10)")
        .bind(maria.run_lock.as_str())
        .fetch_one(&mut *conn)
        .await?;
    if got != Some(1) {
        return Err(sqlx::Error::Protocol(
            "another client held the start of the server run's tokens for 10 s".into(),
        ));
    }
    let started: Option<i64> = sqlx::query_scalar(AssertSqlSafe(run.read.as_str()))
        .fetch_optional(&mut *conn)
        .await?;
    if started.is_none() {
        let bumped = sqlx::query(AssertSqlSafe(run.bump.as_str()))
            .execute(&mut *conn)
            .await?;
        let epoch = i64::try_from(bumped.last_insert_id())
            .map_err(|_| sqlx::Error::Protocol("run epoch out of range".into()))?;
        sqlx::query(AssertSqlSafe(run.set.as_str()))
            .bind(epoch)
            .execute(&mut *conn)
            .await?;
        sqlx::query(AssertSqlSafe(HOLDERS_HEAP_SIZE.as_str()))
            .execute(&mut *conn)
            .await?;
        if let Err(e) = grow_holders(conn, maria).await {
            tracing::warn!(error = %e, "could not grow the session holder table back");
        }
    }
    release_lock(conn, &maria.run_lock).await
}

/// Rebuilds the holder table at this session's `max_heap_table_size`
/// ([`HOLDERS_MAX_BYTES`]) when it is less than half that (a restart sets
/// a `MEMORY` table's limit to the server's global value, 16 MiB by
/// default: about 9,500 keys).
async fn grow_holders(conn: &mut sqlx::MySqlConnection, maria: &MariaSessionSql) -> SqlxResult<()> {
    let (schema, name) = &maria.holders_name;
    let size: Option<i64> = sqlx::query_scalar(AssertSqlSafe(maria.heap_size.as_str()))
        .bind(schema.as_deref())
        .bind(name.as_str())
        .fetch_optional(&mut *conn)
        .await?;
    let wanted = i64::try_from(HOLDERS_MAX_BYTES / 2).unwrap_or(i64::MAX);
    if size.is_some_and(|size| size < wanted) {
        tracing::info!(table = name, "growing the session holder table");
        sqlx::query(AssertSqlSafe(maria.heap_grow.as_str()))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

fn my(conn: &mut DbConn) -> Result<&mut sqlx::MySqlConnection, sqlx::Error> {
    #[allow(irrefutable_let_patterns)] // with only this dialect compiled in
    let DbConn::MySql(c) = conn else {
        return Err(wrong_conn("mysql"));
    };
    Ok(c)
}

/// Runs `statement`, which binds the lock's name once: whether it answers
/// 1 (`RELEASE_LOCK` released the lock, `IS_USED_LOCK` names this
/// connection; 0 or NULL otherwise).
async fn answers_one(
    conn: &mut DbConn,
    statement: &str,
    server_key: &ServerKey,
) -> Result<bool, sqlx::Error> {
    let answer: Option<i64> = sqlx::query_scalar(AssertSqlSafe(statement))
        .bind(server_key.mysql.as_str())
        .fetch_one(my(conn)?)
        .await?;
    Ok(answer == Some(1))
}

/// The holder of a session row (columns token, owner, conn, details from
/// `first`) when `holder`, the connection holding its lock now, made the
/// row's last grant; `None` otherwise (the lock is someone else's).
fn ours(
    holder: i64,
    row: &sqlx::mysql::MySqlRow,
    first: usize,
) -> Result<Option<SessionHolder>, sqlx::Error> {
    let token: Option<i64> = row.try_get(first)?;
    let owner: Option<String> = row.try_get(first + 1)?;
    let conn_id: Option<i64> = row.try_get(first + 2)?;
    let details: Option<String> = row.try_get(first + 3)?;
    Ok((conn_id == Some(holder)).then(|| SessionHolder {
        session: holder,
        owner,
        token: token.and_then(|t| u64::try_from(t).ok()),
        details,
        unpublished: false,
    }))
}

/// The liveness rule of session mode on MySQL/MariaDB: how long after the
/// last statement it received from a silent client (the holder's last
/// renewal at the latest) the server can end a session that holds a lock
/// of `ttl`, and with it the lock. It must never be shorter than the TTL,
/// or a partitioned holder loses its lock before its own deadline (last
/// renewal sent + TTL - drift).
///
/// What ends an idle or dead connection on the server:
/// - `wait_timeout`, which the grant sets (session scope) to the TTL in
///   whole seconds, rounded up;
/// - the TCP keep-alive the server turns on for every TCP client
///   (`SO_KEEPALIVE`): `keepalive` here, idle time plus unanswered probes.
///   Its settings (`tcp_keepalive_time`, `_interval`, `_probes`) are
///   GLOBAL only, 0 meaning the server host's own (Linux: 7200 s, 75 s,
///   9), so a client cannot move them out to its TTL as it does on
///   PostgreSQL: a TTL beyond them is not kept through a partition.
///
/// The others do not apply: `net_read_timeout` and `net_write_timeout`
/// only within a statement's packets, the `idle_*transaction_timeout`s only
/// to a session inside a transaction (a session-mode grant runs in
/// autocommit and leaves none open), `interactive_timeout` only at connect
/// (the grant's `wait_timeout` replaces it).
#[cfg(test)]
fn server_may_end_session_after(ttl: Duration, keepalive: Duration) -> Duration {
    Duration::from_secs(mysql_wait_timeout(ttl)).min(keepalive)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux's defaults, which the server uses with its own settings at 0
    /// (theirs): 7200 s idle, then 9 probes 75 s apart.
    const LINUX_KEEPALIVE: Duration = Duration::from_secs(7200 + 9 * 75);

    /// Every TTL session mode accepts, from the shortest, with odd
    /// fractions of a second (down to a nanosecond past a whole second).
    fn ttls(up_to: Duration) -> Vec<Duration> {
        let mut ttls = Vec::new();
        let mut ttl = crate::config::MYSQL_SESSION_MIN_TTL;
        while ttl <= up_to {
            for odd in [0, 1, 999, 1_000, 999_999, 1_000_001, 499_999_999] {
                ttls.push(ttl + Duration::from_nanos(odd));
            }
            ttl = ttl * 3 / 2 + Duration::from_millis(7);
        }
        ttls.push(up_to);
        ttls
    }

    /// The rule holds for every TTL within the server's keep-alive (Linux
    /// defaults): the server never ends a silent holder's session before
    /// the TTL has passed since the last thing it heard.
    #[test]
    fn the_server_never_ends_a_holders_session_before_the_ttl() {
        for ttl in ttls(LINUX_KEEPALIVE) {
            assert!(
                server_may_end_session_after(ttl, LINUX_KEEPALIVE) >= ttl,
                "TTL {ttl:?}: the server may end the session after {:?}",
                server_may_end_session_after(ttl, LINUX_KEEPALIVE)
            );
        }
    }

    /// The lease table's schema text, as deployed tables were created.
    #[test]
    fn lease_table_text_is_unchanged() {
        assert_eq!(
            MySql.lease_create("t"),
            format!(
                "CREATE TABLE IF NOT EXISTS t (name VARBINARY(1024) NOT NULL PRIMARY KEY, \
                 owner VARCHAR(64) NULL, token BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, \
                 details VARCHAR({DETAILS_LEN}) NULL) ENGINE=InnoDB"
            )
        );
    }

    /// The run clock from MariaDB 10.3 on; never on MySQL.
    #[test]
    fn the_run_clock_is_detected_from_the_version() {
        for (version, expected) in [
            ("10.11.19-MariaDB-0+deb12u1", true),
            ("10.3.0-MariaDB", true),
            ("11.4.2-MariaDB-log", true),
            ("10.2.44-MariaDB", false),
            ("5.5.5-10.11.6-MariaDB", false),
            ("8.0.36", false),
            ("8.4.0-commercial", false),
            ("", false),
        ] {
            assert_eq!(has_run_clock(version), expected, "{version}");
        }
    }

    /// The part the driver sets covers every TTL the API accepts:
    /// `wait_timeout` never undercuts it (only the server's keep-alive
    /// can, see `server_may_end_session_after`).
    #[test]
    fn wait_timeout_never_undercuts_the_ttl() {
        for ttl in ttls(lock_core::MAX_TTL) {
            let wait_timeout = Duration::from_secs(mysql_wait_timeout(ttl));
            assert!(
                wait_timeout >= ttl,
                "TTL {ttl:?}: wait_timeout {wait_timeout:?}"
            );
        }
    }
}
