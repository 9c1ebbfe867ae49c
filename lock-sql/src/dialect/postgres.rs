//! PostgreSQL: `now()` is the transaction start (each lock statement is its
//! own transaction), TTLs travel as microseconds, the release notifies
//! waiters in the same statement, a batch renewal sends its rows as three
//! arrays.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{FencingScope, Lease, LockError};
use sqlx::{AssertSqlSafe, Row};

use super::{
    Arg, Batch, DETAILS_LEN, Dialect, GcLock, GrantAll, GrantReply, LeaseBinds, LeaseSql, Params,
    Profile, Renewed, SessionDialect, SessionHolder, SessionProfile, SharedDdl, SqlxResult,
    WaitersIndex, WaitingSql, lease_upsert, micros, parse_options, text, token_of, wrong_conn,
};
use crate::config::SqlConfig;
use crate::connection::{DbConn, DbOptions};
use crate::dialect::session::SessionSql;
use crate::dialect::session::{
    Granted, KillTarget, Killed, OnSession, Publication, RUN_SHIFT, RunSql, ServerKey,
    SessionGrant, SessionLock, pg_idle_timeout, suffixed, token_of as session_token,
};

/// The `application_name` of a session-mode connection holding no grant
/// of ours (a grant publishes `distlock <owner hex> <token>`).
const IDLE_MARKER: &str = "distlock";

/// PostgreSQL.
#[derive(Debug)]
pub(crate) struct Postgres;

/// What session mode is on this database, as data.
static SESSION: SessionProfile = SessionProfile {
    name: "postgres-session",
    min_ttl: crate::config::PG_SESSION_MIN_TTL,
    // One sequence for every key (nextval order is the order of grants).
    fencing: FencingScope::Global,
    // No per-key row to carry them (see the session module docs).
    details: false,
    counter_suffix: "_session_useq",
};

/// The `LOGGED` token sequence of earlier versions (`CACHE 1`, its values
/// the tokens): the first run's epoch starts above its last value, so the
/// tokens of [`RunSql`] start above every token it handed out.
const OLD_SEQUENCE_SUFFIX: &str = "_session_seq";

/// `1 << RUN_SHIFT` in SQL: the first token of run 1, less one.
const RUN_UNIT: &str = "1099511627776";

/// `now()` in SQL; the release notifies (and answers its row).
static PROFILE: Profile = Profile {
    name: "postgres",
    quote: '"',
    name_text: "name",
    for_update: " FOR UPDATE",
    notified: true,
    single_writer: false,
    pool_size: (10, 10),
    busy_timeout: false,
    int_type: "BIGINT",
    now_sql: "now()",
    left_micros: "CAST(EXTRACT(EPOCH FROM (expires_at - now())) * 1000000 AS BIGINT)",
    begin: "BEGIN",
    binds_now: false,
    binds: LeaseBinds {
        grant: &[Arg::Key, Arg::Owner, Arg::Ttl, Arg::Ahead, Arg::Details],
        release: &[Arg::Key, Arg::Owner, Arg::Token, Arg::Channel],
        renew: &[Arg::Key, Arg::Owner, Arg::Token, Arg::Ttl],
        inspect: &[Arg::Key],
        grant_reply: GrantReply::Returning,
        // One text for any batch size: the rows travel as three arrays.
        batch: Batch::Arrays,
    },
    params: Params::Numbered("$"),
    micros_later: ["now() + ", " * INTERVAL '1 microsecond'"],
    shared: SharedDdl {
        name: "VARCHAR(1024)",
        shape: "VARCHAR(16)",
        owner: "VARCHAR(64)",
        kind: "VARCHAR(32)",
        int: "BIGINT",
        time: "TIMESTAMPTZ",
        details: Some(""),
        waiter_id: "BIGSERIAL PRIMARY KEY",
        keyed_options: "",
        waiters_options: "",
        waiters_index: WaitersIndex::Separate,
    },
};

/// The waiters' statements of lease table `t` (see [`WaitingSql`]).
fn waiting_sql(t: &str, first: &str) -> WaitingSql {
    // Every `CASE` reads the row as it was before the statement (`l`).
    let free = "l.expires_at <= now()";
    WaitingSql {
        grant: format!(
            "WITH g AS (INSERT INTO {t} AS l (name, owner, token, expires_at, details) \
             VALUES ($1, $2, {first}, now() + $3 * INTERVAL '1 microsecond', $4) \
             ON CONFLICT (name) DO UPDATE SET \
             owner = CASE WHEN {free} THEN excluded.owner ELSE l.owner END, \
             token = CASE WHEN {free} THEN l.token + 1 ELSE l.token END, \
             details = CASE WHEN {free} THEN excluded.details ELSE l.details END, \
             waiters_until = CASE WHEN {free} THEN l.waiters_until \
             ELSE GREATEST(l.waiters_until, now() + $5 * INTERVAL '1 microsecond') END, \
             expires_at = CASE WHEN {free} THEN excluded.expires_at ELSE l.expires_at END \
             RETURNING token, owner) \
             SELECT token FROM g WHERE owner = $2"
        ),
        mark: format!(
            "UPDATE {t} SET waiters_until = \
             GREATEST(waiters_until, now() + $2 * INTERVAL '1 microsecond') \
             WHERE name = $1 AND expires_at > now()"
        ),
        add_column: format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS waiters_until TIMESTAMPTZ"),
    }
}

