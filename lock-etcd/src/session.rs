//! One etcd lease per session, kept alive by one keep-alive stream.
//!
//! Every lock entry a backend creates with a given TTL is attached to the
//! lease of that TTL's session, so holding many locks costs one keep-alive.
//! The session publishes its [`SessionState`] to every lease handed out:
//! `Suspect` as soon as a keep-alive fails, `Lost` when the server says the
//! lease is gone (keep-alive TTL <= 0) or, at the latest, at the local
//! deadline (`last successful keep-alive sent + TTL - drift`), which comes
//! before the server can expire the lease.
//!
//! Each grant also has a deadline of its own (`sent + TTL`, moved by every
//! renewal): when it passes without a renewal, the session's expiry task
//! deletes the entry (compare on its create revision and owner), so a lock
//! stops being held when its own TTL runs out, whether its guard stopped
//! renewing (capped renewals, renewal disabled, lost), its lease was dropped
//! without a release, or it was never renewed at all. The session lease only
//! bounds the case where this process cannot delete it (crashed,
//! partitioned).
//!
//! Per held lock the session keeps one map slot (the entry name, shared by
//! an `Arc` with the expiry queue, its revision, owner and deadline) and at
//! most one live expiry-queue element; every lease of the session carries a
//! receiver of the session's one state channel (no channel per grant).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::num::NonZeroI64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use lock_core::{
    ErrorKind, LockError, Operation, OwnerId, SessionState, validity_deadline, with_timeout,
};
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, sleep, sleep_until};

use crate::error::{NAME, from_etcd};

/// A granted lease, its keep-alive task, and what this process knows about
/// the entries attached to it.
pub(crate) struct Session {
    lease_id: i64,
    server_ttl: Duration,
    state: watch::Sender<SessionState>,
    deadline: Mutex<Instant>,
    /// The entries and their deadlines.
    entries: Mutex<Entries>,
    counter: AtomicU64,
    /// The origin of the compact deadlines ([`Ticks`]).
    base: Instant,
    /// Wakes the expiry task: an earlier deadline, a loss, the drop.
    expiry_wake: Arc<Notify>,
}

/// An instant as nanoseconds after the session's `base` (exact: the
/// monotonic clock counts nanoseconds), 8 bytes instead of 16.
type Ticks = u64;

