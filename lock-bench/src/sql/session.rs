//! The raw floor of session mode ([`SqlSessionBackend`](lock_sql::SqlSessionBackend)):
//! its grant and release, by hand on one bare connection.
//!
//! [`SessionFloor`] opens one sqlx connection of its own (the driver's URL
//! parsing and connection type; none of its sessions, dialects, statement
//! texts or retries) and sends two statements written here:
//!
//! 1. the grant, one round trip, the token in its answer:
//!    - PostgreSQL: `pg_try_advisory_lock` and `nextval` of the unlogged
//!      token sequence in one `SELECT` (the server run started by hand at
//!      connect when no client started it since the server's last crash:
//!      the sequence raised to `epoch << 40`), which also publishes the
//!      owner and token in `application_name`. As the driver's session
//!      does, the connection's first grant (and any try whose TTL the
//!      armed one is not within `ttl..=2*ttl` of) is the full grant, which
//!      also arms `idle_session_timeout` and the keep-alive idle time for
//!      the TTL; while they are armed, the quiet grant (the lock and the
//!      token) on a connection that holds nothing and published nothing
//!      (as the driver's session: its first full grant published, the
//!      lean release reset it), else the lean grant (the lock, the token,
//!      `application_name`). The driver publishes a quiet grant held past
//!      its publication delay (10 ms), which a benchmark cycle is not: the
//!      floor publishes none. A connection idle (holding
//!      nothing) for the armed TTL less half a second is replaced by a new
//!      one before the grant, as the driver closes such a session (the
//!      server may have ended it);
//!    - MariaDB 10.3 and later (`SELECT VERSION()` at connect, as the
//!      driver): `SELECT CASE WHEN GET_LOCK(name, 0) = 1 THEN ? +
//!      CAST(UUID_SHORT() & (2^56 - 1) AS SIGNED) END`, the token the
//!      server run's base plus the server's counter; the run's base is
//!      read once at connect (and the run started by hand when no client
//!      started it yet). The
//!      driver writes the holder row only for a lock held past its
//!      publication delay (10 ms), which a benchmark cycle is not: the
//!      floor writes none;
//!    - MySQL: the same `INSERT .. SELECT` on the per-key token row
//!      (`token = LAST_INSERT_ID(token + 1)`);
//! 2. the release, one round trip: PostgreSQL `pg_advisory_unlock`, with
//!    the `application_name` reset when the connection published a grant
//!    (the driver's lean release: the idle timeout and keep-alive stay
//!    armed for the next grant; its release that keeps other locks when
//!    the floor holds more), alone when it published nothing (the
//!    driver's quiet release) / `RELEASE_LOCK`.
//!
//! Two round trips per cycle. Unlike the backend, the floor never arms the
//! MySQL/MariaDB session's `wait_timeout` (one more statement whenever the
//! TTL's whole seconds change): its session lives only as long as a
//! benchmark.
//!
//! What the floor takes from the driver is data, not code on the path it
//! measures: the session profile (name, shortest TTL, and the connect
//! options with the session settings PostgreSQL gets in the startup
//! packet, no round trip), the key layout (`lock_sql::keys`: the floor
//! takes the same server lock as the driver for the same key) and the
//! TTL's conversion to `idle_session_timeout`.

use std::time::Duration;

use async_trait::async_trait;
use conformance::floor::{FloorGrant, RawFloor};
use lock_core::{LockError, LockKey, Operation};
use lock_sql::keys::{mysql_lock_name, pg_idle_timeout, pg_lock_key};
use std::sync::Arc;

use lock_sql::keys::DbOptions;
use lock_sql::sqlx::{self, AssertSqlSafe, Row};
use lock_sql::{SqlConfig, SqlDialect};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::bare::{self, Bare, BareExt, Label, Text, quoted, sql};

