//! A set of mutexes taken in one transaction: if no key of the set has an
//! entry under its prefix, put ours under each (with the session lease),
//! all in one revision; otherwise nothing is written.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use lock_core::{ErrorKind, Lease, LockError, LockKey, Operation, check_ttl, with_timeout};
use tokio::time::Instant;

use crate::config::MIN_TTL;
use crate::connection::{Connection, PendingEntry};
use crate::error::{NAME, from_etcd, protocol_error};
use crate::grants::{Grants, Layout};
use crate::keys::mutex_value;

/// The most keys one transaction takes: etcd's default `--max-txn-ops`
/// (a transaction holds at most that many compares and that many
/// operations). A larger set is refused with `Unsupported`, and so is a
/// set the server refuses as too large (a lower `--max-txn-ops`): the
/// multi-lock then takes the keys one by one.
pub(crate) const MAX_SET_KEYS: usize = 128;

/// Multi-locks: a set of mutexes in one transaction.
#[derive(Debug)]
pub(crate) struct Sets {
    conn: Arc<Connection>,
    grants: Grants,
}

#[async_trait]
impl lock_core::LockSets for Sets {
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        self.acquire_set(keys, ttl).await
    }
}

impl Sets {
    pub(crate) fn new(conn: Arc<Connection>, grants: Grants) -> Self {
        Self { conn, grants }
    }

    /// [`LockSets::try_acquire_all`](lock_core::LockSets::try_acquire_all):
    /// one transaction that compares every key's prefix to be empty and puts
    /// our entry under each; the tokens are that transaction's revision
    /// (each entry's create revision).
    async fn acquire_set(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        let op = Operation::TryAcquire;
        let first = keys.first().map_or("", LockKey::as_str);
        check_ttl(ttl, MIN_TTL, op).map_err(|e| e.with_key(first).with_backend(NAME))?;
        if keys.is_empty() {
            return Err(
                LockError::invalid_argument(op, "a set of keys needs at least one key")
                    .with_backend(NAME),
            );
        }
        let mut distinct = HashSet::with_capacity(keys.len());
        if let Some(twice) = keys.iter().find(|k| !distinct.insert(k.as_str())) {
            return Err(
                LockError::invalid_argument(op, "a set of keys names the same key twice")
                    .with_key(twice)
                    .with_backend(NAME),
            );
        }
        if keys.len() > MAX_SET_KEYS {
            return Err(too_large(first, keys.len()));
        }
        let session = self
            .conn
            .session_for(ttl, op)
            .await
            .map_err(|e| e.with_key(first))?;
        let prefixes: Vec<String> = keys.iter().map(|k| self.conn.key_prefix(k)).collect();
        let mut pending: Vec<PendingEntry<'_>> = prefixes
            .iter()
            .map(|prefix| self.conn.claim_pending(&session, prefix))
            .collect();
        let txn = Txn::new()
            .when(
                prefixes
                    .iter()
                    .map(|prefix| {
                        // On a range, etcd compares every key in it and, on
                        // an empty range, a missing key (create revision 0):
                        // true exactly when nothing is under the prefix.
                        Compare::create_revision(prefix.as_str(), CompareOp::Equal, 0).with_prefix()
                    })
                    .collect::<Vec<_>>(),
            )
            .and_then(
                pending
                    .iter()
                    .map(|p| {
                        TxnOp::put(
                            p.entry.as_str(),
                            mutex_value(p.owner),
                            Some(PutOptions::new().with_lease(session.lease_id())),
                        )
                    })
                    .collect::<Vec<_>>(),
            );
        let sent_at = Instant::now();
        let mut kv = self.conn.client.kv_client();
        // Until the answer comes, every entry may exist: dropped armed (an
        // error, a timeout, this future dropped), each is deleted in the
        // background and its name never reused.
        let response = with_timeout(self.conn.config.op_timeout, op, async {
            kv.txn(txn).await.map_err(|e| {
                if e.to_string().contains("too many operations") {
                    too_large(first, keys.len())
                } else {
                    from_etcd(op, e)
                }
            })
        })
        .await
        .map_err(|e| e.with_key(first).with_backend(NAME))?;
        if !response.succeeded() {
            // Nothing was written.
            for p in &mut pending {
                p.armed = false;
                session.free_entry(&p.entry);
            }
            return Ok(None);
        }
        let Some(revision) = response.header().map(|h| h.revision()).filter(|r| *r > 0) else {
            return Err(protocol_error(op, &keys[0], "no revision for the set"));
        };
        let mut leases = Vec::with_capacity(keys.len());
        for (key, mut entry) in keys.iter().zip(pending) {
            entry.revision = Some(revision);
            match entry
                .granted(key, ttl, sent_at, op)
                .exclusive(Layout::Mutex)
            {
                Ok(lease) => leases.push(lease),
                Err(err) => {
                    // The entries not yet granted are deleted as they drop;
                    // give back the ones granted.
                    for lease in &leases {
                        let _ = self.grants.release(lease).await;
                    }
                    return Err(err);
                }
            }
        }
        Ok(Some(leases))
    }
}

fn too_large(first: &str, count: usize) -> LockError {
    LockError::new(
        ErrorKind::Unsupported,
        Operation::TryAcquire,
        format!(
            "etcd takes at most {MAX_SET_KEYS} keys in one transaction, not {count}: the keys are taken one by one"
        ),
    )
    .with_key(first)
    .with_backend(NAME)
}
