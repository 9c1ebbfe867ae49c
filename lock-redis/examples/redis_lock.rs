//! Taking a lock on Redis as an application does: connect from a URL, take
//! the lock with a TTL (renewed in the background while held) waiting a
//! bounded time for it, hand the fencing token to the protected resource,
//! stop the work if the lock is lost, release.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p lock-redis --example redis_lock
//! ```
//!
//! Any URL of the crate docs works: `redis+sentinel://`, `redis+cluster://`,
//! `rediss://`, `redlock://` (which has no safe fencing token: the token it
//! reports is a hint only).

use std::time::Duration;

use lock_core::{FencingToken, LockClient};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let backend = lock_redis::connect(&url).await?;
    let client = LockClient::new(backend);

    // Held for 10 s at a time and renewed at about a third of that while
    // the guard lives; wait at most 5 s for another holder to let go
    // (`Contended` after that).
    let guard = client
        .lock("reports/daily")
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(5))
        .acquire()
        .await?;
    let token = guard.token();
    println!("holding reports/daily with fencing token {token}");

    // The work runs only while the lock is held: if renewals fail (the
    // server is gone, the process was paused past the TTL) it is dropped
    // and `run` answers `LeaseLost` before anyone else can be granted the
    // lock.
    match guard.run(write_report(token)).await {
        Ok(rows) => println!("wrote {rows} rows"),
        Err(lost) => {
            eprintln!("lost the lock while working: {lost}");
            return Ok(());
        }
    }

    // An explicit release (dropping the guard also releases, in the
    // background); `false` when the lock had already expired.
    let released = guard.release().await?;
    println!("released: {released}");
    Ok(())
}

/// The protected work. A resource that can check tokens refuses writes
/// with an older token than the last it accepted, e.g.
/// `UPDATE reports SET ..., fence = $token WHERE fence < $token`, so a
/// holder that lost the lock without noticing cannot overwrite the next
/// holder's work.
async fn write_report(token: FencingToken) -> u64 {
    tokio::time::sleep(Duration::from_millis(200)).await;
    token.get() % 100 + 1
}
