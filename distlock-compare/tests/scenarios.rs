//! `distlock-compare compare --spawn` on the replicated and clustered Redis
//! deployments (`--quick`: the mutex's cases and fault matrix), run as a
//! process and judged from its JSON: the async
//! replica failover must be flagged (a negative control: Redis loses the
//! grant), Redlock must stay safe with a minority of its nodes down and
//! fail cleanly with a majority down, and nothing may be a violation.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use conformance::OrSkip;
use conformance::process::find_binary;
use conformance::servers::redis::{PACKAGE, TOOLS_PACKAGE};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_distlock-compare");

fn verdict<'a>(report: &'a Value, backend: &str, scenario: &str) -> &'a str {
    report["backends"]
        .as_array()
        .and_then(|list| list.iter().find(|b| b["name"] == backend))
        .and_then(|b| b["scenarios"][scenario]["verdict"].as_str())
        .unwrap_or_else(|| panic!("no verdict for {backend}/{scenario} in {report:#}"))
}

#[test]
fn failover_is_flagged_and_redlock_survives_node_loss() {
    // Missing servers: a printed skip locally, a failure under CI.
    if find_binary("redis-server", PACKAGE).or_skip().is_none()
        || find_binary("redis-cli", TOOLS_PACKAGE).or_skip().is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let started = Instant::now();
    let out = Command::new(BIN)
        .args([
            "compare",
            "--spawn",
            // The mutex's cases and fault matrix: the scenarios this test
            // judges (the drivers' own tests run the whole suite).
            "--quick",
            "--backends",
            "redis-replica,redlock",
            "--json",
        ])
        .arg(&json)
        .env_remove("DISTLOCK_URL")
        .env_remove("DISTLOCK_CONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("run distlock-compare compare");
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n(took {elapsed:?})");
    let text = std::fs::read_to_string(&json)
        .unwrap_or_else(|e| panic!("no JSON report ({e}); stderr:\n{stderr}"));
    let report: Value = serde_json::from_str(&text).expect("the report is JSON");

    for backend in ["redis-replica", "redlock"] {
        let entry = report["backends"]
            .as_array()
            .and_then(|list| list.iter().find(|b| b["name"] == backend))
            .unwrap_or_else(|| panic!("{backend} missing from the report"));
        assert!(
            entry["error"].is_null(),
            "{backend} was not compared: {}",
            entry["error"]
        );
    }

    // The negative control: acquired on the master, master killed before
    // replicating, replica promoted, the key granted again.
    assert_eq!(
        verdict(&report, "redis-replica", "replica_failover"),
        "flagged",
        "{stdout}"
    );
    let failover = &report["backends"][0]["scenarios"]["replica_failover"];
    assert_eq!(failover["negative_control"], true);
    assert_eq!(failover["double_grant"], true, "{failover:#}");
    assert!(
        failover["token_regressions"].as_u64().unwrap_or(0) >= 1,
        "{failover:#}"
    );
    // Redlock: 2 of 5 down keeps granting safely; 3 of 5 down fails in
    // time and leaves the key free.
    assert_eq!(
        verdict(&report, "redlock", "minority_down"),
        "safe",
        "{stdout}"
    );
    assert_eq!(
        verdict(&report, "redlock", "majority_down"),
        "safe",
        "{stdout}"
    );
    let majority = &report["backends"][1]["scenarios"]["majority_down"];
    assert_eq!(majority["granted_without_majority"], false, "{majority:#}");
    // Abilities decide, not names: no failover for Redlock, no node loss
    // for a master/replica pair.
    assert_eq!(verdict(&report, "redlock", "replica_failover"), "skipped");
    assert_eq!(
        verdict(&report, "redis-replica", "minority_down"),
        "skipped"
    );

    for b in report["backends"].as_array().into_iter().flatten() {
        for (name, s) in b["scenarios"].as_object().into_iter().flatten() {
            assert_ne!(
                s["verdict"], "violation",
                "{} {name}: {}",
                b["name"], s["detail"]
            );
        }
    }
    assert!(
        elapsed < Duration::from_secs(240),
        "the comparison took {elapsed:?}"
    );
}
