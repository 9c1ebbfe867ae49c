//! Writing data kept in the same etcd as the lock, guarded by the lock
//! itself: the write and the ownership check are one etcd transaction (as
//! Go's `concurrency.Mutex.IsOwner()`), so a holder that lost the lock
//! unawares cannot overwrite a newer holder's data, and the data needs no
//! fencing token.
//!
//! ```text
//! ETCD_URL=etcd://127.0.0.1:2379/locks?ttl=10s cargo run -p lock-etcd --example etcd_guarded_write
//! ```
//!
//! `ETCD_URL` defaults to `etcd://127.0.0.1:2379/locks` (see the crate docs
//! for the URL's options).

use std::time::Duration;

use lock_core::LockClient;
use lock_etcd::EtcdGuardedOutcome;
use lock_etcd::etcd_client::{Compare, CompareOp, Txn, TxnOp};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url =
        std::env::var("ETCD_URL").unwrap_or_else(|_| "etcd://127.0.0.1:2379/locks".to_owned());
    let backend = lock_etcd::connect(&url).await?;
    // The backend is a handle: the lock client and the guarded writes
    // share its connection and sessions.
    let client = LockClient::new(backend.clone());

    let guard = client
        .lock("nightly-report")
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(5))
        .acquire()
        .await?;
    let lease = guard.lease();

    // The simple form: these operations run only if the lease still holds
    // the lock when etcd commits them.
    let put = TxnOp::put("reports/nightly", "written by the holder", None);
    match backend.guarded_txn(&lease, [put]).await? {
        EtcdGuardedOutcome::Written(_) => println!("written while holding the lock"),
        // Stop the work: another holder may be writing.
        EtcdGuardedOutcome::Refused => return Err("the lock was lost: nothing written".into()),
    }

    // The compares in a transaction of your own, beside your own compares
    // (a transaction takes one `when`): here, bump a counter only if it is
    // still the value read.
    let mut kv = backend.client().kv_client();
    let runs = kv.get("reports/nightly-runs", None).await?;
    let (count, version) = runs.kvs().first().map_or((0, 0), |kv| {
        let count = std::str::from_utf8(kv.value())
            .ok()
            .and_then(|v| v.parse().ok());
        (count.unwrap_or(0_u64), kv.version())
    });
    let mut compares = backend.owner_compares(&lease).await?;
    compares.push(Compare::version(
        "reports/nightly-runs",
        CompareOp::Equal,
        version,
    ));
    let txn = Txn::new().when(compares).and_then([TxnOp::put(
        "reports/nightly-runs",
        (count + 1).to_string(),
        None,
    )]);
    if kv.txn(txn).await?.succeeded() {
        println!("run {} recorded", count + 1);
    } else {
        println!("lost the lock, or the counter moved: nothing recorded");
    }

    // After the release the same lease is refused, and nothing is written.
    guard.release().await?;
    let late = TxnOp::put("reports/nightly", "written after the release", None);
    let outcome = backend.guarded_txn(&lease, [late]).await?;
    println!(
        "a write after the release: {}",
        if outcome.is_written() {
            "written (unexpected!)"
        } else {
            "refused"
        }
    );
    assert!(!outcome.is_written());
    let report = kv.get("reports/nightly", None).await?;
    if let Some(kv) = report.kvs().first() {
        println!(
            "reports/nightly = {:?}",
            String::from_utf8_lossy(kv.value())
        );
    }
    Ok(())
}
