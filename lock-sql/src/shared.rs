//! Read-write locks and semaphores in row mode: a holders table, a waiters
//! table and a per-key counter row (see [`sql`] for the tables).
//!
//! Every grant decision is one transaction that first locks the key's
//! counter row (PostgreSQL `INSERT .. ON CONFLICT DO UPDATE`, MySQL
//! `INSERT .. ON DUPLICATE KEY UPDATE` + `SELECT .. FOR UPDATE`, SQLite
//! `BEGIN IMMEDIATE`), so the decisions of one key and shape are taken one
//! at a time; it reads the key's holders (locked, so a renewal cannot
//! commit beside a decision that counted its row as expired: the
//! transaction deletes every expired row it saw) and waiters, decides, and
//! writes the holder row, the counter and the waiter row in the same
//! transaction. Expiry is by the database's clock (SQLite: the host's, as
//! SQLite reads it).
//!
//! - **Read**: granted when no live writer holds the key and no live
//!   writer waits ahead of it (writer preference: a waiting writer keeps
//!   new readers out). Its token is the key's epoch: the last write token.
//! - **Write**: granted when nobody holds the key and nobody waits ahead.
//!   Token: counter + 1, which becomes the epoch.
//! - **Permits**: granted when the live holders' counts plus the request
//!   fit the limit and nobody waits ahead (FIFO). Token: counter + 1. A
//!   limit that differs from a live holder's or waiter's is
//!   `InvalidArgument`.
//!
//! A waiting acquire inserts its waiter row in the transaction of its
//! first failed attempt (so it is queued from the instant it was refused),
//! refreshes the row's expiry (its TTL) at every attempt, and deletes it
//! when granted (same transaction), at its deadline, or in the background
//! when the acquire is dropped; a waiter that dies stops counting when its
//! row expires. Waiters are woken like the mutex's (PostgreSQL `NOTIFY`
//! from the release, downgrade or withdrawal statement; elsewhere polling
//! with backoff and the process's own wake-ups).

pub(crate) mod holders;
pub(crate) mod wait;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    Downgrade, ErrorKind, FencingToken, Lease, LeaseKind, LockError, LockKey, Operation, OwnerId,
    check_ttl, with_timeout,
};
use tokio::time::Instant;

use crate::config::{MIN_TTL, NAME};
use crate::connection::DbConn;
use crate::connection::table::Table;
use crate::dialect::binds::{Bind, execute, fetch};
use crate::dialect::micros;
use crate::grants::Grant;

/// What one grant transaction decided.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Granted with this token.
    Granted(i64),
    /// Not granted; queued as this waiter (when registering).
    Queued(Option<i64>),
    /// The semaphore is in use with another limit.
    Mismatch(i64),
    /// A holder row counted as expired was renewed meanwhile: rolled
    /// back, to be decided again.
    Retry,
}

/// One grant request, as a grant transaction decides it.
#[derive(Clone, Copy)]
pub(crate) struct Request<'a> {
    key: &'a LockKey,
    kind: LeaseKind,
    /// The owner (hex) the holder row is written with.
    owner: &'a str,
    ttl: Duration,
    /// Our waiter row, when we are queued.
    waiter: Option<i64>,
    /// Whether a refusal queues us (inserts or refreshes our waiter row).
    register: bool,
}

impl<'a> Request<'a> {
    /// A request that is not queued and does not queue when refused.
    fn once(key: &'a LockKey, kind: LeaseKind, owner: &'a str, ttl: Duration) -> Self {
        Self {
            key,
            kind,
            owner,
            ttl,
            waiter: None,
            register: false,
        }
    }

    /// The same request from a waiting acquire: queued as `waiter` (when
    /// it is), and queued when refused.
    fn queued(self, waiter: Option<i64>) -> Self {
        Self {
            waiter,
            register: true,
            ..self
        }
    }
}

/// A holder row as the grant reads it.
struct HolderRow {
    owner: String,
    code: String,
    count: i64,
    limit: i64,
    token: i64,
    live: bool,
}

/// A waiter row as the grant reads it.
struct WaiterRow {
    id: i64,
    code: String,
    limit: i64,
    live: bool,
}

/// The longest a waiter row lives without a refresh: a waiting acquire
/// that dies (no cancel, no background withdrawal) stops queueing others
/// after at most this, even when its lease TTL is longer.
pub(crate) const WAITER_TTL_CAP: Duration = Duration::from_secs(10);

/// The TTL of the waiter row of an acquire whose lease TTL is `ttl`.
pub(crate) fn waiter_ttl(ttl: Duration) -> Duration {
    ttl.min(WAITER_TTL_CAP)
}

