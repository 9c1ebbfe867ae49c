//! Read-write locks and semaphores: one entry per reader, writer or permit
//! lease under the shape's own prefix, ordered by create revision (see the
//! crate docs for the layout and what each token promises).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions, WatchResponse,
};
use lock_core::{
    ErrorKind, FencingToken, HolderDetails, HolderInfo, Lease, LeaseKind, LockError, LockKey,
    LockShape, Operation, OwnerId, SessionState, check_ttl,
};
use tokio::time::{Instant, sleep, sleep_until};

use crate::config::MIN_TTL;
use crate::connection::{Connection, Session, clean_up_later, lock, txn_on};
use crate::error::{NAME, protocol_error};
use crate::grants::{EntryGrant, Grant, Grants};
use crate::keys::{
    Created, entry_value, epoch_key, parse_shared_value, shared_delete, shared_lease_data,
    shared_owner_compares,
};
use crate::waiting::{Seen, Waiting, held_at_deadline, session_lost, start_over};

// Waiting for a turn: the re-checks and their watches.
mod wait;

// Release, downgrade and holders of shared leases.
mod ops;

pub(crate) use ops::granted_shares;

/// One entry of a shared shape as read from the server.
pub(crate) struct Share {
    key: Vec<u8>,
    create_revision: i64,
    mod_revision: i64,
    lease: i64,
    /// `None` for a value this crate did not write (counted as conflicting).
    kind: Option<LeaseKind>,
    owner: String,
    /// The holder details in its value (`None` for an earlier version's).
    details: Option<HolderDetails>,
}

impl Share {
    pub(crate) fn of(kv: &KeyValue) -> Self {
        let parsed = parse_shared_value(kv.value());
        let (kind, owner, details) = match parsed {
            Some(value) => (Some(value.kind), value.owner.to_owned(), value.details),
            None => (None, String::new(), None),
        };
        Self {
            key: kv.key().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            lease: kv.lease(),
            kind,
            owner,
            details,
        }
    }

    /// Whether it keeps a reader behind it out: a writer, or unknown.
    fn blocks_readers(&self) -> bool {
        !matches!(self.kind, Some(LeaseKind::Read))
    }

    /// Permits it counts against `limit` (unknown values count as all).
    fn permits(&self, limit: u32) -> u64 {
        match self.kind {
            Some(LeaseKind::Permits { count, .. }) => u64::from(count),
            _ => u64::from(limit),
        }
    }
}

fn shares(response: Option<&TxnOpResponse>) -> Vec<Share> {
    match response {
        Some(TxnOpResponse::Get(get)) => get.kvs().iter().map(Share::of).collect(),
        _ => Vec::new(),
    }
}

fn mod_revision_of(response: Option<&TxnOpResponse>) -> i64 {
    match response {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().map_or(0, KeyValue::mod_revision),
        _ => 0,
    }
}

/// Every entry under a shape's prefix, oldest first.
fn all_entries() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
}

/// The entries created before `my_revision`, newest first.
fn entries_before(my_revision: i64) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_max_create_revision(my_revision - 1)
}

/// What the create transaction of a shared entry found.
struct SharedCreated {
    /// Our entry was created by this transaction (not found existing: then
    /// nothing else was read, and the waiting path decides).
    fresh: bool,
    /// A writer granted in the create itself (no entry under the prefix).
    granted_at_once: bool,
    /// The other entries (all older than ours) when ours was created.
    others: Vec<Share>,
    /// The epoch key's mod revision in the same revision (0: none).
    epoch: i64,
}

/// Where a waiting grant stands after one re-check.
enum Turn {
    /// Granted, with this token.
    Granted(u64),
    /// Wait for `key` (created at the revision) to change, from `from`.
    WaitFor {
        key: Vec<u8>,
        create_revision: i64,
        from: i64,
        with_puts: bool,
    },
    /// Wait for any entry before ours to go (semaphores).
    WaitAny { before: usize, from: i64 },
    /// Our entry is gone.
    Lost(String),
}

/// Read-write locks and semaphores: their grants, releases, downgrades and
/// holders.
#[derive(Clone, Debug)]
pub(crate) struct Shared {
    conn: Arc<Connection>,
    grants: Grants,
    waiting: Waiting,
}

