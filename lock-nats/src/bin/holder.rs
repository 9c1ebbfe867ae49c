//! A lock-holder process for the crash and pause scenarios of the shared
//! suite: `lock-nats-holder <url> <key> <ttl ms>` takes the mutex, keeps
//! it (the guard renews it) while it lives, and exits with status 76 as
//! soon as it learns the lock was lost. With
//! `DISTLOCK_TEST_RESOURCE=127.0.0.1:PORT` in its environment, its work
//! under the lock is to report its lease, then send its fencing token to
//! that address every 20 ms (one connection per write): each turn writes
//! first and looks at the lock after, as a process that was paused without
//! knowing it would.

use std::io::Write;
use std::time::Duration;

use lock_core::{LockClient, LockGuard, LockState};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, key, ttl_ms] = args.as_slice() else {
        eprintln!("usage: lock-nats-holder <url> <key> <ttl ms>");
        std::process::exit(2);
    };
    let Ok(ttl_ms) = ttl_ms.parse::<u64>() else {
        eprintln!("bad TTL {ttl_ms:?}");
        std::process::exit(2);
    };
    let backend = match lock_nats::connect(url).await {
        Ok(backend) => backend,
        Err(err) => {
            eprintln!("{err}");
            std::process::exit(1);
        }
    };
    let guard = match LockClient::new(backend)
        .lock(key)
        .ttl(Duration::from_millis(ttl_ms))
        .wait(Duration::from_secs(30))
        .acquire()
        .await
    {
        Ok(guard) => guard,
        Err(err) => {
            eprintln!("{err}");
            std::process::exit(1);
        }
    };
    let resource = std::env::var("DISTLOCK_TEST_RESOURCE").ok();
    let token = guard.token().to_string();
    // First the lease it holds (the scenarios read the holder's TTL from
    // it: conformance::scenarios::LEASE_REPORT), then its work.
    if let Some(addr) = &resource
        && let Ok(mut stream) = std::net::TcpStream::connect(addr)
    {
        let _ = writeln!(stream, "lease {}", guard.lease().to_handle());
    }
    let reason = match resource {
        None => guard.lost().await,
        Some(addr) => loop {
            if let Ok(mut stream) = std::net::TcpStream::connect(&addr) {
                let _ = writeln!(stream, "{token}");
            }
            if let Some(reason) = lost_reason(&guard) {
                break reason;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        },
    };
    eprintln!("lock lost: {reason}");
    std::process::exit(76);
}

fn lost_reason(guard: &LockGuard) -> Option<String> {
    match guard.state() {
        LockState::Lost(reason) => Some(reason),
        LockState::Released => Some("released".to_owned()),
        _ if !guard.is_held() => Some("the validity deadline passed".to_owned()),
        _ => None,
    }
}
