//! Acquiring: the create transaction, the grant, and the waiting acquire
//! (our turn in the queue: the predecessor's deletion watched, re-read on
//! every wake-up, the session's loss and the deadline), started over on a
//! new session when one is lost.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, WatchFilterType, WatchOptions};
use lock_core::{
    ErrorKind, FencingToken, Lease, LockError, LockKey, Operation, OwnerId, SessionState,
    check_ttl, with_timeout,
};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};

use super::{EtcdBackend, MIN_TTL};
use crate::cleanup::PendingEntry;
use crate::error::{NAME, from_etcd, protocol_error};
use crate::keys::{
    Created, create_txn, election_lease_data, first_kv, lease_data, mutex_value, predecessor_of,
};
use crate::session::Session;

/// How often a waiter re-reads its predecessor even without a watch event
/// (a safety net; the watch is what normally wakes it).
const RECHECK_INTERVAL: Duration = Duration::from_secs(5);

/// How often a waiter whose watch may still be behind (see
/// `EtcdBackend::wait_deleted`) reads its predecessor.
const UNSYNCED_POLL: Duration = Duration::from_millis(5);

/// How long after its creation a watch may still be behind: etcd's
/// catch-up loop runs every 100 ms.
const UNSYNCED_GRACE: Duration = Duration::from_millis(150);

/// Why waiting for our turn stopped.
enum WaitEnd {
    /// Our entry is the oldest: the lock is ours (the check was sent then).
    Granted(Instant),
    /// The deadline passed.
    Deadline,
    /// Our entry vanished: the session's lease is gone.
    SessionLost(String),
}

/// Where a grant's entry lives, and so how its lease names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// A mutex entry under `<prefix>/<escaped key>/`.
    Mutex,
    /// A candidate of an election under `<prefix>/<escaped name>%elect/`
    /// (the lease's key is `election/<name>`; its data says so).
    Election,
}

impl EtcdBackend {
    /// The heart of both acquire flavours: `deadline` `None` tries once.
    pub(super) async fn acquire_inner(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Option<Instant>,
        op: Operation,
    ) -> Result<Option<Lease>, LockError> {
        let key_prefix = self.key_prefix(key);
        self.acquire_entry(key, key_prefix, Layout::Mutex, ttl, deadline, op)
            .await
    }

    /// etcd's concurrency mutex (and election: the same queue) under
    /// `key_prefix`: create our entry, and wait for every older entry to go
    /// when `deadline` is given. The lease is keyed on `key`.
    pub(super) async fn acquire_entry(
        &self,
        key: &LockKey,
        key_prefix: String,
        layout: Layout,
        ttl: Duration,
        deadline: Option<Instant>,
        op: Operation,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(ttl, MIN_TTL, op).map_err(|e| e.with_key(key).with_backend(NAME))?;
        loop {
            let session = self
                .session_for(ttl, op)
                .await
                .map_err(|e| e.with_key(key))?;
            let entry = session.claim_entry(&key_prefix);
            let owner = session.new_owner();
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
            let sent_at = Instant::now();
            // The create is polled here, from inside the pending entry: if
            // this future is dropped mid-flight, the entry's cleanup task
            // takes the create over and still learns its outcome. (Polling
            // it inline rather than on a task of its own saves a spawn, a
            // join and a cross-thread wake-up per acquire.)
            // The same value for a candidate: `etcdctl elect -l` prints it
            // as the proposal (see the crate docs).
            let value = mutex_value(owner);
            let create = Box::pin(self.create_entry(
                key_prefix.clone(),
                entry.clone(),
                session.lease_id(),
                (owner, value),
                op,
            ));
            let created = pending.create.insert(create).as_mut().await;
            pending.create = None;
            let created = created.map_err(|e| e.with_key(key))?;
            let Some(my_revision) = created.my_revision else {
                return Err(protocol_error(op, key, "no revision for our entry"));
            };
            if !created.ours {
                // Not written by this grant: delete it without a guard (the
                // name carries our lease id, so it is ours) and never reuse it.
                return Err(protocol_error(op, key, "our entry name was taken"));
            }
            pending.revision = Some(my_revision);
            let owner_revision = created.owner_revision;
            if owner_revision == Some(my_revision) {
                return self
                    .grant(key, layout, ttl, &session, pending, sent_at, op)
                    .map(Some);
            }
            let Some(deadline) = deadline else {
                pending.remove_now().await;
                return Ok(None);
            };
            match self
                .wait_turn(&session, &key_prefix, &entry, my_revision, deadline, op)
                .await
            {
                Ok(WaitEnd::Granted(checked_at)) => {
                    return self
                        .grant(key, layout, ttl, &session, pending, checked_at, op)
                        .map(Some);
                }
                Ok(WaitEnd::Deadline) => {
                    pending.remove_now().await;
                    return Err(LockError::new(
                        ErrorKind::Contended,
                        op,
                        "the lock was still held at the deadline",
                    )
                    .with_key(key)
                    .with_backend(NAME));
                }
                Ok(WaitEnd::SessionLost(reason)) => {
                    // Our entry went with the lease: start over on a new
                    // session (the place in the queue is lost).
                    tracing::debug!(%key, %reason, "session lost while waiting; retrying");
                    pending.armed = false;
                    if Instant::now() >= deadline {
                        return Err(LockError::new(ErrorKind::Contended, op, format!(
                            "the session was lost while waiting ({reason}) and the deadline passed"
                        ))
                        .with_key(key)
                        .with_backend(NAME));
                    }
                }
                Err(err) => return Err(err.with_key(key)),
            }
        }
    }