/// `(count, limit)` as stored: permits' own, 1 and 0 for read/write.
fn amounts(kind: LeaseKind) -> (i64, i64) {
    match kind {
        LeaseKind::Permits { count, limit } => (i64::from(count), i64::from(limit)),
        _ => (1, 0),
    }
}

/// Whether `kind` may be granted beside `holders` with `earlier` waiters
/// ahead of it (all live).
fn grantable(kind: LeaseKind, holders: &[&HolderRow], earlier: &[&WaiterRow]) -> bool {
    match kind {
        LeaseKind::Read => {
            holders.iter().all(|h| h.code != "w") && earlier.iter().all(|w| w.code != "w")
        }
        LeaseKind::Permits { count, limit } => {
            let held: i64 = holders.iter().map(|h| h.count).sum();
            earlier.is_empty() && held + i64::from(count) <= i64::from(limit)
        }
        _ => holders.is_empty() && earlier.is_empty(),
    }
}

/// The key's holder and waiter rows (waiters in arrival order).
async fn read_state(
    conn: &mut DbConn,
    statement: &std::sync::Arc<str>,
    name: &str,
    shape: &str,
) -> Result<(Vec<HolderRow>, Vec<WaiterRow>), sqlx::Error> {
    let binds = [
        Bind::Text(name),
        Bind::Text(shape),
        Bind::Text(name),
        Bind::Text(shape),
    ];
    let mut holders = Vec::new();
    let mut waiters = Vec::new();
    for r in fetch(conn, statement, &binds, "ittiiii").await? {
        if r[0].int() == 0 {
            holders.push(HolderRow {
                owner: r[1].text().to_owned(),
                code: r[2].text().to_owned(),
                count: r[3].int(),
                limit: r[4].int(),
                token: r[5].int(),
                live: r[6].int() == 1,
            });
        } else {
            waiters.push(WaiterRow {
                id: r[5].int(),
                code: r[2].text().to_owned(),
                limit: r[4].int(),
                live: r[6].int() == 1,
            });
        }
    }
    waiters.sort_by_key(|w| w.id);
    Ok((holders, waiters))
}

/// Inserts a waiter row with `statements` (the dialect's insert, then on
/// MySQL the read of its id, on the same connection): its id. Binds name,
/// shape, owner, kind, count, limit, TTL µs.
pub(crate) async fn insert_waiter(
    conn: &mut DbConn,
    statements: &[std::sync::Arc<str>],
    binds: &[Bind<'_>],
) -> Result<i64, sqlx::Error> {
    let mut id = None;
    for (i, statement) in statements.iter().enumerate() {
        let binds = if i == 0 { binds } else { &[] };
        if i + 1 == statements.len() {
            id = fetch(conn, statement, binds, "i").await?.into_iter().next();
        } else {
            execute(conn, statement, binds).await?;
        }
    }
    id.map(|r| r[0].int())
        .ok_or_else(|| sqlx::Error::Protocol("the waiter row has no id".into()))
}

/// Whether an error is a rolled-back deadlock or serialization conflict
/// (the transaction changed nothing and may run again).
fn is_conflict(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40001" | "40P01")))
}

/// Row mode's read-write locks and semaphores (and the waiter queue fair
/// mode shares): grants, releases, renewals, holders and downgrades.
#[derive(Clone)]
pub(crate) struct Shared {
    inner: Arc<Table>,
}

#[async_trait]
impl Downgrade for Shared {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.downgrade_share(lease).await
    }
}

impl Shared {
    pub(crate) fn new(inner: Arc<Table>) -> Self {
        Self { inner }
    }

    fn kind_error(
        &self,
        kind: LeaseKind,
        key: &LockKey,
        operation: Operation,
    ) -> Result<(), LockError> {
        kind.validate(operation)
            .map_err(|e| e.with_key(key).with_backend(NAME))
    }

