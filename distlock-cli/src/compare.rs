//! `distlock compare`: the conformance suite and latency, per backend, side
//! by side.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::bench::{self, LatencyStats};
use conformance::{Harness, MemoryTarget, SuiteConfig, SuiteReport, Target};
use lock_core::{LockBackend, LockError, LockKey};
use serde::Serialize;

/// A backend reached by URL: every client is a fresh `distlock::open`.
/// It cannot inject faults, so fault cases are skipped for it.
pub(crate) struct UrlTarget {
    pub(crate) name: String,
    pub(crate) url: String,
}

#[async_trait]
impl Target for UrlTarget {
    fn name(&self) -> String {
        self.name.clone()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        distlock::open(&self.url).await
    }
}

/// One row of the comparison.
#[derive(Debug, Serialize)]
pub(crate) struct BackendRow {
    pub(crate) name: String,
    pub(crate) url: String,
    pub(crate) verdict: String,
    pub(crate) suite: SuiteReport,
    pub(crate) cycle: Option<LatencyStats>,
    pub(crate) error: Option<String>,
}

pub(crate) struct Candidate {
    pub(crate) name: String,
    pub(crate) url: String,
    pub(crate) target: Arc<dyn Target>,
    _keep: Option<tempfile::TempDir>,
}

/// The embedded backends, which need no server: in-memory, and SQLite on a
/// file in a temporary directory.
pub(crate) fn embedded(names: &[String]) -> Result<Vec<Candidate>, String> {
    let mut out = Vec::new();
    for name in names {
        match name.as_str() {
            "memory" => out.push(Candidate {
                name: "memory".into(),
                url: "memory://".into(),
                target: Arc::new(MemoryTarget::new()),
                _keep: None,
            }),
            "sqlite" => {
                let dir = tempfile::Builder::new()
                    .prefix("distlock-compare-")
                    .tempdir()
                    .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
                let url = format!("sqlite://{}", dir.path().join("locks.db").display());
                out.push(Candidate {
                    name: "sqlite".into(),
                    url: url.clone(),
                    target: Arc::new(UrlTarget {
                        name: "sqlite".into(),
                        url,
                    }),
                    _keep: Some(dir),
                });
            }
            other => {
                return Err(format!(
                    "unknown embedded backend {other:?}; expected memory or sqlite (use --with URL for servers)"
                ));
            }
        }
    }
    Ok(out)
}

/// Candidates for user-given URLs.
pub(crate) fn from_urls(urls: &[String]) -> Vec<Candidate> {
    urls.iter()
        .map(|url| {
            let name = url.split("://").next().unwrap_or("url").to_owned();
            Candidate {
                name: name.clone(),
                url: url.clone(),
                target: Arc::new(UrlTarget {
                    name,
                    url: url.clone(),
                }),
                _keep: None,
            }
        })
        .collect()
}

pub(crate) async fn run(candidates: Vec<Candidate>, quick: bool) -> Vec<BackendRow> {
    let mut rows = Vec::new();
    let total = candidates.len();
    for (i, c) in candidates.into_iter().enumerate() {
        eprintln!("[{}/{total}] {}: conformance suite...", i + 1, c.name);
        let config = SuiteConfig {
            iterations: if quick { 10 } else { 25 },
            ..SuiteConfig::default()
        };
        let harness = Harness::with_config(c.target.clone(), config);
        let suite = conformance::run_suite(&harness).await;
        eprintln!(
            "[{}/{total}] {}: {}; latency...",
            i + 1,
            c.name,
            suite.verdict()
        );
        let (cycle, error) = match measure(&*c.target, quick).await {
            Ok(stats) => (Some(stats), None),
            Err(e) => (None, Some(e.to_string())),
        };
        rows.push(BackendRow {
            name: c.name,
            url: distlock::redact_url(&c.url),
            verdict: suite.verdict(),
            suite,
            cycle,
            error,
        });
    }
    rows
}

async fn measure(target: &dyn Target, quick: bool) -> Result<LatencyStats, LockError> {
    let backend = target.client().await?;
    let key = LockKey::new(format!("bench/{}", lock_core::OwnerId::random()))?;
    let ttl = Duration::from_secs(10).max(backend.capabilities().min_ttl);
    // Warm up connections and caches (script loads, prepared statements).
    bench::cycle_latency(backend.clone(), &key, ttl, 20).await?;
    let n = if quick { 300 } else { 2000 };
    bench::cycle_latency(backend, &key, ttl, n).await
}

pub(crate) fn print_table(rows: &[BackendRow]) {
    println!(
        "{:<10} {:<24} {:>14} {:>14} {:>12}",
        "backend", "conformance", "cycle p50 µs", "cycle p99 µs", "cycles/s"
    );
    for row in rows {
        match &row.cycle {
            Some(c) => println!(
                "{:<10} {:<24} {:>14.1} {:>14.1} {:>12.0}",
                row.name, row.verdict, c.p50_us, c.p99_us, c.per_sec
            ),
            None => println!(
                "{:<10} {:<24} {:>14} {:>14} {:>12}  ({})",
                row.name,
                row.verdict,
                "-",
                "-",
                "-",
                row.error.as_deref().unwrap_or("no measurement")
            ),
        }
    }
    for row in rows {
        for case in row.suite.failures() {
            println!("  {} FAILED {}: {}", row.name, case.name, case.detail);
        }
    }
}
