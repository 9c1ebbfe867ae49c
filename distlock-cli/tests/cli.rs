//! The `distlock` command tested as a user would use it: as processes.

mod common;

use common::{BIN, distlock, output, stderr};

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use conformance::OrSkip;
use conformance::servers::redis::RedisServer;

fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

/// Two `run`s on one key: the second waits (or fails at once with
/// --wait 0), they never overlap, and the token grows.
fn runs_serialize(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!(
        "echo start $DISTLOCK_FENCING_TOKEN >> {log}; sleep 1; echo end $DISTLOCK_FENCING_TOKEN >> {log}",
        log = log.display()
    );
    let mut first = distlock(
        url,
        &[
            "run",
            "--ttl",
            "3s",
            "jobs/serial",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .spawn()
    .unwrap();
    // Wait until the first holds the lock.
    let started = Instant::now();
    while !log.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "first run never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let busy = output(distlock(
        url,
        &["run", "--wait", "0", "jobs/serial", "--", "true"],
    ));
    assert_eq!(busy.status.code(), Some(75), "{}", stderr(&busy));
    assert!(stderr(&busy).contains("contended"), "{}", stderr(&busy));
    let custom = output(distlock(
        url,
        &[
            "run",
            "--wait",
            "0",
            "--conflict-exit-code",
            "9",
            "jobs/serial",
            "--",
            "true",
        ],
    ));
    assert_eq!(custom.status.code(), Some(9));
    let second = output(distlock(
        url,
        &[
            "run",
            "--wait",
            "20s",
            "jobs/serial",
            "--",
            "sh",
            "-c",
            &script,
        ],
    ));
    assert!(second.status.success(), "{}", stderr(&second));
    assert!(first.wait().unwrap().success());
    let lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    let token = |line: &str| {
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert!(
        lines[0].starts_with("start") && lines[1].starts_with("end"),
        "overlap: {lines:?}"
    );
    assert!(
        lines[2].starts_with("start") && lines[3].starts_with("end"),
        "overlap: {lines:?}"
    );
    assert_eq!(token(&lines[0]), token(&lines[1]));
    assert!(
        token(&lines[2]) > token(&lines[0]),
        "token did not grow: {lines:?}"
    );
}

#[test]
fn runs_serialize_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    runs_serialize(&sqlite_url(dir.path()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_serialize_on_redis() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let url = server.url();
    tokio::task::spawn_blocking(move || runs_serialize(&url))
        .await
        .unwrap();
}

#[test]
fn exit_status_and_environment_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let out = output(distlock(
        &url,
        &[
            "run",
            "env-check",
            "--",
            "sh",
            "-c",
            "echo $DISTLOCK_KEY/$DISTLOCK_OWNER; exit 7",
        ],
    ));
    assert_eq!(out.status.code(), Some(7));
    let text = String::from_utf8_lossy(&out.stdout);
    let (key, owner) = text.trim().split_once('/').unwrap();
    assert_eq!(key, "env-check");
    assert_eq!(owner.len(), 32);
    let missing = output(distlock(&url, &["run", "x", "--", "/no/such/program"]));
    assert_eq!(missing.status.code(), Some(126));
}

#[test]
fn killed_holder_frees_the_lock_after_its_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let mut holder = distlock(&url, &["run", "--ttl", "1s", "crashy", "--", "sleep", "60"])
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        let out = output(distlock(&url, &["inspect", "crashy", "--json"]));
        if String::from_utf8_lossy(&out.stdout).contains("\"held\":true") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "holder never took the lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    holder.kill().unwrap();
    let _ = holder.wait();
    let killed = Instant::now();
    let next = output(distlock(
        &url,
        &["run", "--wait", "10s", "crashy", "--", "true"],
    ));
    assert!(next.status.success(), "{}", stderr(&next));
    let freed = killed.elapsed();
    assert!(
        freed < Duration::from_secs(5),
        "freed after {freed:?} with a 1 s TTL"
    );
}

#[test]
fn lost_lock_terminates_the_command_with_exit_76() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    // The command releases its own lock behind distlock's back: the next
    // renewal is refused, distlock reports the loss and stops the command.
    let script = format!("{BIN} --url {url} release --handle \"$DISTLOCK_HANDLE\"; sleep 30");
    let started = Instant::now();
    let out = output(distlock(
        &url,
        &["run", "--ttl", "600ms", "stolen", "--", "sh", "-c", &script],
    ));
    assert_eq!(out.status.code(), Some(76), "{}", stderr(&out));
    assert!(stderr(&out).contains("lost"), "{}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn acquire_renew_release_by_handle_from_other_processes() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let out = output(distlock(&url, &["acquire", "--ttl", "30s", "deploy"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let handle = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let inspect = output(distlock(&url, &["inspect", "deploy", "--json"]));
    let info: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(info["held"], true);
    assert!(info["token"].as_u64().unwrap() >= 1);
    let busy = output(distlock(&url, &["acquire", "deploy"]));
    assert_eq!(busy.status.code(), Some(75));
    let renewed = output(distlock(&url, &["renew", "--handle", &handle]));
    assert!(renewed.status.success(), "{}", stderr(&renewed));
    let released = output(distlock(&url, &["release", "--handle", &handle]));
    assert!(released.status.success(), "{}", stderr(&released));
    let again = output(distlock(&url, &["release", "--handle", &handle]));
    assert_eq!(
        again.status.code(),
        Some(1),
        "second release must say not held"
    );
    let free = output(distlock(&url, &["inspect", "deploy"]));
    assert!(String::from_utf8_lossy(&free.stdout).contains("is free"));
}

