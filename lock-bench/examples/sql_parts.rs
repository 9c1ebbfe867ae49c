//! Probe (not a test): where one SQL (row mode) acquire+release cycle's
//! time goes, one client, one connection per side, interleaved rounds,
//! against PostgreSQL and MariaDB servers this process starts and a SQLite
//! file (issue #39: ours over the client crate alone, sending the same
//! requests, at most 1.05x at p50; the hand floor beside it):
//!
//! - the hand floor ([`lock_bench::sql::SqlFloor`]: the grant and guarded
//!   release written by hand, sent with `sqlx::query` on one bare sqlx
//!   connection, so on SQL the floor is itself the client crate on a bare
//!   connection);
//! - sqlx alone: the driver's own row-mode grant and release texts
//!   (`lock_sql::keys::statement_texts`) with the driver's binds in its
//!   order, on a sqlx pool of one connection opened with the driver's
//!   connect options, as a sqlx user writes it; `test_before_acquire` is
//!   off (sqlx's default pings every checkout, a round trip the driver
//!   never sends). sqlx 0.9 still pings every connection given back to its
//!   pool (`return_to_pool`, in a spawned task, unconditionally): four
//!   round trips per cycle where the driver sends two, so the driver's
//!   own connection set of bare connections has no sqlx-pool counterpart,
//!   and the crate alone sending the same two requests on one connection
//!   is the hand floor: ours / floor is the #39 ratio here;
//! - `SqlBackend::acquire` (waiting) + `release` directly, `pool_size=1`;
//! - ours: `LockClient` with a waiting acquire, then `release`, as users
//!   write it, `pool_size=1`.
//!
//! Per side: p50, p99 and mean wall time, CPU per cycle of this process and
//! of the server (PostgreSQL's per-connection backends included); then
//! ours / sqlx alone, sqlx alone / floor and ours / floor. With
//! `RTT_US=<µs>` each side goes through a fault proxy of its own that adds
//! that round-trip time (half each way) and counts its round trips per
//! cycle; SQLite (no network) is skipped then. Pin it to one CPU (the
//! servers inherit it) to take thread placement out:
//!
//! ```text
//! cargo build --release -p lock-bench --example sql_parts
//! taskset -c 0 target/release/examples/sql_parts 2000
//! RTT_US=1000 taskset -c 0 target/release/examples/sql_parts 2000
//! ```
//!
//! `SQL_DATABASES=postgres,mariadb,sqlite` (the default) picks the
//! databases; `ONLY=<0..3>` runs one side alone (for a profiler).

mod parts_support;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conformance::proxy::FaultProxy;
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use lock_bench::sql::SqlFloor;
use lock_core::{HolderDetails, LockClient, LockKey, OwnerId};
use lock_sql::SqlConfig;
use lock_sql::keys::DbOptions;
use lock_sql::sqlx::{self, AssertSqlSafe, Row};
use parts_support::{BoxError, TTL};

const NAMES: [&str; 4] = [
    "hand floor (sqlx, bare)",
    "sqlx alone (pool of 1)",
    "SqlBackend direct",
    "ours (LockClient)",
];
const FLOOR: usize = 0;
const CRATE_ALONE: usize = 1;
const DIRECT: usize = 2;
const OURS: usize = 3;

/// A sqlx pool of the URL's database.
enum Pool {
    Postgres(sqlx::PgPool),
    MySql(sqlx::MySqlPool),
    Sqlite(sqlx::SqlitePool),
}

/// One connection, and no ping before each checkout (see the module docs).
fn pool_options<DB: sqlx::Database>() -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
}

/// The driver's grant and release of a cycle through sqlx alone.
struct CrateAlone {
    pool: Pool,
    grant: Arc<str>,
    release: Arc<str>,
    /// PostgreSQL's release notification channel (the driver's).
    channel: String,
}

/// A statement text as sqlx takes it, without copying it (as the driver).
fn sql(text: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(text))
}

