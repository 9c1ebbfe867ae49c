//! A fenced write to a SQL table: the lock's token goes with the write, and
//! a holder that was paused past its lease is refused with the current
//! token instead of overwriting the newer write. Runs with no server
//! (in-memory locks, a SQLite file):
//!
//!     cargo run -p lock-fence --example fenced_sql_write

use std::time::Duration;

use lock_fence::FenceError;
use lock_fence::sql::SqlFence;
use lock_fence::sqlx::{self, SqlitePool};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let db = SqlitePool::connect(&format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("app.db").display()
    ))
    .await?;
    sqlx::query("CREATE TABLE balance (id INTEGER PRIMARY KEY, amount INTEGER)")
        .execute(&db)
        .await?;
    sqlx::query("INSERT INTO balance VALUES (1, 0)")
        .execute(&db)
        .await?;
    let fence = SqlFence::new();
    fence.create_table(&mut *db.acquire().await?).await?;

    let locks = distlock::connect("memory://example").await?;

    // A writer whose lease runs out while it is paused.
    let paused = locks
        .lock("balance")
        .ttl(Duration::from_millis(300))
        .no_renewal()
        .acquire()
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The next holder writes under its (higher) token.
    let next = locks
        .lock("balance")
        .wait(Duration::from_secs(5))
        .acquire()
        .await?;
    let mut tx = fence.begin(&db, "balance", next.token()).await?;
    sqlx::query("UPDATE balance SET amount = amount + 100 WHERE id = 1")
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    println!("token {} wrote", next.token());
    next.release().await?;

    // The paused writer wakes up and tries to write under its old token.
    match fence.begin(&db, "balance", paused.token()).await {
        Err(FenceError::Stale { token, current, .. }) => {
            println!("token {token} refused: the table already took token {current}");
        }
        Err(other) => return Err(other.into()),
        Ok(_) => unreachable!("a stale token must not write"),
    }
    let amount: i64 = sqlx::query_scalar("SELECT amount FROM balance WHERE id = 1")
        .fetch_one(&db)
        .await?;
    println!("balance {amount}");
    assert_eq!(amount, 100);
    Ok(())
}
