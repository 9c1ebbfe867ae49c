//! `distlock run`: a distributed `flock`.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use distlock::format_duration;
use lock_core::{
    LockBackendExt, LockClient, LockError, LockGuard, LockKey, LockState, RESERVED_KEY_PREFIX,
};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep_until};

use crate::exit;

/// What to do with the command when the lock is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OnLost {
    /// SIGTERM the command's process group early enough that it has
    /// --kill-after to exit before the lock's deadline, SIGKILL it a margin
    /// before the deadline.
    Term,
    /// SIGKILL the command's process group a margin before the deadline.
    Kill,
    /// Let the command run on (it is no longer protected); warn.
    Ignore,
}

/// The default of `--kill-after`.
pub(crate) const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(10);

pub(crate) struct RunArgs {
    pub(crate) key: String,
    /// The mutex, a read or write share, or permits.
    pub(crate) kind: lock_core::LeaseKind,
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) on_lost: OnLost,
    /// `None`: the default ([`DEFAULT_KILL_AFTER`], shortened silently to fit
    /// the TTL); a value given on the command line is shortened with a
    /// warning.
    pub(crate) kill_after: Option<Duration>,
    pub(crate) conflict_exit_code: u8,
    /// For `elect`: the election's name (the command also sees
    /// DISTLOCK_ELECTION and DISTLOCK_TERM).
    pub(crate) election: Option<String>,
    /// Keep the lock until at least this long after the grant, even when
    /// the command ends sooner.
    pub(crate) at_least: Option<Duration>,
    /// Skip the command when a run of it under this lock succeeded within
    /// this period (the "last run" record, [`last_run_key`]).
    pub(crate) once_per: Option<Duration>,
    pub(crate) command: Vec<String>,
}

/// The key of the "last run" record of `--once-per` for lock `key`: a
/// reserved key beside the lock, granted with a TTL of the period when a
/// run succeeds and never renewed, so it says "a run succeeded within the
/// period" for exactly that long.
pub(crate) fn last_run_key(key: &str) -> Result<LockKey, LockError> {
    LockKey::new(format!("{RESERVED_KEY_PREFIX}last-run/{key}"))
}

/// How long before the lock's local deadline the command must be gone:
/// `max(100 ms, 5 % of the TTL)`. The local deadline already allows for
/// clock drift and comes before the server frees the key; the margin
/// covers signal delivery, the process group's exit and our own wake-up.
pub(crate) fn stop_margin(ttl: Duration) -> Duration {
    (ttl / 20).max(Duration::from_millis(100))
}

/// The longest `--kill-after` that fits a TTL: SIGTERM goes out
/// `kill_after + margin` before the deadline, and must not come before the
/// renewal had a fair chance (renewals run about every TTL/3), so the
/// SIGTERM point is kept in the second half of the lease.
pub(crate) fn max_kill_after(ttl: Duration) -> Duration {
    (ttl / 2).saturating_sub(stop_margin(ttl))
}

/// When to signal the command for a lock whose local deadline is
/// `deadline`: `(SIGTERM at, SIGKILL at)`. Nothing for `ignore`.
pub(crate) fn stop_plan(
    deadline: Instant,
    on_lost: OnLost,
    kill_after: Duration,
    margin: Duration,
) -> (Option<Instant>, Option<Instant>) {
    let before = |d: Duration| deadline.checked_sub(d).unwrap_or(deadline);
    match on_lost {
        OnLost::Term => (
            Some(before(kill_after.saturating_add(margin))),
            Some(before(margin)),
        ),
        OnLost::Kill => (None, Some(before(margin))),
        OnLost::Ignore => (None, None),
    }
}

