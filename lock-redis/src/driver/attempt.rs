//! One acquire attempt on every node (a majority for Redlock), the undo of
//! a grant whose outcome was not seen, and what a waiting acquire does
//! after an attempt; for the one-server acquires of the fair mutex and the
//! shared kinds, their withdraw guard and their waiting loop.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{
    ErrorKind, FencingToken, Lease, LockError, LockKey, Operation, OwnerId, RetryPolicy,
    random_delay,
};
use redis::Value;
use tokio::sync::futures::Notified;
use tokio::time::{Instant, sleep_until};

use super::{Inner, RedisBackend};
use crate::conn::{Conn, Node};
use crate::error::{NAME, still_held};
use crate::keys::{GrantArgs, KeyNames, NodeGrant, as_int, parse_grant, pttl, ttl_ms};

/// What one acquire attempt found.
pub(super) enum Attempt {
    Granted(Lease),
    /// Someone else holds the key; `retry_in` is when it expires at the
    /// latest (from its PTTL) or `None` when unknown. `split` says that a
    /// Redlock attempt won some nodes but not a majority.
    Held {
        retry_in: Option<Duration>,
        split: bool,
    },
}

impl Attempt {
    /// Refused by a one-server script that answered the blocker's PTTL
    /// `ms`; -1 is a foreign holder without TTL: re-check at the interval.
    pub(super) fn held(ms: i64) -> Self {
        Self::Held {
            retry_in: (ms != -1).then(|| pttl(ms).unwrap_or(Duration::ZERO)),
            split: false,
        }
    }
}

/// The texts a one-server acquire script (fair mutex, shared kinds) takes
/// besides its key names.
pub(super) struct AcquireTexts {
    pub(super) owner: String,
    pub(super) ttl: String,
    /// The waiting entry's lease, or "0" for a try (register no entry).
    pub(super) wait: String,
    /// The holder's details, written beside the grant by the script itself.
    pub(super) details: String,
}

impl AcquireTexts {
    pub(super) fn new(owner: OwnerId, ttl: Duration, wait: Option<Duration>) -> Self {
        Self {
            owner: owner.to_hex(),
            ttl: ttl_ms(ttl),
            wait: wait.map_or_else(|| "0".to_owned(), ttl_ms),
            details: lock_core::HolderDetails::encode_current(),
        }
    }
}

/// A lease granted by an attempt sent at `sent_at`.
pub(super) fn granted(
    key: &LockKey,
    owner: OwnerId,
    token: FencingToken,
    ttl: Duration,
    sent_at: Instant,
) -> Result<Lease, LockError> {
    Lease::granted(key.clone(), owner, token, ttl, sent_at, String::new())
        .map_err(|e| e.with_backend(NAME))
}

/// What a waiting acquire does after an attempt.
/// Waits before a waiter's next try: until `notified` (a release on the
/// key's channel) or `wait` has passed, never past `deadline`, at which it
/// answers `Contended`.
pub(super) async fn next_try(
    notified: std::pin::Pin<&mut Notified<'_>>,
    wait: Duration,
    deadline: Instant,
    key: &LockKey,
) -> Result<(), LockError> {
    let wake_at = (Instant::now() + wait).min(deadline);
    tokio::select! {
        () = notified => {}
        () = sleep_until(wake_at) => {}
    }
    if Instant::now() >= deadline {
        return Err(still_held(key));
    }
    Ok(())
}

pub(super) enum Found {
    Granted(Lease),
    /// Wait (for a release notification, at most this long), then retry.
    Wait(Duration),
}

/// The cleanup of a guard dropped armed, in the background on the current
/// runtime: `cleanup` runs on clones of the backend's state and of
/// `names`, with `owner`. Without a runtime nothing is spawned and the
/// traces expire with their TTL.
fn in_background<N, F>(
    inner: &Arc<Inner>,
    names: &N,
    owner: String,
    cleanup: impl FnOnce(Arc<Inner>, N, String) -> F,
) where
    N: Clone,
    F: Future<Output = ()> + Send + 'static,
{
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(cleanup(inner.clone(), names.clone(), owner));
    }
}

