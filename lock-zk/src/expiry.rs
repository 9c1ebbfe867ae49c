//! Local TTL enforcement with one task per backend.
//!
//! A ZooKeeper lock node lives as long as its session, so a lease whose
//! holder stops renewing it (capped renewals, renewal disabled, a guard
//! leaked or dropped without release) would stay held while the process
//! lives. The backend therefore deletes a granted node once its own
//! deadline (`sent + TTL`, moved by every renewal) has passed without a
//! renewal.
//!
//! The deadlines sit in one queue, earliest first, served by one task per
//! backend that sleeps until the earliest live deadline. The queue is lazy:
//! a release only removes the node from the backend's `expiries` map, and a
//! renewal only moves the deadline stored there; the task drops queue
//! entries of nodes no longer in the map and re-queues renewed ones when it
//! comes to them (and the queue is compacted when released entries pile
//! up). A grant wakes the task only when its deadline comes before the one
//! the task sleeps until: sequential grants with the same TTL never do, so
//! the acquire path spawns nothing and wakes nobody.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Weak};

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use super::{Expiry, Inner, ZkBackend, lock};
use crate::paths::{self, owner_of};

/// Released entries tolerated in the queue beyond twice the live ones
/// before it is compacted.
const SLACK: usize = 1024;

/// The deadlines of a backend's tracked nodes, earliest first.
#[derive(Default)]
pub(super) struct ExpiryQueue {
    heap: BinaryHeap<Reverse<(Instant, Arc<str>)>>,
    /// The deadline the task sleeps until (`None`: until woken).
    armed: Option<Instant>,
    task: Option<JoinHandle<()>>,
    wake: Arc<Notify>,
}

impl ExpiryQueue {
    /// Stops the task (the backend is dropped).
    pub(super) fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl ZkBackend {
    /// Local TTL enforcement: if `path` is not renewed by `at`, delete it.
    pub(super) fn schedule_expiry(&self, path: &str, at: Instant) {
        let path: Arc<str> = Arc::from(path);
        let mut expiries = lock(&self.inner.expiries);
        expiries.insert(path.clone(), Expiry { due: at });
        let mut queue = lock(&self.inner.queue);
        queue.heap.push(Reverse((at, path)));
        if queue.heap.len() > 2 * expiries.len() + SLACK {
            queue
                .heap
                .retain(|Reverse((_, p))| expiries.contains_key(p));
        }
        drop(expiries);
        let running = queue.task.as_ref().is_some_and(|t| !t.is_finished());
        if !running {
            // First grant (or the runtime that ran the task is gone).
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return;
            };
            let weak: Weak<Inner> = Arc::downgrade(&self.inner);
            queue.armed = None;
            queue.task = Some(runtime.spawn(expiry_loop(weak, queue.wake.clone())));
            return;
        }
        if queue.armed.is_none_or(|armed| at < armed) {
            queue.armed = Some(at);
            queue.wake.notify_one();
        }
    }

    /// Stops enforcing the TTL of `path` (released, or found gone): its
    /// queue entry is dropped when the task comes to it, so no delete is
    /// ever sent for a node that no longer exists.
    pub(super) fn forget_expiry(&self, path: &str) {
        lock(&self.inner.expiries).remove(path);
    }
}

/// Removes and returns the nodes whose deadline passed by `now`, and arms
/// the queue for the next live deadline.
fn take_due(inner: &Inner, now: Instant) -> (Vec<Arc<str>>, Option<Instant>) {
    let mut expiries = lock(&inner.expiries);
    let mut queue = lock(&inner.queue);
    let mut due = Vec::new();
    while let Some(Reverse((at, path))) = queue.heap.peek() {
        let at = *at;
        match expiries.get(path).map(|e| e.due) {
            // Released or found gone.
            None => {
                queue.heap.pop();
            }
            Some(deadline) if deadline <= now => {
                if let Some(Reverse((_, path))) = queue.heap.pop() {
                    expiries.remove(&path);
                    due.push(path);
                }
            }
            // Renewed since it was queued: queue its new deadline.
            Some(deadline) if deadline != at => {
                if let Some(Reverse((_, path))) = queue.heap.pop() {
                    queue.heap.push(Reverse((deadline, path)));
                }
            }
            Some(_) => break,
        }
    }
    let next = queue.heap.peek().map(|Reverse((at, _))| *at);
    queue.armed = next;
    (due, next)
}

/// Deletes each node whose deadline passed without a renewal. Sleeps until
/// the earliest live deadline, or until a grant with an earlier one wakes
/// it. Holds the backend only while it looks.
async fn expiry_loop(inner: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let next = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let (due, next) = take_due(&inner, Instant::now());
            if !due.is_empty() {
                let backend = ZkBackend { inner };
                // No live session: the nodes went with the last one.
                if let Some(session) = backend.inner.current().filter(|s| !s.is_lost()) {
                    for path in due {
                        tracing::debug!(%path, "lease not renewed within its TTL; deleting its node");
                        let backend = backend.clone();
                        let client = session.client.clone();
                        tokio::spawn(async move {
                            let Some((dir, name)) = paths::split_node(&path) else {
                                return;
                            };
                            let Some(owner) = owner_of(name) else {
                                return;
                            };
                            backend.delete_node(&client, &path, dir, owner).await;
                        });
                    }
                }
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