#[derive(Default)]
struct Entries {
    /// Entry names that may exist on the server (held, waiting, or being
    /// cleaned up), never reused for another grant while listed, with the
    /// grant if one is handed out on it.
    names: HashMap<Arc<str>, Option<HeldGrant>>,
    /// Grant deadlines, earliest first: (deadline, revision, entry), the
    /// name shared with `names`. One element per held grant: a renewal only
    /// moves the grant's deadline, and the element is pushed again at the
    /// new deadline when it comes up. Elements of released grants are
    /// dropped when they come up.
    expiries: BinaryHeap<Reverse<(Ticks, i64, Arc<str>)>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        // The expiry task only holds a weak reference: let it end.
        self.expiry_wake.notify_one();
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("lease_id", &format_args!("{:x}", self.lease_id))
            .field("ttl", &self.server_ttl)
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

/// A grant handed out from this session.
struct HeldGrant {
    /// Its entry's create revision (always positive).
    revision: NonZeroI64,
    owner: OwnerId,
    /// When the entry is deleted unless renewed first: the grant's (or last
    /// renewal's) send time plus the lock's TTL.
    due: Ticks,
}

impl HeldGrant {
    fn is(&self, revision: i64, owner: OwnerId) -> bool {
        self.revision.get() == revision && self.owner == owner
    }
}

/// Why a renewal of a grant of this session was refused.
pub(crate) enum RenewRefused {
    /// Not held (released, lost, or another grant).
    NotHeld,
    /// Its deadline passed before the renewal: it is being deleted.
    Expired,
}

/// A grant whose TTL ran out, to delete.
pub(crate) struct ExpiredGrant {
    pub(crate) entry: String,
    pub(crate) revision: i64,
    pub(crate) owner: OwnerId,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Session {
    /// Grants a lease of `ttl` (rounded up to whole seconds by the caller)
    /// and starts keeping it alive.
    pub(crate) async fn start(
        client: &Client,
        ttl_secs: i64,
        op_timeout: Duration,
    ) -> Result<Arc<Self>, LockError> {
        let mut lease_client = client.lease_client();
        let sent_at = Instant::now();
        let grant = with_timeout(op_timeout, Operation::Acquire, async {
            lease_client
                .grant(ttl_secs, None)
                .await
                .map_err(|e| from_etcd(Operation::Acquire, e))
        })
        .await?;
        if !grant.error().is_empty() || grant.ttl() <= 0 {
            return Err(LockError::new(
                ErrorKind::Backend,
                Operation::Acquire,
                format!("lease grant refused: {}", grant.error()),
            )
            .with_backend(NAME));
        }
        let server_ttl = Duration::from_secs(u64::try_from(grant.ttl()).unwrap_or(1));
        let (state, _) = watch::channel(SessionState::Alive);
        let session = Arc::new(Self {
            lease_id: grant.id(),
            server_ttl,
            state,
            deadline: Mutex::new(validity_deadline(sent_at, server_ttl)),
            entries: Mutex::new(Entries::default()),
            counter: AtomicU64::new(0),
            base: sent_at,
            expiry_wake: Arc::new(Notify::new()),
        });
        tracing::debug!(lease = %format_args!("{:x}", grant.id()), ttl = ?server_ttl, "etcd session started");
        tokio::spawn(keep_alive_loop(
            client.clone(),
            Arc::downgrade(&session),
            op_timeout,
        ));
        tokio::spawn(expiry_loop(
            client.clone(),
            Arc::downgrade(&session),
            session.expiry_wake.clone(),
        ));
        Ok(session)
    }

    pub(crate) fn lease_id(&self) -> i64 {
        self.lease_id
    }

    /// The lease id as etcd's concurrency package prints it in entry names.
    pub(crate) fn lease_hex(&self) -> String {
        format!("{:x}", self.lease_id)
    }

    /// The TTL the server granted.
    pub(crate) fn server_ttl(&self) -> Duration {
        self.server_ttl
    }

    /// The instant before which the server cannot have expired the lease.
    pub(crate) fn deadline(&self) -> Instant {
        *lock(&self.deadline)
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<SessionState> {
        self.state.subscribe()
    }

    pub(crate) fn state(&self) -> SessionState {
        self.state.borrow().clone()
    }

    /// Not lost and before its local deadline.
    pub(crate) fn is_alive(&self) -> bool {
        !matches!(*self.state.borrow(), SessionState::Lost(_)) && Instant::now() < self.deadline()
    }

    /// Picks the entry key for a new grant under `key_prefix` (which ends
    /// with the separator): `<key_prefix><lease hex>`, the layout of etcd's
    /// concurrency mutex, unless this session already has an entry there
    /// (a second grant of the same key from the same backend), which then
    /// gets `<lease hex>-<n>`. Both sort under the key's prefix, so the
    /// grants exclude each other (and `etcdctl lock`) by create revision.
    pub(crate) fn claim_entry(&self, key_prefix: &str) -> String {
        let mut entries = lock(&self.entries);
        let primary = format!("{key_prefix}{}", self.lease_hex());
        if !entries.names.contains_key(primary.as_str()) {
            entries.names.insert(Arc::from(primary.as_str()), None);
            return primary;
        }
        loop {
            let n = self.counter.fetch_add(1, Ordering::Relaxed);
            let name = format!("{primary}-{n}");
            if !entries.names.contains_key(name.as_str()) {
                entries.names.insert(Arc::from(name.as_str()), None);
                return name;
            }
        }
    }

    /// The entry is known to be gone from the server: its name may be
    /// reused. A name a grant is handed out on is kept (a late second
    /// cleanup of an earlier grant must not free a newer one's name).
    pub(crate) fn free_entry(&self, entry: &str) {
        let mut entries = lock(&self.entries);
        if matches!(entries.names.get(entry), Some(None)) {
            entries.names.remove(entry);
        }
    }

    fn ticks(&self, at: Instant) -> Ticks {
        Ticks::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(Ticks::MAX)
    }

    fn instant(&self, ticks: Ticks) -> Instant {
        // Ticks saturate beyond centuries: far enough ahead either way.
        self.base
            .checked_add(Duration::from_nanos(ticks))
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 86_400))
    }

