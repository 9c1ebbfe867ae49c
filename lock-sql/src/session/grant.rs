//! Granting in session mode: the try on a pooled session, the server-side
//! wait on a pinned one, and the kill of a session whose wait was
//! abandoned.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use lock_core::{
    ErrorKind, FencingToken, Lease, LockError, LockKey, Operation, OwnerId, SessionState, check_ttl,
};
use tokio::time::{Instant, timeout, timeout_at};

use super::conn::{Granted, ServerKey};
use super::{Held, SqlSessionBackend, is_broken};

impl SqlSessionBackend {
    /// One grant: a try, then (for `acquire`) one server-side wait until
    /// `wait_until`.
    pub(super) async fn grant_session(
        &self,
        key: &LockKey,
        ttl: Duration,
        wait_until: Option<Instant>,
        operation: Operation,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(ttl, self.min_ttl(), operation)
            .map_err(|e| e.with_key(key).with_backend(self.inner.name))?;
        let op_timeout = self.inner.config.op_timeout;
        let now = Instant::now();
        let conn_until = wait_until.unwrap_or(now).max(now + op_timeout);
        let owner = OwnerId::random();
        let owner_hex = owner.hex();
        let owner_hex = owner_hex.as_str();
        let server_key = ServerKey::of(
            self.inner.config.dialect,
            &self.inner.config.table,
            key.as_str(),
        );
        let key_bytes = key.as_str().as_bytes();
        let sql = &self.inner.sql;

        // The try. A pooled connection found broken is replaced once: its
        // session (and anything it held) is gone on the server already.
        let mut pinned = self
            .checkout(conn_until)
            .await
            .map_err(|e| e.with_key(key))?;
        let mut sent_at;
        let mut first = true;
        let granted = loop {
            sent_at = Instant::now();
            let attempt = timeout(
                op_timeout,
                pinned
                    .session
                    .grant(sql, key_bytes, &server_key, owner_hex, ttl, None),
            )
            .await;
            match attempt {
                Ok(Ok(granted)) => break granted,
                Ok(Err(e)) if first && is_broken(&e) && !pinned.session.fresh => {
                    first = false;
                    pinned.session = self
                        .open_session(conn_until)
                        .await
                        .map_err(|e| e.with_key(key))?;
                }
                // The connection is in an unknown state: dropped (closed),
                // never returned to the idle list.
                Ok(Err(e)) => return Err(self.err(operation, key, e)),
                Err(_) => {
                    return Err(LockError::new(
                        ErrorKind::Timeout,
                        operation,
                        "the grant did not answer within the operation timeout (its session was closed)",
                    )
                    .with_key(key)
                    .with_backend(self.inner.name));
                }
            }
        };
        let token = match granted {
            Granted::Token(token) => token,
            Granted::Held => {
                let Some(until) = wait_until.filter(|until| Instant::now() < *until) else {
                    self.checkin(pinned);
                    return Ok(None);
                };
                // Wait on the server, on this connection. If this future is
                // dropped meanwhile, the session is closed and, in the
                // background, killed from another connection (the server
                // may not notice the closed socket while it waits).
                let remaining = until.saturating_duration_since(Instant::now());
                let mut kill = KillOnDrop {
                    backend: Some(self.clone()),
                    victim: pinned.session.id,
                    owner: owner_hex.to_owned(),
                };
                sent_at = Instant::now();
                let waited = timeout(
                    remaining + op_timeout,
                    pinned.session.grant(
                        sql,
                        key_bytes,
                        &server_key,
                        owner_hex,
                        ttl,
                        Some(remaining),
                    ),
                )
                .await;
                match waited {
                    Ok(Ok(granted)) => {
                        kill.backend = None;
                        match granted {
                            Granted::Token(token) => token,
                            Granted::Held => {
                                self.checkin(pinned);
                                return Ok(None);
                            }
                        }
                    }
                    Ok(Err(e)) => {
                        if is_broken(&e) {
                            kill.backend = None;
                        }
                        return Err(self.err(operation, key, e));
                    }
                    Err(_) => {
                        return Err(LockError::new(
                            ErrorKind::Timeout,
                            operation,
                            "the server-side wait did not end by the deadline (its session was killed)",
                        )
                        .with_key(key)
                        .with_backend(self.inner.name));
                    }
                }
            }
        };
        // After a long server-side wait, the send time of the wait says
        // little: confirm with one keep-alive and date the lease from it.
        if sent_at.elapsed() > ttl / 3 {
            sent_at = Instant::now();
            match timeout(op_timeout, pinned.session.holds(sql, &server_key)).await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    return Err(LockError::new(
                        ErrorKind::LeaseLost,
                        operation,
                        "the session lost the lock right after the grant",
                    )
                    .with_key(key)
                    .with_backend(self.inner.name));
                }
                Ok(Err(e)) => return Err(self.err(operation, key, e)),
                Err(_) => {
                    return Err(LockError::new(
                        ErrorKind::Timeout,
                        operation,
                        "the grant could not be confirmed within the operation timeout",
                    )
                    .with_key(key)
                    .with_backend(self.inner.name));
                }
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
                    self.checkin(pinned);
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
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(owner, held);
        Ok(Some(lease.with_session(rx)))
    }
}

/// Kills a session from another connection when a server-side wait on it
/// is abandoned (the future dropped, or our own timeout): closing the
/// socket alone may go unnoticed by a server blocked in a lock wait, which
/// would then take the lock for nobody until it tries to answer.
struct KillOnDrop {
    backend: Option<SqlSessionBackend>,
    victim: i64,
    /// The waiting grant's owner (hex): the session is ended only while it
    /// still waits for this owner.
    owner: String,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let Some(backend) = self.backend.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let victim = self.victim;
        let owner = std::mem::take(&mut self.owner);
        runtime.spawn(async move {
            let until = Instant::now() + backend.inner.config.op_timeout;
            // Outside the permits: this must not wait behind held locks.
            let reused = backend
                .inner
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            let session = match reused {
                Some(session) if !session.maybe_expired() => Some(session),
                _ => backend.open_session(until).await.ok(),
            };
            if let Some(mut session) = session {
                let killed = timeout_at(until, session.kill(victim, &owner)).await;
                if matches!(killed, Ok(Ok(()))) {
                    session.idle_since = Instant::now();
                    let mut idle = backend
                        .inner
                        .idle
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    if idle.len() < backend.inner.pool_size {
                        idle.push(session);
                    }
                }
            }
        });
    }
}
