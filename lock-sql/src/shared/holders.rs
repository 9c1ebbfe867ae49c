//! Renewal, release, downgrade and listing of read, write and permit
//! leases: one statement each on the holders table. A listed holder
//! carries the details its grant wrote (`None` for a row written before
//! the `details` column existed).

use std::sync::Arc;

use lock_core::{
    ErrorKind, HolderInfo, Lease, LeaseKind, LockError, LockKey, LockShape, Operation, check_ttl,
    validity_deadline,
};
use tokio::time::Instant;

use crate::config::{MIN_TTL, NAME};
use crate::connection::{ConnSet, retry_once};
use crate::dialect::binds::{Bind, Value, execute, fetch};
use crate::dialect::{micros, token_of};
use crate::error::timed;

use super::Shared;

impl Shared {
    /// A statement on a holder row, once more on a fresh connection when
    /// the connection broke (all are idempotent or report `false` the
    /// second time): the rows it changed.
    pub(crate) async fn holder_statement(
        &self,
        key: &LockKey,
        statement: &Arc<str>,
        binds: &[Bind<'_>],
        returns_rows: bool,
        operation: Operation,
    ) -> Result<u64, LockError> {
        let conns = &self.inner.conns;
        timed(&self.inner.config, operation, Some(key), async {
            retry_once!(conns, |conn| async {
                if returns_rows {
                    fetch(conn, statement, binds, "")
                        .await
                        .map(|rows| rows.len() as u64)
                } else {
                    execute(conn, statement, binds).await
                }
            })
        })
        .await
    }

    /// A statement that frees part of a key's holding (a release, a
    /// downgrade), with `binds` and, where the shared statements notify,
    /// the release channel after them (the statement then answers a row per
    /// change, see [`Dialect::notifying`](crate::dialect::Dialect::notifying)):
    /// the rows changed.
    async fn freeing<'a>(
        &'a self,
        key: &LockKey,
        statement: &Arc<str>,
        mut binds: Vec<Bind<'a>>,
        operation: Operation,
    ) -> Result<u64, LockError> {
        let notifies = self.inner.shared.notifies;
        if notifies {
            binds.push(Bind::Text(&self.inner.channel));
        }
        self.holder_statement(key, statement, &binds, notifies, operation)
            .await
    }

    fn not_held(lease: &Lease, operation: Operation) -> LockError {
        LockError::new(
            ErrorKind::NotHeld,
            operation,
            "the lease expired, was released, or belongs to someone else",
        )
        .with_key(lease.key())
        .with_backend(NAME)
    }

    /// `renew` of a read, write or permit lease.
    pub(crate) async fn renew_share(&self, lease: &Lease) -> Result<Instant, LockError> {
        let (key, kind, ttl) = (lease.key(), lease.kind(), lease.ttl());
        check_ttl(ttl, MIN_TTL, Operation::Renew)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        let (owner, code) = (lease.owner().to_hex(), kind.code());
        let binds = [
            Bind::Int(micros(ttl)),
            Bind::Text(key.as_str()),
            Bind::Text(kind.shape().as_str()),
            Bind::Text(&owner),
            Bind::Int(token_of(lease)),
            Bind::Text(&code),
        ];
        let sent_at = Instant::now();
        let statement = &self.inner.shared.renew;
        match self
            .holder_statement(key, statement, &binds, false, Operation::Renew)
            .await?
        {
            1 => Ok(validity_deadline(sent_at, ttl)),
            _ => Err(Self::not_held(lease, Operation::Renew)),
        }
    }

    /// Wakes the process's waiters for `key` where the database does not
    /// notify them.
    fn woke(&self, key: &LockKey) {
        if !self.inner.shared.notifies {
            self.inner.waits.released(key.as_str());
        }
    }

    /// `release` of a read, write or permit lease.
    pub(crate) async fn release_share(&self, lease: &Lease) -> Result<bool, LockError> {
        let (key, kind) = (lease.key(), lease.kind());
        let (owner, code) = (lease.owner().to_hex(), kind.code());
        let binds = vec![
            Bind::Text(key.as_str()),
            Bind::Text(kind.shape().as_str()),
            Bind::Text(&owner),
            Bind::Int(token_of(lease)),
            Bind::Text(&code),
        ];
        let release = &self.inner.shared.release;
        let released = self
            .freeing(key, release, binds, Operation::Release)
            .await?
            == 1;
        if released {
            self.woke(key);
        }
        Ok(released)
    }

    /// `downgrade`: our live write row becomes a read row in one
    /// statement (same owner, token and expiry).
    pub(crate) async fn downgrade_share(&self, lease: &Lease) -> Result<Lease, LockError> {
        let key = lease.key();
        if lease.kind() != LeaseKind::Write {
            return Err(Self::not_held(lease, Operation::Downgrade));
        }
        let owner = lease.owner().to_hex();
        let binds = vec![
            Bind::Text(key.as_str()),
            Bind::Text(LockShape::ReadWrite.as_str()),
            Bind::Text(&owner),
            Bind::Int(token_of(lease)),
        ];
        let downgrade = &self.inner.shared.downgrade;
        let changed = self
            .freeing(key, downgrade, binds, Operation::Downgrade)
            .await?;
        if changed != 1 {
            return Err(Self::not_held(lease, Operation::Downgrade));
        }
        self.woke(key);
        Ok(Lease::from_parts(
            key.clone(),
            lease.owner(),
            lease.token(),
            lease.ttl(),
            lease.validity_deadline(),
            String::new(),
        )
        .with_kind(LeaseKind::Read))
    }

    /// `holders` of a read-write lock or a semaphore.
    pub(crate) async fn share_holders(
        &self,
        key: &LockKey,
        shape: LockShape,
    ) -> Result<Vec<HolderInfo>, LockError> {
        let operation = Operation::Inspect;
        let conns = &self.inner.conns;
        let statement = &self.inner.shared.list;
        let binds = [Bind::Text(key.as_str()), Bind::Text(shape.as_str())];
        let rows = timed(&self.inner.config, operation, Some(key), async {
            retry_once!(read, conns, |conn| fetch(conn, statement, &binds, "ttiit"))
        })
        .await?;
        rows.iter()
            .map(|r| holder_info(r).map_err(|e| e.with_key(key).with_backend(NAME)))
            .collect()
    }
}

/// A live holder row `(owner, kind, token, left µs, details)` as
/// [`HolderInfo`].
///
/// # Errors
///
/// `InvalidArgument` for a kind code this version does not know.
pub(crate) fn holder_info(r: &[Value]) -> Result<HolderInfo, LockError> {
    let (token, remaining_ttl, details) = crate::admin::holder_columns(&r[2..]);
    Ok(HolderInfo {
        kind: LeaseKind::from_code(r[1].text())?,
        holder: r[0].text().to_owned(),
        token,
        remaining_ttl,
        details,
    })
}
