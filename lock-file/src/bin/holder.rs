//! `lock-file-holder <file:///dir> <key>`: takes the mutex `key` (waiting
//! up to 10 s), prints `token <n>` on one line, and holds it until its
//! standard input closes (then releases) or the process is killed (then
//! the kernel frees it). The crate's tests use it as a holder process.

use std::io::{BufRead, Write};
use std::time::Duration;

use lock_core::{LockBackend, LockBackendExt, LockKey};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(key)) = (args.next(), args.next()) else {
        return Err("usage: lock-file-holder <file:///dir> <key>".into());
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    runtime.block_on(async {
        let backend = lock_file::connect(&url).await?;
        let key = LockKey::new(key)?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let lease = backend
            .acquire(&key, Duration::from_secs(60), deadline)
            .await?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "token {}", lease.token())?;
        out.flush()?;
        drop(out);
        // Hold until stdin closes.
        for line in std::io::stdin().lock().lines() {
            line?;
        }
        let held = backend.release(&lease).await?;
        eprintln!("released (held: {held}) by {}", backend.name());
        Ok(())
    })
}
