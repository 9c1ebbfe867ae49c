//! Waiting for a held lock, with a deadline. Runs with no server:
//!
//!     cargo run -p distlock --example wait_with_deadline

use std::time::{Duration, Instant};

#[tokio::main]
async fn main() -> Result<(), distlock::LockError> {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let holder = distlock::connect(&url).await?;
    let waiter = distlock::connect(&url).await?;

    let guard = holder
        .lock("import")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;

    // Someone else holds it: a short wait ends with a `Contended` error.
    let started = Instant::now();
    match waiter
        .lock("import")
        .wait(Duration::from_millis(300))
        .acquire()
        .await
    {
        Err(e) if e.is_contended() => println!("gave up after {:?}: {e}", started.elapsed()),
        other => panic!("expected contention, got {other:?}"),
    }
    // `try_acquire` never waits.
    assert!(waiter.lock("import").try_acquire().await?.is_none());

    // Release in 200 ms; a waiter with a longer deadline gets it then.
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = guard.release().await;
    });
    let started = Instant::now();
    let next = waiter
        .lock("import")
        .wait(Duration::from_secs(5))
        .acquire()
        .await?;
    println!(
        "got it after {:?}, token {}",
        started.elapsed(),
        next.token()
    );
    next.release().await?;
    Ok(())
}
