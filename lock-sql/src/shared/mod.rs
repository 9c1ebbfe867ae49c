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

pub(crate) mod run;
pub(crate) mod sql;

use std::time::Duration;

use lock_core::{
    ErrorKind, FencingToken, HolderInfo, Lease, LeaseKind, LockError, LockKey, LockShape,
    Operation, OwnerId, check_ttl, validity_deadline, with_timeout,
};
use tokio::time::Instant;

use self::run::{Bind, execute, fetch};
use crate::conn::DbConn;
use crate::dialect::{micros, token_of};
use crate::driver::{MIN_TTL, NAME, SqlBackend};
use crate::wake::Wake;

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

/// Whether an error is a rolled-back deadlock or serialization conflict
/// (the transaction changed nothing and may run again).
fn is_conflict(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40001" | "40P01")))
}

impl SqlBackend {
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
    #[allow(clippy::too_many_arguments)]
    async fn decide(
        &self,
        conn: &mut DbConn,
        key: &LockKey,
        kind: LeaseKind,
        owner: &str,
        ttl: Duration,
        waiter: Option<i64>,
        register: bool,
    ) -> Result<Outcome, sqlx::Error> {
        let sql = &self.inner().shared;
        let (name, shape) = (key.as_str(), kind.shape().as_str());
        let by_key = [Bind::Text(name), Bind::Text(shape)];
        // Write and permit attempts bump the counter with the lock (a
        // refused attempt only skips a number: tokens still grow).
        let bump = i64::from(kind != LeaseKind::Read);
        let mut counter_row = None;
        for (i, statement) in sql.lock_key.iter().enumerate() {
            let first = [Bind::Text(name), Bind::Text(shape), Bind::Int(bump)];
            let binds: &[Bind<'_>] = if i == 0 { &first } else { &by_key };
            if i + 1 == sql.lock_key.len() {
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
        for dead in holders.iter().filter(|h| !h.live) {
            let binds = [by_key[0], by_key[1], Bind::Text(&dead.owner)];
            if execute(conn, &sql.purge_holder, &binds).await? != 1 {
                return Ok(Outcome::Retry);
            }
        }
        if waiters.iter().any(|w| !w.live) {
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
            let code = kind.code();
            let binds = [
                Bind::Text(name),
                Bind::Text(shape),
                Bind::Text(owner),
                Bind::Text(&code),
                Bind::Int(count),
                Bind::Int(limit),
                Bind::Int(token),
                Bind::Int(micros(ttl)),
            ];
            execute(conn, &sql.insert_holder, &binds).await?;
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
                &[Bind::Int(micros(ttl)), Bind::Int(id)],
            )
            .await?;
            return Ok(Outcome::Queued(Some(id)));
        }
        let code = kind.code();
        let binds = [
            Bind::Text(name),
            Bind::Text(shape),
            Bind::Text(owner),
            Bind::Text(&code),
            Bind::Int(count),
            Bind::Int(limit),
            Bind::Int(micros(ttl)),
        ];
        let mut id = None;
        for (i, statement) in sql.insert_waiter.iter().enumerate() {
            if i == 0 {
                if i + 1 == sql.insert_waiter.len() {
                    id = fetch(conn, statement, &binds, "i")
                        .await?
                        .into_iter()
                        .next();
                } else {
                    execute(conn, statement, &binds).await?;
                }
            } else {
                id = fetch(conn, statement, &[], "i").await?.into_iter().next();
            }
        }
        let id = id
            .map(|r| r[0].int())
            .ok_or_else(|| sqlx::Error::Protocol("the waiter row has no id".into()))?;
        Ok(Outcome::Queued(Some(id)))
    }

    /// A waiting acquire's look before its next grant transaction, read
    /// only and outside any transaction (on SQLite without the writer
    /// turn): `false` when the transaction would only refuse again and its
    /// waiter row (`waiter`, live) needs no refresh yet. Anything else
    /// (grantable, our row gone, another limit, expired holders to clean
    /// up) is `true`: the transaction decides.
    async fn worth_trying(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        waiter: i64,
    ) -> Result<bool, LockError> {
        let operation = Operation::Acquire;
        let conns = &self.inner().conns;
        let statement = &self.inner().shared.state;
        let (name, shape) = (key.as_str(), kind.shape().as_str());
        let (holders, waiters) = with_timeout(self.inner().config.op_timeout, operation, async {
            let mut fresh = false;
            loop {
                let mut checkout = conns
                    .checkout_reader(fresh)
                    .await
                    .map_err(|e| self.err(operation, key, e))?;
                let result = read_state(checkout.conn(), statement, name, shape).await;
                if checkout.finish(&result) && !fresh {
                    fresh = true;
                    continue;
                }
                break result.map_err(|e| self.err(operation, key, e));
            }
        })
        .await
        .map_err(|e| e.with_key(key).with_backend(NAME))?;
        let ours_live = waiters.iter().any(|w| w.id == waiter && w.live);
        if !ours_live || holders.iter().any(|h| !h.live) {
            return Ok(true);
        }
        let live: Vec<&HolderRow> = holders.iter().collect();
        let (_, limit) = amounts(kind);
        let others = waiters.iter().filter(|w| w.live && w.id != waiter);
        if matches!(kind, LeaseKind::Permits { .. })
            && (live.iter().any(|h| h.limit != limit) || others.clone().any(|w| w.limit != limit))
        {
            return Ok(true);
        }
        let earlier: Vec<&WaiterRow> = others.filter(|w| w.id < waiter).collect();
        Ok(grantable(kind, &live, &earlier))
    }

    /// One grant transaction on one connection: BEGIN, decide, COMMIT
    /// (ROLLBACK on an error).
    #[allow(clippy::too_many_arguments)]
    async fn transaction(
        &self,
        conn: &mut DbConn,
        key: &LockKey,
        kind: LeaseKind,
        owner: &str,
        ttl: Duration,
        waiter: Option<i64>,
        register: bool,
    ) -> Result<Outcome, sqlx::Error> {
        let sql = &self.inner().shared;
        execute(conn, &sql.begin, &[]).await?;
        match self
            .decide(conn, key, kind, owner, ttl, waiter, register)
            .await
        {
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
    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        owner: &str,
        ttl: Duration,
        waiter: Option<i64>,
        register: bool,
        operation: Operation,
    ) -> Result<Outcome, LockError> {
        let conns = &self.inner().conns;
        with_timeout(self.inner().config.op_timeout, operation, async {
            let mut fresh = false;
            let mut conflicts = 0;
            loop {
                let mut checkout = conns
                    .checkout(fresh)
                    .await
                    .map_err(|e| self.err(operation, key, e))?;
                let result = self
                    .transaction(checkout.conn(), key, kind, owner, ttl, waiter, register)
                    .await;
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
                    other => break other.map_err(|e| self.err(operation, key, e)),
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
        let token = FencingToken::new(u64::try_from(token).unwrap_or(0));
        match Lease::granted(key.clone(), owner, token, ttl, sent_at, String::new()) {
            Ok(lease) => Ok(lease.with_kind(kind)),
            Err(err) => {
                let stale =
                    Lease::from_parts(key.clone(), owner, token, ttl, sent_at, String::new())
                        .with_kind(kind);
                let _ = self.release_share(&stale).await;
                Err(err.with_backend(NAME))
            }
        }
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
        match self
            .attempt(key, kind, &owner.to_hex(), ttl, None, false, operation)
            .await?
        {
            Outcome::Granted(token) => self
                .share_lease(key, kind, owner, token, ttl, sent_at)
                .await
                .map(Some),
            // Retry: its holders kept renewing at their expiry: held.
            Outcome::Queued(_) | Outcome::Retry => Ok(None),
            Outcome::Mismatch(in_use) => Err(Self::mismatch(key, kind, in_use, operation)),
        }
    }

    /// `acquire_kind` for read, write and permits: queued in the waiters
    /// table from the first refusal until granted, the deadline, or drop.
    pub(crate) async fn acquire_share(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let operation = Operation::Acquire;
        self.kind_error(kind, key, operation)?;
        check_ttl(ttl, MIN_TTL, operation).map_err(|e| e.with_key(key).with_backend(NAME))?;
        let owner = OwnerId::random();
        let owner_hex = owner.to_hex();
        let config = &self.inner().config;
        let notified = self.inner_dialect().notified();
        let mut backoff = config.poll.backoff();
        let mut started_listener = false;
        let mut queued = Queued {
            backend: self.clone(),
            key: key.clone(),
            id: None,
        };
        // When our waiter row was last written (it lives `ttl` from then).
        let mut refreshed_at = Instant::now();
        let mut look_first = false;
        loop {
            // Subscribe before the attempt, so a release between a refusal
            // and the wait is not missed.
            let mut wakes = self.inner().waits.subscribe();
            // While our row is fresh, a read-only look spares a write
            // transaction (and on SQLite the file's write lock) that would
            // only refuse again.
            let skip = match queued.id {
                Some(id) if look_first && refreshed_at.elapsed() < ttl / 3 => {
                    !self.worth_trying(key, kind, id).await?
                }
                _ => false,
            };
            look_first = true;
            if skip {
                self.wait_for_wake(&mut wakes, key, ttl, deadline, &mut backoff)
                    .await;
                if Instant::now() >= deadline {
                    // One last decision at the deadline.
                    look_first = false;
                }
                continue;
            }
            let sent_at = Instant::now();
            match self
                .attempt(key, kind, &owner_hex, ttl, queued.id, true, operation)
                .await?
            {
                Outcome::Granted(token) => {
                    // The grant's transaction deleted our waiter row.
                    queued.id = None;
                    return self
                        .share_lease(key, kind, owner, token, ttl, sent_at)
                        .await;
                }
                Outcome::Queued(id) => {
                    queued.id = id;
                    refreshed_at = sent_at;
                }
                // Its holders kept renewing at their expiry: still queued.
                Outcome::Retry => {}
                Outcome::Mismatch(in_use) => {
                    queued.withdraw().await;
                    return Err(Self::mismatch(key, kind, in_use, operation));
                }
            }
            if Instant::now() >= deadline {
                queued.withdraw().await;
                return Err(LockError::new(
                    ErrorKind::Contended,
                    operation,
                    format!("cannot take {kind} before the wait deadline"),
                )
                .with_key(key)
                .with_backend(NAME));
            }
            if notified && !started_listener {
                self.ensure_listener().await;
                started_listener = true;
                // Releases before the listener ran were not heard.
                continue;
            }
            self.wait_for_wake(&mut wakes, key, ttl, deadline, &mut backoff)
                .await;
        }
    }

    /// Sleeps until a wake-up for `key` (a release, a downgrade, a
    /// withdrawal), the next poll or re-check, or `deadline`; attempts come
    /// at least every `ttl / 3`, so a waiter row (TTL `ttl`) stays live.
    async fn wait_for_wake(
        &self,
        wakes: &mut tokio::sync::broadcast::Receiver<Wake>,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
        backoff: &mut lock_core::Backoff,
    ) {
        let config = &self.inner().config;
        let delay = if self.inner_dialect().notified() {
            config.recheck
        } else {
            backoff.next_delay().unwrap_or(config.poll.max)
        };
        let delay = delay.min(ttl / 3) + lock_core::random_delay(Duration::from_millis(2));
        let sleep = tokio::time::sleep_until((Instant::now() + delay).min(deadline));
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = &mut sleep => break,
                wake = wakes.recv() => match wake {
                    Ok(Wake::Released(released)) if &*released == key.as_str() => {
                        *backoff = config.poll.backoff();
                        break;
                    }
                    Ok(Wake::All) | Err(_) => break,
                    Ok(Wake::Released(_) | Wake::Taken(_)) => {}
                },
            }
        }
    }

    /// A statement on a holder row, once more on a fresh connection when
    /// the connection broke (all are idempotent or report `false` the
    /// second time): the rows it changed.
    async fn holder_statement(
        &self,
        key: &LockKey,
        statement: &std::sync::Arc<str>,
        binds: &[Bind<'_>],
        returns_rows: bool,
        operation: Operation,
    ) -> Result<u64, LockError> {
        let conns = &self.inner().conns;
        with_timeout(self.inner().config.op_timeout, operation, async {
            let mut fresh = false;
            loop {
                let mut checkout = conns
                    .checkout(fresh)
                    .await
                    .map_err(|e| self.err(operation, key, e))?;
                let result = if returns_rows {
                    fetch(checkout.conn(), statement, binds, "")
                        .await
                        .map(|rows| rows.len() as u64)
                } else {
                    execute(checkout.conn(), statement, binds).await
                };
                if checkout.finish(&result) && !fresh {
                    fresh = true;
                    continue;
                }
                break result.map_err(|e| self.err(operation, key, e));
            }
        })
        .await
        .map_err(|e| e.with_key(key).with_backend(NAME))
    }

    fn not_held(lease: &Lease, operation: Operation) -> LockError {
        LockError::new(
            ErrorKind::NotHeld,
            operation,
            "the lease expired, was released, or belongs to someone else",
        )
        .with_key(lease.key())
        .with_backend(NAME)
    }

    /// `renew` of a read, write or permit lease.
    pub(crate) async fn renew_share(&self, lease: &Lease) -> Result<Instant, LockError> {
        let (key, kind, ttl) = (lease.key(), lease.kind(), lease.ttl());
        check_ttl(ttl, MIN_TTL, Operation::Renew)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        let (owner, code) = (lease.owner().to_hex(), kind.code());
        let binds = [
            Bind::Int(micros(ttl)),
            Bind::Text(key.as_str()),
            Bind::Text(kind.shape().as_str()),
            Bind::Text(&owner),
            Bind::Int(token_of(lease)),
            Bind::Text(&code),
        ];
        let sent_at = Instant::now();
        let statement = &self.inner().shared.renew;
        match self
            .holder_statement(key, statement, &binds, false, Operation::Renew)
            .await?
        {
            1 => Ok(validity_deadline(sent_at, ttl)),
            _ => Err(Self::not_held(lease, Operation::Renew)),
        }
    }

    /// Wakes the process's waiters for `key` where the database does not
    /// notify them.
    fn woke(&self, key: &LockKey) {
        if !self.inner().shared.notifies {
            self.inner().waits.released(key.as_str());
        }
    }

    /// `release` of a read, write or permit lease.
    pub(crate) async fn release_share(&self, lease: &Lease) -> Result<bool, LockError> {
        let (key, kind) = (lease.key(), lease.kind());
        let (owner, code) = (lease.owner().to_hex(), kind.code());
        let shared = &self.inner().shared;
        let channel = &self.inner().channel;
        let mut binds = vec![
            Bind::Text(key.as_str()),
            Bind::Text(kind.shape().as_str()),
            Bind::Text(&owner),
            Bind::Int(token_of(lease)),
            Bind::Text(&code),
        ];
        if shared.notifies {
            binds.push(Bind::Text(channel));
        }
        let released = self
            .holder_statement(
                key,
                &shared.release,
                &binds,
                shared.notifies,
                Operation::Release,
            )
            .await?
            == 1;
        if released {
            self.woke(key);
        }
        Ok(released)
    }

    /// `downgrade`: our live write row becomes a read row in one
    /// statement (same owner, token and expiry).
    pub(crate) async fn downgrade_share(&self, lease: &Lease) -> Result<Lease, LockError> {
        let key = lease.key();
        if lease.kind() != LeaseKind::Write {
            return Err(Self::not_held(lease, Operation::Downgrade));
        }
        let owner = lease.owner().to_hex();
        let shared = &self.inner().shared;
        let channel = &self.inner().channel;
        let mut binds = vec![
            Bind::Text(key.as_str()),
            Bind::Text(LockShape::ReadWrite.as_str()),
            Bind::Text(&owner),
            Bind::Int(token_of(lease)),
        ];
        if shared.notifies {
            binds.push(Bind::Text(channel));
        }
        let changed = self
            .holder_statement(
                key,
                &shared.downgrade,
                &binds,
                shared.notifies,
                Operation::Downgrade,
            )
            .await?;
        if changed != 1 {
            return Err(Self::not_held(lease, Operation::Downgrade));
        }
        self.woke(key);
        Ok(Lease::from_parts(
            key.clone(),
            lease.owner(),
            lease.token(),
            lease.ttl(),
            lease.validity_deadline(),
            String::new(),
        )
        .with_kind(LeaseKind::Read))
    }

    /// `holders` of a read-write lock or a semaphore.
    pub(crate) async fn share_holders(
        &self,
        key: &LockKey,
        shape: LockShape,
    ) -> Result<Vec<HolderInfo>, LockError> {
        let operation = Operation::Inspect;
        let conns = &self.inner().conns;
        let statement = &self.inner().shared.list;
        let binds = [Bind::Text(key.as_str()), Bind::Text(shape.as_str())];
        let rows = with_timeout(self.inner().config.op_timeout, operation, async {
            let mut fresh = false;
            loop {
                let mut checkout = conns
                    .checkout_reader(fresh)
                    .await
                    .map_err(|e| self.err(operation, key, e))?;
                let result = fetch(checkout.conn(), statement, &binds, "ttii").await;
                if checkout.finish(&result) && !fresh {
                    fresh = true;
                    continue;
                }
                break result.map_err(|e| self.err(operation, key, e));
            }
        })
        .await
        .map_err(|e| e.with_key(key).with_backend(NAME))?;
        rows.into_iter()
            .map(|r| {
                let kind = LeaseKind::from_code(r[1].text())
                    .map_err(|e| e.with_key(key).with_backend(NAME))?;
                Ok(HolderInfo {
                    kind,
                    holder: r[0].text().to_owned(),
                    token: u64::try_from(r[2].int()).ok().map(FencingToken::new),
                    remaining_ttl: Some(Duration::from_micros(
                        u64::try_from(r[3].int()).unwrap_or(0),
                    )),
                })
            })
            .collect()
    }

    /// Deletes waiter row `id` and wakes the key's waiters (the ones behind
    /// it may go now).
    async fn withdraw(&self, key: &LockKey, id: i64) {
        let shared = &self.inner().shared;
        let _ = self
            .holder_statement(
                key,
                &shared.delete_waiter,
                &[Bind::Int(id)],
                false,
                Operation::Acquire,
            )
            .await;
        match &shared.notify {
            Some(notify) => {
                let binds = [Bind::Text(&self.inner().channel), Bind::Text(key.as_str())];
                let _ = self
                    .holder_statement(key, notify, &binds, true, Operation::Acquire)
                    .await;
            }
            None => self.inner().waits.released(key.as_str()),
        }
    }
}

/// A waiting acquire's row in the waiters table: withdrawn when the
/// acquire gives up, and in the background when it is dropped.
struct Queued {
    backend: SqlBackend,
    key: LockKey,
    id: Option<i64>,
}

impl Queued {
    async fn withdraw(&mut self) {
        if let Some(id) = self.id.take() {
            self.backend.withdraw(&self.key, id).await;
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        // Dropped mid-wait (cancelled): withdraw in the background; without
        // a runtime the row expires with its TTL.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (backend, key) = (self.backend.clone(), self.key.clone());
            runtime.spawn(async move { backend.withdraw(&key, id).await });
        }
    }
}
