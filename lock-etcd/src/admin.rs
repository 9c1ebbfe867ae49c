//! Operating locks: breaking a stuck lock (`force_release`), `gc`
//! (nothing to collect), watching a key's holder, and listing (in
//! `admin/listing.rs`): the `Admin`, `Listing` and `HolderWatch` facets.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp, WatchOptions};
use lock_core::election::ElectionPage;
use lock_core::{
    ErrorKind, GcReport, ListQuery, LockError, LockInfo, LockKey, LockPage, LockShape, Operation,
    SharedPage, WatchRequest,
};
use tokio::time::{Instant, sleep_until};

use crate::connection::Connection;
use crate::elections::Elections;
use crate::error::NAME;
use crate::grants::Grants;
use crate::shared::Shared;
use crate::waiting::Waiting;

// list, list_shared, list_elections: one range read per page.
mod listing;

/// How many times `force_release` reads the holder and tries to delete it
/// when the holder changes in between.
const FORCE_ATTEMPTS: usize = 5;

/// The operating calls: the `Admin`, `Listing` and `HolderWatch` facets.
#[derive(Debug)]
pub(crate) struct Admin {
    conn: Arc<Connection>,
    grants: Grants,
    waiting: Waiting,
    shared: Shared,
    elections: Elections,
}

#[async_trait]
impl lock_core::Admin for Admin {
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.break_lock(key).await
    }

    /// Nothing to collect: etcd keeps no state of a released key (its
    /// entries go with the release, and tokens are the store's global
    /// revisions, which never go back). See the crate docs.
    async fn gc(&self, _older_than: Duration) -> Result<GcReport, LockError> {
        Ok(GcReport::default())
    }
}

#[async_trait]
impl lock_core::Listing for Admin {
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        self.list_locks(query).await
    }

    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        self.list_shared_locks(shape, query).await
    }

    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        self.list_led_elections(query).await
    }
}

#[async_trait]
impl lock_core::HolderWatch for Admin {
    async fn watch_holder(
        &self,
        request: WatchRequest<'_, LockInfo>,
    ) -> Result<Option<LockInfo>, LockError> {
        self.watch_holder_of(request.key, request.seen, request.deadline)
            .await
    }
}

impl Admin {
    pub(crate) fn new(
        conn: Arc<Connection>,
        grants: Grants,
        waiting: Waiting,
        shared: Shared,
        elections: Elections,
    ) -> Self {
        Self {
            conn,
            grants,
            waiting,
            shared,
            elections,
        }
    }

    /// Waits until the mutex's holder is no longer `seen` (or `deadline`),
    /// waking on an etcd watch of the key's entries from the revision after
    /// the read, so a change between the read and the watch is not missed.
    /// No polling.
    async fn watch_holder_of(
        &self,
        key: &LockKey,
        seen: Option<&LockInfo>,
        deadline: Instant,
    ) -> Result<Option<LockInfo>, LockError> {
        loop {
            let (holder, revision) = self.grants.read_holder_at(key, Operation::Inspect).await?;
            let now = holder.map(|h| h.info);
            if !LockInfo::same_holder(now.as_ref(), seen) || Instant::now() >= deadline {
                return Ok(now);
            }
            let options = WatchOptions::new()
                .with_prefix()
                .with_start_revision(revision + 1);
            tokio::select! {
                () = sleep_until(deadline) => {}
                () = self.waiting.wait_change(self.conn.key_prefix(key).into_bytes(), options, revision + 1) => {}
            }
        }
    }

    /// See [`lock_core::Admin::force_release`]: deletes the holder's
    /// entry in a transaction comparing its create revision (the holder
    /// read just before; read again if it changed in between).
    async fn break_lock(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let op = Operation::Release;
        for _ in 0..FORCE_ATTEMPTS {
            let Some(holder) = self.grants.read_holder(key, op).await? else {
                return Ok(None);
            };
            let txn = Txn::new()
                .when([Compare::create_revision(
                    holder.entry.as_str(),
                    CompareOp::Equal,
                    holder.revision,
                )])
                .and_then([TxnOp::delete(holder.entry.as_str(), None::<DeleteOptions>)]);
            let deleted = self
                .conn
                .txn(op, txn)
                .await
                .map_err(|e| e.with_key(key))?
                .succeeded();
            if deleted {
                if let Some(session) = self.conn.session_by_lease(holder.lease_id) {
                    session.forget_grant(&holder.entry, holder.revision);
                }
                tracing::warn!(
                    %key,
                    holder = %holder.info.holder,
                    token = holder.revision,
                    "lock force-released"
                );
                return Ok(Some(holder.info));
            }
        }
        Err(LockError::new(
            ErrorKind::Contended,
            op,
            format!("the holder changed during each of {FORCE_ATTEMPTS} attempts to break it"),
        )
        .with_key(key)
        .with_backend(NAME))
    }
}
