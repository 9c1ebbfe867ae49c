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
//! Per held lock the session keeps one map slot of 32 bytes and nothing
//! else: a keyed hash of the part of the entry name that is not the same
//! for every entry of the session (the escaped key and any `-<n>` suffix,
//! without the backend prefix and the lease id), its revision, the low half
//! of its owner id (the high half is the session's) and its deadline. The
//! name itself is not kept: two names with the same hash never coexist
//! (a new entry whose hash is taken gets the next suffixed name), and the
//! expiry task, the only one that needs a name it was not handed, reads the
//! names of the session's entries back from the server (one
//! `LeaseTimeToLive` listing its keys, as a renewal batch does). There is no
//! expiry queue: the expiry task looks over the slots when the earliest
//! deadline it saw comes up (at most every [`EXPIRY_SCAN_GAP`]), so a grant
//! is deleted at most that long after its deadline (plus that listing's and
//! the delete's round trips). Every lease of the session carries a receiver
//! of the session's one state channel (no channel per grant).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::num::NonZeroI64;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{Client, LeaseTimeToLiveOptions, LeaseTimeToLiveResponse};
use lock_core::{
    LockError, Operation, OwnerId, RandomKeys, SessionState, validity_deadline, with_timeout,
};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::error::{from_etcd, grant_refused};
use crate::keys::{numbered_entry, plain_entry};

mod expiry;
mod keep_alive;

use expiry::expiry_loop;
use keep_alive::keep_alive_loop;
pub(crate) use keep_alive::revoke_in_background;

/// A granted lease, its keep-alive task, and what this process knows about
/// the entries attached to it.
pub(crate) struct Session {
    lease_id: i64,
    server_ttl: Duration,
    state: watch::Sender<SessionState>,
    deadline: Mutex<Instant>,
    /// The entries and their deadlines.
    entries: Mutex<Entries>,
    /// What every entry name of the backend starts with: its prefix and the
    /// separator (empty without a prefix).
    root: Box<str>,
    /// The lease id in hex, as in entry names.
    hex: Box<str>,
    counter: AtomicU64,
    /// The high half of every owner id this session hands out (random),
    /// and the counter that makes the low half.
    owner_high: u64,
    owners: AtomicU64,
    /// The newest create revision of an entry handed out as a grant: every
    /// grant up to it was on the server when this was read.
    newest_grant: AtomicI64,
    /// The origin of the compact deadlines ([`Ticks`]).
    base: Instant,
    /// Keys the hashes of the entry names' tails (see [`Entries::names`]).
    hasher: RandomState,
    /// Wakes the expiry task: an earlier deadline, a loss, the drop.
    expiry_wake: Arc<Notify>,
    /// Wakes the keep-alive task when the session is dropped, so that it
    /// ends (and lets go of its client and stream) at once rather than at
    /// its next keep-alive, up to TTL/3 later.
    keep_alive_wake: Arc<Notify>,
}

/// An instant as nanoseconds after the session's `base` (exact: the
/// monotonic clock counts nanoseconds), 8 bytes instead of 16.
type Ticks = u64;

/// The shortest time between two looks of the expiry task over the
/// session's grants: a grant whose TTL ran out is deleted at most this long
/// after its deadline (plus the delete's round trip). One look walks the
/// session's table under its lock, in time proportional to the grants
/// held; it comes when the earliest deadline seen does, which renewals
/// usually moved on by then.
pub(crate) const EXPIRY_SCAN_GAP: Duration = Duration::from_millis(20);

struct Entries {
    /// Entries that may exist on the server (held, waiting, or being
    /// cleaned up), never reused for another grant while listed, with the
    /// grant if one is handed out on it. Keyed by the session's keyed hash
    /// of the name's *tail* (see [`Session::slot_of`]): of `<escaped key>/`
    /// for the session's plain entry under a key, of `<escaped key>/-<n>`
    /// for a suffixed one. A name whose hash is listed is never given out
    /// ([`Session::claim_entry`]), so a hash stands for one name at a time.
    names: HashMap<Slot, Option<HeldGrant>, RandomKeys>,
    /// When the expiry task looks next (`Ticks::MAX`: not before it is
    /// woken). A grant due earlier wakes it.
    planned: Ticks,
    /// About the size of the session's key listing (`LeaseTimeToLive` with
    /// keys): the listed names' lengths plus their framing.
    listed_bytes: usize,
}

