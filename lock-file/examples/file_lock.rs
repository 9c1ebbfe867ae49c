//! A job that must not run twice at once on this host, protected by a file
//! lock, with the fencing token written beside its output.
//!
//! ```sh
//! cargo run -p lock-file --example file_lock -- /var/lock/myapp
//! # meanwhile, from a shell, the same lock:
//! flock /var/lock/myapp/jobs%2Fnightly.lock echo "the job is not running"
//! ```

use std::time::Duration;

use lock_core::{LockClient, LockError};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| std::env::temp_dir().display().to_string());
    // Bad input (a relative path, a missing directory) is a Config error.
    let backend = lock_file::connect(&format!("file://{dir}")).await?;
    let client = LockClient::new(backend);
    let guard = client
        .lock("jobs/nightly")
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(5))
        .acquire()
        .await?;
    println!(
        "holding jobs/nightly with token {} (a shell's `flock -n {dir}/jobs%2Fnightly.lock true` fails now)",
        guard.token()
    );
    // `run` stops the work if the lock is lost (here: its file deleted).
    let done = guard
        .run(async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            "job done"
        })
        .await?;
    println!("{done}");
    guard.release().await?;
    Ok(())
}