#[async_trait]
impl lock_core::Downgrade for Shared {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.downgrade_shared(lease).await
    }
}

impl Shared {
    pub(crate) fn new(conn: Arc<Connection>, grants: Grants, waiting: Waiting) -> Self {
        Self {
            conn,
            grants,
            waiting,
        }
    }

    /// Takes a read, write or permit grant: `deadline` `None` tries once.
    pub(crate) async fn acquire_shared(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Option<Instant>,
        op: Operation,
    ) -> Result<Option<Lease>, LockError> {
        let tag = |e: LockError| e.with_key(key).with_backend(NAME);
        kind.validate(op).map_err(tag)?;
        check_ttl(ttl, MIN_TTL, op).map_err(tag)?;
        let prefix = self.conn.shape_prefix(key, kind.shape());
        let epoch = epoch_key(&self.conn.prefix, key);
        loop {
            let session = self
                .conn
                .session_for(ttl, op)
                .await
                .map_err(|e| e.with_key(key))?;
            let mut pending = self.conn.claim_pending(&session, &prefix);
            let (entry, owner) = (pending.entry.clone(), pending.owner);
            let value = entry_value(kind, owner);
            // As for the mutex, the create runs inside the pending entry so
            // that a cleanup learns its outcome if this future is dropped;
            // the rest of its answer comes back through `found`.
            let found: Arc<Mutex<Option<SharedCreated>>> = Arc::default();
            let sent_at = Instant::now();
            let create = Box::pin(self.create_shared(
                prefix.clone(),
                entry.clone(),
                epoch.clone(),
                session.lease_id(),
                kind,
                value.clone(),
                found.clone(),
                op,
            ));
            let (my_revision, _) = pending.run_create(create, key, op).await?;
            let found = lock(&found)
                .take()
                .ok_or_else(|| protocol_error(op, key, "no answer to the create"))?;
            let at_once = match kind {
                _ if !found.fresh => None,
                LeaseKind::Write => found
                    .granted_at_once
                    .then(|| u64::try_from(my_revision).unwrap_or(0)),
                LeaseKind::Read => (!found.others.iter().any(Share::blocks_readers))
                    .then(|| u64::try_from(found.epoch).unwrap_or(0)),
                LeaseKind::Permits { count, limit } => {
                    if let Some(other) = found.others.iter().find(|s| {
                        !matches!(s.kind, Some(LeaseKind::Permits { limit: l, .. }) if l == limit)
                    }) {
                        pending.remove_now().await;
                        let theirs = match other.kind {
                            Some(LeaseKind::Permits { limit, .. }) => limit.to_string(),
                            _ => "an unknown limit".to_owned(),
                        };
                        return Err(tag(LockError::invalid_argument(
                            op,
                            format!(
                                "a semaphore of {limit} permits was asked for, but its \
                                 holders or waiters use {theirs}"
                            ),
                        )));
                    }
                    let taken: u64 = found.others.iter().map(|s| s.permits(limit)).sum();
                    (taken + u64::from(count) <= u64::from(limit))
                        .then(|| u64::try_from(my_revision).unwrap_or(0))
                }
                _ => None,
            };
            if let Some(token) = at_once {
                return pending
                    .granted(key, ttl, sent_at, op)
                    .shared(kind, token)
                    .map(Some);
            }
            let Some(deadline) = deadline else {
                pending.remove_now().await;
                return Ok(None);
            };
            match self
                .wait_shared(
                    &session,
                    kind,
                    &prefix,
                    &entry,
                    &epoch,
                    &value,
                    my_revision,
                    deadline,
                    op,
                )
                .await
            {
                Ok(Ok((token, checked_at))) => {
                    return pending
                        .granted(key, ttl, checked_at, op)
                        .shared(kind, token)
                        .map(Some);
                }
                Ok(Err(reason)) => start_over(pending, key, &reason, deadline, op)?,
                Err(err) if err.kind() == ErrorKind::Contended => {
                    pending.remove_now().await;
                    return Err(tag(err));
                }
                Err(err) => return Err(err.with_key(key)),
            }
        }
    }

