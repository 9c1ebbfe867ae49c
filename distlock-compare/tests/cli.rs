//! `distlock-compare` as a process: usage errors before anything starts,
//! the held-at-scale child, the client-shape probe, and help with
//! examples.

use std::path::Path;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_distlock-compare");

/// `distlock-compare --url URL ARGS...`, ignoring `DISTLOCK_URL` /
/// `DISTLOCK_CONFIG` from the environment, stdin closed.
fn distlock(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("--url").arg(url).args(args);
    cmd.env_remove("DISTLOCK_URL")
        .env_remove("DISTLOCK_CONFIG")
        .env_remove("DISTLOCK_LABEL");
    cmd.stdin(Stdio::null());
    cmd
}

fn output(mut cmd: Command) -> Output {
    cmd.output().expect("run distlock-compare")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

#[test]
fn help_has_examples_for_every_command() {
    for command in ["compare", "check"] {
        let out = output({
            let mut c = Command::new(BIN);
            c.args([command, "--help"]);
            c
        });
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("Example"),
            "{command} --help has no example:\n{text}"
        );
    }
}

/// `compare --backends` takes the backend names and URL schemes as
/// aliases; an unknown name is a usage error (exit 2) before anything
/// starts.
#[test]
fn compare_refuses_unknown_backend_names() {
    let out = output(distlock(
        "memory://",
        &["compare", "--backends", "memory,nosuch"],
    ));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("unknown backend \"nosuch\""),
        "{}",
        stderr(&out)
    );
    assert!(
        !stderr(&out).contains("conformance"),
        "it started: {}",
        stderr(&out)
    );
    // `zk` is `zookeeper`, which needs --spawn: refused as that, not as unknown.
    let out = output(distlock("memory://", &["compare", "--backends", "zk"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("\"zookeeper\" needs a server"),
        "{}",
        stderr(&out)
    );
}

/// `compare`'s held-at-scale child (`distlock-compare held-at-scale`, hidden):
/// holds the locks in a process of its own and prints its report as
/// JSON; a bad URL is a one-line error and a failing exit, not a report.
#[test]
fn held_at_scale_child_prints_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let out = output(distlock(
        "memory://",
        &[
            "held-at-scale",
            "--locks",
            "200",
            "--key-prefix",
            "t/",
            &url,
        ],
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["locks"], 200, "{report}");
    assert_eq!(report["all_held"], true, "{report}");
    assert!(report["bytes_per_lock"].as_f64().unwrap() > 0.0, "{report}");
    assert_eq!(report["release_errors"], 0, "{report}");

    let out = output(distlock(
        "memory://",
        &[
            "held-at-scale",
            "--locks",
            "10",
            "--key-prefix",
            "t/",
            "nosuch://x",
        ],
    ));
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(stderr(&out).trim().lines().count(), 1, "{}", stderr(&out));
}

/// The client-shape probe (`distlock-compare client-shape`, hidden): each
/// side on SQLite names its threads and prints its window's figures as
/// JSON, with cycles done in the window.
#[test]
fn client_shape_probe_prints_its_figures() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    for shape in ["clients", "shared", "floor"] {
        let out = output(distlock(
            "memory://",
            &[
                "client-shape",
                "--shape",
                shape,
                "--tasks",
                "2",
                "--window",
                "200ms",
                &url,
            ],
        ));
        assert!(out.status.success(), "{shape}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("threads connected and warm:"),
            "{}",
            stderr(&out)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["shape"], shape, "{report}");
        assert_eq!(report["tasks"], 2, "{report}");
        assert!(report["cycles_per_s"].as_f64().unwrap() > 0.0, "{report}");
        assert!(report["client_cpu_us_per_cycle"].is_number(), "{report}");
    }
}

/// `compare --quick` checks the mutex and says which checks it left to
/// the full run (in the table's text and the JSON), how long each phase
/// took, and which facets the backend has.
#[test]
fn quick_names_what_it_left_to_the_full_run() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let out = output(distlock(
        "memory://",
        &[
            "compare",
            "--quick",
            "--backends",
            "memory",
            "--no-scenarios",
            "--json",
            json.to_str().unwrap(),
        ],
    ));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", stderr(&out));
    assert!(stdout.contains("left to the full run"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let memory = &report["backends"][0];
    let left: Vec<&str> = memory["left_to_full_run"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    for what in [
        "case readers_share_writers_exclude",
        "case one_leader_at_a_time",
        "figures shared-lock",
    ] {
        assert!(left.contains(&what), "{what} not in {left:?}");
    }
    let ran: Vec<&str> = memory["conformance"]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert!(ran.contains(&"mutual_exclusion"), "{ran:?}");
    assert!(!ran.contains(&"readers_share_writers_exclude"), "{ran:?}");
    assert!(memory["bench"]["readers_8_per_s"].is_null(), "{memory:#}");
    // The client shapes' baselines (raw server lock, client library alone)
    // are there and null on a backend that has neither.
    for field in [
        "raw_throughput_8x8",
        "throughput_raw_ratio",
        "throughput_shared_client_raw_ratio",
        "token_cost_ratio",
        "crate_alone_library",
        "crate_alone_throughput_8x8",
        "crate_alone_floor_ratio",
        "throughput_crate_alone_ratio",
        "crate_alone_throughput_shared_client",
        "crate_alone_shared_client_floor_ratio",
        "throughput_shared_client_crate_alone_ratio",
    ] {
        let value = memory["bench"].get(field);
        assert!(
            value.is_some_and(serde_json::Value::is_null),
            "{field}: {memory:#}"
        );
    }
    let rounds = memory["bench"]["client_shape_rounds"].as_array().unwrap();
    assert!(!rounds.is_empty(), "{memory:#}");
    assert!(
        rounds[0]["raw"].is_null()
            && rounds[0]["crate_alone"].is_null()
            && rounds[0]["shared_crate_alone"].is_null(),
        "{rounds:?}"
    );
    // The facets the in-memory backend has, beside its capabilities and
    // in its suite report.
    let facets = serde_json::json!(["listing", "admin", "lock_sets", "downgrade"]);
    assert_eq!(memory["capabilities"]["facets"], facets, "{memory:#}");
    assert_eq!(memory["conformance"]["facets"], facets, "{memory:#}");
    let phases = memory["phases"].as_array().unwrap();
    assert!(
        phases.iter().any(|p| p["name"] == "suite mutual_exclusion"),
        "{phases:?}"
    );
    assert!(
        phases.iter().any(|p| p["name"] == "bench latency"),
        "{phases:?}"
    );
}
