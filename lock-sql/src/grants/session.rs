//! Granting in session mode: the local table of held keys, the try on a
//! session of the set, the server-side wait on a session of its own (or,
//! when none is free, polling), the release on the lock's own session, and
//! the kill of a session whose wait was abandoned.
//!
//! # One grant of a key per backend
//!
//! PostgreSQL advisory locks and MySQL/MariaDB `GET_LOCK` locks are
//! re-entrant per session: a second grant of a key the session holds
//! succeeds. Since many grants share a session, a backend keeps a table of
//! the server locks it holds or is taking, and a second grant of one of
//! them waits here (or, for a try, fails at once with no round trip)
//! until the first is released: two guards of one backend never both hold
//! a key.
//!
//! # Lazy holder rows (MariaDB)
//!
//! A MariaDB grant takes the lock and its token only (`GET_LOCK` and
//! `UUID_SHORT()`, one statement); the holder row that `inspect`, `list` and
//! `force_release` read (`<table>_session_holders`, a `MEMORY` table) is
//! written later, off the caller's path, once the grant has been held for
//! `publish_delay` (10 ms by default): a lock released sooner never writes
//! one. The grant is queued for the backend's publisher task (one per
//! backend, the queue in due order), which then spawns, for a grant still
//! held, the publication. It writes the row on the
//! lock's own session, under the session's mutex, and only if this
//! backend still holds that grant (checked under the mutex) and the
//! session still holds the lock (`WHERE IS_USED_LOCK(..) =
//! CONNECTION_ID()`); the grant is then marked published, and its release,
//! under the same mutex, deletes the row after `RELEASE_LOCK`. A release
//! and a publication of one grant are therefore never interleaved: either
//! the release comes first (nothing is written) or the publication (the
//! release deletes the row). A session that dies leaves rows naming a
//! connection that holds nothing, which every reader ignores (connection
//! ids are not reused while the server runs). Until its row is written a
//! lock shows as held by its server session without owner or token, and
//! `force_release` refuses it; `inspect` that finds a lock so waits
//! `publish_delay` (and 50 ms more) and reads again, four times at most.
//!
//! # Published grants (PostgreSQL)
//!
//! A grant on a session that holds no other lock of ours publishes its
//! owner and token in the session's `application_name`, which `inspect`
//! and `force_release` read. A session holds one `application_name`, so a
//! grant on a session that already holds locks publishes no owner, and a
//! release that leaves locks publishes `distlock-multi`: `inspect` then
//! shows the holding session without owner or token, and `force_release`
//! refuses to end it (it holds other locks).
//!
//! Setting `application_name` costs the server a `ParameterStatus` message
//! and an update of `pg_stat_activity` per statement (about a tenth of a
//! short cycle's server time), so, as MariaDB's holder rows, the common
//! grant publishes lazily: a try on an armed session that holds nothing
//! else and shows the idle marker sends the quiet grant (the lock and its
//! token only), and a task publishes it once it has been held for
//! `publish_delay`, on its own session under the session's mutex, only if
//! this backend still holds that grant and the session holds no other lock
//! of ours. The release of a session's last lock resets `application_name`
//! only when the session published something ([`Session::published`],
//! set before any statement that may publish); otherwise it is the bare
//! unlock. Until published, a lock shows as held by its server session
//! with the idle marker, without owner or token: `inspect` reads it again
//! after `publish_delay` (as on MariaDB), and `force_release` waits that
//! long before reading.
//!
//! [`Session::published`]: crate::connection::session::Session::published

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    ErrorKind, FencingToken, GrantRequest, HolderDetails, Lease, LockError, LockInfo, LockKey,
    Operation, OwnerId, check_ttl,
};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep, sleep_until, timeout, timeout_at};

use crate::config::SqlDialect;
use crate::connection::session::{Conn, ConnUse, Session, Sessions, closed_session, is_broken};
use crate::dialect::SessionHolder;
use crate::dialect::session::{
    Granted, OwnedGrant, Publication, ServerKey, SessionGrant, SessionLock,
};
use crate::grants::MutexOnly;

/// A held lock: its grant and the session that holds it (whose channel
/// its guard watches). The key is the lease's; its server lock is
/// computed again from it when needed, so a held lock costs its entry in
/// [`HeldLocks`] and little more.
#[derive(Clone)]
pub(crate) struct Held {
    pub(crate) owner: OwnerId,
    pub(crate) token: FencingToken,
    pub(crate) conn: Arc<Conn>,
    /// MariaDB: its holder row was written (see "Lazy holder rows"), so
    /// its release deletes it. Set and read under the session's mutex.
    published: Arc<AtomicBool>,
}

