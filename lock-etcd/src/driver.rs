//! The [`LockBackend`] implementation for etcd.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KeyValue, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions,
};
use lock_core::{
    Capabilities, ErrorKind, FencingScope, FencingToken, Lease, LockBackend, LockError, LockInfo,
    LockKey, Operation, OwnerId, SessionState, TtlModel, WaitStrategy, check_ttl,
    validity_deadline, with_timeout,
};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};

use crate::config::EtcdConfig;
use crate::error::{NAME, from_etcd};
use crate::session::{RenewRefused, Session, revoke_in_background};

/// The shortest TTL etcd leases have: one second (the server may raise it
/// further, to 1.5 election timeouts).
pub const MIN_TTL: Duration = Duration::from_secs(1);

/// How often a waiter re-reads its predecessor even without a watch event
/// (a safety net; the watch is what normally wakes it).
const RECHECK_INTERVAL: Duration = Duration::from_secs(5);

/// How often a waiter whose watch may still be behind (see
/// `EtcdBackend::wait_deleted`) reads its predecessor.
const UNSYNCED_POLL: Duration = Duration::from_millis(5);

/// How long after its creation a watch may still be behind: etcd's
/// catch-up loop runs every 100 ms.
const UNSYNCED_GRACE: Duration = Duration::from_millis(150);

/// A lock service on etcd: leases, revisions as fencing tokens, FIFO waits.
///
/// See the [crate docs](crate) for the layout and the TTL model. Clones
/// share the connection and the sessions. Create it with
/// [`EtcdBackend::connect`] (or [`crate::connect`] from a URL).
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: EtcdConfig,
    /// Normalized prefix, without a trailing separator.
    prefix: String,
    /// One session per server TTL (in whole seconds).
    sessions: Mutex<HashMap<u64, Arc<Session>>>,
    /// Serializes session creation so concurrent acquires grant one lease.
    creating: tokio::sync::Mutex<()>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sessions: Vec<String> = lock(&self.inner.sessions)
            .values()
            .map(|s| format!("{s:?}"))
            .collect();
        f.debug_struct("EtcdBackend")
            .field("config", &self.inner.config)
            .field("sessions", &sessions)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Escapes a lock key into one path segment: `%` and `/` are
/// percent-encoded, so `a` and `a/b` get disjoint prefixes (`a/` and
/// `a%2Fb/`). Other keys are unchanged, so `etcdctl lock <prefix>/<key>`
/// names the same lock.
pub(crate) fn escape_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

/// `<prefix>/<escaped key>/` (`<escaped key>/` without a prefix), where
/// `prefix` is normalized (no trailing separator).
pub(crate) fn key_prefix(prefix: &str, key: &LockKey) -> String {
    if prefix.is_empty() {
        format!("{}/", escape_key(key.as_str()))
    } else {
        format!("{prefix}/{}/", escape_key(key.as_str()))
    }
}

/// Why waiting for our turn stopped.
enum WaitEnd {
    /// Our entry is the oldest: the lock is ours (the check was sent then).
    Granted(Instant),
    /// The deadline passed.
    Deadline,
    /// Our entry vanished: the session's lease is gone.
    SessionLost(String),
}

/// What the create transaction found.
pub(crate) struct Created {
    /// The create revision of our entry.
    pub(crate) my_revision: Option<i64>,
    /// Whether the entry holds this grant's owner id.
    pub(crate) ours: bool,
    /// The create revision of the oldest entry under the key.
    pub(crate) owner_revision: Option<i64>,
}

impl Created {
    pub(crate) fn from_response(response: &TxnResponse, owner: OwnerId) -> Self {
        let responses = response.op_responses();
        let owner_revision = first_kv(responses.get(1)).map(KeyValue::create_revision);
        if response.succeeded() {
            Self {
                my_revision: response.header().map(|h| h.revision()).filter(|r| *r > 0),
                ours: true,
                owner_revision,
            }
        } else {
            let existing = first_kv(responses.first());
            Self {
                my_revision: existing.map(KeyValue::create_revision).filter(|r| *r > 0),
                ours: existing.is_some_and(|kv| kv.value() == owner.to_hex().as_bytes()),
                owner_revision,
            }
        }
    }
}

