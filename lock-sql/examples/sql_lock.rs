//! Using the SQL driver: take a lock with a TTL, waiting for it; use the
//! guard's fencing token on the resource it protects; stop the work if the
//! lock is lost; release it.
//!
//! ```text
//! cargo run -p lock-sql --example sql_lock
//! DISTLOCK_SQL_URL=postgres://user:pw@localhost/app cargo run -p lock-sql --example sql_lock
//! ```
//!
//! `DISTLOCK_SQL_URL` names the database (`postgres://`, `mysql://`,
//! `mariadb://`, `sqlite://path`); the default is a SQLite file in the
//! temporary directory, which every process on this host can share. Run
//! two at once to see the second wait for the first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_core::{FencingToken, LockClient, LockError};

/// A resource that checks fencing tokens: it accepts a write only with a
/// token above the last one it saw, so a holder that lost its lock (paused,
/// cut off) cannot overwrite the work of the next one. In a database of
/// your own, the same check is `UPDATE .. WHERE last_token < $token`, or
/// `SqlBackend::owner_predicate` in the lock's own database (see the
/// `guarded_write` example).
#[derive(Default)]
struct Resource {
    last_token: AtomicU64,
}

impl Resource {
    fn write(&self, token: FencingToken, what: &str) -> Result<(), String> {
        let token = token.get();
        let previous = self.last_token.fetch_max(token, Ordering::SeqCst);
        if token <= previous {
            return Err(format!(
                "stale token {token} (last seen {previous}): refused"
            ));
        }
        println!("resource: wrote {what:?} with token {token}");
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::var("DISTLOCK_SQL_URL").unwrap_or_else(|_| {
        let path = std::env::temp_dir().join("distlock-sql-example.db");
        format!("sqlite://{}", path.display())
    });
    let client = LockClient::new(lock_sql::connect(&url).await?);
    let resource = Resource::default();

    // Held for at most 10 s without renewal (the guard renews it in the
    // background); wait up to 30 s while another process holds it.
    let guard = client
        .lock("reports/nightly")
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(30))
        .acquire()
        .await?;
    let token = guard.token();
    println!("holding {} with fencing token {}", guard.key(), token.get());

    // The work runs while the lock is held; if the lock is lost (the
    // database unreachable past the TTL, the row taken over), `run` stops
    // it and answers the loss instead.
    let outcome = guard
        .run(async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            resource.write(token, "nightly report")
        })
        .await;
    match outcome {
        Ok(Ok(())) => println!("work done"),
        Ok(Err(refused)) => println!("the resource refused the write: {refused}"),
        Err(lost) => println!("lock lost, work stopped: {lost}"),
    }

    let released = guard.release().await?;
    println!("released: {released}");
    Ok(())
}
