//! Fencing a write to a table with the lock's token, so a holder that was
//! paused past its TTL cannot overwrite newer data. Runs with no server
//! (SQLite):
//!
//!     cargo run -p distlock --example fenced_write
//!
//! The protected table remembers the highest token that wrote to it; a
//! write carrying a lower (or equal) token changes nothing.

use std::time::Duration;

use distlock::lock_sql::sqlx::{self, Row};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("app.db");
    let locks = distlock::connect(&format!("sqlite://{}", db.display())).await?;
    let app = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", db.display())).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS balance (id INTEGER PRIMARY KEY, amount INTEGER, last_token INTEGER)",
    )
    .execute(&app)
    .await?;
    sqlx::query("INSERT OR IGNORE INTO balance VALUES (1, 0, 0)")
        .execute(&app)
        .await?;

    // A writer whose lock will expire while it is "paused".
    let slow = locks
        .lock("balance")
        .ttl(Duration::from_millis(300))
        .no_renewal()
        .acquire()
        .await?;
    let stale_token = slow.token();
    tokio::time::sleep(Duration::from_millis(500)).await; // the pause

    // Meanwhile another writer takes the lock and writes.
    let fresh = locks
        .lock("balance")
        .wait(Duration::from_secs(5))
        .acquire()
        .await?;
    let applied = fenced_write(&app, fresh.token().get(), 100).await?;
    println!("fresh writer (token {}) applied: {applied}", fresh.token());
    fresh.release().await?;

    // The paused writer wakes up and writes with its old token: refused.
    let applied = fenced_write(&app, stale_token.get(), -50).await?;
    println!("stale writer (token {stale_token}) applied: {applied}");
    assert!(!applied, "a stale token must not write");

    let row = sqlx::query("SELECT amount, last_token FROM balance WHERE id = 1")
        .fetch_one(&app)
        .await?;
    println!(
        "balance {} (last token {})",
        row.get::<i64, _>(0),
        row.get::<i64, _>(1)
    );
    Ok(())
}

/// One statement: apply the change only if our token is newer than the
/// last one that wrote.
async fn fenced_write(
    pool: &sqlx::SqlitePool,
    token: u64,
    delta: i64,
) -> Result<bool, sqlx::Error> {
    let token = i64::try_from(token).unwrap_or(i64::MAX);
    let done = sqlx::query(
        "UPDATE balance SET amount = amount + ?1, last_token = ?2 WHERE id = 1 AND last_token < ?2",
    )
    .bind(delta)
    .bind(token)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}
