//! "Cron on many hosts": `run --at-least`, `run --once-per` and
//! `fence-write`, as processes started at skewed times against one
//! backend (a SQLite file: every host of the test is a process on this
//! machine; the options use only the lock API, so the backend does not
//! change what is checked).

mod common;

use common::{distlock, output, stderr};

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

/// `hosts` runs of `args` started `skew` apart; their exit codes.
fn skewed(url: &str, args: &[&str], hosts: usize, skew: Duration) -> Vec<i32> {
    let mut children: Vec<Child> = Vec::new();
    for _ in 0..hosts {
        children.push(distlock(url, args).spawn().unwrap());
        std::thread::sleep(skew);
    }
    children
        .into_iter()
        .map(|mut c| c.wait().unwrap().code().unwrap_or(-1))
        .collect()
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

#[test]
fn at_least_keeps_a_short_job_to_one_run_per_window() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let log = dir.path().join("runs");
    let job = format!("echo ran >> {}", log.display());
    let args = [
        "run",
        "--wait",
        "0",
        "--at-least",
        "3s",
        "--ttl",
        "2s",
        "nightly",
        "--",
        "sh",
        "-c",
        &job,
    ];
    // Three hosts whose clocks fire the job 400 ms apart: the job itself
    // takes no time, the lock stays taken for 3 s after the first grant.
    let started = Instant::now();
    let codes = skewed(&url, &args, 3, Duration::from_millis(400));
    assert_eq!(lines(&log), 1, "exit codes {codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 0).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 75).count(), 2, "{codes:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "the holder left early"
    );
    // Once the window has passed, the next trigger runs again.
    let again = output(distlock(&url, &args));
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(lines(&log), 2);

    // Without --at-least, the same skew runs the job on every host: the
    // check above is the option's doing.
    let log2 = dir.path().join("runs-without");
    let job2 = format!("echo ran >> {}", log2.display());
    let plain = ["run", "--wait", "0", "hourly", "--", "sh", "-c", &job2];
    skewed(&url, &plain, 3, Duration::from_millis(400));
    assert_eq!(lines(&log2), 3);
}

#[test]
fn once_per_skips_hosts_that_come_after_a_successful_run() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let log = dir.path().join("runs");
    let job = format!("echo ran >> {}", log.display());
    let args = [
        "run",
        "--wait",
        "10s",
        "--once-per",
        "3s",
        "report",
        "--",
        "sh",
        "-c",
        &job,
    ];
    // They wait for each other (--wait 10s), so every host gets the lock in
    // turn; only the first runs the job, the others find its record.
    let codes = skewed(&url, &args, 3, Duration::from_millis(300));
    assert_eq!(lines(&log), 1, "exit codes {codes:?}");
    let mut sorted = codes.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, vec![0, 78, 78], "{codes:?}");
    // After the period, it runs again.
    std::thread::sleep(Duration::from_secs(3));
    let again = output(distlock(&url, &args));
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(lines(&log), 2);

    // A failed run does not count: the next host runs the job.
    let failing = [
        "run",
        "--once-per",
        "1h",
        "flaky",
        "--",
        "sh",
        "-c",
        "exit 3",
    ];
    assert_eq!(output(distlock(&url, &failing)).status.code(), Some(3));
    let log3 = dir.path().join("flaky");
    let job3 = format!("echo ran >> {}", log3.display());
    let retry = ["run", "--once-per", "1h", "flaky", "--", "sh", "-c", &job3];
    assert!(output(distlock(&url, &retry)).status.success());
    assert_eq!(lines(&log3), 1);
    assert_eq!(output(distlock(&url, &retry)).status.code(), Some(78));

    // A period the backend cannot hold is refused before anything runs.
    let bad = output(distlock(
        &url,
        &["run", "--once-per", "48h", "report", "--", "true"],
    ));
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
}

/// A run fenced out (its lock lost while the command ran) does not count
/// for --once-per: here the lock is broken under the first run, whose
/// command then ends normally.
#[test]
fn a_fenced_out_run_does_not_count() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let started = dir.path().join("started");
    let job = format!("touch {}; sleep 2", started.display());
    let mut first = distlock(
        &url,
        &[
            "run",
            "--once-per",
            "1h",
            "--on-lost",
            "ignore",
            "backup",
            "--",
            "sh",
            "-c",
            &job,
        ],
    )
    .spawn()
    .unwrap();
    let t = Instant::now();
    while !started.exists() {
        assert!(t.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(20));
    }
    let broken = output(distlock(&url, &["force-release", "backup"]));
    assert!(broken.status.success(), "{}", stderr(&broken));
    let code = first.wait().unwrap().code();
    assert_eq!(
        code,
        Some(0),
        "--on-lost ignore reports the command's status"
    );
    let log = dir.path().join("second");
    let job = format!("echo ran >> {}", log.display());
    let second = output(distlock(
        &url,
        &["run", "--once-per", "1h", "backup", "--", "sh", "-c", &job],
    ));
    assert!(second.status.success(), "{}", stderr(&second));
    assert_eq!(lines(&log), 1, "the fenced-out run was counted");
}

#[test]
fn fence_write_refuses_a_stale_token() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.txt");
    let write_to = |file: &Path, token: &str, text: &str, append: bool| {
        let mut args = vec!["fence-write", "--token", token];
        if append {
            args.push("--append");
        }
        let path = file.display().to_string();
        args.push(&path);
        let mut cmd = distlock("memory://", &args);
        cmd.env_remove("DISTLOCK_FENCING_TOKEN");
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let write = |token: &str, text: &str, append: bool| write_to(&file, token, text, append);
    assert!(write("5", "five\n", false).status.success());
    assert!(
        write("5", "again\n", true).status.success(),
        "an equal token"
    );
    let stale = write("4", "four\n", false);
    assert_eq!(stale.status.code(), Some(76), "{}", stderr(&stale));
    assert!(
        stderr(&stale).contains("stale fencing token 4"),
        "{}",
        stderr(&stale)
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "five\nagain\n");
    // The token comes from `run`'s environment: two runs in turn write,
    // then a write under the first run's (lower) token is refused.
    let url = sqlite_url(dir.path());
    let out = dir.path().join("out.txt");
    let job = |text: &str| {
        format!(
            "echo {text} | {} fence-write --append {} && echo $DISTLOCK_FENCING_TOKEN",
            common::BIN,
            out.display()
        )
    };
    let first = output(distlock(
        &url,
        &["run", "job", "--", "sh", "-c", &job("one")],
    ));
    assert!(first.status.success(), "{}", stderr(&first));
    let second = output(distlock(
        &url,
        &["run", "job", "--", "sh", "-c", &job("two")],
    ));
    assert!(second.status.success(), "{}", stderr(&second));
    let first_token = common::stdout(&first).trim().to_owned();
    let late = write_to(&out, &first_token, "late\n", true);
    assert_eq!(late.status.code(), Some(76), "{}", stderr(&late));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "one\ntwo\n");
}
