//! Renewals: `renew_many` of a batch of the renewal scheduler in one
//! pipeline per node (one round trip per node on a plain connection; the
//! cluster client pipelines per shard on its own), with the same
//! per-lease rules as one renewal: compare-and-pexpire, a majority for
//! Redlock, the deadline measured from when the pipeline was sent. Single
//! renewals are coalesced into batches per node (`batch.rs`); the shared
//! kinds' renewals are `shares.rs`.

pub(crate) mod batch;
pub(crate) mod shares;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lock_core::{
    ErrorKind, Lease, LeaseKind, LockError, Operation, RENEW_CONCURRENCY, renew_concurrently,
};
use tokio::time::Instant;

use crate::connection::{Node, Servers};
use crate::error::{NAME, copy_for_each, renewed_until};
use crate::grants::check_ttl;
use crate::keys::scripts::Scripts;
use batch::{Counters, MAX_BATCH, Renewer, renew_pipeline};

/// Renewal counts of a [`RedisBackend`](crate::RedisBackend) (see
/// [`RedisBackend::renewal_stats`](crate::RedisBackend::renewal_stats)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedisRenewalStats {
    /// Renewal round trips (pipelines) sent.
    pub round_trips: u64,
    /// Renewals sent in them.
    pub renewals: u64,
}

/// One node's answer: when its pipeline was sent, and per lease renewed
/// (`true`), not held (`false`) or an error.
type NodeAnswer = (Instant, Result<Vec<Result<bool, LockError>>, LockError>);

/// The renewals of every kind of lease, and one renewal batcher per node.
#[derive(Clone)]
pub(crate) struct Renewal {
    servers: Arc<Servers>,
    renewers: Arc<[Renewer]>,
}

impl Renewal {
    /// Starts one renewal batcher per node (on the current runtime).
    pub(crate) fn new(servers: Arc<Servers>) -> Self {
        let renewers = servers
            .nodes
            .iter()
            .map(|n| Renewer::new(n.clone(), servers.scripts.clone()))
            .collect();
        Self { servers, renewers }
    }

    /// How many renewals were sent, and in how many round trips
    /// (pipelines), summed over nodes.
    pub(crate) fn stats(&self) -> RedisRenewalStats {
        let mut stats = RedisRenewalStats::default();
        for renewer in self.renewers.iter() {
            stats.round_trips += renewer.counters().batches.load(Ordering::Relaxed);
            stats.renewals += renewer.counters().renewals.load(Ordering::Relaxed);
        }
        stats
    }

    /// `renew_many`: the mutex leases in one pipeline per node, the other
    /// kinds as `renew_mixed` groups them.
    pub(crate) async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        if leases.iter().any(|l| l.kind() != LeaseKind::Exclusive) {
            return self.renew_mixed(leases).await;
        }
        self.renew_pipelined(leases).await
    }

    /// One lease's renewal, every kind (the write leases of `renew_many`
    /// come here).
    async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        if lease.kind() != LeaseKind::Exclusive {
            return shares::renew_share(&self.servers, &self.renewers[0], lease).await;
        }
        let op = Operation::Renew;
        let key = lease.key();
        check_ttl(lease.ttl(), op, key)?;
        let servers = &self.servers;
        let names = servers.keys.mutex(key, op)?;
        let owner = servers.keys.owner_value(lease.owner());
        let timeout = servers.timeout();
        let calls = self
            .renewers
            .iter()
            .map(|r| r.renew(&names.lock, &owner, lease.ttl(), timeout));
        let results = futures_util::future::join_all(calls).await;
        let mut renewed_at: Vec<Instant> = Vec::new();
        let mut not_held = 0;
        let mut errors = Vec::new();
        for result in results {
            match result {
                Ok((true, sent_at)) => renewed_at.push(sent_at),
                Ok((false, _)) => not_held += 1,
                Err(err) => errors.push(err),
            }
        }
        let n = servers.nodes.len();
        let quorum = servers.quorum;
        if renewed_at.len() >= quorum {
            let sent_at = renewed_at
                .iter()
                .copied()
                .min()
                .unwrap_or_else(Instant::now);
            return renewed_until(sent_at, lease.ttl(), op).map_err(|e| e.with_key(key));
        }
        if not_held > n - quorum {
            return Err(LockError::new(
                ErrorKind::NotHeld,
                op,
                "the lock is not held by this lease any more",
            )
            .with_backend(NAME)
            .with_key(key));
        }
        let err = errors.into_iter().next().unwrap_or_else(|| {
            LockError::new(ErrorKind::Unavailable, op, "no majority answered").with_backend(NAME)
        });
        Err(err.with_key(key))
    }

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
        let keys = &self.servers.keys;
        for (index, lease) in leases.iter().enumerate() {
            match check_ttl(lease.ttl(), op, lease.key()) {
                Err(err) => results[index] = Some(Err(err)),
                Ok(()) => {
                    valid.push(index);
                    args.push([
                        keys.layout_names(lease.key()).lock,
                        keys.owner_value(lease.owner()).to_string(),
                        lease.ttl().as_millis().to_string(),
                    ]);
                }
            }
        }
        let (nodes, scripts) = (&self.servers.nodes, &self.servers.scripts);
        let timeout = self.servers.timeout();
        let answers: Vec<NodeAnswer> =
            futures_util::future::join_all(nodes.iter().enumerate().map(|(i, node)| {
                pipeline(
                    node.clone(),
                    scripts.clone(),
                    &args,
                    timeout,
                    self.renewers.get(i).map(Renewer::counters),
                )
            }))
            .await;
        let quorum = self.servers.quorum;
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

    /// `renew_many` with leases of other kinds than the mutex: the mutex
    /// leases in one pipeline (as before), the read and permit leases in
    /// another (one `ZRENEW` each, `MAX_BATCH` per round trip), the write
    /// leases through the mutex's renewal batcher (their key is a plain
    /// string like the mutex's).
    async fn renew_mixed(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        let mut groups: [Vec<usize>; 3] = Default::default();
        for (i, lease) in leases.iter().enumerate() {
            let group = match lease.kind() {
                LeaseKind::Exclusive => 0,
                LeaseKind::Write => 1,
                _ => 2,
            };
            groups[group].push(i);
        }
        let pick = |group: &[usize]| group.iter().map(|&i| leases[i]).collect::<Vec<&Lease>>();
        let (mutex, write, shares) = (pick(&groups[0]), pick(&groups[1]), pick(&groups[2]));
        let (mutex, write, shares) = futures_util::future::join3(
            self.renew_pipelined(&mutex),
            renew_concurrently(&write, RENEW_CONCURRENCY, |lease| self.renew_one(lease)),
            shares::renew_shares(&self.servers, &shares),
        )
        .await;
        let mut results: Vec<Option<Result<Instant, LockError>>> =
            std::iter::repeat_with(|| None).take(leases.len()).collect();
        for (group, answers) in groups.iter().zip([mutex, write, shares]) {
            for (&i, answer) in group.iter().zip(answers) {
                results[i] = Some(answer);
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(
                        LockError::new(ErrorKind::Backend, Operation::Renew, "no result")
                            .with_backend(NAME),
                    )
                })
            })
            .collect()
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