impl Held {
    fn is(&self, owner: OwnerId, token: FencingToken) -> bool {
        self.owner == owner && self.token == token
    }
}

/// A server lock this backend holds or is taking, and whether local
/// grants wait for it.
struct KeyEntry {
    /// Created by the first local waiter; told at the release.
    freed: Option<Arc<Notify>>,
    /// `None` while the grant is being taken.
    held: Option<Held>,
}

impl KeyEntry {
    fn freed(self) {
        if let Some(freed) = self.freed {
            freed.notify_waiters();
        }
    }
}

#[derive(Default)]
struct Tables {
    /// The server locks held or being taken, by [`ServerKey::id`] (see the
    /// module docs).
    keys: HashMap<u128, KeyEntry>,
    /// Grants of a server lock held already, when the local exclusion is
    /// off (the broken variant of the re-entrancy test only).
    doubles: Vec<(u128, Held)>,
}

/// The server locks this backend holds or is taking, with their grants.
pub(crate) struct HeldLocks {
    tables: Mutex<Tables>,
    /// Whether a second grant of a held server lock waits here (always, but
    /// for the broken variant of the re-entrancy test).
    exclusion: AtomicBool,
    /// Whether a deferred publication checks that its grant is still held
    /// (always, but for the broken variant of the publication race test).
    publication_check: AtomicBool,
}

impl Default for HeldLocks {
    fn default() -> Self {
        Self {
            tables: Mutex::new(Tables::default()),
            exclusion: AtomicBool::new(true),
            publication_check: AtomicBool::new(true),
        }
    }
}

/// The right to take a server lock on this backend (see the module docs);
/// dropped unused, it frees the key for the next local grant.
struct Reservation {
    locks: Arc<HeldLocks>,
    /// `None` once used (or when the local exclusion is off).
    id: Option<u128>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let removed = self.locks.lock().keys.remove(&id);
            if let Some(entry) = removed {
                entry.freed();
            }
        }
    }
}