impl EtcdBackend {
    /// Connects to the cluster and grants the default session's lease.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for an invalid configuration or rejected
    /// credentials, [`ErrorKind::Unavailable`] / [`ErrorKind::Timeout`] when
    /// no endpoint answers within the timeouts.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave a granted lease behind; it expires with
    /// its TTL.
    pub async fn connect(config: EtcdConfig) -> Result<Self, LockError> {
        let client = connect_client(&config).await?;
        let prefix = config.prefix.trim_end_matches('/').to_owned();
        let backend = Self {
            inner: Arc::new(Inner {
                client,
                prefix,
                sessions: Mutex::new(HashMap::new()),
                creating: tokio::sync::Mutex::new(()),
                config,
            }),
        };
        let ttl = backend.inner.config.ttl;
        backend
            .session_for(ttl, Operation::Connect)
            .await
            .map_err(|e| e.with_backend(NAME))?;
        Ok(backend)
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The underlying etcd client (for diagnostics and tests).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The prefix under which `key`'s entries live, ending with the
    /// separator: `<prefix>/<escaped key>/`. `etcdctl lock` on the same
    /// name without the trailing `/` takes the same lock.
    pub fn key_prefix(&self, key: &LockKey) -> String {
        key_prefix(&self.inner.prefix, key)
    }

    /// The lease id (hex, as in entry names) of the session used for `ttl`,
    /// if it exists and is alive.
    pub fn session_lease(&self, ttl: Duration) -> Option<String> {
        let secs = ttl_secs(ttl);
        lock(&self.inner.sessions)
            .get(&secs)
            .filter(|s| s.is_alive())
            .map(|s| s.lease_hex())
    }

    /// Revokes every session lease: every lock held through this backend is
    /// released at once (their guards report them lost). Later acquires start
    /// new sessions.
    ///
    /// # Errors
    ///
    /// The first revoke that failed (timeout, unavailable); such a lease
    /// expires with its TTL.
    ///
    /// # Cancel safety
    ///
    /// Safe: leases not yet revoked expire with their TTL.
    pub async fn close(&self) -> Result<(), LockError> {
        let sessions: Vec<Arc<Session>> =
            lock(&self.inner.sessions).drain().map(|(_, s)| s).collect();
        let mut first_error = None;
        for session in sessions {
            session.lose("the backend was closed");
            let mut lease_client = self.inner.client.lease_client();
            let result = with_timeout(self.inner.config.op_timeout, Operation::Release, async {
                lease_client
                    .revoke(session.lease_id())
                    .await
                    .map_err(|e| from_etcd(Operation::Release, e))
            })
            .await;
            match result {
                Ok(_) => {}
                Err(err) if err.kind() == ErrorKind::LeaseLost => {}
                Err(err) => {
                    revoke_in_background(
                        &self.inner.client,
                        session.lease_id(),
                        session.server_ttl(),
                    );
                    first_error.get_or_insert(err);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The live session for `ttl`, granting a new lease if there is none.
    async fn session_for(&self, ttl: Duration, op: Operation) -> Result<Arc<Session>, LockError> {
        let secs = ttl_secs(ttl);
        if let Some(s) = lock(&self.inner.sessions)
            .get(&secs)
            .filter(|s| s.is_alive())
        {
            return Ok(s.clone());
        }
        let _creating = self.inner.creating.lock().await;
        if let Some(s) = lock(&self.inner.sessions)
            .get(&secs)
            .filter(|s| s.is_alive())
        {
            return Ok(s.clone());
        }
        let ttl_i64 = i64::try_from(secs)
            .map_err(|_| LockError::invalid_argument(op, "TTL too large for an etcd lease"))?;
        let root = if self.inner.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.inner.prefix)
        };
        let session = Session::start(
            &self.inner.client,
            &root,
            ttl_i64,
            self.inner.config.op_timeout,
        )
        .await
        .map_err(|e| relabel(e, op))?;
        let old = lock(&self.inner.sessions).insert(secs, session.clone());
        if let Some(old) = old {
            old.lose("replaced by a new session");
        }
        Ok(session)
    }

    fn session_by_lease(&self, lease_id: i64) -> Option<Arc<Session>> {
        lock(&self.inner.sessions)
            .values()
            .find(|s| s.lease_id() == lease_id)
            .cloned()
    }

    async fn txn(&self, op: Operation, txn: Txn) -> Result<TxnResponse, LockError> {
        let mut kv = self.inner.client.kv_client();
        with_timeout(self.inner.config.op_timeout, op, async {
            kv.txn(txn).await.map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_backend(NAME))
    }

    /// Checks a lease's entry against the key it claims, and returns
    /// (entry, revision, lease id).
    ///
    /// A lease carries its entry's last segment (`<lease hex>` or
    /// `<lease hex>-<n>`, see [`lease_leaf`]); the rest is the key's prefix.
    /// The whole name (as earlier versions wrote it) is accepted too.
    fn parse_lease(&self, lease: &Lease, op: Operation) -> Result<(String, i64, i64), LockError> {
        let bad = |why: &str| {
            LockError::invalid_argument(op, format!("not an etcd lease of this backend: {why}"))
                .with_key(lease.key())
                .with_backend(NAME)
        };
        let data = lease.backend_data();
        let key_prefix = self.key_prefix(lease.key());
        let leaf = if data.contains('/') {
            data.strip_prefix(key_prefix.as_str())
                .ok_or_else(|| bad("entry is not under the key's prefix"))?
        } else {
            data
        };
        if leaf.is_empty() || leaf.contains('/') {
            return Err(bad("entry name"));
        }
        let lease_hex = leaf.split('-').next().unwrap_or(leaf);
        let lease_id = i64::from_str_radix(lease_hex, 16).map_err(|_| bad("entry name"))?;
        let revision = i64::try_from(lease.token().get()).map_err(|_| bad("token"))?;
        let mut entry = key_prefix;
        entry.push_str(leaf);
        Ok((entry, revision, lease_id))
    }

    /// Where a lease's entry is: (entry, revision, lease id), or `None` when
    /// its entry is gone from the server.
    ///
    /// A lease on its session's plain entry (`<key prefix><lease hex>`, the
    /// common case) carries no entry name at all: its owner id names the
    /// session that handed it out ([`Session::owns`]). If that session is
    /// no longer this backend's (replaced, or the lease comes from another
    /// process), the entry is read by its create revision (the lease's
    /// token) under the key's prefix: one more round trip, on that path
    /// only.
    async fn resolve_lease(
        &self,
        lease: &Lease,
        op: Operation,
    ) -> Result<Option<(String, i64, i64)>, LockError> {
        if !lease.backend_data().is_empty() {
            return self.parse_lease(lease, op).map(Some);
        }
        let revision = i64::try_from(lease.token().get()).map_err(|_| {
            LockError::invalid_argument(op, "not an etcd lease of this backend: token")
                .with_key(lease.key())
                .with_backend(NAME)
        })?;
        let mut entry = self.key_prefix(lease.key());
        let own = lock(&self.inner.sessions)
            .values()
            .find(|s| s.owns(lease.owner()))
            .cloned();
        if let Some(session) = own {
            entry.push_str(session.hex());
            return Ok(Some((entry, revision, session.lease_id())));
        }
        let mut kv = self.inner.client.kv_client();
        let response = with_timeout(self.inner.config.op_timeout, op, async {
            kv.get(
                entry.as_str(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_min_create_revision(revision)
                        .with_max_create_revision(revision),
                ),
            )
            .await
            .map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_key(lease.key()).with_backend(NAME))?;
        Ok(response.kvs().first().map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                revision,
                kv.lease(),
            )
        }))
    }

    /// The heart of both acquire flavours: `deadline` `None` tries once.
    async fn acquire_inner(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Option<Instant>,
        op: Operation,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(ttl, MIN_TTL, op).map_err(|e| e.with_key(key).with_backend(NAME))?;
        let key_prefix = self.key_prefix(key);
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
            let create = Box::pin(self.create_entry(
                key_prefix.clone(),
                entry.clone(),
                session.lease_id(),
                owner,
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
                    .grant(key, ttl, &session, pending, sent_at, op)
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
                        .grant(key, ttl, &session, pending, checked_at, op)
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
    /// revision (one round trip). The value is the grant's owner id, which
    /// release and renew compare (`etcdctl lock` writes an empty value and
    /// ignores it).
    fn create_entry(
        &self,
        key_prefix: String,
        entry: String,
        lease_id: i64,
        owner: OwnerId,
        op: Operation,
    ) -> impl std::future::Future<Output = Result<Created, LockError>> + Send + 'static {
        let mut kv = self.inner.client.kv_client();
        let op_timeout = self.inner.config.op_timeout;
        async move {
            let txn = create_txn(&key_prefix, &entry, lease_id, owner);
            let response = with_timeout(op_timeout, op, async {
                kv.txn(txn).await.map_err(|e| from_etcd(op, e))
            })
            .await
            .map_err(|e| e.with_backend(NAME))?;
            Ok(Created::from_response(&response, owner))
        }
    }

    /// Turns our oldest entry into a lease; on failure the entry is removed.
    fn grant(
        &self,
        key: &LockKey,
        ttl: Duration,
        session: &Arc<Session>,
        mut pending: PendingEntry<'_>,
        sent_at: Instant,
        op: Operation,
    ) -> Result<Lease, LockError> {
        let revision = pending.revision.unwrap_or(0);
        let token =
            u64::try_from(revision).map_err(|_| protocol_error(op, key, "negative revision"))?;
        if !session.is_alive() {
            return Err(LockError::new(
                ErrorKind::LeaseLost,
                op,
                "the session was lost before the grant could be handed out",
            )
            .with_key(key)
            .with_backend(NAME));
        }
        let mut lease = Lease::granted(
            key.clone(),
            pending.owner,
            FencingToken::new(token),
            ttl,
            sent_at,
            lease_data(session, &pending.entry).to_owned(),
        )
        .map_err(|e| e.with_backend(NAME))?;
        // The entry lives as long as the session's lease: never promise more.
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
        // The entry is deleted when the lock's own TTL runs out unless
        // renewed: not kept for as long as the session lives.
        let due = sent_at.checked_add(ttl).unwrap_or(sent_at);
        let signal = session.mark_held(&pending.entry, revision, pending.owner, due);
        pending.armed = false;
        Ok(lease.with_session(signal))
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
                .and_then([TxnOp::get(
                    key_prefix,
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_sort(SortTarget::Create, SortOrder::Descend)
                            .with_max_create_revision(my_revision - 1)
                            .with_limit(1),
                    ),
                )]);
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
                () = self.wait_deleted(predecessor_key, predecessor_revision, from_revision) => {}
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
    async fn wait_deleted(&self, key: Vec<u8>, create_revision: i64, from_revision: i64) {
        let mut watch_client = self.inner.client.watch_client();
        let options = WatchOptions::new()
            .with_start_revision(from_revision)
            .with_filters([WatchFilterType::NoPut]);
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

async fn session_lost(state: &mut watch::Receiver<SessionState>) -> String {
    loop {
        if let SessionState::Lost(reason) = &*state.borrow_and_update() {
            return reason.clone();
        }
        if state.changed().await.is_err() {
            return "session closed".to_owned();
        }
    }
}

/// What a lease carries of its entry's name: nothing for the session's
/// plain entry under the key (its owner id names the session, see
/// [`EtcdBackend::resolve_lease`]), else the last segment,
/// `<lease hex>-<n>` (the key's prefix is known from the lease's key).
pub(crate) fn lease_data<'a>(session: &Session, entry: &'a str) -> &'a str {
    let leaf = entry.rsplit('/').next().unwrap_or(entry);
    if leaf == session.hex() { "" } else { leaf }
}

pub(crate) fn first_kv(response: Option<&TxnOpResponse>) -> Option<&KeyValue> {
    match response {
        Some(TxnOpResponse::Get(get)) => get.kvs().first(),
        _ => None,
    }
}

fn protocol_error(op: Operation, key: &LockKey, why: &str) -> LockError {
    LockError::new(
        ErrorKind::Backend,
        op,
        format!("unexpected etcd answer: {why}"),
    )
    .with_key(key)
    .with_backend(NAME)
}

pub(crate) fn relabel(err: LockError, op: Operation) -> LockError {
    if err.operation() == op {
        return err;
    }
    let mut relabeled = LockError::new(err.kind(), op, err.message().to_owned()).with_backend(NAME);
    relabeled = relabeled.with_source(err);
    relabeled
}

/// Validates `config` and connects an etcd client with it (no lease yet).
pub(crate) async fn connect_client(config: &EtcdConfig) -> Result<Client, LockError> {
    config.validate()?;
    let mut options = ConnectOptions::new()
        .with_connect_timeout(config.connect_timeout)
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
        .with_require_leader(true);
    if let Some(user) = &config.user {
        options = options.with_user(user.clone(), config.password.clone().unwrap_or_default());
    }
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    if let Some(tls) = &config.tls {
        options = options.with_tls(tls_options(tls)?);
    }
    let endpoints: Vec<String> = config
        .endpoints
        .iter()
        .map(|e| format!("{scheme}://{e}"))
        .collect();
    with_timeout(
        config.connect_timeout + config.op_timeout,
        Operation::Connect,
        async {
            Client::connect(&endpoints, Some(options))
                .await
                .map_err(|e| from_etcd(Operation::Connect, e))
        },
    )
    .await
}

/// Whole seconds for an etcd lease, rounded up (the server's unit).
pub(crate) fn ttl_secs(ttl: Duration) -> u64 {
    let secs = ttl.as_secs();
    let secs = if ttl.subsec_nanos() > 0 {
        secs.saturating_add(1)
    } else {
        secs
    };
    secs.max(1)
}

fn tls_options(tls: &crate::config::EtcdTls) -> Result<etcd_client::TlsOptions, LockError> {
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| {
            LockError::config(format!(
                "cannot read the TLS {what} file {}",
                path.display()
            ))
            .with_source(e)
        })
    };
    let mut options = etcd_client::TlsOptions::new();
    if let Some(ca) = &tls.ca_file {
        options = options.ca_certificate(etcd_client::Certificate::from_pem(read(ca, "CA")?));
    }
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        options = options.identity(etcd_client::Identity::from_pem(
            read(cert, "certificate")?,
            read(key, "key")?,
        ));
    }
    if let Some(domain) = &tls.domain {
        options = options.domain_name(domain.clone());
    }
    Ok(options)
}

/// A create transaction in flight, owned so that whoever holds it (the
/// acquire, or the cleanup after the acquire was dropped) learns its outcome.
pub(crate) type CreateFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Created, LockError>> + Send>>;

/// An entry we created (or may have created) that nobody holds yet. If it
/// is dropped armed (error, timeout, cancelled acquire), the entry is
/// deleted in the background; `remove_now` does it inline.
struct PendingEntry<'a> {
    /// Cloned only when a cleanup has to run on its own.
    client: &'a Client,
    session: Arc<Session>,
    entry: String,
    owner: OwnerId,
    /// The create transaction while it runs.
    create: Option<CreateFuture>,
    /// Its create revision once known.
    revision: Option<i64>,
    armed: bool,
    op_timeout: Duration,
}

