//! Renewals of many held locks, coalesced into pipelines.
//!
//! Every guard renews on its own timer, but the timers of locks renewed in
//! one batch fire together the next time, so after one period the renewals
//! of N locks cost about `N / MAX_BATCH` round trips per period instead of N.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{ErrorKind, LockError, Operation};
use redis::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::conn::{NAME, Node};
use crate::scripts::Scripts;

/// The most renewals sent in one pipeline.
pub(crate) const MAX_BATCH: usize = 2_000;

/// How long the batcher gathers requests after the first one arrives.
const GATHER: Duration = Duration::from_millis(1);

struct Request {
    lock: String,
    owner: String,
    ttl_ms: String,
    reply: oneshot::Sender<Result<(bool, Instant), LockError>>,
}

/// Queues renewals for one node.
#[derive(Debug, Clone)]
pub(crate) struct Renewer {
    tx: mpsc::UnboundedSender<Request>,
}

impl Renewer {
    /// Starts the batching task of `node`. Must run inside a Tokio runtime.
    pub(crate) fn new(node: Arc<Node>, scripts: Arc<Scripts>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(batcher(node, scripts, rx));
        Self { tx }
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
        match tokio::time::timeout(timeout + GATHER * 2, result).await {
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

async fn batcher(node: Arc<Node>, scripts: Arc<Scripts>, mut rx: mpsc::UnboundedReceiver<Request>) {
    while let Some(first) = rx.recv().await {
        tokio::time::sleep(GATHER).await;
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        // Batches run concurrently so a slow one does not hold up the next.
        tokio::spawn(send_batch(node.clone(), scripts.clone(), batch));
    }
}

async fn send_batch(node: Arc<Node>, scripts: Arc<Scripts>, batch: Vec<Request>) {
    let calls: Vec<(Vec<&str>, Vec<&str>)> = batch
        .iter()
        .map(|r| {
            (
                vec![r.lock.as_str()],
                vec![r.owner.as_str(), r.ttl_ms.as_str()],
            )
        })
        .collect();
    let sent_at = Instant::now();
    let timeout = node.timeout();
    let result = node
        .run(Operation::Renew, timeout, |mut conn| {
            let calls = &calls;
            let scripts = &scripts;
            async move { conn.eval_many(&scripts.renew, calls).await }
        })
        .await;
    match result {
        Ok(results) => {
            for (request, result) in batch.into_iter().zip(results) {
                let reply = match result {
                    Ok(Value::Int(n)) => Ok((n == 1, sent_at)),
                    Ok(other) => Err(LockError::new(
                        ErrorKind::Backend,
                        Operation::Renew,
                        format!("unexpected renewal answer {other:?}"),
                    )
                    .with_backend(NAME)),
                    Err(err) => Err(node.map_err(Operation::Renew, err)),
                };
                let _ = request.reply.send(reply);
            }
        }
        Err(err) => {
            for request in batch {
                let copy = LockError::new(err.kind(), Operation::Renew, err.to_string())
                    .with_backend(NAME);
                let _ = request.reply.send(Err(copy));
            }
        }
    }
}
