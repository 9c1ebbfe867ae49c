//! Renewals of read, write and permit leases: the writer's key is a plain
//! string like the mutex's, renewed by the mutex's batched
//! compare-and-pexpire; readers and permit holders by `ZRENEW`, one at a
//! time or pipelined (`MAX_BATCH` per round trip).

use lock_core::{ErrorKind, Lease, LeaseKind, LockError, Operation};
use redis::Value;
use tokio::time::Instant;

use crate::connection::{Lane, Servers};
use crate::error::{NAME, copy_for_each, renewed_until, unexpected};
use crate::keys::replies::{as_int, ttl_ms};
use crate::keys::shared::{SHARED, SharedNames};
use crate::renewal::batch::{MAX_BATCH, Renewer};
use crate::shared::refusals::{check_shared, not_held};

/// `renew` of a read, write or permit lease.
pub(crate) async fn renew_share(
    servers: &Servers,
    writers: &Renewer,
    lease: &Lease,
) -> Result<Instant, LockError> {
    let op = Operation::Renew;
    let key = lease.key();
    let kind = lease.kind();
    check_shared(servers, key, kind, lease.ttl(), op)?;
    let owner = lease.owner().to_hex();
    let timeout = servers.timeout();
    let (renewed, sent_at) = match servers.keys.shared(key, kind) {
        SharedNames::Rw(n) if kind == LeaseKind::Write => {
            // The writer is a plain string like the mutex: the mutex's
            // batched compare-and-pexpire serves it.
            writers
                .renew(&n.writer, &owner, lease.ttl(), timeout)
                .await
                .map_err(|e| e.with_key(key))?
        }
        names => {
            let ttl_text = ttl_ms(lease.ttl());
            let sent_at = Instant::now();
            let (owner, ttl_text) = (owner.as_str(), ttl_text.as_str());
            let names = &names;
            let value = servers
                .first()
                .run_on(Lane::ANY, op, timeout, move |mut conn| async move {
                    match names {
                        SharedNames::Rw(n) => {
                            conn.eval(
                                &SHARED.zrenew,
                                &[&n.readers, &n.details],
                                &[owner, ttl_text],
                            )
                            .await
                        }
                        SharedNames::Sem(n) => {
                            conn.eval(
                                &SHARED.zrenew,
                                &[&n.holders, &n.counts, &n.tokens, &n.details],
                                &[owner, ttl_text],
                            )
                            .await
                        }
                    }
                })
                .await
                .map_err(|e| e.with_key(key))?;
            (as_int(&value, op)? == 1, sent_at)
        }
    };
    if !renewed {
        return Err(not_held(
            op,
            key,
            "the lock is not held by this lease any more",
        ));
    }
    renewed_until(sent_at, lease.ttl(), op).map_err(|e| e.with_key(key))
}

/// Read and permit leases renewed in pipelines of `ZRENEW` calls, as
/// [`renew_share`] renews one.
pub(crate) async fn renew_shares(
    servers: &Servers,
    leases: &[&Lease],
) -> Vec<Result<Instant, LockError>> {
    let op = Operation::Renew;
    let mut results: Vec<Option<Result<Instant, LockError>>> =
        std::iter::repeat_with(|| None).take(leases.len()).collect();
    let mut calls: Vec<(usize, Vec<String>, [String; 2])> = Vec::new();
    for (i, lease) in leases.iter().enumerate() {
        let (key, kind) = (lease.key(), lease.kind());
        if let Err(err) = check_shared(servers, key, kind, lease.ttl(), op) {
            results[i] = Some(Err(err));
            continue;
        }
        let keys = match servers.keys.shared(key, kind) {
            SharedNames::Rw(n) => vec![n.readers, n.details],
            SharedNames::Sem(n) => vec![n.holders, n.counts, n.tokens, n.details],
        };
        calls.push((i, keys, [lease.owner().to_hex(), ttl_ms(lease.ttl())]));
    }
    let node = servers.first();
    let timeout = servers.timeout();
    for chunk in calls.chunks(MAX_BATCH) {
        let args: Vec<(Vec<&str>, Vec<&str>)> = chunk
            .iter()
            .map(|(_, keys, args)| {
                (
                    keys.iter().map(String::as_str).collect(),
                    args.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        let sent_at = Instant::now();
        let args = &args;
        let answer = node
            .run_on(Lane::RENEWALS, op, timeout, move |mut conn| async move {
                conn.eval_many(&SHARED.zrenew, args).await
            })
            .await;
        for (position, (i, _, _)) in chunk.iter().enumerate() {
            let lease = leases[*i];
            let result = match &answer {
                Ok(replies) => match replies.get(position) {
                    Some(Ok(Value::Int(1))) => renewed_until(sent_at, lease.ttl(), op),
                    Some(Ok(Value::Int(0))) => Err(not_held(
                        op,
                        lease.key(),
                        "the lock is not held by this lease any more",
                    )),
                    Some(Ok(other)) => Err(unexpected(op, other)),
                    Some(Err(err)) => Err(node.map_err(op, err.clone())),
                    None => Err(
                        LockError::new(ErrorKind::Backend, op, "short pipeline answer")
                            .with_backend(NAME),
                    ),
                },
                Err(err) => Err(copy_for_each(err, op)),
            };
            results[*i] = Some(result.map_err(|e| e.with_key(lease.key())));
        }
    }
    lock_core::results_in_order(results, NAME)
}
