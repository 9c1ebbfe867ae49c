//! The operator's commands as processes, on SQLite and on real Redis, etcd
//! and ZooKeeper servers:
//! `list` and `inspect` show a running holder's details (its pid, the
//! `distlock` program, its token); `force-release` breaks it, the holder's
//! `run` learns it lost the lock and stops its command (exit 76), and the
//! next holder's token is above the broken one; `watch` prints the
//! changes; `gc` runs; a backend without tokens is refused unless
//! `--yes-unfenced`; `list` and `leader` show readers, permit holders and
//! leaders with their processes' details.

mod common;

use common::{distlock, output, stdout};

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use conformance::OrSkip;
use conformance::servers::etcd::EtcdServer;
use conformance::servers::redis::RedisServer;
use conformance::servers::zookeeper::ZkServer;

/// Waits until `path` has a line (the token a `run` wrote), at most 10 s.
fn token_in(path: &Path) -> u64 {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Some(token) = text.lines().next().and_then(|l| l.trim().parse().ok())
        {
            return token;
        }
        assert!(Instant::now() < until, "no token in {}", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `run` holding `key`, writing its token to `file`, then sleeping.
fn holder(url: &str, key: &str, file: &Path) -> Child {
    let script = format!(
        "echo $DISTLOCK_FENCING_TOKEN > {}; sleep 20",
        file.display()
    );
    distlock(url, &["run", "--ttl", "2s", key, "--", "sh", "-c", &script])
        .spawn()
        .expect("holder")
}

/// A `run` (or `elect`) with `args` before `--`, writing `$var` to `file`,
/// then sleeping.
fn sharer(url: &str, args: &[&str], var: &str, file: &Path) -> Child {
    let script = format!("echo ${var} > {}; sleep 20", file.display());
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--", "sh", "-c", &script]);
    distlock(url, &all).spawn().expect("sharer")
}

/// The holder of `pid` among `holders` (JSON holders with details).
fn by_pid(holders: &serde_json::Value, pid: u32) -> bool {
    holders
        .as_array()
        .is_some_and(|hs| hs.iter().any(|h| h["details"]["pid"] == pid))
}

/// `list` shows the readers of a read-write lock, a semaphore's permit
/// holder and an election's leader, each with its process's details;
/// `leader` names the leader.
fn operate_shapes(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let f = |n: &str| dir.path().join(n);
    let mut children = vec![
        sharer(
            url,
            &["run", "--ttl", "2s", "--shared", "ops/rw"],
            "DISTLOCK_FENCING_TOKEN",
            &f("r1"),
        ),
        sharer(
            url,
            &["run", "--ttl", "2s", "--shared", "ops/rw"],
            "DISTLOCK_FENCING_TOKEN",
            &f("r2"),
        ),
        sharer(
            url,
            &["run", "--ttl", "2s", "--semaphore", "3", "ops/sem"],
            "DISTLOCK_FENCING_TOKEN",
            &f("p"),
        ),
        sharer(
            url,
            &["elect", "--ttl", "2s", "ops/boss"],
            "DISTLOCK_TERM",
            &f("e"),
        ),
    ];
    for name in ["r1", "r2", "p", "e"] {
        token_in(&f(name));
    }
    let term = token_in(&f("e"));
    let pids: Vec<u32> = children.iter().map(Child::id).collect();

    let listed = output(distlock(url, &["list", "ops/", "--json"]));
    assert!(listed.status.success(), "{listed:?}");
    let value: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let rw = value["rwlock"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["key"] == "ops/rw"))
        .unwrap_or_else(|| panic!("ops/rw not listed: {value}"));
    assert!(
        by_pid(&rw["holders"], pids[0]) && by_pid(&rw["holders"], pids[1]),
        "{rw}"
    );
    let sem = value["semaphore"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["key"] == "ops/sem"))
        .unwrap_or_else(|| panic!("ops/sem not listed: {value}"));
    assert!(by_pid(&sem["holders"], pids[2]), "{sem}");
    let boss = value["elections"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["election"] == "ops/boss"))
        .unwrap_or_else(|| panic!("ops/boss not listed: {value}"));
    assert_eq!(boss["leader"]["details"]["pid"], pids[3], "{boss}");
    assert_eq!(boss["leader"]["term"], term, "{boss}");

    let text = stdout(&output(distlock(
        url,
        &["list", "ops/", "--shape", "rwlock"],
    )));
    assert!(
        text.lines()
            .filter(|l| l.starts_with("ops/rw rwlock read by"))
            .count()
            == 2,
        "{text}"
    );
    let leader = stdout(&output(distlock(url, &["leader", "ops/boss"])));
    assert!(
        leader.contains(&format!("term {term}")) && leader.contains(&format!("pid {}", pids[3])),
        "{leader}"
    );
    let inspect = stdout(&output(distlock(url, &["inspect", "ops/rw"])));
    assert!(inspect.contains(&format!("pid {}", pids[0])), "{inspect}");
    // A cursor needs its shape.
    let bad = output(distlock(url, &["list", "ops/", "--cursor", "x"]));
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn operate(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first");
    let mut run = holder(url, "ops/stuck", &first);
    let token = token_in(&first);

    // list and inspect name the holder process.
    let listed = output(distlock(url, &["list", "ops/", "--json"]));
    assert!(listed.status.success(), "{listed:?}");
    let value: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let locks = value["locks"].as_array().unwrap();
    let lock = locks
        .iter()
        .find(|l| l["key"] == "ops/stuck")
        .unwrap_or_else(|| panic!("ops/stuck not listed: {value}"));
    assert_eq!(lock["token"], token);
    assert_eq!(lock["details"]["pid"], run.id(), "{lock}");
    assert_eq!(lock["details"]["program"], "distlock", "{lock}");
    let text = stdout(&output(distlock(url, &["inspect", "ops/stuck"])));
    assert!(
        text.contains(&format!("token {token}")) && text.contains(&format!("pid {}", run.id())),
        "{text}"
    );

    // force-release breaks it; the holder's run stops its command.
    let broken = output(distlock(url, &["force-release", "ops/stuck"]));
    assert!(broken.status.success(), "{broken:?}");
    let said = stdout(&broken);
    assert!(said.contains(&format!("above {token}")), "{said}");
    let stderr = String::from_utf8_lossy(&broken.stderr);
    assert!(
        stderr.contains("broke ops/stuck"),
        "logged with who: {stderr}"
    );
    let until = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = run.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < until, "the broken holder's run went on");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(76), "the broken holder exits as lost");
    // A free key: nothing to break (exit 1).
    let again = output(distlock(url, &["force-release", "ops/stuck"]));
    assert_eq!(again.status.code(), Some(1), "{again:?}");

    // The next holder's token is above the broken one; watch sees it come
    // and go.
    let mut watch = distlock(
        url,
        &["watch", "ops/stuck", "--interval", "50ms", "--changes", "2"],
    );
    let watch = watch.stdout(Stdio::piped()).spawn().expect("watch");
    std::thread::sleep(Duration::from_millis(500));
    let next = dir.path().join("next");
    let script = format!("echo $DISTLOCK_FENCING_TOKEN > {}; sleep 1", next.display());
    let ran = output(distlock(
        url,
        &["run", "ops/stuck", "--", "sh", "-c", &script],
    ));
    assert!(ran.status.success(), "{ran:?}");
    assert!(token_in(&next) > token, "the next token is above {token}");
    let watched = watch.wait_with_output().expect("watch");
    let lines = stdout(&watched);
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines.len(), 3, "free, held, free: {lines:?}");
    assert!(
        lines[0].ends_with("is free") && lines[2].ends_with("is free"),
        "{lines:?}"
    );
    assert!(lines[1].contains("held by"), "{lines:?}");

    // gc runs and keeps tokens growing.
    let gc = output(distlock(url, &["gc", "--older-than", "0s", "--json"]));
    assert!(gc.status.success(), "{gc:?}");
    let after = dir.path().join("after");
    let script = format!("echo $DISTLOCK_FENCING_TOKEN > {}", after.display());
    assert!(
        output(distlock(
            url,
            &["run", "ops/stuck", "--", "sh", "-c", &script]
        ))
        .status
        .success()
    );
    assert!(token_in(&after) > token_in(&next), "tokens grow across gc");
    operate_shapes(url);
}

