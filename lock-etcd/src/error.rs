//! Conversion of etcd client errors into [`LockError`].

use lock_core::{ErrorKind, LockError, Operation};

pub(crate) const NAME: &str = "etcd";

// gRPC status codes, compared by value (tonic is not a direct dependency).
const CANCELLED: i32 = 1;
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
            } else {
                match i32::from(status.code()) {
                    UNAVAILABLE | CANCELLED | ABORTED => ErrorKind::Unavailable,
                    DEADLINE_EXCEEDED => ErrorKind::Timeout,
                    UNAUTHENTICATED | PERMISSION_DENIED => ErrorKind::Config,
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
