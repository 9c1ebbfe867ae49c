//! What the session-mode crash tests (`session_postgres_restart`,
//! `session_mariadb_restart`) share: grants that collect tokens, and the
//! monotonicity check they apply across a crash of the server.

use std::time::Duration;

use lock_core::{LockBackend, LockBackendExt, LockKey};
use lock_sql::SqlSessionBackend;

/// The TTL of every grant the crash tests take.
pub(crate) const TTL: Duration = Duration::from_secs(30);

/// The monotonicity check: `after` (a token taken after the crash) must be
/// above every token of `before`.
pub(crate) fn rises_above(before: &[u64], after: u64) -> Result<(), String> {
    let highest = before.iter().copied().max().unwrap_or(0);
    if after > highest {
        Ok(())
    } else {
        Err(format!(
            "token {after} after the crash is not above {highest} before it"
        ))
    }
}

/// The broken variant's side of the check: [`rises_above`] must refuse
/// `broken` (the token a broken variant hands out after `before`), else
/// the test fails with `passed`; prints what it caught after `label`.
pub(crate) fn caught_going_back(label: &str, before: &[u64], broken: u64, passed: &str) {
    let caught = rises_above(before, broken);
    assert!(caught.is_err(), "{passed}");
    println!("{label}broken variant caught: {}", caught.unwrap_err());
}

/// `n` try + release cycles over 4 keys: the tokens.
pub(crate) async fn grants(backend: &SqlSessionBackend, prefix: &str, n: usize) -> Vec<u64> {
    let mut tokens = Vec::with_capacity(n);
    for i in 0..n {
        let key = LockKey::new(format!("{prefix}/{}", i % 4)).unwrap();
        let lease = backend.try_acquire(&key, TTL).await.unwrap().unwrap();
        tokens.push(lease.token().get());
        assert!(backend.release(&lease).await.unwrap());
    }
    tokens
}
