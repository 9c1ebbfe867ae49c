//! Local TTL enforcement with one task per backend, and the compact record
//! the backend keeps per granted node.
//!
//! A ZooKeeper lock node lives as long as its session, so a lease whose
//! holder stops renewing it (capped renewals, renewal disabled, a guard
//! leaked or dropped without release) would stay held while the process
//! lives. The backend therefore deletes a granted node once its own
//! deadline (`sent + TTL`, moved by every renewal) has passed without a
//! renewal.
//!
//! Per granted node the backend keeps one map slot, keyed by the attempt
//! id (the lease's owner, see [`Owners`]): the key, the node's sequence
//! number and the deadline in 10 ms ticks (32 bytes plus the key's text;
//! the node's path is rebuilt from them when it is needed). There is no
//! queue: one task per backend scans the map when the earliest deadline it
//! saw comes, deletes the nodes that are due and sleeps until the next
//! earliest. Scans are at least [`MIN_GAP`] (plus a microsecond per
//! tracked node) apart, so a node may be deleted that much after its
//! deadline (the lease itself stops being valid at its own deadline, before
//! that; a renewal after the deadline is refused). A grant wakes the task
//! only when its deadline comes before the one the task sleeps until:
//! sequential grants with the same TTL never do, so the acquire path
//! spawns nothing and wakes nobody.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lock_core::{Lease, OwnerId};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use crate::cleanup::Cleanup;
use crate::config::ZkConfig;
use crate::connection::lock;
use crate::keys;

/// The shortest time between two scans of the tracked nodes.
pub(crate) const MIN_GAP: Duration = Duration::from_millis(20);

/// One tick of the stored deadlines.
const TICK: Duration = Duration::from_millis(10);

/// A granted node this backend tracks, keyed by the low half of its owner
/// id ([`Owners`]).
pub(crate) struct Tracked {
    /// The lease's key (its directory follows from it).
    pub(crate) key: Box<str>,
    /// The node's sequence number.
    pub(crate) seq: u32,
    /// When the node is deleted unless renewed first, in ticks since the
    /// backend's epoch ([`Clock`]).
    pub(crate) due: u32,
}

/// Marks a [`Tracked`] entry of an election's latch node: its `key` is
/// this character, the election's name, this character again and the
/// escaped details in the node's name (a key never holds a control
/// character, so no mutex key starts with it and the name ends at it).
pub(crate) const LATCH_MARK: char = '\u{1}';

impl Tracked {
    /// The node's path (rebuilt from the key, the owner and the sequence).
    fn path(
        &self,
        root: &str,
        layout: crate::ZkLayout,
        nodes: crate::ZkNodeNames,
        owner: OwnerId,
    ) -> String {
        match self.key.strip_prefix(LATCH_MARK) {
            Some(latch) => {
                let (election, details) = latch.split_once(LATCH_MARK).unwrap_or((latch, ""));
                keys::named_node_path(
                    &keys::latch_dir_of(root, election),
                    owner,
                    &crate::keys::latch_name(details),
                    self.seq,
                )
            }
            None => keys::mutex_node_path(
                &keys::mutex_dir_of(root, layout, &self.key),
                owner,
                nodes,
                self.seq,
            ),
        }
    }
}

/// A granted node (or the nodes of one permit grant) of a read-write lock
/// or a semaphore this backend tracks, keyed like [`Tracked`]. Kept apart
/// from the mutex's compact map: these store their paths.
pub(crate) struct SharedTracked {
    /// The lease's nodes.
    pub(crate) paths: Vec<String>,
    /// When the nodes are deleted unless renewed first (see [`Tracked`]).
    pub(crate) due: u32,
}

/// The owner ids (attempt ids) of one backend: a random upper half drawn
/// when the backend is made, and a lower half counted from a random start,
/// one per attempt. Unique within the backend by construction and across
/// backends as long as their random halves differ; the backend's map of
/// granted nodes is keyed by the lower half alone (8 bytes per slot instead
/// of 16, which with a `u128`'s alignment would pad every slot to 48).
pub(crate) struct Owners {
    upper: u64,
    next: AtomicU64,
}

impl Owners {
    pub(crate) fn new() -> Self {
        let seed = OwnerId::random().as_u128();
        // The two halves of a random value.
        #[allow(clippy::cast_possible_truncation)]
        let (upper, lower) = ((seed >> 64) as u64, seed as u64);
        Self {
            upper,
            next: AtomicU64::new(lower),
        }
    }

    /// A fresh attempt id.
    pub(crate) fn next(&self) -> OwnerId {
        let lower = self.next.fetch_add(1, Ordering::Relaxed);
        self.owner(lower)
    }

