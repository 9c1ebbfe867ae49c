//! The mapping from the ZooKeeper client's errors to [`LockError`] kinds,
//! the backend's name, and the operation timeout every request has.

use std::future::Future;
use std::time::Duration;

use lock_core::{ErrorKind, LockError, Operation};
use zookeeper_client as zk;

pub(crate) const NAME: &str = "zookeeper";

/// A request that failed: the server's answer or our own timeout.
#[derive(Debug)]
pub(crate) enum CallError {
    Zk(zk::Error),
    TimedOut(Duration),
}

impl CallError {
    pub(crate) fn is(&self, err: &zk::Error) -> bool {
        matches!(self, Self::Zk(e) if e == err)
    }

    /// The request may or may not have been applied.
    pub(crate) fn outcome_unknown(&self) -> bool {
        matches!(
            self,
            Self::TimedOut(_) | Self::Zk(zk::Error::ConnectionLoss)
        )
    }

    pub(crate) fn ends_session(&self) -> bool {
        matches!(
            self,
            Self::Zk(zk::Error::SessionExpired | zk::Error::SessionMoved | zk::Error::ClientClosed)
        )
    }

    pub(crate) fn into_lock_error(self, operation: Operation) -> LockError {
        match self {
            Self::TimedOut(after) => LockError::new(
                ErrorKind::Timeout,
                operation,
                format!("no answer from ZooKeeper within the operation timeout of {after:?}"),
            )
            .with_backend(NAME),
            Self::Zk(err) => zk_error(operation, err),
        }
    }
}

/// The connection broke with the request in flight. The client reports
/// this as `ConnectionLoss`, or as a custom error carrying the reason
/// ("no response from connection in ...", an I/O error).
pub(crate) fn connection_failure(err: &zk::Error) -> bool {
    matches!(err, zk::Error::ConnectionLoss | zk::Error::Custom(_))
}

/// Opening a session failed: no session within the connect timeout, or
/// the client refused (bad arguments or failed authentication are
/// configuration errors; the rest is an unreachable ensemble).
pub(crate) fn connect_error(
    operation: Operation,
    connect_string: &str,
    err: CallError,
) -> LockError {
    match err {
        CallError::TimedOut(after) => LockError::new(
            ErrorKind::Unavailable,
            operation,
            format!("no ZooKeeper session with {connect_string} within {after:?}"),
        )
        .with_backend(NAME),
        CallError::Zk(err) => {
            let kind = match err {
                zk::Error::BadArguments(_) => ErrorKind::Config,
                zk::Error::AuthFailed => ErrorKind::Config,
                zk::Error::Timeout => ErrorKind::Unavailable,
                _ => ErrorKind::Unavailable,
            };
            LockError::new(
                kind,
                operation,
                format!("cannot open a ZooKeeper session with {connect_string}: {err}"),
            )
            .with_backend(NAME)
            .with_source(err)
        }
    }
}

pub(crate) fn zk_error(operation: Operation, err: zk::Error) -> LockError {
    let kind = match &err {
        err if connection_failure(err) => ErrorKind::Unavailable,
        zk::Error::ConnectionLoss
        | zk::Error::NoHosts
        | zk::Error::SessionExpired
        | zk::Error::SessionMoved
        | zk::Error::ClientClosed
        | zk::Error::Throttled
        | zk::Error::NotReadOnly => ErrorKind::Unavailable,
        zk::Error::Timeout => ErrorKind::Timeout,
        zk::Error::BadArguments(_) => ErrorKind::InvalidArgument,
        _ => ErrorKind::Backend,
    };
    LockError::new(kind, operation, format!("ZooKeeper: {err}"))
        .with_backend(NAME)
        .with_source(err)
}

pub(crate) async fn timed<T, F>(timeout: Duration, call: F) -> Result<T, CallError>
where
    F: Future<Output = Result<T, zk::Error>>,
{
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(CallError::Zk(err)),
        Err(_) => Err(CallError::TimedOut(timeout)),
    }
}

/// [`timed`] for a request that is safe to send again (a delete of our own
/// node by path): made by `call`, the first time at once (so requests made
/// together leave together), and again after a pause when the connection
/// broke with it in flight (the client reconnects, and the session lives
/// on across a reconnection), until it gets an answer or `timeout` has
/// passed since the first try. A repeated delete whose first copy was
/// applied answers `NoNode`.
pub(crate) fn timed_resending<T, F>(
    timeout: Duration,
    mut call: impl FnMut() -> F,
) -> impl Future<Output = Result<T, CallError>>
where
    F: Future<Output = Result<T, zk::Error>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut sent = Some(call());
    async move {
        let mut pause = Duration::from_millis(25);
        loop {
            let request = match sent.take() {
                Some(request) => request,
                None => call(),
            };
            match tokio::time::timeout_at(deadline, request).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(err))
                    if connection_failure(&err)
                        && tokio::time::Instant::now() + pause < deadline =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(400));
                }
                Ok(Err(err)) => return Err(CallError::Zk(err)),
                Err(_) => return Err(CallError::TimedOut(timeout)),
            }
        }
    }
}
