//! Handoffs on one key, unfair vs `fair=true`: 4 contenders cycling
//! acquire+release on one key, each on its own backend with its own wake-up
//! scope (a distinct harmless driver option), as if each ran in its own
//! process, so nothing in-process lets waiters go first; then the same
//! with the 4 in one process (same URL: one wake-up scope), and fair apart
//! with the poll backoff capped at 20 ms. Prints handoffs/s
//! and each contender's grants (the spread: the busiest over the least
//! busy). Measures only; asserts nothing.
//!
//! ```text
//! cargo run --release -p lock-bench --example sql_fair_handoff
//! ```
//!
//! Starts MariaDB and PostgreSQL where installed and uses a SQLite file.
//! Environment: `BENCH_HANDOFF_SECS` (seconds per run, default 3).

use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{self, Contender, Ours};
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use lock_core::{LockClient, RetryPolicy};
use lock_sql::{SqlBackend, SqlConfig};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const CONTENDERS: usize = 4;

/// `url` plus `options`.
fn with(url: &str, options: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{options}")
}

/// How contender `i`'s URL differs from the others' (its own wake-up scope).
enum Scope<'a> {
    /// A harmless driver option with a per-contender value.
    Option(&'a str),
    /// SQLite: the same file spelled with `i` extra `./` segments.
    Dots,
}

async fn run(name: &str, url: &str, scope: Scope<'_>, secs: u64) -> Result<(), BoxError> {
    // Each contender as its own process, then all in one process; last,
    // fair apart with the polling backoff capped at 20 ms instead of 100.
    let runs = [
        (false, true, None),
        (true, true, None),
        (false, false, None),
        (true, false, None),
        (true, true, Some(Duration::from_millis(20))),
    ];
    for (fair, apart, poll_max) in runs {
        let mut contenders: Vec<Arc<dyn Contender>> = Vec::new();
        for i in 0..CONTENDERS {
            let url = match scope {
                _ if !apart => url.to_owned(),
                Scope::Option(option) => with(url, &format!("{option}={}", 100 + i)),
                Scope::Dots => {
                    url.replacen("/handoff.db", &format!("/{}handoff.db", "./".repeat(i)), 1)
                }
            };
            let url = with(&url, &format!("fair={fair}&ttl=30s"));
            let mut config = SqlConfig::from_url(&url)?;
            if let Some(max) = poll_max {
                config = config.poll_policy(RetryPolicy {
                    initial: Duration::from_millis(5),
                    max,
                    multiplier: 2,
                    max_attempts: None,
                });
            }
            let client = LockClient::new(SqlBackend::connect(config).await?);
            contenders.push(Arc::new(Ours::new(client, Duration::from_secs(30))));
        }
        let key = format!("handoff/{}/{fair}", lock_core::OwnerId::random());
        let h = bench::handoffs(&contenders, &key, Duration::from_secs(secs)).await?;
        println!(
            "{name:<9} fair={fair:<5} {:<12} {:>8.1} handoffs/s  grants per contender {:?}  spread {:.2}",
            match (apart, poll_max) {
                (true, None) => "apart".to_owned(),
                (true, Some(max)) => format!("apart {max:?}"),
                _ => "one process".to_owned(),
            },
            h.per_sec,
            h.per_client,
            h.spread()
        );
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let secs = std::env::var("BENCH_HANDOFF_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    match MariaDbServer::start().await {
        Ok(server) => {
            run(
                "mariadb",
                &server.url(),
                Scope::Option("statement-cache-capacity"),
                secs,
            )
            .await?
        }
        Err(e) => println!("mariadb skipped: {e}"),
    }
    match PostgresServer::start().await {
        Ok(server) => {
            run(
                "postgres",
                &server.url(),
                Scope::Option("statement-cache-capacity"),
                secs,
            )
            .await?
        }
        Err(e) => println!("postgres skipped: {e}"),
    }
    let dir = tempfile::tempdir()?;
    let url = format!(
        "sqlite://{}?busy_timeout=5s",
        dir.path().join("handoff.db").display()
    );
    run("sqlite", &url, Scope::Dots, secs).await?;
    Ok(())
}