impl Dialect for Postgres {
    fn statements(&self, t: &str, first: &str) -> LeaseSql {
        LeaseSql {
            grant: lease_upsert(
                t,
                &format!("VALUES ($1, $2, {first}, now() + $3 * INTERVAL '1 microsecond', $4)"),
                "now()",
                "token",
            ),
            // The notification is sent at commit, in the same statement,
            // only when someone waits (see `WaitingSql`): one row when
            // released either way.
            release: format!(
                "WITH r AS (UPDATE {t} SET owner = NULL, details = NULL, expires_at = now() \
                 WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > now() \
                 RETURNING name, waiters_until) \
                 SELECT CASE WHEN waiters_until > now() THEN pg_notify($4, name) END FROM r"
            ),
            renew: format!(
                "UPDATE {t} SET expires_at = now() + $4 * INTERVAL '1 microsecond' \
                 WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > now()"
            ),
            inspect: format!(
                "SELECT owner, token, \
                 CAST(EXTRACT(EPOCH FROM (expires_at - now())) * 1000000 AS BIGINT), details \
                 FROM {t} WHERE name = $1 AND owner IS NOT NULL AND expires_at > now()"
            ),
            waiting: Some(waiting_sql(t, first)),
        }
    }

    fn lease_create(&self, t: &str) -> String {
        // The waiters' deadline (see `WaitingSql`) is PostgreSQL's alone.
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (\
             name VARCHAR(1024) PRIMARY KEY, \
             owner VARCHAR(64), \
             token BIGINT NOT NULL, \
             expires_at TIMESTAMPTZ NOT NULL, \
             details VARCHAR({DETAILS_LEN}), \
             waiters_until TIMESTAMPTZ)"
        )
    }

    fn add_details_sql(&self, t: &str) -> String {
        format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS details VARCHAR({DETAILS_LEN})")
    }

    // SHARE ROW EXCLUSIVE conflicts with the ROW EXCLUSIVE lock every
    // grant, renewal and release takes before its snapshot: a grant waits
    // for gc's commit and then reads the raised floor.
    fn gc_lock(&self, t: &str, _f: &str, wait_ms: u128) -> GcLock {
        GcLock {
            begin: vec![
                "BEGIN".to_owned(),
                format!("SET LOCAL lock_timeout = {}", wait_ms.max(1)),
                format!("LOCK TABLE {t} IN SHARE ROW EXCLUSIVE MODE"),
            ],
            commit: vec!["COMMIT".to_owned()],
            abort: vec!["ROLLBACK".to_owned()],
        }
    }

    fn raise_floor_sql(&self, f: &str) -> String {
        format!(
            "INSERT INTO {f} AS x (id, token) VALUES (1, $1) \
             ON CONFLICT (id) DO UPDATE SET token = GREATEST(x.token, EXCLUDED.token) \
             RETURNING token"
        )
    }

    fn owner_predicate(&self, t: &str, n: usize) -> String {
        format!(
            "EXISTS (SELECT 1 FROM {t} WHERE name = ${} AND owner = ${} AND token = ${} \
             AND expires_at > now() FOR SHARE)",
            n,
            n + 1,
            n + 2
        )
    }

    fn renew_batch_sql(&self, table: &str, _rows: usize) -> String {
        format!(
            "UPDATE {table} AS l SET expires_at = now() + $1 * INTERVAL '1 microsecond' \
             FROM unnest($2::text[], $3::text[], $4::bigint[]) AS b(name, owner, token) \
             WHERE l.name = b.name AND l.owner = b.owner AND l.token = b.token \
             AND l.expires_at > now() RETURNING l.name, l.owner, l.token"
        )
    }

    fn connect_options(&self, config: &SqlConfig) -> Result<DbOptions, LockError> {
        let options = parse_options(config)?;
        Ok(if config.transaction_pooler {
            DbOptions::PostgresPooled(options)
        } else {
            DbOptions::Postgres(options)
        })
    }

    // Every key in one statement. A held key found in the statement's
    // snapshot refuses the set before any write; a set only partly free
    // after all (a grant racing ours) divides by zero, which rolls the
    // whole statement back.
    fn grant_all_sql(&self, t: &str, first: &str, w: Option<&str>, n: usize) -> GrantAll {
        let values: Vec<String> = (0..n)
            .map(|i| format!("(${}::varchar, {i})", i + 4))
            .collect();
        let fair = w.map_or_else(String::new, |w| {
            format!(
                " AND NOT EXISTS (SELECT 1 FROM {w} WHERE name IN (SELECT name FROM v) \
                 AND shape = 'mutex' AND expires_at > now())"
            )
        });
        let gate = format!(
            " WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE name IN (SELECT name FROM v) \
             AND expires_at > now()){fair}"
        );
        let details = n + 4;
        let source = format!(
            "SELECT name, $1, {first}, now() + $2 * INTERVAL '1 microsecond', ${details}::varchar \
             FROM v{gate} ORDER BY ord"
        );
        GrantAll::One(format!(
            "WITH v (name, ord) AS (VALUES {}), g AS ({}) \
             SELECT name, token, 1 / CASE WHEN (SELECT count(*) FROM g) = $3 THEN 1 ELSE 0 END FROM g",
            values.join(", "),
            lease_upsert(t, &source, "now()", "name, token")
        ))
    }

    // No row is inserted or taken over while an earlier live waiter is
    // queued: the SELECT yields nothing, so the conflict clause never runs.
    fn fair_grant_sql(&self, t: &str, first: &str, w: &str) -> String {
        let source = format!(
            "SELECT $1, $2, {first}, now() + $3 * INTERVAL '1 microsecond', $5 \
             WHERE NOT EXISTS (SELECT 1 FROM {w} WHERE name = $1 AND shape = 'mutex' \
             AND expires_at > now() AND id < $4)"
        );
        lease_upsert(t, &source, "now()", "token")
    }

    /// `DO UPDATE` locks the row and bumps the counter, in one round trip.
    fn lock_key_sql(&self, keys: &str) -> Vec<String> {
        vec![format!(
            "INSERT INTO {keys} AS k (name, shape, token, epoch) VALUES ($1, $2, $3, 0) \
             ON CONFLICT (name, shape) DO UPDATE SET token = k.token + excluded.token \
             RETURNING token, epoch"
        )]
    }

    fn lock_key_shared_sql(&self, keys: &str) -> Option<Vec<String>> {
        Some(vec![
            format!(
                "INSERT INTO {keys} (name, shape, token, epoch) VALUES ($1, $2, 0, 0) \
                 ON CONFLICT (name, shape) DO NOTHING"
            ),
            format!("SELECT token, epoch FROM {keys} WHERE name = $1 AND shape = $2 FOR SHARE"),
        ])
    }

    // The lease row's mark (`WaitingSql`) in the same statement: a
    // data-modifying `WITH` runs whether or not it is read.
    fn insert_waiter_sql(&self, waiters: &str, lease: &str) -> Vec<String> {
        vec![format!(
            "WITH m AS (UPDATE {lease} SET waiters_until = \
             GREATEST(waiters_until, now() + $7 * INTERVAL '1 microsecond') \
             WHERE name = $1 AND expires_at > now()) \
             INSERT INTO {waiters} (name, shape, owner, kind, cnt, lim, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, now() + $7 * INTERVAL '1 microsecond') RETURNING id"
        )]
    }

    /// The notification is sent at commit, in the same statement.
    fn notifying(&self, statement: &str) -> Option<String> {
        let next = statement.matches('$').count() + 1;
        Some(format!(
            "WITH changed AS ({statement} RETURNING name) \
             SELECT pg_notify(${next}, name) FROM changed"
        ))
    }

    fn profile(&self) -> &'static Profile {
        &PROFILE
    }
}