/// Releases a grant whose outcome we could not see (timeout, cancelled
/// future, expired on arrival, WAIT not satisfied) unless disarmed.
struct PendingGrant<'a> {
    inner: &'a Arc<Inner>,
    names: &'a KeyNames,
    owner: &'a str,
    armed: bool,
}

impl PendingGrant<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for PendingGrant<'_> {
    fn drop(&mut self) {
        if self.armed {
            let owner = self.owner.to_owned();
            in_background(
                self.inner,
                self.names,
                owner,
                |inner, names, owner| async move {
                    let _ = inner
                        .release_all(&names, &owner, inner.config.operation_timeout)
                        .await;
                },
            );
        }
    }
}

/// The Redis names under which a one-server acquire leaves traces (its
/// waiting entry, a grant whose answer was lost), and their removal.
pub(super) trait Traces: Clone + Send + Sync + 'static {
    /// Removes every trace of `owner` under these names (and publishes, so
    /// a waiter behind it goes on at once).
    fn abandon(
        &self,
        inner: &Inner,
        owner: &str,
    ) -> impl Future<Output = Result<Value, LockError>> + Send;
}

/// Removes every trace of an acquire that did not end with a lease,
/// unless disarmed: at once on `withdraw`, in the background when dropped
/// armed (a cancelled waiter, a deadline, an error), so the next waiter does
/// not wait out our entry lease.
pub(super) struct Withdraw<N: Traces> {
    inner: Arc<Inner>,
    names: N,
    owner: String,
    armed: bool,
}

impl<N: Traces> Withdraw<N> {
    pub(super) fn disarm(mut self) {
        self.armed = false;
    }

    pub(super) async fn withdraw(mut self) {
        self.armed = false;
        let _ = self.names.abandon(&self.inner, &self.owner).await;
    }
}

impl<N: Traces> Withdraw<N> {
    /// A single try's answer: once a grant or a refusal is seen there is
    /// nothing to withdraw (the guard is disarmed), nor after an error
    /// `wrote_nothing` recognises; after any other error the answer may
    /// have hidden a grant, and the guard withdraws in the background.
    pub(super) fn settle_try(
        self,
        attempt: Result<Attempt, LockError>,
        wrote_nothing: impl FnOnce(&LockError) -> bool,
    ) -> Result<Option<Lease>, LockError> {
        match attempt {
            Ok(Attempt::Granted(lease)) => {
                self.disarm();
                Ok(Some(lease))
            }
            Ok(Attempt::Held { .. }) => {
                self.disarm();
                Ok(None)
            }
            Err(err) if wrote_nothing(&err) => {
                self.disarm();
                Err(err)
            }
            Err(err) => Err(err),
        }
    }
}

impl<N: Traces> Drop for Withdraw<N> {
    fn drop(&mut self) {
        if self.armed {
            let owner = std::mem::take(&mut self.owner);
            in_background(
                &self.inner,
                &self.names,
                owner,
                |inner, names, owner| async move {
                    let _ = names.abandon(&inner, &owner).await;
                },
            );
        }
    }
}

/// Runs `call` on every node: concurrently, or directly when there is one.
async fn each_node<'a, F, Fut, T>(nodes: &'a [Arc<Node>], mut call: F) -> Vec<T>
where
    F: FnMut(&'a Arc<Node>) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    if let [node] = nodes {
        vec![call(node).await]
    } else {
        futures_util::future::join_all(nodes.iter().map(call)).await
    }
}

