//! The helpers of `tests/shared.rs`, and the one check of the shared kinds
//! the conformance suite has no case for: semaphore permits are granted in
//! arrival order (a big waiting request is not overtaken), a function
//! returning `Err(why)` on a violation, shown failing on a double whose
//! permit requests do not queue. Exclusion of readers and writers, their
//! tokens, writer preference, downgrade without a gap and the permit limit
//! are the suite's cases (`conformance::cases::shared`), which
//! `tests/conformance.rs` runs on one server, Cluster and Sentinel.

use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::redis::RedisServer;
use lock_core::{
    ErrorKind, GrantRequest, Lease, LeaseKind, LockBackend, LockBackendExt, LockError, LockKey,
    LockWrapper, async_trait,
};
use lock_redis::{RedisBackend, RedisConfig};
use tokio::time::{Instant, sleep};

pub(crate) type Check = Result<(), String>;

pub(crate) const TTL: Duration = Duration::from_secs(5);

pub(crate) fn key(name: &str) -> LockKey {
    LockKey::new(format!("{name}-{:x}", rand_suffix())).expect("key")
}

pub(crate) fn rand_suffix() -> u64 {
    u64::try_from(lock_core::OwnerId::random().as_u128() >> 64).unwrap_or(0)
}

pub(crate) fn permits(count: u32, limit: u32) -> LeaseKind {
    LeaseKind::permits(count, limit).expect("valid permits")
}

pub(crate) fn soon(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

pub(crate) async fn single() -> Option<(RedisServer, RedisBackend)> {
    let server = RedisServer::start().await.or_skip()?;
    let backend = RedisBackend::connect(RedisConfig::from_url(&server.url()).unwrap())
        .await
        .expect("connect");
    Some((server, backend))
}

pub(crate) async fn take(
    b: &dyn LockBackend,
    k: &LockKey,
    kind: LeaseKind,
) -> Result<Option<Lease>, String> {
    b.try_acquire_kind(k, kind, TTL)
        .await
        .map_err(|e| format!("try {kind}: {e}"))
}

/// Every Redis key of `k` left is a token counter (kept forever, like the
/// mutex's): no share, queue entry or holder detail outlived its holder.
pub(crate) async fn assert_only_counters_left(
    conn: &mut redis::aio::MultiplexedConnection,
    k: &LockKey,
) {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{k}*"))
        .query_async(conn)
        .await
        .unwrap();
    keys.sort();
    assert!(
        keys.iter().all(|name| name.ends_with(":counters")),
        "left behind: {keys:?}"
    );
}

// ---------------------------------------------------------------- checks

/// Whether tries of `kind` start being refused within 2 s (a waiter just
/// spawned needs a moment to queue; a try that got in before it did is
/// released at once and tried again).
pub(crate) async fn refused_soon(
    b: &dyn LockBackend,
    k: &LockKey,
    kind: LeaseKind,
) -> Result<bool, String> {
    let start = Instant::now();
    sleep(Duration::from_millis(50)).await;
    while start.elapsed() < Duration::from_secs(2) {
        match take(b, k, kind).await? {
            None => return Ok(true),
            Some(lease) => {
                b.release(&lease).await.map_err(|e| e.to_string())?;
            }
        }
        sleep(Duration::from_millis(20)).await;
    }
    Ok(false)
}

/// FIFO: a big waiting request at the head is not overtaken by a small
/// later one, and gets its permits when they free.
pub(crate) async fn check_semaphore_fifo(b: Arc<dyn LockBackend>, k: &LockKey) -> Check {
    let two = take(&*b, k, permits(2, 3)).await?.ok_or("2 of 3 refused")?;
    let big = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move { b.acquire_kind(&k, permits(3, 3), TTL, soon(4_000)).await })
    };
    if !refused_soon(&*b, k, permits(1, 3)).await? {
        b.release(&two).await.map_err(|e| e.to_string())?;
        let _ = big.await;
        return Err("a later request for 1 permit overtook a waiting request for 3".into());
    }
    b.release(&two).await.map_err(|e| e.to_string())?;
    let all = big
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the waiting request for 3: {e}"))?;
    if all.token() <= two.token() {
        return Err(format!(
            "permit token {} not above {}",
            all.token(),
            two.token()
        ));
    }
    b.release(&all).await.map_err(|e| e.to_string())?;
    Ok(())
}

// --------------------------------------------------------- broken double

/// The real backend whose waiting permit requests poll tries instead of
/// queueing (no FIFO): what `check_semaphore_fifo` must catch. Every other
/// call goes through unchanged.
#[derive(Debug)]
pub(crate) struct PermitsDoNotQueue {
    inner: RedisBackend,
}

impl PermitsDoNotQueue {
    pub(crate) fn wrap(inner: &RedisBackend) -> Arc<dyn LockBackend> {
        Arc::new(Self {
            inner: inner.clone(),
        })
    }
}

#[async_trait]
impl LockWrapper for PermitsDoNotQueue {
    fn inner(&self) -> &dyn LockBackend {
        &self.inner
    }
    fn name(&self) -> &'static str {
        "broken-redis"
    }
    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let GrantRequest {
            key,
            kind,
            ttl,
            deadline,
        } = request;
        let (LeaseKind::Permits { .. }, Some(deadline)) = (kind, deadline) else {
            return self.inner.grant(request).await;
        };
        loop {
            if let Some(lease) = self.inner.try_acquire_kind(key, kind, ttl).await? {
                return Ok(Some(lease));
            }
            if Instant::now() >= deadline {
                return Err(LockError::new(
                    ErrorKind::Contended,
                    lock_core::Operation::Acquire,
                    "held",
                ));
            }
            sleep(Duration::from_millis(5)).await;
        }
    }
}
