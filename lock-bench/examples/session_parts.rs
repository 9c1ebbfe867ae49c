//! Probe (not a test): SQL session mode (`?mode=session`) against the
//! server's own lock exchange (issue #43), on PostgreSQL and MariaDB
//! servers this process starts. Three sides, each a waiting acquire +
//! release cycle of one client:
//!
//! - **raw**: the bare advisory / `GET_LOCK` exchange written by hand on
//!   one sqlx connection: `SELECT pg_try_advisory_lock($1)` +
//!   `SELECT pg_advisory_unlock($1)` (MySQL/MariaDB `GET_LOCK(name, 0)` +
//!   `RELEASE_LOCK(name)`); when the try fails, a blocking
//!   `pg_advisory_lock` / `GET_LOCK(name, 60)`. No token.
//! - **raw + token**: the raw exchange with a fencing token taken in the
//!   grant statement, nothing else: `SELECT CASE WHEN
//!   pg_try_advisory_lock($1) THEN nextval(seq) END` (an `UNLOGGED
//!   CACHE 1` sequence, as the driver's); MariaDB `SELECT CASE WHEN
//!   GET_LOCK(?, 0) = 1 THEN CAST(UUID_SHORT() & (2^56 - 1) AS SIGNED)
//!   END` (the server's counter, as the driver's; MySQL would need the
//!   driver's token row). raw +
//!   token / raw is the fencing token's cost.
//! - **floor**: [`lock_bench::sql::SessionFloor`], the driver's own grant
//!   statement (lock and fencing token in one statement: `nextval` of the
//!   token sequence, the lean grant once the connection's idle timeout is
//!   armed for the TTL, as the driver's; MariaDB the server's
//!   `UUID_SHORT()` above the run's base, no holder row in a cycle shorter than the driver's
//!   publication delay) and release, by hand on one bare connection:
//!   floor / raw is the cost of the fencing token.
//! - **ours**: `LockClient` on `SqlSessionBackend`, waiting acquire then
//!   release, as users write it (each client its own backend); and the 8
//!   clients as 8 tasks sharing **one** backend (its sessions carry every
//!   client's locks).
//!
//! Printed per database: [`conformance::bench::StandardFigures`] (1 client
//! p50/p99, 8 clients on 8 keys throughput, 4 clients on one key
//! handoffs) of raw + token vs raw, floor vs raw, ours vs raw, ours (one
//! shared backend) vs raw, and ours vs raw + token. Run it in release mode while nothing else builds:
//!
//! ```text
//! cargo run --release -p lock-bench --example session_parts
//! ```
//!
//! Environment: `BENCH_CYCLES` (1-client cycles per side, default 2000),
//! `BENCH_ROUNDS` (default 6), `BENCH_HANDOFF_SECS` (default 2),
//! `SQL_DATABASES` (`postgres,mariadb`, the default), `BENCH_DURABILITY`
//! (`defaults`, the default: each server with its own durable settings,
//! MariaDB flushing its log at each commit, PostgreSQL `fsync=on`; `fast`:
//! the test kit's settings, where a write per grant costs little).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::bench::{Contender, FloorCycle, Ours, StandardRun, standard_figures};
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use conformance::servers::{Durability, set_durability};
use lock_bench::sql::SessionFloor;
use lock_core::{ErrorKind, LockClient, LockError, Operation};
use lock_sql::SqlSessionBackend;
use lock_sql::sqlx::{self, Connection};
use tokio::sync::Mutex;

const TTL: Duration = Duration::from_secs(30);

/// The 8 clients of one side.
type Side = [Arc<dyn Contender>];

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The raw exchange on one bare connection, with a token when `token`.
enum Raw {
    Pg(Mutex<sqlx::PgConnection>, bool),
    My(Mutex<sqlx::MySqlConnection>, bool),
}

/// The raw + token side's sequence (PostgreSQL) and counter (MariaDB).
const PG_SEQ: &str = "session_parts_useq";
const MY_TOKEN: &str = "CAST(UUID_SHORT() & 72057594037927935 AS SIGNED)";

fn failed(e: sqlx::Error) -> LockError {
    LockError::new(ErrorKind::Backend, Operation::Acquire, e.to_string())
}

/// The server lock of `key` (any fixed mapping does: the raw side only
/// contends with itself).
fn pg_key(key: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    i64::from_ne_bytes(h.to_ne_bytes())
}

impl Raw {
    async fn connect(url: &str, token: bool) -> Self {
        if url.starts_with("postgres") {
            let mut conn = sqlx::PgConnection::connect(url).await.expect("pg");
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "CREATE UNLOGGED SEQUENCE IF NOT EXISTS {PG_SEQ} AS BIGINT CACHE 1"
            )))
            .execute(&mut conn)
            .await
            .expect("sequence");
            Self::Pg(Mutex::new(conn), token)
        } else {
            let conn = sqlx::MySqlConnection::connect(url).await.expect("mysql");
            Self::My(Mutex::new(conn), token)
        }
    }
}

