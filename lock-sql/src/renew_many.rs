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

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{
    ErrorKind, Lease, LockBackend, LockError, Operation, check_ttl, validity_deadline,
};
use sqlx::AssertSqlSafe;
#[allow(unused_imports)] // unused when only the MySQL dialect is compiled in
use sqlx::Row;
use tokio::time::Instant;

use crate::config::{SqlConfig, SqlDialect};
use crate::conn::{ConnSet, DbConn};
#[allow(unused_imports)] // used by the SQLite dialect only
use crate::driver::unix_micros;
use crate::driver::{MIN_TTL, NAME, micros};
use crate::error::map_sqlx;

/// The most leases in one statement. Each pooled connection keeps the
/// buffers of the largest statement it sent (about 150 bytes per row), so
/// larger statements would cost more memory per connection than they save
/// in round trips.
pub const RENEW_ROWS_PER_STATEMENT: usize = 256;
const MAX_ROWS: usize = RENEW_ROWS_PER_STATEMENT;

type Renewed = HashSet<(String, String, i64)>;

/// What the driver hands over for a batch.
pub(crate) struct RowRenewal<'a> {
    pub(crate) backend: &'a dyn LockBackend,
    pub(crate) conns: &'a ConnSet,
    pub(crate) config: &'a SqlConfig,
    pub(crate) table: &'a str,
}

fn token_of(lease: &Lease) -> i64 {
    i64::try_from(lease.token().get()).unwrap_or(i64::MAX)
}

/// The statement for `rows` leases (a power of two).
fn statement(dialect: SqlDialect, table: &str, rows: usize) -> String {
    let mut n = 0;
    let mut param = || {
        n += 1;
        match dialect {
            SqlDialect::Postgres => format!("${n}"),
            SqlDialect::Sqlite => format!("?{n}"),
            SqlDialect::MySql => "?".to_owned(),
        }
    };
    let (set, now) = match dialect {
        SqlDialect::Postgres => {
            let ttl = param();
            (
                format!("now() + {ttl} * INTERVAL '1 microsecond'"),
                "now()".to_owned(),
            )
        }
        SqlDialect::MySql => {
            let ttl = param();
            (
                format!("UTC_TIMESTAMP(6) + INTERVAL {ttl} MICROSECOND"),
                "UTC_TIMESTAMP(6)".to_owned(),
            )
        }
        SqlDialect::Sqlite => {
            let now = param();
            let ttl = param();
            (format!("{now} + {ttl}"), now)
        }
    };
    if dialect == SqlDialect::Postgres {
        // One text for any batch size: the rows travel as three arrays.
        let (names, owners, tokens) = (param(), param(), param());
        return format!(
            "UPDATE {table} AS l SET expires_at = {set} \
             FROM unnest({names}::text[], {owners}::text[], {tokens}::bigint[]) AS b(name, owner, token) \
             WHERE l.name = b.name AND l.owner = b.owner AND l.token = b.token \
             AND l.expires_at > {now} RETURNING l.name, l.owner, l.token"
        );
    }
    // Bound in this order: every (name, owner, token), then every name.
    let triples: Vec<String> = (0..rows)
        .map(|_| {
            let (name, owner, token) = (param(), param(), param());
            format!("({name}, {owner}, {token})")
        })
        .collect();
    let names: Vec<String> = (0..rows).map(|_| param()).collect();
    let returning = match dialect {
        SqlDialect::MySql => "",
        SqlDialect::Postgres | SqlDialect::Sqlite => " RETURNING name, owner, token",
    };
    // SQLite takes a row-value list only from a subquery.
    let values = match dialect {
        SqlDialect::Sqlite => "VALUES ",
        SqlDialect::Postgres | SqlDialect::MySql => "",
    };
    format!(
        "UPDATE {table} SET expires_at = {set} \
         WHERE (name, owner, token) IN ({values}{}) AND name IN ({}) AND expires_at > {now}{returning}",
        triples.join(", "),
        names.join(", ")
    )
}

