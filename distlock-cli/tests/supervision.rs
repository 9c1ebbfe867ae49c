//! `distlock run` as the supervisor of its command: the command never
//! outlives `distlock` (however `distlock` dies), a job the command leaves
//! running keeps the lock until it ends, a lost lock kills every process
//! the command started, and a command that reads the terminal runs in the
//! terminal's foreground.

mod common;

use common::{BIN, distlock, output, stderr};

use std::io::Write;
use std::os::unix::process::CommandExt;
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

/// `sh -c` text that starts a job leaving the command's process group
/// (`setsid`, its output detached) which writes `done` to `log` after a
/// pause, then ends at once.
fn leaves_a_job(log: &Path) -> String {
    format!(
        "setsid sh -c 'sleep 1; echo done >>{log}' </dev/null >/dev/null 2>&1 & echo started",
        log = log.display()
    )
}

/// Runs `supervisor` to its end (bounded): whether the job its command
/// left had written `done` by then (its work had run under the
/// supervision).
fn leftover_done_at_the_end(mut supervisor: Command, log: &Path) -> bool {
    let mut child = supervisor
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let status = wait_bounded(&mut child, Duration::from_secs(30));
    assert!(status.is_some(), "the supervisor never ended");
    std::fs::read_to_string(log).is_ok_and(|s| s.contains("done"))
}

/// A command that leaves a job running when it ends: `distlock` keeps the
/// lock until the job has ended too (as `flock(1)` does while a process
/// holds its descriptor), so the job never runs beside the next holder.
/// The check's broken variant: `sh` alone, which does not wait, must be
/// caught ending before its job.
#[test]
fn a_job_the_command_leaves_keeps_the_lock_until_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());

    let bare_log = dir.path().join("bare");
    let mut bare = Command::new("sh");
    bare.arg("-c").arg(leaves_a_job(&bare_log));
    assert!(
        !leftover_done_at_the_end(bare, &bare_log),
        "the check did not catch a supervisor that ends before the job"
    );

    let log = dir.path().join("kept");
    let script = leaves_a_job(&log);
    let mut holder = distlock(
        &url,
        &["run", "--ttl", "2s", "k", "--", "sh", "-c", &script],
    )
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    // While the job runs, the key is still held.
    std::thread::sleep(Duration::from_millis(300));
    let other = output(distlock(&url, &["run", "--wait", "0", "k", "--", "true"]));
    assert!(
        !other.status.success(),
        "another run got the key while the job ran: {}",
        stderr(&other)
    );
    let status = wait_bounded(&mut holder, Duration::from_secs(30)).expect("distlock ended");
    assert!(status.success(), "{status:?}");
    assert!(
        std::fs::read_to_string(&log).is_ok_and(|s| s.contains("done")),
        "distlock ended (and released) before the job its command left"
    );
    let log2 = dir.path().join("kept2");
    let mut again = distlock(
        &url,
        &[
            "run",
            "--ttl",
            "2s",
            "k",
            "--",
            "sh",
            "-c",
            &leaves_a_job(&log2),
        ],
    );
    again.stdout(Stdio::null());
    assert!(leftover_done_at_the_end(again, &log2));
}

/// `sh -c` text whose job leaves the group (`setsid`) and writes a line to
/// `log` every 50 ms until `stop` exists; the command then sleeps.
fn keeps_writing(log: &Path, stop: &Path) -> String {
    format!(
        "setsid sh -c 'while [ ! -e {stop} ]; do echo x >>{log}; sleep .05; done' \
         </dev/null >/dev/null 2>&1 & sleep 60",
        log = log.display(),
        stop = stop.display()
    )
}

/// Whether `log` stops growing within a second of now (lines written
/// meanwhile may land).
fn stops_writing(log: &Path) -> bool {
    std::thread::sleep(Duration::from_millis(300));
    let settled = lines(log);
    std::thread::sleep(Duration::from_secs(1));
    lines(log) == settled
}

fn wait_for_lines(log: &Path) {
    let started = Instant::now();
    while lines(log) < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the job never wrote"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A lost lock with `--on-lost kill`: every process the command started is
/// killed, a job that left its process group with `setsid` included. The
/// check's broken variant: SIGKILL to the command's group alone must be
/// caught leaving the job writing.
#[test]
fn a_lost_lock_kills_the_jobs_that_left_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());

    let (bare_log, bare_stop) = (dir.path().join("bare"), dir.path().join("bare.stop"));
    let mut bare = Command::new("sh");
    bare.arg("-c")
        .arg(keeps_writing(&bare_log, &bare_stop))
        .process_group(0)
        .stdin(Stdio::null());
    let mut bare = bare.spawn().unwrap();
    wait_for_lines(&bare_log);
    let group = libc::pid_t::try_from(bare.id()).unwrap();
    // SAFETY: kill(2) on a process group we created.
    unsafe {
        libc::kill(-group, libc::SIGKILL);
    }
    let _ = bare.wait();
    let caught = !stops_writing(&bare_log);
    std::fs::write(&bare_stop, "").unwrap();
    assert!(caught, "the check did not catch a job left writing");

    let (log, stop) = (dir.path().join("kept"), dir.path().join("kept.stop"));
    let script = keeps_writing(&log, &stop);
    let mut holder = distlock(
        &url,
        &[
            "run",
            "--ttl",
            "2s",
            "--on-lost",
            "kill",
            "k",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .spawn()
    .unwrap();
    wait_for_lines(&log);
    let broken = output(distlock(&url, &["force-release", "k"]));
    assert!(broken.status.success(), "{}", stderr(&broken));
    let status = wait_bounded(&mut holder, Duration::from_secs(20)).expect("distlock ended");
    let stopped = stops_writing(&log);
    std::fs::write(&stop, "").unwrap();
    assert_eq!(status.code(), Some(76), "the broken holder exits as lost");
    assert!(
        stopped,
        "a job the command left kept writing after the lock was lost"
    );
}