    /// The map key of `owner`, if it is one of this backend's.
    pub(crate) fn key(&self, owner: OwnerId) -> Option<u64> {
        let v = owner.as_u128();
        // The two halves.
        #[allow(clippy::cast_possible_truncation)]
        ((v >> 64) as u64 == self.upper).then_some(v as u64)
    }

    fn owner(&self, lower: u64) -> OwnerId {
        OwnerId::from_u128((u128::from(self.upper) << 64) | u128::from(lower))
    }
}

/// Deadlines as 32-bit tick counts since the backend's epoch, compared
/// with wrap-around: correct while a deadline lies within 248 days of the
/// time it is compared with (deadlines are at most a session timeout
/// ahead, and the task removes due ones within a scan gap).
#[derive(Clone, Copy)]
pub(crate) struct Clock {
    epoch: Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Self {
            epoch: Instant::now(),
        }
    }

    fn ticks(self, at: Instant, round_up: bool) -> u32 {
        let since = at.saturating_duration_since(self.epoch).as_millis();
        let tick = TICK.as_millis();
        let ticks = if round_up {
            since.div_ceil(tick)
        } else {
            since / tick
        };
        // Wraps by design (see the type's docs).
        #[allow(clippy::cast_possible_truncation)]
        let ticks = ticks as u32;
        ticks
    }

    /// A deadline: rounded up, so a node is never deleted before it.
    pub(crate) fn deadline(self, at: Instant) -> u32 {
        self.ticks(at, true)
    }

    /// Whether the deadline `due` has passed at `now`.
    pub(crate) fn passed(self, due: u32, now: Instant) -> bool {
        self.remaining_ticks(due, now) <= 0
    }

    /// Ticks from `now` until `due` (negative once passed).
    fn remaining_ticks(self, due: u32, now: Instant) -> i32 {
        // Reinterpreting the wrapped difference is the comparison.
        #[allow(clippy::cast_possible_wrap)]
        let remaining = due.wrapping_sub(self.ticks(now, false)) as i32;
        remaining
    }

    /// Time from `now` until `due` (zero once passed).
    pub(crate) fn remaining(self, due: u32, now: Instant) -> Duration {
        let ticks = u32::try_from(self.remaining_ticks(due, now)).unwrap_or(0);
        TICK * ticks
    }
}

/// The backend's expiry task and what it sleeps until.
#[derive(Default)]
pub(crate) struct ExpiryTask {
    /// When the task scans next (`None`: only when woken).
    armed: Option<Instant>,
    task: Option<JoinHandle<()>>,
    wake: Arc<Notify>,
}

impl ExpiryTask {
    /// Stops the task (the backend is dropped).
    pub(crate) fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The backend's local TTL enforcement: the granted nodes it tracks and
/// its one expiry task. Clones share them.
#[derive(Clone)]
pub(crate) struct Expiry {
    state: Arc<ExpiryState>,
    /// What deletes a node whose TTL ran out.
    cleanup: Cleanup,
}

struct ExpiryState {
    /// The granted nodes by owner id, each with when it must be deleted
    /// if not renewed (the lease's validity deadline comes before).
    /// Removed at release.
    expiries: Mutex<HashMap<u64, Tracked>>,
    /// The same for read, write and permit leases (locked after
    /// `expiries` when both are).
    shared: Mutex<HashMap<u64, SharedTracked>>,
    /// The attempt ids this backend hands out (and keys `expiries` by).
    owners: Owners,
    /// The deadlines' epoch.
    clock: Clock,
    /// The expiry task. Locked after `expiries` when both are.
    task: Mutex<ExpiryTask>,
}

impl Drop for ExpiryState {
    fn drop(&mut self) {
        lock(&self.task).stop();
    }
}

impl Expiry {
    pub(crate) fn new(cleanup: Cleanup) -> Self {
        Self {
            state: Arc::new(ExpiryState {
                expiries: Mutex::new(HashMap::new()),
                shared: Mutex::new(HashMap::new()),
                owners: Owners::new(),
                clock: Clock::new(),
                task: Mutex::new(ExpiryTask::default()),
            }),
            cleanup,
        }
    }

    /// A fresh attempt id (the owner of the lease it may grant).
    pub(crate) fn next_owner(&self) -> OwnerId {
        self.state.owners.next()
    }

    /// The deadlines' clock.
    pub(crate) fn clock(&self) -> Clock {
        self.state.clock
    }

    /// Whether `lease`'s node (sequence `seq`) is tracked and its TTL has
    /// not run out by `at`.
    pub(crate) fn tracked_until(&self, lease: &Lease, seq: u32, at: Instant) -> bool {
        let clock = self.state.clock;
        self.nodes()
            .tracked(lease.owner(), |node| {
                node.seq == seq && !clock.passed(node.due, at)
            })
            .unwrap_or(false)
    }

