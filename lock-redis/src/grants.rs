//! Grants: the try-once mutex grant on every node (a majority for
//! Redlock), its `WAIT` for replicas, the release, and the holder `inspect`
//! reports; the undo of grants whose outcome was not seen (`undo.rs`).

pub(crate) mod attempt;
pub(crate) mod holders;
pub(crate) mod undo;

use std::sync::Arc;
use std::time::Duration;

use lock_core::{ErrorKind, FencingToken, Lease, LockError, LockInfo, LockKey, Operation, OwnerId};
use redis::Value;
use tokio::time::Instant;

use crate::config::MIN_TTL;
use crate::connection::{Conn, Lane, Node, ScriptCall, Servers};
use crate::error::NAME;
use crate::keys::names::KeyNames;
use crate::keys::replies::{NodeGrant, parse_grant, pttl, ttl_ms};
use attempt::{Attempt, granted};
use undo::{PendingGrant, Traces, Withdraw, release_everywhere};

/// `ttl` checked against [`MIN_TTL`] and the longest TTL, the error naming
/// this backend and `key`.
pub(crate) fn check_ttl(ttl: Duration, op: Operation, key: &LockKey) -> Result<(), LockError> {
    lock_core::check_ttl(ttl, MIN_TTL, op).map_err(|e| e.with_backend(NAME).with_key(key))
}

/// The ARGV (and the optional floor key) of one acquire call.
struct GrantArgs<'a> {
    owner: &'a str,
    ttl_ms: &'a str,
    details: &'a str,
    floor: Option<&'a str>,
}

impl GrantArgs<'_> {
    /// The acquire script's keys under `names` (the floor key last, where
    /// `gc` keeps one) and its ARGV. `ttl_ms` comes from [`ttl_ms`];
    /// `details` is
    /// [`HolderDetails::encode_current`](lock_core::HolderDetails::encode_current).
    fn script_texts<'n>(&'n self, names: &'n KeyNames) -> ([&'n str; 4], usize, [&'n str; 3]) {
        let keys = [
            names.lock.as_str(),
            names.counter.as_str(),
            names.holder.as_str(),
            self.floor.unwrap_or_default(),
        ];
        let count = if self.floor.is_some() { 4 } else { 3 };
        (keys, count, [self.owner, self.ttl_ms, self.details])
    }
}

/// The mutex's grants, releases and holders, and the grant machinery the
/// other components share (`run_grant`, the replicas' check, the withdraw
/// guard).
#[derive(Clone)]
pub(crate) struct Grants {
    servers: Arc<Servers>,
}

impl Grants {
    pub(crate) fn new(servers: Arc<Servers>) -> Self {
        Self { servers }
    }

    pub(crate) fn servers(&self) -> &Arc<Servers> {
        &self.servers
    }

    /// A single try of the (unfair) mutex: one round trip per node.
    pub(crate) async fn try_take(
        &self,
        key: &LockKey,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        let op = Operation::TryAcquire;
        check_ttl(ttl, op, key)?;
        match self.attempt(key, ttl, op, self.servers.timeout()).await? {
            Attempt::Granted(lease) => Ok(Some(lease)),
            Attempt::Held { .. } => Ok(None),
        }
    }

