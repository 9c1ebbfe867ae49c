//! Read-write locks and semaphores: one entry per reader, writer or permit
//! lease under the shape's own prefix, ordered by create revision (see the
//! crate docs for the layout and what each token promises).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions,
};
use lock_core::{
    ErrorKind, FencingToken, HolderInfo, Lease, LeaseKind, LockError, LockKey, LockShape,
    Operation, OwnerId, SessionState, check_ttl, with_timeout,
};
use tokio::time::{Instant, sleep, sleep_until};

use super::{EtcdBackend, MIN_TTL, lock, waiting::session_lost};
use crate::cleanup::{PendingEntry, cleanup};
use crate::error::{NAME, from_etcd, protocol_error};
use crate::keys::{
    Created, entry_of_lease, entry_value, epoch_key, exact_delete, parse_shared_lease_data,
    parse_shared_value, shape_prefix, shared_lease_data,
};
use crate::session::Session;

/// How often a semaphore waiter re-reads even without a watch event.
const RECHECK_INTERVAL: Duration = Duration::from_secs(5);
/// As in `waiting.rs`: a watch may be behind for this long after its
/// creation (etcd's catch-up loop runs every 100 ms); meanwhile the waiter
/// also polls every [`UNSYNCED_POLL`].
const UNSYNCED_GRACE: Duration = Duration::from_millis(150);
const UNSYNCED_POLL: Duration = Duration::from_millis(5);

/// One entry of a shared shape as read from the server.
struct Share {
    key: Vec<u8>,
    create_revision: i64,
    mod_revision: i64,
    lease: i64,
    /// `None` for a value this crate did not write (counted as conflicting).
    kind: Option<LeaseKind>,
    owner: String,
}

