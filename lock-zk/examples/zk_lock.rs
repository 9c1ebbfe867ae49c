//! Using the ZooKeeper driver: connect from a URL, take a lock with a TTL
//! and a wait, hand its fencing token to the resource it protects, stop the
//! work if the lock is lost, and release it.
//!
//! ```text
//! DISTLOCK_ZK_URL='zk://127.0.0.1:2181/myapp?session_timeout=10s' \
//!     cargo run -p lock-zk --example zk_lock
//! ```

use std::time::Duration;

use lock_core::{FencingToken, LockClient, LockError};

/// The resource the lock protects. A real one (a database row, a file
/// store) refuses writes carrying a token lower than the last it accepted:
/// `UPDATE report SET ... WHERE last_token < $token`.
async fn write_report(token: FencingToken) {
    println!("writing the nightly report with fencing token {token}");
    tokio::time::sleep(Duration::from_millis(500)).await;
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::var("DISTLOCK_ZK_URL")
        .unwrap_or_else(|_| "zk://127.0.0.1:2181/distlock-example".to_owned());
    let client = LockClient::new(lock_zk::connect(&url).await?);

    // Held for at most 30 s without a renewal (the guard renews it in the
    // background while it lives); wait up to 10 s for another holder.
    let guard = client
        .lock("nightly-report")
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;

    // The work runs only while the lock is held: if the ZooKeeper session
    // expires (or renewal fails), `run` drops the work and says why.
    match guard.run(write_report(guard.token())).await {
        Ok(()) => println!("report written"),
        Err(lost) => eprintln!("lock lost before the report was done: {lost}"),
    }

    // `true`: we still held it; `false`: it was lost or taken over, and
    // nothing of anyone else's was touched.
    let held = guard.release().await?;
    println!("released (still held at release: {held})");
    Ok(())
}
