//! Threads inside a network namespace: the one primitive both a
//! [`Lab`](crate::netns::Lab) and a server's readiness check
//! ([`Ready::Reachable`](crate::process::Ready::Reachable)) need, kept
//! apart from the lab so that starting a process does not depend on it.
//!
//! A thread enters the namespace with `setns(2)` before it opens any
//! socket; every thread it starts (a runtime's workers) inherits it.

use std::path::{Path, PathBuf};

/// Runs the future `make` returns to its end on a new thread inside the
/// network namespace at `path` (`/run/netns/NAME`,
/// [`Namespace::path`](crate::netns::Namespace::path)), on a runtime of its
/// own (`workers` worker threads, in the namespace too; 0: a
/// current-thread runtime): a client that does all its I/O from that host.
///
/// # Errors
///
/// The thread's result is an error when the namespace cannot be entered
/// or the runtime cannot be built.
pub fn spawn_runtime_in<F, Fut>(
    path: PathBuf,
    workers: usize,
    make: F,
) -> std::thread::JoinHandle<std::io::Result<Fut::Output>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future,
    Fut::Output: Send + 'static,
{
    std::thread::spawn(move || {
        enter(&path)?;
        let mut builder = if workers == 0 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(workers);
            builder
        };
        let runtime = builder.enable_all().build()?;
        Ok(runtime.block_on(make()))
    })
}

/// Runs `work` on a new thread inside the network namespace at `path`
/// (`/run/netns/NAME`); see
/// [`Namespace::spawn`](crate::netns::Namespace::spawn).
pub fn spawn_in<F, R>(path: PathBuf, work: F) -> std::thread::JoinHandle<std::io::Result<R>>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    std::thread::spawn(move || {
        enter(&path)?;
        Ok(work())
    })
}

/// Moves the calling thread into the network namespace at `path`.
fn enter(path: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path)?;
    // SAFETY: setns(2) on a descriptor we own; it changes only this
    // thread's network namespace.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