/// One batch renewal of `group` as three arrays (see
/// [`Batch::Arrays`]): the renewed rows.
pub(super) async fn renew_arrays(
    conn: &mut DbConn,
    sql: &Arc<str>,
    group: &[&Lease],
    owners: &[String],
    ttl: Duration,
) -> Result<Option<Renewed>, sqlx::Error> {
    let names: Vec<&str> = group.iter().map(|l| l.key().as_str()).collect();
    let tokens: Vec<i64> = group.iter().map(|l| token_of(l)).collect();
    let query = sqlx::query(text(sql))
        .bind(micros(ttl))
        .bind(names)
        .bind(owners)
        .bind(tokens);
    let mut renewed = Renewed::new();
    for row in crate::connection::pooler::pg_fetch_all(conn, sql, query).await? {
        renewed.insert((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?));
    }
    Ok(Some(renewed))
}

fn pg(conn: &mut DbConn) -> Result<&mut sqlx::PgConnection, sqlx::Error> {
    #[allow(irrefutable_let_patterns)] // with only this dialect compiled in
    let DbConn::Postgres(c) = conn else {
        return Err(wrong_conn("postgres"));
    };
    Ok(c)
}

/// How often a PostgreSQL backend running a statement checks that its
/// client is still there (PostgreSQL 14+), so a dropped waiting acquire
/// ends on the server soon even if the background kill cannot run.
const PG_CLIENT_CHECK: &str = "250ms";