    /// Moves the deadline of `lease`'s node to `sent + ttl` after a
    /// confirmed renewal. `false` when the node is no longer tracked (its
    /// TTL ran out and the expiry task took it, or it was released), so the
    /// renewal must not be reported.
    pub(crate) fn extend(&self, lease: &Lease, seq: u32, sent: Instant, ttl: Duration) -> bool {
        let clock = self.state.clock;
        self.nodes()
            .tracked(lease.owner(), |node| {
                if node.seq != seq || clock.passed(node.due, sent) {
                    return false;
                }
                if clock.passed(node.due, sent + ttl) {
                    node.due = clock.deadline(sent + ttl);
                }
                true
            })
            .unwrap_or(false)
    }

    /// Tracks a granted node (`key` is its lease's key, or [`LATCH_MARK`]
    /// and the election's name for a latch node): if not renewed by `at`,
    /// it is deleted.
    pub(crate) fn schedule_expiry(&self, owner: OwnerId, key: &str, seq: u32, at: Instant) {
        let clock = self.state.clock;
        let Some(slot) = self.state.owners.key(owner) else {
            // Every grant carries an id from `Owners::next`.
            tracing::warn!(%key, "lock node of a foreign owner id not tracked");
            return;
        };
        let mut tracked = lock(&self.state.expiries);
        tracked.insert(
            slot,
            Tracked {
                key: key.into(),
                seq,
                due: clock.deadline(at),
            },
        );
        let task = lock(&self.state.task);
        drop(tracked);
        self.arm(task, at);
    }

    /// Tracks the nodes of a read, write or permit lease: if not renewed
    /// by `at`, they are deleted.
    pub(crate) fn schedule_shared(&self, owner: OwnerId, paths: Vec<String>, at: Instant) {
        let clock = self.state.clock;
        let Some(slot) = self.state.owners.key(owner) else {
            tracing::warn!("shared lock node of a foreign owner id not tracked");
            return;
        };
        let mut tracked = lock(&self.state.shared);
        tracked.insert(
            slot,
            SharedTracked {
                paths,
                due: clock.deadline(at),
            },
        );
        let task = lock(&self.state.task);
        drop(tracked);
        self.arm(task, at);
    }

    /// The shared-lock nodes whose TTL this backend enforces, by owner.
    pub(crate) fn shared(&self) -> Tracking<'_, SharedTracked> {
        Tracking {
            owners: &self.state.owners,
            map: &self.state.shared,
        }
    }

    /// The mutex and election nodes whose TTL this backend enforces, by
    /// owner.
    pub(crate) fn nodes(&self) -> Tracking<'_, Tracked> {
        Tracking {
            owners: &self.state.owners,
            map: &self.state.expiries,
        }
    }

    /// The remaining TTL of `owner`'s tracked node when it is the node of
    /// sequence `seq` (what `inspect` and the election listing report).
    pub(crate) fn remaining(&self, owner: OwnerId, seq: Option<u32>) -> Option<Duration> {
        let clock = self.clock();
        self.nodes()
            .tracked(owner, |node| {
                (Some(node.seq) == seq).then(|| clock.remaining(node.due, Instant::now()))
            })
            .flatten()
    }

    /// Makes sure the expiry task runs and scans by `at`.
    fn arm(&self, mut task: std::sync::MutexGuard<'_, ExpiryTask>, at: Instant) {
        let running = task.task.as_ref().is_some_and(|t| !t.is_finished());
        if !running {
            // First grant (or the runtime that ran the task is gone).
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return;
            };
            let weak: Weak<ExpiryState> = Arc::downgrade(&self.state);
            task.armed = None;
            task.task =
                Some(runtime.spawn(expiry_loop(weak, task.wake.clone(), self.cleanup.clone())));
            return;
        }
        if task.armed.is_none_or(|armed| at < armed) {
            task.armed = Some(at);
            task.wake.notify_one();
        }
    }
}

/// The earliest time the next scan may run after one that saw `tracked`
/// nodes.
fn scan_gap(tracked: usize) -> Duration {
    MIN_GAP + Duration::from_micros(u64::try_from(tracked).unwrap_or(u64::MAX))
}

type Due = (Vec<(String, OwnerId)>, Option<Instant>, Instant);

