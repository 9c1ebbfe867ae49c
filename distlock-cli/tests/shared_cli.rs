//! `distlock run --shared / --write / --semaphore N` and `inspect` of a
//! shared key, as processes against a real redis-server.

mod common;

use common::{distlock, output};

use std::process::{Child, Stdio};
use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::redis::RedisServer;

/// A `run` that holds until `release` appears, having written `ready`
/// once it holds.
fn holder(url: &str, kind: &[&str], key: &str, dir: &std::path::Path, name: &str) -> Child {
    let ready = dir.join(format!("{name}.ready"));
    let release = dir.join(format!("{name}.release"));
    let script = format!(
        "echo $DISTLOCK_LOCK_KIND > {r}; while [ ! -e {x} ]; do sleep 0.05; done",
        r = ready.display(),
        x = release.display()
    );
    let mut args = vec!["run", "--ttl", "5s"];
    args.extend_from_slice(kind);
    args.extend_from_slice(&[key, "--", "sh", "-c", &script]);
    let mut child = distlock(url, &args)
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn distlock run");
    for _ in 0..200 {
        if ready.exists() {
            return child;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{name} never held {key}");
}

fn let_go(mut child: Child, dir: &std::path::Path, name: &str) {
    std::fs::write(dir.join(format!("{name}.release")), "").unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{name}: {status}");
}

fn try_run(url: &str, kind: &[&str], key: &str) -> Option<i32> {
    let mut args = vec!["run", "--wait", "0"];
    args.extend_from_slice(kind);
    args.extend_from_slice(&[key, "--", "true"]);
    output(distlock(url, &args)).status.code()
}

fn shared_runs(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Readers share; a writer is refused beside them; the mutex of the
    // same name is another lock.
    let reader = holder(url, &["--shared"], "doc", d, "reader");
    assert_eq!(
        std::fs::read_to_string(d.join("reader.ready"))
            .unwrap()
            .trim(),
        "r"
    );
    assert_eq!(try_run(url, &["--shared"], "doc"), Some(0));
    assert_eq!(try_run(url, &["--write"], "doc"), Some(75));
    assert_eq!(try_run(url, &[], "doc"), Some(0));
    let inspect = output(distlock(url, &["inspect", "doc", "--json"]));
    let json: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let holders = json["shared_holders"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{json}");
    assert_eq!(holders[0]["shape"], "rwlock");
    assert_eq!(holders[0]["kind"], "r");
    let text = output(distlock(url, &["inspect", "doc"]));
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("rwlock read by"),
        "{text:?}"
    );
    let_go(reader, d, "reader");
    let writer = holder(url, &["--write"], "doc", d, "writer");
    assert_eq!(try_run(url, &["--shared"], "doc"), Some(75));
    let_go(writer, d, "writer");

    // A semaphore of 2: two holders, the third is refused; another limit
    // is an error.
    let a = holder(url, &["--semaphore", "2"], "pool", d, "a");
    let b = holder(url, &["--semaphore", "2"], "pool", d, "b");
    assert_eq!(try_run(url, &["--semaphore", "2"], "pool"), Some(75));
    let other = output(distlock(
        url,
        &[
            "run",
            "--wait",
            "0",
            "--semaphore",
            "3",
            "pool",
            "--",
            "true",
        ],
    ));
    assert_ne!(other.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&other.stderr).contains("limit"),
        "{other:?}"
    );
    let_go(a, d, "a");
    assert_eq!(
        try_run(url, &["--semaphore", "2", "--permits", "1"], "pool"),
        Some(0)
    );
    let_go(b, d, "b");
    assert_eq!(
        try_run(url, &["--semaphore", "2", "--permits", "2"], "pool"),
        Some(0)
    );
    let bad = output(distlock(
        url,
        &[
            "run",
            "--semaphore",
            "2",
            "--permits",
            "3",
            "pool",
            "--",
            "true",
        ],
    ));
    assert_ne!(bad.status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_and_semaphore_runs_on_redis() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let url = server.url();
    tokio::task::spawn_blocking(move || shared_runs(&url))
        .await
        .unwrap();
}