/// The `application_name` prefix of a session waiting for a grant (the
/// owner follows): what a dropped wait's clean-up checks before it ends
/// the session by pid.
const WAITING_MARKER: &str = "distlock-waiting";

/// `application_name` of a session waiting for a grant to `owner`.
fn waiting_name(owner: &str) -> String {
    format!("{WAITING_MARKER} {owner}")
}

/// `tcp_keepalives_idle` (seconds) of a session-mode connection that holds
/// no lock; a grant sets the TTL instead (rounded up to whole seconds).
const IDLE_KEEPALIVE_IDLE: &str = "5";

/// The liveness rule of session mode on PostgreSQL: how long after the
/// last packet (or statement) it received from a silent client the server
/// can end a session that holds a lock of `ttl`, and with it the lock.
/// It must never be shorter than the TTL, or a partitioned holder loses
/// its lock before its own deadline (last renewal sent + TTL - drift): the
/// earlier of `idle_session_timeout` (the TTL in milliseconds, rounded up)
/// and the keep-alive (idle for the TTL in seconds rounded up, then
/// `tcp_keepalives_count` unanswered probes `tcp_keepalives_interval`
/// apart), as the grant statement and `session_options` set them.
#[cfg(test)]
fn server_may_end_session_after(ttl: Duration) -> Duration {
    let idle_session = Duration::from_millis(pg_idle_timeout(ttl).parse().unwrap_or(u64::MAX));
    let keepalive = Duration::from_secs(
        ttl.as_millis()
            .div_ceil(1000)
            .try_into()
            .unwrap_or(u64::MAX),
    ) + Duration::from_secs(1) * 3;
    idle_session.min(keepalive)
}

/// A quiet grant's deferred publication (`$1` owner hex, `$2` token): the
/// text the publishing grants set.
const PG_PUBLISH: &str =
    "SELECT set_config('application_name', 'distlock ' || $1::text || ' ' || $2::bigint, false)";

/// The waiting grant's subquery (`g.t`, the token): `lock_timeout` for
/// the wait (`$4`), the waiting marker published with the owner (`$2`), the
/// blocking lock (`$1`), the token of sequence `seq`.
fn waiting_grant(seq: &str) -> String {
    format!(
        "(SELECT CASE \
         WHEN set_config('lock_timeout', $4, false) IS NULL THEN NULL \
         WHEN set_config('application_name', '{WAITING_MARKER} ' || $2, false) IS NULL THEN NULL \
         WHEN pg_advisory_lock($1)::text IS NULL THEN NULL \
         ELSE nextval('{seq}') END AS t OFFSET 0) g"
    )
}

/// The waiting grant on a session armed for the lease already (see
/// `connection::session`'s lean statements): the full one without
/// setting `idle_session_timeout` and `tcp_keepalives_idle` (a
/// `setsockopt`) again, as the lean try (`$3`, the TTL, bound and
/// unused).
pub(crate) fn pg_lean_wait(seq: &str) -> String {
    format!(
        "SELECT g.t, CASE WHEN g.t IS NOT NULL AND $3::text IS NOT NULL THEN \
         set_config('application_name', 'distlock ' || $2 || ' ' || g.t, false) END FROM {}",
        waiting_grant(seq)
    )
}

/// Session mode: session-level advisory locks, tokens from one sequence.