#[async_trait]
impl Contender for Raw {
    async fn cycle(&self, key: &str) -> Result<(), LockError> {
        match self {
            Self::Pg(conn, token) => {
                let conn = &mut *conn.lock().await;
                let k = pg_key(key);
                let got = if *token {
                    let t: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                        "SELECT CASE WHEN pg_try_advisory_lock($1) THEN nextval('{PG_SEQ}') END"
                    )))
                    .bind(k)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(failed)?;
                    t.is_some()
                } else {
                    sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1)")
                        .bind(k)
                        .fetch_one(&mut *conn)
                        .await
                        .map_err(failed)?
                };
                if !got {
                    let wait = if *token {
                        format!("SELECT pg_advisory_lock($1), nextval('{PG_SEQ}')")
                    } else {
                        "SELECT pg_advisory_lock($1)".to_owned()
                    };
                    sqlx::query(sqlx::AssertSqlSafe(wait))
                        .bind(k)
                        .execute(&mut *conn)
                        .await
                        .map_err(failed)?;
                }
                let _: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
                    .bind(k)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(failed)?;
            }
            Self::My(conn, token) => {
                let conn = &mut *conn.lock().await;
                let got = if *token {
                    let t: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                        "SELECT CASE WHEN GET_LOCK(?, 0) = 1 THEN {MY_TOKEN} END"
                    )))
                    .bind(key)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(failed)?;
                    t.is_some()
                } else {
                    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                        .bind(key)
                        .fetch_one(&mut *conn)
                        .await
                        .map_err(failed)?;
                    got == Some(1)
                };
                if !got {
                    if *token {
                        sqlx::query(sqlx::AssertSqlSafe(format!(
                            "SELECT GET_LOCK(?, 60), {MY_TOKEN}"
                        )))
                        .bind(key)
                        .execute(&mut *conn)
                        .await
                        .map_err(failed)?;
                    } else {
                        sqlx::query("SELECT GET_LOCK(?, 60)")
                            .bind(key)
                            .execute(&mut *conn)
                            .await
                            .map_err(failed)?;
                    }
                }
                let _: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                    .bind(key)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(failed)?;
            }
        }
        Ok(())
    }
}

async fn run(name: &str, base: &str) {
    let url = format!("{base}?mode=session");
    let mut run = StandardRun::new(env("BENCH_CYCLES", 2000));
    run.rounds = env("BENCH_ROUNDS", 6);
    run.handoff_window =
        Duration::from_secs(u64::try_from(env("BENCH_HANDOFF_SECS", 2)).unwrap_or(2));
    let (mut raw, mut floors, mut ours) = (Vec::new(), Vec::new(), Vec::new());
    let mut tokened = Vec::new();
    let shared = LockClient::new(SqlSessionBackend::connect_url(&url).await.expect("ours"));
    let mut ours_shared = Vec::new();
    for _ in 0..8 {
        raw.push(Arc::new(Raw::connect(base, false).await) as Arc<dyn Contender>);
        tokened.push(Arc::new(Raw::connect(base, true).await) as Arc<dyn Contender>);
        let floor = SessionFloor::connect(&url).await.expect("floor");
        floors.push(Arc::new(FloorCycle::new(Box::new(floor), TTL)) as Arc<dyn Contender>);
        let backend = SqlSessionBackend::connect_url(&url).await.expect("ours");
        ours.push(Arc::new(Ours::new(LockClient::new(backend), TTL)) as Arc<dyn Contender>);
        ours_shared.push(Arc::new(Ours::new(shared.clone(), TTL)) as Arc<dyn Contender>);
    }
    let (plain, with_token) = ("raw exchange (no token)", "raw exchange + token");
    let sides: [(&str, &Side, &str, &Side); 5] = [
        (with_token, &tokened, plain, &raw),
        ("floor (driver's grant by hand)", &floors, plain, &raw),
        ("ours (a backend per client)", &ours, plain, &raw),
        ("ours (8 clients on one backend)", &ours_shared, plain, &raw),
        ("ours (a backend per client)", &ours, with_token, &tokened),
    ];
    for (label, side, base_label, base) in sides {
        let figures = standard_figures(side, base, &run).await.expect("figures");
        figures.print(
            &format!("{name}: {label} vs {base_label}"),
            label,
            base_label,
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let durability = match std::env::var("BENCH_DURABILITY").as_deref() {
        Ok("fast") => Durability::Fast,
        _ => Durability::ServerDefaults,
    };
    set_durability(durability);
    println!("servers: {}", durability.describe());
    let databases = std::env::var("SQL_DATABASES").unwrap_or_else(|_| "postgres,mariadb".into());
    if databases.contains("postgres") {
        match PostgresServer::start().await {
            Ok(server) => run("postgres-session", &server.url()).await,
            Err(e) => println!("postgres skipped: {e}"),
        }
    }
    if databases.contains("mariadb") {
        match MariaDbServer::start().await {
            Ok(server) => run("mariadb-session", &server.url()).await,
            Err(e) => println!("mariadb skipped: {e}"),
        }
    }
}
