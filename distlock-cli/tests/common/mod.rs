//! What the command-line tests share: the `distlock` binary run as a
//! process with a backend URL and nothing from the environment.
#![allow(dead_code)]

use std::process::{Command, Output, Stdio};

/// The binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_distlock");

/// `distlock --url URL ARGS...`, ignoring `DISTLOCK_URL` / `DISTLOCK_CONFIG`
/// and `DISTLOCK_LABEL` from the environment, stdin closed.
pub(crate) fn distlock(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("--url").arg(url).args(args);
    cmd.env_remove("DISTLOCK_URL")
        .env_remove("DISTLOCK_CONFIG")
        .env_remove("DISTLOCK_LABEL");
    cmd.stdin(Stdio::null());
    cmd
}

/// Runs it to the end, stdin closed.
pub(crate) fn output(mut cmd: Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("run distlock")
}

/// Its standard output, as text.
pub(crate) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Its standard error, as text.
pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