/// Session mode's grant and release, by hand on one bare connection.
///
/// Serves one call at a time; a session holds any number of keys at once
/// (each its own server lock), as one benchmark client needs.
#[derive(Debug)]
pub struct SessionFloor {
    label: Label,
    config: SqlConfig,
    conn: Mutex<FloorConn>,
    /// The full grant (PostgreSQL), the grant (MySQL/MariaDB).
    grant: Text,
    /// The release (PostgreSQL: the lean one, the session's last lock).
    release: Text,
    /// MariaDB: the server run's token base the grant binds; `None` on
    /// MySQL's token rows and on PostgreSQL.
    run_base: Option<i64>,
    /// PostgreSQL: the lean statements and how to replace an expired
    /// connection; `None` on MySQL/MariaDB.
    lean: Option<PgLean>,
}

/// The floor's connection and, on PostgreSQL, what the driver's session
/// keeps of it.
#[derive(Debug)]
struct FloorConn {
    bare: Bare,
    /// The TTL the session's idle timeout and keep-alive are armed for (a
    /// full grant's), `None` before the first.
    armed: Option<Duration>,
    /// Locks the floor holds on it.
    held: usize,
    /// PostgreSQL: its `application_name` may show a grant (the driver's
    /// `Session::published`).
    published: bool,
    /// When its last statement ended.
    last_used: Instant,
}

impl FloorConn {
    fn new(bare: Bare) -> Mutex<Self> {
        Mutex::new(Self {
            bare,
            armed: None,
            held: 0,
            published: false,
            last_used: Instant::now(),
        })
    }

    /// Whether the server may have ended it for silence (armed, holding
    /// nothing, idle for the armed TTL less half a second), as the
    /// driver's `Session::maybe_expired`.
    fn maybe_expired(&self) -> bool {
        self.held == 0
            && self
                .armed
                .is_some_and(|armed| self.last_used.elapsed() + Duration::from_millis(500) >= armed)
    }
}

/// PostgreSQL's lean statements (see the module docs) and what replacing
/// the connection takes.
#[derive(Debug)]
struct PgLean {
    grant: Text,
    /// The release of a lock while the floor holds others.
    kept: Text,
    /// The quiet grant and the bare unlock (nothing published).
    quiet_grant: Text,
    quiet_release: Text,
    options: DbOptions,
    run: [Text; 4],
}

/// MariaDB's session statements (10.3 and later): the `CREATE`s (holder
/// table, run counter, run clock), the run's token base, the grant and
/// the release.
struct MariaSql {
    /// The quoted durable run counter and run clock tables (setup only).
    runs: String,
    clock: String,
    creates: [Text; 3],
    run_read: Text,
    grant: Text,
    release: Text,
}

/// [`MariaSql`] on validated table `table`.
fn mariadb_sql(table: &str) -> MariaSql {
    let q = |suffix: &str| quoted(SqlDialect::MySql, &format!("{table}{suffix}"));
    let (h, runs, clock) = (
        q("_session_holders"),
        q("_session_runs"),
        q("_session_clock"),
    );
    MariaSql {
        runs: runs.clone(),
        clock: clock.clone(),
        creates: [
            format!(
                "CREATE TABLE IF NOT EXISTS {h} (name VARBINARY({}) NOT NULL, \
                 token BIGINT NOT NULL, owner VARCHAR(64) CHARACTER SET ascii NOT NULL, \
                 conn BIGINT NOT NULL, lock_name VARCHAR(64) CHARACTER SET ascii NOT NULL, \
                 details VARCHAR({}) CHARACTER SET ascii NULL, \
                 PRIMARY KEY USING BTREE (name)) ENGINE=MEMORY",
                lock_core::MAX_KEY_LEN,
                lock_core::MAX_ENCODED_LEN
            )
            .into(),
            format!(
                "CREATE TABLE IF NOT EXISTS {runs} (id TINYINT NOT NULL PRIMARY KEY, \
                 epoch BIGINT NOT NULL) ENGINE=InnoDB"
            )
            .into(),
            format!(
                "CREATE TABLE IF NOT EXISTS {clock} (id TINYINT NOT NULL PRIMARY KEY, \
                 epoch BIGINT NOT NULL, origin BIGINT NOT NULL) ENGINE=MEMORY"
            )
            .into(),
        ],
        run_read: format!("SELECT epoch * 1099511627776 - origin FROM {clock} WHERE id = 1").into(),
        grant: "SELECT CASE WHEN GET_LOCK(?, 0) = 1 \
                THEN ? + CAST(UUID_SHORT() & 72057594037927935 AS SIGNED) END"
            .into(),
        release: "SELECT RELEASE_LOCK(?)".into(),
    }
}

