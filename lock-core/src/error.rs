//! The one public error type.

use std::error::Error as StdError;
use std::fmt;

/// What went wrong, in a form callers can match on.
///
/// New kinds may be added; match with a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The lock is held by someone else and could not be had before the wait
    /// deadline (or, for a single try, at all).
    Contended,
    /// A single backend call did not answer within its operation timeout.
    /// The outcome of that call is unknown.
    Timeout,
    /// The lease is not (or no longer) ours: it was released, it expired, or
    /// another owner holds the key. Nothing was changed on the backend.
    NotHeld,
    /// The lease was lost while we held it (expired before it could be
    /// renewed, session expired, ...). Work protected by it must stop.
    LeaseLost,
    /// The backend could not be reached or refused to serve.
    Unavailable,
    /// An argument was rejected before anything was sent (bad key, TTL, ...).
    InvalidArgument,
    /// A configuration (URL, file, option) was rejected.
    Config,
    /// The backend cannot do what was asked (see its capabilities).
    Unsupported,
    /// The backend answered with an error of its own.
    Backend,
    /// The request was refused because granting it could deadlock (a
    /// reader asking to become a writer: two such readers would wait for
    /// each other for ever).
    WouldDeadlock,
}

impl ErrorKind {
    /// A short, stable, lowercase name (`"not_held"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Contended => "contended",
            Self::Timeout => "timeout",
            Self::NotHeld => "not_held",
            Self::LeaseLost => "lease_lost",
            Self::Unavailable => "unavailable",
            Self::InvalidArgument => "invalid_argument",
            Self::Config => "config",
            Self::Unsupported => "unsupported",
            Self::Backend => "backend",
            Self::WouldDeadlock => "would_deadlock",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The operation during which an error happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// Validating an argument before any call.
    Validate,
    /// Connecting or configuring a backend.
    Connect,
    /// A single acquire attempt.
    TryAcquire,
    /// Acquire, waiting up to a deadline.
    Acquire,
    /// Extending a lease.
    Renew,
    /// Giving a lease back.
    Release,
    /// Reading who holds a key.
    Inspect,
    /// Turning a write lease into a read lease.
    Downgrade,
    /// A write in the lock's own store guarded by the lease's ownership
    /// (an etcd transaction, a ZooKeeper `multi`, a Redis script, a SQL
    /// statement).
    GuardedWrite,
}

impl Operation {
    /// A short, stable, lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Validate => "validate",
            Self::Connect => "connect",
            Self::TryAcquire => "try_acquire",
            Self::Acquire => "acquire",
            Self::Renew => "renew",
            Self::Release => "release",
            Self::Inspect => "inspect",
            Self::Downgrade => "downgrade",
            Self::GuardedWrite => "guarded_write",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type Source = Box<dyn StdError + Send + Sync + 'static>;

/// The error every backend and the guard return.
///
/// It carries a [`kind`](Self::kind) to match on, the [`operation`](Self::operation)
/// and key as context, a human message, and the backend's own error as
/// [`source`](StdError::source). Messages never contain passwords.
pub struct LockError {
    kind: ErrorKind,
    operation: Operation,
    key: Option<String>,
    backend: Option<&'static str>,
    message: String,
    source: Option<Source>,
}

impl LockError {
    /// A new error of `kind` during `operation`.
    pub fn new(kind: ErrorKind, operation: Operation, message: impl Into<String>) -> Self {
        Self {
            kind,
            operation,
            key: None,
            backend: None,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the key the operation was about.
    #[must_use]
    pub fn with_key(mut self, key: impl fmt::Display) -> Self {
        self.key = Some(key.to_string());
        self
    }

    /// Attaches the backend's name (`"redis"`, `"memory"`, ...).
    #[must_use]
    pub fn with_backend(mut self, backend: &'static str) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Attaches the underlying error.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// The kind, to match on.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The operation that failed.
    pub fn operation(&self) -> Operation {
        self.operation
    }

    /// The key the operation was about, if any.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The backend's name, if attached.
    pub fn backend(&self) -> Option<&'static str> {
        self.backend
    }

    /// The message, without kind and context.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether trying again later may succeed (timeouts, unavailability,
    /// contention). Argument, configuration and ownership errors are final.
    pub fn is_temporary(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Timeout | ErrorKind::Unavailable | ErrorKind::Contended
        )
    }

    /// The lock was held by someone else until the deadline.
    pub fn is_contended(&self) -> bool {
        self.kind == ErrorKind::Contended
    }

    /// A backend call timed out (its outcome is unknown).
    pub fn is_timeout(&self) -> bool {
        self.kind == ErrorKind::Timeout
    }

    /// The lease is not ours (any more).
    pub fn is_not_held(&self) -> bool {
        self.kind == ErrorKind::NotHeld
    }

    /// The lease was lost while held.
    pub fn is_lost(&self) -> bool {
        self.kind == ErrorKind::LeaseLost
    }

    /// The backend could not be reached.
    pub fn is_unavailable(&self) -> bool {
        self.kind == ErrorKind::Unavailable
    }

    /// Shorthand for an invalid-argument error.
    pub fn invalid_argument(operation: Operation, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, operation, message)
    }

    /// Shorthand for a configuration error.
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config, Operation::Connect, message)
    }
}

impl fmt::Debug for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("LockError");
        d.field("kind", &self.kind)
            .field("operation", &self.operation)
            .field("message", &self.message);
        if let Some(key) = &self.key {
            d.field("key", key);
        }
        if let Some(backend) = self.backend {
            d.field("backend", &backend);
        }
        if let Some(source) = &self.source {
            d.field("source", source);
        }
        d.finish()
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(backend) = self.backend {
            write!(f, "{backend}: ")?;
        }
        write!(f, "{} failed ({})", self.operation, self.kind)?;
        if let Some(key) = &self.key {
            write!(f, " for key {key:?}")?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl StdError for LockError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_carries_context_and_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = LockError::new(ErrorKind::Unavailable, Operation::Acquire, "cannot connect")
            .with_key("jobs/a")
            .with_backend("redis")
            .with_source(io);
        let text = err.to_string();
        assert_eq!(
            text,
            "redis: acquire failed (unavailable) for key \"jobs/a\": cannot connect: refused"
        );
        assert!(err.is_temporary());
        assert!(err.source().is_some());
    }
}
