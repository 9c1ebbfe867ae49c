//! A lock-holder process for the crash and pause scenarios of the shared
//! suite: `holder <url> <key> <ttl ms>` takes the lock, keeps it (the guard
//! renews it) while it lives, and exits with status 76 as soon as it learns
//! the lock was lost.

use std::time::Duration;

use lock_core::LockClient;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, key, ttl_ms] = args.as_slice() else {
        eprintln!("usage: holder <url> <key> <ttl ms>");
        std::process::exit(2);
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
    let reason = guard.lost().await;
    eprintln!("lock lost: {reason}");
    std::process::exit(76);
}
