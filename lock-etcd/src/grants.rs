//! Grants of the mutex: the create transaction of etcd's concurrency
//! mutex and the lease it turns into (the try-once grant), the release
//! (the guarded delete), and the holder of a key; how a lease names its
//! entry, for every component that reaches an entry from a lease.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{GetResponse, KeyValue, Txn};
use lock_core::{
    ErrorKind, FencingToken, Lease, LeaseKind, LockError, LockInfo, LockKey, Operation, OwnerId,
    check_ttl, with_timeout,
};
use tokio::time::Instant;

use crate::config::MIN_TTL;
use crate::connection::{Connection, PendingEntry, Session, clean_up_later, txn_on};
use crate::error::{NAME, from_etcd, protocol_error};
use crate::keys::{
    self, Created, create_txn, election_lease_data, entry_of_lease, guarded_delete, lease_data,
    mutex_value, parse_shared_lease_data, value_details,
};

/// Where a grant's entry lives, and so how its lease names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// A mutex entry under `<prefix>/<escaped key>/`.
    Mutex,
    /// A candidate of an election under `<prefix>/<escaped name>%elect/`
    /// (the lease's key is `election/<name>`; its data says so).
    Election,
}

/// The mutex's grants: try once, release, read the holder.
#[derive(Clone, Debug)]
pub(crate) struct Grants {
    conn: Arc<Connection>,
}

/// What one create attempt under a key's prefix came to.
pub(crate) enum Attempt<'a> {
    /// Our entry is the oldest: the lease.
    Granted(Lease),
    /// An older entry holds the key: ours waits in the queue.
    Queued {
        session: Arc<Session>,
        pending: PendingEntry<'a>,
        my_revision: i64,
    },
}

impl Grants {
    pub(crate) fn new(conn: Arc<Connection>) -> Self {
        Self { conn }
    }

    /// A try-once grant of `key`'s mutex.
    pub(crate) async fn try_take(
        &self,
        key: &LockKey,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        let op = Operation::TryAcquire;
        let key_prefix = self.conn.key_prefix(key);
        match self
            .attempt(key, &key_prefix, Layout::Mutex, ttl, op)
            .await?
        {
            Attempt::Granted(lease) => Ok(Some(lease)),
            Attempt::Queued { pending, .. } => {
                Box::pin(pending.remove_now()).await;
                Ok(None)
            }
        }
    }