impl RedisBackend {
    pub(super) async fn attempt(
        &self,
        key: &LockKey,
        ttl: Duration,
        op: Operation,
        timeout: Duration,
    ) -> Result<Attempt, LockError> {
        let names = self.names(key, op)?;
        let owner = OwnerId::random();
        let owner_hex = self.owner_value(owner);
        let ttl_ms = ttl_ms(ttl);
        let details = lock_core::HolderDetails::encode_current();
        let grant = GrantArgs {
            owner: &owner_hex,
            ttl_ms: &ttl_ms,
            details: &details,
            floor: self.inner.floor.key_for(&names.counter),
        };
        let pending = PendingGrant {
            inner: &self.inner,
            names: &names,
            owner: &owner_hex,
            armed: true,
        };
        let inner = &self.inner;
        let sent_at = Instant::now();
        let per_node = if inner.redlock {
            timeout.min((ttl / 10).max(Duration::from_millis(100)))
        } else {
            timeout
        };
        let results = each_node(&inner.nodes, |node| {
            let (names, grant) = (&names, &grant);
            self.run_grant(
                node,
                op,
                per_node,
                move |mut conn| async move {
                    inner.scripts.call_acquire(&mut conn, names, grant).await
                },
                |value| matches!(parse_grant(value), Ok(NodeGrant::Granted(_))),
            )
        })
        .await;
        let mut tokens = Vec::new();
        let mut held_pttl: Option<Duration> = None;
        let mut errors = Vec::new();
        let mut acked = None;
        for result in results {
            let result = result.and_then(|(value, replicas)| {
                acked = acked.or(replicas);
                parse_grant(&value)
            });
            match result {
                Ok(NodeGrant::Granted(token)) => tokens.push(token),
                Ok(NodeGrant::Held(ms)) => {
                    let left = pttl(ms).unwrap_or(Duration::ZERO);
                    held_pttl = Some(held_pttl.map_or(left, |p| p.min(left)));
                    if ms == -1 {
                        // A foreign holder without TTL: re-check at the interval.
                        held_pttl = Some(inner.config.recheck);
                    }
                }
                Err(err) => errors.push(err),
            }
        }
        if tokens.len() >= inner.quorum {
            // Redlock: the highest node counter is a hint, not a safe token.
            let token = tokens.iter().copied().max().unwrap_or(0);
            if let Err(err) = self.replicas_acked(op, acked) {
                // `pending` releases the grant on drop.
                return Err(err.with_key(key));
            }
            let lease = granted(key, owner, FencingToken::new(token), ttl, sent_at)?;
            pending.disarm();
            return Ok(Attempt::Granted(lease));
        }
        let split = !tokens.is_empty();
        if tokens.is_empty() && errors.is_empty() {
            // Nothing was set anywhere: nothing to undo.
            pending.disarm();
        } else {
            // Undo the partial grant now, on every node (also those whose
            // answer was lost), so no partial lock is left behind.
            let _ = inner.release_all(&names, &owner_hex, per_node).await;
            pending.disarm();
        }
        if errors.len() > inner.nodes.len() - inner.quorum {
            let err = errors.swap_remove(0);
            let err = if inner.redlock {
                LockError::new(
                    err.kind(),
                    op,
                    format!(
                        "only {} of {} Redlock nodes answered (a majority is needed): {}",
                        inner.nodes.len() - errors.len() - 1,
                        inner.nodes.len(),
                        err.message()
                    ),
                )
                .with_backend(NAME)
                .with_source(err)
            } else {
                err
            };
            return Err(err.with_key(key));
        }
        Ok(Attempt::Held {
            retry_in: held_pttl,
            split,
        })
    }

