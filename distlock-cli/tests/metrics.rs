//! `--metrics-addr`: a real HTTP client (curl, Debian's `curl`) scrapes the
//! Prometheus endpoint while `run` holds its lock, and the counters match
//! what the run did: one attempt, one grant, the renewals its TTL implies
//! (each with its safety margin), nothing lost; and a second `run` that
//! finds the key held counts a timeout, not a grant.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};

use conformance::OrSkip;
use conformance::process::{find_binary, in_ci};
use conformance::servers::redis::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `series -> value` of a Prometheus text page.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn curl() -> Option<std::path::PathBuf> {
    match find_binary("curl", "curl") {
        Ok(path) => Some(path),
        Err(e) => {
            assert!(!in_ci(), "CI requires curl: {e}");
            eprintln!("SKIPPED: {e}");
            None
        }
    }
}

/// Runs `distlock run` on `url` holding `jobs/report` for about 1.4 s with a
/// 1 s TTL, scraping its endpoint from inside the command; returns the
/// scraped page.
fn scrape_during_run(url: &str, curl: &Path, dir: &Path) -> String {
    let port = free_port();
    let page = dir.join("page.txt");
    let script = format!(
        "sleep 1.4; {curl} -sS --max-time 5 http://127.0.0.1:{port}/metrics > {page}",
        curl = curl.display(),
        page = page.display()
    );
    let status = Command::new(BIN)
        .args(["--url", url, "--metrics-addr", &format!("127.0.0.1:{port}")])
        .args([
            "run",
            "--ttl",
            "1s",
            "jobs/report",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .env_remove("DISTLOCK_URL")
        .env_remove("DISTLOCK_CONFIG")
        .stdin(Stdio::null())
        .status()
        .expect("run distlock");
    assert!(status.success(), "distlock run failed: {status}");
    std::fs::read_to_string(&page).expect("the scraped page")
}

fn check(url: &str, backend: &str) {
    let Some(curl) = curl() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let page = scrape_during_run(url, &curl, dir.path());
    println!("{page}");
    let s = samples(&page);
    let labels = format!("backend=\"{backend}\",key=\"jobs\"");
    let get = |name: &str, extra: &str| {
        s.get(&format!("{name}{{{labels}{extra}}}"))
            .copied()
            .unwrap_or(0.0)
    };
    assert_eq!(
        get("distlock_acquire_attempts_total", ",shape=\"mutex\""),
        1.0
    );
    assert_eq!(
        get("distlock_acquire_grants_total", ",shape=\"mutex\""),
        1.0
    );
    assert_eq!(
        get("distlock_acquire_wait_seconds_count", ",shape=\"mutex\""),
        1.0
    );
    // Renewed about every TTL/3 for 1.4 s: 3 to 5 renewals by the scrape.
    let renewals = get("distlock_renewals_total", ",outcome=\"ok\"");
    assert!((3.0..=5.0).contains(&renewals), "{renewals} renewals");
    assert_eq!(get("distlock_renewals_total", ",outcome=\"failed\""), 0.0);
    assert_eq!(get("distlock_renewal_margin_seconds_count", ""), renewals);
    // Each renewal came back with most of the TTL still left.
    let margin = get("distlock_renewal_margin_seconds_sum", "") / renewals;
    assert!((0.3..1.0).contains(&margin), "mean margin {margin} s");
    assert!(
        !page.contains("distlock_locks_lost_total"),
        "nothing was lost: {page}"
    );
}

#[test]
fn metrics_of_a_run_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    check(
        &format!("sqlite://{}", dir.path().join("locks.db").display()),
        "sqlite",
    );
}

#[test]
fn metrics_of_a_run_on_redis() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(redis) = rt.block_on(RedisServer::start()).or_skip() else {
        return;
    };
    check(&redis.url(), "redis");
}

/// A `run` waiting for a held key, scraped from outside while it waits:
/// one attempt, no grant yet.
#[test]
fn a_waiting_run_counts_its_attempt_and_no_grant() {
    let Some(curl) = curl() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let mut holder = Command::new(BIN)
        .args([
            "--url", &url, "run", "--ttl", "5s", "jobs/a", "--", "sleep", "4",
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("holder");
    std::thread::sleep(std::time::Duration::from_millis(700));
    let port = free_port();
    let mut waiter = Command::new(BIN)
        .args([
            "--url",
            &url,
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ])
        .args(["run", "--wait", "2s", "jobs/a", "--", "true"])
        .stdin(Stdio::null())
        .spawn()
        .expect("waiter");
    std::thread::sleep(std::time::Duration::from_millis(800));
    let scraped = Command::new(&curl)
        .args([
            "-sS",
            "--max-time",
            "5",
            &format!("http://127.0.0.1:{port}/"),
        ])
        .output()
        .expect("curl");
    let status = waiter.wait().expect("waiter");
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(status.code(), Some(75), "the waiter gives up (75)");
    assert!(
        scraped.status.success(),
        "the waiter's endpoint did not answer"
    );
    let text = String::from_utf8_lossy(&scraped.stdout).into_owned();
    let s = samples(&text);
    let series = "distlock_acquire_attempts_total{backend=\"sqlite\",key=\"jobs\",shape=\"mutex\"}";
    assert_eq!(s.get(series).copied(), Some(1.0), "{text}");
    assert!(!text.contains("distlock_acquire_grants_total"), "{text}");
}