impl HeldLocks {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Turns the local table of held keys off or on (see
    /// [`SqlSessionBackend::set_local_exclusion`](crate::SqlSessionBackend::set_local_exclusion)).
    pub(crate) fn set_exclusion(&self, on: bool) {
        self.exclusion.store(on, Ordering::Release);
    }

    /// Turns the checks before a deferred publication off or on: that its
    /// grant is still held and, on PostgreSQL, alone on its session (off:
    /// the broken variants of the publication race tests only).
    pub(crate) fn set_publication_check(&self, on: bool) {
        self.publication_check.store(on, Ordering::Release);
    }

    /// Whether grant `owner`/`token` of server lock `id` is still held
    /// (always `true` with the publication check off).
    fn still_held(&self, id: u128, owner: OwnerId, token: FencingToken) -> bool {
        !self.publication_check.load(Ordering::Acquire)
            || self.find_grant(id, owner, token).is_some()
    }

    /// PostgreSQL: whether a publication may name its grant on a session
    /// holding `held` locks of ours: only when it holds that one lock
    /// (always with the publication check off).
    fn alone(&self, held: usize) -> bool {
        !self.publication_check.load(Ordering::Acquire) || held <= 1
    }

    /// Reserves server lock `id`, or says what to wait on while this
    /// backend holds it or is taking it. A lock held on a session that has
    /// closed is freed.
    fn reserve(self: &Arc<Self>, id: u128) -> Result<Reservation, Arc<Notify>> {
        let exclusion = self.exclusion.load(Ordering::Acquire);
        let mut tables = self.lock();
        if let Some(entry) = tables.keys.get_mut(&id) {
            let dead = entry.held.as_ref().is_some_and(|h| h.conn.is_dead());
            if !dead && exclusion {
                return Err(Arc::clone(
                    entry.freed.get_or_insert_with(|| Arc::new(Notify::new())),
                ));
            }
            if dead && let Some(entry) = tables.keys.remove(&id) {
                entry.freed();
            }
        }
        if tables.keys.contains_key(&id) {
            // Exclusion off and held: a double grant, recorded apart.
            return Ok(Reservation {
                locks: Arc::clone(self),
                id: None,
            });
        }
        tables.keys.insert(
            id,
            KeyEntry {
                freed: None,
                held: None,
            },
        );
        Ok(Reservation {
            locks: Arc::clone(self),
            id: Some(id),
        })
    }

    /// Records a grant of server lock `id` made under `reservation`.
    fn insert(&self, id: u128, held: Held, mut reservation: Reservation) {
        let mut tables = self.lock();
        match reservation.id.take() {
            Some(reserved) => {
                if let Some(entry) = tables.keys.get_mut(&reserved) {
                    entry.held = Some(held);
                }
            }
            None => tables.doubles.push((id, held)),
        }
    }

    /// How many locks are held (on sessions still open).
    pub(crate) fn len(&self) -> usize {
        let tables = self.lock();
        let alive = |h: &Held| !h.conn.is_dead();
        tables
            .keys
            .values()
            .filter_map(|e| e.held.as_ref())
            .filter(|h| alive(h))
            .count()
            + tables.doubles.iter().filter(|(_, h)| alive(h)).count()
    }

    /// The grant of `lease`, whose server lock is `id`.
    pub(crate) fn find(&self, id: u128, lease: &Lease) -> Option<Held> {
        self.find_grant(id, lease.owner(), lease.token())
    }

    /// The held grant `owner`/`token` of server lock `id`, if still held.
    fn find_grant(&self, id: u128, owner: OwnerId, token: FencingToken) -> Option<Held> {
        let tables = self.lock();
        tables
            .keys
            .get(&id)
            .and_then(|e| e.held.as_ref())
            .filter(|h| h.is(owner, token))
            .or_else(|| {
                tables
                    .doubles
                    .iter()
                    .find(|(i, h)| *i == id && h.is(owner, token))
                    .map(|(_, h)| h)
            })
            .cloned()
    }

    /// Forgets `held`, the grant of server lock `id` (released, or lost),
    /// and frees its key for the next local grant.
    pub(crate) fn forget(&self, id: u128, held: &Held) {
        let mut tables = self.lock();
        let ours = tables
            .keys
            .get(&id)
            .and_then(|e| e.held.as_ref())
            .is_some_and(|h| h.is(held.owner, held.token));
        if ours {
            if let Some(entry) = tables.keys.remove(&id) {
                entry.freed();
            }
        } else {
            tables
                .doubles
                .retain(|(i, h)| !(*i == id && h.is(held.owner, held.token)));
        }
    }

    /// Whether a grant of ours holds server lock `id` on `conn`.
    pub(crate) fn held_on(&self, conn: &Arc<Conn>, id: u128) -> bool {
        let tables = self.lock();
        let here = |h: &Held| Arc::ptr_eq(&h.conn, conn);
        tables
            .keys
            .get(&id)
            .and_then(|e| e.held.as_ref())
            .is_some_and(here)
            || tables.doubles.iter().any(|(i, h)| *i == id && here(h))
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
/// [`HeldLocks`] records until the release.
pub(crate) struct SessionGrants {
    inner: Arc<Sessions>,
    held: Arc<HeldLocks>,
    publisher: Arc<Publisher>,
}

impl Drop for SessionGrants {
    fn drop(&mut self) {
        let task = self
            .publisher
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            task.abort();
        }
    }
}

#[async_trait]
impl MutexOnly for SessionGrants {
    /// One try, or a wait until the request's deadline.
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
        let server_key = self.inner.server_key(key);
        // MariaDB: a lock younger than the publication delay has no row
        // yet (see "Lazy holder rows"): read again after it (four times at
        // most: a loaded machine can delay the publication's task), with
        // no session in use meanwhile (the publication may need it).
        let lag = self.inner.publication_lag();
        let mut waits = if lag.is_some() { 4 } else { 0 };
        loop {
            let used = self
                .inner
                .any(Instant::now() + op_timeout)
                .await
                .map_err(|e| e.with_key(key).with_backend(self.inner.name))?;
            // Run to its end even if this call is dropped (see
            // `connection::session`, "Abandoned statements").
            let inner = Arc::clone(&self.inner);
            let (key_bytes, server_key) = (key.as_str().as_bytes().to_vec(), server_key.clone());
            let armed = used.armed_ttl();
            let statement = self.inner.finish(
                armed,
                used.run(
                    || None,
                    async move |session| {
                        let lock = SessionLock {
                            key: &key_bytes,
                            server_key: &server_key,
                        };
                        Some(session.inspect(&inner.sql, lock).await)
                    },
                ),
            );
            let late = "inspect did not answer within the operation timeout";
            let (mut used, found) = match timeout(op_timeout, statement).await {
                Ok((used, Some(found))) => (used, found),
                Ok((_, None)) => return Err(self.closed(Operation::Inspect, key)),
                Err(_) => {
                    return Err(self.error(ErrorKind::Timeout, Operation::Inspect, key, late));
                }
            };
            let found = self.answer(&mut used, Operation::Inspect, key, Ok(found), late)?;
            if let Some(wait) = lag.filter(|_| waits > 0)
                && found.as_ref().is_some_and(|holder| holder.unpublished)
            {
                waits -= 1;
                drop(used);
                sleep(wait).await;
                continue;
            }
            return Ok(found.map(|holder| holder_info(key.clone(), holder)));
        }
    }
}

/// Records the key of a grant or release as an orphan of its session when
/// dropped armed: the statement was abandoned mid-way (see
/// `connection::session`, "Abandoned statements").
struct Abandon {
    conn: Arc<Conn>,
    key: Option<ServerKey>,
}

impl Abandon {
    fn disarm(&mut self) {
        self.key = None;
    }
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.conn.orphan(key);
        }
    }
}