/// Acquires, runs the command with the lock held (renewed), releases.
/// Returns the process exit code.
pub(crate) async fn run(client: &LockClient, args: RunArgs) -> Result<u8, LockError> {
    let last_run = match args.once_per {
        Some(period) => {
            lock_core::check_ttl(
                period,
                Duration::from_millis(10),
                lock_core::Operation::Validate,
            )?;
            Some(last_run_key(&args.key)?)
        }
        None => None,
    };
    let granted = match &args.election {
        // The driver's own election layout (etcd's, Curator's LeaderLatch)
        // where it has one.
        Some(name) => {
            let mut campaign = client.elect(name);
            if let Some(ttl) = args.ttl {
                campaign = campaign.ttl(ttl);
            }
            if let Some(wait) = args.wait {
                campaign = campaign.wait(wait);
            }
            campaign
                .campaign()
                .await
                .map(lock_core::election::Leadership::into_guard)
        }
        None => {
            let mut request = client.lock_kind(&args.key, args.kind);
            if let Some(ttl) = args.ttl {
                request = request.ttl(ttl);
            }
            if let Some(wait) = args.wait {
                request = request.wait(wait);
            }
            request.acquire().await
        }
    };
    let guard = match granted {
        Ok(guard) => guard,
        Err(err) if err.is_contended() => {
            eprintln!("distlock: {err}");
            return Ok(args.conflict_exit_code);
        }
        Err(err) => return Err(err),
    };
    let granted_at = Instant::now();
    // `--once-per`: read under the lock, so that no run can record itself
    // between this look and ours.
    if let Some(record) = &last_run {
        match client.backend().inspect(record).await {
            Ok(Some(info)) => {
                eprintln!(
                    "distlock: {:?} already ran within the period (last run's record expires in {}); skipping the command",
                    args.key,
                    info.remaining_ttl
                        .map_or_else(|| "its TTL".to_owned(), format_duration)
                );
                let _ = guard.release().await;
                return Ok(exit::RAN_RECENTLY);
            }
            Ok(None) => {}
            Err(err) => {
                let _ = guard.release().await;
                return Err(err);
            }
        }
    }
    let Some((program, rest)) = args.command.split_first() else {
        let _ = guard.release().await;
        return Err(LockError::invalid_argument(
            lock_core::Operation::Validate,
            "no command given after --",
        ));
    };
    let ttl = guard.lease().ttl();
    let fits = max_kill_after(ttl);
    let kill_after = match args.kill_after {
        Some(asked) if asked > fits && args.on_lost == OnLost::Term => {
            eprintln!(
                "distlock: warning: --kill-after {} does not fit in the TTL {}: the command \
                 must be stopped {} before the lock's deadline and SIGTERM may come at most \
                 half a TTL before it; using --kill-after {}",
                format_duration(asked),
                format_duration(ttl),
                format_duration(stop_margin(ttl)),
                format_duration(fits)
            );
            fits
        }
        Some(asked) => asked.min(fits),
        None => DEFAULT_KILL_AFTER.min(fits),
    };
    // The lock may already be gone (a lease lost between the grant and
    // now): the command must not start at all.
    if let LockState::Lost(reason) = guard.state() {
        eprintln!(
            "distlock: lock {:?} lost before the command started ({reason}); not running it",
            args.key
        );
        let _ = guard.release().await;
        return Ok(exit::LOST_BEFORE_START);
    }
    // Signals are handled from before the command exists: one that comes
    // while it starts is forwarded, not left to kill distlock alone.
    let mut signals = Signals::new();
    let foreground = terminal_is_ours();
    let (mut child, watch) = match spawn_kept(program, rest, &args, &guard, foreground) {
        Ok(started) => started,
        Err(err) => {
            let _ = guard.release().await;
            eprintln!("distlock: cannot start {program:?}: {err}");
            return Ok(exit::CANNOT_EXEC);
        }
    };
    let mut watch = Some(watch);
    let outcome = supervise(
        &mut child,
        &guard,
        &args,
        kill_after,
        &mut signals,
        &mut watch,
    )
    .await;
    if foreground {
        take_terminal_back();
    }
    // The keeper has ended (or is being waited for no more): closing the
    // watch pipe now only tells a keeper still alive to stop everything.
    drop(watch);
    if let Supervised::Exited(status) = &outcome {
        if let (Some(record), Some(period), true) = (&last_run, args.once_per, status.success()) {
            record_run(client, &guard, record, period).await;
        }
        if let Some(at_least) = args.at_least {
            hold_until(&guard, granted_at + at_least).await;
        }
    }
    let released = guard.release().await;
    match outcome {
        Supervised::Exited(status) => {
            if let Err(err) = released {
                eprintln!(
                    "distlock: warning: release failed, the lock expires with its TTL: {err}"
                );
            }
            Ok(status_code(status))
        }
        Supervised::Lost { reason, status } => {
            eprintln!(
                "distlock: lock {:?} lost while the command ran ({reason}); command {}",
                args.key,
                describe(status)
            );
            Ok(exit::LOCK_LOST)
        }
        Supervised::WaitFailed(err) => {
            eprintln!("distlock: waiting for the command failed: {err}");
            Ok(exit::UNAVAILABLE)
        }
    }
}