impl Entries {
    /// Lists a name of `len` bytes.
    fn listed(&mut self, len: usize) {
        self.listed_bytes = self.listed_bytes.saturating_add(len + NAME_FRAMING);
    }

    /// Removes `slot`, whose name is `len` bytes long (`None`: not known,
    /// counted as the average name).
    fn unlist(&mut self, slot: Slot, len: Option<usize>) {
        let average = self.listed_bytes / self.names.len().max(1);
        if self.names.remove(&slot).is_some() {
            let freed = len.map_or(average, |len| len + NAME_FRAMING);
            self.listed_bytes = self.listed_bytes.saturating_sub(freed);
        }
    }
}

/// Bytes a listed key costs in a `LeaseTimeToLive` answer besides its name
/// (field tag and length).
const NAME_FRAMING: usize = 3;

/// How large a session's key listing may grow before new grants go to
/// another session of the same TTL: half the 4 MiB the client accepts in
/// one answer (gRPC's default, which the etcd client does not let us raise
/// for lease calls). At about 45 bytes a name (a 20-byte key), that is some
/// 44,000 entries a session: a client holding 100,000 such locks keeps
/// three sessions, one keep-alive stream and one listing per renewal round
/// each.
pub(crate) const LISTING_BUDGET: usize = 2 << 20;

impl Default for Entries {
    fn default() -> Self {
        Self {
            names: HashMap::default(),
            planned: Ticks::MAX,
            listed_bytes: 0,
        }
    }
}

/// The keyed hash of an entry name's tail: its key in [`Entries::names`].
type Slot = u64;

