//! A grant the database confirmed, turned into its lease (or given back
//! when it arrived too late): one path for the mutex, ShedLock and shared
//! grants.

use std::time::Duration;

use lock_core::{FencingToken, Lease, LeaseKind, LockError, LockKey, OwnerId};
use tokio::time::Instant;

use crate::driver::NAME;

/// A grant the database confirmed: `token` for `key` and `owner`, asked
/// for at `sent_at`.
pub(crate) struct Grant<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) owner: OwnerId,
    pub(crate) token: FencingToken,
    pub(crate) kind: LeaseKind,
    pub(crate) ttl: Duration,
    pub(crate) sent_at: Instant,
}

impl Grant<'_> {
    /// The grant's lease; when it arrived too late to be of use (after its
    /// validity deadline), `give_back` releases it rather than let it
    /// block others until its TTL, and the lease's error is returned.
    pub(crate) async fn lease_or_give_back<F: Future<Output = ()>>(
        self,
        give_back: impl FnOnce(Lease) -> F,
    ) -> Result<Lease, LockError> {
        let Self {
            key,
            owner,
            token,
            kind,
            ttl,
            sent_at,
        } = self;
        match Lease::granted(key.clone(), owner, token, ttl, sent_at, String::new()) {
            Ok(lease) => Ok(lease.with_kind(kind)),
            Err(err) => {
                let stale =
                    Lease::from_parts(key.clone(), owner, token, ttl, sent_at, String::new());
                give_back(stale.with_kind(kind)).await;
                Err(err.with_backend(NAME))
            }
        }
    }
}
