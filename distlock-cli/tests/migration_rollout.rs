//! A migration rollout straggler, reproduced with real `distlock run`
//! processes configured only by `DISTLOCK_MIGRATION_*`, as a user would:
//! a `dual` holder, a process still on `old` waiting behind it, then `new`
//! processes. When the `dual` holder releases, the `old` waiter gets the
//! old backend's lock while a `new` process gets the new backend's: before
//! the cutover guard both ran at once. Now the first `new` process
//! announces the cutover in the old backend, the straggler's grant is
//! refused, and `new` waits out the old leases before its first grant.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use conformance::OrSkip;
use conformance::servers::etcd::EtcdServer;
use conformance::servers::redis::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_distlock");
const KEY: &str = "jobs/rollout";

/// A `distlock run` configured for a migration in `phase` through the
/// environment only; the command logs `start NAME` / `end NAME` around a
/// sleep.
fn run(old: &str, new: &str, phase: &str, name: &str, log: &Path, hold: &str) -> Command {
    let script = format!(
        "echo \"start {name} $DISTLOCK_FENCING_TOKEN\" >> {log}; sleep {hold}; echo \"end {name}\" >> {log}",
        log = log.display()
    );
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--wait", "30s", KEY, "--", "sh", "-c", &script])
        .env_remove("DISTLOCK_URL")
        .env_remove("DISTLOCK_CONFIG")
        .env("DISTLOCK_MIGRATION_OLD", old)
        .env("DISTLOCK_MIGRATION_NEW", new)
        .env("DISTLOCK_MIGRATION_PHASE", phase)
        .env("DISTLOCK_TTL", "2s")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn wait_for_line(log: &Path, prefix: &str) {
    let started = Instant::now();
    while !lines(log).iter().any(|l| l.starts_with(prefix)) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{prefix:?} never appeared: {:?}",
            lines(log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn finish(child: Child) -> Output {
    child.wait_with_output().expect("wait for distlock")
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

fn straggler_is_refused(old: &str, new: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let dual = run(old, new, "dual", "dual", &log, "4").spawn().unwrap();
    wait_for_line(&log, "start dual");
    // The straggler: still configured for `old`, waiting behind the dual
    // holder in the old backend, so it holds nothing `inspect` could show.
    let straggler = run(old, new, "old", "old", &log, "2").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // The fleet moves on to `new`.
    let new_a = run(old, new, "new", "new-a", &log, "1").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let new_b = run(old, new, "new", "new-b", &log, "1").spawn().unwrap();

    let outputs = [
        ("dual", finish(dual)),
        ("old", finish(straggler)),
        ("new-a", finish(new_a)),
        ("new-b", finish(new_b)),
    ];
    let seen = lines(&log);
    let report = outputs
        .iter()
        .map(|(name, out)| format!("{name}: {}", text(out)))
        .collect::<Vec<_>>()
        .join("\n");
    println!("log: {seen:?}\n{report}");

    // No two commands ever ran at once: every start is followed by its end.
    for pair in seen.chunks(2) {
        let [start, end] = pair else {
            panic!("unfinished command in {seen:?}\n{report}");
        };
        let name = start.split_whitespace().nth(1).unwrap_or("?");
        assert!(
            start.starts_with("start ") && *end == format!("end {name}"),
            "two holders at once: {seen:?}\n{report}"
        );
    }
    // The straggler was refused, with an error that says what to do.
    let (_, old_out) = &outputs[1];
    assert_eq!(old_out.status.code(), Some(2), "{report}");
    assert!(
        String::from_utf8_lossy(&old_out.stderr).contains("moved to the new backend"),
        "{report}"
    );
    assert!(!seen.iter().any(|l| l.starts_with("start old")), "{seen:?}");
    // Everyone else ran, and the tokens grew in the order they ran.
    for (name, out) in [&outputs[0], &outputs[2], &outputs[3]] {
        assert!(out.status.success(), "{name}: {report}");
    }
    let tokens: Vec<u64> = seen
        .iter()
        .filter(|l| l.starts_with("start "))
        .map(|l| l.split_whitespace().nth(2).unwrap().parse().unwrap())
        .collect();
    assert_eq!(tokens.len(), 3, "{seen:?}");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_straggler_is_refused_redis_to_etcd() {
    let (Some(redis), Some(etcd)) = (
        RedisServer::start().await.or_skip(),
        EtcdServer::start().await.or_skip(),
    ) else {
        return;
    };
    let (old, new) = (redis.url(), etcd.url("rollout", "ttl=2s"));
    tokio::task::spawn_blocking(move || straggler_is_refused(&old, &new))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_straggler_is_refused_sqlite_to_etcd() {
    let Some(etcd) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let old = format!("sqlite://{}", dir.path().join("old.db").display());
    let new = etcd.url("rollout", "ttl=2s");
    tokio::task::spawn_blocking(move || straggler_is_refused(&old, &new))
        .await
        .unwrap();
}