impl Share {
    fn of(kv: &KeyValue) -> Self {
        let parsed = parse_shared_value(kv.value());
        Self {
            key: kv.key().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            lease: kv.lease(),
            kind: parsed.map(|(kind, _)| kind),
            owner: parsed
                .map(|(_, owner)| owner.to_owned())
                .unwrap_or_default(),
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

impl EtcdBackend {
    fn shape_prefix(&self, key: &LockKey, shape: LockShape) -> String {
        shape_prefix(&self.inner.prefix, key, shape)
    }

    /// Takes a read, write or permit grant: `deadline` `None` tries once.
    pub(super) async fn acquire_shared(
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
        let prefix = self.shape_prefix(key, kind.shape());
        let epoch = epoch_key(&self.inner.prefix, key);
        loop {
            let session = self
                .session_for(ttl, op)
                .await
                .map_err(|e| e.with_key(key))?;
            let entry = session.claim_entry(&prefix);
            let owner = session.new_owner();
            let value = entry_value(kind, owner);
            let mut pending = PendingEntry {
                client: &self.inner.client,
                session: session.clone(),
                entry: entry.clone(),
                owner,
                create: None,
                revision: None,
                armed: true,
                op_timeout: self.inner.config.op_timeout,
            };
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
            let created = pending.create.insert(create).as_mut().await;
            pending.create = None;
            let created = created.map_err(|e| e.with_key(key))?;
            let Some(my_revision) = created.my_revision else {
                return Err(protocol_error(op, key, "no revision for our entry"));
            };
            if !created.ours {
                return Err(protocol_error(op, key, "our entry name was taken"));
            }
            pending.revision = Some(my_revision);
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
                return self
                    .grant_shared(key, kind, ttl, &session, pending, token, sent_at, op)
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
                    return self
                        .grant_shared(key, kind, ttl, &session, pending, token, checked_at, op)
                        .map(Some);
                }
                Ok(Err(reason)) => {
                    tracing::debug!(%key, %reason, "session lost while waiting; retrying");
                    pending.armed = false;
                    if Instant::now() >= deadline {
                        return Err(tag(LockError::new(
                            ErrorKind::Contended,
                            op,
                            format!(
                                "the session was lost while waiting ({reason}) and the \
                                 deadline passed"
                            ),
                        )));
                    }
                }
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
        let mut kv = self.inner.client.kv_client();
        let op_timeout = self.inner.config.op_timeout;
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
            let response = with_timeout(op_timeout, op, async {
                kv.txn(txn).await.map_err(|e| from_etcd(op, e))
            })
            .await
            .map_err(|e| e.with_backend(NAME))?;
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
            let (created, others, epoch) = match &inner {
                None => (
                    Created {
                        my_revision: Some(revision).filter(|r| *r > 0),
                        ours: true,
                        owner_revision: None,
                    },
                    Vec::new(),
                    revision,
                ),
                Some(inner) if inner.succeeded() => {
                    let responses = inner.op_responses();
                    let others: Vec<Share> = shares(responses.get(1))
                        .into_iter()
                        .filter(|s| s.key != entry.as_bytes())
                        .collect();
                    (
                        Created {
                            my_revision: Some(revision).filter(|r| *r > 0),
                            ours: true,
                            owner_revision: None,
                        },
                        others,
                        mod_revision_of(responses.get(2)),
                    )
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

    /// Turns our entry into a lease of `kind` with `token`.
    #[allow(clippy::too_many_arguments)]
    fn grant_shared(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        session: &Arc<Session>,
        mut pending: PendingEntry<'_>,
        token: u64,
        sent_at: Instant,
        op: Operation,
    ) -> Result<Lease, LockError> {
        let revision = pending.revision.unwrap_or(0);
        if !session.is_alive() {
            return Err(LockError::new(
                ErrorKind::LeaseLost,
                op,
                "the session was lost before the grant could be handed out",
            )
            .with_key(key)
            .with_backend(NAME));
        }
        let leaf = pending.entry.rsplit('/').next().unwrap_or_default();
        let mut lease = Lease::granted(
            key.clone(),
            pending.owner,
            FencingToken::new(token),
            ttl,
            sent_at,
            shared_lease_data(leaf, revision),
        )
        .map_err(|e| e.with_backend(NAME))?
        .with_kind(kind);
        let deadline = lease.validity_deadline().min(session.deadline());
        if deadline <= Instant::now() {
            return Err(LockError::new(
                ErrorKind::LeaseLost,
                op,
                "the session's lease deadline passed before the grant",
            )
            .with_key(key)
            .with_backend(NAME));
        }
        lease.set_validity_deadline(deadline);
        let due = sent_at.checked_add(ttl).unwrap_or(sent_at);
        let signal = session.mark_held(&pending.entry, revision, pending.owner, due);
        pending.armed = false;
        Ok(lease.with_session(signal))
    }

    /// Waits for our turn: `Ok(Ok((token, sent)))` when granted,
    /// `Ok(Err(reason))` when our entry or session was lost, `Contended`
    /// at the deadline.
    #[allow(clippy::too_many_arguments)]
    async fn wait_shared(
        &self,
        session: &Arc<Session>,
        kind: LeaseKind,
        prefix: &str,
        entry: &str,
        epoch: &str,
        value: &str,
        my_revision: i64,
        deadline: Instant,
        op: Operation,
    ) -> Result<Result<(u64, Instant), String>, LockError> {
        let contended = || {
            LockError::new(
                ErrorKind::Contended,
                op,
                "the lock was still held at the deadline",
            )
        };
        let mut state = session.subscribe();
        let mut backoff = lock_core::RetryPolicy::default().backoff();
        loop {
            if let SessionState::Lost(reason) = session.state() {
                return Ok(Err(reason));
            }
            if Instant::now() >= deadline {
                return Err(contended());
            }
            let sent_at = Instant::now();
            let turn = tokio::select! {
                biased;
                () = sleep_until(deadline) => return Err(contended()),
                turn = self.check_turn(
                    kind, prefix, entry, epoch, value, session.lease_id(), my_revision, op,
                ) => turn,
            };
            let turn = match turn {
                Ok(turn) => turn,
                Err(err) if err.is_temporary() => {
                    tracing::debug!(%err, "re-check failed; retrying");
                    let delay = backoff.next_delay().unwrap_or(Duration::from_millis(500));
                    tokio::select! {
                        () = sleep_until(deadline) => return Err(contended()),
                        () = sleep(delay) => continue,
                    }
                }
                Err(err) => return Err(err),
            };
            match turn {
                Turn::Granted(token) => return Ok(Ok((token, sent_at))),
                Turn::Lost(reason) => return Ok(Err(reason)),
                Turn::WaitFor {
                    key,
                    create_revision,
                    from,
                    with_puts,
                } => {
                    tokio::select! {
                        biased;
                        () = sleep_until(deadline) => return Err(contended()),
                        reason = session_lost(&mut state) => return Ok(Err(reason)),
                        () = self.wait_deleted(key, create_revision, from, with_puts) => {}
                    }
                }
                Turn::WaitAny { before, from } => {
                    tokio::select! {
                        biased;
                        () = sleep_until(deadline) => return Err(contended()),
                        reason = session_lost(&mut state) => return Ok(Err(reason)),
                        () = self.wait_any_deleted(prefix, my_revision, before, from) => {}
                    }
                }
            }
        }
    }

    /// One re-check of a waiting shared entry.
    ///
    /// - A writer: a transaction that, if our entry exists and no entry
    ///   under the prefix is older (every create revision >= ours), puts
    ///   the epoch key and our entry again in one revision, which is the
    ///   writer's token; otherwise reads the newest entry before ours.
    /// - A reader: reads the entries before ours and the epoch key in one
    ///   revision: granted when none is a writer, with the epoch's mod
    ///   revision as its token.
    /// - Permits: reads the entries before ours; when ours fit, puts our
    ///   entry again (if it still exists): that put's revision is the
    ///   token.
    #[allow(clippy::too_many_arguments)]
    async fn check_turn(
        &self,
        kind: LeaseKind,
        prefix: &str,
        entry: &str,
        epoch: &str,
        value: &str,
        lease_id: i64,
        my_revision: i64,
        op: Operation,
    ) -> Result<Turn, LockError> {
        let ours = Compare::create_revision(entry, CompareOp::Equal, my_revision);
        let gone = || Turn::Lost("our waiting entry disappeared (lease expired or revoked)".into());
        let put_again = || TxnOp::put(entry, value, Some(PutOptions::new().with_lease(lease_id)));
        match kind {
            LeaseKind::Write => {
                let txn = Txn::new()
                    .when([
                        ours,
                        Compare::create_revision(prefix, CompareOp::Greater, my_revision - 1)
                            .with_prefix(),
                    ])
                    .and_then([TxnOp::put(epoch, entry, None), put_again()])
                    .or_else([
                        TxnOp::get(entry, Some(GetOptions::new().with_keys_only())),
                        TxnOp::get(
                            prefix,
                            Some(entries_before(my_revision).with_limit(1).with_keys_only()),
                        ),
                    ]);
                let response = self.txn(op, txn).await?;
                let revision = response.header().map_or(0, |h| h.revision());
                if response.succeeded() {
                    return Ok(Turn::Granted(u64::try_from(revision).unwrap_or(0)));
                }
                let responses = response.op_responses();
                let mine = shares(responses.first());
                if !mine.iter().any(|s| s.create_revision == my_revision) {
                    return Ok(gone());
                }
                match shares(responses.get(1)).into_iter().next() {
                    Some(before) => Ok(Turn::WaitFor {
                        key: before.key,
                        create_revision: before.create_revision,
                        from: revision + 1,
                        with_puts: false,
                    }),
                    // Nothing before us, yet the compare failed: a race
                    // with a deletion; check again at once.
                    None => Ok(Turn::WaitAny {
                        before: 0,
                        from: revision + 1,
                    }),
                }
            }
            LeaseKind::Read => {
                let txn = Txn::new().when([ours]).and_then([
                    TxnOp::get(prefix, Some(entries_before(my_revision))),
                    TxnOp::get(epoch, None),
                ]);
                let response = self.txn(op, txn).await?;
                if !response.succeeded() {
                    return Ok(gone());
                }
                let revision = response.header().map_or(0, |h| h.revision());
                let responses = response.op_responses();
                match shares(responses.first())
                    .into_iter()
                    .find(Share::blocks_readers)
                {
                    None => Ok(Turn::Granted(
                        u64::try_from(mod_revision_of(responses.get(1))).unwrap_or(0),
                    )),
                    // A writer before us may also downgrade in place: watch
                    // its puts too.
                    Some(writer) => Ok(Turn::WaitFor {
                        key: writer.key,
                        create_revision: writer.create_revision,
                        from: revision + 1,
                        with_puts: true,
                    }),
                }
            }
            LeaseKind::Permits { count, limit } => {
                let txn = Txn::new()
                    .when([ours.clone()])
                    .and_then([TxnOp::get(prefix, Some(entries_before(my_revision)))]);
                let response = self.txn(op, txn).await?;
                if !response.succeeded() {
                    return Ok(gone());
                }
                let revision = response.header().map_or(0, |h| h.revision());
                let before = shares(response.op_responses().first());
                let taken: u64 = before.iter().map(|s| s.permits(limit)).sum();
                if taken + u64::from(count) > u64::from(limit) {
                    return Ok(Turn::WaitAny {
                        before: before.len(),
                        from: revision + 1,
                    });
                }
                // Ours fit, and keeps fitting (entries before ours only
                // go). The token is a fresh revision, above every grant
                // handed out before this one.
                let txn = Txn::new()
                    .when([ours, Compare::value(entry, CompareOp::Equal, value)])
                    .and_then([put_again()]);
                let response = self.txn(op, txn).await?;
                if !response.succeeded() {
                    return Ok(gone());
                }
                let revision = response.header().map_or(0, |h| h.revision());
                Ok(Turn::Granted(u64::try_from(revision).unwrap_or(0)))
            }
            _ => Ok(Turn::Lost("not a shared kind".to_owned())),
        }
    }

    /// Returns when an entry under `prefix` older than ours was deleted at or
    /// after `from` (later waiters leaving wake nobody),
    /// when fewer than `before` entries older than `my_revision` remain, or
    /// when the watch ended for any reason: the caller re-reads either way.
    /// The watch's possible lag after its creation is covered as in
    /// `wait_deleted` (polling the number of older entries meanwhile).
    async fn wait_any_deleted(&self, prefix: &str, my_revision: i64, before: usize, from: i64) {
        if before == 0 {
            return;
        }
        let mut watch_client = self.inner.client.watch_client();
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(from)
            .with_prev_key()
            .with_filters([WatchFilterType::NoPut]);
        let count = || async {
            let mut kv = self.inner.client.kv_client();
            let response = tokio::time::timeout(
                self.inner.config.op_timeout,
                kv.get(
                    prefix,
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_keys_only()
                            .with_max_create_revision(my_revision - 1),
                    ),
                ),
            )
            .await
            .ok()?
            .ok()?;
            Some((
                response.kvs().len(),
                response.header().map_or(0, |h| h.revision()),
            ))
        };
        let watch = async {
            let mut stream = match watch_client.watch(prefix, Some(options)).await {
                Ok(stream) => stream,
                Err(err) => {
                    tracing::debug!(%err, "watch failed");
                    sleep(Duration::from_millis(100)).await;
                    return;
                }
            };
            let created_at = Instant::now();
            let mut poll_until = None;
            loop {
                let poll = async {
                    match poll_until {
                        Some(until) if Instant::now() < until => sleep(UNSYNCED_POLL).await,
                        _ => std::future::pending().await,
                    }
                };
                let message = tokio::select! {
                    biased;
                    message = stream.message() => message,
                    () = poll => {
                        if count().await.is_some_and(|(n, _)| n < before) {
                            return;
                        }
                        continue;
                    }
                };
                match message {
                    Ok(Some(response)) => {
                        if response.canceled() || response.compact_revision() > 0 {
                            return;
                        }
                        // Only the deletion of an entry older than ours can
                        // make room (one without its previous value counts).
                        if response.events().iter().any(|event| {
                            event
                                .prev_kv()
                                .is_none_or(|kv| kv.create_revision() < my_revision)
                        }) {
                            return;
                        }
                        if !response.created() {
                            continue;
                        }
                        if response.header().map_or(0, |h| h.revision()) >= from {
                            return;
                        }
                        match count().await {
                            Some((n, _)) if n < before => return,
                            Some((_, revision)) if revision < from => {}
                            _ => poll_until = Some(created_at + UNSYNCED_GRACE),
                        }
                    }
                    Ok(None) => return,
                    Err(err) => {
                        tracing::debug!(%err, "watch stream failed");
                        sleep(Duration::from_millis(50)).await;
                        return;
                    }
                }
            }
        };
        tokio::select! {
            () = sleep(RECHECK_INTERVAL) => {}
            () = watch => {}
        }
    }

    /// (entry, create revision, lease id) of a shared lease.
    pub(super) fn parse_shared_lease(
        &self,
        lease: &Lease,
        op: Operation,
    ) -> Result<(String, i64, i64), LockError> {
        let bad = |why: &str| {
            LockError::invalid_argument(op, format!("not an etcd lease of this backend: {why}"))
                .with_key(lease.key())
                .with_backend(NAME)
        };
        let (leaf, revision) =
            parse_shared_lease_data(lease.backend_data()).ok_or_else(|| bad("entry"))?;
        let prefix = self.shape_prefix(lease.key(), lease.kind().shape());
        let (entry, lease_id) = entry_of_lease(prefix, leaf).map_err(bad)?;
        Ok((entry, revision, lease_id))
    }

    /// Releases a read, write or permit lease: deletes its entry if it still
    /// has the lease's create revision and value (a downgraded write lease's
    /// entry now holds the read lease's value, so it is left alone).
    pub(super) async fn release_shared(&self, lease: &Lease) -> Result<bool, LockError> {
        let op = Operation::Release;
        let (entry, revision, lease_id) = self.parse_shared_lease(lease, op)?;
        let session = self.session_by_lease(lease_id);
        let was_held = session
            .as_ref()
            .is_some_and(|s| s.unmark_held(&entry, revision, lease.owner()));
        let value = entry_value(lease.kind(), lease.owner());
        match self.txn(op, exact_delete(&entry, revision, &value)).await {
            Ok(response) => {
                let released = response.succeeded();
                if released && let Some(session) = &session {
                    session.free_entry(&entry);
                }
                Ok(released)
            }
            Err(err) => {
                if was_held && let Some(session) = session {
                    tokio::spawn(cleanup(
                        self.inner.client.clone(),
                        session,
                        entry,
                        lease.owner(),
                        None,
                        Some(revision),
                    ));
                }
                Err(err.with_key(lease.key()))
            }
        }
    }

    /// Write to read in place: one transaction rewrites our entry's value
    /// (same key, same create revision, so the same place before every
    /// waiter) if it still is this write lease's. The read lease gets a new
    /// owner id, so the write lease is no longer held.
    pub(super) async fn downgrade_shared(&self, lease: &Lease) -> Result<Lease, LockError> {
        let op = Operation::Downgrade;
        let not_held = |why: &str| {
            LockError::new(ErrorKind::NotHeld, op, why.to_owned())
                .with_key(lease.key())
                .with_backend(NAME)
        };
        if lease.kind() != LeaseKind::Write {
            return Err(not_held("only a write lease can be downgraded"));
        }
        let (entry, revision, lease_id) = self.parse_shared_lease(lease, op)?;
        let now = Instant::now();
        if lease.validity_deadline() <= now && lease.session().is_some() {
            return Err(not_held("the write lease's deadline passed"));
        }
        let session = self.session_by_lease(lease_id);
        if let Some(session) = &session {
            if !session.holds(&entry, revision, lease.owner()) {
                return Err(not_held("the write lease was released or lost"));
            }
            if let SessionState::Lost(reason) = session.state() {
                return Err(LockError::new(ErrorKind::LeaseLost, op, reason)
                    .with_key(lease.key())
                    .with_backend(NAME));
            }
        }
        let new_owner = session
            .as_ref()
            .map_or_else(OwnerId::random, |s| s.new_owner());
        let txn = Txn::new()
            .when([
                Compare::create_revision(entry.as_str(), CompareOp::Equal, revision),
                Compare::value(
                    entry.as_str(),
                    CompareOp::Equal,
                    entry_value(LeaseKind::Write, lease.owner()),
                ),
            ])
            .and_then([TxnOp::put(
                entry.as_str(),
                entry_value(LeaseKind::Read, new_owner),
                Some(PutOptions::new().with_lease(lease_id)),
            )]);
        match self.txn(op, txn).await {
            Ok(response) if response.succeeded() => {}
            Ok(_) => {
                if let Some(session) = &session {
                    session.unmark_held(&entry, revision, lease.owner());
                }
                return Err(not_held("the write lease's entry is gone or changed"));
            }
            Err(err) => {
                // Unknown outcome: neither lease may be trusted; the entry
                // is deleted (or expires with its TTL).
                if let Some(session) = session
                    && session.unmark_held(&entry, revision, lease.owner())
                {
                    tokio::spawn(cleanup(
                        self.inner.client.clone(),
                        session,
                        entry,
                        lease.owner(),
                        None,
                        Some(revision),
                    ));
                }
                return Err(err.with_key(lease.key()));
            }
        }
        let mut read = Lease::from_parts(
            lease.key().clone(),
            new_owner,
            lease.token(),
            lease.ttl(),
            lease.validity_deadline(),
            lease.backend_data().to_owned(),
        )
        .with_kind(LeaseKind::Read);
        if let Some(session) = &session {
            let due = session
                .due(&entry)
                .unwrap_or_else(|| now.checked_add(lease.ttl()).unwrap_or(now));
            read.set_validity_deadline(read.validity_deadline().min(session.deadline()));
            read = read.with_session(session.mark_held(&entry, revision, new_owner, due));
        }
        Ok(read)
    }

    /// Every holder of a read-write lock or a semaphore: the entries whose
    /// turn has come (readers with no writer before them, the oldest entry
    /// if it is a granted writer; permit entries that fit with every entry
    /// before them).
    pub(super) async fn shared_holders(
        &self,
        key: &LockKey,
        shape: LockShape,
    ) -> Result<Vec<HolderInfo>, LockError> {
        let op = Operation::Inspect;
        let prefix = self.shape_prefix(key, shape);
        let epoch = epoch_key(&self.inner.prefix, key);
        let txn = Txn::new().and_then([
            TxnOp::get(prefix.as_str(), Some(all_entries())),
            TxnOp::get(epoch.as_str(), None),
        ]);
        let response = self.txn(op, txn).await.map_err(|e| e.with_key(key))?;
        let responses = response.op_responses();
        let entries = shares(responses.first());
        let epoch_revision = mod_revision_of(responses.get(1));
        let mut held = Vec::new();
        let mut writer_before = false;
        let mut taken: u64 = 0;
        for (i, share) in entries.iter().enumerate() {
            let token = match (shape, share.kind) {
                (LockShape::ReadWrite, Some(LeaseKind::Read)) => {
                    (!writer_before).then_some(epoch_revision)
                }
                (LockShape::ReadWrite, Some(LeaseKind::Write)) => {
                    writer_before = true;
                    (i == 0 && share.mod_revision == epoch_revision).then_some(share.mod_revision)
                }
                (LockShape::Semaphore, Some(LeaseKind::Permits { count, limit })) => {
                    let fits = taken + u64::from(count) <= u64::from(limit);
                    taken += u64::from(count);
                    fits.then_some(share.mod_revision)
                }
                _ => {
                    writer_before = true;
                    taken = u64::MAX / 2;
                    None
                }
            };
            if let (Some(token), Some(kind)) = (token, share.kind) {
                held.push((share, kind, token));
            }
        }
        let mut ttls: HashMap<i64, Option<Duration>> = HashMap::new();
        let mut out = Vec::with_capacity(held.len());
        for (share, kind, token) in held {
            let name = String::from_utf8_lossy(&share.key).into_owned();
            let own_due = self
                .session_by_lease(share.lease)
                .and_then(|s| s.due(&name));
            let remaining_ttl = match own_due {
                Some(due) => Some(due.saturating_duration_since(Instant::now())),
                None => match ttls.get(&share.lease) {
                    Some(ttl) => *ttl,
                    None => {
                        let ttl = self.lease_ttl(share.lease, op).await;
                        ttls.insert(share.lease, ttl);
                        ttl
                    }
                },
            };
            out.push(HolderInfo {
                kind,
                holder: share.owner.clone(),
                token: u64::try_from(token).ok().map(FencingToken::new),
                remaining_ttl,
            });
        }
        Ok(out)
    }

    /// An upper bound of the time left to an entry of another backend on
    /// `lease_id` (as `inspect` reports it).
    async fn lease_ttl(&self, lease_id: i64, op: Operation) -> Option<Duration> {
        if lease_id == 0 {
            return None;
        }
        let mut lease_client = self.inner.client.lease_client();
        let ttl = with_timeout(self.inner.config.op_timeout, op, async {
            lease_client
                .time_to_live(lease_id, None)
                .await
                .map_err(|e| from_etcd(op, e))
        })
        .await
        .ok()?;
        u64::try_from(ttl.granted_ttl())
            .ok()
            .filter(|_| ttl.ttl() > 0)
            .map(|granted| {
                Duration::from_secs(granted)
                    .max(Duration::from_secs(u64::try_from(ttl.ttl()).unwrap_or(0)))
            })
    }
}
