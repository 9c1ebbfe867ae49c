//! Conversion of etcd client errors into [`LockError`].

use lock_core::{ErrorKind, LockError, LockKey, Operation};

pub(crate) const NAME: &str = "etcd";

// gRPC status codes, compared by value.
const CANCELLED: i32 = 1;
const UNKNOWN: i32 = 2;
const INVALID_ARGUMENT: i32 = 3;
const DEADLINE_EXCEEDED: i32 = 4;
const PERMISSION_DENIED: i32 = 7;
const ABORTED: i32 = 10;
const UNAVAILABLE: i32 = 14;
const UNAUTHENTICATED: i32 = 16;

/// Maps an etcd client error to a [`LockError`] of the right kind.
pub(crate) fn from_etcd(operation: Operation, err: etcd_client::Error) -> LockError {
    use etcd_client::Error as E;
    let kind = match &err {
        E::GRpcStatus(status) => {
            let message = status.message();
            if message.contains("lease not found") {
                ErrorKind::LeaseLost
            } else if is_certificate_rejection(&err.to_string()) {
                ErrorKind::Config
            } else {
                match i32::from(status.code()) {
                    UNAVAILABLE | CANCELLED | ABORTED => ErrorKind::Unavailable,
                    // A connection that broke (reset, broken pipe, a TLS
                    // alert from the server) is a "transport error", which
                    // tonic reports as Unknown. The request may not have
                    // arrived.
                    UNKNOWN if message.contains("transport error") => ErrorKind::Unavailable,
                    DEADLINE_EXCEEDED => ErrorKind::Timeout,
                    UNAUTHENTICATED | PERMISSION_DENIED => ErrorKind::Config,
                    // etcd answers a wrong user or password with
                    // InvalidArgument ("authentication failed, invalid user
                    // ID or password"), and a request without credentials to
                    // an auth-enabled server with "user name is empty".
                    INVALID_ARGUMENT
                        if message.contains("authentication failed")
                            || message.contains("user name is empty")
                            || message.contains("invalid auth token") =>
                    {
                        ErrorKind::Config
                    }
                    _ if message.contains("no leader")
                        || message.contains("leader changed")
                        || message.contains("timed out")
                        || message.contains("too many requests") =>
                    {
                        ErrorKind::Unavailable
                    }
                    _ => ErrorKind::Backend,
                }
            }
        }
        E::TransportError(_) | E::IoError(_) | E::EndpointError(_) => ErrorKind::Unavailable,
        E::InvalidArgs(_) | E::InvalidUri(_) | E::InvalidMetadataValue(_) => ErrorKind::Config,
        E::LeaseKeepAliveError(message) if message.contains("not found") => ErrorKind::LeaseLost,
        E::WatchError(_) | E::LeaseKeepAliveError(_) => ErrorKind::Unavailable,
        _ => ErrorKind::Backend,
    };
    LockError::new(kind, operation, "etcd call failed")
        .with_backend(NAME)
        .with_source(err)
}

/// Whether a TLS handshake failed on a certificate: ours rejecting the
/// server's (wrong CA or name, reported as "invalid peer certificate") or
/// the server rejecting ours (a TLS alert). Retrying does not help, so
/// these are configuration errors, like in the other drivers of the family.
/// `text` is the client error's Display, which shows the gRPC status'
/// source (where the rustls error is).
fn is_certificate_rejection(text: &str) -> bool {
    [
        "invalid peer certificate",
        "BadCertificate",
        "UnknownCA",
        "UnsupportedCertificate",
        "CertificateRequired",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// An answer this driver does not expect from etcd, as a `Backend` error.
pub(crate) fn protocol_error(op: Operation, key: &LockKey, why: &str) -> LockError {
    LockError::new(
        ErrorKind::Backend,
        op,
        format!("unexpected etcd answer: {why}"),
    )
    .with_key(key)
    .with_backend(NAME)
}

/// A lease grant the server answered without a lease (an error text, or no
/// TTL), as a `Backend` error naming `what` was granted; `None` when the
/// lease was granted.
pub(crate) fn grant_refused(
    op: Operation,
    what: &str,
    grant: &etcd_client::LeaseGrantResponse,
) -> Option<LockError> {
    (!grant.error().is_empty() || grant.ttl() <= 0).then(|| {
        LockError::new(
            ErrorKind::Backend,
            op,
            format!("{what} was refused: {}", grant.error()),
        )
        .with_backend(NAME)
    })
}

/// `err` as an error of `op` (the session start reports its own operation).
pub(crate) fn relabel(err: LockError, op: Operation) -> LockError {
    if err.operation() == op {
        return err;
    }
    let mut relabeled = LockError::new(err.kind(), op, err.message().to_owned()).with_backend(NAME);
    relabeled = relabeled.with_source(err);
    relabeled
}