#[async_trait]
impl SessionDialect for Postgres {
    fn session_profile(&self) -> &'static SessionProfile {
        &SESSION
    }

    // The grant's CASE runs `nextval` only when the try-lock succeeded
    // (CASE evaluates its branches in order and only as needed), and the
    // token and the holder's identity are published in `application_name`
    // for `inspect`. OFFSET 0 keeps the subquery from being flattened into
    // the outer query, so the volatile lock call is evaluated exactly once.
    fn session_sql(&self, table: &str) -> SessionSql {
        let q = |suffix: &str| suffixed('"', table, suffix);
        let (seq, runs, old) = (
            q(SESSION.counter_suffix),
            q("_session_runs"),
            q(OLD_SEQUENCE_SUFFIX),
        );
        let seq = seq.as_str();
        // With the grant, the server's own liveness checks move out to the
        // lease's TTL ($3, milliseconds): `idle_session_timeout` ends a
        // silent session no earlier than the TTL after its last statement,
        // and the keep-alive probes start no earlier than the TTL (whole
        // seconds, rounded up) after the last packet. Either way the server
        // frees the lock only after the holder's deadline (last renewal
        // sent + TTL - drift) has passed: see `liveness_rule`.
        let publish = "CASE WHEN g.t IS NOT NULL THEN \
             set_config('application_name', 'distlock ' || $2 || ' ' || g.t, false) \
             || set_config('idle_session_timeout', $3, false) \
             || set_config('tcp_keepalives_idle', ceil($3::numeric / 1000)::bigint::text, false) END";
        // The run is started when the sequence is at or above 2^40 (see
        // `RunSql`): crash recovery resets it to 1.
        let started = format!("SELECT CAST(0 AS BIGINT) FROM {seq} WHERE last_value >= {RUN_UNIT}");
        let run = RunSql {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {runs} (id SMALLINT PRIMARY KEY, epoch BIGINT NOT NULL)"
            ),
            open_id: Arc::from(format!(
                "SELECT CAST(pg_backend_pid() AS BIGINT), ({started})"
            )),
            read: started,
            // Only while the run is not started (a client that started it
            // meanwhile leaves nothing to do); above every epoch before and
            // above the old logged sequence's tokens.
            bump: format!(
                "WITH s AS (SELECT 1 FROM {seq} WHERE last_value < {RUN_UNIT}) \
                 INSERT INTO {runs} AS r (id, epoch) \
                 SELECT 1, COALESCE(pg_sequence_last_value(to_regclass('{old}')), 0) / {RUN_UNIT} + 1 \
                 FROM s ON CONFLICT (id) DO UPDATE SET epoch = GREATEST(r.epoch + 1, excluded.epoch) \
                 RETURNING epoch"
            ),
            // Raises only (see `pg_start_run`).
            set: format!("SELECT setval('{seq}', $1) FROM {seq} WHERE last_value < $1"),
        };
        SessionSql {
            create: format!(
                "CREATE UNLOGGED SEQUENCE IF NOT EXISTS {seq} AS BIGINT CACHE 1 NO CYCLE"
            ),
            check: "SELECT seqcache, seqcycle FROM pg_sequence WHERE seqrelid = $1::regclass"
                .to_owned(),
            grant: format!(
                "SELECT g.t, {publish} FROM (SELECT CASE WHEN pg_try_advisory_lock($1) \
                 THEN nextval('{seq}') END AS t OFFSET 0) g"
            ),
            wait: format!("SELECT g.t, {publish} FROM {}", waiting_grant(seq)),
            release: format!(
                "SELECT pg_advisory_unlock($1), \
                 set_config('application_name', '{IDLE_MARKER}', false), \
                 set_config('idle_session_timeout', '0', false), \
                 set_config('tcp_keepalives_idle', '{IDLE_KEEPALIVE_IDLE}', false)"
            ),
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
            // Only the grant inspect saw (same pid, same published owner
            // and token, so a pooled session regranted since is spared),
            // and only a session holding no other advisory lock: ending it
            // frees this lock and nothing else. pg_terminate_backend with
            // a timeout (14+) waits for the backend to exit.
            kill_holder: "SELECT CASE WHEN o.n = 1 THEN pg_terminate_backend(l.pid, $5) END, o.n \
                 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid, \
                 LATERAL (SELECT count(*) AS n FROM pg_locks x WHERE x.pid = l.pid \
                          AND x.locktype = 'advisory' AND x.granted) o \
                 WHERE l.locktype = 'advisory' AND l.classid::bigint = $1 \
                 AND l.objid::bigint = $2 AND l.objsubid = 1 AND l.granted \
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND l.pid = $3::int AND a.application_name = $4"
                .to_owned(),
            session_id: Arc::from("SELECT CAST(pg_backend_pid() AS BIGINT)"),
            list: String::new(),
            counter: seq.to_owned(),
            holders: String::new(),
            fencing: SESSION.fencing,
            maria: None,
            run: Some(run),
        }
    }

    fn session_options(&self, config: &SqlConfig) -> Result<DbOptions, LockError> {
        let options: sqlx::postgres::PgConnectOptions = parse_options(config)?;
        Ok(DbOptions::Postgres(
            options.application_name(IDLE_MARKER).options([
                ("client_connection_check_interval", PG_CLIENT_CHECK),
                // A dead client host while a statement runs or while the
                // connection holds nothing. A grant moves the idle time out
                // to the TTL (the grant statement sets it) and the release
                // brings it back: probes this early would end a partitioned
                // holder's session, and free its lock, seconds after the
                // cut and long before the holder's deadline.
                ("tcp_keepalives_idle", IDLE_KEEPALIVE_IDLE),
                ("tcp_keepalives_interval", "1"),
                ("tcp_keepalives_count", "3"),
                ("idle_session_timeout", "0"),
            ]),
        ))
    }

    /// Set inside the grant statement (`idle_session_timeout`).
    fn idle_timeout_secs(&self, _ttl: Duration) -> Option<u64> {
        None
    }

    async fn session_grant(
        &self,
        on: OnSession<'_>,
        grant: &SessionGrant<'_>,
    ) -> SqlxResult<Granted> {
        let statement = match grant.wait {
            None => &on.sql.grant,
            Some(_) => &on.sql.wait,
        };
        let mut query = sqlx::query(AssertSqlSafe(statement.as_str()))
            .bind(grant.lock.server_key.pg)
            .bind(grant.owner)
            .bind(pg_idle_timeout(grant.ttl));
        if let Some(wait) = grant.wait {
            // lock_timeout = 0 would mean "wait forever".
            let ms = wait.as_millis().max(1);
            query = query.bind(ms.to_string());
        }
        let conn = pg(on.conn)?;
        match query.fetch_one(&mut *conn).await {
            Ok(row) => match session_token(row.try_get::<Option<i64>, _>(0)?) {
                // Only a crash resets the sequence below the run's base,
                // and a crash ends every session: this one cannot have
                // seen its run started (a pooler kept the client
                // connection across a server restart, or someone set the
                // sequence by hand). The lock just taken is given back and
                // the session reported broken: the caller closes it, and
                // the next session opened starts a new run.
                Granted::Token(token) if token < RUN_FIRST => {
                    sqlx::query("SELECT pg_advisory_unlock($1)")
                        .bind(grant.lock.server_key.pg)
                        .execute(&mut *conn)
                        .await?;
                    Err(sqlx::Error::Protocol(format!(
                        "token {token} is below the server run's base: the token sequence was \
                         reset (a server crash) while this session lived"
                    )))
                }
                granted => Ok(granted),
            },
            // lock_not_available: lock_timeout ran out.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03") => {
                Ok(Granted::Held)
            }
            Err(e) => Err(e),
        }
    }

    async fn session_release(&self, on: OnSession<'_>, key: &ServerKey) -> SqlxResult<bool> {
        let row = sqlx::query(AssertSqlSafe(on.sql.release.as_str()))
            .bind(key.pg)
            .fetch_one(pg(on.conn)?)
            .await?;
        row.try_get::<bool, _>(0)
    }

    /// A quiet grant's deferred publication in `application_name`, as
    /// the publishing grants write it (see `grants::session`, "Published
    /// grants"). The caller holds the session's mutex and checked that the
    /// grant is still held: a session lock leaves only with its release or
    /// its session. Answers `false`: nothing for the release to withdraw
    /// (the release resets `application_name` itself).
    async fn session_publish(
        &self,
        on: OnSession<'_>,
        publication: &Publication<'_>,
    ) -> SqlxResult<bool> {
        sqlx::query(PG_PUBLISH)
            .bind(publication.owner)
            .bind(i64::try_from(publication.token).unwrap_or(i64::MAX))
            .execute(pg(on.conn)?)
            .await?;
        Ok(false)
    }

    async fn session_withdraw(&self, on: OnSession<'_>, key: &[u8], token: u64) -> SqlxResult<()> {
        let _ = (on, key, token);
        Ok(())
    }

    async fn session_holds(&self, on: OnSession<'_>, key: &ServerKey) -> SqlxResult<bool> {
        sqlx::query_scalar::<_, bool>(AssertSqlSafe(on.sql.holds.as_str()))
            .bind(key.pg_halves.0)
            .bind(key.pg_halves.1)
            .fetch_one(pg(on.conn)?)
            .await
    }

    async fn session_inspect(
        &self,
        on: OnSession<'_>,
        lock: SessionLock<'_>,
    ) -> SqlxResult<Option<SessionHolder>> {
        let (sql, server_key) = (on.sql, lock.server_key);
        // `pg_locks` and `pg_stat_activity` are read one after the other,
        // and a session of ours shows the bare marker while holding only
        // inside one of its statements: between a grant's lock and its
        // publishing, or a release's unlock and its reset. Read then, the
        // holder would show without its token (a release seen as a holder
        // of unknown token); such a row is read again (twice at most).
        let mut attempts = 0;
        let (pid, app) = loop {
            let row = sqlx::query(AssertSqlSafe(sql.inspect.as_str()))
                .bind(server_key.pg_halves.0)
                .bind(server_key.pg_halves.1)
                .fetch_optional(pg(&mut *on.conn)?)
                .await?;
            let Some(row) = row else { return Ok(None) };
            let pid: i32 = row.try_get(0)?;
            let app: Option<String> = row.try_get(1)?;
            attempts += 1;
            if app.as_deref() != Some(IDLE_MARKER) || attempts == 3 {
                break (pid, app);
            }
        };
        // `distlock <owner hex> <token>` while one of ours holds it.
        let ours = app.as_deref().and_then(|a| {
            let mut parts = a.strip_prefix("distlock ")?.split(' ');
            let owner = parts.next()?.to_owned();
            let token = parts.next()?.parse::<u64>().ok()?;
            Some((owner, token))
        });
        let (owner, token) = ours.map_or((None, None), |(o, t)| (Some(o), Some(t)));
        Ok(Some(SessionHolder {
            session: i64::from(pid),
            unpublished: app.as_deref() == Some(IDLE_MARKER),
            owner,
            token,
            details: None,
        }))
    }

    // A backend's pid can be another backend's once it has exited: only
    // the session that still shows this waiting owner is ended.
    async fn kill_session(&self, conn: &mut DbConn, victim: i64, owner: &str) -> SqlxResult<()> {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE pid = $1::int AND application_name = $2",
        )
        .bind(victim)
        .bind(waiting_name(owner))
        .execute(pg(conn)?)
        .await
        .map(drop)
    }

    async fn kill_holder(&self, on: OnSession<'_>, target: KillTarget<'_>) -> SqlxResult<Killed> {
        let KillTarget {
            lock,
            victim,
            owner,
            token,
            wait,
        } = target;
        let wait_ms = i64::try_from(wait.as_millis().max(1)).unwrap_or(i64::MAX);
        let row = sqlx::query(AssertSqlSafe(on.sql.kill_holder.as_str()))
            .bind(lock.server_key.pg_halves.0)
            .bind(lock.server_key.pg_halves.1)
            .bind(victim)
            .bind(format!("distlock {owner} {token}"))
            .bind(wait_ms)
            .fetch_optional(pg(on.conn)?)
            .await?;
        let Some(row) = row else {
            return Ok(Killed::Changed);
        };
        let locks: i64 = row.try_get(1)?;
        // Ended (the backend exited within `wait`, or exits later and
        // frees the lock then), or spared for its other locks.
        Ok(if locks == 1 {
            Killed::Ended
        } else {
            Killed::HoldsOthers(locks.saturating_sub(1))
        })
    }

    async fn session_run(&self, on: OnSession<'_>) -> SqlxResult<Option<i64>> {
        let Some(run) = &on.sql.run else {
            return Ok(Some(0));
        };
        sqlx::query_scalar(AssertSqlSafe(run.read.as_str()))
            .fetch_optional(pg(on.conn)?)
            .await
    }

    async fn start_run(&self, on: OnSession<'_>) -> SqlxResult<()> {
        match &on.sql.run {
            Some(run) => pg_start_run(pg(on.conn)?, run).await,
            None => Ok(()),
        }
    }

    fn is_missing_relation(&self, err: &sqlx::Error) -> bool {
        is_undefined_table(err)
    }

    async fn prepare_session_schema(
        &self,
        on: OnSession<'_>,
        create: bool,
    ) -> SqlxResult<Option<String>> {
        let (conn, sql) = (pg(on.conn)?, on.sql);
        if create {
            let run = sql.run.iter().map(|run| run.create.as_str());
            for create in std::iter::once(sql.create.as_str()).chain(run) {
                sqlx::query(AssertSqlSafe(create))
                    .execute(&mut *conn)
                    .await?;
            }
        }
        let row = sqlx::query(AssertSqlSafe(sql.check.as_str()))
            .bind(sql.counter.as_str())
            .fetch_one(&mut *conn)
            .await?;
        let cache: i64 = row.try_get(0)?;
        let cycle: bool = row.try_get(1)?;
        if cache != 1 || cycle {
            return Ok(Some(format!(
                "the token sequence {} must have CACHE 1 and NO CYCLE (has cache {cache}, cycle {cycle}): \
                 a per-session cache hands out tokens out of order",
                sql.counter
            )));
        }
        Ok(None)
    }
}

