//! `renew_many`: a batch of the renewal scheduler renewed in one pipeline
//! per node (one round trip per node on a plain connection; the cluster
//! client pipelines per shard on its own), with the same per-lease rules
//! as `renew`: compare-and-pexpire, a majority for Redlock, the deadline
//! measured from when the pipeline was sent.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lock_core::{ErrorKind, Lease, LockError, Operation, check_ttl};
use tokio::time::Instant;

use crate::batch::{Counters, MAX_BATCH, renew_pipeline};
use crate::conn::Node;
use crate::driver::{MIN_TTL, RedisBackend};
use crate::error::{NAME, copy_for_each, renewed_until};
use crate::keys::Scripts;

/// One node's answer: when its pipeline was sent, and per lease renewed
/// (`true`), not held (`false`) or an error.
type NodeAnswer = (Instant, Result<Vec<Result<bool, LockError>>, LockError>);

impl RedisBackend {
    /// Renews `leases` with one pipeline per node (per `MAX_BATCH`).
    pub(crate) async fn renew_pipelined(
        &self,
        leases: &[&Lease],
    ) -> Vec<Result<Instant, LockError>> {
        let op = Operation::Renew;
        let mut results: Vec<Option<Result<Instant, LockError>>> =
            std::iter::repeat_with(|| None).take(leases.len()).collect();
        // Checked before anything is sent, as `renew` does.
        let mut valid = Vec::with_capacity(leases.len());
        let mut args: Vec<[String; 3]> = Vec::with_capacity(leases.len());
        for (index, lease) in leases.iter().enumerate() {
            match check_ttl(lease.ttl(), MIN_TTL, op) {
                Err(err) => {
                    results[index] = Some(Err(err.with_backend(NAME).with_key(lease.key())))
                }
                Ok(()) => {
                    valid.push(index);
                    args.push([
                        self.redis_key(lease.key()),
                        self.owner_value(lease.owner()),
                        lease.ttl().as_millis().to_string(),
                    ]);
                }
            }
        }
        let (nodes, scripts, counters) = self.renewal_parts();
        let timeout = self.config().operation_timeout;
        let answers: Vec<NodeAnswer> =
            futures_util::future::join_all(nodes.iter().enumerate().map(|(i, node)| {
                pipeline(
                    node.clone(),
                    scripts.clone(),
                    &args,
                    timeout,
                    counters.get(i).copied(),
                )
            }))
            .await;
        let quorum = nodes.len() / 2 + 1;
        for (position, &index) in valid.iter().enumerate() {
            let lease = leases[index];
            let mut renewed_at: Option<Instant> = None;
            let mut renewed = 0;
            let mut not_held = 0;
            let mut error = None;
            for (sent_at, answer) in &answers {
                match answer.as_ref().map(|list| list.get(position)) {
                    Ok(Some(Ok(true))) => {
                        renewed += 1;
                        renewed_at = Some(renewed_at.map_or(*sent_at, |at| at.min(*sent_at)));
                    }
                    Ok(Some(Ok(false))) => not_held += 1,
                    Ok(Some(Err(err))) | Err(err) => {
                        error.get_or_insert_with(|| copy_for_each(err, op));
                    }
                    Ok(None) => {
                        error.get_or_insert_with(|| {
                            LockError::new(ErrorKind::Backend, op, "short pipeline answer")
                                .with_backend(NAME)
                        });
                    }
                }
            }
            let result = if renewed >= quorum {
                renewed_until(renewed_at.unwrap_or_else(Instant::now), lease.ttl(), op)
            } else if not_held > nodes.len() - quorum {
                Err(LockError::new(
                    ErrorKind::NotHeld,
                    op,
                    "the lock is not held by this lease any more",
                )
                .with_backend(NAME))
            } else {
                Err(error.unwrap_or_else(|| {
                    LockError::new(ErrorKind::Unavailable, op, "no majority answered")
                        .with_backend(NAME)
                }))
            };
            results[index] = Some(result.map_err(|e| e.with_key(lease.key())));
        }
        lock_core::results_in_order(results, NAME)
    }
}

/// The renewals of `args` on one node, `MAX_BATCH` per pipeline.
async fn pipeline(
    node: Arc<Node>,
    scripts: Arc<Scripts>,
    args: &[[String; 3]],
    timeout: Duration,
    counters: Option<&Counters>,
) -> NodeAnswer {
    let sent_at = Instant::now();
    let mut out = Vec::with_capacity(args.len());
    for chunk in args.chunks(MAX_BATCH) {
        if let Some(counters) = counters {
            // Counted as sent, as the single-renewal batcher counts them.
            counters.batches.fetch_add(1, Ordering::Relaxed);
            counters.renewals.fetch_add(
                u64::try_from(chunk.len()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
        }
        let renewals: Vec<[&str; 3]> = chunk
            .iter()
            .map(|[lock, owner, ttl]| [lock.as_str(), owner.as_str(), ttl.as_str()])
            .collect();
        match renew_pipeline(&node, &scripts, &renewals, timeout).await {
            Ok(replies) => out.extend(replies),
            Err(err) => return (sent_at, Err(err)),
        }
    }
    (sent_at, Ok(out))
}
