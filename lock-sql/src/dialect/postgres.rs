//! PostgreSQL: `now()` is the transaction start (each lock statement is its
//! own transaction), TTLs travel as microseconds, the release notifies
//! waiters in the same statement, a batch renewal sends its rows as three
//! arrays.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{Lease, LockError, LockKey};
use sqlx::Row;

use super::{
    Dialect, Holder, Renewed, SharedNames, bad_option, micros, text, token_of, wrong_conn,
};
use crate::config::SqlConfig;
use crate::conn::{DbConn, DbOptions, DbPool};
use crate::sql::Statements;

/// PostgreSQL.
#[derive(Debug)]
pub(crate) struct Postgres;

fn pg(conn: &mut DbConn) -> Result<&mut sqlx::PgConnection, sqlx::Error> {
    #[allow(irrefutable_let_patterns)] // with only this dialect compiled in
    let DbConn::Postgres(c) = conn else {
        return Err(wrong_conn("postgres"));
    };
    Ok(c)
}

fn options(config: &SqlConfig) -> Result<sqlx::postgres::PgConnectOptions, LockError> {
    config.driver_url().parse().map_err(bad_option(config))
}

#[async_trait]
impl Dialect for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn statements(&self, t: &str) -> Statements {
        let arc = |s: String| -> Arc<str> { Arc::from(s) };
        Statements {
            create: vec![arc(format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                 name VARCHAR(1024) PRIMARY KEY, \
                 owner VARCHAR(64), \
                 token BIGINT NOT NULL, \
                 expires_at TIMESTAMPTZ NOT NULL)"
            ))],
            grant: arc(format!(
                "INSERT INTO {t} AS l (name, owner, token, expires_at) \
                 VALUES ($1, $2, 1, now() + $3 * INTERVAL '1 microsecond') \
                 ON CONFLICT (name) DO UPDATE \
                 SET owner = EXCLUDED.owner, token = l.token + 1, expires_at = EXCLUDED.expires_at \
                 WHERE l.expires_at <= now() \
                 RETURNING token"
            )),
            // The notification is sent at commit, in the same statement.
            release: arc(format!(
                "WITH r AS (UPDATE {t} SET owner = NULL, expires_at = now() \
                 WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > now() \
                 RETURNING name) \
                 SELECT pg_notify($4, name) FROM r"
            )),
            renew: arc(format!(
                "UPDATE {t} SET expires_at = now() + $4 * INTERVAL '1 microsecond' \
                 WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > now()"
            )),
            inspect: arc(format!(
                "SELECT owner, token, \
                 CAST(EXTRACT(EPOCH FROM (expires_at - now())) * 1000000 AS BIGINT) \
                 FROM {t} WHERE name = $1 AND owner IS NOT NULL AND expires_at > now()"
            )),
            quoted_table: t.to_owned(),
        }
    }

    fn notified(&self) -> bool {
        true
    }

    fn fence_predicate(&self, t: &str, n: usize) -> String {
        format!(
            "EXISTS (SELECT 1 FROM {t} WHERE name = ${} AND owner = ${} AND token = ${} \
             AND expires_at > now() FOR SHARE)",
            n,
            n + 1,
            n + 2
        )
    }

    /// One text for any batch size: the rows travel as three arrays.
    fn renew_batch_sql(&self, table: &str, _rows: usize) -> String {
        format!(
            "UPDATE {table} AS l SET expires_at = now() + $1 * INTERVAL '1 microsecond' \
             FROM unnest($2::text[], $3::text[], $4::bigint[]) AS b(name, owner, token) \
             WHERE l.name = b.name AND l.owner = b.owner AND l.token = b.token \
             AND l.expires_at > now() RETURNING l.name, l.owner, l.token"
        )
    }

    /// Arrays: no padding.
    fn batch_rows(&self, leases: usize) -> usize {
        leases
    }

    fn connect_options(&self, config: &SqlConfig) -> Result<DbOptions, LockError> {
        Ok(DbOptions::Postgres(options(config)?))
    }

    fn open(&self, config: &SqlConfig) -> Result<(DbOptions, DbPool), LockError> {
        let o = options(config)?;
        let pool = sqlx::pool::PoolOptions::<sqlx::Postgres>::new()
            .max_connections(crate::conn::pool_size(config))
            .acquire_timeout(config.op_timeout)
            .test_before_acquire(false)
            .connect_lazy_with(o.clone());
        Ok((DbOptions::Postgres(o), DbPool::Postgres(pool)))
    }

    async fn grant(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        key: &LockKey,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query(text(sql))
            .bind(key.as_str())
            .bind(owner)
            .bind(micros(ttl))
            .fetch_optional(pg(conn)?)
            .await?
            .map(|row| row.try_get::<i64, _>(0))
            .transpose()
    }

    async fn release(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        key: &LockKey,
        owner: &str,
        token: i64,
        channel: &str,
    ) -> Result<bool, sqlx::Error> {
        Ok(sqlx::query(text(sql))
            .bind(key.as_str())
            .bind(owner)
            .bind(token)
            .bind(channel)
            .fetch_optional(pg(conn)?)
            .await?
            .is_some())
    }

    async fn renew(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        key: &LockKey,
        owner: &str,
        token: i64,
        ttl: Duration,
    ) -> Result<u64, sqlx::Error> {
        Ok(sqlx::query(text(sql))
            .bind(key.as_str())
            .bind(owner)
            .bind(token)
            .bind(micros(ttl))
            .execute(pg(conn)?)
            .await?
            .rows_affected())
    }

    async fn inspect(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        key: &LockKey,
    ) -> Result<Option<Holder>, sqlx::Error> {
        sqlx::query(text(sql))
            .bind(key.as_str())
            .fetch_optional(pg(conn)?)
            .await?
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
            .transpose()
    }

    async fn renew_batch(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        group: &[&Lease],
        owners: &[String],
        ttl: Duration,
        _rows: usize,
    ) -> Result<Option<Renewed>, sqlx::Error> {
        let names: Vec<&str> = group.iter().map(|l| l.key().as_str()).collect();
        let tokens: Vec<i64> = group.iter().map(|l| token_of(l)).collect();
        let query = sqlx::query(text(sql))
            .bind(micros(ttl))
            .bind(names)
            .bind(owners)
            .bind(tokens);
        let mut renewed = Renewed::new();
        for row in query.fetch_all(pg(conn)?).await? {
            renewed.insert((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?));
        }
        Ok(Some(renewed))
    }

    async fn plain(&self, conn: &mut DbConn, sql: &Arc<str>) -> Result<(), sqlx::Error> {
        sqlx::query(text(sql)).execute(pg(conn)?).await.map(drop)
    }

    fn param(&self, n: usize) -> String {
        format!("${n}")
    }

    fn now_sql(&self) -> &'static str {
        "now()"
    }

    fn plus_micros(&self, micros: &str) -> String {
        format!("now() + {micros} * INTERVAL '1 microsecond'")
    }

    fn left_micros(&self) -> &'static str {
        "CAST(EXTRACT(EPOCH FROM (expires_at - now())) * 1000000 AS BIGINT)"
    }

    fn shared_schema(&self, names: &SharedNames) -> Vec<String> {
        let (keys, holders, waiters) = (&names.keys, &names.holders, &names.waiters);
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {keys} (\
                 name VARCHAR(1024) NOT NULL, shape VARCHAR(16) NOT NULL, \
                 token BIGINT NOT NULL, epoch BIGINT NOT NULL, \
                 PRIMARY KEY (name, shape))"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {holders} (\
                 name VARCHAR(1024) NOT NULL, shape VARCHAR(16) NOT NULL, \
                 owner VARCHAR(64) NOT NULL, kind VARCHAR(32) NOT NULL, \
                 cnt BIGINT NOT NULL, lim BIGINT NOT NULL, token BIGINT NOT NULL, \
                 expires_at TIMESTAMPTZ NOT NULL, \
                 PRIMARY KEY (name, shape, owner))"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {waiters} (\
                 id BIGSERIAL PRIMARY KEY, \
                 name VARCHAR(1024) NOT NULL, shape VARCHAR(16) NOT NULL, \
                 owner VARCHAR(64) NOT NULL, kind VARCHAR(32) NOT NULL, \
                 cnt BIGINT NOT NULL, lim BIGINT NOT NULL, \
                 expires_at TIMESTAMPTZ NOT NULL)"
            ),
            format!(
                "CREATE INDEX IF NOT EXISTS {} ON {waiters} (name, shape, id)",
                names.index
            ),
        ]
    }

    /// `DO UPDATE` locks the row and bumps the counter, in one round trip.
    fn lock_key_sql(&self, keys: &str) -> Vec<String> {
        vec![format!(
            "INSERT INTO {keys} AS k (name, shape, token, epoch) VALUES ($1, $2, $3, 0) \
             ON CONFLICT (name, shape) DO UPDATE SET token = k.token + excluded.token \
             RETURNING token, epoch"
        )]
    }

    fn insert_waiter_sql(&self, waiters: &str) -> Vec<String> {
        vec![format!(
            "INSERT INTO {waiters} (name, shape, owner, kind, cnt, lim, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, now() + $7 * INTERVAL '1 microsecond') RETURNING id"
        )]
    }

    /// The notification is sent at commit, in the same statement.
    fn notifying(&self, statement: &str) -> Option<String> {
        let next = statement.matches('$').count() + 1;
        Some(format!(
            "WITH changed AS ({statement} RETURNING name) \
             SELECT pg_notify(${next}, name) FROM changed"
        ))
    }
}
