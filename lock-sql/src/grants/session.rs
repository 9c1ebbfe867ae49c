//! Granting in session mode: the try on a pooled session, the server-side
//! wait on a pinned one, and the kill of a session whose wait was
//! abandoned.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    ErrorKind, FencingToken, GrantRequest, HolderDetails, Lease, LockError, LockInfo, LockKey,
    Operation, OwnerId, RandomKeys, SessionState, check_ttl,
};
use tokio::time::{Instant, timeout, timeout_at};

use crate::connection::session::{Pinned, Sessions, is_broken};
use crate::dialect::SessionHolder;
use crate::dialect::session::{Granted, ServerKey, SessionGrant, SessionLock};
use crate::grants::MutexOnly;

/// A held lock and its pinned session (whose channel its guard watches).
pub(crate) struct Held {
    pub(crate) key: LockKey,
    pub(crate) token: FencingToken,
    pub(crate) server_key: ServerKey,
    pub(crate) session: tokio::sync::Mutex<Option<Pinned>>,
}

/// Held locks by owner id (random, this backend's own: hashed by
/// folding).
#[derive(Default)]
pub(crate) struct HeldLocks(Mutex<HashMap<OwnerId, Arc<Held>, RandomKeys>>);

impl HeldLocks {
    fn insert(&self, owner: OwnerId, held: Arc<Held>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(owner, held);
    }

    /// How many locks are held.
    pub(crate) fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    pub(crate) fn find(&self, lease: &Lease) -> Option<Arc<Held>> {
        let held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        held.get(&lease.owner())
            .filter(|h| h.key == *lease.key() && h.token == lease.token())
            .cloned()
    }

    pub(crate) fn forget(&self, lease: &Lease) -> Option<Arc<Held>> {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // One lookup: the entry is removed only when it is this grant.
        match held.entry(lease.owner()) {
            Entry::Occupied(found)
                if found.get().key == *lease.key() && found.get().token == lease.token() =>
            {
                Some(found.remove())
            }
            _ => None,
        }
    }
}

/// A session holder as `inspect` reports it.
pub(crate) fn holder_info(key: LockKey, holder: SessionHolder) -> LockInfo {
    LockInfo {
        details: holder.details.as_deref().and_then(HolderDetails::decode),
        key,
        holder: holder
            .owner
            .unwrap_or_else(|| format!("server session {}", holder.session)),
        token: holder.token.map(FencingToken::new),
        // The server frees it when the session ends, not at a time.
        remaining_ttl: None,
    }
}

/// Session mode's grants: the lock lives in the granting session, which
/// stays pinned (in [`HeldLocks`]) until the release.
pub(crate) struct SessionGrants {
    inner: Arc<Sessions>,
    held: Arc<HeldLocks>,
}

#[async_trait]
impl MutexOnly for SessionGrants {
    /// One try, or a wait on the server until the request's deadline.
    async fn take(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let GrantRequest {
            key, ttl, deadline, ..
        } = request;
        let operation = match deadline {
            None => Operation::TryAcquire,
            Some(_) => Operation::Acquire,
        };
        let granted = self.grant_session(key, ttl, deadline, operation).await?;
        if granted.is_none() && deadline.is_some() {
            return Err(self.error(
                ErrorKind::Contended,
                Operation::Acquire,
                key,
                "still held by another session at the wait deadline",
            ));
        }
        Ok(granted)
    }

    /// The key's holder as the server reports it.
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let op_timeout = self.inner.config.op_timeout;
        let mut pinned = self
            .inner
            .checkout(Instant::now() + op_timeout)
            .await
            .map_err(|e| e.with_key(key).with_backend(self.inner.name))?;
        let server_key = self.inner.server_key(key);
        let (dialect, on) = pinned.session.on(&self.inner.sql);
        let found = timeout(
            op_timeout,
            dialect.session_inspect(
                on,
                SessionLock {
                    key: key.as_str().as_bytes(),
                    server_key: &server_key,
                },
            ),
        )
        .await;
        let late = "inspect did not answer within the operation timeout";
        let found = self.answer(Operation::Inspect, key, found, late)?;
        self.inner.checkin(pinned);
        Ok(found.map(|holder| holder_info(key.clone(), holder)))
    }
}

