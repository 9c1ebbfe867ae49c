//! `distlock elect NAME -- cmd` as processes against a real redis-server:
//! one leader runs at a time, the next one runs when it steps down, with a
//! higher term; a candidate with --wait 0 is refused while someone leads.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use conformance::OrSkip;
use conformance::servers::redis::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

fn elect(url: &str, extra: &[&str], script: &str) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["--url", url, "elect"])
        .args(extra)
        .args(["jobs", "--", "sh", "-c", script])
        .env_remove("DISTLOCK_URL")
        .env_remove("DISTLOCK_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

fn wait_for(path: &std::path::Path, within: Duration) -> Option<String> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Ok(text) = std::fs::read_to_string(path)
            && !text.trim().is_empty()
        {
            return Some(text.trim().to_owned());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn leaders_take_turns(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let stop_a = dir.path().join("stop-a");
    let script_a = format!(
        "echo $DISTLOCK_ELECTION:$DISTLOCK_TERM > {}; while [ ! -e {} ]; do sleep 0.05; done",
        a.display(),
        stop_a.display()
    );
    let mut first = elect(url, &["--ttl", "5s"], &script_a).spawn().unwrap();
    let term_a = wait_for(&a, Duration::from_secs(10)).expect("the first candidate never led");
    let script_b = format!("echo $DISTLOCK_ELECTION:$DISTLOCK_TERM > {}", b.display());
    let mut second = elect(url, &["--ttl", "5s"], &script_b).spawn().unwrap();
    assert!(
        wait_for(&b, Duration::from_millis(700)).is_none(),
        "two leaders ran at once"
    );
    let refused = elect(url, &["--wait", "0"], "true").status().unwrap();
    assert_eq!(refused.code(), Some(75));
    std::fs::write(&stop_a, "").unwrap();
    assert!(first.wait().unwrap().success());
    let term_b = wait_for(&b, Duration::from_secs(10)).expect("the second candidate never led");
    assert!(second.wait().unwrap().success());
    let term = |t: &str| -> u64 {
        let (name, term) = t.split_once(':').unwrap();
        assert_eq!(name, "jobs");
        term.parse().unwrap()
    };
    assert!(term(&term_b) > term(&term_a), "{term_a} then {term_b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaders_take_turns_on_redis() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let url = server.url();
    tokio::task::spawn_blocking(move || leaders_take_turns(&url))
        .await
        .unwrap();
}