/// The TTL bound in microseconds, as the driver binds it.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// SQLite's "now" the driver binds: the host clock in microseconds.
fn unix_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, micros)
}

impl CrateAlone {
    /// A pool of one connection with the driver's connect options for
    /// `url`, and the driver's statement texts for its table (created by
    /// the backends connected before).
    async fn connect(url: &str) -> Result<Self, BoxError> {
        let config = SqlConfig::from_url(url)?;
        let texts = lock_sql::keys::statement_texts(config.dialect(), config.table_name())?;
        let pool = match lock_sql::keys::connect_options(&config)? {
            DbOptions::Postgres(o) | DbOptions::PostgresPooled(o) => {
                Pool::Postgres(pool_options().connect_with(o).await?)
            }
            DbOptions::MySql(o) => Pool::MySql(pool_options().connect_with(o).await?),
            DbOptions::Sqlite(o) => Pool::Sqlite(pool_options().connect_with(o).await?),
        };
        Ok(Self {
            pool,
            grant: texts.grant.into(),
            release: texts.release.into(),
            channel: format!("distlock_{}", config.table_name().replace('.', "_")),
        })
    }

    /// The grant and the guarded release of the free `key`, with a fresh
    /// owner and the holder details, bound as the driver binds them
    /// (PostgreSQL: key, owner, TTL µs, details → `RETURNING token`; then
    /// key, owner, token, channel. MariaDB: key bytes, owner, TTL µs,
    /// details → `LAST_INSERT_ID`; then key bytes, owner, token. SQLite:
    /// key, owner, now, TTL µs, details → `RETURNING token`; then key,
    /// owner, token, now).
    async fn cycle(&self, key: &str) -> Result<(), BoxError> {
        let owner = OwnerId::random().to_hex();
        let owner = owner.as_str();
        let details = HolderDetails::encode_current();
        let ttl = micros(TTL);
        let token: Option<i64> = match &self.pool {
            Pool::Postgres(pool) => {
                let query = sqlx::query(sql(&self.grant))
                    .bind(key)
                    .bind(owner)
                    .bind(ttl)
                    .bind(details);
                let row = query.fetch_optional(pool).await?;
                row.map(|row| row.try_get(0)).transpose()?
            }
            Pool::MySql(pool) => {
                let query = sqlx::query(sql(&self.grant))
                    .bind(key.as_bytes())
                    .bind(owner)
                    .bind(ttl)
                    .bind(details);
                let done = query.execute(pool).await?;
                Some(i64::try_from(done.last_insert_id())?).filter(|t| *t != 0)
            }
            Pool::Sqlite(pool) => {
                let query = sqlx::query(sql(&self.grant))
                    .bind(key)
                    .bind(owner)
                    .bind(unix_micros())
                    .bind(ttl)
                    .bind(details);
                let row = query.fetch_optional(pool).await?;
                row.map(|row| row.try_get(0)).transpose()?
            }
        };
        let token = token.expect("the key is free");
        let released = match &self.pool {
            Pool::Postgres(pool) => {
                let query = sqlx::query(sql(&self.release))
                    .bind(key)
                    .bind(owner)
                    .bind(token)
                    .bind(self.channel.as_str());
                query.fetch_optional(pool).await?.is_some()
            }
            Pool::MySql(pool) => {
                let query = sqlx::query(sql(&self.release))
                    .bind(key.as_bytes())
                    .bind(owner)
                    .bind(token);
                query.execute(pool).await?.rows_affected() == 1
            }
            Pool::Sqlite(pool) => {
                let query = sqlx::query(sql(&self.release))
                    .bind(key)
                    .bind(owner)
                    .bind(token)
                    .bind(unix_micros());
                query.execute(pool).await?.rows_affected() == 1
            }
        };
        assert!(released, "the grant was still ours");
        Ok(())
    }
}