/// The run's token base, `None` before the run was started.
async fn run_base(
    conn: &mut sqlx::MySqlConnection,
    maria: &MariaSql,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar(AssertSqlSafe(Arc::clone(&maria.run_read)))
        .fetch_optional(conn)
        .await
}

/// Setup on a MariaDB connection: the `CREATE`s (the holder table with
/// the driver's `max_heap_table_size`) unless `create` is off, then the
/// run's token base, starting the run by hand (the epoch bumped, its row
/// written) when no client started it since the server started.
async fn mariadb_setup(
    conn: &mut sqlx::MySqlConnection,
    maria: &MariaSql,
    create: bool,
) -> Result<i64, sqlx::Error> {
    use sqlx::Executor;
    if create {
        conn.execute("SET SESSION max_heap_table_size = 268435456")
            .await?;
        for text in &maria.creates {
            conn.execute(sql(text)).await?;
        }
    }
    if let Some(base) = run_base(conn, maria).await? {
        return Ok(base);
    }
    let bumped = sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (id, epoch) VALUES (1, LAST_INSERT_ID(1)) \
         ON DUPLICATE KEY UPDATE epoch = LAST_INSERT_ID(epoch + 1)",
        maria.runs
    )))
    .execute(&mut *conn)
    .await?;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT IGNORE INTO {} (id, epoch, origin) \
         VALUES (1, ?, CAST(UUID_SHORT() & 72057594037927935 AS SIGNED))",
        maria.clock
    )))
    .bind(i64::try_from(bumped.last_insert_id()).unwrap_or(i64::MAX))
    .execute(&mut *conn)
    .await?;
    run_base(conn, maria)
        .await?
        .ok_or_else(|| sqlx::Error::Protocol("the server run was not started".into()))
}

/// PostgreSQL's server run of session tokens (see `lock_sql`'s session
/// docs): the durable run counter's `CREATE`, the read of whether the run
/// is started (the unlogged sequence at or above 2^40), the counter's
/// bump and the sequence's raise to `epoch << 40`.
fn postgres_run_sql(table: &str) -> [Text; 4] {
    let q = |suffix: &str| quoted(SqlDialect::Postgres, &format!("{table}{suffix}"));
    let (seq, runs, old) = (q("_session_useq"), q("_session_runs"), q("_session_seq"));
    let unit = 1_u64 << 40;
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {runs} (id SMALLINT PRIMARY KEY, epoch BIGINT NOT NULL)"
        )
        .into(),
        format!("SELECT CAST(0 AS BIGINT) FROM {seq} WHERE last_value >= {unit}").into(),
        format!(
            "WITH s AS (SELECT 1 FROM {seq} WHERE last_value < {unit}) \
             INSERT INTO {runs} AS r (id, epoch) \
             SELECT 1, COALESCE(pg_sequence_last_value(to_regclass('{old}')), 0) / {unit} + 1 \
             FROM s ON CONFLICT (id) DO UPDATE SET epoch = GREATEST(r.epoch + 1, excluded.epoch) \
             RETURNING epoch"
        )
        .into(),
        format!("SELECT setval('{seq}', $1) FROM {seq} WHERE last_value < $1").into(),
    ]
}

