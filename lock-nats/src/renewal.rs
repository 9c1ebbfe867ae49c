//! [`Renewal`]: renewing and releasing grants with writes conditioned on
//! the key's last revision.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use lock_core::{ErrorKind, Lease, LockError, Operation, OwnerId, validity_deadline};
use tokio::time::Instant;

use crate::NAME;
use crate::connection::{Change, Connection, MARKER_TTL, Write};
use crate::keys::{Value, kv_key};

/// Renews (an update with a fresh TTL) and releases (a purge) a grant,
/// each conditioned on the key's last revision: the one this backend
/// last wrote for the owner, so a renewal or a release is one round trip.
/// When that revision is unknown (a lease from a handle) or stale, the
/// entry is read and the write goes ahead only if it still names the
/// owner.
#[derive(Debug)]
pub(crate) struct Renewal {
    connection: Arc<Connection>,
    revisions: Mutex<HashMap<OwnerId, u64>>,
}

impl Renewal {
    pub(crate) fn new(connection: Arc<Connection>) -> Self {
        Self {
            connection,
            revisions: Mutex::default(),
        }
    }

    /// Remembers the revision `owner` last wrote.
    pub(crate) fn remember(&self, owner: OwnerId, revision: u64) {
        self.revisions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(owner, revision);
    }

    /// The revision this backend last wrote for the lease's owner, or
    /// (a lease it did not grant: from a handle, or forged) the key's
    /// current revision if the entry names the owner.
    async fn last_known(
        &self,
        operation: Operation,
        lease: &Lease,
    ) -> Result<Option<u64>, LockError> {
        let known = self
            .revisions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&lease.owner())
            .copied();
        match known {
            Some(revision) => Ok(Some(revision)),
            None => self.current(operation, lease).await,
        }
    }

    fn forget(&self, owner: OwnerId) {
        self.revisions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&owner);
    }

    /// The key's current revision if it is still `lease`'s grant.
    async fn current(&self, operation: Operation, lease: &Lease) -> Result<Option<u64>, LockError> {
        let last = self
            .connection
            .last(operation, lease.key(), &kv_key(lease.key()))
            .await?;
        Ok(last
            .filter(|l| l.is_value && Value::decode(&l.value).is(lease.owner()))
            .map(|l| l.revision))
    }

    /// Renews one lease for its TTL.
    pub(crate) async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        let key = lease.key();
        let kv = kv_key(key);
        let value = Value::encode(lease.owner(), Some(lease.token()));
        let mut expected = self.last_known(Operation::Renew, lease).await?;
        while let Some(revision) = expected.take() {
            let sent_at = Instant::now();
            let change = Change::Put(value.clone());
            match self
                .connection
                .write(Operation::Renew, key, &kv, change, revision, lease.ttl())
                .await?
            {
                Write::Stored(revision) => {
                    self.remember(lease.owner(), revision);
                    return Ok(validity_deadline(sent_at, lease.ttl()));
                }
                // Written meanwhile by another backend value of the owner
                // (a handle): once more at the current revision.
                Write::Conflict => {
                    expected = self
                        .current(Operation::Renew, lease)
                        .await?
                        .filter(|&current| current != revision);
                }
            }
        }
        self.forget(lease.owner());
        Err(LockError::new(
            ErrorKind::NotHeld,
            Operation::Renew,
            "the key is no longer this lease's (expired, released or taken by another)",
        )
        .with_key(key)
        .with_backend(NAME))
    }

    /// Releases one lease: the revision of the purge marker it left, or
    /// `None` when it was no longer held.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<Option<u64>, LockError> {
        let key = lease.key();
        let kv = kv_key(key);
        let mut expected = self.last_known(Operation::Release, lease).await?;
        while let Some(revision) = expected.take() {
            match self
                .connection
                .write(
                    Operation::Release,
                    key,
                    &kv,
                    Change::Purge,
                    revision,
                    MARKER_TTL,
                )
                .await?
            {
                Write::Stored(marker) => {
                    self.forget(lease.owner());
                    return Ok(Some(marker));
                }
                Write::Conflict => {
                    expected = self
                        .current(Operation::Release, lease)
                        .await?
                        .filter(|&current| current != revision);
                }
            }
        }
        self.forget(lease.owner());
        Ok(None)
    }
}