/// What one try found.
enum Tried {
    Granted(ConnUse, u64, Instant),
    Held,
}

impl SessionGrants {
    /// What a statement run under the operation timeout answered: its
    /// value, its error (a broken session closed), or a Timeout error
    /// saying `late`.
    fn answer<T>(
        &self,
        used: &mut ConnUse,
        operation: Operation,
        key: &LockKey,
        answer: Result<Result<T, sqlx::Error>, tokio::time::error::Elapsed>,
        late: &str,
    ) -> Result<T, LockError> {
        match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if is_broken(&e) {
                    used.close(&self.ended(&e));
                }
                Err(self.inner.err(operation, key, e))
            }
            Err(_) => Err(self.error(ErrorKind::Timeout, operation, key, late)),
        }
    }

    /// The lost reason of a session that broke with `err`.
    fn ended(&self, err: &sqlx::Error) -> String {
        format!(
            "the lock's session ended: {}",
            self.inner.config.scrub(&err.to_string())
        )
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

    fn closed(&self, operation: Operation, key: &LockKey) -> LockError {
        self.error(ErrorKind::Unavailable, operation, key, "the session closed")
    }

    pub(crate) fn new(inner: Arc<Sessions>, held: Arc<HeldLocks>) -> Self {
        Self {
            inner,
            held,
            publisher: Arc::default(),
        }
    }

    /// Releases every orphan of `used`'s session that no grant of ours
    /// holds there.
    async fn clean(&self, used: &mut ConnUse) {
        let conn = Arc::clone(&used.conn);
        used.clean_orphans(&self.inner, |key| self.held.held_on(&conn, key.id()))
            .await;
    }

    /// The release on the lock's own session.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let server_key = self.inner.server_key(lease.key());
        let id = server_key.id();
        let Some(held) = self.held.find(id, lease) else {
            return Ok(false);
        };
        let op_timeout = self.inner.config.op_timeout;
        let used = self
            .inner
            .this(&held.conn, Instant::now() + op_timeout)
            .await;
        let mut used = match used {
            Ok(Some(used)) => used,
            Ok(None) => {
                // The session closed: the server freed the lock with it.
                self.held.forget(id, &held);
                return Ok(false);
            }
            Err(e) => return Err(e.with_key(lease.key()).with_backend(self.inner.name)),
        };
        self.clean(&mut used).await;
        let left = used.conn.held().saturating_sub(1);
        let mut abandon = Abandon {
            conn: Arc::clone(&used.conn),
            key: Some(server_key.clone()),
        };
        if used.session().is_none() {
            abandon.disarm();
            self.held.forget(id, &held);
            return Ok(false);
        }
        // The release, then its holder row if a publication wrote one (see
        // "Lazy holder rows"), under the session's mutex; run to its end
        // even if this call is dropped (see `connection::session`,
        // "Abandoned statements").
        let inner = Arc::clone(&self.inner);
        let published = Arc::clone(&held.published);
        let (key_bytes, token) = (lease.key().as_str().as_bytes().to_vec(), held.token.get());
        let armed = used.armed_ttl();
        let statement = self.inner.finish(armed, async move {
            let released = async move |session: &mut Session| {
                let released = session.release(inner.release_sql(left), &server_key).await;
                if released.is_ok() && published.load(Ordering::Acquire) {
                    let withdrawn = session.withdraw(&inner.sql, &key_bytes, token).await;
                    if withdrawn.is_err() {
                        tracing::warn!("could not delete a released lock's holder row");
                    }
                }
                released
            };
            let (used, released) = used.run(|| Ok(false), released).await;
            // The grant is over whatever the answer: released, or gone
            // with its session.
            used.remove_held();
            (used, released)
        });
        let finished = timeout(op_timeout, statement).await;
        self.held.forget(id, &held);
        let Ok((mut used, released)) = finished else {
            // Left as an orphan, which the session's next call releases.
            return Err(self.error(
                ErrorKind::Timeout,
                Operation::Release,
                lease.key(),
                "the release did not answer within the operation timeout; the next call on its \
                 session releases the lock, and the server frees it at the latest when the \
                 session has been silent for the TTL",
            ));
        };
        abandon.disarm();
        match released {
            Ok(released) => Ok(released),
            // The session is gone, and its lock with it.
            Err(e) if is_broken(&e) => {
                used.close(&self.ended(&e));
                Ok(false)
            }
            Err(e) => Err(self.inner.err(Operation::Release, lease.key(), e)),
        }
    }

    /// Publishes grant `pending` once it has been held for
    /// `publish_delay` (see "Lazy holder rows", "Published grants"): queued
    /// for the backend's publisher task (started, or started again after
    /// its runtime ended, here), which publishes it if still held then.
    fn publish_later(&self, pending: Pending) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let publisher = &self.publisher;
        let was_empty = {
            let mut queue = publisher
                .queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let was_empty = queue.is_empty();
            queue.push_back(pending);
            was_empty
        };
        {
            let mut task = publisher
                .task
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if task
                .as_ref()
                .is_none_or(tokio::task::JoinHandle::is_finished)
            {
                *task = Some(runtime.spawn(publications(
                    Arc::downgrade(&self.inner),
                    Arc::downgrade(&self.held),
                    Arc::clone(publisher),
                    publication_slack(self.inner.config.publish_delay),
                )));
            }
        }
        if was_empty {
            publisher.wake.notify_one();
        }
    }

    /// The owner a grant on `used` publishes (see the module docs,
    /// "Published grants"): none on a PostgreSQL session that holds other
    /// locks (two words, which `inspect` does not read as an owner and a
    /// token).
    fn published<'a>(&self, used: &ConnUse, owner: &'a str) -> &'a str {
        if self.inner.config.dialect == SqlDialect::Postgres && used.conn.held() > 0 {
            "multi -"
        } else {
            owner
        }
    }

    /// One try on a session of the set. A session found broken is closed
    /// and the try made once more on another (its locks are gone on the
    /// server already).
    async fn try_once(
        &self,
        grant: &SessionGrant<'_>,
        until: Instant,
        operation: Operation,
        key: &LockKey,
    ) -> Result<Tried, LockError> {
        let op_timeout = self.inner.config.op_timeout;
        let mut again = true;
        loop {
            let mut used = self
                .inner
                .any_for(until, Some(grant.lock.server_key.id()))
                .await
                .map_err(|e| e.with_key(key))?;
            self.clean(&mut used).await;
            let holds_others = used.conn.held() > 0;
            let try_here = SessionGrant {
                owner: self.published(&used, grant.owner),
                ..*grant
            };
            let mut abandon = Abandon {
                conn: Arc::clone(&used.conn),
                key: Some(grant.lock.server_key.clone()),
            };
            let Some(session) = used.session() else {
                abandon.disarm();
                continue;
            };
            let fresh = session.fresh;
            session.fresh = false;
            // Run to its end even if this call is dropped (see
            // `connection::session`, "Abandoned statements").
            let inner = Arc::clone(&self.inner);
            let owned = OwnedGrant::of(&try_here);
            let armed = used.armed_ttl();
            let statement = self.inner.finish(
                armed,
                used.run(closed_session, async move |session| {
                    session
                        .grant(inner.grant_sql(), &owned.grant(), holds_others)
                        .await
                }),
            );
            let sent_at = Instant::now();
            let attempt = timeout(op_timeout, statement).await;
            match attempt {
                Ok((used, Ok(Granted::Token(token)))) => {
                    abandon.disarm();
                    used.add_held();
                    return Ok(Tried::Granted(used, token, sent_at));
                }
                Ok((_, Ok(Granted::Held))) => {
                    abandon.disarm();
                    return Ok(Tried::Held);
                }
                Ok((mut used, Err(e))) => {
                    // A failed statement took nothing.
                    abandon.disarm();
                    if is_broken(&e) {
                        used.close(&self.ended(&e));
                        if again && !fresh {
                            again = false;
                            continue;
                        }
                    }
                    return Err(self.inner.err(operation, key, e));
                }
                Err(_) => {
                    return Err(self.error(
                        ErrorKind::Timeout,
                        operation,
                        key,
                        "the grant did not answer within the operation timeout (the next call \
                         on its session releases the lock if it was taken)",
                    ));
                }
            }
        }
    }

    /// One wait on the server, on a session that holds no lock (see
    /// `connection::session`); `None` when no such session is free.
    async fn wait_on_server(
        &self,
        grant: &SessionGrant<'_>,
        until: Instant,
        operation: Operation,
        key: &LockKey,
    ) -> Result<Option<Tried>, LockError> {
        let op_timeout = self.inner.config.op_timeout;
        let Some(mut used) = self
            .inner
            .for_wait(until)
            .await
            .map_err(|e| e.with_key(key))?
        else {
            return Ok(None);
        };
        self.clean(&mut used).await;
        let remaining = until.saturating_duration_since(Instant::now());
        // If this future is dropped mid-wait, the session is closed and, in
        // the background, killed from another connection (the server may
        // not notice the closed socket while it waits).
        let mut kill = KillOnDrop {
            sessions: Some(Arc::clone(&self.inner)),
            conn: Arc::clone(&used.conn),
            owner: grant.owner.to_owned(),
        };
        let Some(session) = used.session() else {
            kill.sessions = None;
            return Ok(None);
        };
        let sent_at = Instant::now();
        let waited = timeout(
            remaining + op_timeout,
            session.grant(
                self.inner.grant_sql(),
                &SessionGrant {
                    wait: Some(remaining),
                    ..*grant
                },
                false,
            ),
        )
        .await;
        match waited {
            Ok(Ok(granted)) => {
                kill.sessions = None;
                match granted {
                    Granted::Token(token) => {
                        used.add_held();
                        Ok(Some(Tried::Granted(used, token, sent_at)))
                    }
                    Granted::Held => Ok(Some(Tried::Held)),
                }
            }
            Ok(Err(e)) => {
                if is_broken(&e) {
                    kill.sessions = None;
                    used.close(&self.ended(&e));
                }
                Err(self.inner.err(operation, key, e))
            }
            Err(_) => Err(self.error(
                ErrorKind::Timeout,
                operation,
                key,
                "the server-side wait did not end by the deadline (its session was killed)",
            )),
        }
    }

    /// Waits until this backend no longer holds (or takes) `server_key`,
    /// then reserves it; `None` at `until` (or at once, for a try).
    async fn reserve(&self, server_key: &ServerKey, until: Option<Instant>) -> Option<Reservation> {
        loop {
            let freed = match self.held.reserve(server_key.id()) {
                Ok(reservation) => return Some(reservation),
                Err(freed) => freed,
            };
            let until = until?;
            let notified = freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Ok(reservation) = self.held.reserve(server_key.id()) {
                return Some(reservation);
            }
            if Instant::now() >= until {
                return None;
            }
            // Bounded, so a key held on a session that closed meanwhile
            // (freed only when seen) is taken soon.
            let _ = timeout_at(until.min(Instant::now() + LOCAL_RECHECK), notified).await;
        }
    }

    /// One grant: a try, then (for `acquire`) a wait until `wait_until`.
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
        let Some(reservation) = self.reserve(&server_key, wait_until).await else {
            return Ok(None);
        };
        let grant = SessionGrant {
            lock: SessionLock {
                key: key.as_str().as_bytes(),
                server_key: &server_key,
            },
            owner: owner_hex,
            ttl,
            wait: None,
        };
        let mut backoff = POLL_FIRST;
        let mut tried = self.try_once(&grant, conn_until, operation, key).await?;
        while matches!(tried, Tried::Held) {
            let Some(until) = wait_until.filter(|until| Instant::now() < *until) else {
                return Ok(None);
            };
            match self.wait_on_server(&grant, until, operation, key).await? {
                Some(found) => tried = found,
                None => {
                    // Every session holds locks or is busy, and no more may
                    // be opened: poll with tries (backoff with jitter).
                    let jitter = Duration::from_micros(u64::from(owner_hex.as_bytes()[0]) * 20);
                    sleep((backoff + jitter).min(until.saturating_duration_since(Instant::now())))
                        .await;
                    backoff = (backoff * 2).min(POLL_CAP);
                    tried = self.try_once(&grant, until, operation, key).await?;
                }
            }
            if matches!(tried, Tried::Held) && wait_until.is_some_and(|u| Instant::now() >= u) {
                return Ok(None);
            }
        }
        let Tried::Granted(mut used, token, mut sent_at) = tried else {
            return Ok(None);
        };
        let sql = &self.inner.sql;
        // After a long server-side wait, the send time of the wait says
        // little: confirm with one keep-alive and date the lease from it.
        if sent_at.elapsed() > ttl / 3 {
            sent_at = Instant::now();
            let Some(session) = used.session() else {
                return Err(self.closed(operation, key));
            };
            let held = timeout(op_timeout, session.holds(sql, &server_key)).await;
            let late = "the grant could not be confirmed within the operation timeout";
            if !self.answer(&mut used, operation, key, held, late)? {
                used.close("the session lost a lock right after its grant");
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
                // Too late to be of use: give it back (or leave it as an
                // orphan for the session's next call).
                let left = used.conn.held().saturating_sub(1);
                let release_sql = self.inner.release_sql(left);
                let mut abandon = Abandon {
                    conn: Arc::clone(&used.conn),
                    key: Some(server_key.clone()),
                };
                if let Some(session) = used.session()
                    && timeout(op_timeout, session.release(release_sql, &server_key))
                        .await
                        .is_ok()
                {
                    abandon.disarm();
                }
                used.remove_held();
                return Err(err.with_backend(self.inner.name));
            }
        };
        let rx = used.conn.state.subscribe();
        let published = Arc::new(AtomicBool::new(false));
        let held = Held {
            owner,
            token,
            conn: Arc::clone(&used.conn),
            published: Arc::clone(&published),
        };
        self.held.insert(server_key.id(), held, reservation);
        // MariaDB's holder row, PostgreSQL's quiet grant: published later
        // if still held.
        let unpublished = self.inner.config.dialect == SqlDialect::Postgres
            && used.session().is_some_and(|s| !s.published);
        if self.inner.sql.maria.is_some() || unpublished {
            let grant = Held {
                conn: Arc::clone(&used.conn),
                published: Arc::clone(&published),
                owner,
                token,
            };
            drop(used);
            // Holder details: MariaDB's row only.
            let details = if self.inner.sql.maria.is_some() {
                HolderDetails::encode_current()
            } else {
                String::new()
            };
            self.publish_later(Pending {
                due: Instant::now() + self.inner.config.publish_delay,
                key: key.clone(),
                server_key,
                grant,
                details,
            });
        }
        Ok(Some(lease.with_session(rx)))
    }
}

