//! Renewals of many held locks, coalesced into pipelines.
//!
//! Every guard renews on its own timer (about every TTL/3). A renewal may
//! wait a little (its *slack*: TTL/30, between 1 ms and 100 ms) for others
//! to join its batch, and the timers of locks renewed in one batch fire
//! together the next time. So N held locks cost at most about
//! `period / slack` round trips per renewal period (and at least
//! `N / MAX_BATCH`), instead of N.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_core::{ErrorKind, LockError, Operation};
use redis::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::connection::node::{Lane, Node};
use crate::error::{NAME, copy_for_each};
use crate::keys::names::holder_key;
use crate::keys::scripts::Scripts;

/// The most renewals sent in one pipeline.
pub(crate) const MAX_BATCH: usize = 2_000;

/// The longest a renewal waits for others to join its batch.
const MAX_SLACK: Duration = Duration::from_millis(100);

/// How long a renewal of a lease of `ttl` may wait for its batch.
fn slack(ttl: Duration) -> Duration {
    (ttl / 30).clamp(Duration::from_millis(1), MAX_SLACK)
}

struct Request {
    lock: String,
    owner: String,
    ttl_ms: String,
    send_by: Instant,
    reply: oneshot::Sender<Result<(bool, Instant), LockError>>,
}

/// Counts of renewal round trips, for benchmarks and tests.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) batches: AtomicU64,
    pub(crate) renewals: AtomicU64,
}

/// Queues renewals for one node.
#[derive(Debug, Clone)]
pub(crate) struct Renewer {
    tx: mpsc::UnboundedSender<Request>,
    counters: Arc<Counters>,
}

impl Renewer {
    /// Starts the batching task of `node`. Must run inside a Tokio runtime.
    pub(crate) fn new(node: Arc<Node>, scripts: Arc<Scripts>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        tokio::spawn(batcher(node, scripts, rx, counters.clone()));
        Self { tx, counters }
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Renews one lock: `Ok((renewed, sent_at))`.
    pub(crate) async fn renew(
        &self,
        lock: &str,
        owner: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<(bool, Instant), LockError> {
        let (reply, result) = oneshot::channel();
        let request = Request {
            lock: lock.to_owned(),
            owner: owner.to_owned(),
            ttl_ms: ttl.as_millis().to_string(),
            send_by: Instant::now() + slack(ttl),
            reply,
        };
        let gone = || {
            LockError::new(
                ErrorKind::Unavailable,
                Operation::Renew,
                "the renewal task stopped",
            )
            .with_backend(NAME)
        };
        self.tx.send(request).map_err(|_| gone())?;
        // The batch itself is bounded by the operation timeout; this bounds
        // the wait in the queue as well.
        match tokio::time::timeout(timeout + slack(ttl) * 2, result).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(gone()),
            Err(_) => Err(LockError::new(
                ErrorKind::Timeout,
                Operation::Renew,
                format!("no renewal answer within {timeout:?}"),
            )
            .with_backend(NAME)),
        }
    }
}

async fn batcher(
    node: Arc<Node>,
    scripts: Arc<Scripts>,
    mut rx: mpsc::UnboundedReceiver<Request>,
    counters: Arc<Counters>,
) {
    while let Some(first) = rx.recv().await {
        // Gather until the most urgent request's slack is used up.
        let mut send_by = first.send_by;
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            tokio::select! {
                biased;
                request = rx.recv() => match request {
                    Some(request) => {
                        send_by = send_by.min(request.send_by);
                        batch.push(request);
                    }
                    None => break,
                },
                () = tokio::time::sleep_until(send_by) => break,
            }
        }
        counters.batches.fetch_add(1, Ordering::Relaxed);
        counters.renewals.fetch_add(
            u64::try_from(batch.len()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        // Batches run concurrently so a slow one does not hold up the next.
        tokio::spawn(send_batch(node.clone(), scripts.clone(), batch));
    }
}

async fn send_batch(node: Arc<Node>, scripts: Arc<Scripts>, batch: Vec<Request>) {
    let renewals: Vec<[&str; 3]> = batch
        .iter()
        .map(|r| [r.lock.as_str(), r.owner.as_str(), r.ttl_ms.as_str()])
        .collect();
    let sent_at = Instant::now();
    let result = renew_pipeline(&node, &scripts, &renewals, node.timeout()).await;
    match result {
        Ok(results) => {
            for (request, result) in batch.into_iter().zip(results) {
                let _ = request.reply.send(result.map(|renewed| (renewed, sent_at)));
            }
        }
        Err(err) => {
            for request in batch {
                let copy = copy_for_each(&err, Operation::Renew);
                let _ = request.reply.send(Err(copy));
            }
        }
    }
}

/// One pipeline of renew script calls on `node`, one per `[lock, owner,
/// ttl ms]`: per call whether it renewed (`false`: not held) or its error;
/// `Err` when the pipeline failed as a whole. The holder details' key is
/// derived here, at send time, so a queued renewal keeps no more than the
/// lock's name.
pub(crate) async fn renew_pipeline(
    node: &Node,
    scripts: &Scripts,
    renewals: &[[&str; 3]],
    timeout: Duration,
) -> Result<Vec<Result<bool, LockError>>, LockError> {
    let sides: Vec<String> = renewals
        .iter()
        .map(|[lock, _, _]| holder_key(lock))
        .collect();
    let calls: Vec<(Vec<&str>, Vec<&str>)> = renewals
        .iter()
        .zip(&sides)
        .map(|([lock, owner, ttl], side)| (vec![*lock, side.as_str()], vec![*owner, *ttl]))
        .collect();
    let calls = &calls;
    let replies = node
        .run_on(
            Lane::RENEWALS,
            Operation::Renew,
            timeout,
            |mut conn| async move { conn.eval_many(&scripts.renew, calls).await },
        )
        .await?;
    Ok(replies
        .into_iter()
        .map(|reply| match reply {
            Ok(Value::Int(n)) => Ok(n == 1),
            Ok(other) => Err(LockError::new(
                ErrorKind::Backend,
                Operation::Renew,
                format!("unexpected renewal answer {other:?}"),
            )
            .with_backend(NAME)),
            Err(err) => Err(node.map_err(Operation::Renew, err)),
        })
        .collect())
}
