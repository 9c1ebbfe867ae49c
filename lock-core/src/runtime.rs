//! Where guards run their renewal tasks: on a thread of their own by default.

use std::fmt;
use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::error::{ErrorKind, LockError, Operation};

/// The name of the dedicated renewal thread (visible in `top -H`, debuggers
/// and panic messages).
pub const RENEWAL_THREAD_NAME: &str = "distlock-renewal";

/// The Tokio runtime the renewal scheduler of a client's guards runs on (one
/// scheduler task per backend and runtime renews every guard, in batches).
///
/// - [`RenewalRuntime::dedicated`] (the **default**): one process-wide
///   current-thread runtime on its own named thread
///   ([`RENEWAL_THREAD_NAME`]), started lazily by the first guard that uses
///   it and never stopped. The application can block its own runtime (a
///   synchronous call, a CPU-bound loop) and the scheduler still renews on
///   time, and still fires `Lost` at the local deadline when renewal fails.
/// - [`RenewalRuntime::current`]: the runtime the guard is created on (the
///   behaviour before the dedicated runtime existed). If the application
///   blocks that runtime, renewals stop; the guard then reports `Lost` as
///   soon as anyone looks after the deadline ([`LockGuard::state`],
///   [`is_held`], [`run`], [`lost`]), never a silent expiry, but the lock
///   *is* gone.
/// - [`RenewalRuntime::from_handle`]: any runtime of the application's.
///
/// # Why dedicated is the default, and where it helps
///
/// Its cost is one thread, started only when a guard needs it, and a
/// cross-thread wake-up when a guard is registered whose first renewal or
/// deadline comes before the scheduler's planned wake-up (rare in a hot
/// acquire/release loop: while guards are being registered the scheduler
/// ticks on its own, at most every 100 ms, for a second after the last
/// one), and one per renewal batch (a few microseconds). What it buys depends on where the backend does its I/O:
///
/// - **In-process backends** ([`MemoryBackend`](crate::MemoryBackend)):
///   renewal needs nothing but the scheduler, so it survives a blocked
///   application runtime completely.
/// - **Network backends**: a renewal is a request on the backend's
///   connection, and that connection's own tasks (a Redis multiplexed
///   connection's driver task, sqlx pool maintenance, tonic channels for
///   etcd, the ZooKeeper session task) and socket readiness run on the
///   runtime where the client was **connected**. If that is the
///   application's runtime and it is blocked, the renewal request waits
///   for it like any other; the dedicated scheduler still declares `Lost`
///   at the deadline on time, so other threads (and the application, the
///   moment it looks) see the loss when it happens. To make renewal itself
///   survive, connect the backend on the dedicated runtime too, with
///   [`run_on`](Self::run_on): `RenewalRuntime::dedicated().run_on(connect(..)).await`.
///   The application's calls then talk to connection tasks that live on
///   the renewal thread.
///
/// A backend whose calls block the thread they run on would stall every
/// guard on the shared renewal thread; the backends of this family do not.
///
/// [`LockGuard::state`]: crate::LockGuard::state
/// [`is_held`]: crate::LockGuard::is_held
/// [`run`]: crate::LockGuard::run
/// [`lost`]: crate::LockGuard::lost
#[derive(Clone, Default)]
pub struct RenewalRuntime {
    place: Place,
}

#[derive(Clone, Default)]
enum Place {
    #[default]
    Dedicated,
    Current,
    Handle(Handle),
}

impl fmt::Debug for RenewalRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let place = match &self.place {
            Place::Dedicated => "dedicated",
            Place::Current => "current",
            Place::Handle(_) => "handle",
        };
        f.debug_tuple("RenewalRuntime").field(&place).finish()
    }
}

impl RenewalRuntime {
    /// The process-wide renewal runtime on its own thread (the default).
    ///
    /// Started on first use. Should the thread or runtime fail to start
    /// (the OS refusing a thread), work goes to the current runtime instead
    /// and a warning is logged once.
    pub fn dedicated() -> Self {
        Self {
            place: Place::Dedicated,
        }
    }

    /// The runtime current where the guard is created (outside any runtime:
    /// the dedicated one).
    pub fn current() -> Self {
        Self {
            place: Place::Current,
        }
    }

    /// A runtime of the application's choosing.
    pub fn from_handle(handle: Handle) -> Self {
        Self {
            place: Place::Handle(handle),
        }
    }

    /// Whether this is the process-wide dedicated runtime.
    pub fn is_dedicated(&self) -> bool {
        matches!(self.place, Place::Dedicated)
    }

