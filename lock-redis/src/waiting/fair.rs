//! The fair (FIFO) mutex (`fair=true`; one server, Sentinel, Cluster): a
//! try and a waiting acquire through the fair script of
//! `keys/fair.rs`. The lease is a plain mutex lease (same lock key,
//! same counter), so renew / renew_many / release / inspect are the
//! mutex's.

use std::time::Duration;

use lock_core::{FencingToken, Lease, LockError, LockKey, Operation, OwnerId};
use tokio::time::Instant;

use crate::connection::Servers;
use crate::grants::Grants;
use crate::grants::attempt::{AcquireTexts, Attempt, granted};
use crate::grants::undo::Traces;
use crate::keys::fair::{FAIR, FairNames};
use crate::keys::replies::{NodeGrant, parse_grant};
use crate::waiting::retry::{entry_lease, wait_one_server};

/// A fair acquire's traces: its queue entry, a grant whose answer was lost.
impl Traces for FairNames {
    async fn abandon(&self, servers: &Servers, owner: &str) -> Result<redis::Value, LockError> {
        servers
            .first()
            .run(
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

/// One fair acquire script call. `wait`: join the queue (or refresh our
/// entry) with an entry lease that long when refused; `None` for a try.
/// The same `owner` is sent by every attempt of one waiting acquire (it
/// is the queue entry's id).
#[allow(clippy::too_many_arguments)]
async fn fair_attempt(
    grants: &Grants,
    key: &LockKey,
    ttl: Duration,
    owner: OwnerId,
    names: &FairNames,
    wait: Option<Duration>,
    op: Operation,
    timeout: Duration,
) -> Result<Attempt, LockError> {
    let texts = AcquireTexts::new(owner, ttl, wait);
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
            let lease = granted(key, owner, FencingToken::new(token), ttl, sent_at)?;
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
    let op = Operation::TryAcquire;
    let names = grants.servers().keys.fair(key);
    let owner = OwnerId::random();
    // Armed until the answer is seen: a lost answer may hide a grant.
    let guard = grants.withdraw_guard(&names, owner);
    let timeout = grants.servers().timeout();
    let attempt = fair_attempt(grants, key, ttl, owner, &names, None, op, timeout).await;
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
    let names = grants.servers().keys.fair(key);
    let owner = OwnerId::random();
    let guard = grants.withdraw_guard(&names, owner);
    let result = wait_fair(grants, key, ttl, deadline, owner, &names).await;
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
    key: &LockKey,
    ttl: Duration,
    deadline: Instant,
    owner: OwnerId,
    names: &FairNames,
) -> Result<Lease, LockError> {
    let op = Operation::Acquire;
    let servers = grants.servers();
    let entry = entry_lease(&servers.config, ttl);
    let channel = &names.mutex.channel;
    wait_one_server(servers, key, channel, deadline, entry / 3, move |timeout| {
        fair_attempt(grants, key, ttl, owner, names, Some(entry), op, timeout)
    })
    .await
}