    /// The mutex's release: compare-and-delete on every node; `true` when
    /// a majority (Redlock: any node, with no error) released it.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let servers = &self.servers;
        let names = servers
            .keys
            .release_names(lease.key(), Operation::Release)?;
        let owner_value = servers.keys.owner_value(lease.owner());
        // Read once: each read of a native value checks its digits again.
        let owner: &str = &owner_value;
        // The grant's lane: after a renewal of it or an undo, as on one
        // connection (any lane would do: the grant's answer was seen).
        let lane = Lane::of(owner);
        let (released, _not_held, errors) =
            release_everywhere(servers, names.keys(), owner, servers.timeout(), lane).await;
        let quorum = servers.quorum;
        if released >= quorum || (servers.redlock && released > 0 && errors.is_empty()) {
            return Ok(true);
        }
        if released + errors.len() >= quorum && !errors.is_empty() {
            // Whether a majority held it is unknown: report the error; the
            // lease expires with its TTL where the release did not arrive.
            let err = errors.into_iter().next().unwrap_or_else(|| {
                LockError::new(ErrorKind::Unavailable, Operation::Release, "no answer")
            });
            return Err(err.with_key(lease.key()));
        }
        Ok(false)
    }

    /// The mutex's holder, as a majority of nodes report it.
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        Ok(holders::inspect_nodes(&self.servers, key).await?.0)
    }

    /// One acquire attempt of the mutex on every node (see the crate docs:
    /// a majority for Redlock, whose partial grants are undone at once).
    pub(crate) async fn attempt(
        &self,
        key: &LockKey,
        ttl: Duration,
        op: Operation,
        timeout: Duration,
    ) -> Result<Attempt, LockError> {
        let servers = &self.servers;
        let names = servers.keys.mutex(key, op)?;
        let owner = OwnerId::random();
        let owner_value = servers.keys.owner_value(owner);
        // Read once: each read of a native value checks its digits again.
        let owner_hex: &str = &owner_value;
        let ttl_ms = ttl_ms(ttl);
        let details = lock_core::HolderDetails::encode_current();
        let grant = GrantArgs {
            owner: owner_hex,
            ttl_ms: &ttl_ms,
            details: &details,
            floor: servers.floor.key_for(&names.counter),
        };
        let pending = PendingGrant {
            servers,
            names: &names,
            owner: owner_hex,
            armed: true,
        };
        let (keys, key_count, args) = grant.script_texts(&names);
        // Built once for every node.
        let call = ScriptCall::new(&servers.scripts.acquire, &keys[..key_count], &args);
        let sent_at = Instant::now();
        let per_node = if servers.redlock {
            timeout.min((ttl / 10).max(Duration::from_millis(100)))
        } else {
            timeout
        };
        // Granted nodes and their highest token (Redlock: the highest node
        // counter is a hint, not a safe token).
        let (mut granted_on, mut token) = (0, 0);
        let mut held_pttl: Option<Duration> = None;
        let mut errors = Vec::new();
        let mut acked = None;
        let lane = Lane::of(owner_hex);
        servers
            .each_node(
                |node| {
                    let call = &call;
                    self.run_grant(
                        node,
                        lane,
                        op,
                        per_node,
                        move |mut conn| async move { conn.eval_call(call).await },
                        |value| matches!(parse_grant(value), Ok(NodeGrant::Granted(_))),
                    )
                },
                |result| {
                    let result = result.and_then(|(value, replicas)| {
                        acked = acked.or(replicas);
                        parse_grant(&value)
                    });
                    match result {
                        Ok(NodeGrant::Granted(t)) => {
                            granted_on += 1;
                            token = token.max(t);
                        }
                        Ok(NodeGrant::Held(ms)) => {
                            let left = pttl(ms).unwrap_or(Duration::ZERO);
                            held_pttl = Some(held_pttl.map_or(left, |p| p.min(left)));
                            if ms == -1 {
                                // A foreign holder without TTL: re-check at the interval.
                                held_pttl = Some(servers.config.recheck);
                            }
                        }
                        Err(err) => errors.push(err),
                    }
                },
            )
            .await;
        if granted_on >= servers.quorum {
            if let Err(err) = self.replicas_acked(op, acked) {
                // `pending` releases the grant on drop.
                return Err(err.with_key(key));
            }
            let lease = granted(key, owner, FencingToken::new(token), ttl, sent_at)?;
            pending.disarm();
            return Ok(Attempt::Granted(lease));
        }
        let split = granted_on > 0;
        if granted_on == 0 && errors.is_empty() {
            // Nothing was set anywhere: nothing to undo.
            pending.disarm();
        } else {
            // Undo the partial grant now, on every node (also those whose
            // answer was lost), so no partial lock is left behind.
            let undo = servers.undo_lane(lane);
            // Boxed: the rare path, kept out of the size of every
            // attempt's future (moved whole into the waiting acquire's,
            // and that into the box of `LockBackend::grant`).
            let undo = Box::pin(release_everywhere(
                servers,
                names.release_keys(),
                owner_hex,
                per_node,
                undo,
            ));
            let _ = undo.await;
            pending.disarm();
        }
        if errors.len() > servers.nodes.len() - servers.quorum {
            let err = errors.swap_remove(0);
            let err = if servers.redlock {
                LockError::new(
                    err.kind(),
                    op,
                    format!(
                        "only {} of {} Redlock nodes answered (a majority is needed): {}",
                        servers.nodes.len() - errors.len() - 1,
                        servers.nodes.len(),
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

    /// Runs a grant script (`script`, one request on a handle of `node`'s
    /// connection of `lane`, the grant owner's [`Lane::of`], see
    /// [`Node::run_request_on`]) and, with `replicas=N` configured, when the answer is a grant
    /// (`is_grant`), `WAIT`s for the replicas on the *same* connection
    /// (the same handle) right after it, within the same bounded call. `WAIT` counts the
    /// acknowledgements of the writes of the connection it runs on: sent on
    /// another one (another lane, or the lane's connection re-established
    /// in between, after some other call on it failed or timed out) it
    /// would confirm nothing.
    /// If that connection breaks before `WAIT` answers, the call fails like
    /// a grant whose answer was lost (the caller undoes it). Returns the
    /// script's answer and how many replicas acknowledged it (`None`: no
    /// `WAIT` was sent).
    pub(crate) async fn run_grant<F, Fut>(
        &self,
        node: &Node,
        lane: Lane,
        op: Operation,
        timeout: Duration,
        script: F,
        is_grant: impl FnOnce(&Value) -> bool,
    ) -> Result<(Value, Option<i64>), LockError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<Value>>,
    {
        let config = &self.servers.config;
        let wanted = config.wait_replicas;
        if wanted == 0 {
            // No replicas to wait for: the script alone, one request, on
            // the handle the node lends (no second handle, no `WAIT`).
            return node
                .run_request_on(lane, op, timeout, |conn| async move {
                    Ok((script(conn).await?, None))
                })
                .await;
        }
        let wait_ms = config.wait_timeout.as_millis().to_string();
        // `WAIT` blocks up to its own timeout on the server.
        let bound = timeout.saturating_add(config.wait_timeout * 2);
        // Boxed: a call of two requests, larger than the one request
        // above, would make every grant's future as large as its own.
        #[cfg(test)]
        if self.servers.unpinned.wait() {
            // The tests' broken variant: `WAIT` on the next lane's
            // connection instead of the grant's.
            let value = node.run_on(lane, op, bound, script).await?;
            if !is_grant(&value) {
                return Ok((value, None));
            }
            let acked = node
                .run_on(lane.next(), op, bound, |mut conn| async move {
                    conn.query::<i64>(redis::cmd("WAIT").arg(wanted).arg(&wait_ms))
                        .await
                })
                .await?;
            return Ok((value, Some(acked)));
        }
        Box::pin(node.run_on(lane, op, bound, |mut conn| async move {
            // A clone of the handle: the same server connection.
            let value = script(conn.clone()).await?;
            if !is_grant(&value) {
                return Ok((value, None));
            }
            let acked = conn
                .query::<i64>(redis::cmd("WAIT").arg(wanted).arg(&wait_ms))
                .await?;
            Ok((value, Some(acked)))
        }))
        .await
    }

    /// Whether a grant's `WAIT` (see [`run_grant`](Self::run_grant)) was
    /// acknowledged by the configured number of replicas; always with none
    /// configured.
    pub(crate) fn replicas_acked(
        &self,
        op: Operation,
        acked: Option<i64>,
    ) -> Result<(), LockError> {
        let wanted = self.servers.config.wait_replicas;
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
    pub(crate) async fn confirm_one_server_grant<N: Traces>(
        &self,
        names: &N,
        owner_hex: &str,
        op: Operation,
        acked: Option<i64>,
        key: &LockKey,
    ) -> Result<(), LockError> {
        if let Err(err) = self.replicas_acked(op, acked) {
            let _ = names.abandon(&self.servers, owner_hex).await;
            return Err(err.with_key(key));
        }
        Ok(())
    }

    /// A guard that withdraws `owner`'s traces under `names` unless disarmed.
    pub(crate) fn withdraw_guard<N: Traces>(&self, names: &N, owner: OwnerId) -> Withdraw<N> {
        Withdraw {
            servers: self.servers.clone(),
            names: names.clone(),
            owner: owner.to_hex(),
            armed: true,
        }
    }
}