/// Runs one statement for `group` (same TTL, at most `MAX_ROWS`), padded
/// to a power of two: the renewed rows (PostgreSQL, SQLite) or `None` when
/// MySQL matched fewer rows than leases.
async fn run(
    conn: &mut DbConn,
    sql: &Arc<str>,
    group: &[&Lease],
    owners: &[String],
    ttl: Duration,
    rows: usize,
) -> Result<Option<Renewed>, sqlx::Error> {
    let ttl_us = micros(ttl);
    let pick = |i: usize| i.min(group.len() - 1);
    let text = AssertSqlSafe(Arc::clone(sql));
    Ok(match conn {
        #[cfg(feature = "postgres")]
        DbConn::Postgres(c) => {
            let names: Vec<&str> = group.iter().map(|l| l.key().as_str()).collect();
            let tokens: Vec<i64> = group.iter().map(|l| token_of(l)).collect();
            let query = sqlx::query(text)
                .bind(ttl_us)
                .bind(names)
                .bind(owners)
                .bind(tokens);
            let mut renewed = Renewed::new();
            for row in query.fetch_all(c).await? {
                renewed.insert((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?));
            }
            Some(renewed)
        }
        #[cfg(feature = "mysql")]
        DbConn::MySql(c) => {
            let mut query = sqlx::query(text).bind(ttl_us);
            for i in 0..rows {
                let lease = group[pick(i)];
                query = query
                    .bind(lease.key().as_str().as_bytes())
                    .bind(owners[pick(i)].as_str())
                    .bind(token_of(lease));
            }
            for i in 0..rows {
                query = query.bind(group[pick(i)].key().as_str().as_bytes());
            }
            let matched = query.execute(c).await?.rows_affected();
            (usize::try_from(matched).ok() == Some(group.len())).then(|| {
                group
                    .iter()
                    .zip(owners)
                    .map(|(l, o)| (l.key().as_str().to_owned(), o.clone(), token_of(l)))
                    .collect()
            })
        }
        #[cfg(feature = "sqlite")]
        DbConn::Sqlite(c) => {
            let mut query = sqlx::query(text).bind(unix_micros()).bind(ttl_us);
            for i in 0..rows {
                let lease = group[pick(i)];
                query = query
                    .bind(lease.key().as_str())
                    .bind(owners[pick(i)].as_str())
                    .bind(token_of(lease));
            }
            for i in 0..rows {
                query = query.bind(group[pick(i)].key().as_str());
            }
            let mut renewed = Renewed::new();
            for row in query.fetch_all(c).await? {
                renewed.insert((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?));
            }
            Some(renewed)
        }
    })
}

impl RowRenewal<'_> {
    /// Renews `leases`: one statement per TTL and `MAX_ROWS` leases.
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
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(LockError::new(ErrorKind::Backend, op, "no result").with_backend(NAME))
                })
            })
            .collect()
    }

    async fn renew_group(
        &self,
        group: &[&Lease],
        ttl: Duration,
    ) -> Vec<Result<Instant, LockError>> {
        let op = Operation::Renew;
        let rows = match self.config.dialect {
            // Arrays: no padding needed.
            SqlDialect::Postgres => group.len(),
            SqlDialect::MySql | SqlDialect::Sqlite => group.len().next_power_of_two(),
        };
        let sql: Arc<str> = Arc::from(statement(self.config.dialect, self.table, rows));
        let owners: Vec<String> = group.iter().map(|l| l.owner().to_hex()).collect();
        let sent_at = Instant::now();
        let outcome = lock_core::with_timeout(self.config.op_timeout, op, async {
            // As every lock statement: a connection found broken by the
            // statement's error is replaced and the statement sent once more.
            let mut fresh = false;
            loop {
                let mut checkout = self
                    .conns
                    .checkout(fresh)
                    .await
                    .map_err(|e| map_sqlx(self.config, op, e))?;
                let result = run(checkout.conn(), &sql, group, &owners, ttl, rows).await;
                if checkout.finish(&result) && !fresh {
                    fresh = true;
                    continue;
                }
                break result.map_err(|e| map_sqlx(self.config, op, e));
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
                        Err(LockError::new(
                            ErrorKind::NotHeld,
                            op,
                            "the lease expired, was released, or belongs to someone else",
                        )
                        .with_key(lease.key())
                        .with_backend(NAME))
                    }
                })
                .collect(),
            // MySQL matched fewer rows: ask lease by lease.
            Ok(None) => {
                let mut out = Vec::with_capacity(group.len());
                for lease in group {
                    out.push(self.backend.renew(lease).await);
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
}
