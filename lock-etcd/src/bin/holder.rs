//! A holder process for the fault scenarios (`tests/scenarios.rs`, which
//! find it as `CARGO_BIN_EXE_lock-etcd-holder`; not a user tool):
//! `lock-etcd-holder <url> <key> <ttl ms> [kind code]` takes the lock, or with a kind
//! code (`w`, `r`, `p<count>-<limit>`) that grant of the key's read-write
//! lock or semaphore, holds it (its guard renews) and exits with status 76
//! once it learns the grant is lost. With `DISTLOCK_TEST_RESOURCE=host:port`
//! set, its work is to send its fencing token there every 20 ms (write
//! first, look at the lock after, as a process paused unawares would).

use std::io::Write;
use std::time::Duration;

use lock_core::{LeaseKind, LockClient, LockGuard, LockState};

fn fail(message: impl std::fmt::Display, code: i32) -> ! {
    eprintln!("{message}");
    std::process::exit(code)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, key, ttl_ms, kind) = match args.as_slice() {
        [url, key, ttl] => (url, key, ttl, LeaseKind::Exclusive),
        [url, key, ttl, code] => (
            url,
            key,
            ttl,
            LeaseKind::from_code(code).unwrap_or_else(|e| fail(e, 2)),
        ),
        _ => fail(
            "usage: lock-etcd-holder <url> <key> <ttl ms> [x|r|w|p<count>-<limit>]",
            2,
        ),
    };
    let ttl = ttl_ms
        .parse::<u64>()
        .map(Duration::from_millis)
        .unwrap_or_else(|_| fail(format!("bad TTL {ttl_ms:?}"), 2));
    let backend = lock_etcd::connect(url).await.unwrap_or_else(|e| fail(e, 1));
    let guard = LockClient::new(backend)
        .lock_kind(key, kind)
        .ttl(ttl)
        .wait(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap_or_else(|e| fail(e, 1));
    let reason = match std::env::var("DISTLOCK_TEST_RESOURCE").ok() {
        None => guard.lost().await,
        Some(addr) => {
            let token = guard.token().to_string();
            // First the lease it holds (the scenarios read the holder's TTL
            // from it; conformance::scenarios::LEASE_REPORT), then its work.
            if let Ok(mut stream) = std::net::TcpStream::connect(&addr) {
                let _ = writeln!(stream, "lease {}", guard.lease().to_handle());
            }
            loop {
                if let Ok(mut stream) = std::net::TcpStream::connect(&addr) {
                    let _ = writeln!(stream, "{token}");
                }
                if let Some(reason) = gone(&guard) {
                    break reason;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    fail(format!("lock lost: {reason}"), 76)
}

/// Why the guard no longer holds, if it does not.
fn gone(guard: &LockGuard) -> Option<String> {
    match guard.state() {
        LockState::Lost(reason) => Some(reason),
        LockState::Released => Some("released".to_owned()),
        _ if !guard.is_held() => Some("the validity deadline passed".to_owned()),
        _ => None,
    }
}