/// Setup on a PostgreSQL connection: the run counter's `CREATE` unless
/// `create` is off, then the server run started by hand when no client
/// started it since the server's last crash (the bump with
/// `synchronous_commit` on, then the raise).
async fn postgres_setup(
    conn: &mut sqlx::PgConnection,
    run: &[Text; 4],
    create: bool,
) -> Result<(), sqlx::Error> {
    use sqlx::Executor;
    if create {
        conn.execute(sql(&run[0])).await?;
    }
    let started: Option<i64> = sqlx::query_scalar(sql(&run[1]))
        .fetch_optional(&mut *conn)
        .await?;
    if started.is_some() {
        return Ok(());
    }
    conn.execute("SET synchronous_commit = on").await?;
    let epoch: Option<i64> = sqlx::query_scalar(sql(&run[2]))
        .fetch_optional(&mut *conn)
        .await?;
    if let Some(epoch) = epoch {
        sqlx::query(sql(&run[3]))
            .bind(epoch << 40)
            .execute(&mut *conn)
            .await?;
    }
    conn.execute("SET synchronous_commit = DEFAULT").await?;
    Ok(())
}

/// Session mode's `CREATE` of the token counter, its grant and its release
/// for `dialect` on validated table `table`; `None` on SQLite (no session
/// locks). PostgreSQL's are the full grant and release (the release
/// checked against the driver's only: the driver, and so the floor, send
/// the lean one, see [`postgres_lean_sql`]).
fn session_sql(dialect: SqlDialect, table: &str) -> Option<(Text, Text, Text)> {
    let (create, grant, release) = match dialect {
        SqlDialect::Postgres => {
            let seq = quoted(dialect, &format!("{table}_session_useq"));
            let publish = "CASE WHEN g.t IS NOT NULL THEN \
                 set_config('application_name', 'distlock ' || $2 || ' ' || g.t, false) \
                 || set_config('idle_session_timeout', $3, false) \
                 || set_config('tcp_keepalives_idle', ceil($3::numeric / 1000)::bigint::text, false) END";
            (
                format!("CREATE UNLOGGED SEQUENCE IF NOT EXISTS {seq} AS BIGINT CACHE 1 NO CYCLE"),
                format!(
                    "SELECT g.t, {publish} FROM (SELECT CASE WHEN pg_try_advisory_lock($1) \
                     THEN nextval('{seq}') END AS t OFFSET 0) g"
                ),
                "SELECT pg_advisory_unlock($1), \
                 set_config('application_name', 'distlock', false), \
                 set_config('idle_session_timeout', '0', false), \
                 set_config('tcp_keepalives_idle', '5', false)"
                    .to_owned(),
            )
        }
        SqlDialect::MySql => {
            let tok = quoted(dialect, &format!("{table}_session_tokens"));
            (
                format!(
                    "CREATE TABLE IF NOT EXISTS {tok} (name VARBINARY(1024) NOT NULL PRIMARY KEY, \
                     token BIGINT NOT NULL, owner VARCHAR(64) NOT NULL, conn BIGINT NOT NULL, \
                     lock_name VARCHAR(64) NULL, details VARCHAR({}) NULL, \
                     details_token BIGINT NULL) ENGINE=InnoDB",
                    lock_core::MAX_ENCODED_LEN
                ),
                format!(
                    "INSERT INTO {tok} (name, token, owner, conn, lock_name, details, details_token) \
                     SELECT ?, LAST_INSERT_ID(1), ?, CONNECTION_ID(), ?, ?, 1 FROM DUAL \
                     WHERE GET_LOCK(?, ?) = 1 \
                     ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), \
                     owner = VALUES(owner), conn = VALUES(conn), lock_name = VALUES(lock_name), \
                     details = VALUES(details), details_token = token"
                ),
                "SELECT RELEASE_LOCK(?)".to_owned(),
            )
        }
        _ => return None,
    };
    Some((create.into(), grant.into(), release.into()))
}