/// Records a successful run for `--once-per`, fenced by the lock: the
/// lease is renewed first, a round trip that proves the lock is still ours
/// and keeps it ours for a TTL, inside which the record is written. A run
/// whose lock was lost (broken, expired: the next holder may have started
/// its own run) is not recorded.
async fn record_run(client: &LockClient, guard: &LockGuard, record: &LockKey, period: Duration) {
    let margin = stop_margin(guard.lease().ttl());
    let proven = match client.backend().renew(&guard.lease()).await {
        Ok(valid_until) => guard.is_held() && valid_until > Instant::now() + margin,
        Err(_) => false,
    };
    if !proven {
        eprintln!(
            "distlock: warning: lock {:?} is no longer ours: this run is not recorded for --once-per",
            guard.key().as_str()
        );
        return;
    }
    match client.backend().try_acquire(record, period).await {
        Ok(Some(_)) => {}
        Ok(None) => eprintln!(
            "distlock: warning: the last-run record of {:?} was already set",
            guard.key().as_str()
        ),
        Err(err) => eprintln!("distlock: warning: cannot record the run for --once-per: {err}"),
    }
}

/// `--at-least`: keeps the lock (renewed) until `until`, or until it is
/// lost.
async fn hold_until(guard: &LockGuard, until: Instant) {
    if Instant::now() >= until {
        return;
    }
    tokio::select! {
        () = sleep_until(until) => {}
        reason = guard.lost() => {
            eprintln!("distlock: lock {:?} ended before --at-least passed ({reason})", guard.key().as_str());
        }
    }
}

