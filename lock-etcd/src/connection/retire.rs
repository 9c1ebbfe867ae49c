//! Retiring idle sessions: a session started for a TTL other than the
//! configured one (a lease and its keep-alive stream) is revoked once it
//! has had no entry for [`idle_limit`], so that a client that used many
//! TTLs does not keep a lease and a stream for each of them forever. The
//! next grant of that TTL starts a new session (one lease grant more).
//!
//! Race-free by construction: a session is retired under the sessions
//! map's lock, only when the map holds the last reference to it and it has
//! no entry. Every acquire takes its session out of that map under the same
//! lock (`session_with_room`) and keeps a reference until its entry is
//! claimed, and every cleanup of an entry keeps one too, so no grant can be
//! on its way to a retired session.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::session::{revoke_in_background, ttl_secs};
use super::{Connection, lock};

/// How often the sessions are looked over.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// How long a session must have had no entry to be retired: three of its
/// TTLs, and at least 10 s.
fn idle_limit(ttl: Duration) -> Duration {
    ttl.saturating_mul(3).max(Duration::from_secs(10))
}

/// Starts the connection's sweeper; it ends when the connection is dropped.
pub(super) fn retire_idle_sessions(connection: &Arc<Connection>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(sweep_loop(Arc::downgrade(connection)));
}

async fn sweep_loop(inner: Weak<Connection>) {
    // Lease id -> when its session was first seen idle.
    let mut idle_since: HashMap<i64, Instant> = HashMap::new();
    loop {
        sleep(SWEEP_EVERY).await;
        let Some(inner) = inner.upgrade() else { return };
        sweep(&inner, &mut idle_since, Instant::now());
    }
}

/// One look over the sessions: retires those idle long enough.
fn sweep(inner: &Connection, idle_since: &mut HashMap<i64, Instant>, now: Instant) {
    let kept_secs = ttl_secs(inner.config.ttl);
    let mut retired = Vec::new();
    // Idle sessions kept for now (their idle start is remembered).
    let mut waiting = Vec::new();
    {
        let mut sessions = lock(&inner.sessions);
        for (secs, of_ttl) in sessions.iter_mut() {
            if *secs == kept_secs {
                continue;
            }
            of_ttl.retain(|session| {
                let id = session.lease_id();
                // The map's reference is the only one: no acquire or
                // cleanup is using it, and none can start while we hold
                // the map's lock.
                if Arc::strong_count(session) > 1 || !session.is_idle() {
                    return true;
                }
                let since = *idle_since.entry(id).or_insert(now);
                if now.duration_since(since) < idle_limit(session.server_ttl()) {
                    waiting.push(id);
                    return true;
                }
                retired.push((id, session.server_ttl()));
                false
            });
        }
        sessions.retain(|_, of_ttl| !of_ttl.is_empty());
    }
    idle_since.retain(|id, _| waiting.contains(id));
    for (lease_id, ttl) in retired {
        tracing::debug!(
            target: "lock_etcd",
            "retiring idle session {lease_id:x} (TTL {ttl:?})"
        );
        // Dropping the session ended its keep-alive; revoking frees the
        // lease at once instead of at its TTL.
        revoke_in_background(&inner.client, lease_id, ttl);
    }
}
