//! Probe (not a test): the sizes of the futures one SQL row-mode
//! acquire+release cycle creates, on a SQLite file (issue #39: with
//! client, runtime and server on one CPU, a cycle's cost follows the memory
//! it touches, and a future is moved and polled through its whole size).
//! Build in release, as the timing probes are:
//!
//! ```text
//! cargo run --release -p lock-bench --example sql_sizes
//! ```

use std::mem::size_of_val;
use std::time::Duration;

use lock_bench::sql::SqlFloor;
use lock_core::{GrantRequest, LockBackend, LockClient, LockKey};
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TTL: Duration = Duration::from_secs(30);

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("sizes.db").display());
    let backend = lock_sql::SqlBackend::connect_url(&url).await?;
    let key = LockKey::new("sizes")?;
    let report = |what: &str, bytes: usize| println!("{bytes:>6} B  {what}");

    let try_grant = backend.grant(GrantRequest::mutex(&key, TTL));
    report("SqlBackend::grant, try (boxed)", size_of_val(&*try_grant));
    let lease = try_grant.await?.expect("free");
    let release = backend.release(&lease);
    report("SqlBackend::release (boxed)", size_of_val(&*release));
    assert!(release.await?);

    let deadline = Instant::now() + Duration::from_secs(5);
    let waiting = backend.grant(GrantRequest::mutex(&key, TTL).until(deadline));
    report("SqlBackend::grant, waiting (boxed)", size_of_val(&*waiting));
    let lease = waiting.await?.expect("free");
    assert!(backend.release(&lease).await?);

    let client = LockClient::new(backend.clone());
    let acquire = client
        .lock("sizes")
        .ttl(TTL)
        .wait(Duration::from_secs(5))
        .acquire();
    report("LockRequest::acquire, waiting", size_of_val(&acquire));
    let guard = acquire.await?;
    let release = guard.release();
    report("LockGuard::release", size_of_val(&release));
    release.await?;

    let floor = SqlFloor::connect(&url).await?;
    let cycle = floor.cycle("sizes-floor", TTL);
    report(
        "hand floor: SqlFloor::cycle (grant + release)",
        size_of_val(&cycle),
    );
    cycle.await?;
    Ok(())
}