/// The first token of run 1 (`1 << RUN_SHIFT`): a session-mode token
/// below it comes from a sequence that crash recovery reset and no client
/// started the run of (see [`RunSql`]).
pub(crate) const RUN_FIRST: u64 = 1 << RUN_SHIFT;

/// undefined_table: the sequence or run table is not created yet (the
/// first connect creates them after its first session opened).
pub(crate) fn is_undefined_table(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01"))
}

/// Starts the server run of session mode's tokens (see [`RunSql`]) on
/// `conn`, a connection of its own, in two transactions (each works behind
/// a transaction pooler):
///
/// 1. the durable run counter bumped, only while the sequence is below
///    2^40 (not started), with `synchronous_commit` on whatever the
///    server's default: the commit returns once the new epoch is on disk,
///    so no crash can hand it out twice;
/// 2. then, under a transaction-level advisory lock that serializes the
///    clients starting the run, the sequence raised to `epoch << 40`, only
///    if it is below (`setval` is not transactional: were it sent before
///    the bump's commit, an aborted bump would leave the sequence in an
///    epoch a later run gets again). Two clients starting the same run
///    each bump the counter (one epoch is skipped); the lock makes the
///    higher raise win, so the sequence never goes back.
///
/// A client that dies between the two leaves a bumped counter and the
/// run not started: the next client bumps again.
async fn pg_start_run(conn: &mut sqlx::PgConnection, run: &RunSql) -> SqlxResult<()> {
    use sqlx::Connection;
    let mut tx = conn.begin().await?;
    sqlx::query("SET LOCAL synchronous_commit = on")
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    let epoch: Option<i64> = sqlx::query_scalar(AssertSqlSafe(run.bump.as_str()))
        .persistent(false)
        .fetch_optional(&mut *tx)
        .await?;
    tx.commit().await?;
    let Some(epoch) = epoch else {
        return Ok(());
    };
    let base = epoch
        .checked_mul(1 << RUN_SHIFT)
        .ok_or_else(|| sqlx::Error::Protocol(format!("run epoch {epoch} out of range")))?;
    let mut tx = conn.begin().await?;
    sqlx::query("SET LOCAL lock_timeout = '10s'")
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1), 0)")
        .persistent(false)
        .bind(run.create.as_str())
        .execute(&mut *tx)
        .await?;
    sqlx::query(AssertSqlSafe(run.set.as_str()))
        .persistent(false)
        .bind(base)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    tracing::info!(epoch, "started the server run of session tokens");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule holds for every TTL session mode accepts: the server never
    /// ends a silent holder's session before the TTL has passed since the
    /// last thing it heard (the holder's last renewal at the latest).
    #[test]
    fn the_server_never_ends_a_holders_session_before_the_ttl() {
        let mut ttl = crate::config::PG_SESSION_MIN_TTL;
        while ttl < Duration::from_secs(3600) {
            assert!(
                server_may_end_session_after(ttl) >= ttl,
                "TTL {ttl:?}: the server may end the session after {:?}",
                server_may_end_session_after(ttl)
            );
            ttl = ttl * 3 / 2 + Duration::from_millis(7);
        }
    }

    /// The clean-up of a dropped waiting acquire ends the session by pid:
    /// a session that has the pid but does not wait for that owner (the
    /// waiter's backend exited and the pid went to a new one) must survive,
    /// the waiting one must not. With `pg_terminate_backend(pid)` alone
    /// the bystander was ended.
    async fn backend_pid(conn: &mut sqlx::PgConnection) -> i32 {
        sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid()")
            .fetch_one(conn)
            .await
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_waits_clean_up_ends_only_the_session_still_waiting() {
        use conformance::OrSkip;
        use conformance::servers::postgres::PostgresServer;
        use sqlx::Connection;
        let Some(server) = PostgresServer::start().await.or_skip() else {
            return;
        };
        let connect = || async { sqlx::PgConnection::connect(&server.url()).await.unwrap() };
        let alive = |victim: i32| {
            let url = server.url();
            async move {
                let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
                sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
                    .bind(victim)
                    .fetch_one(&mut conn)
                    .await
                    .unwrap()
                    == 1
            }
        };
        let mut killer = DbConn::Postgres(connect().await);
        // A bystander with the pid the clean-up was given.
        let mut bystander = connect().await;
        let bystander_pid = backend_pid(&mut bystander).await;
        Postgres
            .kill_session(&mut killer, i64::from(bystander_pid), "00ff")
            .await
            .unwrap();
        assert!(
            alive(bystander_pid).await,
            "a session that waits for no one was ended by pid"
        );
        // The session still waiting for that owner is ended.
        let mut waiter = connect().await;
        let waiter_pid = backend_pid(&mut waiter).await;
        sqlx::query("SELECT set_config('application_name', $1, false)")
            .bind(waiting_name("00ff"))
            .execute(&mut waiter)
            .await
            .unwrap();
        Postgres
            .kill_session(&mut killer, i64::from(waiter_pid), "00ff")
            .await
            .unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while alive(waiter_pid).await {
            assert!(
                std::time::Instant::now() < until,
                "the waiting session was not ended"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
