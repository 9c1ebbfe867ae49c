//! The ShedLock layout's renewals: one guarded `UPDATE` per lease.

use std::sync::Arc;

use lock_core::{
    ErrorKind, Lease, LockError, Operation, RENEW_CONCURRENCY, check_ttl, renew_concurrently,
    validity_deadline,
};
use tokio::time::Instant;

use crate::config::{MIN_TTL, NAME};
use crate::connection::shedlock::ShedTable;
use crate::connection::{ConnSet, retry_once};
use crate::error::timed;

/// The ShedLock layout's renewals.
pub(crate) struct ShedRenewal {
    inner: Arc<ShedTable>,
}

impl ShedRenewal {
    pub(crate) fn new(inner: Arc<ShedTable>) -> Self {
        Self { inner }
    }

    /// One renewal per lease.
    pub(crate) async fn renew(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        renew_concurrently(leases, RENEW_CONCURRENCY, |lease| self.renew_one(lease)).await
    }

    async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        let key = lease.key();
        let ttl = lease.ttl();
        check_ttl(ttl, MIN_TTL, Operation::Renew)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        let locked_by = self.inner.locked_by(lease.owner());
        let sql = &self.inner.sql;
        let sent_at = Instant::now();
        let renewed = timed(&self.inner.config, Operation::Renew, Some(key), async {
            retry_once!(&self.inner.conns, |conn| sql.renew(
                conn,
                key.as_str(),
                &locked_by,
                ttl
            ))
        })
        .await?;
        if renewed {
            Ok(validity_deadline(sent_at, ttl))
        } else {
            Err(LockError::new(
                ErrorKind::NotHeld,
                Operation::Renew,
                "the lease expired, was released, or belongs to someone else",
            )
            .with_key(key)
            .with_backend(NAME))
        }
    }
}