impl PendingEntry<'_> {
    /// Deletes the entry now (guarded by its revision and owner); on
    /// failure leaves it to the background cleanup.
    async fn remove_now(mut self) {
        let Some(revision) = self.revision else {
            return;
        };
        let mut kv = self.client.kv_client();
        let result = tokio::time::timeout(
            self.op_timeout,
            kv.txn(guarded_delete(&self.entry, revision, self.owner)),
        )
        .await;
        if let Ok(Ok(_)) = result {
            self.session.free_entry(&self.entry);
            self.armed = false;
        }
    }
}

impl Drop for PendingEntry<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(cleanup(
                self.client.clone(),
                self.session.clone(),
                std::mem::take(&mut self.entry),
                self.owner,
                self.create.take(),
                self.revision,
            ));
        }
    }
}

/// The create transaction of etcd's concurrency mutex: put `entry` (value:
/// the grant's owner id, attached to `lease_id`) if it does not exist, and
/// read the oldest entry under `key_prefix` in the same revision. On
/// failure, read the existing entry and the oldest one instead.
pub(crate) fn create_txn(key_prefix: &str, entry: &str, lease_id: i64, owner: OwnerId) -> Txn {
    let get_owner = TxnOp::get(
        key_prefix,
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1),
        ),
    );
    Txn::new()
        .when([Compare::create_revision(entry, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(
                entry,
                owner.to_hex(),
                Some(PutOptions::new().with_lease(lease_id)),
            ),
            get_owner.clone(),
        ])
        .or_else([TxnOp::get(entry, None), get_owner])
}