/// A grant whose publication is due at `due` (see "Lazy holder rows"):
/// its key, server lock, grant and (MariaDB) holder details at the grant.
struct Pending {
    due: Instant,
    key: LockKey,
    server_key: ServerKey,
    grant: Held,
    details: String,
}

/// A backend's deferred publications, in due order (one delay for all),
/// and the one task that takes them when due: a grant released sooner
/// costs a push here, not a task and a timer of its own.
#[derive(Default)]
struct Publisher {
    queue: Mutex<VecDeque<Pending>>,
    /// Told when the queue stops being empty.
    wake: Notify,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// How late the publisher may take a due publication, for a publication
/// delay of `delay`: half of it, at most 10 ms (well within the 50 ms
/// readers allow a publication beyond the delay, `publication_lag`). The
/// publisher then wakes at most once per that slack, taking every
/// publication due by then, not once per grant's due time (at thousands
/// of short grants a second, a timer wake-up per millisecond, most
/// finding every grant released).
fn publication_slack(delay: Duration) -> Duration {
    (delay / 2).min(Duration::from_millis(10))
}

/// The publisher task: waits for the first queued publication's due time
/// and `slack` more (see [`publication_slack`]), then publishes, each on a
/// task of its own, the due ones still held. Ends when the backend is
/// gone (and is aborted with it).
async fn publications(
    inner: Weak<Sessions>,
    held: Weak<HeldLocks>,
    publisher: Arc<Publisher>,
    slack: Duration,
) {
    loop {
        let next = publisher
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .front()
            .map(|p| p.due);
        match next {
            None => publisher.wake.notified().await,
            Some(due) => sleep_until(due + slack).await,
        }
        let now = Instant::now();
        let due: Vec<Pending> = {
            let mut queue = publisher
                .queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut due = Vec::new();
            while queue.front().is_some_and(|p| p.due <= now) {
                due.extend(queue.pop_front());
            }
            due
        };
        let (Some(inner), Some(held)) = (inner.upgrade(), held.upgrade()) else {
            return;
        };
        for pending in due {
            let grant = &pending.grant;
            if held.still_held(pending.server_key.id(), grant.owner, grant.token) {
                tokio::spawn(publish(Arc::clone(&inner), Arc::clone(&held), pending));
            }
        }
    }
}

/// Publishes `pending` on its own session: MariaDB's holder row,
/// PostgreSQL's `application_name` (see "Lazy holder rows").
async fn publish(inner: Arc<Sessions>, held: Arc<HeldLocks>, pending: Pending) {
    let Pending {
        key,
        server_key,
        grant,
        details,
        ..
    } = pending;
    let (id, owner, token) = (server_key.id(), grant.owner, grant.token);
    let op_timeout = inner.config.op_timeout;
    let Ok(Some(mut used)) = inner.this(&grant.conn, Instant::now() + op_timeout).await else {
        return;
    };
    // Under the session's mutex, which the grant's release takes
    // too: still held here means its release comes after.
    if !held.still_held(id, owner, token) {
        return;
    }
    // PostgreSQL: a session holding more than this lock publishes
    // no owner (the grant of the second one published
    // `distlock multi`, see "Published grants").
    if inner.config.dialect == SqlDialect::Postgres && !held.alone(used.conn.held()) {
        return;
    }
    let Some(session) = used.session() else {
        return;
    };
    let owner_hex = owner.hex();
    let publication = Publication {
        lock: SessionLock {
            key: key.as_str().as_bytes(),
            server_key: &server_key,
        },
        owner: owner_hex.as_str(),
        token: token.get(),
        details: details.as_str(),
    };
    // Given the time a `Finish` gets (the operation timeout, and as much
    // again): a publication stopped mid-way closes its session (see
    // `connection::session`, "Abandoned statements"), so only a session
    // that long silent is given up.
    let limit = op_timeout.saturating_mul(2);
    match timeout(limit, session.publish(&inner.sql, &publication)).await {
        Ok(Ok(written)) => {
            if written {
                grant.published.store(true, Ordering::Release);
            }
        }
        Ok(Err(e)) if is_broken(&e) => {
            used.close(&format!("the session ended: {e}"));
        }
        Ok(Err(e)) => {
            tracing::warn!(key = %key, error = %e, "could not write a session holder row");
        }
        // Stopped mid-statement: the use's drop closes the session, and
        // its locks with it.
        Err(_) => {}
    }
}

/// How long a local waiter sleeps at most before it looks again at a key
/// this backend holds.
const LOCAL_RECHECK: Duration = Duration::from_millis(100);
/// The first and the longest pause between polling tries.
const POLL_FIRST: Duration = Duration::from_millis(5);
const POLL_CAP: Duration = Duration::from_millis(100);

/// Kills a session from another connection when a server-side wait on it
/// is abandoned (the future dropped, or our own timeout), and closes it
/// here: closing the socket alone may go unnoticed by a server blocked in
/// a lock wait, which would then take the lock for nobody until it tries
/// to answer.
struct KillOnDrop {
    sessions: Option<Arc<Sessions>>,
    conn: Arc<Conn>,
    /// The waiting grant's owner (hex): the session is ended only while it
    /// still waits for this owner.
    owner: String,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let Some(sessions) = self.sessions.take() else {
            return;
        };
        // Closed: it leaves the set with the drop of its use.
        self.conn.mark_dead();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let victim = self.conn.id;
        let owner = std::mem::take(&mut self.owner);
        runtime.spawn(async move {
            let until = Instant::now() + sessions.config.op_timeout;
            // Outside the set: this must not wait behind its calls.
            if let Ok(mut session) = sessions.open_session(until).await {
                let _ = timeout_at(until, session.kill(victim, &owner)).await;
            }
        });
    }
}