    /// The handle work is spawned on right now, if any runtime is
    /// available (for `current`: the runtime of the calling thread).
    pub fn handle(&self) -> Option<Handle> {
        match &self.place {
            Place::Dedicated => dedicated_handle().or_else(|| Handle::try_current().ok()),
            Place::Current => Handle::try_current().ok().or_else(dedicated_handle),
            Place::Handle(handle) => Some(handle.clone()),
        }
    }

    /// Spawns `future` on this runtime.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unavailable`] when no runtime is available: `current`
    /// outside a runtime with the dedicated runtime unable to start.
    pub fn spawn<F>(&self, future: F) -> Result<JoinHandle<F::Output>, LockError>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = self.handle().ok_or_else(|| {
            LockError::new(
                ErrorKind::Unavailable,
                Operation::Connect,
                "no Tokio runtime to run on (and the renewal thread could not start)",
            )
        })?;
        Ok(handle.spawn(future))
    }

    /// Runs `future` to completion on this runtime and returns its output,
    /// e.g. a backend's connect future, so that the connection's own tasks
    /// live on the renewal thread and a blocked application runtime cannot
    /// starve renewals (see the type's docs):
    ///
    /// ```
    /// use lock_core::{LockClient, MemoryBackend, RenewalRuntime};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// // With a network backend this would be its `connect(url)` future.
    /// let backend = RenewalRuntime::dedicated()
    ///     .run_on(async { MemoryBackend::new() })
    ///     .await?;
    /// let client = LockClient::new(backend);
    /// assert!(client.renewal_runtime().is_dedicated());
    /// # Ok(()) }
    /// ```
    ///
    /// A panic in `future` is resumed in the caller.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unavailable`] when there is no runtime to run on, or the
    /// runtime shut down before `future` finished (never for the dedicated
    /// one).
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future does **not** stop `future`: it runs to
    /// completion on the other runtime and its output is dropped (for a
    /// connect future: the connection is closed again).
    pub async fn run_on<F>(&self, future: F) -> Result<F::Output, LockError>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.spawn(future)?.await {
            Ok(output) => Ok(output),
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(err) => Err(LockError::new(
                ErrorKind::Unavailable,
                Operation::Connect,
                "the runtime shut down before the future finished",
            )
            .with_source(err)),
        }
    }
}

/// The process-wide renewal runtime's handle, started on first call.
pub(crate) fn dedicated_handle() -> Option<Handle> {
    static DEDICATED: OnceLock<Option<Handle>> = OnceLock::new();
    DEDICATED.get_or_init(start_dedicated).clone()
}

fn start_dedicated() -> Option<Handle> {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name(RENEWAL_THREAD_NAME.to_owned())
        .spawn(move || {
            // `enable_all` turns on I/O whenever the build has it (any crate
            // enabling tokio's `net`), so backends can connect here.
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(err) => {
                    let _ = tx.send(Err(err.to_string()));
                    return;
                }
            };
            let _ = tx.send(Ok(runtime.handle().clone()));
            // Drives every task spawned through the handle, forever.
            runtime.block_on(std::future::pending::<()>());
        });
    let outcome = match spawned {
        Ok(_) => rx
            .recv()
            .unwrap_or_else(|_| Err("the renewal thread exited".to_owned())),
        Err(err) => Err(err.to_string()),
    };
    match outcome {
        Ok(handle) => Some(handle),
        Err(reason) => {
            tracing::warn!(%reason, "could not start the renewal runtime; renewing on the application's runtime");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedicated_runs_on_its_own_named_thread_without_a_caller_runtime() {
        let handle = RenewalRuntime::dedicated().handle().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        handle.spawn(async move {
            let _ = tx.send(std::thread::current().name().map(str::to_owned));
        });
        let name = rx.recv().unwrap();
        assert_eq!(name.as_deref(), Some(RENEWAL_THREAD_NAME));
        // `current` outside a runtime falls back to the dedicated one.
        assert!(RenewalRuntime::current().handle().is_some());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn run_on_returns_the_output_and_resumes_panics() {
        let name = RenewalRuntime::dedicated()
            .run_on(async { std::thread::current().name().map(str::to_owned) })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some(RENEWAL_THREAD_NAME));
        let here = RenewalRuntime::current()
            .run_on(async { std::thread::current().id() })
            .await
            .unwrap();
        assert_eq!(here, std::thread::current().id());
        let caught = tokio::spawn(async {
            RenewalRuntime::dedicated()
                .run_on(async { panic!("boom") })
                .await
        })
        .await;
        assert!(caught.unwrap_err().is_panic());
    }
}
