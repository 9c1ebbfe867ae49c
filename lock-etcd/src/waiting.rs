//! Acquiring: the create transaction, the grant, and the waiting acquire
//! (our turn in the queue: the predecessor's deletion watched, re-read on
//! every wake-up, the session's loss and the deadline), started over on a
//! new session when one is lost.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, GetResponse, KvClient, Txn, TxnOp, TxnResponse,
    WatchFilterType, WatchOptions, WatchResponse,
};
use lock_core::{
    ErrorKind, FencingToken, Lease, LeaseKind, LockError, LockKey, Operation, OwnerId,
    SessionState, check_ttl, with_timeout,
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
            let mut pending = self.claim_pending(&session, &key_prefix);
            let (entry, owner) = (pending.entry.clone(), pending.owner);
            let sent_at = Instant::now();
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
            let (my_revision, owner_revision) = pending.run_create(create, key, op).await?;
            if owner_revision == Some(my_revision) {
                return self
                    .grant(key, layout, ttl, &session, pending, sent_at, op)
                    .map(Some);
            }
            let Some(deadline) = deadline else {
                Box::pin(pending.remove_now()).await;
                return Ok(None);
            };
            // Boxed: waiting (a watch) is the contended path; inline, its
            // futures would enlarge every acquire's.
            match Box::pin(self.wait_turn(&session, &key_prefix, &entry, my_revision, deadline, op))
                .await
            {
                Ok(WaitEnd::Granted(checked_at)) => {
                    return self
                        .grant(key, layout, ttl, &session, pending, checked_at, op)
                        .map(Some);
                }
                Ok(WaitEnd::Deadline) => {
                    Box::pin(pending.remove_now()).await;
                    return Err(held_at_deadline(op).with_key(key).with_backend(NAME));
                }
                Ok(WaitEnd::SessionLost(reason)) => {
                    start_over(pending, key, &reason, deadline, op)?;
                }
                Err(err) => return Err(err.with_key(key)),
            }
        }
    }

    /// A pending entry under `key_prefix` with a name and an owner id of
    /// `session`'s, armed before its create is sent.
    pub(super) fn claim_pending(
        &self,
        session: &Arc<Session>,
        key_prefix: &str,
    ) -> PendingEntry<'_> {
        PendingEntry {
            client: &self.inner.client,
            session: session.clone(),
            entry: session.claim_entry(key_prefix),
            owner: session.new_owner(),
            create: None,
            revision: None,
            armed: true,
            op_timeout: self.inner.config.op_timeout,
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
            let response = txn_on(&mut kv, op_timeout, op, txn).await?;
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
        let data = match layout {
            Layout::Mutex => lease_data(session.hex(), &pending.entry).to_owned(),
            Layout::Election => election_lease_data(&pending.entry),
        };
        let grant = Grant {
            kind: LeaseKind::Exclusive,
            token,
            data,
        };
        grant_entry(session, pending, grant, ttl, sent_at, key, op)
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
    /// reason (see [`Self::watch_until`]): the caller re-reads the state
    /// either way. The check of a possibly unsynced watch reads `key`.
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
        let mut options = WatchOptions::new().with_start_revision(from_revision);
        if !with_puts {
            options = options.with_filters([WatchFilterType::NoPut]);
        }
        let watched: &[u8] = &key;
        self.watch_until(
            key.clone(),
            options,
            from_revision,
            |response| !response.events().is_empty(),
            move || self.entry_seen(watched, create_revision),
        )
        .await;
    }

    /// Watches `key` with `options` (which start at `from`) and returns at
    /// an event `wakes` accepts, or when the watch ended for any reason
    /// (cancelled, compacted, stream error, periodic re-check): the caller
    /// re-reads the state either way. `probe` reads what the waiter waits
    /// for (`None` when the read failed).
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
    /// - header revision >= `from`: the store moved since our read; re-read
    ///   at once rather than wait for the catch-up;
    /// - otherwise one probe after the created response: if it saw nothing
    ///   change and its revision is still below `from`, nothing was written
    ///   before the registration and the watch is synced; if it saw the
    ///   change, re-read; if the store moved, the watch may be behind, so
    ///   the probe is also run every [`UNSYNCED_POLL`] until
    ///   [`UNSYNCED_GRACE`] after the watch was created (by then the
    ///   catch-up loop has run), and the watch alone is relied on
    ///   afterwards.
    pub(super) async fn watch_until<P, F>(
        &self,
        key: impl Into<Vec<u8>>,
        options: WatchOptions,
        from: i64,
        wakes: impl Fn(&WatchResponse) -> bool,
        probe: P,
    ) where
        P: Fn() -> F,
        F: std::future::Future<Output = Option<Seen>>,
    {
        let mut watch_client = self.inner.client.watch_client();
        let give_up = sleep(RECHECK_INTERVAL);
        tokio::pin!(give_up);
        let watch = async {
            let mut stream = match watch_client.watch(key, Some(options)).await {
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
                        if matches!(probe().await, Some(Seen::Changed)) {
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
                        if wakes(&response) {
                            return;
                        }
                        if !response.created() {
                            continue;
                        }
                        if response.header().map_or(0, |h| h.revision()) >= from {
                            return;
                        }
                        match probe().await {
                            Some(Seen::Changed) => return,
                            Some(Seen::Unchanged(revision)) if revision < from => {}
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

    /// Whether `key` still holds the entry created at `create_revision`
    /// (`Unchanged` with the revision of the read), or is gone.
    async fn entry_seen(&self, key: &[u8], create_revision: i64) -> Option<Seen> {
        let response = self
            .read_quietly(key, GetOptions::new().with_keys_only())
            .await?;
        let present = response
            .kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == create_revision);
        Some(if present {
            Seen::Unchanged(response.header().map_or(0, |h| h.revision()))
        } else {
            Seen::Changed
        })
    }

    /// One range read bounded by the operation timeout, for a waiter's
    /// probes: `None` when it failed (the waiter re-reads later anyway).
    pub(super) async fn read_quietly(
        &self,
        key: impl Into<Vec<u8>>,
        options: GetOptions,
    ) -> Option<GetResponse> {
        let mut kv = self.inner.client.kv_client();
        tokio::time::timeout(self.inner.config.op_timeout, kv.get(key, Some(options)))
            .await
            .ok()?
            .ok()
    }
}

/// What a waiter's probe of the keys it watches saw.
pub(super) enum Seen {
    /// What the waiter waits for has happened: re-check at once.
    Changed,
    /// Nothing yet, as of this store revision.
    Unchanged(i64),
}

/// One transaction on `kv`, bounded by `timeout`: the backend's `txn` for
/// a future that owns its client, or with a budget of its own.
pub(super) async fn txn_on(
    kv: &mut KvClient,
    timeout: Duration,
    op: Operation,
    txn: Txn,
) -> Result<TxnResponse, LockError> {
    with_timeout(timeout, op, async {
        kv.txn(txn).await.map_err(|e| from_etcd(op, e))
    })
    .await
    .map_err(|e| e.with_backend(NAME))
}

/// `Contended`: the deadline of a waiting acquire passed with older
/// entries still there.
pub(super) fn held_at_deadline(op: Operation) -> LockError {
    LockError::new(
        ErrorKind::Contended,
        op,
        "the lock was still held at the deadline",
    )
}

/// After the session was lost while `pending` waited (its entry went with
/// the lease): lets the entry go so that the caller starts over on a new
/// session (the place in the queue is lost), or `Contended` when the
/// deadline has passed meanwhile.
pub(super) fn start_over(
    mut pending: PendingEntry<'_>,
    key: &LockKey,
    reason: &str,
    deadline: Instant,
    op: Operation,
) -> Result<(), LockError> {
    tracing::debug!(%key, %reason, "session lost while waiting; retrying");
    pending.armed = false;
    if Instant::now() >= deadline {
        return Err(LockError::new(
            ErrorKind::Contended,
            op,
            format!("the session was lost while waiting ({reason}) and the deadline passed"),
        )
        .with_key(key)
        .with_backend(NAME));
    }
    Ok(())
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

/// What a granted entry's lease carries besides its key, owner and TTL.
pub(super) struct Grant {
    pub(super) kind: LeaseKind,
    pub(super) token: u64,
    /// The lease's backend data, naming its entry.
    pub(super) data: String,
}

/// Builds the lease `grant` describes for our `pending` entry and hands it
/// out (see [`hand_out`]); fails if the session was lost meanwhile.
pub(super) fn grant_entry(
    session: &Arc<Session>,
    pending: PendingEntry<'_>,
    grant: Grant,
    ttl: Duration,
    sent_at: Instant,
    key: &LockKey,
    op: Operation,
) -> Result<Lease, LockError> {
    let revision = pending.revision.unwrap_or(0);
    session_alive(session, key, op)?;
    let lease = Lease::granted(
        key.clone(),
        pending.owner,
        FencingToken::new(grant.token),
        ttl,
        sent_at,
        grant.data,
    )
    .map_err(|e| e.with_backend(NAME))?
    .with_kind(grant.kind);
    hand_out(session, pending, lease, revision, ttl, sent_at, key, op)
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