#[test]
fn operating_a_sqlite_lock() {
    let dir = tempfile::tempdir().unwrap();
    operate(&format!(
        "sqlite://{}",
        dir.path().join("locks.db").display()
    ));
}

#[test]
fn operating_a_redis_lock() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(redis) = rt.block_on(RedisServer::start()).or_skip() else {
        return;
    };
    operate(&redis.url());
}

#[test]
fn operating_an_etcd_lock() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(etcd) = rt.block_on(EtcdServer::start()).or_skip() else {
        return;
    };
    operate(&etcd.url("ops", ""));
}

#[test]
fn operating_a_zookeeper_lock() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(zk) = rt.block_on(ZkServer::start()).or_skip() else {
        return;
    };
    operate(&zk.url());
}

/// A backend without fencing tokens (Redlock) refuses force-release unless
/// told `--yes-unfenced`.
#[test]
fn force_release_without_tokens_needs_consent() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let servers: Vec<RedisServer> = (0..3)
        .filter_map(|_| rt.block_on(RedisServer::start()).or_skip())
        .collect();
    if servers.len() < 3 {
        return;
    }
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = format!("redlock://{}", hosts.join(","));
    let refused = output(distlock(&url, &["force-release", "ops/x"]));
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--yes-unfenced"));
    let consented = output(distlock(
        &url,
        &["force-release", "--yes-unfenced", "ops/x"],
    ));
    assert_eq!(consented.status.code(), Some(1), "free key: {consented:?}");
}

/// A reserved key (a migration's cutover marker) is not broken unless
/// told `--reserved`; `--help` shows the flag.
#[test]
fn force_release_of_a_reserved_key_needs_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("old.db").display());
    let marker = "__distlock/migration-cutover/default";
    let held = output(distlock(&url, &["acquire", "--ttl", "60s", marker]));
    assert!(held.status.success(), "{held:?}");
    let refused = output(distlock(&url, &["force-release", marker]));
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--reserved"),
        "{refused:?}"
    );
    let still = output(distlock(&url, &["inspect", marker]));
    assert!(!stdout(&still).contains("is free"), "{still:?}");
    let broken = output(distlock(&url, &["force-release", "--reserved", marker]));
    assert_eq!(broken.status.code(), Some(0), "{broken:?}");
    let free = output(distlock(&url, &["inspect", marker]));
    assert!(stdout(&free).contains("is free"), "{free:?}");
    let help = output(distlock(&url, &["force-release", "--help"]));
    assert!(stdout(&help).contains("--reserved"), "{help:?}");
}
