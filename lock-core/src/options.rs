//! TTL checks, retry policy with backoff and jitter, per-call timeouts.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{ErrorKind, LockError, Operation};
use crate::types::OwnerId;

/// The longest TTL accepted by [`check_ttl`]: one day. A lock held longer
/// should be renewed by its guard instead.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The shortest TTL any backend accepts: 10 ms. [`check_ttl`] enforces it on
/// top of each backend's own minimum.
///
/// Why 10 ms: a lease's local validity is `ttl - clock_drift(ttl)` with a
/// drift of 1% + 2 ms (see [`clock_drift`](crate::clock_drift)), so a TTL of
/// 2 ms or less is born expired and one of a few milliseconds is gone before
/// a reply could be read. At 10 ms the validity is 7.9 ms, about four fifths
/// of the TTL: drift takes at most a fifth, and what is left is still several
/// times the 1 ms granularity of Tokio's timers, so the guard's deadline
/// timer and a first renewal at a third of the TTL remain meaningful.
pub const MIN_TTL_FLOOR: Duration = Duration::from_millis(10);

/// How far in the future a saturated deadline lies: 30 years, as Tokio's own
/// "far future" (any deadline past it is as good as never).
pub const FAR_FUTURE: Duration = Duration::from_secs(60 * 60 * 24 * 365 * 30);

/// `at + by` without overflow: an addition that would overflow (or land
/// beyond [`FAR_FUTURE`]) gives `at + FAR_FUTURE`, a deadline that never
/// comes in practice. Every deadline computed from a user's duration goes
/// through this, so `Duration::MAX` means "never" instead of a panic.
pub fn saturating_add(at: Instant, by: Duration) -> Instant {
    at.checked_add(by.min(FAR_FUTURE))
        // Only reachable for an `at` itself near the end of time.
        .unwrap_or(at)
}

/// Checks a TTL against a backend's minimum, [`MIN_TTL_FLOOR`] and
/// [`MAX_TTL`].
///
/// # Errors
///
/// [`ErrorKind::InvalidArgument`] when `ttl` is zero, below `min_ttl` or
/// [`MIN_TTL_FLOOR`], or above [`MAX_TTL`].
pub fn check_ttl(ttl: Duration, min_ttl: Duration, operation: Operation) -> Result<(), LockError> {
    if ttl.is_zero() {
        return Err(LockError::invalid_argument(
            operation,
            "TTL must be positive",
        ));
    }
    if ttl < MIN_TTL_FLOOR {
        return Err(LockError::invalid_argument(
            operation,
            format!(
                "TTL {ttl:?} is below the minimum of {MIN_TTL_FLOOR:?}: the clock-drift \
                 allowance would leave (almost) no validity"
            ),
        ));
    }
    if ttl < min_ttl {
        return Err(LockError::invalid_argument(
            operation,
            format!("TTL {ttl:?} is below this backend's minimum of {min_ttl:?}"),
        ));
    }
    if ttl > MAX_TTL {
        return Err(LockError::invalid_argument(
            operation,
            format!("TTL {ttl:?} is above the maximum of {MAX_TTL:?}"),
        ));
    }
    Ok(())
}

/// Runs one backend call under its operation timeout.
///
/// # Errors
///
/// The call's own error, or [`ErrorKind::Timeout`] when it did not finish in
/// `timeout` (its outcome is then unknown).
///
/// # Cancel safety
///
/// As cancel-safe as `call` itself.
pub async fn with_timeout<T, F>(
    timeout: Duration,
    operation: Operation,
    call: F,
) -> Result<T, LockError>
where
    F: Future<Output = Result<T, LockError>>,
{
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result,
        Err(_) => Err(LockError::new(
            ErrorKind::Timeout,
            operation,
            format!("no answer within the operation timeout of {timeout:?}"),
        )),
    }
}

