//! PostgreSQL's transaction locks: `pg_try_advisory_xact_lock` for a try,
//! `pg_advisory_xact_lock` under `lock_timeout` inside a savepoint for a
//! wait; session mode's sequence or row mode's lease row for the token,
//! in the same statement.

use std::time::Duration;

use async_trait::async_trait;
use lock_core::{LockError, LockKey};
use sqlx::{AssertSqlSafe, PgConnection, Row};
use tokio::time::Instant;

use super::{
    Granted, TransactionLockKind, TransactionLocks, TxGrantRequest, TxSql, code_of, sealed,
    token_of,
};
use crate::config::SqlDialect;
use crate::dialect::postgres::RUN_FIRST;
use crate::dialect::{first_token, lease_upsert, quote_with};

/// The savepoint a wait runs in.
const SAVEPOINT: &str = "distlock_lock_wait";

/// The statements of `kind` on `table` (validated).
pub(super) fn sql(kind: TransactionLockKind, table: &str) -> Result<TxSql, LockError> {
    Ok(match kind {
        TransactionLockKind::Advisory => {
            // Session mode's own sequence (its name and CREATE).
            let session = crate::dialect::session::SessionSql::new(
                crate::dialect::session_of(SqlDialect::Postgres)?,
                table,
            );
            let seq = &session.counter;
            // CASE evaluates its branches in order and only as needed:
            // nextval runs only once the lock is held, and nothing is
            // locked while the server run is not started (the sequence
            // below 2^40, see `RunSql`): -1 then. Checked in each
            // statement, since a pooler may keep this connection across a
            // server restart, and an xact lock cannot be given back.
            let not_started = format!("WHEN (SELECT last_value FROM {seq}) < {RUN_FIRST} THEN -1");
            let mut create = vec![session.create.clone()];
            create.extend(session.run.iter().map(|run| run.create.clone()));
            TxSql {
                try_grant: format!(
                    "SELECT CASE {not_started} \
                     WHEN pg_try_advisory_xact_lock($1) THEN nextval('{seq}') END"
                ),
                wait_grant: format!(
                    "SELECT CASE {not_started} \
                     WHEN set_config('lock_timeout', $2, true) IS NULL THEN NULL \
                     WHEN pg_advisory_xact_lock($1)::text IS NULL THEN NULL \
                     ELSE nextval('{seq}') END"
                ),
                create,
                session: Some(session),
            }
        }
        TransactionLockKind::Row => {
            let statements =
                crate::keys::Statements::new(crate::dialect::of(SqlDialect::Postgres)?, table);
            let t = quote_with('"', table);
            let first = first_token(&statements.quoted_floor);
            // Row mode's upsert (a free row only, its token bumped), from
            // a gate that took the key's advisory lock, with "now" read
            // from the clock (not the transaction's start) and an expiry
            // of now: the row is free once the transaction commits.
            let upsert = lease_upsert(
                &t,
                &format!("SELECT $1, $2, {first}, clock_timestamp(), $3 FROM g WHERE g.ok"),
                "clock_timestamp()",
                "token",
            );
            let grant = |gate: &str| format!("WITH g AS (SELECT {gate} AS ok OFFSET 0) {upsert}");
            TxSql {
                // A key under a live lease is refused before the advisory
                // lock is taken (a refused try holds nothing).
                try_grant: grant(&format!(
                    "CASE WHEN EXISTS (SELECT 1 FROM {t} WHERE name = $1 \
                     AND expires_at > clock_timestamp()) THEN false \
                     ELSE pg_try_advisory_xact_lock($4) END"
                )),
                wait_grant: grant(
                    "CASE WHEN set_config('lock_timeout', $5, true) IS NULL THEN false \
                     ELSE pg_advisory_xact_lock($4)::text IS NOT NULL END",
                ),
                create: statements.create.iter().map(|s| s.to_string()).collect(),
                session: None,
            }
        }
    })
}

/// A statement's answer when the server run of session mode's tokens is
/// not started (nothing was locked).
const NOT_STARTED: i64 = -1;

/// What one waiting statement did.
enum Waited {
    Granted(u64),
    /// Session mode's server run is not started: nothing was locked.
    NotStarted,
    /// The advisory lock was had, but a live lease holds the row.
    Leased,
    /// `lock_timeout` ran out (the savepoint was rolled back).
    TimedOut,
}

#[async_trait]
impl sealed::Driver for sqlx::Postgres {
    const DIALECT: SqlDialect = SqlDialect::Postgres;

