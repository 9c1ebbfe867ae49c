//! `distlock run`: a distributed `flock`.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use lock_core::{LockClient, LockError, LockGuard};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

use crate::exit;

/// What to do with the command when the lock is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OnLost {
    /// SIGTERM the command's process group, SIGKILL after --kill-after.
    Term,
    /// SIGKILL the command's process group at once.
    Kill,
    /// Let the command run on (it is no longer protected); warn.
    Ignore,
}

pub(crate) struct RunArgs {
    pub(crate) key: String,
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) on_lost: OnLost,
    pub(crate) kill_after: Duration,
    pub(crate) conflict_exit_code: u8,
    pub(crate) command: Vec<String>,
}

/// Acquires, runs the command with the lock held (renewed), releases.
/// Returns the process exit code.
pub(crate) async fn run(client: &LockClient, args: RunArgs) -> Result<u8, LockError> {
    let mut request = client.lock(&args.key);
    if let Some(ttl) = args.ttl {
        request = request.ttl(ttl);
    }
    if let Some(wait) = args.wait {
        request = request.wait(wait);
    }
    let guard = match request.acquire().await {
        Ok(guard) => guard,
        Err(err) if err.is_contended() => {
            eprintln!("distlock: {err}");
            return Ok(args.conflict_exit_code);
        }
        Err(err) => return Err(err),
    };
    let Some((program, rest)) = args.command.split_first() else {
        let _ = guard.release().await;
        return Err(LockError::invalid_argument(
            lock_core::Operation::Validate,
            "no command given after --",
        ));
    };
    let mut cmd = Command::new(program);
    cmd.args(rest)
        .env("DISTLOCK_KEY", &args.key)
        .env("DISTLOCK_FENCING_TOKEN", guard.token().to_string())
        .env("DISTLOCK_OWNER", guard.owner().to_hex())
        .env("DISTLOCK_HANDLE", guard.lease().to_handle())
        .stdin(Stdio::inherit())
        // Its own process group: forwarded signals and the on-lost action
        // reach the whole job, grandchildren included.
        .process_group(0)
        .kill_on_drop(false);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(err) => {
            let _ = guard.release().await;
            eprintln!("distlock: cannot start {program:?}: {err}");
            return Ok(exit::CANNOT_EXEC);
        }
    };
    let outcome = supervise(&mut child, &guard, &args).await;
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

enum Supervised {
    Exited(ExitStatus),
    Lost {
        reason: String,
        status: Option<ExitStatus>,
    },
    WaitFailed(std::io::Error),
}

async fn supervise(child: &mut Child, guard: &LockGuard, args: &RunArgs) -> Supervised {
    let pid = child.id().and_then(|p| libc::pid_t::try_from(p).ok());
    let mut signals = Signals::new();
    let mut lost_reason: Option<String> = None;
    loop {
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
            reason = guard.lost(), if lost_reason.is_none() => {
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
                        if let Some(pid) = pid {
                            signal_group(pid, libc::SIGKILL);
                        }
                    }
                    OnLost::Term => {
                        if let Some(pid) = pid {
                            signal_group(pid, libc::SIGTERM);
                        }
                        let kill_after = args.kill_after;
                        if tokio::time::timeout(kill_after, child.wait()).await.is_err()
                            && let Some(pid) = pid
                        {
                            signal_group(pid, libc::SIGKILL);
                        }
                    }
                }
                lost_reason = Some(reason);
            }
        }
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
        let kinds = [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGUSR1,
            libc::SIGUSR2,
        ];
        let streams = kinds
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