impl SessionGrants {
    /// What a statement run under the operation timeout answered: its
    /// value, its error, or a Timeout error saying `late`.
    fn answer<T>(
        &self,
        operation: Operation,
        key: &LockKey,
        answer: Result<Result<T, sqlx::Error>, tokio::time::error::Elapsed>,
        late: &str,
    ) -> Result<T, LockError> {
        match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.inner.err(operation, key, e)),
            Err(_) => Err(self.error(ErrorKind::Timeout, operation, key, late)),
        }
    }

    /// A `kind` error of `operation` on `key`, from this backend.
    fn error(
        &self,
        kind: ErrorKind,
        operation: Operation,
        key: &LockKey,
        message: &str,
    ) -> LockError {
        LockError::new(kind, operation, message)
            .with_key(key)
            .with_backend(self.inner.name)
    }

    pub(crate) fn new(inner: Arc<Sessions>, held: Arc<HeldLocks>) -> Self {
        Self { inner, held }
    }

    /// The release on the lock's own session, which then goes back to the
    /// idle list.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(held) = self.held.forget(lease) else {
            return Ok(false);
        };
        // No signal on the session's channel: the session lives on (its
        // guard deregistered before releasing).
        let mut slot = held.session.lock().await;
        // Taken out: if this future is dropped, the connection is closed
        // with it and the server frees the lock.
        let Some(mut pinned) = slot.take() else {
            return Ok(false);
        };
        drop(slot);
        let released = timeout(
            self.inner.config.op_timeout,
            pinned.session.release(&self.inner.sql, &held.server_key),
        )
        .await;
        match released {
            Ok(Ok(true)) => {
                self.inner.checkin(pinned);
                Ok(true)
            }
            // Not ours any more (someone ran pg_advisory_unlock_all?): the
            // session's state is unclear, close it.
            Ok(Ok(false)) => Ok(false),
            // The session is gone, and its lock with it.
            Ok(Err(e)) if is_broken(&e) => Ok(false),
            Ok(Err(e)) => Err(self.inner.err(Operation::Release, lease.key(), e)),
            Err(_) => Err(self.error(
                ErrorKind::Timeout,
                Operation::Release,
                lease.key(),
                "the release did not answer within the operation timeout; its session was \
                 closed, so the server frees the lock when it notices (at the latest after the TTL)",
            )),
        }
    }

    /// One grant: a try, then (for `acquire`) one server-side wait until
    /// `wait_until`.
    async fn grant_session(
        &self,
        key: &LockKey,
        ttl: Duration,
        wait_until: Option<Instant>,
        operation: Operation,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(ttl, self.inner.min_ttl(), operation)
            .map_err(|e| e.with_key(key).with_backend(self.inner.name))?;
        let op_timeout = self.inner.config.op_timeout;
        let now = Instant::now();
        let conn_until = wait_until.unwrap_or(now).max(now + op_timeout);
        let owner = OwnerId::random();
        let owner_hex = owner.hex();
        let owner_hex = owner_hex.as_str();
        let server_key = self.inner.server_key(key);
        let try_once = SessionGrant {
            lock: SessionLock {
                key: key.as_str().as_bytes(),
                server_key: &server_key,
            },
            owner: owner_hex,
            ttl,
            wait: None,
        };
        let sql = &self.inner.sql;

        // The try. A pooled connection found broken is replaced once: its
        // session (and anything it held) is gone on the server already.
        let mut pinned = self
            .inner
            .checkout(conn_until)
            .await
            .map_err(|e| e.with_key(key))?;
        let mut sent_at;
        let mut first = true;
        let granted = loop {
            sent_at = Instant::now();
            let attempt = timeout(op_timeout, pinned.session.grant(sql, &try_once)).await;
            match attempt {
                Ok(Ok(granted)) => break granted,
                Ok(Err(e)) if first && is_broken(&e) && !pinned.session.fresh => {
                    first = false;
                    pinned.session = self
                        .inner
                        .open_session(conn_until)
                        .await
                        .map_err(|e| e.with_key(key))?;
                }
                // The connection is in an unknown state: dropped (closed),
                // never returned to the idle list.
                Ok(Err(e)) => return Err(self.inner.err(operation, key, e)),
                Err(_) => {
                    return Err(self.error(
                        ErrorKind::Timeout,
                        operation,
                        key,
                        "the grant did not answer within the operation timeout (its session was closed)",
                    ));
                }
            }
        };
        let token = match granted {
            Granted::Token(token) => token,
            Granted::Held => {
                let Some(until) = wait_until.filter(|until| Instant::now() < *until) else {
                    self.inner.checkin(pinned);
                    return Ok(None);
                };
                // Wait on the server, on this connection. If this future is
                // dropped meanwhile, the session is closed and, in the
                // background, killed from another connection (the server
                // may not notice the closed socket while it waits).
                let remaining = until.saturating_duration_since(Instant::now());
                let mut kill = KillOnDrop {
                    sessions: Some(Arc::clone(&self.inner)),
                    victim: pinned.session.id,
                    owner: owner_hex.to_owned(),
                };
                sent_at = Instant::now();
                let waited = timeout(
                    remaining + op_timeout,
                    pinned.session.grant(
                        sql,
                        &SessionGrant {
                            wait: Some(remaining),
                            ..try_once
                        },
                    ),
                )
                .await;
                match waited {
                    Ok(Ok(granted)) => {
                        kill.sessions = None;
                        match granted {
                            Granted::Token(token) => token,
                            Granted::Held => {
                                self.inner.checkin(pinned);
                                return Ok(None);
                            }
                        }
                    }
                    Ok(Err(e)) => {
                        if is_broken(&e) {
                            kill.sessions = None;
                        }
                        return Err(self.inner.err(operation, key, e));
                    }
                    Err(_) => {
                        return Err(self.error(
                            ErrorKind::Timeout,
                            operation,
                            key,
                            "the server-side wait did not end by the deadline (its session was killed)",
                        ));
                    }
                }
            }
        };
        // After a long server-side wait, the send time of the wait says
        // little: confirm with one keep-alive and date the lease from it.
        if sent_at.elapsed() > ttl / 3 {
            sent_at = Instant::now();
            let held = timeout(op_timeout, pinned.session.holds(sql, &server_key)).await;
            let late = "the grant could not be confirmed within the operation timeout";
            if !self.answer(operation, key, held, late)? {
                return Err(self.error(
                    ErrorKind::LeaseLost,
                    operation,
                    key,
                    "the session lost the lock right after the grant",
                ));
            }
        }
        let token = FencingToken::new(token);
        let lease = match Lease::granted(key.clone(), owner, token, ttl, sent_at, String::new()) {
            Ok(lease) => lease,
            Err(err) => {
                // Too late to be of use: give it back (or close it).
                if let Ok(Ok(true)) =
                    timeout(op_timeout, pinned.session.release(sql, &server_key)).await
                {
                    self.inner.checkin(pinned);
                }
                return Err(err.with_backend(self.inner.name));
            }
        };
        // The session's own channel (see `Session::state`): a grant on a
        // session that is still open starts `Alive` (it always is: a
        // session found lost is closed, not pooled). Sent only on a change:
        // a send wakes whoever watches the channel.
        pinned.session.state.send_if_modified(|state| {
            let changed = *state != SessionState::Alive;
            *state = SessionState::Alive;
            changed
        });
        let rx = pinned.session.state.subscribe();
        let held = Arc::new(Held {
            key: key.clone(),
            token,
            server_key,
            session: tokio::sync::Mutex::new(Some(pinned)),
        });
        self.held.insert(owner, held);
        Ok(Some(lease.with_session(rx)))
    }
}

/// Kills a session from another connection when a server-side wait on it
/// is abandoned (the future dropped, or our own timeout): closing the
/// socket alone may go unnoticed by a server blocked in a lock wait, which
/// would then take the lock for nobody until it tries to answer.
struct KillOnDrop {
    sessions: Option<Arc<Sessions>>,
    victim: i64,
    /// The waiting grant's owner (hex): the session is ended only while it
    /// still waits for this owner.
    owner: String,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let Some(sessions) = self.sessions.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let victim = self.victim;
        let owner = std::mem::take(&mut self.owner);
        runtime.spawn(async move {
            let until = Instant::now() + sessions.config.op_timeout;
            // Outside the permits: this must not wait behind held locks.
            let session = match sessions.take_idle() {
                Some(session) if !session.maybe_expired() => Some(session),
                _ => sessions.open_session(until).await.ok(),
            };
            if let Some(mut session) = session {
                let killed = timeout_at(until, session.kill(victim, &owner)).await;
                if matches!(killed, Ok(Ok(()))) {
                    sessions.put_idle(session);
                }
            }
        });
    }
}
