//! `distlock run` as the supervisor of its command: the command never
//! outlives `distlock` (however `distlock` dies), and a command that reads
//! the terminal runs in the terminal's foreground.

mod common;

use common::{BIN, distlock, output, stderr};

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

/// Waits for `child` up to `limit`; kills it (and reports `None`) past that.
fn wait_bounded(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= until {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The case of issue #37: `distlock` is SIGKILLed (its pid alone, not its
/// group) while its command writes to a file; the command, and a
/// grandchild that left the process group with `setsid`, must stop at
/// once, and the next holder's command must be the only writer.
#[test]
fn a_killed_distlock_takes_its_command_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let log = dir.path().join("writes");
    let work = format!(
        "setsid sh -c 'while :; do echo grandchild >>{log}; sleep .05; done' & \
         while :; do echo child >>{log}; sleep .05; done",
        log = log.display()
    );
    let mut holder = distlock(&url, &["run", "--ttl", "2s", "k", "--", "sh", "-c", &work])
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !std::fs::read_to_string(&log)
        .is_ok_and(|s| s.contains("grandchild") && s.contains("child\n"))
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the command never wrote"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGKILL to distlock alone: no handler, no clean-up of its own.
    holder.kill().unwrap();
    let _ = holder.wait();
    // Writes already under way may land; then nothing more.
    std::thread::sleep(Duration::from_millis(300));
    let after_kill = lines(&log);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        lines(&log),
        after_kill,
        "the command (or its setsid grandchild) kept writing after distlock was killed"
    );
    let next = output(distlock(
        &url,
        &[
            "run",
            "--ttl",
            "2s",
            "--wait",
            "10s",
            "k",
            "--",
            "sh",
            "-c",
            "sleep 0.5",
        ],
    ));
    assert!(next.status.success(), "{}", stderr(&next));
    assert_eq!(
        lines(&log),
        after_kill,
        "an orphaned command wrote beside the next holder"
    );
}

/// A command that reads the terminal, under `distlock run` started from a
/// terminal's foreground (`script` gives it a pseudo-terminal): it reads
/// its line instead of being stopped by SIGTTIN in a background group.
#[test]
fn a_command_reading_the_terminal_is_not_stopped() {
    if Command::new("script").arg("--version").output().is_err() {
        assert!(
            std::env::var("CI").is_err(),
            "`script` is missing (Debian package bsdutils)"
        );
        eprintln!("skipped: `script` is missing (Debian package bsdutils)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let inner =
        format!("{BIN} --url {url} run --ttl 2s tty -- sh -c 'read line; echo \"read: $line\"'");
    let mut script = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .env_remove("DISTLOCK_URL")
        .env_remove("DISTLOCK_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    script.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let status = wait_bounded(&mut script, Duration::from_secs(20));
    let out = script.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.is_some_and(|s| s.success()) && text.contains("read: hello"),
        "the command did not read the terminal (stopped by SIGTTIN?): {status:?} {text:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