/// PostgreSQL's lean statements on validated table `table`, for a
/// session armed for the TTL already: the grant (the lock, the token and
/// `application_name`; `$3`, the TTL, bound and unused), the release of
/// the session's last lock (the settings stay armed), the release of a
/// lock while the session keeps others (published as `distlock-multi`),
/// the quiet grant (the lock and the token; `$2` and `$3` bound and
/// unused) and the bare unlock of a session that published nothing.
fn postgres_lean_sql(table: &str) -> [Text; 5] {
    let seq = quoted(SqlDialect::Postgres, &format!("{table}_session_useq"));
    [
        format!(
            "SELECT g.t, CASE WHEN g.t IS NOT NULL AND $3::text IS NOT NULL THEN \
             set_config('application_name', 'distlock ' || $2 || ' ' || g.t, false) END \
             FROM (SELECT CASE WHEN pg_try_advisory_lock($1) THEN nextval('{seq}') END AS t \
             OFFSET 0) g"
        )
        .into(),
        "SELECT pg_advisory_unlock($1), set_config('application_name', 'distlock', false)".into(),
        "SELECT pg_advisory_unlock($1), set_config('application_name', 'distlock-multi', false)"
            .into(),
        format!(
            "SELECT CASE WHEN pg_try_advisory_lock($1) THEN nextval('{seq}') END \
             WHERE $2::text IS NOT NULL AND $3::text IS NOT NULL"
        )
        .into(),
        "SELECT pg_advisory_unlock($1)".into(),
    ]
}