enum Supervised {
    Exited(ExitStatus),
    Lost {
        reason: String,
        status: Option<ExitStatus>,
    },
    WaitFailed(std::io::Error),
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn millis(d: Duration) -> u128 {
    d.as_millis()
}

/// Waits for the command while forwarding signals, and stops it before the
/// lock's deadline when renewals do not keep up.
///
/// The SIGTERM / SIGKILL points are computed from the guard's *current*
/// local deadline ([`stop_plan`]): a renewal that succeeds moves the
/// deadline and with it both points, so with healthy renewals they are
/// never reached. They are reached when renewals fail (the guard is
/// `Suspect`) and also when a renewal hangs (the guard still says `Held`
/// until its call times out): in both cases the command is gone a margin
/// before the deadline, before the server can give the key to anyone else.
async fn supervise(
    child: &mut Child,
    guard: &LockGuard,
    args: &RunArgs,
    kill_after: Duration,
    signals: &mut Signals,
    watch: &mut Option<std::os::fd::OwnedFd>,
) -> Supervised {
    let pid = child.id().and_then(|p| libc::pid_t::try_from(p).ok());
    let margin = stop_margin(guard.lease().ttl());
    let mut states = guard.subscribe();
    let mut states_open = true;
    let mut lost_reason: Option<String> = None;
    let mut term_sent = false;
    let mut kill_sent = false;
    // After a loss reported before the deadline: SIGKILL no later than this.
    let mut kill_by: Option<Instant> = None;
    loop {
        let deadline = guard.validity_deadline();
        let (term_at, kill_at) = stop_plan(deadline, args.on_lost, kill_after, margin);
        let kill_at = match (kill_at, kill_by) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        tokio::select! {
            status = child.wait() => {
                return match (status, lost_reason) {
                    (Ok(status), None) => Supervised::Exited(status),
                    (Ok(status), Some(reason)) => Supervised::Lost { reason, status: Some(status) },
                    (Err(err), _) => Supervised::WaitFailed(err),
                };
            }
            sig = signals.next() => {
                if let (Some(sig), Some(pid)) = (sig, pid) {
                    signal_group(pid, sig);
                }
            }
            () = sleep_until_opt(term_at), if !term_sent => {
                // A renewal may have moved the deadline without a state
                // change (Held -> Held): only act if the point still stands.
                let (term_at, _) = stop_plan(guard.validity_deadline(), args.on_lost, kill_after, margin);
                if term_at.is_some_and(|at| at <= Instant::now()) {
                    let left = guard.validity_deadline().saturating_duration_since(Instant::now());
                    eprintln!(
                        "distlock: lock {:?} not renewed in time ({}): SIGTERM to the command, SIGKILL in {} ms, {} ms before the lock's deadline",
                        args.key,
                        state_name(&guard.state()),
                        millis(left.saturating_sub(margin)),
                        millis(margin),
                    );
                    if let Some(pid) = pid {
                        signal_group(pid, libc::SIGTERM);
                    }
                    term_sent = true;
                    lost_reason.get_or_insert_with(|| "renewals did not succeed in time; the command was stopped before the lock's deadline".to_owned());
                }
            }
            () = sleep_until_opt(kill_at), if !kill_sent => {
                let (_, planned) = stop_plan(guard.validity_deadline(), args.on_lost, kill_after, margin);
                let now = Instant::now();
                if planned.is_some_and(|at| at <= now) || kill_by.is_some_and(|at| at <= now) {
                    if !term_sent {
                        eprintln!(
                            "distlock: lock {:?} not renewed in time ({}): SIGKILL to the command {} ms before the lock's deadline",
                            args.key,
                            state_name(&guard.state()),
                            millis(margin),
                        );
                    }
                    kill_everything(pid, watch);
                    kill_sent = true;
                    lost_reason.get_or_insert_with(|| "renewals did not succeed in time; the command was killed before the lock's deadline".to_owned());
                }
            }
            changed = states.changed(), if states_open => {
                if changed.is_err() {
                    states_open = false;
                    continue;
                }
                let LockState::Lost(reason) = states.borrow_and_update().clone() else {
                    // Held or Suspect: the loop recomputes from the deadline.
                    continue;
                };
                match args.on_lost {
                    OnLost::Ignore => {
                        eprintln!("distlock: warning: lock {:?} lost ({reason}); the command runs on unprotected (--on-lost ignore)", args.key);
                        // Keep waiting for the child; report its own status.
                        return match child.wait().await {
                            Ok(status) => Supervised::Exited(status),
                            Err(err) => Supervised::WaitFailed(err),
                        };
                    }
                    OnLost::Kill => {
                        kill_everything(pid, watch);
                        kill_sent = true;
                    }
                    OnLost::Term => {
                        if !term_sent {
                            if let Some(pid) = pid {
                                signal_group(pid, libc::SIGTERM);
                            }
                            term_sent = true;
                        }
                        // Lost before its deadline (renewal refused): the
                        // key may already be someone else's. Give the
                        // command its --kill-after, but never past the
                        // deadline's margin.
                        let by = lock_core::saturating_add(Instant::now(), kill_after);
                        kill_by = Some(kill_by.map_or(by, |b| b.min(by)));
                    }
                }
                lost_reason = Some(reason);
            }
        }
    }
}

/// Starts the command under a keeper (see [`crate::keeper`]): this binary
/// again, leading a process group of its own, with the read end of a pipe
/// whose write end (returned) only this process holds. Whatever ends this
/// process closes it, and the keeper then kills the command.
fn spawn_kept(
    program: &str,
    rest: &[String],
    args: &RunArgs,
    guard: &LockGuard,
    foreground: bool,
) -> std::io::Result<(Child, std::os::fd::OwnedFd)> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned only here.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let watch = read_end.as_raw_fd();
    // `/proc/self/exe` is this very binary even if its file was replaced
    // or removed since it started.
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg(crate::keeper::ARG).arg(watch.to_string());
    if foreground {
        cmd.arg("--foreground");
    }
    cmd.arg("--").arg(program).args(rest);
    if let Some(name) = &args.election {
        cmd.env("DISTLOCK_ELECTION", name)
            .env("DISTLOCK_TERM", guard.token().to_string());
    }
    cmd.env("DISTLOCK_KEY", &args.key)
        .env("DISTLOCK_LOCK_KIND", guard.kind().code())
        .env("DISTLOCK_FENCING_TOKEN", guard.token().to_string())
        .env("DISTLOCK_OWNER", guard.owner().to_hex())
        .env("DISTLOCK_HANDLE", guard.lease().to_handle())
        .stdin(Stdio::inherit())
        // Its own process group: forwarded signals and the on-lost action
        // reach the whole job, grandchildren included.
        .process_group(0)
        .kill_on_drop(false);
    // SAFETY: the closure runs between fork and exec and only calls
    // fcntl(2), which is async-signal-safe; it lets the read end (and only
    // it) survive the exec into the keeper.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(watch, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(read_end);
    if foreground {
        // From here this process is in a background group; writing to the
        // terminal or taking it back must not stop it.
        // SAFETY: signal(2) with integer arguments.
        unsafe {
            libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        }
    }
    Ok((child, write_end))
}

/// Whether stdin is a terminal whose foreground process group is ours: the
/// command then gets the terminal (its keeper makes its group the
/// foreground), so reading it does not stop it with SIGTTIN.
fn terminal_is_ours() -> bool {
    // SAFETY: isatty, tcgetpgrp and getpgrp take integers only.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// Makes our process group the terminal's foreground again (SIGTTOU is
/// ignored since the command was given the terminal).
fn take_terminal_back() {
    // SAFETY: tcsetpgrp and getpgrp take integers only.
    unsafe {
        libc::tcsetpgrp(0, libc::getpgrp());
    }
}

fn state_name(state: &LockState) -> &'static str {
    match state {
        LockState::Held => "renewal pending",
        LockState::Suspect => "renewals failing",
        LockState::Lost(_) => "lost",
        LockState::Released => "released",
    }
}

