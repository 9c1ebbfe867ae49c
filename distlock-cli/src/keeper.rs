//! The keeper: a small process between `distlock run` (or `elect`) and its
//! command, so that the command never outlives its supervisor.
//!
//! `distlock` starts itself again as `distlock __distlock-keeper FD [--foreground]
//! -- PROGRAM ARGS...`, in a process group of its own; the keeper starts the
//! command in that group and waits for it. `FD` is the read end of a pipe
//! whose only write end stays in `distlock`: however `distlock` ends
//! (SIGKILL, the OOM killer, a panic, a crash), the kernel closes the write
//! end, the keeper reads end-of-file and kills the command's process group
//! and every process below itself (it is a child subreaper, so what the
//! command started with `setsid` or double-forked is still below it), then
//! itself. Nothing else is in the keeper: it holds no lock and no
//! connection, so it has nothing to wait for.
//!
//! When the command ends, the keeper waits for every process it left
//! running below it (a background job, a `setsid` or double-forked one) to
//! end as well, as `flock(1)`'s lock lasts while any process holds its
//! descriptor: `distlock` keeps the lock meanwhile, so nothing the command
//! started runs without it. Signals forwarded to the command's group
//! afterwards also reach the leftovers that left the group.
//!
//! The keeper then ends with the command's own status (exit code, or the
//! same signal), which `distlock` reports as the command's.
//!
//! With `--foreground` (stdin is a terminal and `distlock` was in its
//! foreground process group) the keeper makes its group the terminal's
//! foreground before it starts the command, so a command that reads the
//! terminal is not stopped by SIGTTIN; `distlock` takes the terminal back
//! when the command has ended.

use std::ffi::OsString;
use std::os::fd::RawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

/// Set by the end-of-file thread before it kills anything: from then on
/// that thread alone ends the keeper.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// The last forwarded signal the keeper received (0: none since it was
/// last taken): passed on to the command's leftovers outside its group.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// The first argument that makes `distlock` a keeper.
pub(crate) const ARG: &str = "__distlock-keeper";

/// The signals `distlock` forwards to the command's process group: the
/// keeper is in that group and must outlive them to report the command's
/// status.
pub(crate) const FORWARDED: [libc::c_int; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// When this process was started as a keeper, runs it and exits; otherwise
/// returns at once. Called first thing in `main`, before any thread exists.
pub(crate) fn run_if_keeper() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(ARG)) {
        return;
    }
    let code = match parse(args.collect()) {
        Some(plan) => keep(plan),
        None => {
            eprintln!("distlock: {ARG} is internal to `distlock run`");
            2
        }
    };
    std::process::exit(code);
}

struct Plan {
    watch: RawFd,
    foreground: bool,
    program: OsString,
    args: Vec<OsString>,
}

fn parse(args: Vec<OsString>) -> Option<Plan> {
    let mut args = args.into_iter();
    let watch = args.next()?.to_str()?.parse::<RawFd>().ok()?;
    let mut foreground = false;
    loop {
        let arg = args.next()?;
        match arg.to_str() {
            Some("--foreground") => foreground = true,
            Some("--") => break,
            _ => return None,
        }
    }
    let program = args.next()?;
    Some(Plan {
        watch,
        foreground,
        program,
        args: args.collect(),
    })
}

extern "C" fn record_signal(sig: libc::c_int) {
    // An atomic store is async-signal-safe.
    RECEIVED.store(sig, Ordering::SeqCst);
}

fn keep(plan: Plan) -> i32 {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer; no
    // memory is passed.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    for sig in FORWARDED {
        survive(sig);
    }
    // The watch end must not reach the command.
    // SAFETY: fcntl on a descriptor number; an invalid one fails with EBADF.
    if unsafe { libc::fcntl(plan.watch, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        eprintln!("distlock: keeper: bad watch descriptor {}", plan.watch);
        return 2;
    }
    if plan.foreground {
        take_terminal();
    }
    let child = match Command::new(&plan.program).args(&plan.args).spawn() {
        Ok(child) => child,
        Err(err) => {
            eprintln!("distlock: cannot start {:?}: {err}", plan.program);
            return 126;
        }
    };
    let watch = plan.watch;
    std::thread::spawn(move || {
        wait_for_eof(watch);
        // distlock is gone: nobody renews the lock any more.
        STOPPING.store(true, Ordering::SeqCst);
        kill_everything_below();
    });
    let mut child = child;
    let waited = child.wait();
    if STOPPING.load(Ordering::SeqCst) {
        // The end-of-file thread is stopping everything below (distlock is
        // gone) and ends this process when it has: the command's end (or
        // ECHILD, when that thread reaped it) must not end the keeper
        // first, or a process that left the command's group (`setsid`)
        // and was not yet reached would outlive it.
        park_until_stopped();
    }
    match waited {
        Ok(status) => {
            wait_for_leftovers();
            if let Some(code) = status.code() {
                return code;
            }
            if let Some(sig) = status.signal() {
                die_by(sig);
            }
            1
        }
        Err(err) => {
            eprintln!("distlock: keeper: waiting for the command failed: {err}");
            kill_everything_below()
        }
    }
}

