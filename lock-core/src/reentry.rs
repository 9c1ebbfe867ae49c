//! Reentrancy by scope, never by thread: a held guard hands out nested
//! guards for its key ([`LockGuard::reenter`](crate::LockGuard::reenter)), and code running inside
//! [`LockGuard::scope`](crate::LockGuard::scope) that asks its client for the same lock again gets
//! a nested guard at once, with no round trip and no second grant.
//!
//! Thread-bound reentrancy (a count per thread id, as Redisson keeps it)
//! is wrong in async Rust: a task moves between threads and many tasks
//! share one. Here the scope is the *task* that entered it: a task spawned
//! from inside a scope is not in it, and asks like any other client (it
//! waits while the lock is held, even by its parent). Scopes nest, and two
//! scopes running at once in one task (`join!`, `select!`) are apart: each
//! sees its own lock and those of the scopes it was entered from, never
//! its sibling's.
//!
//! The outermost guard owns the grant: nested guards are views of it.
//! Releasing or dropping a nested guard only ends that view; the lock is
//! released when the outermost guard ends, and every nested guard then
//! reads `Released` (or `Lost`, at the same moment as the outer guard, if
//! the lock is lost).

use std::future::Future;
use std::sync::Arc;

use crate::backend::LockBackend;
use crate::hold::Shared;
use crate::key::LockKey;
use crate::kind::LeaseKind;
use crate::scheduler::Scheduler;

tokio::task_local! {
    /// The innermost scope the code being polled runs in. Each scope sets
    /// its own value for its own future only (tokio swaps it in around
    /// each poll of that future), so two scopes running at once in one
    /// task (`join!`, `select!`) never see or end each other's entries: a
    /// per-task stack would let the first to finish pop the other's.
    static SCOPE: Arc<Scope>;
}

/// One scope: its lock and the scope it was entered from (shared with the
/// scope's siblings, never changed).
struct Scope {
    entry: Entry,
    parent: Option<Arc<Scope>>,
}

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

/// The hold (and its scheduler) a nested guard for `key` shares, when the
/// current task runs inside the scope of a live guard of `backend` that
/// covers `kind` (the innermost such scope).
pub(crate) fn find(
    backend: usize,
    key: &LockKey,
    kind: LeaseKind,
) -> Option<(Arc<Shared>, Arc<Scheduler>)> {
    SCOPE
        .try_with(|innermost| {
            let mut scope = Some(innermost);
            while let Some(current) = scope {
                let e = &current.entry;
                if e.backend == backend && &e.key == key && covers(e.kind, kind) {
                    return e
                        .shared
                        .is_held()
                        .then(|| (e.shared.clone(), e.scheduler.clone()));
                }
                scope = current.parent.as_ref();
            }
            None
        })
        .ok()
        .flatten()
}

/// Runs `work` with `guard`'s lock in the current task's scope: a scope of
/// its own, inside the one it is entered from (if any), that ends with
/// `work` (also when `work` is dropped half way).
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
    let parent = SCOPE.try_with(Arc::clone).ok();
    SCOPE.scope(Arc::new(Scope { entry, parent }), work).await
}