/// Exponential backoff with full jitter, a cap, and an optional attempt
/// limit. Used by polling waiters and by the guard's renewal retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first delay before jitter.
    pub initial: Duration,
    /// The largest delay before jitter.
    pub max: Duration,
    /// Growth factor per attempt, at least 1.
    pub multiplier: u32,
    /// Stop after this many retries (`None`: until the deadline).
    pub max_attempts: Option<u32>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(500),
            multiplier: 2,
            max_attempts: None,
        }
    }
}

impl RetryPolicy {
    /// Checks that the policy makes sense: a positive `initial` delay not
    /// above `max`, and a `multiplier` of at least 1.
    ///
    /// A [`Backoff`] copes with any policy without panicking (a zero
    /// multiplier counts as 1, delays are capped at `max`), but these
    /// mistakes would silently mean something else, or a hot retry loop for
    /// a zero delay, so requests refuse them.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] naming the field.
    pub fn validate(&self) -> Result<(), LockError> {
        let bad = |why: String| Err(LockError::invalid_argument(Operation::Validate, why));
        if self.initial.is_zero() {
            return bad("retry policy: the initial delay must be positive".to_owned());
        }
        if self.initial > self.max {
            return bad(format!(
                "retry policy: the initial delay {:?} is above the maximum {:?}",
                self.initial, self.max
            ));
        }
        if self.multiplier == 0 {
            return bad("retry policy: the multiplier must be at least 1".to_owned());
        }
        Ok(())
    }

    /// A fresh backoff sequence following this policy.
    ///
    /// Its jitter is seeded from the OS (so that processes do not retry in
    /// lock-step) at the first [`next_delay`](Backoff::next_delay), not
    /// here: seeding is a system call, and the callers that make a backoff
    /// up front (a waiting acquire) mostly succeed at their first try and
    /// never ask for a delay.
    pub fn backoff(&self) -> Backoff {
        Backoff {
            policy: *self,
            attempt: 0,
            state: UNSEEDED,
        }
    }
}

/// [`Backoff::state`] before the first draw (a seeded state is odd, and
/// xorshift never reaches 0 from a non-zero state).
const UNSEEDED: u64 = 0;

/// The delays of one retry sequence (see [`RetryPolicy`]).
#[derive(Clone, Debug)]
pub struct Backoff {
    policy: RetryPolicy,
    attempt: u32,
    /// The jitter generator's state, [`UNSEEDED`] until the first draw.
    state: u64,
}

impl Backoff {
    /// The next delay, or `None` once `max_attempts` is used up. Each delay
    /// is drawn uniformly from `[ceiling / 2, ceiling]` where the ceiling
    /// grows geometrically up to `max` ("equal jitter": never zero, never
    /// synchronized).
    pub fn next_delay(&mut self) -> Option<Duration> {
        if self
            .policy
            .max_attempts
            .is_some_and(|max| self.attempt >= max)
        {
            return None;
        }
        let factor = self
            .policy
            .multiplier
            .max(1)
            .checked_pow(self.attempt.min(30))
            .unwrap_or(u32::MAX);
        let ceiling = self
            .policy
            .initial
            .checked_mul(factor)
            .unwrap_or(self.policy.max)
            .min(self.policy.max);
        self.attempt = self.attempt.saturating_add(1);
        let half = ceiling / 2;
        let span = u64::try_from((ceiling - half).as_nanos()).unwrap_or(u64::MAX);
        let jitter = match span.checked_add(1) {
            _ if span == 0 => 0,
            Some(modulus) => self.next_random() % modulus,
            // A span of u64::MAX nanoseconds (ceilings near Duration::MAX).
            None => self.next_random(),
        };
        Some(half.saturating_add(Duration::from_nanos(jitter)))
    }