/// Deletes `entry` only if it is still the grant with this create revision
/// and owner.
pub(crate) fn guarded_delete(entry: &str, revision: i64, owner: OwnerId) -> Txn {
    Txn::new()
        .when([
            Compare::create_revision(entry, CompareOp::Equal, revision),
            Compare::value(entry, CompareOp::Equal, owner.to_hex()),
        ])
        .and_then([TxnOp::delete(entry, None::<DeleteOptions>)])
}

/// Deletes an entry nobody holds, retrying while the session lives (the
/// entry goes with the lease otherwise).
///
/// If the create was still running, its outcome is awaited first. With a
/// known revision the delete is guarded and the name is freed afterwards.
/// With an unknown outcome (the create timed out), the name is never reused
/// by this session and the delete is repeated a few times over several
/// seconds, in case the create is applied after an earlier delete.
pub(crate) async fn cleanup(
    client: Client,
    session: Arc<Session>,
    entry: String,
    owner: OwnerId,
    create: Option<CreateFuture>,
    mut revision: Option<i64>,
) {
    if let Some(create) = create
        && let Ok(Ok(created)) = tokio::time::timeout(Duration::from_secs(10), create).await
        && created.ours
    {
        revision = created.my_revision;
    }
    let mut kv = client.kv_client();
    let give_up = Instant::now()
        + session
            .server_ttl()
            .saturating_mul(10)
            .max(Duration::from_secs(30));
    let mut delay = Duration::from_millis(20);
    // Delays before repeating an unguarded delete.
    let mut repeats = [
        Duration::from_millis(100),
        Duration::from_millis(500),
        Duration::from_secs(2),
        Duration::from_secs(5),
    ]
    .into_iter();
    while session.is_alive() && Instant::now() < give_up {
        let result = match revision {
            Some(revision) => tokio::time::timeout(
                Duration::from_secs(2),
                kv.txn(guarded_delete(&entry, revision, owner)),
            )
            .await
            .map(|r| r.map(|_| ())),
            None => tokio::time::timeout(Duration::from_secs(2), kv.delete(entry.as_str(), None))
                .await
                .map(|r| r.map(|_| ())),
        };
        match result {
            Ok(Ok(())) if revision.is_some() => {
                session.free_entry(&entry);
                return;
            }
            Ok(Ok(())) => match repeats.next() {
                Some(pause) => sleep(pause).await,
                None => return,
            },
            _ => {
                sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
    }
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        capabilities()
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.acquire_inner(key, ttl, None, Operation::TryAcquire)
            .await
    }

    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        // A request that hangs (most members down) must not hold the caller
        // past its wait: bound the whole acquire by the deadline plus a short
        // grace. Dropping `acquire_inner` is cancel-safe (a create in flight
        // is cleaned up in the background).
        let grace = Duration::from_millis(250);
        let attempt = self.acquire_inner(key, ttl, Some(deadline), Operation::Acquire);
        match tokio::time::timeout_at(deadline + grace, attempt).await {
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

    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        let op = Operation::Renew;
        let not_held = |why: &str| {
            LockError::new(ErrorKind::NotHeld, op, why.to_owned())
                .with_key(lease.key())
                .with_backend(NAME)
        };
        let Some((entry, revision, lease_id)) = self.resolve_lease(lease, op).await? else {
            return Err(not_held("the entry is gone"));
        };
        if let Some(session) = self.session_by_lease(lease_id) {
            // Our own session keeps the etcd lease alive, and this backend
            // deletes the entry at the grant's own deadline: renewing moves
            // that deadline (no network call).
            if !session.holds(&entry, revision, lease.owner()) {
                return Err(not_held("the lease was released or lost"));
            }
            if let SessionState::Lost(reason) = session.state() {
                return Err(LockError::new(ErrorKind::LeaseLost, op, reason)
                    .with_key(lease.key())
                    .with_backend(NAME));
            }
            let now = Instant::now();
            let deadline = session.deadline().min(validity_deadline(now, lease.ttl()));
            if deadline <= now {
                return Err(LockError::new(
                    ErrorKind::LeaseLost,
                    op,
                    "the session's lease deadline passed",
                )
                .with_key(lease.key())
                .with_backend(NAME));
            }
            let due = now.checked_add(lease.ttl()).unwrap_or(now);
            return match session.renew_held(&entry, revision, lease.owner(), now, due) {
                Ok(()) => Ok(deadline),
                Err(RenewRefused::NotHeld) => Err(not_held("the lease was released or lost")),
                Err(RenewRefused::Expired) => {
                    tokio::spawn(cleanup(
                        self.inner.client.clone(),
                        session,
                        entry,
                        lease.owner(),
                        None,
                        Some(revision),
                    ));
                    Err(not_held(
                        "the lock's TTL ran out before this renewal; its entry is deleted",
                    ))
                }
            };
        }
        // A lease of another process (rebuilt from a handle): refresh its
        // etcd lease once and check the entry is still the same one.
        let sent_at = Instant::now();
        let mut lease_client = self.inner.client.lease_client();
        let kept = with_timeout(self.inner.config.op_timeout, op, async {
            lease_client
                .keep_alive(lease_id)
                .await
                .map_err(|e| from_etcd(op, e))
        })
        .await;
        match kept {
            Ok(_) => {}
            Err(err) if err.kind() == ErrorKind::LeaseLost => {
                return Err(not_held("the etcd lease is gone"));
            }
            Err(err) => return Err(err.with_key(lease.key())),
        }
        let granted = with_timeout(self.inner.config.op_timeout, op, async {
            lease_client
                .time_to_live(lease_id, None)
                .await
                .map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_key(lease.key()))?;
        let txn = Txn::new().when([
            Compare::create_revision(entry.as_str(), CompareOp::Equal, revision),
            Compare::value(entry.as_str(), CompareOp::Equal, lease.owner().to_hex()),
        ]);
        if !self
            .txn(op, txn)
            .await
            .map_err(|e| e.with_key(lease.key()))?
            .succeeded()
        {
            return Err(not_held("the entry is gone or was re-created"));
        }
        let server_ttl = u64::try_from(granted.granted_ttl())
            .map(Duration::from_secs)
            .unwrap_or(Duration::ZERO);
        let deadline = validity_deadline(sent_at, lease.ttl().min(server_ttl));
        if deadline <= Instant::now() {
            return Err(not_held("the etcd lease has no time left"));
        }
        Ok(deadline)
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let op = Operation::Release;
        let Some((entry, revision, lease_id)) = self.resolve_lease(lease, op).await? else {
            return Ok(false);
        };
        let session = self.session_by_lease(lease_id);
        if let Some(session) = &session {
            session.unmark_held(&entry, revision, lease.owner());
        }
        match self
            .txn(op, guarded_delete(&entry, revision, lease.owner()))
            .await
        {
            Ok(response) => {
                let released = response.succeeded();
                if released && let Some(session) = &session {
                    session.free_entry(&entry);
                }
                Ok(released)
            }
            Err(err) => {
                // Our session would keep the entry alive: keep trying.
                if let Some(session) = session {
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

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let op = Operation::Inspect;
        let key_prefix = self.key_prefix(key);
        let mut kv = self.inner.client.kv_client();
        let response = with_timeout(self.inner.config.op_timeout, op, async {
            kv.get(
                key_prefix.as_str(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(1),
                ),
            )
            .await
            .map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_key(key).with_backend(NAME))?;
        let Some(holder) = response.kvs().first() else {
            return Ok(None);
        };
        let name = String::from_utf8_lossy(holder.key());
        let holder_name = name
            .strip_prefix(key_prefix.as_str())
            .unwrap_or(&name)
            .to_owned();
        let token = u64::try_from(holder.create_revision())
            .ok()
            .map(FencingToken::new);
        let mut remaining_ttl = None;
        let own_due = self
            .session_by_lease(holder.lease())
            .and_then(|s| s.due(&name));
        if let Some(due) = own_due {
            // Held through this backend: it deletes the entry at `due`.
            remaining_ttl = Some(due.saturating_duration_since(Instant::now()));
        } else if holder.lease() != 0 {
            let mut lease_client = self.inner.client.lease_client();
            let lease_id = holder.lease();
            if let Ok(ttl) = with_timeout(self.inner.config.op_timeout, op, async {
                lease_client
                    .time_to_live(lease_id, None)
                    .await
                    .map_err(|e| from_etcd(op, e))
            })
            .await
            {
                // Another backend deletes the entry at its own deadline,
                // which etcd cannot show: at most the lock's TTL after its
                // last renewal, and the lease's granted TTL is that TTL
                // rounded up. A crashed holder's entry goes with the lease,
                // within the same bound. So the granted TTL is an upper
                // bound of the time left; the lease's remaining TTL is not.
                remaining_ttl = u64::try_from(ttl.granted_ttl())
                    .ok()
                    .filter(|_| ttl.ttl() > 0)
                    .map(|granted| {
                        Duration::from_secs(granted)
                            .max(Duration::from_secs(u64::try_from(ttl.ttl()).unwrap_or(0)))
                    });
            }
        }
        Ok(Some(LockInfo {
            key: key.clone(),
            holder: holder_name,
            token,
            remaining_ttl,
        }))
    }
}

/// What the etcd backend guarantees.
pub fn capabilities() -> Capabilities {
    Capabilities {
        fencing: FencingScope::Global,
        fencing_survives_failover: true,
        grants_survive_restart: true,
        waiting: WaitStrategy::Notify,
        fifo: true,
        // Each lock is deleted when its own TTL runs out without a renewal
        // (by the backend that holds it; by the session lease's expiry, one
        // TTL rounded up to whole seconds, if that process is gone).
        ttl_model: TtlModel::PerLease,
        linearizable: true,
        min_ttl: MIN_TTL,
        shared_locks: false,
        semaphores: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_get_disjoint_prefixes() {
        assert_eq!(escape_key("a"), "a");
        assert_eq!(escape_key("a/b"), "a%2Fb");
        assert_eq!(escape_key("100%"), "100%25");
        assert!(!format!("{}/", escape_key("a/b")).starts_with(&format!("{}/", escape_key("a"))));
    }

    #[test]
    fn ttls_round_up_to_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 1);
        assert_eq!(ttl_secs(Duration::from_secs(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1500)), 2);
    }
}
