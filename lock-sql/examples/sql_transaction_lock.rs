//! A transaction-scoped lock: taken inside a transaction of ours, held
//! until that transaction commits or rolls back, with the grant's fencing
//! token written by the work it protects in the same transaction.
//!
//! ```text
//! cargo run -p lock-sql --example sql_transaction_lock
//! DISTLOCK_SQL_URL=postgres://user:pw@localhost/app cargo run -p lock-sql --example sql_transaction_lock
//! DISTLOCK_SQL_URL='postgres://user:pw@localhost/app?mode=session' cargo run -p lock-sql --example sql_transaction_lock
//! ```
//!
//! `DISTLOCK_SQL_URL` names the database (`postgres://`, `mysql://`,
//! `mariadb://`, `sqlite://path`) and optionally `table` and `mode`, as
//! for `lock_sql::connect`: the transaction locks exclude the locks of the
//! backend that URL opens. The default is a SQLite file in the temporary
//! directory.

use std::time::Duration;

use lock_core::LockKey;
use lock_sql::sqlx;
use lock_sql::{SqlConfig, SqlDialect, TransactionLocks};

/// The demo on one pool type: `$begin` is the pool's call that begins a
/// transaction (SQLite: `BEGIN IMMEDIATE`), `$insert` writes the invoice
/// and the token.
macro_rules! demo {
    ($pool:expr, $locks:expr, $begin:ident($($arg:expr)?), $create:expr, $insert:expr) => {{
        let (pool, locks) = ($pool, $locks);
        locks.prepare(&pool).await?;
        sqlx::query($create).execute(&pool).await?;
        let key = LockKey::new("invoices/42")?;

        // The lock and the work it protects, in one transaction.
        let mut tx = pool.$begin($($arg)?).await?;
        let mut guard = locks
            .lock_in(&mut tx, &key, Duration::from_secs(10))
            .await?;
        let token = i64::try_from(guard.token().get())?;
        println!("locked {} in the transaction, token {token}", guard.key());
        sqlx::query($insert)
            .bind(42_i64)
            .bind(token)
            .execute(guard.conn())
            .await?;

        // Meanwhile, another transaction is refused (on SQLite, after
        // the busy timeout: the first transaction holds the file's
        // write lock).
        let mut other = pool.begin().await?;
        let refused = locks.try_lock_in(&mut other, &key).await?.is_none();
        println!("a second transaction is refused while the first is open: {refused}");
        other.rollback().await?;

        // The guard borrows `tx`: it must be gone before the commit,
        // which ends the lock. There is no release call.
        drop(guard);
        tx.commit().await?;
        println!("committed: the lock ended with the transaction");

        let mut next = pool.$begin($($arg)?).await?;
        let again = locks.try_lock_in(&mut next, &key).await?;
        let again = again.map(|g| g.token().get());
        next.rollback().await?;
        println!("the next transaction gets it: token {again:?}; rolled back, which ends it too");
    }};
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DISTLOCK_SQL_URL").unwrap_or_else(|_| {
        let path = std::env::temp_dir().join("distlock-sql-tx-example.db");
        format!("sqlite://{}?busy_timeout=1s", path.display())
    });
    let config = SqlConfig::from_url(&url)?;
    let locks = TransactionLocks::new(&config)?;
    println!(
        "{:?} transaction locks on table {}",
        locks.kind(),
        config.table_name()
    );
    // sqlx's own URL: ours without our options.
    let sqlx_url = url.split('?').next().unwrap_or(&url).to_owned();
    match config.dialect() {
        SqlDialect::Postgres => demo!(
            sqlx::PgPool::connect(&sqlx_url).await?,
            locks,
            begin(),
            "CREATE TABLE IF NOT EXISTS tx_example_invoices (id BIGINT PRIMARY KEY, token BIGINT NOT NULL)",
            "INSERT INTO tx_example_invoices (id, token) VALUES ($1, $2) \
             ON CONFLICT (id) DO UPDATE SET token = excluded.token"
        ),
        SqlDialect::MySql => demo!(
            sqlx::MySqlPool::connect(&sqlx_url).await?,
            locks,
            begin(),
            "CREATE TABLE IF NOT EXISTS tx_example_invoices (id BIGINT PRIMARY KEY, token BIGINT NOT NULL)",
            "INSERT INTO tx_example_invoices (id, token) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE token = VALUES(token)"
        ),
        SqlDialect::Sqlite => {
            let options: sqlx::sqlite::SqliteConnectOptions = sqlx_url.parse()?;
            let options = options
                .create_if_missing(true)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(1));
            demo!(
                sqlx::SqlitePool::connect_with(options).await?,
                locks,
                begin_with("BEGIN IMMEDIATE"),
                "CREATE TABLE IF NOT EXISTS tx_example_invoices (id INTEGER PRIMARY KEY, token INTEGER NOT NULL)",
                "INSERT INTO tx_example_invoices (id, token) VALUES (?1, ?2) \
                 ON CONFLICT (id) DO UPDATE SET token = excluded.token"
            )
        }
        other => return Err(format!("no demo for {other:?}").into()),
    }
    Ok(())
}