    /// How many delays were handed out.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    fn next_random(&mut self) -> u64 {
        if self.state == UNSEEDED {
            let seed = OwnerId::random().as_u128();
            #[allow(clippy::cast_possible_truncation)] // folding 128 bits into 64 on purpose
            let state = (seed as u64) ^ ((seed >> 64) as u64) | 1;
            self.state = state;
        }
        // xorshift64*: jitter needs spread, not cryptographic strength.
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Parses a duration the one way every part of the family reads them:
/// a number with a unit, `us` (or `µs`), `ms`, `s`, `m` (or `min`), `h`, `d`,
/// optionally several (`1m30s`) or with a fraction (`1.5s`). A bare `0`
/// is zero; any other bare number is refused, because `10` could mean
/// seconds or milliseconds depending on whom you ask.
///
/// Returns `None` for anything else (including overflow); callers turn that
/// into a config error naming the option.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text == "0" {
        return Some(Duration::ZERO);
    }
    if text.is_empty() {
        return None;
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !c.is_ascii_digit() && c != '.')?;
        let (number, tail) = rest.split_at(number_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let nanos_per_unit: u128 = match unit {
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" | "min" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            _ => return None,
        };
        let part = Duration::from_nanos(exact_nanos(number, nanos_per_unit)?);
        total = total.checked_add(part)?;
        rest = tail;
    }
    Some(total)
}

/// `number` (digits with at most one `.`) times `nanos_per_unit`, exactly,
/// rounded half up to a nanosecond; `None` beyond 10^18 ns (about 31
/// years, far beyond any sensible lock duration) or for a malformed number.
fn exact_nanos(number: &str, nanos_per_unit: u128) -> Option<u64> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return None;
    }
    let digits = |text: &str| -> Option<u128> {
        if text.is_empty() {
            return Some(0);
        }
        text.parse::<u128>().ok()
    };
    // Only the first 20 fraction digits can matter at nanosecond precision.
    let fraction = &fraction[..fraction.len().min(20)];
    let scale = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
    let mut nanos = digits(whole)?.checked_mul(nanos_per_unit)?;
    let fraction_nanos = digits(fraction)?.checked_mul(nanos_per_unit)?;
    nanos = nanos.checked_add((fraction_nanos + scale / 2) / scale)?;
    if nanos > 1_000_000_000_000_000_000 {
        return None;
    }
    u64::try_from(nanos).ok()
}

/// A random delay in `[0, max]`, e.g. Redlock's retry delay.
pub fn random_delay(max: Duration) -> Duration {
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    #[allow(clippy::cast_possible_truncation)] // low 64 bits of a random value
    let r = OwnerId::random().as_u128() as u64;
    Duration::from_nanos(r % (nanos + 1))
}

