//! The lock holders of the crash and pause scenarios: real `distlock run`
//! processes of the `distlock` command a user installs, found beside this
//! binary (both built into one target directory), in `DISTLOCK_BIN`, or on
//! `PATH`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use conformance::scenarios::{self, HolderCommand};
use lock_core::LeaseKind;

/// The environment variable that names the `distlock` binary to use.
pub(crate) const BIN_ENV: &str = "DISTLOCK_BIN";

/// The `distlock` binary the holders run, looked up once and said once on
/// stderr (`None`: the holder scenarios are skipped, and that is said too).
pub(crate) fn distlock_binary() -> Option<&'static Path> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let found = find();
            match &found {
                Some(path) => eprintln!("lock holders: {} run", path.display()),
                None => eprintln!(
                    "lock holders: no distlock binary beside this one, in {BIN_ENV} or on \
                     PATH: the scenarios that need a holder process are skipped (build it \
                     with `cargo build --release -p distlock-cli`)"
                ),
            }
            found
        })
        .as_deref()
}

fn find() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(BIN_ENV) {
        return Some(PathBuf::from(path));
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("distlock")));
    beside.filter(|p| p.is_file()).or_else(|| {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|dir| dir.join("distlock"))
            .find(|p| p.is_file())
    })
}

/// The holder command taking a grant of `kind`, or `None` without a
/// `distlock` binary.
pub(crate) fn command(kind: LeaseKind) -> Option<HolderCommand> {
    let exe = distlock_binary()?.to_owned();
    Some(scenarios::distlock_run_holder_kind(
        exe,
        scenarios::HOLDER_WORK.to_owned(),
        kind,
    ))
}