/// Where one database is and what to call it.
struct Database<'a> {
    name: &'a str,
    url: &'a str,
    /// The server's loopback port (none for SQLite).
    port: Option<u16>,
    /// The server's process.
    pid: Option<u32>,
}

/// The four sides on one database, measured and printed.
async fn probe(db: Database<'_>, cycles: usize, rtt: Option<Duration>) -> Result<(), BoxError> {
    let proxies: Vec<FaultProxy> = match db.port {
        Some(port) => parts_support::proxies(port, NAMES.len(), rtt).await?,
        None => Vec::new(),
    };
    // Each side's URL: through its proxy, one pooled connection.
    let url = |side: usize| {
        let base = match db.port {
            Some(port) => db.url.replace(
                &format!("127.0.0.1:{port}/"),
                &format!(
                    "127.0.0.1:{}/",
                    parts_support::port_of(&proxies, side, port)
                ),
            ),
            None => db.url.to_owned(),
        };
        format!("{base}?pool_size=1")
    };
    // The backends first: they create the tables.
    let direct = lock_sql::connect(&url(DIRECT)).await?;
    let ours = LockClient::new(lock_sql::connect(&url(OURS)).await?);
    let floor = SqlFloor::connect(&url(FLOOR)).await?;
    let alone = CrateAlone::connect(&url(CRATE_ALONE)).await?;
    let direct_key = LockKey::new("parts-direct")?;
    let measured = parts_support::interleaved(
        &NAMES,
        cycles,
        db.pid,
        &proxies,
        async |side| -> Result<(), BoxError> {
            match side {
                FLOOR => floor.cycle("parts-floor", TTL).await?,
                CRATE_ALONE => alone.cycle("parts-crate").await?,
                DIRECT => parts_support::direct_cycle(&direct, &direct_key).await?,
                _ => parts_support::ours_cycle(&ours).await?,
            }
            Ok(())
        },
    )
    .await?;
    let rtt = rtt.map_or_else(|| "no injected RTT".to_owned(), |r| format!("{r:?} RTT"));
    println!("{}, 1 client, {cycles} cycles per side, {rtt}:", db.name);
    measured.print(&[
        (OURS, FLOOR),
        (DIRECT, FLOOR),
        (OURS, CRATE_ALONE),
        (CRATE_ALONE, FLOOR),
    ]);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let cycles = parts_support::cycles();
    let rtt = parts_support::rtt();
    let wanted =
        std::env::var("SQL_DATABASES").unwrap_or_else(|_| "postgres,mariadb,sqlite".to_owned());
    for database in wanted.split(',') {
        match database {
            "postgres" => match PostgresServer::start().await {
                Ok(mut server) => {
                    let db = Database {
                        name: "postgres",
                        url: &server.url(),
                        port: Some(server.port()),
                        pid: server.process().pid(),
                    };
                    probe(db, cycles, rtt).await?;
                }
                Err(e) => eprintln!("postgres skipped: {e}"),
            },
            "mariadb" => match MariaDbServer::start().await {
                Ok(mut server) => {
                    let db = Database {
                        name: "mariadb",
                        url: &server.url(),
                        port: Some(server.port()),
                        pid: server.process().pid(),
                    };
                    probe(db, cycles, rtt).await?;
                }
                Err(e) => eprintln!("mariadb skipped: {e}"),
            },
            "sqlite" if rtt.is_some() => eprintln!("sqlite skipped: no network to delay"),
            "sqlite" => {
                let dir = tempfile::tempdir()?;
                let url = format!("sqlite://{}", dir.path().join("parts.db").display());
                let db = Database {
                    name: "sqlite (file, WAL)",
                    url: &url,
                    port: None,
                    pid: None,
                };
                probe(db, cycles, rtt).await?;
            }
            other => eprintln!("unknown database {other:?} (postgres, mariadb, sqlite)"),
        }
    }
    Ok(())
}
