//! A lock-holder process for the crash and pause scenarios of the shared
//! suite: `holder <url> <key> <ttl ms> [kind]` takes the lock (or, with a
//! kind code `w`, `r` or `p<count>-<limit>`, that grant of the key's
//! read-write lock or semaphore), keeps it (the guard
//! renews it) while it lives, and exits with status 76 as soon as it learns
//! the lock was lost. With `DISTLOCK_TEST_RESOURCE=127.0.0.1:PORT` in its
//! environment, its work under the lock is to send its fencing token to
//! that address every 20 ms (one connection per write): each turn writes
//! first and looks at the lock after, as a process that was paused without
//! knowing it would.

use std::time::Duration;

use lock_core::LockClient;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, key, ttl_ms, kind) = match args.as_slice() {
        [url, key, ttl_ms] => (url, key, ttl_ms, lock_core::LeaseKind::Exclusive),
        [url, key, ttl_ms, kind] => match lock_core::LeaseKind::from_code(kind) {
            Ok(kind) => (url, key, ttl_ms, kind),
            Err(err) => {
                eprintln!("{err}");
                std::process::exit(2);
            }
        },
        _ => {
            eprintln!("usage: holder <url> <key> <ttl ms> [kind: x, r, w, p<count>-<limit>]");
            std::process::exit(2);
        }
    };
    let Ok(ttl_ms) = ttl_ms.parse::<u64>() else {
        eprintln!("bad TTL {ttl_ms:?}");
        std::process::exit(2);
    };
    let backend = match lock_zk::connect(url).await {
        Ok(backend) => backend,
        Err(err) => {
            eprintln!("{err}");
            std::process::exit(1);
        }
    };
    let guard = match LockClient::new(backend)
        .lock_kind(key, kind)
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
    // First the lease it holds (the scenarios read the holder's TTL from it;
    // conformance::scenarios::LEASE_REPORT), then its work.
    if let Some(addr) = &resource
        && let Ok(mut stream) = std::net::TcpStream::connect(addr)
    {
        use std::io::Write;
        let _ = writeln!(stream, "lease {}", guard.lease().to_handle());
    }
    let reason = match resource {
        None => guard.lost().await,
        Some(addr) => loop {
            if let Ok(mut stream) = std::net::TcpStream::connect(&addr) {
                use std::io::Write;
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

fn lost_reason(guard: &lock_core::LockGuard) -> Option<String> {
    match guard.state() {
        lock_core::LockState::Lost(reason) => Some(reason),
        lock_core::LockState::Released => Some("released".to_owned()),
        _ if !guard.is_held() => Some("the validity deadline passed".to_owned()),
        _ => None,
    }
}