    /// Runs a grant script (`script`, on a handle of `node`'s connection)
    /// and, with `replicas=N` configured, when the answer is a grant
    /// (`is_grant`), `WAIT`s for the replicas on the *same* connection
    /// right after it, within the same bounded call. `WAIT` counts the
    /// acknowledgements of the writes of the connection it runs on: sent on
    /// another one (the shared connection re-established in between, after
    /// some other call on it failed or timed out) it would confirm nothing.
    /// If that connection breaks before `WAIT` answers, the call fails like
    /// a grant whose answer was lost (the caller undoes it). Returns the
    /// script's answer and how many replicas acknowledged it (`None`: no
    /// `WAIT` was sent).
    pub(super) async fn run_grant<F, Fut>(
        &self,
        node: &Node,
        op: Operation,
        timeout: Duration,
        script: F,
        is_grant: impl FnOnce(&Value) -> bool,
    ) -> Result<(Value, Option<i64>), LockError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<Value>>,
    {
        let config = &self.inner.config;
        let wanted = config.wait_replicas;
        let wait_ms = config.wait_timeout.as_millis().to_string();
        // `WAIT` blocks up to its own timeout on the server.
        let bound = if wanted > 0 {
            timeout.saturating_add(config.wait_timeout * 2)
        } else {
            timeout
        };
        node.run(op, bound, |mut conn| async move {
            // A clone of the handle: the same server connection.
            let value = script(conn.clone()).await?;
            if wanted == 0 || !is_grant(&value) {
                return Ok((value, None));
            }
            let acked = conn
                .query::<i64>(redis::cmd("WAIT").arg(wanted).arg(&wait_ms))
                .await?;
            Ok((value, Some(acked)))
        })
        .await
    }

    /// Whether a grant's `WAIT` (see [`run_grant`](Self::run_grant)) was
    /// acknowledged by the configured number of replicas; always with none
    /// configured.
    pub(super) fn replicas_acked(
        &self,
        op: Operation,
        acked: Option<i64>,
    ) -> Result<(), LockError> {
        let wanted = self.inner.config.wait_replicas;
        if wanted == 0 {
            return Ok(());
        }
        let Some(acked) = acked else {
            return Err(LockError::new(
                ErrorKind::Backend,
                op,
                "the grant was not confirmed by WAIT on its connection; it was undone",
            )
            .with_backend(NAME));
        };
        if acked < i64::from(wanted) {
            return Err(LockError::new(
                ErrorKind::Unavailable,
                op,
                format!("only {acked} of {wanted} replicas acknowledged the grant; it was undone"),
            )
            .with_backend(NAME));
        }
        Ok(())
    }

    /// After a one-server grant to `owner_hex` under `names`, whose `WAIT`
    /// (on the grant's connection, see [`run_grant`](Self::run_grant))
    /// answered `acked`: a grant too few replicas took is undone (a waiting
    /// entry goes with it).
    pub(super) async fn confirm_one_server_grant<N: Traces>(
        &self,
        names: &N,
        owner_hex: &str,
        op: Operation,
        acked: Option<i64>,
        key: &LockKey,
    ) -> Result<(), LockError> {
        if let Err(err) = self.replicas_acked(op, acked) {
            let _ = names.abandon(&self.inner, owner_hex).await;
            return Err(err.with_key(key));
        }
        Ok(())
    }

    /// A guard that withdraws `owner`'s traces under `names` unless disarmed.
    pub(super) fn withdraw_guard<N: Traces>(&self, names: &N, owner: OwnerId) -> Withdraw<N> {
        Withdraw {
            inner: self.inner.clone(),
            names: names.clone(),
            owner: owner.to_hex(),
            armed: true,
        }
    }

    /// How long a waiter's queue entry lives without a refresh: at most the
    /// lease's TTL and three re-check intervals (1.5 s by default), at
    /// least 30 ms. A waiter that died stops holding up the queue after it.
    pub(super) fn entry_lease(&self, ttl: Duration) -> Duration {
        ttl.min(self.inner.config.recheck * 3)
            .max(Duration::from_millis(30))
    }