    /// The body of one grant transaction (between BEGIN and COMMIT).
    async fn decide(
        &self,
        conn: &mut DbConn,
        request: Request<'_>,
    ) -> Result<Outcome, sqlx::Error> {
        let Request {
            key,
            kind,
            owner,
            ttl,
            waiter,
            register,
        } = request;
        let sql = &self.inner.shared;
        let (name, shape) = (key.as_str(), kind.shape().as_str());
        let by_key = [Bind::Text(name), Bind::Text(shape)];
        // Write and permit attempts bump the counter with the lock (a
        // refused attempt only skips a number: tokens still grow).
        let bump = i64::from(kind != LeaseKind::Read);
        // A reader locks the key's row in share mode where the database
        // has one: readers decide side by side, writers and permits (and
        // every registration of a writer) one at a time and never beside a
        // reader's decision.
        let read = kind == LeaseKind::Read;
        let (lock, shared_lock) = match &sql.lock_key_shared {
            Some(shared) if read => (shared, true),
            _ => (&sql.lock_key, false),
        };
        let mut counter_row = None;
        for (i, statement) in lock.iter().enumerate() {
            let first = [Bind::Text(name), Bind::Text(shape), Bind::Int(bump)];
            let binds: &[Bind<'_>] = if i == 0 && !shared_lock {
                &first
            } else {
                &by_key
            };
            if i + 1 == lock.len() {
                counter_row = fetch(conn, statement, binds, "ii")
                    .await?
                    .into_iter()
                    .next();
            } else {
                execute(conn, statement, binds).await?;
            }
        }
        let counter_row = counter_row
            .ok_or_else(|| sqlx::Error::Protocol("the key's counter row is missing".into()))?;
        let (counter, epoch) = (counter_row[0].int(), counter_row[1].int());
        let (holders, waiters) = read_state(conn, &sql.state, name, shape).await?;
        // An expired holder is deleted by the decision that counts it as
        // gone, exactly that row: when it is not deleted, a renewal got in
        // between, and the decision starts again on what is there now.
        // Readers deciding side by side delete only the expired writers
        // they count as gone (a revived reader beside them would be
        // harmless) and leave expired waiters to the others.
        let dead = holders
            .iter()
            .filter(|h| !h.live && (!shared_lock || h.code == "w"));
        for dead in dead {
            let binds = [by_key[0], by_key[1], Bind::Text(&dead.owner)];
            if execute(conn, &sql.purge_holder, &binds).await? != 1 {
                return Ok(Outcome::Retry);
            }
        }
        if !shared_lock && waiters.iter().any(|w| !w.live) {
            execute(conn, &sql.purge_waiters, &by_key).await?;
        }
        let live: Vec<&HolderRow> = holders.iter().filter(|h| h.live).collect();
        // Our own grant whose reply was lost (a retry on a fresh
        // connection, same owner): it is ours.
        if let Some(ours) = live.iter().find(|h| h.owner == owner) {
            return Ok(Outcome::Granted(ours.token));
        }
        let others: Vec<&WaiterRow> = waiters
            .iter()
            .filter(|w| w.live && Some(w.id) != waiter)
            .collect();
        let (count, limit) = amounts(kind);
        if let LeaseKind::Permits { .. } = kind {
            let in_use = live
                .iter()
                .map(|h| h.limit)
                .chain(others.iter().map(|w| w.limit))
                .find(|&l| l != limit);
            if let Some(in_use) = in_use {
                return Ok(Outcome::Mismatch(in_use));
            }
        }
        let earlier: Vec<&WaiterRow> = others
            .into_iter()
            .filter(|w| waiter.is_none_or(|me| w.id < me))
            .collect();
        // The columns a holder row and a waiter row start with: name,
        // shape, owner, kind, count, limit.
        let code = kind.code();
        let row = [
            Bind::Text(name),
            Bind::Text(shape),
            Bind::Text(owner),
            Bind::Text(&code),
            Bind::Int(count),
            Bind::Int(limit),
        ];
        if grantable(kind, &live, &earlier) {
            let token = match kind {
                LeaseKind::Read => epoch,
                LeaseKind::Write => {
                    let binds = [Bind::Int(counter), Bind::Text(name), Bind::Text(shape)];
                    execute(conn, &sql.set_epoch, &binds).await?;
                    counter
                }
                _ => counter,
            };
            // Who takes the share, written by the insert itself.
            let details = lock_core::HolderDetails::encode_current();
            let holder = [
                Bind::Int(token),
                Bind::Int(micros(ttl)),
                Bind::Text(&details),
            ];
            execute(conn, &sql.insert_holder, &[&row[..], &holder].concat()).await?;
            if let Some(id) = waiter {
                execute(conn, &sql.delete_waiter, &[Bind::Int(id)]).await?;
            }
            return Ok(Outcome::Granted(token));
        }
        if !register {
            return Ok(Outcome::Queued(None));
        }
        // Still queued: refresh our row, or join the queue (again, when our
        // row expired meanwhile).
        if let Some(id) = waiter.filter(|id| waiters.iter().any(|w| w.id == *id && w.live)) {
            execute(
                conn,
                &sql.refresh_waiter,
                &[Bind::Int(micros(waiter_ttl(ttl))), Bind::Int(id)],
            )
            .await?;
            return Ok(Outcome::Queued(Some(id)));
        }
        let binds = [&row[..], &[Bind::Int(micros(waiter_ttl(ttl)))]].concat();
        let id = insert_waiter(conn, &sql.insert_waiter, &binds).await?;
        Ok(Outcome::Queued(Some(id)))
    }

