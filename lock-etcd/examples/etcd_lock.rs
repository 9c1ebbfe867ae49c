//! Taking a lock on etcd, as an application does: connect from a URL, take
//! the lock with a TTL and a bounded wait, hand the fencing token to the
//! resource the lock protects, stop the work if the lock is lost, release.
//!
//! ```text
//! ETCD_URL=etcd://127.0.0.1:2379/locks?ttl=10s cargo run -p lock-etcd --example etcd_lock
//! ```
//!
//! `ETCD_URL` defaults to `etcd://127.0.0.1:2379/locks` (see the crate docs
//! for the URL's options: several endpoints, TLS with `etcds://`, user and
//! password).

use std::time::Duration;

use lock_core::{LockClient, LockError};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url =
        std::env::var("ETCD_URL").unwrap_or_else(|_| "etcd://127.0.0.1:2379/locks".to_owned());
    let backend = lock_etcd::connect(&url).await?;
    let client = LockClient::new(backend);

    // Held for at most 10 s past the last renewal (the guard renews it on
    // its own every few seconds); wait at most 5 s for it.
    let guard = client
        .lock("nightly-report")
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(5))
        .acquire()
        .await?;

    // The fencing token grows with every grant of the key: the resource
    // refuses writes that carry a token lower than one it has seen, so a
    // holder that lost the lock unawares cannot overwrite a newer one.
    let token = guard.token();
    println!("holding nightly-report with fencing token {token}");

    // The work runs only while the lock is held: if renewal fails (etcd
    // unreachable, the entry deleted by an operator), `run` drops the work
    // and says why.
    let work = async {
        // e.g. UPDATE reports SET ... , last_token = $token
        //      WHERE last_token < $token
        tokio::time::sleep(Duration::from_secs(1)).await;
        "report written"
    };
    match guard.run(work).await {
        Ok(done) => println!("{done}"),
        Err(lost) => {
            eprintln!("the lock was lost, the work was stopped: {lost}");
            return Err(lost);
        }
    }

    // Give the lock back at once (dropping the guard would too, in the
    // background; a crashed process's lock frees after its TTL).
    let released = guard.release().await?;
    println!("released: {released}");
    Ok(())
}
