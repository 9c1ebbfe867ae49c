//! The mapping from the redis crate's errors (and the servers' error
//! replies) to [`LockError`] kinds, with this backend's name and every
//! secret scrubbed from the text.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use lock_core::{ErrorKind, LockError, LockKey, Operation, validity_deadline};
use redis::RedisError;
use std::time::Duration;
use tokio::time::Instant;

/// The backend's name in every error (and `LockBackend::name`).
pub(crate) const NAME: &str = "redis";

/// A Redis error as a [`LockError`] of the right kind, naming the node
/// `label`, with every secret scrubbed from the source text.
pub(crate) fn map_redis_error(
    label: &str,
    secrets: &[String],
    op: Operation,
    err: RedisError,
) -> LockError {
    use redis::ErrorKind as K;
    use redis::ServerErrorKind as S;
    let kind = if err.is_timeout() {
        ErrorKind::Timeout
    } else if is_tls_failure(&err) {
        // A TLS handshake that rustls refused (untrusted CA, name
        // mismatch): retrying will not help; the trust settings or the
        // URL must change.
        ErrorKind::Config
    } else if err.is_io_error() || err.is_connection_refusal() || err.is_connection_dropped() {
        ErrorKind::Unavailable
    } else {
        match err.kind() {
            K::AuthenticationFailed | K::InvalidClientConfig => ErrorKind::Config,
            K::Server(
                S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly | S::BusyLoading,
            )
            | K::ClusterConnectionNotFound
            | K::MasterNameNotFoundBySentinel
            | K::NoValidReplicasFoundBySentinel
            | K::EmptySentinelList => ErrorKind::Unavailable,
            _ if err.code() == Some("LOADING") => ErrorKind::Unavailable,
            _ if matches!(err.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM")) => ErrorKind::Config,
            _ => ErrorKind::Backend,
        }
    };
    LockError::new(kind, op, format!("redis node {label}"))
        .with_backend(NAME)
        .with_source(Redacted::new(&err, secrets))
}

/// Whether `err` comes from the TLS layer: a rustls error, or a host name
/// rustls cannot verify. The redis crate wraps them (a failed handshake is
/// an I/O error holding rustls's error), so the chain is searched, looking
/// inside the `Arc` and the `io::Error` that `source()` steps over.
fn is_tls_failure(err: &RedisError) -> bool {
    fn is_tls(err: &(dyn StdError + 'static)) -> bool {
        err.is::<rustls::Error>()
            || err.is::<rustls::pki_types::InvalidDnsNameError>()
            || err
                .downcast_ref::<Arc<dyn StdError + Send + Sync>>()
                .is_some_and(|inner| is_tls(&**inner))
            || err
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .is_some_and(|inner| is_tls(inner))
    }
    let mut next: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(err) = next {
        if is_tls(err) {
            return true;
        }
        next = err.source();
    }
    false
}

pub(crate) fn needs_reconnect(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.is_unrecoverable_error()
        || err.code() == Some("READONLY")
        || err.code() == Some("MASTERDOWN")
}

/// A backend error as text with every secret scrubbed out.
#[derive(Debug)]
pub(crate) struct Redacted(String);

impl Redacted {
    pub(crate) fn new(err: &dyn fmt::Display, secrets: &[String]) -> Self {
        let mut text = err.to_string();
        for secret in secrets {
            text = text.replace(secret.as_str(), "<redacted>");
        }
        Self(text)
    }
}

impl fmt::Display for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Redacted {}

/// A script answered something it never returns.
pub(crate) fn unexpected(op: Operation, answer: &dyn fmt::Debug) -> LockError {
    LockError::new(
        ErrorKind::Backend,
        op,
        format!("unexpected answer from the lock script: {answer:?}"),
    )
    .with_backend(NAME)
}

/// The validity deadline a renewal of a `ttl` lease sent at `sent_at`
/// gives; `LeaseLost` when its answer came after that deadline.
pub(crate) fn renewed_until(
    sent_at: Instant,
    ttl: Duration,
    op: Operation,
) -> Result<Instant, LockError> {
    let deadline = validity_deadline(sent_at, ttl);
    if deadline > Instant::now() {
        return Ok(deadline);
    }
    Err(LockError::new(
        ErrorKind::LeaseLost,
        op,
        "the renewal arrived after its validity deadline",
    )
    .with_backend(NAME))
}

/// A copy of `err` (a pipeline's failure) for each renewal it carried.
pub(crate) fn copy_for_each(err: &LockError, op: Operation) -> LockError {
    LockError::new(err.kind(), op, err.to_string()).with_backend(NAME)
}

/// A waiting acquire's deadline passed with the key still held.
pub(crate) fn still_held(key: &LockKey) -> LockError {
    LockError::new(
        ErrorKind::Contended,
        Operation::Acquire,
        "the key was still held at the deadline",
    )
    .with_backend(NAME)
    .with_key(key)
}
