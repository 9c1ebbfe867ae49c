//! Processes that open a new SQLite file at the same moment: each one's
//! connect waits out the others' schema set-up (WAL switch, table
//! creation) instead of failing with "database is locked". Two `distlock
//! run` commands started together on a fresh file hit exactly this.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use lock_core::{LockBackend, LockBackendExt, LockKey};
use lock_sql::SqlBackend;

const CHILD_DB: &str = "LOCK_SQL_FIRST_OPEN_DB";

fn url_for(path: &std::path::Path) -> String {
    format!("sqlite://{}?ttl=5s", path.display())
}

/// A child process's work (the re-executed test binary): open the file,
/// take and give back one lock. Without the variable it does the same on a
/// file of its own, so it is a real test either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_open_child() {
    let dir = tempfile::tempdir().unwrap();
    let path: std::path::PathBuf = match std::env::var(CHILD_DB) {
        Ok(path) => path.into(),
        Err(_) => dir.path().join("solo.db"),
    };
    // Started together: every process opens the file at the same moment.
    let go = path.with_extension("go");
    if std::env::var(CHILD_DB).is_ok() {
        while !go.exists() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let backend = SqlBackend::connect_url(&url_for(&path)).await.unwrap();
    let key = LockKey::new(format!("first-open/{}", std::process::id())).unwrap();
    let lease = backend
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("a key of its own is free");
    assert!(backend.release(&lease).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_opening_a_new_file_together_all_connect() {
    const FILES: usize = 8;
    const PROCESSES: usize = 8;
    for round in 0..FILES {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.db");
        let children: Vec<_> = (0..PROCESSES)
            .map(|_| {
                Command::new(std::env::current_exe().unwrap())
                    .args([
                        "--exact",
                        "first_open_child",
                        "--nocapture",
                        "--test-threads=1",
                    ])
                    .env(CHILD_DB, &path)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write(path.with_extension("go"), b"").unwrap();
        let what = format!("round {round}: a process failed to open the new file");
        common::all_succeed(children, &what).await;
    }
}
