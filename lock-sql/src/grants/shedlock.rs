//! The ShedLock layout's grants: one upsert on ShedLock's row that also
//! bumps our token in the tokens table, the release and renewal guarded by
//! our `locked_by`, the holder as the rows show it, and polling waits
//! (ShedLock's table has no notification).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    ErrorKind, FencingToken, GrantRequest, Lease, LockError, LockInfo, LockKey, Operation, OwnerId,
    check_ttl,
};
use tokio::time::Instant;

use super::{MutexOnly, mutex_lease};
use crate::config::{MIN_TTL, NAME};
use crate::connection::shedlock::ShedTable;
use crate::connection::{ConnSet, retry_once};
use crate::error::timed;
use crate::keys::shedlock::{SHEDLOCK_MAX_NAME, is_conflict, is_ours};

/// The ShedLock layout's grants, release and holder.
pub(crate) struct ShedGrants {
    inner: Arc<ShedTable>,
}

#[async_trait]
impl MutexOnly for ShedGrants {
    /// The try-once grant, or one that polls until the request's deadline.
    async fn take(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let (key, ttl) = (request.key, request.ttl);
        let Some(deadline) = request.deadline else {
            return self.try_once(key, ttl, Operation::TryAcquire).await;
        };
        let poll = self.inner.config.poll;
        let mut backoff = poll.backoff();
        loop {
            if let Some(lease) = self.try_once(key, ttl, Operation::Acquire).await? {
                return Ok(Some(lease));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(LockError::new(
                    ErrorKind::Contended,
                    Operation::Acquire,
                    "still held (by ShedLock or by us) at the wait deadline",
                )
                .with_key(key)
                .with_backend(NAME));
            }
            let delay = backoff.next_delay().unwrap_or(poll.max);
            tokio::time::sleep_until((now + delay).min(deadline)).await;
        }
    }

    /// The key's holder as the rows show it.
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let sql = &self.inner.sql;
        let row = timed(&self.inner.config, Operation::Inspect, Some(key), async {
            retry_once!(read, &self.inner.conns, |conn| sql
                .inspect(conn, key.as_str()))
        })
        .await?;
        Ok(
            row.map(|(locked_by, token, remaining_us, details)| LockInfo {
                details: crate::keys::shedlock::details_of(&locked_by, details.as_deref()),
                key: key.clone(),
                // A ShedLock holder's token is not its own: none.
                token: token
                    .filter(|_| is_ours(&locked_by))
                    .and_then(|t| u64::try_from(t).ok())
                    .map(FencingToken::new),
                holder: locked_by,
                remaining_ttl: Some(crate::dialect::remaining(remaining_us)),
            }),
        )
    }
}

impl ShedGrants {
    pub(crate) fn new(inner: Arc<ShedTable>) -> Self {
        Self { inner }
    }

    /// The release guarded by our `locked_by`.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let key = lease.key();
        let locked_by = self.inner.locked_by(lease.owner());
        let sql = &self.inner.sql;
        timed(&self.inner.config, Operation::Release, Some(key), async {
            retry_once!(&self.inner.conns, |conn| sql.release(
                conn,
                key.as_str(),
                &locked_by
            ))
        })
        .await
    }

    /// One grant with its recovery: a grant whose connection broke may
    /// have committed before its reply was lost; the retry on a fresh
    /// connection cannot grant twice (our row is unexpired), and one
    /// inspect says whether the holder is us.
    async fn grant_row(
        &self,
        key: &LockKey,
        locked_by: &str,
        ttl: Duration,
    ) -> Result<Option<i64>, sqlx::Error> {
        let (sql, conns) = (&self.inner.sql, &self.inner.conns);
        let mut conflicts = 0;
        loop {
            let mut checkout = conns.checkout(false).await?;
            let mut result = sql
                .grant(checkout.conn(), key.as_str(), ttl, locked_by)
                .await;
            if checkout.finish(&result) {
                let mut checkout = conns.checkout(true).await?;
                result = async {
                    let conn = checkout.conn();
                    if let Some(token) = sql.grant(conn, key.as_str(), ttl, locked_by).await? {
                        return Ok(Some(token));
                    }
                    Ok(sql
                        .inspect(conn, key.as_str())
                        .await?
                        .and_then(|(by, token, _, _)| token.filter(|_| by == locked_by)))
                }
                .await;
                checkout.finish(&result);
            }
            match result {
                Err(e) if is_conflict(&e) && conflicts < 5 => {
                    conflicts += 1;
                    tokio::time::sleep(lock_core::random_delay(Duration::from_millis(2))).await;
                }
                other => return other,
            }
        }
    }

    fn check_key(key: &LockKey, operation: Operation) -> Result<(), LockError> {
        if key.as_str().chars().count() > SHEDLOCK_MAX_NAME {
            return Err(LockError::new(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "a ShedLock lock name has at most {SHEDLOCK_MAX_NAME} characters \
                     (its name VARCHAR(64) column)"
                ),
            )
            .with_key(key)
            .with_backend(NAME));
        }
        Ok(())
    }

    async fn try_once(
        &self,
        key: &LockKey,
        ttl: Duration,
        operation: Operation,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(ttl, MIN_TTL, operation).map_err(|e| e.with_key(key).with_backend(NAME))?;
        Self::check_key(key, operation)?;
        let owner = OwnerId::random();
        let locked_by = self.inner.locked_by(owner);
        let sent_at = Instant::now();
        let grant = self.grant_row(key, &locked_by, ttl);
        let granted = timed(&self.inner.config, operation, Some(key), grant).await?;
        let token = granted.map(|token| FencingToken::new(u64::try_from(token).unwrap_or(0)));
        mutex_lease(token, key, owner, ttl, sent_at, |stale| async move {
            let _ = self.release(&stale).await;
        })
        .await
    }
}