/// SIGKILL to everything the command started: closing the watch pipe makes
/// the keeper kill every process below it (one that left the command's
/// group with `setsid` included), then the group and itself; with the pipe
/// already closed, SIGKILL to the command's group.
fn kill_everything(pid: Option<libc::pid_t>, watch: &mut Option<std::os::fd::OwnedFd>) {
    if watch.take().is_none()
        && let Some(pid) = pid
    {
        signal_group(pid, libc::SIGKILL);
    }
}

fn signal_group(pid: libc::pid_t, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions; a negative pid
    // addresses the process group we created for the command.
    unsafe {
        libc::kill(-pid, sig);
    }
}

/// The signals forwarded to the command.
struct Signals {
    streams: Vec<(libc::c_int, tokio::signal::unix::Signal)>,
}

impl Signals {
    fn new() -> Self {
        let streams = crate::keeper::FORWARDED
            .into_iter()
            .filter_map(|sig| signal(SignalKind::from_raw(sig)).ok().map(|s| (sig, s)))
            .collect();
        Self { streams }
    }

    async fn next(&mut self) -> Option<libc::c_int> {
        if self.streams.is_empty() {
            return std::future::pending().await;
        }
        let futures = self
            .streams
            .iter_mut()
            .map(|(sig, stream)| {
                let sig = *sig;
                Box::pin(async move { stream.recv().await.map(|()| sig) })
            })
            .collect::<Vec<_>>();
        select_first(futures).await
    }
}

async fn select_first<F>(mut futures: Vec<std::pin::Pin<Box<F>>>) -> F::Output
where
    F: std::future::Future,
{
    std::future::poll_fn(|cx| {
        for fut in &mut futures {
            if let std::task::Poll::Ready(out) = fut.as_mut().poll(cx) {
                return std::task::Poll::Ready(out);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

fn status_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    status
        .signal()
        .and_then(|sig| u8::try_from(128 + sig).ok())
        .unwrap_or(1)
}

fn describe(status: Option<ExitStatus>) -> String {
    match status {
        Some(status) => format!("ended with {status}"),
        None => "state unknown".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_margin_and_the_longest_kill_after_follow_the_ttl() {
        assert_eq!(
            stop_margin(Duration::from_secs(1)),
            Duration::from_millis(100)
        );
        assert_eq!(
            stop_margin(Duration::from_secs(10)),
            Duration::from_millis(500)
        );
        assert_eq!(
            max_kill_after(Duration::from_secs(10)),
            Duration::from_millis(4500)
        );
        assert_eq!(
            max_kill_after(Duration::from_secs(30)),
            Duration::from_millis(13_500)
        );
        // The default --kill-after fits the default TTL.
        assert!(DEFAULT_KILL_AFTER <= max_kill_after(Duration::from_secs(30)));
        assert_eq!(max_kill_after(Duration::from_millis(150)), Duration::ZERO);
        assert_eq!(max_kill_after(Duration::ZERO), Duration::ZERO);
        assert_eq!(stop_margin(Duration::MAX), Duration::MAX / 20);
    }

    #[test]
    fn signals_come_before_the_deadline_and_move_with_it() {
        let now = Instant::now();
        let deadline = now + Duration::from_secs(10);
        let margin = Duration::from_millis(500);
        let kill_after = Duration::from_secs(2);
        let (term, kill) = stop_plan(deadline, OnLost::Term, kill_after, margin);
        assert_eq!(term, Some(deadline - Duration::from_millis(2500)));
        assert_eq!(kill, Some(deadline - margin));
        assert!(term.unwrap() < kill.unwrap() && kill.unwrap() < deadline);
        // A renewal moves the deadline, and both points with it.
        let renewed = deadline + Duration::from_secs(3);
        let (term2, kill2) = stop_plan(renewed, OnLost::Term, kill_after, margin);
        assert_eq!(term2.unwrap() - term.unwrap(), Duration::from_secs(3));
        assert_eq!(kill2.unwrap() - kill.unwrap(), Duration::from_secs(3));
        assert_eq!(
            stop_plan(deadline, OnLost::Kill, kill_after, margin),
            (None, Some(deadline - margin))
        );
        assert_eq!(
            stop_plan(deadline, OnLost::Ignore, kill_after, margin),
            (None, None)
        );
        // Huge values saturate instead of panicking.
        let (term, kill) = stop_plan(deadline, OnLost::Term, Duration::MAX, Duration::MAX);
        assert!(term.is_some() && kill.is_some());
    }
}
