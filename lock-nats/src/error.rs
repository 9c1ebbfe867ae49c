//! From async-nats's errors to [`LockError`] kinds.

use std::error::Error as StdError;

use lock_core::{ErrorKind, LockError, LockKey, Operation};

use crate::NAME;

/// A request that got no answer in time.
pub(crate) fn timed_out(operation: Operation, key: Option<&LockKey>) -> LockError {
    let error = LockError::new(
        ErrorKind::Timeout,
        operation,
        "the NATS server did not answer in time",
    )
    .with_backend(NAME);
    match key {
        Some(key) => error.with_key(key),
        None => error,
    }
}

/// An error of the client: a timeout, a closed connection or a missing
/// stream is `Unavailable` (a retry may help), the rest `Backend`.
pub(crate) fn client_error<E>(operation: Operation, key: &LockKey, error: E) -> LockError
where
    E: StdError + Send + Sync + 'static,
{
    let text = error.to_string().to_ascii_lowercase();
    let kind = if text.contains("timed out")
        || text.contains("timeout")
        || text.contains("broken pipe")
        || text.contains("disconnect")
        || text.contains("no responders")
        || text.contains("not found")
        || text.contains("no stream")
        || text.contains("unavailable")
        || text.contains("503")
        || text.contains("connection")
    {
        ErrorKind::Unavailable
    } else {
        ErrorKind::Backend
    };
    LockError::new(kind, operation, "NATS JetStream key-value request failed")
        .with_key(key)
        .with_backend(NAME)
        .with_source(error)
}

/// An error while connecting or opening the bucket.
pub(crate) fn connect_error<E>(kind: ErrorKind, message: &str, error: E) -> LockError
where
    E: StdError + Send + Sync + 'static,
{
    LockError::new(kind, Operation::Connect, message.to_owned())
        .with_backend(NAME)
        .with_source(error)
}
