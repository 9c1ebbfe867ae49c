//! From the file system's errors to [`LockError`] kinds.

use std::io;

use lock_core::{ErrorKind, LockError, LockKey, Operation};

use crate::NAME;

/// An I/O error of `operation` on `key`'s files: a directory that went
/// away or stopped being writable is `Unavailable` (it may come back); a
/// corrupt counter and everything else is `Backend`.
pub(crate) fn io_error(operation: Operation, key: &LockKey, error: io::Error) -> LockError {
    let kind = match error.kind() {
        io::ErrorKind::NotFound
        | io::ErrorKind::PermissionDenied
        | io::ErrorKind::ReadOnlyFilesystem
        | io::ErrorKind::StorageFull => ErrorKind::Unavailable,
        _ => ErrorKind::Backend,
    };
    LockError::new(kind, operation, "lock file")
        .with_key(key)
        .with_backend(NAME)
        .with_source(error)
}

/// A blocking task of ours that did not finish (it panicked, or the
/// runtime is shutting down).
pub(crate) fn task_error(
    operation: Operation,
    key: &LockKey,
    error: tokio::task::JoinError,
) -> LockError {
    LockError::new(
        ErrorKind::Backend,
        operation,
        "file lock task did not finish",
    )
    .with_key(key)
    .with_backend(NAME)
    .with_source(error)
}
