//! Operating locks: who holds a key (with the holder details stored in
//! its entry's value), breaking a stuck lock (`force_release`), and `gc`
//! (nothing to collect). Listing is in `listing.rs`.

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetResponse, KeyValue, Txn, TxnOp, WatchOptions,
};
use lock_core::{
    ErrorKind, FencingToken, GcReport, LockError, LockInfo, LockKey, Operation, with_timeout,
};
use tokio::time::{Instant, sleep_until};

use super::EtcdBackend;
use crate::error::{NAME, from_etcd};
use crate::keys::{self, value_details};

/// How many times `force_release` reads the holder and tries to delete it
/// when the holder changes in between.
const FORCE_ATTEMPTS: usize = 5;

/// The holder's entry of a key, as read.
pub(super) struct HolderEntry {
    pub(super) info: LockInfo,
    pub(super) entry: String,
    pub(super) revision: i64,
    pub(super) lease_id: i64,
}

impl EtcdBackend {
    /// The holder of `key` (its oldest entry), as `inspect` reports it.
    pub(super) async fn read_holder(
        &self,
        key: &LockKey,
        op: Operation,
    ) -> Result<Option<HolderEntry>, LockError> {
        Ok(self.read_holder_at(key, op).await?.0)
    }

    /// Waits until the mutex's holder is no longer `seen` (or `deadline`),
    /// waking on an etcd watch of the key's entries from the revision after
    /// the read, so a change between the read and the watch is not missed.
    /// No polling.
    pub(super) async fn watch_holder_of(
        &self,
        key: &LockKey,
        seen: Option<&LockInfo>,
        deadline: Instant,
    ) -> Result<Option<LockInfo>, LockError> {
        loop {
            let (holder, revision) = self.read_holder_at(key, Operation::Inspect).await?;
            let now = holder.map(|h| h.info);
            if !LockInfo::same_holder(now.as_ref(), seen) || Instant::now() >= deadline {
                return Ok(now);
            }
            let options = WatchOptions::new()
                .with_prefix()
                .with_start_revision(revision + 1);
            tokio::select! {
                () = sleep_until(deadline) => {}
                () = self.wait_change(self.key_prefix(key).into_bytes(), options, revision + 1) => {}
            }
        }
    }

    /// The oldest entry under `prefix` (the holder of a key, the leader of
    /// an election), with the store's revision, in one range read.
    pub(super) async fn read_oldest(
        &self,
        prefix: &str,
        op: Operation,
    ) -> Result<GetResponse, LockError> {
        let mut kv = self.inner.client.kv_client();
        with_timeout(self.inner.config.op_timeout, op, async {
            kv.get(prefix, Some(keys::oldest_entry()))
                .await
                .map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_backend(NAME))
    }

    /// The holder and the store's revision of the read.
    async fn read_holder_at(
        &self,
        key: &LockKey,
        op: Operation,
    ) -> Result<(Option<HolderEntry>, i64), LockError> {
        let key_prefix = self.key_prefix(key);
        let response = self
            .read_oldest(&key_prefix, op)
            .await
            .map_err(|e| e.with_key(key))?;
        let revision = response.header().map_or(0, |h| h.revision());
        let Some(holder) = response.kvs().first() else {
            return Ok((None, revision));
        };
        let remaining_ttl = self
            .remaining_ttl(&String::from_utf8_lossy(holder.key()), holder.lease(), op)
            .await;
        Ok((
            Some(holder_entry(key, &key_prefix, holder, remaining_ttl)),
            revision,
        ))
    }

    /// See [`lock_core::Admin::force_release`]: deletes the holder's
    /// entry in a transaction comparing its create revision (the holder
    /// read just before; read again if it changed in between).
    pub(super) async fn break_lock(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let op = Operation::Release;
        for _ in 0..FORCE_ATTEMPTS {
            let Some(holder) = self.read_holder(key, op).await? else {
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
                .txn(op, txn)
                .await
                .map_err(|e| e.with_key(key))?
                .succeeded();
            if deleted {
                if let Some(session) = self.session_by_lease(holder.lease_id) {
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

    /// See [`lock_core::Admin::gc`]: nothing to collect.
    pub(super) fn collect_garbage(&self) -> GcReport {
        GcReport::default()
    }
}

/// The holder `holder` (an entry under `key_prefix`) of `key`.
pub(super) fn holder_entry(
    key: &LockKey,
    key_prefix: &str,
    holder: &KeyValue,
    remaining_ttl: Option<Duration>,
) -> HolderEntry {
    let name = String::from_utf8_lossy(holder.key()).into_owned();
    let holder_name = name.strip_prefix(key_prefix).unwrap_or(&name).to_owned();
    let token = u64::try_from(holder.create_revision())
        .ok()
        .map(FencingToken::new);
    HolderEntry {
        info: LockInfo {
            key: key.clone(),
            holder: holder_name,
            token,
            remaining_ttl,
            details: value_details(holder.value()),
        },
        entry: name,
        revision: holder.create_revision(),
        lease_id: holder.lease(),
    }
}