    /// Records a grant, deleted at `due` unless renewed, and returns the
    /// state receiver its lease carries (of the session's one channel).
    pub(crate) fn mark_held(
        &self,
        entry: &str,
        revision: i64,
        owner: OwnerId,
        due: Instant,
    ) -> watch::Receiver<SessionState> {
        let due = self.ticks(due);
        let mut guard = lock(&self.entries);
        let entries = &mut *guard;
        if let Some(revision) = NonZeroI64::new(revision) {
            let grant = HeldGrant {
                revision,
                owner,
                due,
            };
            let name = match entries.names.get_key_value(entry) {
                Some((name, _)) => name.clone(),
                None => Arc::from(entry),
            };
            entries.names.insert(name.clone(), Some(grant));
            let earliest = entries
                .expiries
                .peek()
                .is_none_or(|Reverse((next, _, _))| due < *next);
            entries.expiries.push(Reverse((due, revision.get(), name)));
            if earliest {
                self.expiry_wake.notify_one();
            }
        }
        drop(guard);
        self.state.subscribe()
    }

    /// Moves a grant's deadline to `due` if it is held and its deadline has
    /// not passed by `now`. A grant whose deadline passed is forgotten and
    /// returned as [`RenewRefused::Expired`]: the caller deletes it.
    pub(crate) fn renew_held(
        &self,
        entry: &str,
        revision: i64,
        owner: OwnerId,
        now: Instant,
        due: Instant,
    ) -> Result<(), RenewRefused> {
        let (now, due) = (self.ticks(now), self.ticks(due));
        let mut entries = lock(&self.entries);
        let slot = entries.names.get_mut(entry).ok_or(RenewRefused::NotHeld)?;
        let Some(grant) = slot.as_mut().filter(|g| g.is(revision, owner)) else {
            return Err(RenewRefused::NotHeld);
        };
        if grant.due <= now {
            // The name stays listed until the entry's cleanup frees it.
            *slot = None;
            return Err(RenewRefused::Expired);
        }
        // Its queue element, at an earlier deadline, moves it on when it
        // comes up: nothing is pushed here.
        grant.due = grant.due.max(due);
        Ok(())
    }

    /// When a grant is deleted unless renewed, if it is held.
    pub(crate) fn due(&self, entry: &str) -> Option<Instant> {
        let due = lock(&self.entries)
            .names
            .get(entry)
            .and_then(|slot| slot.as_ref().map(|g| g.due))?;
        Some(self.instant(due))
    }

    /// Removes and returns the grants whose deadline passed by `now`, and
    /// the next deadline to look at.
    fn take_expired(&self, now: Instant) -> (Vec<ExpiredGrant>, Option<Instant>) {
        let now = self.ticks(now);
        let mut guard = lock(&self.entries);
        let entries = &mut *guard;
        let mut expired = Vec::new();
        while let Some(Reverse((due, _, _))) = entries.expiries.peek() {
            if *due > now {
                break;
            }
            let Some(Reverse((_, revision, entry))) = entries.expiries.pop() else {
                break;
            };
            let Some(slot) = entries.names.get_mut(&entry) else {
                continue;
            };
            match slot {
                // Renewed since: its element moves to the new deadline.
                Some(grant) if grant.revision.get() == revision && grant.due > now => {
                    let due = grant.due;
                    entries.expiries.push(Reverse((due, revision, entry)));
                }
                Some(grant) if grant.revision.get() == revision => {
                    let owner = grant.owner;
                    // Listed until the cleanup frees the name.
                    *slot = None;
                    expired.push(ExpiredGrant {
                        entry: entry.as_ref().to_owned(),
                        revision,
                        owner,
                    });
                }
                // Released (or the name reused by another grant).
                _ => {}
            }
        }
        let next = entries
            .expiries
            .peek()
            .map(|Reverse((due, _, _))| self.instant(*due));
        (expired, next)
    }