impl SessionFloor {
    /// Opens one connection to `url` (same syntax as [`lock_sql::connect`];
    /// `mode` is ignored) and creates the token sequence or table if
    /// missing, as the driver does.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for a bad URL or
    /// a SQLite one (no session locks); the driver's kinds for a database
    /// that cannot be reached or refuses the setup.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes the connection. A sequence or
    /// table created meanwhile stays (creation is idempotent).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = SqlConfig::from_url(url)?;
        // The driver's session profile (its name, shortest TTL and connect
        // options with the session settings of the startup packet); a
        // SQLite URL is refused here, as the driver refuses it.
        let (options, name, min_ttl) = lock_sql::keys::session_connect_options(&config)?;
        let label = Label { name, min_ttl };
        let Some((create, grant, release)) = session_sql(config.dialect(), config.table_name())
        else {
            return Err(
                LockError::config("session mode has no SQLite floor").with_backend(label.name)
            );
        };
        if config.dialect() == SqlDialect::MySql {
            let mut conn = Bare::open_with(&config, options, &[]).await?;
            if let Bare::MySql(c) = &mut conn {
                let failed = |e| lock_sql::keys::map_error(&config, Operation::Connect, e);
                let version: String = sqlx::query_scalar("SELECT VERSION()")
                    .fetch_one(&mut *c)
                    .await
                    .map_err(failed)?;
                if lock_sql::keys::mariadb_has_run_clock(&version) {
                    let maria = mariadb_sql(config.table_name());
                    let base = mariadb_setup(c, &maria, config.creates_table())
                        .await
                        .map_err(failed)?;
                    return Ok(Self {
                        label,
                        conn: FloorConn::new(conn),
                        grant: maria.grant,
                        release: maria.release,
                        config,
                        run_base: Some(base),
                        lean: None,
                    });
                }
                if config.creates_table() {
                    conn.run(&create).await.map_err(failed)?;
                }
            }
            return Ok(Self {
                label,
                conn: FloorConn::new(conn),
                grant,
                release,
                config,
                run_base: None,
                lean: None,
            });
        }
        let run = postgres_run_sql(config.table_name());
        let mut conn = Bare::open_with(&config, options.clone(), &[create]).await?;
        if let Bare::Postgres(c) = &mut conn {
            postgres_setup(c, &run, config.creates_table())
                .await
                .map_err(|e| lock_sql::keys::map_error(&config, Operation::Connect, e))?;
        }
        let [lean_grant, lean_release, kept, quiet_grant, quiet_release] =
            postgres_lean_sql(config.table_name());
        Ok(Self {
            label,
            conn: FloorConn::new(conn),
            grant,
            release: lean_release,
            config,
            run_base: None,
            lean: Some(PgLean {
                grant: lean_grant,
                kept,
                quiet_grant,
                quiet_release,
                options,
                run,
            }),
        })
    }

    /// PostgreSQL: replaces a connection the server may have ended for
    /// silence with a new one (whose run is checked, as the driver's
    /// session open does), not yet armed.
    async fn renew_expired(&self, conn: &mut FloorConn) -> Result<(), sqlx::Error> {
        let Some(lean) = &self.lean else {
            return Ok(());
        };
        if !conn.maybe_expired() {
            return Ok(());
        }
        let mut bare = lean.options.connect().await?;
        if let Bare::Postgres(c) = &mut bare {
            postgres_setup(c, &lean.run, false).await?;
        }
        *conn = FloorConn {
            bare,
            armed: None,
            held: 0,
            published: false,
            last_used: Instant::now(),
        };
        Ok(())
    }

    /// The grant statement: the token when granted, `None` when held.
    async fn grant(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<i64>, sqlx::Error> {
        let namespace = self.config.table_name();
        let mut conn = self.conn.lock().await;
        self.renew_expired(&mut conn).await?;
        let conn = &mut *conn;
        let token = match &mut conn.bare {
            Bare::PostgresPooled(_) => return Err(super::bare::pooled()),
            Bare::Postgres(c) => {
                // The driver's choice (`Session::grant`): a session holding
                // other locks stays armed for the longest TTL; a try on a
                // session armed for ttl..=2*ttl sends the lean grant.
                let ttl = match conn.armed {
                    Some(armed) if conn.held > 0 => armed.max(ttl),
                    _ => ttl,
                };
                let lean = self
                    .lean
                    .as_ref()
                    .filter(|_| conn.armed.is_some_and(|a| a >= ttl && a <= ttl * 2));
                // The driver's quiet grant: nothing else held, nothing
                // published on the connection.
                let quiet = lean.filter(|_| conn.held == 0 && !conn.published);
                let text = match (quiet, lean) {
                    (Some(quiet), _) => &quiet.quiet_grant,
                    (None, Some(lean)) => &lean.grant,
                    (None, None) => &self.grant,
                };
                if quiet.is_none() {
                    conn.published = true;
                }
                let q = sqlx::query(sql(text))
                    .bind(pg_lock_key(namespace, key))
                    .bind(owner)
                    .bind(pg_idle_timeout(ttl));
                let token = q.fetch_one(c).await?.try_get::<Option<i64>, _>(0)?;
                if lean.is_none() && token.is_some_and(|t| t > 0) {
                    conn.armed = Some(ttl);
                }
                token
            }
            Bare::MySql(c) if let Some(run_base) = self.run_base => {
                let lock_name = mysql_lock_name(namespace, key);
                let q = sqlx::query_scalar::<_, Option<i64>>(sql(&self.grant))
                    .bind(lock_name.as_str())
                    .bind(run_base);
                q.fetch_one(c).await?
            }
            Bare::MySql(c) => {
                let lock_name = mysql_lock_name(namespace, key);
                let q = sqlx::query(sql(&self.grant))
                    .bind(key.as_bytes())
                    .bind(owner)
                    .bind(lock_name.as_str())
                    .bind(lock_core::HolderDetails::encode_current())
                    .bind(lock_name.as_str())
                    .bind(0.0_f64);
                i64::try_from(q.execute(c).await?.last_insert_id()).ok()
            }
            Bare::Sqlite(_) => None,
        }
        .filter(|token| *token > 0);
        conn.last_used = Instant::now();
        if token.is_some() {
            conn.held += 1;
        }
        Ok(token)
    }

    /// The release statement: whether this session held the lock.
    async fn release_lock(&self, key: &str) -> Result<bool, sqlx::Error> {
        let namespace = self.config.table_name();
        let mut conn = self.conn.lock().await;
        let conn = &mut *conn;
        let released = match &mut conn.bare {
            Bare::PostgresPooled(_) => return Err(super::bare::pooled()),
            Bare::Postgres(c) => {
                // The driver's `Sessions::release_sql`: the lean release
                // for the session's last lock, the kept one otherwise.
                let text = match &self.lean {
                    Some(lean) if conn.held > 1 => {
                        conn.published = true;
                        &lean.kept
                    }
                    Some(lean) if !conn.published => &lean.quiet_release,
                    _ => &self.release,
                };
                let q = sqlx::query(sql(text)).bind(pg_lock_key(namespace, key));
                let released = q.fetch_one(c).await?.try_get::<bool, _>(0)?;
                if conn.held <= 1 {
                    conn.published = false;
                }
                released
            }
            Bare::MySql(c) => {
                let q = sqlx::query(sql(&self.release)).bind(mysql_lock_name(namespace, key));
                q.fetch_one(c).await?.try_get::<Option<i64>, _>(0)? == Some(1)
            }
            Bare::Sqlite(_) => false,
        };
        conn.last_used = Instant::now();
        if released {
            conn.held = conn.held.saturating_sub(1);
        }
        Ok(released)
    }
}

