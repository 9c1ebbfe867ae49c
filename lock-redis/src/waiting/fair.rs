//! The fair (FIFO) mutex (`fair=true`; one server, Sentinel, Cluster): a
//! try and a waiting acquire through the fair script of
//! `keys/fair.rs`. The lease is a plain mutex lease (same lock key,
//! same counter), so renew / renew_many / release / inspect are the
//! mutex's.

use std::time::Duration;

use lock_core::{FencingToken, Lease, LockError, LockKey, Operation};
use tokio::time::Instant;

use crate::connection::{Lane, Servers};
use crate::grants::Grants;
use crate::grants::attempt::{AcquireCall, Attempt};
use crate::grants::undo::Traces;
use crate::keys::fair::{FAIR, FairNames};
use crate::keys::replies::{NodeGrant, parse_grant};
use crate::waiting::retry::{entry_lease, wait_one_server};

/// A fair acquire's traces: its queue entry, a grant whose answer was lost.
impl Traces for FairNames {
    async fn abandon(&self, servers: &Servers, owner: &str) -> Result<redis::Value, LockError> {
        servers
            .first()
            .run_on(
                servers.undo_lane(Lane::of(owner)),
                Operation::Release,
                servers.timeout(),
                move |mut conn| async move {
                    conn.eval(
                        &FAIR.abandon,
                        &[&self.mutex.lock, &self.queue, &self.queue_expiry],
                        &[owner, &self.mutex.channel],
                    )
                    .await
                },
            )
            .await
    }
}

/// One fair acquire script call: `call.wait` joins the queue (or
/// refreshes our entry) when refused.
async fn fair_attempt(
    grants: &Grants,
    call: AcquireCall<'_>,
    names: &FairNames,
    timeout: Duration,
) -> Result<Attempt, LockError> {
    let AcquireCall { key, op, .. } = call;
    let texts = call.texts();
    let args = [
        texts.owner.as_str(),
        texts.ttl.as_str(),
        texts.wait.as_str(),
        names.mutex.channel.as_str(),
        texts.details.as_str(),
    ];
    let mut keys = names.acquire_keys().to_vec();
    keys.extend(grants.servers().floor.key_for(&names.mutex.counter));
    let keys = &keys;
    let sent_at = Instant::now();
    let (value, acked) = grants
        .run_grant(
            grants.servers().first(),
            Lane::of(&texts.owner),
            op,
            timeout,
            |mut conn| async move { conn.eval(&FAIR.acquire, keys, &args).await },
            |value| matches!(parse_grant(value), Ok(NodeGrant::Granted(_))),
        )
        .await
        .map_err(|e| e.with_key(key))?;
    match parse_grant(&value).map_err(|e| e.with_key(key))? {
        NodeGrant::Granted(token) => {
            grants
                .confirm_one_server_grant(names, &texts.owner, op, acked, key)
                .await?;
            let lease = call.granted(FencingToken::new(token), sent_at)?;
            Ok(Attempt::Granted(lease))
        }
        NodeGrant::Held(ms) => Ok(Attempt::held(ms)),
    }
}

/// `try_acquire` in fair mode: granted only when the key is free and
/// nobody waits for it. One round trip.
pub(crate) async fn try_acquire(
    grants: &Grants,
    key: &LockKey,
    ttl: Duration,
) -> Result<Option<Lease>, LockError> {
    let call = AcquireCall::new(key, ttl, Operation::TryAcquire);
    let names = grants.servers().keys.fair(key);
    // Armed until the answer is seen: a lost answer may hide a grant.
    let guard = grants.withdraw_guard(&names, call.owner);
    let timeout = grants.servers().timeout();
    let attempt = fair_attempt(grants, call, &names, timeout).await;
    guard.settle_try(attempt, |_| false)
}

/// `acquire` in fair mode: one try that also joins the queue when
/// refused (on a free key with no waiters that try is the whole
/// acquire, one round trip); then subscribe to the release channel and
/// re-try on every notification, when the blocker's TTL (or the queue
/// head's entry lease) ends, and at least every third of our own entry
/// lease, which each attempt refreshes. The entry is withdrawn (in the
/// background) when the acquire ends without a lease: at the deadline,
/// on an error, or when the future is dropped.
pub(crate) async fn acquire(
    grants: &Grants,
    key: &LockKey,
    ttl: Duration,
    deadline: Instant,
) -> Result<Lease, LockError> {
    let call = AcquireCall::new(key, ttl, Operation::Acquire);
    let names = grants.servers().keys.fair(key);
    let guard = grants.withdraw_guard(&names, call.owner);
    let result = wait_fair(grants, call, deadline, &names).await;
    if result.is_ok() {
        guard.disarm();
    }
    // Otherwise the guard withdraws our entry in the background (and
    // publishes, so the waiter behind us goes on at once): the caller
    // gets its `Contended` at the deadline, not one round trip later.
    result
}

async fn wait_fair(
    grants: &Grants,
    call: AcquireCall<'_>,
    deadline: Instant,
    names: &FairNames,
) -> Result<Lease, LockError> {
    let servers = grants.servers();
    let entry = entry_lease(&servers.config, call.ttl);
    let call = call.waiting(Some(entry));
    let channel = &names.mutex.channel;
    wait_one_server(
        servers,
        call.key,
        channel,
        deadline,
        entry / 3,
        move |timeout| fair_attempt(grants, call, names, timeout),
    )
    .await
}
