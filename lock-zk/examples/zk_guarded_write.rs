//! A write guarded by the lock's own store: the data lives in the same
//! ZooKeeper ensemble as the lock, so the write goes in a `multi` whose
//! first operation checks the lock's node. The write lands only while the
//! lock is held, atomically with that check, and the data needs no fencing
//! token. After the release the same write is refused and changes nothing.
//!
//! ```text
//! DISTLOCK_ZK_URL='zk://127.0.0.1:2181/myapp?session_timeout=10s' \
//!     cargo run -p lock-zk --example zk_guarded_write
//! ```

use std::time::Duration;

use lock_core::{LockClient, LockError};
use lock_zk::zookeeper_client as zk;
use lock_zk::{ZkBackend, ZkGuardedOutcome};

/// The data node the lock protects (inside the URL's chroot, as the lock).
const CONFIG: &str = "/app-config";

/// Writes `value` to [`CONFIG`] if `lease` holds its lock: a create
/// the first time, a set afterwards, in one `multi` with the owner check.
async fn write_config(
    backend: &ZkBackend,
    lease: &lock_core::Lease,
    value: &str,
    exists: bool,
) -> Result<ZkGuardedOutcome, LockError> {
    backend
        .guarded_multi(lease, |multi| {
            if exists {
                multi.add_set_data(CONFIG, value.as_bytes(), None)
            } else {
                let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                multi.add_create(CONFIG, value.as_bytes(), &options)
            }
        })
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DISTLOCK_ZK_URL")
        .unwrap_or_else(|_| "zk://127.0.0.1:2181/distlock-example".to_owned());
    let backend = lock_zk::connect(&url).await?;
    // The application's own session, to read the data: rooted at the same
    // chroot, so that it sees the same paths as the backend.
    let config = backend.config();
    let chroot = config.chroot().unwrap_or("");
    let data = zk::Client::connector()
        .connect(&format!("{}{chroot}", config.connect_string()))
        .await?;
    let client = LockClient::new(backend.clone());

    let guard = client
        .lock("app-config")
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;
    let lease = guard.lease();
    let exists = data.check_stat(CONFIG).await?.is_some();
    let value = format!("written under fencing token {}", guard.token());
    match write_config(&backend, &lease, &value, exists).await? {
        ZkGuardedOutcome::Written(_) => println!("written: {value:?}"),
        ZkGuardedOutcome::Refused => println!("the lock was lost: nothing written"),
        ZkGuardedOutcome::OperationFailed { index, error } => {
            // Another writer created or deleted the node meanwhile.
            println!("operation {index} failed ({error}): nothing written");
        }
    }
    println!("{CONFIG} holds {:?}", read(&data).await?);

    guard.release().await?;
    // The lease's node is gone: the same write is refused.
    let outcome = write_config(&backend, &lease, "too late", true).await?;
    println!("after the release: {outcome:?}");
    assert!(outcome.is_refused());
    println!("{CONFIG} still holds {:?}", read(&data).await?);
    Ok(())
}

async fn read(data: &zk::Client) -> Result<String, zk::Error> {
    let (bytes, _) = data.get_data(CONFIG).await?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
