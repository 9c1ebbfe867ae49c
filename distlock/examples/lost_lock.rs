//! Reacting to a lost lock: the guard's state goes Held -> Suspect -> Lost
//! before anyone else can be granted the key, and `run` cancels the work.
//! Runs with no server:
//!
//!     cargo run -p distlock --example lost_lock

use std::time::Duration;

use distlock::LockState;
use distlock::backend::{LockBackendExt, MemoryBackend};
use lock_core::MemoryFault;

#[tokio::main]
async fn main() -> Result<(), distlock::LockError> {
    // The in-memory backend has a fault switch standing in for a server
    // that stops answering.
    let service = MemoryBackend::with_op_timeout(Duration::from_secs(2));
    let client = distlock::LockClient::new(service.clone());
    let guard = client
        .lock("leader")
        .ttl(Duration::from_millis(600))
        .acquire()
        .await?;

    let mut states = guard.subscribe();
    tokio::spawn(async move {
        while states.changed().await.is_ok() {
            let state = states.borrow().clone();
            println!("state: {state:?}");
            if state.is_terminal() {
                break;
            }
        }
    });

    service.set_fault(MemoryFault::Unavailable);
    let result = guard
        .run(async {
            loop {
                // Leader work that must stop when leadership is lost.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
    match result {
        Err(e) if e.is_lost() => println!("work cancelled: {e}"),
        other => panic!("expected a lost lock, got {other:?}"),
    }
    assert!(matches!(guard.state(), LockState::Lost(_)));
    service.set_fault(MemoryFault::None);
    let key = distlock::LockKey::new("leader")?;
    // The holder was told before the service could give the key away: it
    // is still held there for the drift allowance, then free.
    println!(
        "still held by the service at the lost signal: {}",
        service.inspect(&key).await?.is_some()
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    println!(
        "free a moment later: {}",
        service.inspect(&key).await?.is_none()
    );
    Ok(())
}
