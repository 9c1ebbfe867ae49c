//! Benchmark: our acquire+release cycle against the raw floor, the same
//! two statements issued by hand with sqlx on the same pool, per database.
//!
//! `cargo run --release -p lock-sql --example bench`
//!
//! Starts its own PostgreSQL and MariaDB where installed (skipped with a
//! note otherwise) and uses a SQLite file in a temporary directory. Runs
//! ours and the floor in alternating rounds so both see the same machine
//! load, sequentially on one key and with 8 tasks on 8 keys, and prints
//! p50/p99 and the ratios. Measures only; asserts nothing.
//!
//! Environment: `BENCH_CYCLES` (per variant, default 2000), `BENCH_ROUNDS`
//! (alternations, default 4).

use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{LatencyStats, ratio};
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use lock_core::{LockKey, OwnerId};
use lock_sql::sqlx::{self, AssertSqlSafe, Row};
use lock_sql::{SqlBackend, SqlDialect};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);
const TASKS: usize = 8;

/// The statements the driver issues, written out by hand (see the crate
/// docs), so the floor does exactly the same database work.
struct RawSql {
    grant: Arc<str>,
    release: Arc<str>,
}

fn raw_sql(backend: &SqlBackend) -> RawSql {
    let t = backend.quoted_table();
    let (grant, release) = match backend.dialect() {
        SqlDialect::Postgres => (
            format!(
                "INSERT INTO {t} AS l (name, owner, token, expires_at) \
                 VALUES ($1, $2, 1, now() + $3 * INTERVAL '1 microsecond') \
                 ON CONFLICT (name) DO UPDATE \
                 SET owner = EXCLUDED.owner, token = l.token + 1, expires_at = EXCLUDED.expires_at \
                 WHERE l.expires_at <= now() RETURNING token"
            ),
            format!(
                "WITH r AS (UPDATE {t} SET owner = NULL, expires_at = now() \
                 WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > now() \
                 RETURNING name) SELECT pg_notify($4, name) FROM r"
            ),
        ),
        SqlDialect::MySql => (
            format!(
                "INSERT INTO {t} (name, owner, token, expires_at) \
                 VALUES (?, ?, LAST_INSERT_ID(1), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
                 ON DUPLICATE KEY UPDATE \
                 token = IF(expires_at <= UTC_TIMESTAMP(6), LAST_INSERT_ID(token + 1), token + LAST_INSERT_ID(0)), \
                 owner = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(owner), owner), \
                 expires_at = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(expires_at), expires_at)"
            ),
            format!(
                "UPDATE {t} SET owner = NULL, expires_at = UTC_TIMESTAMP(6) \
                 WHERE name = ? AND owner = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)"
            ),
        ),
        _ => (
            format!(
                "INSERT INTO {t} AS l (name, owner, token, expires_at) VALUES (?1, ?2, 1, ?3 + ?4) \
                 ON CONFLICT (name) DO UPDATE \
                 SET owner = excluded.owner, token = l.token + 1, expires_at = excluded.expires_at \
                 WHERE l.expires_at <= ?3 RETURNING token"
            ),
            format!(
                "UPDATE {t} SET owner = NULL, expires_at = ?4 \
                 WHERE name = ?1 AND owner = ?2 AND token = ?3 AND expires_at > ?4"
            ),
        ),
    };
    RawSql {
        grant: Arc::from(grant),
        release: Arc::from(release),
    }
}

fn unix_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// One grant + release by hand on the backend's own pool.
async fn raw_cycle(backend: &SqlBackend, sql: &RawSql, key: &str) -> Result<(), sqlx::Error> {
    let owner = OwnerId::random().to_hex();
    let ttl_us = i64::try_from(TTL.as_micros()).unwrap_or(i64::MAX);
    let missing = || sqlx::Error::Protocol("benchmark key unexpectedly held".into());
    if let Some(pool) = backend.pg_pool() {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&sql.grant)))
            .bind(key)
            .bind(&owner)
            .bind(ttl_us)
            .fetch_optional(pool)
            .await?
            .ok_or_else(missing)?;
        let token: i64 = row.try_get(0)?;
        sqlx::query(AssertSqlSafe(Arc::clone(&sql.release)))
            .bind(key)
            .bind(&owner)
            .bind(token)
            .bind("distlock_distlock_leases")
            .fetch_optional(pool)
            .await?
            .ok_or_else(missing)?;
    } else if let Some(pool) = backend.mysql_pool() {
        let done = sqlx::query(AssertSqlSafe(Arc::clone(&sql.grant)))
            .bind(key.as_bytes())
            .bind(&owner)
            .bind(ttl_us)
            .execute(pool)
            .await?;
        let token = i64::try_from(done.last_insert_id()).unwrap_or(0);
        if token == 0 {
            return Err(missing());
        }
        sqlx::query(AssertSqlSafe(Arc::clone(&sql.release)))
            .bind(key.as_bytes())
            .bind(&owner)
            .bind(token)
            .execute(pool)
            .await?;
    } else if let Some(pool) = backend.sqlite_pool() {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&sql.grant)))
            .bind(key)
            .bind(&owner)
            .bind(unix_micros())
            .bind(ttl_us)
            .fetch_optional(pool)
            .await?
            .ok_or_else(missing)?;
        let token: i64 = row.try_get(0)?;
        sqlx::query(AssertSqlSafe(Arc::clone(&sql.release)))
            .bind(key)
            .bind(&owner)
            .bind(token)
            .bind(unix_micros())
            .execute(pool)
            .await?;
    }
    Ok(())
}