#[test]
fn bad_input_gives_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    for (args, code) in [
        (vec!["--url", "nonsense", "run", "k", "--", "true"], 2),
        (vec!["--url", "gopher://x", "inspect", "k"], 2),
        (
            vec!["--url", &url, "run", "--ttl", "soon", "k", "--", "true"],
            2,
        ),
        (
            vec!["--url", &url, "run", "--wait=-1s", "k", "--", "true"],
            2,
        ),
        (vec!["--url", &url, "run", "", "--", "true"], 2),
        (
            vec!["--url", &url, "run", "--ttl", "0s", "k", "--", "true"],
            2,
        ),
        (vec!["--url", &url, "release", "--handle", "garbage"], 2),
        (vec!["--url", "redis://127.0.0.1:1", "inspect", "k"], 69),
    ] {
        let mut cmd = Command::new(BIN);
        cmd.args(&args).env_remove("DISTLOCK_URL");
        let started = Instant::now();
        let out = output(cmd);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
            "{args:?}: {err}"
        );
        let lines = err.trim().lines().count();
        assert!(lines <= 3, "{args:?}: not a short error: {err}");
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
    let mut cmd = Command::new(BIN);
    cmd.args(["inspect", "k"])
        .env_remove("DISTLOCK_URL")
        .env_remove("DISTLOCK_CONFIG");
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("DISTLOCK_URL"), "{}", stderr(&out));
}

#[test]
fn config_file_selects_the_backend() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("distlock.toml");
    std::fs::write(
        &config,
        format!(
            "url = \"{}\"\nttl = \"5s\"\nrequire = [\"fencing\"]\n",
            sqlite_url(dir.path())
        ),
    )
    .unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("--config").arg(&config).args([
        "run",
        "cfg",
        "--",
        "sh",
        "-c",
        "test -n \"$DISTLOCK_FENCING_TOKEN\"",
    ]);
    let out = output(cmd);
    assert!(out.status.success(), "{}", stderr(&out));
    // A requirement the backend cannot meet is refused at start-up.
    std::fs::write(
        &config,
        format!(
            "url = \"{}\"\nrequire = [\"fifo\"]\n",
            sqlite_url(dir.path())
        ),
    )
    .unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("--config").arg(&config).args(["inspect", "cfg"]);
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("FIFO"), "{}", stderr(&out));
}