    /// Forgets a grant; returns whether it was held with this revision and
    /// owner. Its name stays listed until [`Self::free_entry`].
    pub(crate) fn unmark_held(&self, entry: &str, revision: i64, owner: OwnerId) -> bool {
        let mut entries = lock(&self.entries);
        match entries.names.get_mut(entry) {
            Some(slot) if slot.as_ref().is_some_and(|g| g.is(revision, owner)) => {
                *slot = None;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn holds(&self, entry: &str, revision: i64, owner: OwnerId) -> bool {
        lock(&self.entries)
            .names
            .get(entry)
            .is_some_and(|slot| slot.as_ref().is_some_and(|g| g.is(revision, owner)))
    }

    /// Moves the state (never out of `Lost`); every lease holds a receiver.
    fn set_state(&self, next: SessionState) {
        self.state.send_if_modified(|state| {
            if matches!(state, SessionState::Lost(_)) || *state == next {
                false
            } else {
                *state = next.clone();
                true
            }
        });
    }

    /// Declares the session lost: every lease on it gets the lost signal.
    pub(crate) fn lose(&self, reason: &str) {
        if !matches!(*self.state.borrow(), SessionState::Lost(_)) {
            tracing::warn!(lease = %self.lease_hex(), %reason, "etcd session lost");
        }
        self.set_state(SessionState::Lost(reason.to_owned()));
        let mut entries = lock(&self.entries);
        entries.names = HashMap::new();
        entries.expiries = BinaryHeap::new();
        drop(entries);
        self.expiry_wake.notify_one();
    }

    fn extend(&self, deadline: Instant) {
        let mut current = lock(&self.deadline);
        if deadline > *current {
            *current = deadline;
        }
    }
}

/// Sends one keep-alive on the open stream (opening it if needed) and
/// returns the TTL the server answered with.
async fn one_keep_alive(
    client: &Client,
    stream: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    lease_id: i64,
) -> Result<i64, LockError> {
    let op = Operation::Renew;
    match stream {
        None => {
            // Opening the stream sends the first keep-alive and waits for its
            // answer (an error when the lease is gone).
            let opened = client
                .lease_client()
                .keep_alive(lease_id)
                .await
                .map_err(|e| from_etcd(op, e))?;
            *stream = Some(opened);
            Ok(i64::MAX)
        }
        Some((keeper, responses)) => {
            keeper.keep_alive().await.map_err(|e| from_etcd(op, e))?;
            match responses.message().await.map_err(|e| from_etcd(op, e))? {
                Some(response) => Ok(response.ttl()),
                None => Err(LockError::new(
                    ErrorKind::Unavailable,
                    op,
                    "keep-alive stream closed",
                )),
            }
        }
    }
}

/// Keeps the lease alive every TTL/3 until the session is dropped or lost.
///
/// Each attempt is bounded by TTL/3 (and the operation timeout), so a hung
/// server turns the session `Suspect` well before the deadline; a stream
/// whose request timed out is dropped, so a late answer is never credited
/// to a newer request.
async fn keep_alive_loop(client: Client, session: Weak<Session>, op_timeout: Duration) {
    let mut stream = None;
    let mut failures: u32 = 0;
    loop {
        let Some(s) = session.upgrade() else { return };
        let ttl = s.server_ttl;
        let interval = (ttl / 3).max(Duration::from_millis(100));
        let deadline = s.deadline();
        let lease_id = s.lease_id;
        drop(s);
        let sent_at = Instant::now();
        if sent_at >= deadline {
            if let Some(s) = session.upgrade() {
                s.lose("no keep-alive succeeded before the lease's local deadline");
                revoke_in_background(&client, lease_id, ttl);
            }
            return;
        }
        let budget = op_timeout.min(interval).min(deadline - sent_at);
        let outcome =
            tokio::time::timeout(budget, one_keep_alive(&client, &mut stream, lease_id)).await;
        let Some(s) = session.upgrade() else { return };
        match outcome {
            Ok(Ok(server_ttl)) if server_ttl > 0 => {
                let granted = u64::try_from(server_ttl)
                    .map(Duration::from_secs)
                    .unwrap_or(ttl)
                    .min(ttl);
                s.extend(validity_deadline(sent_at, granted));
                s.set_state(SessionState::Alive);
                failures = 0;
                drop(s);
                sleep_until(sent_at + interval).await;
            }
            Ok(Ok(_)) => {
                s.lose("the lease expired on the server (keep-alive answered TTL 0)");
                return;
            }
            Ok(Err(err)) if err.kind() == ErrorKind::LeaseLost => {
                s.lose(&format!("the lease is gone on the server: {err}"));
                return;
            }
            Ok(Err(err)) => {
                tracing::debug!(lease = %s.lease_hex(), %err, "keep-alive failed");
                stream = None;
                s.set_state(SessionState::Suspect);
                failures = failures.saturating_add(1);
                drop(s);
                let backoff = Duration::from_millis(25)
                    .saturating_mul(1 << failures.min(5))
                    .min(interval / 2);
                sleep(backoff.min(deadline.saturating_duration_since(Instant::now()))).await;
            }
            Err(_) => {
                tracing::debug!(lease = %s.lease_hex(), "keep-alive timed out");
                stream = None;
                s.set_state(SessionState::Suspect);
                failures = failures.saturating_add(1);
            }
        }
    }
}

/// Deletes each grant of the session whose own deadline passed without a
/// renewal (the lease would keep it as long as the session lives). Sleeps
/// until the earliest deadline, or until woken by an earlier one, the
/// session's loss or its drop.
async fn expiry_loop(client: Client, session: Weak<Session>, wake: Arc<Notify>) {
    loop {
        let next = {
            let Some(s) = session.upgrade() else { return };
            if matches!(s.state(), SessionState::Lost(_)) {
                return;
            }
            let (expired, next) = s.take_expired(Instant::now());
            for grant in expired {
                tracing::debug!(entry = %grant.entry, "lock TTL ran out without a renewal; deleting its entry");
                tokio::spawn(crate::driver::cleanup(
                    client.clone(),
                    s.clone(),
                    grant.entry,
                    grant.owner,
                    None,
                    Some(grant.revision),
                ));
            }
            next
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = sleep_until(at) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

/// Revokes a lease we gave up on, so that entries the server may still
/// keep (a lease outlives a leader change) vanish as soon as it is
/// reachable. Best effort, for a bounded time.
pub(crate) fn revoke_in_background(client: &Client, lease_id: i64, ttl: Duration) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let mut lease_client = client.lease_client();
    handle.spawn(async move {
        let give_up = Instant::now() + ttl.saturating_mul(3).max(Duration::from_secs(5));
        let mut delay = Duration::from_millis(50);
        while Instant::now() < give_up {
            match tokio::time::timeout(Duration::from_secs(1), lease_client.revoke(lease_id)).await
            {
                Ok(Ok(_)) => return,
                Ok(Err(err)) => {
                    if from_etcd(Operation::Release, err).kind() == ErrorKind::LeaseLost {
                        return;
                    }
                }
                Err(_) => {}
            }
            sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    });
}