async fn our_cycle(backend: &SqlBackend, key: &LockKey) -> Result<(), lock_core::LockError> {
    conformance::bench::cycle(backend, key, TTL).await
}

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Ours,
    Raw,
}

/// Runs `cycles` cycles spread over `tasks` tasks (each on its own key) and
/// returns every cycle's latency.
async fn run(
    backend: &SqlBackend,
    sql: &Arc<RawSql>,
    variant: Variant,
    prefix: &str,
    tasks: usize,
    cycles: usize,
) -> Vec<Duration> {
    let per_task = cycles / tasks;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let backend = backend.clone();
        let sql = Arc::clone(sql);
        let name = format!("bench/{prefix}-{t}");
        handles.push(tokio::spawn(async move {
            let key = LockKey::new(name.clone()).expect("valid key");
            let mut samples = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                let started = Instant::now();
                match variant {
                    Variant::Ours => our_cycle(&backend, &key).await.expect("our cycle"),
                    Variant::Raw => raw_cycle(&backend, &sql, &name).await.expect("raw cycle"),
                }
                samples.push(started.elapsed());
            }
            samples
        }));
    }
    let mut all = Vec::with_capacity(cycles);
    for handle in handles {
        all.extend(handle.await.expect("bench task"));
    }
    all
}

struct Row2 {
    database: String,
    mode: &'static str,
    ours: LatencyStats,
    raw: LatencyStats,
}

async fn bench_database(name: &str, url: &str, cycles: usize, rounds: usize) -> Vec<Row2> {
    let backend = match SqlBackend::connect_url(url).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{name}: cannot connect: {e}");
            return Vec::new();
        }
    };
    let sql = Arc::new(raw_sql(&backend));
    let mut rows = Vec::new();
    for (mode, tasks) in [("sequential", 1), ("8 tasks/8 keys", TASKS)] {
        // Warm up both paths (connections, prepared statements, rows).
        let _ = run(
            &backend,
            &sql,
            Variant::Ours,
            "warm",
            tasks,
            100.max(tasks * 10),
        )
        .await;
        let _ = run(
            &backend,
            &sql,
            Variant::Raw,
            "warm",
            tasks,
            100.max(tasks * 10),
        )
        .await;
        let mut ours = Vec::new();
        let mut raw = Vec::new();
        let mut ours_wall = Duration::ZERO;
        let mut raw_wall = Duration::ZERO;
        let per_round = (cycles / rounds).max(tasks);
        for round in 0..rounds {
            // Alternate which goes first, so neither always runs warmer.
            let order = if round % 2 == 0 {
                [Variant::Ours, Variant::Raw]
            } else {
                [Variant::Raw, Variant::Ours]
            };
            for variant in order {
                let started = Instant::now();
                let samples = run(&backend, &sql, variant, "k", tasks, per_round).await;
                let wall = started.elapsed();
                if variant == Variant::Ours {
                    ours.extend(samples);
                    ours_wall += wall;
                } else {
                    raw.extend(samples);
                    raw_wall += wall;
                }
            }
        }
        rows.push(Row2 {
            database: name.to_owned(),
            mode,
            ours: LatencyStats::from_samples(ours, ours_wall),
            raw: LatencyStats::from_samples(raw, raw_wall),
        });
    }
    let _ = backend.close().await;
    rows
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let cycles = env_usize("BENCH_CYCLES", 2000);
    let rounds = env_usize("BENCH_ROUNDS", 4);
    let mut rows = Vec::new();

    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite_url = format!(
        "sqlite://{}?pool_size=8",
        dir.path().join("bench.db").display()
    );
    rows.extend(bench_database("sqlite (file, WAL)", &sqlite_url, cycles, rounds).await);

    match PostgresServer::start().await {
        Ok(server) => {
            let url = format!("{}?pool_size=8", server.url());
            rows.extend(bench_database("postgres 15", &url, cycles, rounds).await);
        }
        Err(e) => eprintln!("postgres skipped: {e}"),
    }
    match MariaDbServer::start().await {
        Ok(server) => {
            let url = format!("{}?pool_size=8", server.url());
            rows.extend(bench_database("mariadb", &url, cycles, rounds).await);
        }
        Err(e) => eprintln!("mariadb skipped: {e}"),
    }

    println!(
        "\nlock-sql: acquire+release cycle vs the same two statements by hand on the same pool \
         ({cycles} cycles per variant, {rounds} alternating rounds)\n"
    );
    println!(
        "{:<20} {:<16} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>10} {:>10}",
        "database",
        "mode",
        "ours p50",
        "raw p50",
        "ours p99",
        "raw p99",
        "p50 x",
        "p99 x",
        "ours/s",
        "raw/s"
    );
    for r in &rows {
        println!(
            "{:<20} {:<16} {:>8.0}us {:>8.0}us {:>8.0}us {:>8.0}us {:>8.3} {:>8.3} {:>10.0} {:>10.0}",
            r.database,
            r.mode,
            r.ours.p50_us,
            r.raw.p50_us,
            r.ours.p99_us,
            r.raw.p99_us,
            ratio(r.ours.p50_us, r.raw.p50_us),
            ratio(r.ours.p99_us, r.raw.p99_us),
            r.ours.per_sec,
            r.raw.per_sec,
        );
    }
}