impl Drop for Session {
    fn drop(&mut self) {
        // The expiry and keep-alive tasks only hold weak references: let
        // them end.
        self.expiry_wake.notify_one();
        self.keep_alive_wake.notify_one();
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
    /// The low half of its owner id; the high half is the session's
    /// (see [`Session::new_owner`]). 8 bytes: a whole `u128` would pad the
    /// map slot from 40 to 48 bytes.
    owner_low: u64,
    /// When the entry is deleted unless renewed first: the grant's (or last
    /// renewal's) send time plus the lock's TTL.
    due: Ticks,
}

impl HeldGrant {
    fn is(&self, revision: i64, owner: OwnerId, owner_high: u64) -> bool {
        self.revision.get() == revision && split_owner(owner) == (owner_high, self.owner_low)
    }
}

/// An owner id's (high, low) halves.
fn split_owner(owner: OwnerId) -> (u64, u64) {
    let value = owner.as_u128();
    // Truncation intended: the two halves.
    #[allow(clippy::cast_possible_truncation)]
    ((value >> 64) as u64, value as u64)
}

/// Why a renewal of a grant of this session was refused.
pub(crate) enum RenewRefused {
    /// Not held (released, lost, or another grant).
    NotHeld,
    /// Its deadline passed before the renewal: it is being deleted.
    Expired,
}

/// A grant whose TTL ran out, to delete once its entry's name is read
/// back from the server.
struct ExpiredGrant {
    slot: Slot,
    revision: i64,
    owner: OwnerId,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Session {
    /// Grants a lease of `ttl` (rounded up to whole seconds by the caller)
    /// and starts keeping it alive.
    ///
    /// `root` is what every entry name of the backend starts with (its
    /// prefix and the separator, or nothing).
    pub(crate) async fn start(
        client: &Client,
        root: &str,
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
        if let Some(err) = grant_refused(Operation::Acquire, "the session's lease grant", &grant) {
            return Err(err);
        }
        let server_ttl = Duration::from_secs(u64::try_from(grant.ttl()).unwrap_or(1));
        let (state, _) = watch::channel(SessionState::Alive);
        let session = Arc::new(Self {
            lease_id: grant.id(),
            server_ttl,
            state,
            deadline: Mutex::new(validity_deadline(sent_at, server_ttl)),
            entries: Mutex::new(Entries::default()),
            root: Box::from(root),
            hex: format!("{:x}", grant.id()).into_boxed_str(),
            counter: AtomicU64::new(0),
            owner_high: split_owner(OwnerId::random()).0,
            owners: AtomicU64::new(split_owner(OwnerId::random()).1),
            newest_grant: AtomicI64::new(0),
            base: sent_at,
            hasher: RandomState::new(),
            expiry_wake: Arc::new(Notify::new()),
            keep_alive_wake: Arc::new(Notify::new()),
        });
        tracing::debug!(lease = %format_args!("{:x}", grant.id()), ttl = ?server_ttl, "etcd session started");
        tokio::spawn(keep_alive_loop(
            client.clone(),
            Arc::downgrade(&session),
            session.keep_alive_wake.clone(),
            op_timeout,
        ));
        tokio::spawn(expiry_loop(
            client.clone(),
            Arc::downgrade(&session),
            session.expiry_wake.clone(),
            op_timeout,
        ));
        Ok(session)
    }

    pub(crate) fn lease_id(&self) -> i64 {
        self.lease_id
    }

    /// The lease id as etcd's concurrency package prints it in entry names.
    pub(crate) fn lease_hex(&self) -> String {
        self.hex.to_string()
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

    /// How long a call checking this session's entries on the server may
    /// take: `op_timeout`, at most a third of the session's TTL and half
    /// the time left before its deadline, so that a server that does not
    /// answer fails the call (a renewal goes `Suspect` and retries) well
    /// before the lease is lost.
    pub(crate) fn call_budget(&self, op_timeout: Duration) -> Duration {
        let left = self.deadline().saturating_duration_since(Instant::now());
        op_timeout
            .min(self.server_ttl / 3)
            .min(left / 2)
            .max(Duration::from_millis(10))
    }

    /// The keys attached to the session's lease: one `LeaseTimeToLive`
    /// listing them, within [`Self::call_budget`]. `Ok(None)`: the server
    /// no longer has the lease (its TTL, whole seconds rounded down, reads
    /// -1; a live lease with under a second left reads 0).
    pub(crate) async fn list_keys(
        &self,
        client: &Client,
        op_timeout: Duration,
        op: Operation,
    ) -> Result<Option<LeaseTimeToLiveResponse>, LockError> {
        let mut lease_client = client.lease_client();
        let answer = with_timeout(self.call_budget(op_timeout), op, async {
            lease_client
                .time_to_live(
                    self.lease_id,
                    Some(LeaseTimeToLiveOptions::new().with_keys()),
                )
                .await
                .map_err(|e| from_etcd(op, e))
        })
        .await?;
        Ok((answer.ttl() >= 0).then_some(answer))
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
        let part = key_prefix.strip_prefix(&*self.root).unwrap_or(key_prefix);
        if let Entry::Vacant(free) = entries.names.entry(self.hash_tail(part, "")) {
            free.insert(None);
            let entry = plain_entry(key_prefix, &self.hex);
            entries.listed(entry.len());
            return entry;
        }
        loop {
            let n = self.counter.fetch_add(1, Ordering::Relaxed);
            if let Entry::Vacant(free) = entries.names.entry(self.hash_tail(part, &format!("-{n}")))
            {
                free.insert(None);
                let entry = numbered_entry(key_prefix, &self.hex, n);
                entries.listed(entry.len());
                return entry;
            }
        }
    }

    /// The newest create revision handed out as a grant so far: a key
    /// listing asked for after reading it includes every grant up to it
    /// that still exists.
    pub(crate) fn newest_grant(&self) -> i64 {
        self.newest_grant.load(Ordering::Relaxed)
    }

    /// Whether new grants may still go to this session: its key listing is
    /// below [`LISTING_BUDGET`].
    pub(crate) fn has_room(&self) -> bool {
        lock(&self.entries).listed_bytes < LISTING_BUDGET
    }

    /// Whether the session has no entry (held, waiting or being cleaned up).
    pub(crate) fn is_idle(&self) -> bool {
        lock(&self.entries).names.is_empty()
    }

    /// Whether `owner` was handed out by this session ([`Self::new_owner`]).
    pub(crate) fn owns(&self, owner: OwnerId) -> bool {
        split_owner(owner).0 == self.owner_high
    }

    /// The lease id in hex, as in entry names.
    pub(crate) fn hex(&self) -> &str {
        &self.hex
    }

    /// A fresh owner id for a grant of this session: the session's random
    /// high half and a counted low half (unique per grant; 2^64 grants per
    /// session before it repeats), so a held grant stores only the low half.
    pub(crate) fn new_owner(&self) -> OwnerId {
        let low = self.owners.fetch_add(1, Ordering::Relaxed);
        OwnerId::from_u128((u128::from(self.owner_high) << 64) | u128::from(low))
    }

    /// The key of `entry` in the session's map: the hash of the name
    /// without the backend's prefix and this session's lease id (`None` for
    /// a name that is not one of this session's entries).
    fn slot_of(&self, entry: &str) -> Option<Slot> {
        let rest = entry.strip_prefix(&*self.root)?;
        let slash = rest.rfind('/')?;
        let (part, leaf) = rest.split_at(slash + 1);
        let suffix = leaf.strip_prefix(&*self.hex)?;
        if !suffix.is_empty() {
            let n = suffix.strip_prefix('-')?;
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
        }
        Some(self.hash_tail(part, suffix))
    }

    /// The keyed hash of the tail `part` + `suffix` (hashed as one string,
    /// without joining them).
    fn hash_tail(&self, part: &str, suffix: &str) -> Slot {
        let mut hasher = self.hasher.build_hasher();
        hasher.write(part.as_bytes());
        hasher.write(suffix.as_bytes());
        hasher.finish()
    }

    /// The entry is known to be gone from the server: its name may be
    /// reused. A name a grant is handed out on is kept (a late second
    /// cleanup of an earlier grant must not free a newer one's name).
    pub(crate) fn free_entry(&self, entry: &str) {
        if let Some(slot) = self.slot_of(entry) {
            self.free_slot(slot, Some(entry.len()));
        }
    }

    /// [`Self::free_entry`] by slot, for a name `len` bytes long (`None`:
    /// not known).
    fn free_slot(&self, slot: Slot, len: Option<usize>) {
        let mut entries = lock(&self.entries);
        if matches!(entries.names.get(&slot), Some(None)) {
            entries.unlist(slot, len);
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
        let (high, owner_low) = split_owner(owner);
        if let (Some(revision), Some(slot), true) = (
            NonZeroI64::new(revision),
            self.slot_of(entry),
            high == self.owner_high,
        ) {
            let grant = HeldGrant {
                revision,
                owner_low,
                due,
            };
            self.newest_grant
                .fetch_max(revision.get(), Ordering::Relaxed);
            let mut entries = lock(&self.entries);
            if entries.names.insert(slot, Some(grant)).is_none() {
                entries.listed(entry.len());
            }
            if due < entries.planned {
                entries.planned = due;
                self.expiry_wake.notify_one();
            }
        }
        self.state.subscribe()
    }

    /// The held grant on `entry` with this revision and owner.
    fn with_grant<T>(
        &self,
        entry: &str,
        revision: i64,
        owner: OwnerId,
        f: impl FnOnce(&mut Option<HeldGrant>) -> T,
    ) -> Option<T> {
        let key = self.slot_of(entry)?;
        let mut entries = lock(&self.entries);
        let slot = entries.names.get_mut(&key)?;
        if slot
            .as_ref()
            .is_some_and(|g| g.is(revision, owner, self.owner_high))
        {
            Some(f(slot))
        } else {
            None
        }
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
        self.with_grant(entry, revision, owner, |slot| {
            let Some(grant) = slot.as_mut() else {
                return Err(RenewRefused::NotHeld);
            };
            if grant.due <= now {
                // The name stays listed until the entry's cleanup frees it.
                *slot = None;
                return Err(RenewRefused::Expired);
            }
            // Later only: the expiry task finds the new deadline when it
            // looks (nothing to wake).
            grant.due = grant.due.max(due);
            Ok(())
        })
        .unwrap_or(Err(RenewRefused::NotHeld))
    }

    /// When a grant is deleted unless renewed, if it is held.
    pub(crate) fn due(&self, entry: &str) -> Option<Instant> {
        let slot = self.slot_of(entry)?;
        let due = lock(&self.entries)
            .names
            .get(&slot)
            .and_then(|slot| slot.as_ref().map(|g| g.due))?;
        Some(self.instant(due))
    }

    /// Removes and returns the grants whose deadline passed by `now`, and
    /// when to look next: the earliest deadline left, but not before
    /// [`EXPIRY_SCAN_GAP`] from now.
    fn take_expired(&self, now: Instant) -> (Vec<ExpiredGrant>, Option<Instant>) {
        let now_ticks = self.ticks(now);
        let mut guard = lock(&self.entries);
        let entries = &mut *guard;
        let mut expired = Vec::new();
        let mut next = Ticks::MAX;
        for (&key, slot) in &mut entries.names {
            let Some(grant) = slot else { continue };
            if grant.due > now_ticks {
                next = next.min(grant.due);
                continue;
            }
            let (revision, owner) = (grant.revision.get(), grant.owner_low);
            // Listed until the cleanup frees the name.
            *slot = None;
            expired.push((key, revision, owner));
        }
        let next = if next == Ticks::MAX {
            self.idle_horizon(now)
        } else {
            Some(next.max(self.ticks(now + EXPIRY_SCAN_GAP)))
        };
        entries.planned = next.unwrap_or(Ticks::MAX);
        drop(guard);
        let expired = expired
            .into_iter()
            .map(|(slot, revision, low)| ExpiredGrant {
                slot,
                revision,
                owner: OwnerId::from_u128((u128::from(self.owner_high) << 64) | u128::from(low)),
            })
            .collect();
        (expired, next.map(|at| self.instant(at)))
    }

    /// When the expiry task looks next while no grant is held: a second
    /// less than the session's TTL from `now` (`None`, not before it is
    /// woken, for a TTL under 2 s).
    ///
    /// Any time is safe here: a grant due before it wakes the task
    /// ([`Self::mark_held`]), one due after it is found when the task
    /// looks then. Sleeping until woken would make the next grant wake the
    /// task; and a grant is mostly released before the task has run (a
    /// release forgets its grant before its delete is sent), so the task
    /// found nothing held again and every acquire+release cycle woke it
    /// once. A grant of this session asks for more than the session's TTL
    /// less a second (the session's is the grant's rounded up to whole
    /// seconds), so a grant made after `now` is due after the horizon and
    /// wakes nobody (where the server raised a short TTL, some still wake
    /// the task, as before).
    fn idle_horizon(&self, now: Instant) -> Option<Ticks> {
        let horizon = self.server_ttl.saturating_sub(Duration::from_secs(1));
        (horizon >= Duration::from_secs(1)).then(|| self.ticks(now + horizon))
    }

    /// Forgets a grant; returns whether it was held with this revision and
    /// owner. Its name stays listed until [`Self::free_entry`].
    pub(crate) fn unmark_held(&self, entry: &str, revision: i64, owner: OwnerId) -> bool {
        self.with_grant(entry, revision, owner, |slot| *slot = None)
            .is_some()
    }

    /// Forgets the grant on `entry` with this create revision, whoever its
    /// owner, and frees the name: the entry is known to be gone from the
    /// server (deleted behind our back, e.g. force-released).
    pub(crate) fn forget_grant(&self, entry: &str, revision: i64) {
        let Some(slot) = self.slot_of(entry) else {
            return;
        };
        let mut entries = lock(&self.entries);
        if entries
            .names
            .get(&slot)
            .is_some_and(|slot| slot.as_ref().is_some_and(|g| g.revision.get() == revision))
        {
            entries.unlist(slot, Some(entry.len()));
        }
    }

    pub(crate) fn holds(&self, entry: &str, revision: i64, owner: OwnerId) -> bool {
        self.with_grant(entry, revision, owner, |_| ()).is_some()
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
        *entries = Entries::default();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 1);
        assert_eq!(ttl_secs(Duration::from_secs(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1500)), 2);
    }
}
