//! Renewing many leases at once: for drivers whose
//! [`LockBackend::renew_many`](crate::LockBackend::renew_many) renews some
//! (or all) leases one by one, a bounded number at a time.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use tokio::time::Instant;

use crate::error::{ErrorKind, LockError, Operation};
use crate::types::Lease;

/// The most leases the renewal scheduler hands to one
/// [`LockBackend::renew_many`](crate::LockBackend::renew_many) call.
/// Drivers may split a call further (a statement's parameter limit).
pub const RENEW_BATCH: usize = 1_000;

/// How many renewals the default `renew_many` keeps in flight at once.
pub const RENEW_CONCURRENCY: usize = 64;

/// Renews every lease with `renew` (one lease's renewal, with the
/// contract of [`LockBackend::renew_many`](crate::LockBackend::renew_many)
/// for that lease), at most `limit` (at least 1) at a time, and returns one
/// result per lease in order.
///
/// # Errors
///
/// Each result carries that lease's own renewal error.
///
/// # Cancel safety
///
/// Dropping the future leaves each renewal done or not done; every lease
/// stays valid until its previous deadline.
pub async fn renew_concurrently<'a, F, Fut>(
    leases: &[&'a Lease],
    limit: usize,
    renew: F,
) -> Vec<Result<Instant, LockError>>
where
    F: Fn(&'a Lease) -> Fut,
    Fut: Future<Output = Result<Instant, LockError>>,
{
    let limit = limit.max(1);
    let mut results: Vec<Option<Result<Instant, LockError>>> =
        std::iter::repeat_with(|| None).take(leases.len()).collect();
    let mut next = 0;
    let mut running: Vec<(usize, Pin<Box<Fut>>)> = Vec::with_capacity(limit.min(leases.len()));
    std::future::poll_fn(|cx| {
        loop {
            while running.len() < limit && next < leases.len() {
                running.push((next, Box::pin(renew(leases[next]))));
                next += 1;
            }
            let mut progressed = false;
            let mut i = 0;
            while i < running.len() {
                if let Poll::Ready(result) = running[i].1.as_mut().poll(cx) {
                    results[running[i].0] = Some(result);
                    drop(running.swap_remove(i));
                    progressed = true;
                } else {
                    i += 1;
                }
            }
            if running.is_empty() && next >= leases.len() {
                return Poll::Ready(());
            }
            if !progressed {
                return Poll::Pending;
            }
        }
    })
    .await;
    results
        .into_iter()
        .map(|result| result.unwrap_or_else(|| Err(missing_result())))
        .collect()
}

/// A driver's batched `renew_many` answers as one result per lease, in
/// the leases' order: `results[i]` is lease `i`'s, and a lease no batch
/// answered for gets a [`Backend`](ErrorKind::Backend) error from
/// `backend`.
pub fn results_in_order(
    results: Vec<Option<Result<Instant, LockError>>>,
    backend: &'static str,
) -> Vec<Result<Instant, LockError>> {
    results
        .into_iter()
        .map(|result| result.unwrap_or_else(|| Err(missing_result().with_backend(backend))))
        .collect()
}

/// The error for a lease a `renew_many` answer left out.
pub(crate) fn missing_result() -> LockError {
    LockError::new(
        ErrorKind::Backend,
        Operation::Renew,
        "the backend's renew_many gave no result for this lease",
    )
}
