//! Fair mode (`fair=true`): mutex waiters queue in the waiters table (shape
//! `mutex`) in the order of their database-assigned ids, and a grant
//! happens only when the row is free and no live waiter with a smaller id
//! waits (the fair grant statement, [`Dialect::fair_grant_sql`]). The
//! mutex row itself is the unfair clients' row: both exclude each other.
//!
//! [`Dialect::fair_grant_sql`]: crate::dialect::Dialect::fair_grant_sql

use std::time::Duration;

use lock_core::{ErrorKind, Lease, LockError, LockKey, Operation, OwnerId};
use tokio::time::Instant;

use super::Waiting;
use crate::config::NAME;
use crate::connection::{ConnSet, retry_once};
use crate::dialect::binds::Bind;
use crate::dialect::micros;
use crate::error::timed;
use crate::shared::wait::Queued;
use crate::shared::{insert_waiter, waiter_ttl};

/// The shape of mutex waiters' rows.
const MUTEX: &str = "mutex";

impl Waiting {
    /// Inserts this acquire's waiter row: its id. A registration sent again
    /// on a fresh connection first deletes the rows of `owner` (the first
    /// may have committed; it would queue us behind ourselves).
    async fn register_fair(
        &self,
        key: &LockKey,
        owner: &str,
        ttl: Duration,
    ) -> Result<i64, LockError> {
        let operation = Operation::Acquire;
        let shared = &self.inner.shared;
        let conns = &self.inner.conns;
        let micros = micros(waiter_ttl(ttl));
        let binds = [
            Bind::Text(key.as_str()),
            Bind::Text(MUTEX),
            Bind::Text(owner),
            Bind::Text("x"),
            Bind::Int(1),
            Bind::Int(0),
            Bind::Int(micros),
        ];
        timed(&self.inner.config, operation, Some(key), async {
            retry_once!(conns, |conn, fresh| async {
                if fresh {
                    let forget = [Bind::Text(key.as_str()), Bind::Text(owner)];
                    crate::dialect::binds::execute(conn, &shared.forget_waiter, &forget).await?;
                }
                insert_waiter(conn, &shared.insert_waiter, &binds).await
            })
        })
        .await
    }

    /// `acquire` in fair mode: a fair try (behind every live waiter), then
    /// queued as a waiter row until the key is free and nobody live is
    /// ahead of it, the deadline, or drop (the row is withdrawn in the
    /// background).
    pub(super) async fn acquire_fair(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let operation = Operation::Acquire;
        let shared = &self.inner.shared;
        let owner = OwnerId::random().to_hex();
        let mut pacing = self.shared.pacing();
        let mut queued = Queued::new(&self.shared, key);
        let mut refreshed_at = Instant::now();
        // The mutex row stays marked waited for, so that its release
        // notifies (PostgreSQL; see `crate::dialect::WaitingSql`): the
        // registration marks it for the waiter row's TTL, and a mark is
        // sent again once a third of that has passed (the loop comes round
        // at least that often).
        let mark_for = waiter_ttl(ttl);
        let mut marked_at: Option<Instant> = None;
        loop {
            // Subscribe before the attempt, so a release between a refusal
            // and the wait is not missed.
            let mut wakes = self.inner.waits.subscribe();
            let ahead = queued.id.unwrap_or(i64::MAX);
            if let Some(lease) = self
                .grants
                .try_once(key, ttl, operation, Some(ahead))
                .await?
            {
                if let Some(id) = queued.id {
                    // Our row (and the key's expired ones) go before the
                    // lease is handed out. Should that fail, the row stays
                    // in `queued`, whose drop withdraws it in the
                    // background (it would hold the queue after our
                    // release until it expired).
                    let binds = [Bind::Text(key.as_str()), Bind::Int(id)];
                    let removed = self
                        .shared
                        .holder_statement(key, &shared.granted_waiter, &binds, false, operation)
                        .await;
                    if removed.is_ok() {
                        queued.id = None;
                    }
                }
                return Ok(lease);
            }
            if Instant::now() >= deadline {
                queued.withdraw().await;
                return Err(LockError::new(
                    ErrorKind::Contended,
                    operation,
                    "still held, or others queued first, at the wait deadline",
                )
                .with_key(key)
                .with_backend(NAME));
            }
            match queued.id {
                None => {
                    refreshed_at = Instant::now();
                    queued.id = Some(self.register_fair(key, &owner, ttl).await?);
                    marked_at = Some(refreshed_at);
                }
                Some(id) if refreshed_at.elapsed() >= waiter_ttl(ttl) / 3 => {
                    let sent_at = Instant::now();
                    let binds = [Bind::Int(micros(waiter_ttl(ttl))), Bind::Int(id)];
                    let refreshed = self
                        .shared
                        .holder_statement(
                            key,
                            &shared.refresh_live_waiter,
                            &binds,
                            false,
                            operation,
                        )
                        .await?;
                    if refreshed == 1 {
                        refreshed_at = sent_at;
                    } else {
                        // Expired (a stall longer than its TTL): skipped by
                        // the others meanwhile, so it queues again at the end.
                        queued.withdraw().await;
                        refreshed_at = Instant::now();
                        queued.id = Some(self.register_fair(key, &owner, ttl).await?);
                        marked_at = Some(refreshed_at);
                    }
                }
                Some(_) => {}
            }
            if marked_at.is_none_or(|at| at.elapsed() >= mark_for / 3) {
                marked_at = Some(Instant::now());
                self.grants.mark_waited(key, mark_for).await;
            }
            self.shared
                .pace(&mut pacing, &mut wakes, key, ttl, deadline)
                .await;
        }
    }
}