    /// The create transaction of a shared entry (one round trip):
    ///
    /// - a writer: if the prefix is empty, create the entry and put the
    ///   epoch key in the same revision (granted at once); otherwise create
    ///   the entry if absent and read the prefix (a nested transaction);
    /// - a reader or permits: create the entry if absent and read the
    ///   prefix (and, for a reader, the epoch key) in the same revision.
    #[allow(clippy::too_many_arguments)]
    fn create_shared(
        &self,
        prefix: String,
        entry: String,
        epoch: String,
        lease_id: i64,
        kind: LeaseKind,
        value: String,
        found: Arc<Mutex<Option<SharedCreated>>>,
        op: Operation,
    ) -> impl std::future::Future<Output = Result<Created, LockError>> + Send + 'static {
        let mut kv = self.conn.client.kv_client();
        let op_timeout = self.conn.config.op_timeout;
        async move {
            let put = TxnOp::put(
                entry.as_str(),
                value.as_str(),
                Some(PutOptions::new().with_lease(lease_id)),
            );
            let mut reads = vec![TxnOp::get(prefix.as_str(), Some(all_entries()))];
            if kind == LeaseKind::Read {
                reads.push(TxnOp::get(epoch.as_str(), None));
            }
            let mut and_then = vec![put.clone()];
            and_then.extend(reads);
            let create_if_absent = Txn::new()
                .when([Compare::create_revision(
                    entry.as_str(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then(and_then)
                .or_else([TxnOp::get(entry.as_str(), None)]);
            let txn = if kind == LeaseKind::Write {
                Txn::new()
                    .when([Compare::version(prefix.as_str(), CompareOp::Equal, 0).with_prefix()])
                    .and_then([put, TxnOp::put(epoch.as_str(), entry.as_str(), None)])
                    .or_else([TxnOp::txn(create_if_absent)])
            } else {
                create_if_absent
            };
            let response = txn_on(&mut kv, op_timeout, op, txn).await?;
            let revision = response.header().map_or(0, |h| h.revision());
            let (inner, granted_at_once) = if kind == LeaseKind::Write {
                if response.succeeded() {
                    (None, true)
                } else {
                    match response.op_responses().first() {
                        Some(TxnOpResponse::Txn(inner)) => (Some(inner.clone()), false),
                        _ => {
                            return Err(LockError::new(
                                ErrorKind::Backend,
                                op,
                                "etcd answered the create without its nested transaction",
                            )
                            .with_backend(NAME));
                        }
                    }
                }
            } else {
                (Some(response), false)
            };
            let own = value.as_bytes();
            let fresh = inner.as_ref().is_none_or(TxnResponse::succeeded);
            // Our entry as this transaction created it, at its revision.
            let created_now = Created {
                my_revision: Some(revision).filter(|r| *r > 0),
                ours: true,
                owner_revision: None,
            };
            let (created, others, epoch) = match &inner {
                None => (created_now, Vec::new(), revision),
                Some(inner) if inner.succeeded() => {
                    let responses = inner.op_responses();
                    let others: Vec<Share> = shares(responses.get(1))
                        .into_iter()
                        .filter(|s| s.key != entry.as_bytes())
                        .collect();
                    (created_now, others, mod_revision_of(responses.get(2)))
                }
                Some(inner) => {
                    let existing = match inner.op_responses().first() {
                        Some(TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
                        _ => None,
                    };
                    (
                        Created {
                            my_revision: existing
                                .as_ref()
                                .map(KeyValue::create_revision)
                                .filter(|r| *r > 0),
                            ours: existing.as_ref().is_some_and(|kv| kv.value() == own),
                            owner_revision: None,
                        },
                        Vec::new(),
                        0,
                    )
                }
            };
            *lock(&found) = Some(SharedCreated {
                fresh,
                granted_at_once,
                others,
                epoch,
            });
            Ok(created)
        }
    }
}

impl EntryGrant<'_> {
    /// A lease of `kind` with `token` for our entry of a read-write lock or
    /// a semaphore.
    fn shared(self, kind: LeaseKind, token: u64) -> Result<Lease, LockError> {
        let leaf = self.pending.entry.rsplit('/').next().unwrap_or_default();
        let data = shared_lease_data(leaf, self.pending.revision.unwrap_or(0));
        self.lease(Grant { kind, token, data })
    }
}