/// A random number in `[0, bound)` (0 when `bound` is 0).
pub(crate) fn random_below(bound: u32) -> u32 {
    if bound == 0 {
        return 0;
    }
    #[allow(clippy::cast_possible_truncation)] // the remainder is below a u32
    let r = (OwnerId::random().as_u128() % u128::from(bound)) as u32;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_exact() {
        // f64 arithmetic rounded this to 630878440.744999936 s.
        assert_eq!(
            parse_duration("630878440745ms"),
            Some(Duration::from_millis(630_878_440_745))
        );
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration(".5s"), Some(Duration::from_millis(500)));
        assert_eq!(
            parse_duration("0.0000000005s"),
            Some(Duration::from_nanos(1))
        );
        for bad in [".s", "1..2s", "1.2.3s", "99999999999999999999999999999h"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn durations_need_a_unit() {
        let ok = [
            ("250ms", Duration::from_millis(250)),
            ("30s", Duration::from_secs(30)),
            ("2m", Duration::from_secs(120)),
            ("1min", Duration::from_secs(60)),
            ("1h", Duration::from_secs(3600)),
            ("30d", Duration::from_secs(30 * 86_400)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5s", Duration::from_millis(1500)),
            ("100us", Duration::from_micros(100)),
            ("0", Duration::ZERO),
            (" 5s ", Duration::from_secs(5)),
        ];
        for (text, want) in ok {
            assert_eq!(parse_duration(text), Some(want), "{text}");
        }
        for bad in [
            "",
            "10",
            "s",
            "5x",
            "-1s",
            "1..5s",
            "s5",
            "1e3s",
            "99999999999h",
            "5 s",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn ttl_bounds() {
        let min = Duration::from_millis(10);
        assert!(check_ttl(Duration::from_secs(1), min, Operation::Acquire).is_ok());
        for bad in [Duration::ZERO, Duration::from_millis(5), MAX_TTL * 2] {
            let err = check_ttl(bad, min, Operation::Acquire).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        }
    }

    #[test]
    fn ttl_floor_applies_whatever_the_backend_says() {
        for bad in [Duration::from_millis(1), Duration::from_millis(5)] {
            let err = check_ttl(bad, Duration::from_nanos(1), Operation::Acquire).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        }
        check_ttl(MIN_TTL_FLOOR, Duration::ZERO, Operation::Acquire).unwrap();
        // The floor keeps most of the TTL as validity.
        let valid = MIN_TTL_FLOOR - crate::clock_drift(MIN_TTL_FLOOR);
        assert!(valid * 4 >= MIN_TTL_FLOOR * 3, "{valid:?}");
    }

    #[test]
    fn backoff_near_duration_max_does_not_overflow() {
        let policy = RetryPolicy {
            initial: Duration::MAX,
            max: Duration::MAX,
            multiplier: u32::MAX,
            max_attempts: Some(40),
        };
        policy.validate().unwrap();
        let mut backoff = policy.backoff();
        while let Some(delay) = backoff.next_delay() {
            assert!(delay >= Duration::MAX / 2);
        }
        let now = Instant::now();
        assert!(saturating_add(now, Duration::MAX) >= now + FAR_FUTURE);
        assert_eq!(
            saturating_add(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
    }

    #[test]
    fn backoff_seeds_its_jitter_at_the_first_delay() {
        let mut backoff = RetryPolicy::default().backoff();
        assert_eq!(
            backoff.state, UNSEEDED,
            "no system call before a delay is asked for"
        );
        backoff.next_delay().expect("no attempt limit");
        assert_ne!(backoff.state, UNSEEDED);
    }

    #[test]
    fn nonsense_retry_policies_are_invalid() {
        let good = RetryPolicy::default();
        good.validate().unwrap();
        for bad in [
            RetryPolicy {
                multiplier: 0,
                ..good
            },
            RetryPolicy {
                initial: Duration::ZERO,
                ..good
            },
            RetryPolicy {
                initial: good.max * 2,
                ..good
            },
        ] {
            let err = bad.validate().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad:?}");
        }
    }

    #[test]
    fn backoff_grows_with_jitter_and_caps() {
        let policy = RetryPolicy {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(80),
            multiplier: 2,
            max_attempts: Some(8),
        };
        let mut backoff = policy.backoff();
        let delays: Vec<Duration> = std::iter::from_fn(|| backoff.next_delay()).collect();
        assert_eq!(delays.len(), 8);
        assert!(delays[0] >= Duration::from_millis(5) && delays[0] <= Duration::from_millis(10));
        for d in &delays[4..] {
            assert!(
                *d >= Duration::from_millis(40) && *d <= Duration::from_millis(80),
                "{d:?}"
            );
        }
        // Two sequences are not identical (jitter is seeded per sequence).
        let a: Vec<_> = std::iter::from_fn({
            let mut b = policy.backoff();
            move || b.next_delay()
        })
        .collect();
        assert_ne!(a, delays);
    }

    #[tokio::test]
    async fn timeout_is_typed() {
        let err = with_timeout(Duration::from_millis(10), Operation::Renew, async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<(), LockError>(())
        })
        .await
        .unwrap_err();
        assert!(err.is_timeout());
        assert_eq!(err.operation(), Operation::Renew);
    }
}
