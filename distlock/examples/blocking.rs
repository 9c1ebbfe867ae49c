//! The blocking API: no async code, no server (the in-memory backend; put
//! any backend URL in `DISTLOCK_URL` to use it instead).
//!
//! `cargo run -p distlock --example blocking`

use std::thread;
use std::time::Duration;

use distlock::blocking::Client;

fn main() -> Result<(), distlock::LockError> {
    let url = std::env::var("DISTLOCK_URL").unwrap_or_else(|_| "memory://example".into());
    let client = Client::connect(&url)?;
    // Two threads want the same lock; the second waits for the first.
    let workers: Vec<_> = (0..2)
        .map(|n| {
            let client = client.clone();
            thread::spawn(move || -> Result<(), distlock::LockError> {
                let guard = client
                    .lock("reports/nightly")
                    .ttl(Duration::from_secs(5))
                    .wait(Duration::from_secs(10))
                    .acquire()?;
                println!("worker {n}: holding with token {}", guard.token());
                // Blocking work while the guard renews on its own thread.
                thread::sleep(Duration::from_millis(200));
                assert!(guard.is_held());
                guard.release()?;
                println!("worker {n}: released");
                Ok(())
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker thread")?;
    }
    // An election, as a blocking call.
    let leading = client.elect("scheduler", Duration::from_secs(5), Duration::from_secs(5))?;
    println!("leading in term {}", leading.token());
    leading.release()?;
    Ok(())
}