    async fn grant(conn: &mut PgConnection, request: &mut TxGrantRequest<'_>) -> Granted {
        let (locks, key, operation) = (request.locks, request.key, request.operation);
        let op_timeout = locks.config.op_timeout;
        let mut started = false;
        let token = loop {
            let tried = locks
                .pg_grant(
                    &locks.sql.try_grant,
                    key,
                    request.owner.as_str(),
                    &request.details,
                    None,
                )
                .fetch_optional(&mut *conn);
            let row = locks
                .bounded(operation, Some(key), op_timeout, tried)
                .await?;
            let raw = match row {
                Some(row) => row
                    .try_get::<Option<i64>, _>(0)
                    .map_err(|e| locks.failed(operation, Some(key), e))?,
                None => None,
            };
            if raw != Some(NOT_STARTED) {
                break token_of(raw);
            }
            locks.start_run(operation, key, &mut started).await?;
        };
        if token.is_some() {
            return Ok(token);
        }
        let Some(deadline) = request.deadline else {
            return Ok(None);
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let waited = locks.pg_wait(conn, key, request.owner.as_str(), &request.details, left);
            match locks
                .bounded(operation, Some(key), left + op_timeout, waited)
                .await?
            {
                Waited::Granted(token) => return Ok(Some(token)),
                Waited::NotStarted => locks.start_run(operation, key, &mut started).await?,
                Waited::TimedOut => return Ok(None),
                // Row mode: a live lease; poll (the advisory lock is kept,
                // so the next transaction lock waits behind this one).
                Waited::Leased => {
                    if !request.pause().await {
                        return Ok(None);
                    }
                }
            }
        }
    }
}

impl TransactionLocks {
    /// Starts the server run of session mode's tokens (see `RunSql`) on a
    /// connection of its own (the caller's transaction cannot commit the
    /// run's epoch), once per grant: `started` says it was done already,
    /// and a grant that still finds the run not started fails (something
    /// resets the sequence faster than it is started).
    async fn start_run(
        &self,
        operation: lock_core::Operation,
        key: &LockKey,
        started: &mut bool,
    ) -> Result<(), LockError> {
        let not_started = || {
            LockError::new(
                lock_core::ErrorKind::Unavailable,
                operation,
                "the server run of the session tokens was started, yet the token sequence \
                 is still below its base",
            )
            .with_key(key)
            .with_backend(crate::config::NAME)
        };
        let Some(session) = self.sql.session.as_ref().filter(|_| !*started) else {
            return Err(not_started());
        };
        *started = true;
        let dialect = crate::dialect::session_of(SqlDialect::Postgres)?;
        let options = crate::dialect::of(SqlDialect::Postgres)?.connect_options(&self.config)?;
        let start = async {
            let mut conn = options.connect().await?;
            let on = crate::dialect::session::OnSession {
                conn: &mut conn,
                sql: session,
                run_base: 0,
            };
            dialect.start_run(on).await
        };
        self.bounded(operation, Some(key), self.config.op_timeout * 2, start)
            .await
    }

    /// The grant statement `sql` with its binds (`wait_ms` for the wait).
    fn pg_grant<'q>(
        &'q self,
        sql: &'q str,
        key: &'q LockKey,
        owner: &'q str,
        details: &'q str,
        wait_ms: Option<String>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        let lock_key = crate::keys::pg_lock_key(&self.config.table, key.as_str());
        let query = sqlx::query(AssertSqlSafe(sql)).persistent(false);
        let query = match self.kind {
            TransactionLockKind::Advisory => query.bind(lock_key),
            TransactionLockKind::Row => query
                .bind(key.as_str())
                .bind(owner)
                .bind(details)
                .bind(lock_key),
        };
        match wait_ms {
            Some(ms) => query.bind(ms),
            None => query,
        }
    }

    /// One waiting statement of at most `wait`, in a savepoint.
    async fn pg_wait(
        &self,
        conn: &mut PgConnection,
        key: &LockKey,
        owner: &str,
        details: &str,
        wait: Duration,
    ) -> Result<Waited, sqlx::Error> {
        let rows = sqlx::raw_sql(AssertSqlSafe(format!(
            "SAVEPOINT {SAVEPOINT}; SELECT current_setting('lock_timeout')"
        )))
        .fetch_all(&mut *conn)
        .await?;
        let before: String = match rows.last() {
            Some(row) => row.try_get(0)?,
            None => "0".to_owned(),
        };
        // lock_timeout = 0 would mean "wait forever".
        let ms = wait.as_millis().max(1).to_string();
        let granted = self
            .pg_grant(&self.sql.wait_grant, key, owner, details, Some(ms))
            .fetch_optional(&mut *conn)
            .await;
        match granted {
            Ok(row) => {
                let raw = match row {
                    Some(row) => row.try_get::<Option<i64>, _>(0)?,
                    None => None,
                };
                // The lock (acquired in the savepoint) stays the
                // transaction's; lock_timeout goes back to what it was.
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "SELECT set_config('lock_timeout', '{}', true); RELEASE SAVEPOINT {SAVEPOINT}",
                    before.replace('\'', "''")
                )))
                .execute(&mut *conn)
                .await?;
                Ok(match (raw, token_of(raw)) {
                    (Some(NOT_STARTED), _) => Waited::NotStarted,
                    (_, Some(token)) => Waited::Granted(token),
                    (_, None) => Waited::Leased,
                })
            }
            Err(err @ sqlx::Error::Database(_)) => {
                // The statement failed, the transaction with it: back to
                // the savepoint (which also restores lock_timeout).
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "ROLLBACK TO SAVEPOINT {SAVEPOINT}; RELEASE SAVEPOINT {SAVEPOINT}"
                )))
                .execute(&mut *conn)
                .await?;
                // lock_not_available: lock_timeout ran out.
                if code_of(&err).as_deref() == Some("55P03") {
                    Ok(Waited::TimedOut)
                } else {
                    Err(err)
                }
            }
            Err(err) => Err(err),
        }
    }
}
