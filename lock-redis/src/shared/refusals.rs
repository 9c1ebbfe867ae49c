//! What the shared kinds refuse: every kind on Redlock, a bad kind or TTL,
//! and the lease a script no longer finds.

use std::time::Duration;

use lock_core::{ErrorKind, LeaseKind, LockError, LockKey, Operation};

use crate::connection::Servers;
use crate::error::NAME;
use crate::grants::check_ttl;

/// Why Redlock has no read-write locks or semaphores.
pub(crate) const REDLOCK_WHY: &str = "Redlock does not provide read-write locks or semaphores: its \
    majority rule over independent nodes gives no consistent order of readers, writers or \
    permits across nodes (two majorities can each count a different set of holders), so \
    neither exclusion nor the permit limit could be promised";

/// Checks a request for a shared kind before anything is sent.
pub(crate) fn check_shared(
    servers: &Servers,
    key: &LockKey,
    kind: LeaseKind,
    ttl: Duration,
    op: Operation,
) -> Result<(), LockError> {
    check_ttl(ttl, op, key)?;
    kind.validate(op)
        .map_err(|e| e.with_backend(NAME).with_key(key))?;
    if servers.redlock {
        return Err(redlock_unsupported(key, op));
    }
    Ok(())
}

pub(crate) fn redlock_unsupported(key: &LockKey, op: Operation) -> LockError {
    LockError::new(ErrorKind::Unsupported, op, REDLOCK_WHY)
        .with_backend(NAME)
        .with_key(key)
}

pub(crate) fn not_held(op: Operation, key: &LockKey, why: &str) -> LockError {
    LockError::new(ErrorKind::NotHeld, op, why.to_owned())
        .with_backend(NAME)
        .with_key(key)
}
