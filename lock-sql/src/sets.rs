//! `try_acquire_all` in row mode: every key of a set in one exchange, all
//! or nothing (see [`GrantAll`] for each dialect's form), with fresh tokens
//! per key. PostgreSQL: one statement; MySQL/MariaDB: one transaction of 4
//! statements (5 in fair mode); SQLite: one `BEGIN IMMEDIATE` transaction
//! of 3 statements (4 in fair mode).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    ErrorKind, FencingToken, Lease, LockError, LockKey, LockSets, Operation, OwnerId, check_ttl,
};
use tokio::time::Instant;

use crate::config::{MIN_TTL, NAME};
use crate::connection::DbConn;
use crate::connection::table::Table;
use crate::dialect::binds::{Bind, NO_BINDS, execute, fetch};
use crate::dialect::{GrantAll, UpsertBinds, first_token, micros, unix_micros};
use crate::error::timed;
use crate::grants::Grants;

/// Whether `err` is a rolled-back deadlock or serialization conflict, or
/// the division by zero that rolls back a partly free set (PostgreSQL).
fn conflict(err: &sqlx::Error) -> Option<bool> {
    match err {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("40001" | "40P01") => Some(true),
            Some("22012") => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// Tokens of `keys` (in order) from `(name, token)` rows, when every key
/// has one.
fn in_order(keys: &[LockKey], rows: impl IntoIterator<Item = (String, i64)>) -> Option<Vec<i64>> {
    let by_name: HashMap<String, i64> = rows.into_iter().collect();
    keys.iter()
        .map(|k| by_name.get(k.as_str()).copied())
        .collect()
}

/// Row mode's multi-lock sets: the [`LockSets`] facet.
pub(crate) struct Sets {
    inner: Arc<Table>,
    /// Gives back a set granted too late.
    grants: Grants,
}

#[async_trait]
impl LockSets for Sets {
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        self.try_all(keys, ttl).await
    }
}

impl Sets {
    pub(crate) fn new(inner: Arc<Table>, grants: Grants) -> Self {
        Self { inner, grants }
    }

    /// One all-or-nothing grant of `keys` on `conn`: the tokens, or `None`.
    async fn grant_all_on(
        &self,
        conn: &mut DbConn,
        plan: &GrantAll,
        keys: &[LockKey],
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Vec<i64>>, sqlx::Error> {
        let names = keys.iter().map(|k| Bind::Text(k.as_str()));
        let n = i64::try_from(keys.len()).unwrap_or(i64::MAX);
        // Who takes the set: every key's row carries it, as a single grant's.
        let details = lock_core::HolderDetails::encode_current();
        let details = details.as_str();
        match plan {
            GrantAll::One(sql) => {
                let sql = std::sync::Arc::from(sql.as_str());
                let binds: Vec<Bind<'_>> =
                    [Bind::Text(owner), Bind::Int(micros(ttl)), Bind::Int(n)]
                        .into_iter()
                        .chain(names)
                        .chain([Bind::Text(details)])
                        .collect();
                match fetch(conn, &sql, &binds, "ti").await {
                    Ok(rows) => Ok(in_order(
                        keys,
                        rows.iter().map(|r| (r[0].text().to_owned(), r[1].int())),
                    )),
                    // Only some were free: the statement was rolled back.
                    Err(e) if conflict(&e) == Some(false) => Ok(None),
                    Err(e) => Err(e),
                }
            }
            GrantAll::Transaction {
                begin,
                check,
                upsert,
                rows,
                returns,
                read,
            } => {
                let arc = |s: &str| -> std::sync::Arc<str> { std::sync::Arc::from(s) };
                execute(conn, &arc(begin), NO_BINDS).await?;
                let body = async {
                    let names: Vec<Bind<'_>> = names.collect();
                    if let Some(check) = check {
                        let waiting = fetch(conn, &arc(check), &names, "i").await?;
                        if waiting.first().is_some_and(|r| r[0].int() > 0) {
                            return Ok(None);
                        }
                    }
                    let ttl = micros(ttl);
                    let binds: Vec<Bind<'_>> = match rows {
                        UpsertBinds::PerRow => keys
                            .iter()
                            .flat_map(|k| {
                                [
                                    Bind::Text(k.as_str()),
                                    Bind::Text(owner),
                                    Bind::Int(ttl),
                                    Bind::Text(details),
                                ]
                            })
                            .collect(),
                        UpsertBinds::NowTtlOwnerNames => {
                            let now = unix_micros();
                            [Bind::Int(now), Bind::Int(ttl), Bind::Text(owner)]
                                .into_iter()
                                .chain(names.iter().copied())
                                .chain([Bind::Text(details)])
                                .collect()
                        }
                    };
                    if *returns {
                        let granted = fetch(conn, &arc(upsert), &binds, "ti").await?;
                        return Ok(in_order(
                            keys,
                            granted.iter().map(|r| (r[0].text().to_owned(), r[1].int())),
                        ));
                    }
                    execute(conn, &arc(upsert), &binds).await?;
                    let Some(read) = read else {
                        return Ok(None);
                    };
                    let held = fetch(conn, &arc(read), &names, "tti").await?;
                    Ok(in_order(
                        keys,
                        held.iter()
                            .filter(|r| r[1].text() == owner)
                            .map(|r| (r[0].text().to_owned(), r[2].int())),
                    ))
                };
                let outcome = body.await;
                let end = match &outcome {
                    Ok(Some(_)) => "COMMIT",
                    _ => "ROLLBACK",
                };
                match execute(conn, &arc(end), NO_BINDS).await {
                    Ok(_) => outcome,
                    // A failed rollback after an error: the error says more.
                    Err(e) => outcome.and(Err(e)),
                }
            }
        }
    }

    /// The grant with its retries: once more on a fresh connection when the
    /// connection broke (the same owner; a set that did commit is found
    /// held by us and handed back), and again after a rolled-back deadlock.
    async fn grant_all(
        &self,
        keys: &[LockKey],
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Vec<i64>>, sqlx::Error> {
        let inner = &self.inner;
        let waiters = inner
            .config
            .fair
            .then_some(inner.shared.waiters_table.as_str());
        let plan = inner.dialect.grant_all_sql(
            inner.quoted_table(),
            &first_token(inner.quoted_floor()),
            waiters,
            keys.len(),
        );
        let mut conflicts = 0;
        let mut fresh = false;
        loop {
            let mut checkout = inner.conns.checkout(fresh).await?;
            let mut result = self
                .grant_all_on(checkout.conn(), &plan, keys, owner, ttl)
                .await;
            if fresh && matches!(result, Ok(None)) {
                // The first attempt may have committed before its reply was
                // lost: every key held by us is that grant.
                result = self.held_by(checkout.conn(), keys, owner).await;
            }
            if checkout.finish(&result) && !fresh {
                fresh = true;
                continue;
            }
            match result {
                Err(e) if conflict(&e) == Some(true) && conflicts < 5 => {
                    conflicts += 1;
                    tokio::time::sleep(lock_core::random_delay(Duration::from_millis(2))).await;
                }
                other => return other,
            }
        }
    }

    /// The tokens of `keys` when every one is held by `owner`.
    async fn held_by(
        &self,
        conn: &mut DbConn,
        keys: &[LockKey],
        owner: &str,
    ) -> Result<Option<Vec<i64>>, sqlx::Error> {
        let (dialect, inspect) = (self.inner.dialect, &self.inner.statements.inspect);
        let mut tokens = Vec::with_capacity(keys.len());
        for key in keys {
            match dialect.inspect(conn, inspect, key).await? {
                Some((Some(holder), token, _, _)) if holder == owner => tokens.push(token),
                _ => return Ok(None),
            }
        }
        Ok(Some(tokens))
    }

    /// `try_acquire_all` of the mutex in row mode.
    async fn try_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        let operation = Operation::TryAcquire;
        let first = keys.first().map_or("", LockKey::as_str);
        check_ttl(ttl, MIN_TTL, operation).map_err(|e| e.with_key(first).with_backend(NAME))?;
        let mut seen = std::collections::HashSet::new();
        if let Some(twice) = keys.iter().find(|k| !seen.insert(k.as_str())) {
            return Err(LockError::new(
                ErrorKind::InvalidArgument,
                operation,
                "a key appears twice in the set",
            )
            .with_key(twice)
            .with_backend(NAME));
        }
        if keys.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let owner = OwnerId::random();
        let sent_at = Instant::now();
        let owner_hex = owner.to_hex();
        let grant = self.grant_all(keys, &owner_hex, ttl);
        let granted = timed(&self.inner.config, operation, keys.first(), grant).await?;
        let Some(tokens) = granted else {
            return Ok(None);
        };
        let tokens: Vec<FencingToken> = tokens
            .into_iter()
            .map(|t| FencingToken::new(u64::try_from(t).unwrap_or(0)))
            .collect();
        let mut leases = Vec::with_capacity(keys.len());
        for (key, &token) in keys.iter().zip(&tokens) {
            match Lease::granted(key.clone(), owner, token, ttl, sent_at, String::new()) {
                Ok(lease) => leases.push(lease),
                Err(err) => {
                    // Too late to be of use: give every key back rather
                    // than let them block others until their TTL.
                    for (key, &token) in keys.iter().zip(&tokens) {
                        let stale = Lease::from_parts(
                            key.clone(),
                            owner,
                            token,
                            ttl,
                            sent_at,
                            String::new(),
                        );
                        let _ = self.grants.release(&stale).await;
                    }
                    return Err(err.with_backend(NAME));
                }
            }
        }
        Ok(Some(leases))
    }
}
