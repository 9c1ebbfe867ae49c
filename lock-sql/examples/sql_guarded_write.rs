//! A write guarded by the lock's own table: the data lives in the database
//! that holds the lease table, so the write itself checks, in the same
//! statement, that the guard still holds its lock (`OwnerPredicate`). No
//! fencing token is needed at the resource; a write after the lock was
//! released, expired or taken over changes no row.
//!
//! ```text
//! cargo run -p lock-sql --example sql_guarded_write
//! DISTLOCK_SQL_URL=postgres://user:pw@localhost/app cargo run -p lock-sql --example sql_guarded_write
//! ```
//!
//! `DISTLOCK_SQL_URL` names the database (`postgres://`, `mysql://`,
//! `mariadb://`, `sqlite://path`) in row mode; the default is a SQLite file
//! in the temporary directory.

use std::error::Error;
use std::time::Duration;

use lock_core::LockClient;
use lock_sql::sqlx::{self, AssertSqlSafe, Database};
use lock_sql::{OwnerPredicate, SqlBackend, SqlDialect};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let url = std::env::var("DISTLOCK_SQL_URL").unwrap_or_else(|_| {
        let path = std::env::temp_dir().join("distlock-sql-guarded.db");
        format!("sqlite://{}", path.display())
    });
    let backend = lock_sql::connect(&url).await?;
    let row = backend
        .as_row()
        .ok_or("the ownership predicate needs row mode (no mode=session, no layout=shedlock)")?
        .clone();
    setup(&row).await?;
    let client = LockClient::new(backend.clone());

    let guard = client
        .lock("reports/nightly")
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(30))
        .acquire()
        .await?;
    println!("holding {} with token {}", guard.key(), guard.token().get());

    // The predicate's placeholders come after the statement's own one.
    let owner = backend.owner_predicate(&guard.lease(), 2)?;
    let status = format!("written under token {}", guard.token().get());
    let rows = guarded_update(&row, &owner, &status).await?;
    println!("guarded write while holding: {rows} row(s) changed");

    guard.release().await?;
    let rows = guarded_update(&row, &owner, "written after release").await?;
    println!("guarded write after release: {rows} row(s) changed (refused)");
    assert_eq!(rows, 0, "a released lease must not write");
    println!("status is now {:?}", read_status(&row).await?);
    Ok(())
}

/// The data table, in the lock's database, and its one row.
async fn setup(row: &SqlBackend) -> Result<(), sqlx::Error> {
    let create = "CREATE TABLE IF NOT EXISTS report_status \
                  (report VARCHAR(100) PRIMARY KEY, status TEXT NOT NULL)";
    let insert = match row.dialect() {
        SqlDialect::MySql => "INSERT IGNORE INTO report_status VALUES ('nightly', 'pending')",
        _ => "INSERT INTO report_status VALUES ('nightly', 'pending') ON CONFLICT DO NOTHING",
    };
    for sql in [create, insert] {
        if let Some(pool) = row.pg_pool() {
            sqlx::query(sql).execute(pool).await?;
        } else if let Some(pool) = row.mysql_pool() {
            sqlx::query(sql).execute(pool).await?;
        } else if let Some(pool) = row.sqlite_pool() {
            sqlx::query(sql).execute(pool).await?;
        }
    }
    Ok(())
}

/// `UPDATE .. WHERE report = 'nightly' AND <owner predicate>`: the rows
/// changed (0 when the lease no longer holds its lock).
async fn guarded_update(
    row: &SqlBackend,
    owner: &OwnerPredicate,
    status: &str,
) -> Result<u64, sqlx::Error> {
    let first = match row.dialect() {
        SqlDialect::Postgres => "$1",
        SqlDialect::MySql => "?",
        _ => "?1",
    };
    let sql = format!(
        "UPDATE report_status SET status = {first} WHERE report = 'nightly' AND {}",
        owner.sql()
    );
    let status = status.to_owned();
    if let Some(pool) = row.pg_pool() {
        let query = statement::<sqlx::Postgres>(&sql, status, owner);
        Ok(query.execute(pool).await?.rows_affected())
    } else if let Some(pool) = row.mysql_pool() {
        let query = statement::<sqlx::MySql>(&sql, status, owner);
        Ok(query.execute(pool).await?.rows_affected())
    } else {
        let pool = row.sqlite_pool().expect("one of the three databases");
        let query = statement::<sqlx::Sqlite>(&sql, status, owner);
        Ok(query.execute(pool).await?.rows_affected())
    }
}

/// `sql` with the status bound first, then the predicate's parameters.
fn statement<DB: Database>(
    sql: &str,
    status: String,
    owner: &OwnerPredicate,
) -> sqlx::query::Query<'static, DB, <DB as Database>::Arguments>
where
    String: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    i64: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
{
    owner.bind(sqlx::query(AssertSqlSafe(sql.to_owned())).bind(status))
}

async fn read_status(row: &SqlBackend) -> Result<String, sqlx::Error> {
    let sql = "SELECT status FROM report_status WHERE report = 'nightly'";
    if let Some(pool) = row.pg_pool() {
        sqlx::query_scalar(sql).fetch_one(pool).await
    } else if let Some(pool) = row.mysql_pool() {
        sqlx::query_scalar(sql).fetch_one(pool).await
    } else {
        let pool = row.sqlite_pool().expect("one of the three databases");
        sqlx::query_scalar(sql).fetch_one(pool).await
    }
}
