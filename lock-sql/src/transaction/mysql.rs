//! MySQL/MariaDB's transaction locks: row mode's grant in the caller's
//! transaction, refusing at once a row another transaction holds
//! (`innodb_lock_wait_timeout` 0 for the statement on MariaDB, 1 s on
//! MySQL), polled until a wait's deadline.

use async_trait::async_trait;
use lock_core::LockKey;
use sqlx::{AssertSqlSafe, MySqlConnection};

use super::{Granted, TransactionLocks, TxGrantRequest, sealed};
use crate::config::SqlDialect;

/// What one try did.
enum Tried {
    Granted(u64),
    /// Another transaction holds the row (or a live lease).
    Held,
}

impl TransactionLocks {
    /// Whether the server is MariaDB (asked once).
    async fn is_mariadb(&self, conn: &mut MySqlConnection) -> Result<bool, sqlx::Error> {
        if let Some(known) = self.mariadb.get() {
            return Ok(*known);
        }
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&mut *conn)
            .await?;
        let mariadb = version.to_ascii_lowercase().contains("mariadb");
        Ok(*self.mariadb.get_or_init(|| mariadb))
    }

    /// One try: row mode's grant, not waiting for another transaction's
    /// row lock.
    async fn mysql_try(
        &self,
        conn: &mut MySqlConnection,
        key: &LockKey,
        owner: &str,
        details: &str,
    ) -> Result<Tried, sqlx::Error> {
        let mariadb = self.is_mariadb(conn).await?;
        let grant = &self.sql.try_grant;
        let sql = if mariadb {
            format!("SET STATEMENT innodb_lock_wait_timeout = 0 FOR {grant}")
        } else {
            // MySQL: no per-statement form; its minimum is 1 s.
            sqlx::query(
                "SET @distlock_lock_wait = @@SESSION.innodb_lock_wait_timeout, \
                 SESSION innodb_lock_wait_timeout = 1",
            )
            .execute(&mut *conn)
            .await?;
            grant.clone()
        };
        let granted = sqlx::query(AssertSqlSafe(sql))
            .bind(key.as_str().as_bytes())
            .bind(owner)
            .bind(0_i64)
            .bind(details)
            .execute(&mut *conn)
            .await;
        if !mariadb {
            sqlx::query("SET SESSION innodb_lock_wait_timeout = @distlock_lock_wait")
                .execute(&mut *conn)
                .await?;
        }
        match granted {
            Ok(done) => Ok(match done.last_insert_id() {
                0 => Tried::Held,
                token => Tried::Granted(token),
            }),
            // ER_LOCK_WAIT_TIMEOUT / ER_LOCK_NOWAIT: another transaction
            // holds the row; only the statement was rolled back.
            Err(err) if is_lock_wait(&err) => Ok(Tried::Held),
            Err(err) => Err(err),
        }
    }
}

/// Whether `err` is InnoDB's lock wait timeout (or NOWAIT refusal).
fn is_lock_wait(err: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = err else {
        return false;
    };
    let number = db
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(sqlx::mysql::MySqlDatabaseError::number);
    matches!(number, Some(1205 | 3572))
}

#[async_trait]
impl sealed::Driver for sqlx::MySql {
    const DIALECT: SqlDialect = SqlDialect::MySql;

    async fn grant(conn: &mut MySqlConnection, request: &mut TxGrantRequest<'_>) -> Granted {
        let (locks, key, operation) = (request.locks, request.key, request.operation);
        loop {
            let tried = locks.mysql_try(conn, key, request.owner.as_str(), &request.details);
            match locks
                .bounded(operation, Some(key), locks.config.op_timeout, tried)
                .await?
            {
                Tried::Granted(token) => return Ok(Some(token)),
                Tried::Held => {}
            }
            if !request.pause().await {
                return Ok(None);
            }
        }
    }
}
