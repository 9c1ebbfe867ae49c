//! The loop of a waiting acquire: after each attempt, wait for a release
//! notification or the holder's expiry (never past the deadline), with a
//! backoff after errors; the same loop for every one-server acquire (fair
//! mutex, shared kinds).

use std::time::Duration;

use lock_core::{Lease, LockError, LockKey, RetryPolicy, random_delay};
use tokio::sync::futures::Notified;
use tokio::time::{Instant, sleep_until};

use crate::config::RedisConfig;
use crate::connection::Servers;
use crate::error::still_held;
use crate::grants::attempt::Attempt;

/// What a waiting acquire does after an attempt.
/// Waits before a waiter's next try: until `notified` (a release on the
/// key's channel) or `wait` has passed, never past `deadline`, at which it
/// answers `Contended`.
pub(crate) async fn next_try(
    notified: std::pin::Pin<&mut Notified<'_>>,
    wait: Duration,
    deadline: Instant,
    key: &LockKey,
) -> Result<(), LockError> {
    let wake_at = (Instant::now() + wait).min(deadline);
    tokio::select! {
        () = notified => {}
        () = sleep_until(wake_at) => {}
    }
    if Instant::now() >= deadline {
        return Err(still_held(key));
    }
    Ok(())
}

pub(crate) enum Found {
    Granted(Lease),
    /// Wait (for a release notification, at most this long), then retry.
    Wait(Duration),
}

/// How long a waiter's queue entry lives without a refresh: at most the
/// lease's TTL and three re-check intervals (1.5 s by default), at
/// least 30 ms. A waiter that died stops holding up the queue after it.
pub(crate) fn entry_lease(config: &RedisConfig, ttl: Duration) -> Duration {
    ttl.min(config.recheck * 3).max(Duration::from_millis(30))
}

/// The waiting part of a one-server acquire (the fair mutex, the shared
/// kinds): `attempt` (given its timeout) once; then subscribe to
/// `channel` and attempt again on every release notification, when the
/// blocker's TTL ends and at least every `refresh`, until a grant, a
/// permanent error or `deadline`.
pub(crate) async fn wait_one_server<F, Fut>(
    servers: &Servers,
    key: &LockKey,
    channel: &str,
    deadline: Instant,
    refresh: Duration,
    mut attempt: F,
) -> Result<Lease, LockError>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<Attempt, LockError>>,
{
    let mut errors = None;
    let config = &servers.config;
    let first = attempt(attempt_timeout(config, deadline)).await;
    if let Found::Granted(lease) = found(config, key, first, deadline, &mut errors)? {
        return Ok(lease);
    }
    let watch = servers.notifier.watch(channel, deadline).await;
    loop {
        // Registered before the attempt so a release in between wakes us.
        let notified = watch.notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let result = attempt(attempt_timeout(config, deadline)).await;
        let wait = match found(config, key, result, deadline, &mut errors)? {
            Found::Granted(lease) => return Ok(lease),
            Found::Wait(wait) => wait.min(refresh),
        };
        next_try(notified.as_mut(), wait, deadline, key).await?;
    }
}

/// The bound of one attempt of a waiting acquire: the operation
/// timeout, shortened near the deadline (but never below 100 ms).
pub(crate) fn attempt_timeout(config: &RedisConfig, deadline: Instant) -> Duration {
    let left = deadline.saturating_duration_since(Instant::now());
    config
        .operation_timeout
        .min(left.max(Duration::from_millis(100)))
}

/// What a waiting acquire does after one attempt: return the lease,
/// fail (a permanent error, or the deadline passed), or wait this long
/// (at most) before the next attempt.
pub(crate) fn found(
    config: &RedisConfig,
    key: &LockKey,
    attempt: Result<Attempt, LockError>,
    deadline: Instant,
    errors: &mut Option<lock_core::Backoff>,
) -> Result<Found, LockError> {
    match attempt {
        Ok(Attempt::Granted(lease)) => Ok(Found::Granted(lease)),
        Ok(Attempt::Held { retry_in, split }) => {
            if Instant::now() >= deadline {
                return Err(still_held(key));
            }
            Ok(Found::Wait(if split {
                // Redlock split vote: back off a random time so the
                // contenders do not collide again.
                random_delay(Duration::from_millis(30))
            } else {
                // Expiry publishes nothing: re-check when the holder's
                // TTL runs out, and at least every `recheck`.
                retry_in
                    .map_or(config.recheck, |t| t + Duration::from_millis(1))
                    .min(config.recheck)
            }))
        }
        Err(err) if err.is_temporary() || err.is_lost() => {
            if Instant::now() >= deadline {
                return Err(err);
            }
            let errors = errors.get_or_insert_with(|| {
                RetryPolicy {
                    initial: Duration::from_millis(20),
                    max: Duration::from_millis(500),
                    multiplier: 2,
                    max_attempts: None,
                }
                .backoff()
            });
            Ok(Found::Wait(
                errors.next_delay().unwrap_or(Duration::from_millis(500)),
            ))
        }
        Err(err) => Err(err),
    }
}