/// Removes the nodes whose deadline passed by `now`: their paths, when the
/// task scans next (the earliest deadline left, no sooner than the gap)
/// and the gap (the earliest any scan may run).
fn take_due(inner: &ExpiryState, config: &ZkConfig, now: Instant) -> Due {
    let clock = inner.clock;
    let root = config.root();
    let mut tracked = lock(&inner.expiries);
    let mut due = Vec::new();
    let mut earliest: Option<Duration> = None;
    tracked.retain(|slot, node| {
        if clock.passed(node.due, now) {
            let owner = inner.owners.owner(*slot);
            due.push((
                node.path(root, config.layout(), config.node_names(), owner),
                owner,
            ));
            false
        } else {
            let left = clock.remaining(node.due, now);
            earliest = Some(earliest.map_or(left, |e| e.min(left)));
            true
        }
    });
    let mut count = tracked.len();
    {
        let mut shared = lock(&inner.shared);
        count += shared.len();
        shared.retain(|slot, node| {
            if clock.passed(node.due, now) {
                let owner = inner.owners.owner(*slot);
                due.extend(node.paths.drain(..).map(|path| (path, owner)));
                false
            } else {
                let left = clock.remaining(node.due, now);
                earliest = Some(earliest.map_or(left, |e| e.min(left)));
                true
            }
        });
    }
    let gap = now + scan_gap(count);
    let next = earliest.map(|left| (now + left).max(gap));
    lock(&inner.task).armed = next;
    drop(tracked);
    (due, next, gap)
}

/// Deletes each node whose deadline passed without a renewal. Sleeps until
/// the earliest deadline, or until a grant with an earlier one wakes it
/// (scanning no sooner than the scan gap after the last scan). Holds the
/// backend only while it looks.
/// One of the backend's maps of tracked nodes, keyed by owner (the attempt
/// ids this backend hands out).
pub(crate) struct Tracking<'a, V> {
    owners: &'a Owners,
    map: &'a Mutex<HashMap<u64, V>>,
}

impl<V> Tracking<'_, V> {
    /// Stops enforcing the TTL of `owner`'s node(s) (released, or found
    /// gone), so no delete is ever sent for a node that no longer exists.
    pub(crate) fn forget(&self, owner: OwnerId) {
        if let Some(slot) = self.owners.key(owner) {
            lock(self.map).remove(&slot);
        }
    }

    /// `f` applied to `owner`'s tracked entry, if it has one.
    pub(crate) fn tracked<T>(&self, owner: OwnerId, f: impl FnOnce(&mut V) -> T) -> Option<T> {
        let slot = self.owners.key(owner)?;
        lock(self.map).get_mut(&slot).map(f)
    }
}

async fn expiry_loop(inner: Weak<ExpiryState>, wake: Arc<Notify>, cleanup: Cleanup) {
    loop {
        let now = Instant::now();
        let (next, gap) = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let (due, next, gap) = take_due(&inner, cleanup.conn().config(), now);
            if !due.is_empty() {
                // No live session: the nodes went with the last one.
                if let Some(session) = cleanup.conn().current().filter(|s| !s.is_lost()) {
                    for (path, owner) in due {
                        tracing::debug!(%path, "lease not renewed within its TTL; deleting its node");
                        let cleanup = cleanup.clone();
                        let client = session.client.clone();
                        tokio::spawn(async move {
                            let Some((dir, _)) = keys::split_node(&path) else {
                                return;
                            };
                            cleanup.delete_node(&client, &path, dir, owner).await;
                        });
                    }
                }
            }
            (next, gap)
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = sleep_until(at) => {}
                    () = wake.notified() => sleep_until(gap).await,
                }
            }
            None => {
                wake.notified().await;
                sleep_until(gap).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_round_up_and_compare_across_the_wrap() {
        let clock = Clock::new();
        let at = clock.epoch + Duration::from_millis(25);
        let due = clock.deadline(at);
        assert_eq!(due, 3);
        assert!(!clock.passed(due, clock.epoch + Duration::from_millis(29)));
        assert!(clock.passed(due, clock.epoch + Duration::from_millis(30)));
        assert_eq!(
            clock.remaining(due, clock.epoch + Duration::from_millis(10)),
            Duration::from_millis(20)
        );
        assert_eq!(
            clock.remaining(due, at + Duration::from_secs(1)),
            Duration::ZERO
        );
        // Near the wrap of the 32-bit tick count.
        let late = clock.epoch + TICK * (u32::MAX - 1);
        let due = clock.deadline(late + Duration::from_millis(50));
        assert!(!clock.passed(due, late));
        assert!(clock.passed(due, late + Duration::from_millis(50)));
        assert_eq!(clock.remaining(due, late), Duration::from_millis(50));
    }

    #[test]
    fn owner_ids_are_fresh_and_keyed_by_their_lower_half() {
        let owners = Owners::new();
        let (a, b) = (owners.next(), owners.next());
        assert_ne!(a, b);
        let slot = owners.key(a).unwrap();
        assert_eq!(owners.owner(slot), a);
        assert_ne!(owners.key(b), Some(slot));
        // Another backend's ids are not this one's.
        let other = Owners::new();
        assert_eq!(owners.key(other.next()), None);
        assert_eq!(std::mem::size_of::<(u64, Tracked)>(), 32);
    }
}
