//! Take a lock, do work under it, give it back. Runs with no server:
//!
//!     cargo run -p distlock --example basic
//!     cargo run -p distlock --example basic -- sqlite:///tmp/locks.db

use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), distlock::LockError> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".to_owned());
    let client = distlock::connect(&url).await?;
    println!(
        "backend {} ({:?})",
        client.backend().name(),
        client.capabilities().fencing
    );

    let guard = client
        .lock("reports/nightly")
        .ttl(Duration::from_secs(10))
        .acquire()
        .await?;
    println!("holding with fencing token {}", guard.token());
    // The guard renews in the background; `run` stops the work if the lock
    // is lost.
    let rows = guard
        .run(async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            42
        })
        .await?;
    println!("work done: {rows} rows");
    let still_held = guard.release().await?;
    println!("released (still held at release: {still_held})");

    // Or in one call:
    let sum = client.with_lock("reports/nightly", async { 1 + 2 }).await?;
    println!("with_lock returned {sum}");
    Ok(())
}
