//! Reentrancy by scope, never by thread: a held guard hands out nested
//! guards for its key ([`LockGuard::reenter`]), and code running inside
//! [`LockGuard::scope`] that asks its client for the same lock again gets
//! a nested guard at once, with no round trip and no second grant.
//!
//! Thread-bound reentrancy (a count per thread id, as Redisson keeps it)
//! is wrong in async Rust: a task moves between threads and many tasks
//! share one. Here the scope is the *task* that entered it: a task spawned
//! from inside a scope is not in it, and asks like any other client (it
//! waits while the lock is held, even by its parent).
//!
//! The outermost guard owns the grant: nested guards are views of it.
//! Releasing or dropping a nested guard only ends that view; the lock is
//! released when the outermost guard ends, and every nested guard then
//! reads `Released` (or `Lost`, at the same moment as the outer guard, if
//! the lock is lost).

use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;

use crate::backend::LockBackend;
use crate::guard::{LockGuard, Shared};
use crate::key::LockKey;
use crate::kind::LeaseKind;
use crate::scheduler::Scheduler;

tokio::task_local! {
    static SCOPE: RefCell<Vec<Entry>>;
}

#[derive(Clone)]
struct Entry {
    backend: usize,
    key: LockKey,
    kind: LeaseKind,
    shared: Arc<Shared>,
    scheduler: Arc<Scheduler>,
}

/// The identity of a backend instance (the client's shared `Arc`).
pub(crate) fn backend_id(backend: &Arc<dyn LockBackend>) -> usize {
    Arc::as_ptr(backend).cast::<()>() as usize
}

/// Whether a held grant of `held` also covers a request for `asked`: the
/// same kind, or a read request under a write grant.
fn covers(held: LeaseKind, asked: LeaseKind) -> bool {
    held == asked || (held == LeaseKind::Write && asked == LeaseKind::Read)
}

/// A nested guard for `key` when the current task runs inside the scope of
/// a live guard of `backend` that covers `kind`.
pub(crate) fn find(backend: usize, key: &LockKey, kind: LeaseKind) -> Option<LockGuard> {
    SCOPE
        .try_with(|scope| {
            scope
                .borrow()
                .iter()
                .rev()
                .find(|e| e.backend == backend && &e.key == key && covers(e.kind, kind))
                .filter(|e| e.shared.is_held())
                .map(|e| LockGuard::nested(e.shared.clone(), e.scheduler.clone()))
        })
        .ok()
        .flatten()
}

/// Runs `work` with `guard`'s lock in the current task's scope.
pub(crate) async fn run_in_scope<F: Future>(
    backend: usize,
    shared: Arc<Shared>,
    scheduler: Arc<Scheduler>,
    work: F,
) -> F::Output {
    let entry = Entry {
        backend,
        key: shared.original().key().clone(),
        kind: shared.original().kind(),
        shared,
        scheduler,
    };
    let pushed = SCOPE
        .try_with(|scope| scope.borrow_mut().push(entry.clone()))
        .is_ok();
    if !pushed {
        return SCOPE.scope(RefCell::new(vec![entry]), work).await;
    }
    // Already inside a scope: extend it for `work`, and take the entry
    // back out afterwards, also when `work` is dropped half way.
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            let _ = SCOPE.try_with(|scope| scope.borrow_mut().pop());
        }
    }
    let _pop = Pop;
    work.await
}
