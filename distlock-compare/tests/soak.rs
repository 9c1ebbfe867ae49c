//! `distlock-compare compare --soak`: a short soak on the embedded backend
//! prints its seed, writes the per-fault figures as JSON and exits 0; the
//! same `--seed` is reported back; bad flags are usage errors.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_distlock-compare");

#[test]
fn a_short_soak_reports_its_seed_and_faults() {
    let dir = tempfile::tempdir().expect("temp dir");
    let json = dir.path().join("soak.json");
    let out = Command::new(BIN)
        .args([
            "compare",
            "--soak",
            "6s",
            "--seed",
            "4242",
            "--backends",
            "memory",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("soak seed 4242"), "{stderr}");
    assert!(stdout.contains("client_freeze"), "{stdout}");
    assert!(stdout.contains("verdict: safe"), "{stdout}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written")).expect("json");
    let report = &doc["soak"][0]["report"];
    assert_eq!(report["seed"], 4242);
    assert_eq!(report["backend"], "memory");
    assert!(report["grants"].as_u64().unwrap_or(0) > 0, "{report}");
    assert!(
        report["faults"]["client_freeze"]["injected"].is_u64(),
        "{report}"
    );
    assert_eq!(report["unexpected_violations"], 0, "{report}");
}

#[test]
fn soak_flags_are_checked() {
    let bad_duration = Command::new(BIN)
        .args(["compare", "--soak", "10", "--backends", "memory"])
        .output()
        .expect("runs");
    assert_eq!(bad_duration.status.code(), Some(2));
    let seed_alone = Command::new(BIN)
        .args(["compare", "--seed", "1"])
        .output()
        .expect("runs");
    assert_eq!(seed_alone.status.code(), Some(2));
    let needs_spawn = Command::new(BIN)
        .args(["compare", "--soak", "1s", "--backends", "redis"])
        .output()
        .expect("runs");
    assert_eq!(needs_spawn.status.code(), Some(2));
}
