//! `renew_many` in row mode: one `UPDATE` per batch of keys (per TTL in
//! the batch), guarded by owner and token exactly as the single renewal,
//! with the database's clock:
//!
//! ```sql
//! UPDATE t SET expires_at = now() + ttl
//! WHERE name IN (k1, …) AND (name, owner, token) IN ((k1, o1, t1), …)
//!   AND expires_at > now()
//! RETURNING name, owner, token          -- PostgreSQL, SQLite
//! ```
//!
//! PostgreSQL and SQLite return which rows were renewed. MySQL/MariaDB
//! cannot return rows from an `UPDATE`: its matched-row count (sqlx sets
//! `CLIENT_FOUND_ROWS`) says whether all were; when fewer were, the leases
//! of that statement are renewed one by one, so each gets its own answer
//! (rare: a lock lost or taken over). Every value is a bound parameter.
//! Batches are padded to a power of two (repeating the last lease, which
//! changes nothing) so that few distinct statements are prepared.

pub(crate) mod session;
pub(crate) mod shedlock;

use std::sync::Arc;
use std::time::Duration;

use lock_core::{ErrorKind, Lease, LockError, LockKey, Operation, check_ttl, validity_deadline};
use tokio::time::Instant;

use crate::config::{MIN_TTL, NAME};
use crate::connection::table::Table;
use crate::connection::{ConnSet, retry_once};
use crate::dialect::{LeaseRow, token_of};
use crate::error::{map_sqlx, timed};

/// The most leases in one statement. Each pooled connection keeps the
/// buffers of the largest statement it sent (about 150 bytes per row), so
/// larger statements would cost more memory per connection than they save
/// in round trips.
pub const RENEW_ROWS_PER_STATEMENT: usize = 256;
const MAX_ROWS: usize = RENEW_ROWS_PER_STATEMENT;

/// Row mode's mutex renewals.
pub(crate) struct Renewal {
    inner: Arc<Table>,
}

impl Renewal {
    pub(crate) fn new(inner: Arc<Table>) -> Self {
        Self { inner }
    }

    /// Renews `leases` (mutex leases): one statement per TTL and
    /// `MAX_ROWS` leases.
    pub(crate) async fn renew(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        let op = Operation::Renew;
        let mut results: Vec<Option<Result<Instant, LockError>>> =
            std::iter::repeat_with(|| None).take(leases.len()).collect();
        let mut by_ttl: Vec<(Duration, Vec<usize>)> = Vec::new();
        for (index, lease) in leases.iter().enumerate() {
            if let Err(err) = check_ttl(lease.ttl(), MIN_TTL, op) {
                results[index] = Some(Err(err.with_key(lease.key()).with_backend(NAME)));
                continue;
            }
            match by_ttl.iter_mut().find(|(ttl, _)| *ttl == lease.ttl()) {
                Some((_, group)) => group.push(index),
                None => by_ttl.push((lease.ttl(), vec![index])),
            }
        }
        for (ttl, indices) in by_ttl {
            for chunk in indices.chunks(MAX_ROWS) {
                let group: Vec<&Lease> = chunk.iter().map(|&i| leases[i]).collect();
                let answers = self.renew_group(&group, ttl).await;
                for (&index, answer) in chunk.iter().zip(answers) {
                    results[index] = Some(answer);
                }
            }
        }
        lock_core::results_in_order(results, NAME)
    }

    async fn renew_group(
        &self,
        group: &[&Lease],
        ttl: Duration,
    ) -> Vec<Result<Instant, LockError>> {
        let op = Operation::Renew;
        let (dialect, config) = (self.inner.dialect, &self.inner.config);
        let rows = dialect.batch_rows(group.len());
        let sql: Arc<str> = Arc::from(dialect.renew_batch_sql(self.inner.quoted_table(), rows));
        let owners: Vec<String> = group.iter().map(|l| l.owner().to_hex()).collect();
        let sent_at = Instant::now();
        let outcome = lock_core::with_timeout(config.op_timeout, op, async {
            // As every lock statement: a connection found broken by the
            // statement's error is replaced and the statement sent once more.
            let mut fresh = false;
            loop {
                let mut checkout = self
                    .inner
                    .conns
                    .checkout(fresh)
                    .await
                    .map_err(|e| map_sqlx(config, op, e))?;
                let result = dialect
                    .renew_batch(checkout.conn(), &sql, group, &owners, ttl, rows)
                    .await;
                if checkout.finish(&result) && !fresh {
                    fresh = true;
                    continue;
                }
                break result.map_err(|e| map_sqlx(config, op, e));
            }
        })
        .await;
        match outcome {
            Ok(Some(renewed)) => group
                .iter()
                .zip(&owners)
                .map(|(lease, owner)| {
                    let row = (
                        lease.key().as_str().to_owned(),
                        owner.clone(),
                        token_of(lease),
                    );
                    if renewed.contains(&row) {
                        Ok(validity_deadline(sent_at, ttl))
                    } else {
                        Err(not_held(lease.key()))
                    }
                })
                .collect(),
            // MySQL matched fewer rows: ask lease by lease.
            Ok(None) => {
                let mut out = Vec::with_capacity(group.len());
                for lease in group {
                    out.push(self.renew_one(lease).await);
                }
                out
            }
            Err(err) => group
                .iter()
                .map(|lease| {
                    Err(LockError::new(err.kind(), op, err.to_string())
                        .with_key(lease.key())
                        .with_backend(NAME))
                })
                .collect(),
        }
    }

    /// One mutex lease's renewal (a MySQL batch that matched fewer rows
    /// asks lease by lease).
    async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        let key = lease.key();
        let ttl = lease.ttl();
        check_ttl(ttl, MIN_TTL, Operation::Renew)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        let inner = &self.inner;
        let statement = &inner.statements.renew;
        let owner = lease.owner().to_hex();
        let row = LeaseRow::of(lease, &owner);
        let dialect = inner.dialect;
        let sent_at = Instant::now();
        let renewed = timed(&inner.config, Operation::Renew, Some(key), async {
            retry_once!(&inner.conns, |conn| dialect
                .renew(conn, statement, row, ttl))
        })
        .await?;
        if renewed == 1 {
            Ok(validity_deadline(sent_at, ttl))
        } else {
            Err(not_held(key))
        }
    }
}

/// A renewal that found the lease gone.
fn not_held(key: &LockKey) -> LockError {
    LockError::new(
        ErrorKind::NotHeld,
        Operation::Renew,
        "the lease expired, was released, or belongs to someone else",
    )
    .with_key(key)
    .with_backend(NAME)
}