    /// One grant transaction on one connection: BEGIN, decide, COMMIT
    /// (ROLLBACK on an error).
    async fn transaction(
        &self,
        conn: &mut DbConn,
        request: Request<'_>,
    ) -> Result<Outcome, sqlx::Error> {
        let sql = &self.inner.shared;
        execute(conn, &sql.begin, &[]).await?;
        match self.decide(conn, request).await {
            Ok(Outcome::Retry) => {
                execute(conn, &sql.rollback, &[]).await?;
                Ok(Outcome::Retry)
            }
            Ok(outcome) => {
                execute(conn, &sql.commit, &[]).await?;
                Ok(outcome)
            }
            Err(err) => {
                // A failed rollback means a broken connection, which the
                // caller's checkout drops.
                let _ = execute(conn, &sql.rollback, &[]).await;
                Err(err)
            }
        }
    }

    /// A grant transaction with its retries: once more on a fresh
    /// connection when the connection broke (the same owner: a grant that
    /// did commit is found as ours), and again after a rolled-back deadlock.
    async fn attempt(
        &self,
        request: Request<'_>,
        operation: Operation,
    ) -> Result<Outcome, LockError> {
        let key = request.key;
        let conns = &self.inner.conns;
        with_timeout(self.inner.config.op_timeout, operation, async {
            let mut fresh = false;
            let mut conflicts = 0;
            loop {
                let mut checkout = conns
                    .checkout(fresh)
                    .await
                    .map_err(|e| self.inner.err(operation, key, e))?;
                let result = self.transaction(checkout.conn(), request).await;
                if checkout.finish(&result) && !fresh {
                    fresh = true;
                    continue;
                }
                match result {
                    Ok(Outcome::Retry) if conflicts < 5 => conflicts += 1,
                    Err(err) if is_conflict(&err) && conflicts < 5 => {
                        conflicts += 1;
                        tokio::time::sleep(lock_core::random_delay(Duration::from_millis(5))).await;
                    }
                    other => break other.map_err(|e| self.inner.err(operation, key, e)),
                }
            }
        })
        .await
        .map_err(|e| e.with_key(key).with_backend(NAME))
    }

    fn mismatch(key: &LockKey, kind: LeaseKind, in_use: i64, operation: Operation) -> LockError {
        let asked = match kind {
            LeaseKind::Permits { limit, .. } => limit,
            _ => 0,
        };
        LockError::new(
            ErrorKind::InvalidArgument,
            operation,
            format!(
                "the semaphore is in use with a limit of {in_use} permits; this request says {asked}"
            ),
        )
        .with_key(key)
        .with_backend(NAME)
    }

    /// The lease of a grant (given back when it arrived too late).
    async fn share_lease(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        owner: OwnerId,
        token: i64,
        ttl: Duration,
        sent_at: Instant,
    ) -> Result<Lease, LockError> {
        let grant = Grant {
            key,
            owner,
            token: FencingToken::new(u64::try_from(token).unwrap_or(0)),
            kind,
            ttl,
            sent_at,
        };
        grant
            .lease_or_give_back(|stale| async move {
                let _ = self.release_share(&stale).await;
            })
            .await
    }

    /// `try_acquire_kind` for read, write and permits.
    pub(crate) async fn try_share(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        let operation = Operation::TryAcquire;
        self.kind_error(kind, key, operation)?;
        check_ttl(ttl, MIN_TTL, operation).map_err(|e| e.with_key(key).with_backend(NAME))?;
        let owner = OwnerId::random();
        let sent_at = Instant::now();
        let owner_hex = owner.to_hex();
        let request = Request::once(key, kind, &owner_hex, ttl);
        match self.attempt(request, operation).await? {
            Outcome::Granted(token) => self
                .share_lease(key, kind, owner, token, ttl, sent_at)
                .await
                .map(Some),
            // Retry: its holders kept renewing at their expiry: held.
            Outcome::Queued(_) | Outcome::Retry => Ok(None),
            Outcome::Mismatch(in_use) => Err(Self::mismatch(key, kind, in_use, operation)),
        }
    }
}