#[test]
fn help_has_examples_for_every_command() {
    for command in ["run", "acquire", "inspect"] {
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

#[test]
fn migration_config_works_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let old = format!("sqlite://{}", dir.path().join("old.db").display());
    let new = format!("sqlite://{}", dir.path().join("new.db").display());
    let config = dir.path().join("migrate.toml");
    let write = |phase: &str| {
        std::fs::write(
            &config,
            format!("[migration]\nold = \"{old}\"\nnew = \"{new}\"\nphase = \"{phase}\"\n"),
        )
        .unwrap();
    };
    let token_in = |phase: &str| -> u64 {
        write(phase);
        let mut cmd = Command::new(BIN);
        cmd.arg("--config").arg(&config).args([
            "run",
            "jobs/m",
            "--",
            "sh",
            "-c",
            "echo $DISTLOCK_FENCING_TOKEN",
        ]);
        let out = output(cmd);
        assert!(out.status.success(), "{phase}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let old_token = token_in("old");
    let dual_token = token_in("dual");
    let new_token = token_in("new");
    assert!(
        old_token < 1 << 56,
        "old phase keeps the old backend's tokens"
    );
    assert!(
        dual_token > old_token && new_token > dual_token,
        "{old_token} {dual_token} {new_token}"
    );

    // While a process on `old` holds the key, a `dual` one is excluded.
    let held = output(distlock(&old, &["acquire", "--ttl", "30s", "jobs/m"]));
    assert!(held.status.success(), "{}", stderr(&held));
    write("dual");
    let mut cmd = Command::new(BIN);
    cmd.arg("--config")
        .arg(&config)
        .args(["run", "--wait", "0", "jobs/m", "--", "true"]);
    assert_eq!(output(cmd).status.code(), Some(75));
    let mut cmd = Command::new(BIN);
    cmd.arg("--config").arg(&config).args(["inspect", "jobs/m"]);
    let out = output(cmd);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("old-only:"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Wall-clock nanoseconds (what `date +%s%N` prints in a child).
fn wall_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Whether process `pid` has exited (gone, or a zombie not yet reaped).
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_none_or(|state| state == 'Z' || state == 'X'),
    }
}

/// How the holder's renewals are stopped.
#[derive(Clone, Copy, Debug)]
enum Stall {
    /// Traffic held: renewals hang until their timeout (the guard stays
    /// `Held` meanwhile).
    Partition,
    /// The proxy is gone: renewals fail at once (the guard turns `Suspect`).
    Refused,
}

/// Bug 6: `run --on-lost term` must stop the command before the lock's
/// deadline, so the next holder never runs beside it. The holder reaches
/// Redis through a fault proxy; its renewals are stalled; a second `run`
/// (straight to Redis) waits for the key. Measured on the wall clock: the
/// first command's exit, the latest possible deadline (stall + TTL: no
/// renewal sent after the stall can succeed), and the second command's
/// start.
async fn stops_before_the_deadline(server: &RedisServer, stall: Stall, trap: &str) {
    use conformance::proxy::FaultProxy;
    let upstream: std::net::SocketAddr = format!("127.0.0.1:{}", server.port()).parse().unwrap();
    let proxy = FaultProxy::start(upstream).await.unwrap();
    let holder_url = format!("redis://127.0.0.1:{}", proxy.port());
    let direct_url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let started_file = dir.path().join("second");
    let key = format!("stall/{stall:?}");
    let ttl = Duration::from_secs(3);
    let script = format!(
        "{trap}; echo $$ > {pid}.tmp; mv {pid}.tmp {pid}; while :; do sleep 0.05; done",
        pid = pid_file.display()
    );
    let mut first = distlock(
        &holder_url,
        &[
            "run",
            "--ttl",
            "3s",
            "--on-lost",
            "term",
            "--kill-after",
            "10s",
            &key,
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    first.stdin(Stdio::null()).stderr(Stdio::piped());
    let first = first.spawn().unwrap();
    let begun = Instant::now();
    while !pid_file.exists() {
        assert!(
            begun.elapsed() < Duration::from_secs(20),
            "first command never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Let a renewal or two succeed, so the deadline is a recent one.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!exited(pid), "the command must run while renewals succeed");

    let stalled_at = wall_ns();
    let mut proxy = Some(proxy);
    match stall {
        Stall::Partition => proxy.as_ref().unwrap().partition(),
        Stall::Refused => drop(proxy.take()),
    }
    let watcher = std::thread::spawn(move || {
        let begun = Instant::now();
        while !exited(pid) {
            if begun.elapsed() > Duration::from_secs(30) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Some(wall_ns())
    });
    let second_script = format!("date +%s%N > {}", started_file.display());
    let second = tokio::task::spawn_blocking(move || {
        output(distlock(
            &direct_url,
            &[
                "run",
                "--wait",
                "20s",
                &key,
                "--",
                "sh",
                "-c",
                &second_script,
            ],
        ))
    });
    let first_exit = tokio::task::spawn_blocking(move || watcher.join().unwrap())
        .await
        .unwrap()
        .expect("the first command did not exit within 30 s");
    let second = second.await.unwrap();
    assert!(second.status.success(), "{}", stderr(&second));
    let first = tokio::task::spawn_blocking(move || first.wait_with_output().unwrap())
        .await
        .unwrap();
    drop(proxy);
    let second_start: u128 = std::fs::read_to_string(&started_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let ms = |t: u128| (t.saturating_sub(stalled_at)) as f64 / 1e6;
    let latest_deadline = stalled_at + ttl.as_nanos();
    println!(
        "{stall:?} ({trap}): renewals stalled at 0 ms; first command exited at {:.0} ms; \
         lock deadline at the latest {:.0} ms; second command started at {:.0} ms",
        ms(first_exit),
        ms(latest_deadline),
        ms(second_start)
    );
    let first_err = String::from_utf8_lossy(&first.stderr);
    println!("first distlock said: {first_err}");
    assert!(
        first_exit < latest_deadline,
        "{stall:?}: the command exited {:.0} ms after the stall, after the lock's deadline (at most {:.0} ms)",
        ms(first_exit),
        ms(latest_deadline)
    );
    assert!(
        first_exit < second_start,
        "{stall:?}: the second command started at {:.0} ms while the first ran until {:.0} ms",
        ms(second_start),
        ms(first_exit)
    );
    assert_eq!(first.status.code(), Some(76), "{first_err}");
    assert!(first_err.contains("does not fit in the TTL"), "{first_err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lost_term_stops_the_command_before_the_deadline() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    // A command that ignores SIGTERM: only the SIGKILL a margin before the
    // deadline stops it (the old behaviour: SIGTERM at the deadline, then
    // --kill-after 10 s of overlap with the next holder).
    stops_before_the_deadline(&server, Stall::Partition, "trap '' TERM").await;
    // A command that cleans up for 300 ms on SIGTERM and exits.
    stops_before_the_deadline(&server, Stall::Refused, "trap 'sleep 0.3; exit 0' TERM").await;
}

/// The installed command has no comparison: `compare` and `check` say
/// where they went (a usage error, exit 2) instead of "unrecognized".
#[test]
fn compare_and_check_point_to_distlock_compare() {
    for command in ["compare", "check"] {
        let out = output(distlock("memory://", &[command, "--spawn", "--quick"]));
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("-p distlock-compare -- {command}")),
            "{}",
            stderr(&out)
        );
    }
}