    /// etcd's concurrency mutex: create our entry with the lease if it does
    /// not exist, and read the oldest entry under the key in the same
    /// revision (one round trip). The value starts with the grant's owner
    /// id, which release and renew compare, followed by the holder details
    /// (`etcdctl lock` writes an empty value and ignores it; `etcdctl
    /// elect -l` prints a candidate's whole value).
    fn create_entry(
        &self,
        key_prefix: String,
        entry: String,
        lease_id: i64,
        (owner, value): (OwnerId, String),
        op: Operation,
    ) -> impl std::future::Future<Output = Result<Created, LockError>> + Send + 'static {
        let mut kv = self.inner.client.kv_client();
        let op_timeout = self.inner.config.op_timeout;
        async move {
            let txn = create_txn(&key_prefix, &entry, lease_id, value);
            let response = with_timeout(op_timeout, op, async {
                kv.txn(txn).await.map_err(|e| from_etcd(op, e))
            })
            .await
            .map_err(|e| e.with_backend(NAME))?;
            Ok(Created::from_response(&response, owner))
        }
    }

    /// Turns our oldest entry into a lease; on failure the entry is removed.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn grant(
        &self,
        key: &LockKey,
        layout: Layout,
        ttl: Duration,
        session: &Arc<Session>,
        pending: PendingEntry<'_>,
        sent_at: Instant,
        op: Operation,
    ) -> Result<Lease, LockError> {
        let revision = pending.revision.unwrap_or(0);
        let token =
            u64::try_from(revision).map_err(|_| protocol_error(op, key, "negative revision"))?;
        session_alive(session, key, op)?;
        let lease = Lease::granted(
            key.clone(),
            pending.owner,
            FencingToken::new(token),
            ttl,
            sent_at,
            match layout {
                Layout::Mutex => lease_data(session, &pending.entry).to_owned(),
                Layout::Election => election_lease_data(&pending.entry),
            },
        )
        .map_err(|e| e.with_backend(NAME))?;
        hand_out(session, pending, lease, revision, ttl, sent_at, key, op)
    }

    /// Waits until no entry older than ours exists under the key's prefix,
    /// watching only the immediate predecessor's deletion.
    async fn wait_turn(
        &self,
        session: &Arc<Session>,
        key_prefix: &str,
        entry: &str,
        my_revision: i64,
        deadline: Instant,
        op: Operation,
    ) -> Result<WaitEnd, LockError> {
        let mut state = session.subscribe();
        let mut backoff = lock_core::RetryPolicy::default().backoff();
        loop {
            if let SessionState::Lost(reason) = session.state() {
                return Ok(WaitEnd::SessionLost(reason));
            }
            if Instant::now() >= deadline {
                return Ok(WaitEnd::Deadline);
            }
            // Is our entry still there (same revision), and who is just
            // before us?
            let txn = Txn::new()
                .when([Compare::create_revision(
                    entry,
                    CompareOp::Equal,
                    my_revision,
                )])
                .and_then([TxnOp::get(key_prefix, Some(predecessor_of(my_revision)))]);
            let sent_at = Instant::now();
            let response = tokio::select! {
                biased;
                () = sleep_until(deadline) => return Ok(WaitEnd::Deadline),
                response = self.txn(op, txn) => response,
            };
            let response = match response {
                Ok(response) => response,
                Err(err) if err.is_temporary() => {
                    // A member restarting or a leader election: keep our
                    // place and try again until the deadline.
                    tracing::debug!(%err, "re-check failed; retrying");
                    let delay = backoff.next_delay().unwrap_or(Duration::from_millis(500));
                    tokio::select! {
                        () = sleep_until(deadline) => return Ok(WaitEnd::Deadline),
                        () = sleep(delay) => continue,
                    }
                }
                Err(err) => return Err(err),
            };
            if !response.succeeded() {
                return Ok(WaitEnd::SessionLost(
                    "our waiting entry disappeared (lease expired or revoked)".to_owned(),
                ));
            }
            let responses = response.op_responses();
            let Some(predecessor) = first_kv(responses.first()) else {
                return Ok(WaitEnd::Granted(sent_at));
            };
            let predecessor_key = predecessor.key().to_vec();
            let predecessor_revision = predecessor.create_revision();
            let from_revision = response.header().map_or(0, |h| h.revision()) + 1;
            tokio::select! {
                biased;
                () = sleep_until(deadline) => return Ok(WaitEnd::Deadline),
                reason = session_lost(&mut state) => return Ok(WaitEnd::SessionLost(reason)),
                () = self.wait_deleted(predecessor_key, predecessor_revision, from_revision, false) => {}
            }
        }
    }

    /// Returns when `key` (the entry created at `create_revision`) was
    /// deleted at or after `from_revision`, or when the watch ended for any
    /// reason (cancelled, compacted, stream error, periodic re-check): the
    /// caller re-reads the state either way.
    ///
    /// etcd delivers events at once only to a watch that is *synced*, one
    /// whose start revision was above the store's revision when the server
    /// registered it. A watch that starts at or below it is served by the
    /// server's catch-up loop, every 100 ms, until it has caught up. The
    /// created response cannot tell the two apart: its header revision is
    /// read before the registration, so a write committed in between (the
    /// predecessor's own release, under contention) leaves the watch
    /// unsynced behind a header that looks current. Hence:
    ///
    /// - header revision >= `from_revision`: the store moved since our read;
    ///   re-read at once rather than wait for the catch-up;
    /// - otherwise one read of `key` after the created response: if its
    ///   revision is still below `from_revision`, nothing was written before
    ///   the registration and the watch is synced; if `key` is gone, re-read;
    ///   if the store moved, the watch may be behind, so `key` is also read
    ///   every [`UNSYNCED_POLL`] until [`UNSYNCED_GRACE`] after the watch
    ///   was created (by then the catch-up loop has run), and the watch alone
    ///   is relied on afterwards.
    ///
    /// With `with_puts`, a put to `key` (a writer rewriting its entry in
    /// place to a reader: a downgrade) also ends the wait.
    pub(super) async fn wait_deleted(
        &self,
        key: Vec<u8>,
        create_revision: i64,
        from_revision: i64,
        with_puts: bool,
    ) {
        let mut watch_client = self.inner.client.watch_client();
        let mut options = WatchOptions::new().with_start_revision(from_revision);
        if !with_puts {
            options = options.with_filters([WatchFilterType::NoPut]);
        }
        let give_up = sleep(RECHECK_INTERVAL);
        tokio::pin!(give_up);
        let watch = async {
            let mut stream = match watch_client.watch(key.clone(), Some(options)).await {
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
                        if self.entry_present(&key, create_revision).await == Some((false, 0)) {
                            return;
                        }
                        continue;
                    }
                };
                match message {
                    Ok(Some(response)) => {
                        if response.canceled() || response.compact_revision() > 0 {
                            // Compacted or cancelled: re-read instead.
                            return;
                        }
                        if !response.events().is_empty() {
                            return;
                        }
                        if !response.created() {
                            continue;
                        }
                        if response.header().map_or(0, |h| h.revision()) >= from_revision {
                            return;
                        }
                        match self.entry_present(&key, create_revision).await {
                            Some((false, _)) => return,
                            Some((true, revision)) if revision < from_revision => {}
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
            () = &mut give_up => {}
            () = watch => {}
        }
    }

    /// Whether `key` still holds the entry created at `create_revision`,
    /// with the revision of the read (`(false, 0)` when it is gone); `None`
    /// if the read failed.
    async fn entry_present(&self, key: &[u8], create_revision: i64) -> Option<(bool, i64)> {
        let mut kv = self.inner.client.kv_client();
        let response = tokio::time::timeout(
            self.inner.config.op_timeout,
            kv.get(key, Some(GetOptions::new().with_keys_only())),
        )
        .await
        .ok()?
        .ok()?;
        let present = response
            .kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == create_revision);
        if present {
            Some((true, response.header().map_or(0, |h| h.revision())))
        } else {
            Some((false, 0))
        }
    }
}