    /// etcd's concurrency mutex (and election: the same queue) under
    /// `key_prefix`: creates our entry on a session of `ttl`, granted when
    /// it is the oldest. The lease is keyed on `key`.
    pub(crate) async fn attempt(
        &self,
        key: &LockKey,
        key_prefix: &str,
        layout: Layout,
        ttl: Duration,
        op: Operation,
    ) -> Result<Attempt<'_>, LockError> {
        check_ttl(ttl, MIN_TTL, op).map_err(|e| e.with_key(key).with_backend(NAME))?;
        let session = self
            .conn
            .session_for(ttl, op)
            .await
            .map_err(|e| e.with_key(key))?;
        let mut pending = self.conn.claim_pending(&session, key_prefix);
        let (entry, owner) = (pending.entry.clone(), pending.owner);
        let sent_at = Instant::now();
        // The same value for a candidate: `etcdctl elect -l` prints it
        // as the proposal (see the crate docs).
        let value = mutex_value(owner);
        let create = Box::pin(self.create_entry(
            key_prefix.to_owned(),
            entry,
            session.lease_id(),
            (owner, value),
            op,
        ));
        let (my_revision, owner_revision) = pending.run_create(create, key, op).await?;
        if owner_revision == Some(my_revision) {
            return pending
                .granted(key, ttl, sent_at, op)
                .exclusive(layout)
                .map(Attempt::Granted);
        }
        Ok(Attempt::Queued {
            session,
            pending,
            my_revision,
        })
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
        let mut kv = self.conn.client.kv_client();
        let op_timeout = self.conn.config.op_timeout;
        async move {
            let txn = create_txn(&key_prefix, &entry, lease_id, value);
            let response = txn_on(&mut kv, op_timeout, op, txn).await?;
            Ok(Created::from_response(&response, owner))
        }
    }

    /// Releases a mutex lease: the guarded delete of its entry.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let op = Operation::Release;
        let Some((entry, revision, lease_id)) = self.resolve_lease(lease, op).await? else {
            return Ok(false);
        };
        let session = self.conn.session_by_lease(lease_id);
        if let Some(session) = &session {
            session.unmark_held(&entry, revision, lease.owner());
        }
        let delete = guarded_delete(&entry, revision, lease.owner());
        // Our session would keep the entry alive: on failure keep trying.
        self.delete_released(op, delete, lease, (entry, revision), session, true)
            .await
    }

    /// Sends a release's guarded `delete` of `entry` (created at its
    /// revision) and returns whether it deleted it. On success the session
    /// frees the entry's name; on failure, if `clean_up_on_failure`, a task
    /// of its own keeps deleting the entry while the session lives.
    pub(crate) async fn delete_released(
        &self,
        op: Operation,
        delete: Txn,
        lease: &Lease,
        (entry, revision): (String, i64),
        session: Option<Arc<Session>>,
        clean_up_on_failure: bool,
    ) -> Result<bool, LockError> {
        match self.conn.txn(op, delete).await {
            Ok(response) => {
                let released = response.succeeded();
                if released && let Some(session) = &session {
                    session.free_entry(&entry);
                }
                Ok(released)
            }
            Err(err) => {
                if clean_up_on_failure && let Some(session) = session {
                    clean_up_later(&self.conn.client, session, entry, lease.owner(), revision);
                }
                Err(err.with_key(lease.key()))
            }
        }
    }

    /// Checks a lease's entry against the key it claims, and returns
    /// (entry, revision, lease id): see [`keys::entry_of_lease`].
    pub(crate) fn parse_lease(
        &self,
        lease: &Lease,
        op: Operation,
    ) -> Result<(String, i64, i64), LockError> {
        let bad = |why: &str| not_our_lease(lease, op, why);
        let (key_prefix, data) = match lease.backend_data().strip_prefix(keys::ELECTION_DATA) {
            Some(leaf) => (
                self.conn
                    .election_prefix_of(lease.key())
                    .ok_or_else(|| bad("an election lease not keyed on election/<name>"))?,
                leaf,
            ),
            None => (self.conn.key_prefix(lease.key()), lease.backend_data()),
        };
        let (entry, lease_id) = keys::entry_of_lease(key_prefix, data).map_err(bad)?;
        let revision = i64::try_from(lease.token().get()).map_err(|_| bad("token"))?;
        Ok((entry, revision, lease_id))
    }

    /// (entry, create revision, lease id) of a shared lease.
    pub(crate) fn parse_shared_lease(
        &self,
        lease: &Lease,
        op: Operation,
    ) -> Result<(String, i64, i64), LockError> {
        let bad = |why: &str| not_our_lease(lease, op, why);
        let (leaf, revision) =
            parse_shared_lease_data(lease.backend_data()).ok_or_else(|| bad("entry"))?;
        let prefix = self.conn.shape_prefix(lease.key(), lease.kind().shape());
        let (entry, lease_id) = entry_of_lease(prefix, leaf).map_err(bad)?;
        Ok((entry, revision, lease_id))
    }

    /// The time an entry has left: its own deadline for a grant of this
    /// backend, else an upper bound from its etcd lease (`None` when that
    /// cannot be read, or for an entry without a lease).
    pub(crate) async fn remaining_ttl(
        &self,
        entry: &str,
        lease_id: i64,
        op: Operation,
    ) -> Option<Duration> {
        let own_due = self
            .conn
            .session_by_lease(lease_id)
            .and_then(|s| s.due(entry));
        if let Some(due) = own_due {
            // Held through this backend: it deletes the entry at `due`.
            return Some(due.saturating_duration_since(Instant::now()));
        }
        self.conn.lease_ttl(lease_id, op).await
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
    pub(crate) async fn resolve_lease(
        &self,
        lease: &Lease,
        op: Operation,
    ) -> Result<Option<(String, i64, i64)>, LockError> {
        if lease.kind() != LeaseKind::Exclusive {
            return self.parse_shared_lease(lease, op).map(Some);
        }
        if !lease.backend_data().is_empty() {
            return self.parse_lease(lease, op).map(Some);
        }
        let revision = i64::try_from(lease.token().get()).map_err(|_| {
            LockError::invalid_argument(op, "not an etcd lease of this backend: token")
                .with_key(lease.key())
                .with_backend(NAME)
        })?;
        let mut entry = self.conn.key_prefix(lease.key());
        if let Some(session) = self.conn.session_owning(lease.owner()) {
            entry.push_str(session.hex());
            return Ok(Some((entry, revision, session.lease_id())));
        }
        // Boxed: rare, and inline the read would enlarge every release.
        Box::pin(self.look_up_entry(lease, entry, revision, op)).await
    }

    /// [`Self::resolve_lease`]'s read of a lease's `entry` by its create
    /// `revision`, for a lease of no session of this backend.
    async fn look_up_entry(
        &self,
        lease: &Lease,
        entry: String,
        revision: i64,
        op: Operation,
    ) -> Result<Option<(String, i64, i64)>, LockError> {
        let mut kv = self.conn.client.kv_client();
        let response = with_timeout(self.conn.config.op_timeout, op, async {
            kv.get(entry.as_str(), Some(keys::created_at(revision)))
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

    /// The mutex's holder of `key` as `inspect` reports it.
    pub(crate) async fn inspect_mutex(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        Ok(self
            .read_holder(key, Operation::Inspect)
            .await?
            .map(|holder| holder.info))
    }

    /// The holder of `key` (its oldest entry), as `inspect` reports it.
    pub(crate) async fn read_holder(
        &self,
        key: &LockKey,
        op: Operation,
    ) -> Result<Option<HolderEntry>, LockError> {
        Ok(self.read_holder_at(key, op).await?.0)
    }

    /// The oldest entry under `prefix` (the holder of a key, the leader of
    /// an election), with the store's revision, in one range read.
    pub(crate) async fn read_oldest(
        &self,
        prefix: &str,
        op: Operation,
    ) -> Result<GetResponse, LockError> {
        let mut kv = self.conn.client.kv_client();
        with_timeout(self.conn.config.op_timeout, op, async {
            kv.get(prefix, Some(keys::oldest_entry()))
                .await
                .map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_backend(NAME))
    }

    /// The holder and the store's revision of the read.
    pub(crate) async fn read_holder_at(
        &self,
        key: &LockKey,
        op: Operation,
    ) -> Result<(Option<HolderEntry>, i64), LockError> {
        let key_prefix = self.conn.key_prefix(key);
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
}

/// The holder's entry of a key, as read.
pub(crate) struct HolderEntry {
    pub(crate) info: LockInfo,
    pub(crate) entry: String,
    pub(crate) revision: i64,
    pub(crate) lease_id: i64,
}

/// The holder `holder` (an entry under `key_prefix`) of `key`.
pub(crate) fn holder_entry(
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

/// Refuses (`LeaseLost`) a grant whose session was lost before it could be
/// handed out.
pub(crate) fn session_alive(
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
pub(crate) struct Grant {
    pub(crate) kind: LeaseKind,
    pub(crate) token: u64,
    /// The lease's backend data, naming its entry.
    pub(crate) data: String,
}

/// Our entry `pending` under `key`, granted by the request sent at
/// `sent_at`: what turning it into a lease of `ttl` takes. On failure the
/// entry is removed (as `pending` drops).
pub(crate) struct EntryGrant<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) pending: PendingEntry<'a>,
    pub(crate) ttl: Duration,
    pub(crate) sent_at: Instant,
    pub(crate) op: Operation,
}

impl<'a> PendingEntry<'a> {
    /// This entry, granted (for `key`, in `op`) by the request sent at
    /// `sent_at`, to become a lease of `ttl`.
    pub(crate) fn granted(
        self,
        key: &'a LockKey,
        ttl: Duration,
        sent_at: Instant,
        op: Operation,
    ) -> EntryGrant<'a> {
        EntryGrant {
            key,
            pending: self,
            ttl,
            sent_at,
            op,
        }
    }
}

impl EntryGrant<'_> {
    /// The mutex's (or an election's) lease of our oldest entry: its
    /// token is the entry's create revision.
    pub(super) fn exclusive(self, layout: Layout) -> Result<Lease, LockError> {
        let revision = self.pending.revision.unwrap_or(0);
        let token = u64::try_from(revision)
            .map_err(|_| protocol_error(self.op, self.key, "negative revision"))?;
        let entry = &self.pending.entry;
        let data = match layout {
            Layout::Mutex => lease_data(self.pending.session.hex(), entry).to_owned(),
            Layout::Election => election_lease_data(entry),
        };
        let grant = Grant {
            kind: LeaseKind::Exclusive,
            token,
            data,
        };
        self.lease(grant)
    }

    /// Builds the lease `grant` describes and hands it out (see
    /// [`hand_out`](Self::hand_out)); fails if the session was lost
    /// meanwhile.
    pub(crate) fn lease(self, grant: Grant) -> Result<Lease, LockError> {
        let revision = self.pending.revision.unwrap_or(0);
        session_alive(&self.pending.session, self.key, self.op)?;
        let lease = Lease::granted(
            self.key.clone(),
            self.pending.owner,
            FencingToken::new(grant.token),
            self.ttl,
            self.sent_at,
            grant.data,
        )
        .map_err(|e| e.with_backend(NAME))?
        .with_kind(grant.kind);
        self.hand_out(lease, revision)
    }

    /// Hands out `lease` for our entry (a mutex, election or shared
    /// grant): its validity ends no later than the session's lease, which
    /// the entry lives by (`LeaseLost` when that has passed, the entry then
    /// removed), and the entry is marked held until `ttl` after `sent_at`
    /// (deleted then unless renewed, not kept as long as the session
    /// lives).
    fn hand_out(self, mut lease: Lease, revision: i64) -> Result<Lease, LockError> {
        let Self {
            key,
            mut pending,
            ttl,
            sent_at,
            op,
        } = self;
        let deadline = lease.validity_deadline().min(pending.session.deadline());
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
        let signal = pending
            .session
            .mark_held(&pending.entry, revision, pending.owner, due);
        pending.armed = false;
        Ok(lease.with_session(signal))
    }
}

/// The error for a lease this backend did not grant (or that was altered):
/// `why` names the part that does not parse.
fn not_our_lease(lease: &Lease, op: Operation, why: &str) -> LockError {
    LockError::invalid_argument(op, format!("not an etcd lease of this backend: {why}"))
        .with_key(lease.key())
        .with_backend(NAME)
}
