//! Waiting grants: our turn in the queue (the predecessor's deletion
//! watched, re-read on every wake-up, the session's loss and the
//! deadline), started over on a new session when one is lost; and the
//! watches other waiters (shared shapes, elections, holder watches) use.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, Txn, TxnOp, WatchFilterType, WatchOptions, WatchResponse,
};
use lock_core::{ErrorKind, Lease, LockError, LockKey, Operation, SessionState, saturating_add};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};

use crate::connection::{Connection, PendingEntry, Session};
use crate::error::{NAME, protocol_error};
use crate::grants::{Attempt, Grants, Layout};
use crate::keys::{first_kv, predecessor_of};

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

/// Waiting grants of the mutex and of elections, and the watches.
#[derive(Clone, Debug)]
pub(crate) struct Waiting {
    conn: Arc<Connection>,
    grants: Grants,
}

impl Waiting {
    pub(crate) fn new(conn: Arc<Connection>, grants: Grants) -> Self {
        Self { conn, grants }
    }

    /// A waiting grant of `key`'s mutex, bounded by `deadline`.
    pub(crate) async fn take_waiting(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let key_prefix = self.conn.key_prefix(key);
        let attempt = async {
            self.acquire_entry(
                key,
                key_prefix,
                Layout::Mutex,
                ttl,
                deadline,
                Operation::Acquire,
            )
            .await
            .map(Some)
        };
        bounded_wait(key, deadline, attempt).await
    }

    /// etcd's concurrency mutex (and election: the same queue) under
    /// `key_prefix`: create our entry, and wait for every older entry to go
    /// until `deadline`. The lease is keyed on `key`.
    pub(crate) async fn acquire_entry(
        &self,
        key: &LockKey,
        key_prefix: String,
        layout: Layout,
        ttl: Duration,
        deadline: Instant,
        op: Operation,
    ) -> Result<Lease, LockError> {
        loop {
            let (session, pending, my_revision) = match self
                .grants
                .attempt(key, &key_prefix, layout, ttl, op)
                .await?
            {
                Attempt::Granted(lease) => return Ok(lease),
                Attempt::Queued {
                    session,
                    pending,
                    my_revision,
                } => (session, pending, my_revision),
            };
            let entry = pending.entry.clone();
            // Boxed: waiting (a watch) is the contended path; inline, its
            // futures would enlarge every acquire's.
            match Box::pin(self.wait_turn(&session, &key_prefix, &entry, my_revision, deadline, op))
                .await
            {
                Ok(WaitEnd::Granted(checked_at)) => {
                    return pending.granted(key, ttl, checked_at, op).exclusive(layout);
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
                response = self.conn.txn(op, txn) => response,
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
    pub(crate) async fn wait_deleted(
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
    pub(crate) async fn watch_until<P, F>(
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
        let mut watch_client = self.conn.client.watch_client();
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
            .conn
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

    /// Returns at the first event of the watch, when the store already
    /// moved past `from` when the watch was created (something may have
    /// happened between our read and the watch: re-read rather than wait for
    /// etcd's catch-up loop), or when the watch ends or fails.
    pub(crate) async fn wait_change(&self, key: Vec<u8>, options: WatchOptions, from: i64) {
        let mut watch_client = self.conn.client.watch_client();
        let mut stream = match watch_client.watch(key, Some(options)).await {
            Ok(stream) => stream,
            Err(err) => {
                tracing::debug!(%err, "etcd watch failed");
                sleep(Duration::from_millis(100)).await;
                return;
            }
        };
        loop {
            match stream.message().await {
                Ok(Some(response)) => {
                    if response.canceled()
                        || response.compact_revision() > 0
                        || !response.events().is_empty()
                    {
                        return;
                    }
                    if response.created() && response.header().map_or(0, |h| h.revision()) >= from {
                        return;
                    }
                }
                Ok(None) => return,
                Err(err) => {
                    tracing::debug!(%err, "etcd watch stream failed");
                    sleep(Duration::from_millis(50)).await;
                    return;
                }
            }
        }
    }
}

/// Runs a waiting acquire, bounded by its deadline plus a short grace:
/// a request that hangs (most members down) must not hold the caller
/// past its wait. Dropping `attempt` must be cancel-safe (the acquires
/// clean a create in flight up in the background).
pub(crate) async fn bounded_wait(
    key: &LockKey,
    deadline: Instant,
    attempt: impl std::future::Future<Output = Result<Option<Lease>, LockError>>,
) -> Result<Lease, LockError> {
    let grace = Duration::from_millis(250);
    // Saturating: a deadline near the end of time must not overflow.
    match tokio::time::timeout_at(saturating_add(deadline, grace), attempt).await {
        Ok(Ok(Some(lease))) => Ok(lease),
        Ok(Ok(None)) => Err(protocol_error(Operation::Acquire, key, "no grant")),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(LockError::new(
            ErrorKind::Timeout,
            Operation::Acquire,
            "etcd did not answer before the wait deadline",
        )
        .with_key(key)
        .with_backend(NAME)),
    }
}

/// What a waiter's probe of the keys it watches saw.
pub(crate) enum Seen {
    /// What the waiter waits for has happened: re-check at once.
    Changed,
    /// Nothing yet, as of this store revision.
    Unchanged(i64),
}

/// `Contended`: the deadline of a waiting acquire passed with older
/// entries still there.
pub(crate) fn held_at_deadline(op: Operation) -> LockError {
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
pub(crate) fn start_over(
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

pub(crate) async fn session_lost(state: &mut watch::Receiver<SessionState>) -> String {
    loop {
        if let SessionState::Lost(reason) = &*state.borrow_and_update() {
            return reason.clone();
        }
        if state.changed().await.is_err() {
            return "session closed".to_owned();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use conformance::process::end_of_time;

    /// Issue 37: a waiting acquire's bound is its deadline plus a grace;
    /// a deadline closer to the end of time than that grace must not
    /// overflow (`Instant + Duration` panics).
    #[tokio::test]
    async fn a_wait_with_a_deadline_near_the_end_of_time_does_not_panic() {
        let key = LockKey::new("far").unwrap();
        let deadline = end_of_time() - Duration::from_millis(100);
        let lease = Lease::granted(
            key.clone(),
            lock_core::OwnerId::random(),
            lock_core::FencingToken::new(1),
            Duration::from_secs(5),
            Instant::now(),
            String::new(),
        )
        .unwrap();
        let granted = bounded_wait(&key, deadline, async { Ok(Some(lease)) }).await;
        assert!(granted.is_ok(), "{granted:?}");
    }
}