    /// The waiting part of a one-server acquire (the fair mutex, the shared
    /// kinds): `attempt` (given its timeout) once; then subscribe to
    /// `channel` and attempt again on every release notification, when the
    /// blocker's TTL ends and at least every `refresh`, until a grant, a
    /// permanent error or `deadline`.
    pub(super) async fn wait_one_server<F, Fut>(
        &self,
        key: &LockKey,
        channel: &str,
        deadline: Instant,
        refresh: Duration,
        mut attempt: F,
    ) -> Result<Lease, LockError>
    where
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = Result<Attempt, LockError>>,
    {
        let mut errors = None;
        let first = attempt(self.attempt_timeout(deadline)).await;
        if let Found::Granted(lease) = self.found(key, first, deadline, &mut errors)? {
            return Ok(lease);
        }
        let watch = self.inner.notifier.watch(channel, deadline).await;
        loop {
            // Registered before the attempt so a release in between wakes us.
            let notified = watch.notify().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let result = attempt(self.attempt_timeout(deadline)).await;
            let wait = match self.found(key, result, deadline, &mut errors)? {
                Found::Granted(lease) => return Ok(lease),
                Found::Wait(wait) => wait.min(refresh),
            };
            next_try(notified.as_mut(), wait, deadline, key).await?;
        }
    }

    /// The bound of one attempt of a waiting acquire: the operation
    /// timeout, shortened near the deadline (but never below 100 ms).
    pub(super) fn attempt_timeout(&self, deadline: Instant) -> Duration {
        let left = deadline.saturating_duration_since(Instant::now());
        self.inner
            .config
            .operation_timeout
            .min(left.max(Duration::from_millis(100)))
    }

    /// What a waiting acquire does after one attempt: return the lease,
    /// fail (a permanent error, or the deadline passed), or wait this long
    /// (at most) before the next attempt.
    pub(super) fn found(
        &self,
        key: &LockKey,
        attempt: Result<Attempt, LockError>,
        deadline: Instant,
        errors: &mut Option<lock_core::Backoff>,
    ) -> Result<Found, LockError> {
        let config = &self.inner.config;
        match attempt {
            Ok(Attempt::Granted(lease)) => Ok(Found::Granted(lease)),
            Ok(Attempt::Held { retry_in, split }) => {
                if Instant::now() >= deadline {
                    return Err(still_held(key));
                }
                Ok(Found::Wait(if split {
                    // Redlock split vote: back off a random time so the
                    // contenders do not collide again.
                    random_delay(Duration::from_millis(30))
                } else {
                    // Expiry publishes nothing: re-check when the holder's
                    // TTL runs out, and at least every `recheck`.
                    retry_in
                        .map_or(config.recheck, |t| t + Duration::from_millis(1))
                        .min(config.recheck)
                }))
            }
            Err(err) if err.is_temporary() || err.is_lost() => {
                if Instant::now() >= deadline {
                    return Err(err);
                }
                let errors = errors.get_or_insert_with(|| {
                    RetryPolicy {
                        initial: Duration::from_millis(20),
                        max: Duration::from_millis(500),
                        multiplier: 2,
                        max_attempts: None,
                    }
                    .backoff()
                });
                Ok(Found::Wait(
                    errors.next_delay().unwrap_or(Duration::from_millis(500)),
                ))
            }
            Err(err) => Err(err),
        }
    }
}

impl Inner {
    /// Compare-and-delete on every node; `(released, not_held, errors)`.
    pub(super) async fn release_all(
        &self,
        names: &KeyNames,
        owner: &str,
        timeout: Duration,
    ) -> (usize, usize, Vec<LockError>) {
        let results = each_node(&self.nodes, |node| {
            node.run(Operation::Release, timeout, move |mut conn| async move {
                self.scripts.call_release(&mut conn, names, owner).await
            })
        })
        .await;
        let mut released = 0;
        let mut not_held = 0;
        let mut errors = Vec::new();
        for result in results {
            match result.and_then(|v| as_int(&v, Operation::Release)) {
                Ok(1) => released += 1,
                Ok(_) => not_held += 1,
                Err(err) => errors.push(err),
            }
        }
        (released, not_held, errors)
    }
}