#[async_trait]
impl RawFloor for SessionFloor {
    fn name(&self) -> &'static str {
        self.label.name
    }

    /// The grant and the release: one statement each.
    fn round_trips_per_cycle(&self) -> u32 {
        2
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        let (key, owner) = bare::grant_args(self.label, key, ttl)?;
        let grant = self.grant(key.as_str(), &owner, ttl);
        let token =
            bare::timed(&self.config, self.label, Operation::TryAcquire, &key, grant).await?;
        Ok(bare::granted(&key, owner, token))
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        let key = LockKey::new(&grant.key)?;
        let release = self.release_lock(key.as_str());
        bare::timed(&self.config, self.label, Operation::Release, &key, release).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The floor writes its own SQL; it must stay the text the driver
    /// sends, or the ratio compares two different exchanges.
    #[test]
    fn the_floors_text_is_the_drivers() {
        for dialect in [SqlDialect::Postgres, SqlDialect::MySql] {
            for table in ["locks", "app.locks"] {
                let ours = lock_sql::keys::statement_texts(dialect, table).expect("compiled in");
                let ours = ours.session.expect("session mode");
                let (create, grant, release) = session_sql(dialect, table).expect("session SQL");
                assert_eq!(&*create, ours[0], "{dialect} {table}");
                assert_eq!(&*grant, ours[1], "{dialect} {table}");
                assert_eq!(&*release, ours[2], "{dialect} {table}");
            }
        }
        assert!(session_sql(SqlDialect::Sqlite, "locks").is_none());
        for table in ["locks", "app.locks"] {
            let ours = lock_sql::keys::statement_texts(SqlDialect::Postgres, table).expect("pg");
            let lean = ours.session_lean.expect("PostgreSQL's lean statements");
            for (floor, ours) in postgres_lean_sql(table).iter().zip(&lean) {
                assert_eq!(&**floor, ours, "PostgreSQL lean {table}");
            }
            let mysql = lock_sql::keys::statement_texts(SqlDialect::MySql, table).expect("mysql");
            assert!(
                mysql.session_lean.is_none(),
                "lean statements are PostgreSQL's"
            );
            let ours = ours.session_run.expect("PostgreSQL's server run");
            for (floor, ours) in postgres_run_sql(table).iter().zip(&ours) {
                assert_eq!(&**floor, ours, "PostgreSQL {table}");
            }
        }
        for table in ["locks", "app.locks"] {
            let ours = lock_sql::keys::statement_texts(SqlDialect::MySql, table).expect("mysql");
            let ours = ours.session_mariadb.expect("MariaDB session mode");
            let m = mariadb_sql(table);
            let floor = [
                &m.creates[0],
                &m.creates[1],
                &m.creates[2],
                &m.run_read,
                &m.grant,
                &m.release,
            ];
            for (floor, ours) in floor.into_iter().zip(&ours) {
                assert_eq!(&**floor, ours, "MariaDB {table}");
            }
        }
    }
}