pub(super) async fn session_lost(state: &mut watch::Receiver<SessionState>) -> String {
    loop {
        if let SessionState::Lost(reason) = &*state.borrow_and_update() {
            return reason.clone();
        }
        if state.changed().await.is_err() {
            return "session closed".to_owned();
        }
    }
}

/// Refuses (`LeaseLost`) a grant whose session was lost before it could be
/// handed out.
pub(super) fn session_alive(
    session: &Session,
    key: &LockKey,
    op: Operation,
) -> Result<(), LockError> {
    if session.is_alive() {
        return Ok(());
    }
    Err(LockError::new(
        ErrorKind::LeaseLost,
        op,
        "the session was lost before the grant could be handed out",
    )
    .with_key(key)
    .with_backend(NAME))
}

/// Hands out `lease` for our entry `pending` (a mutex, election or shared
/// grant): its validity ends no later than the session's lease, which the
/// entry lives by (`LeaseLost` when that has passed, the entry then
/// removed), and the entry is marked held until `ttl` after `sent_at`
/// (deleted then unless renewed, not kept as long as the session lives).
#[allow(clippy::too_many_arguments)]
pub(super) fn hand_out(
    session: &Arc<Session>,
    mut pending: PendingEntry<'_>,
    mut lease: Lease,
    revision: i64,
    ttl: Duration,
    sent_at: Instant,
    key: &LockKey,
    op: Operation,
) -> Result<Lease, LockError> {
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