/// Waits until no process is left below the keeper (the command's
/// leftovers, re-parented to it as a subreaper), reaping them; passes the
/// forwarded signals received meanwhile on to those outside the keeper's
/// process group (its members got them from `distlock` already). Should
/// `distlock` end meanwhile, the end-of-file thread kills them all.
fn wait_for_leftovers() {
    RECEIVED.store(0, Ordering::SeqCst);
    // SAFETY: getpgrp takes nothing and cannot fail.
    let group = unsafe { libc::getpgrp() };
    loop {
        loop {
            // SAFETY: waitpid with a null status pointer is allowed.
            let reaped = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
            if reaped > 0 {
                continue;
            }
            if reaped < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
                return;
            }
            break;
        }
        let sig = RECEIVED.swap(0, Ordering::SeqCst);
        if sig != 0 {
            for pid in descendants(std::process::id()) {
                let Ok(pid) = libc::pid_t::try_from(pid) else {
                    continue;
                };
                // SAFETY: getpgid and kill take integers only.
                unsafe {
                    if libc::getpgid(pid) != group {
                        libc::kill(pid, sig);
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Leaves the end of the process to the end-of-file thread
/// ([`kill_everything_below`] exits within about 100 ms). Should it not
/// have within 5 s, does the same from here.
fn park_until_stopped() -> ! {
    std::thread::sleep(Duration::from_secs(5));
    kill_everything_below()
}

/// A handler that only records `sig` unless it is ignored (an ignored signal stays
/// ignored for the command, as `nohup` and background shells expect; a
/// handler is reset to the default by `exec`).
fn survive(sig: libc::c_int) {
    // SAFETY: sigaction reads and writes the two structs we own; the handler
    // is an `extern "C"` function that only stores to an atomic.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
            || old.sa_sigaction == libc::SIG_IGN
        {
            return;
        }
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = record_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(sig, &action, std::ptr::null_mut());
    }
}

/// Makes this process group the foreground of the terminal on stdin.
/// From a background group `tcsetpgrp` raises SIGTTOU, ignored for the call.
fn take_terminal() {
    // SAFETY: signal and tcsetpgrp take integers only.
    unsafe {
        let previous = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        libc::tcsetpgrp(0, libc::getpgrp());
        libc::signal(libc::SIGTTOU, previous);
    }
}

/// Blocks until the pipe's write end is closed (read returns 0 or fails
/// with anything but EINTR).
fn wait_for_eof(fd: RawFd) {
    let mut buf = [0u8; 16];
    loop {
        // SAFETY: reads into a buffer we own, of its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            continue;
        }
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return;
    }
}

/// SIGKILL to every process below the keeper (children and, since it is a
/// subreaper, orphans that were re-parented to it), repeated until none is
/// left or a bound passes, then to its whole process group, itself
/// included.
fn kill_everything_below() -> ! {
    let me = std::process::id();
    for _ in 0..50 {
        let below = descendants(me);
        if below.is_empty() {
            break;
        }
        for pid in below {
            if let Ok(pid) = libc::pid_t::try_from(pid) {
                // SAFETY: kill(2) has no memory-safety preconditions.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
        // Reap what died so it is not listed again.
        // SAFETY: waitpid with a null status pointer is allowed.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        std::thread::sleep(Duration::from_millis(2));
    }
    // SAFETY: as above; 0 addresses our own process group.
    unsafe {
        libc::kill(0, libc::SIGKILL);
    }
    std::process::exit(137)
}

/// Every process below `pid`, read from `/proc/<pid>/task/*/children`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(children) = std::fs::read_to_string(task.path().join("children")) else {
                continue;
            };
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                out.push(child);
                todo.push(child);
            }
        }
    }
    out
}

/// Ends this process by `sig`, as the command ended, so `distlock` reports
/// the same status. No core file for the keeper itself.
fn die_by(sig: libc::c_int) {
    // SAFETY: setrlimit reads a struct we own; signal and raise take integers.
    unsafe {
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &none);
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keeper_arguments_are_parsed_strictly() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        let plan = parse(os(&["7", "--foreground", "--", "sh", "-c", "x"])).unwrap();
        assert_eq!(plan.watch, 7);
        assert!(plan.foreground);
        assert_eq!(plan.program, "sh");
        assert_eq!(plan.args, os(&["-c", "x"]));
        assert!(!parse(os(&["7", "--", "true"])).unwrap().foreground);
        assert!(parse(os(&["x", "--", "true"])).is_none());
        assert!(parse(os(&["7", "--"])).is_none());
        assert!(parse(os(&["7", "--bogus", "--", "true"])).is_none());
    }
}
