//! Tokens, leases and what `inspect` reports.

use std::fmt;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{ErrorKind, LockError, Operation};
use crate::holder::HolderDetails;
use crate::key::LockKey;
use crate::kind::{HolderInfo, LeaseKind};
pub(crate) use crate::owner::OwnerId;
pub(crate) use crate::token::FencingToken;

/// What a backend session says about the leases attached to it. Backends
/// whose leases hang off a session (etcd, ZooKeeper) publish it so the guard
/// can warn its holder before a renewal would have noticed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionState {
    /// Connected and the session is alive.
    Alive,
    /// Disconnected or keep-alives failing: leases may already be gone.
    Suspect,
    /// The session is gone; every lease attached to it is lost.
    Lost(String),
}

/// A granted lock, as a backend returns it.
///
/// It holds everything needed to renew or release the grant, and can be
/// turned into a text handle ([`Lease::to_handle`]) so another process can
/// do so (the `distlock acquire` / `release` commands).
#[derive(Clone)]
pub struct Lease {
    key: LockKey,
    owner: OwnerId,
    token: FencingToken,
    /// In nanoseconds (8 bytes instead of a `Duration`'s 16: a client may
    /// hold 100,000 leases); TTLs beyond 584 years saturate there.
    ttl_ns: u64,
    validity_deadline: Instant,
    /// Boxed: no spare capacity kept per held lease.
    backend_data: Box<str>,
    session: Option<watch::Receiver<SessionState>>,
    /// `None` for the mutex, so a mutex lease allocates nothing for it and
    /// the kind costs 8 bytes per lease (the enum inline would cost 16).
    kind: Option<Box<LeaseKind>>,
}

impl Lease {
    /// Builds a lease for a grant whose request was sent at `sent_at`.
    ///
    /// The local validity deadline is `sent_at + ttl - drift` (see
    /// [`clock_drift`]), measured on the monotonic clock from when the
    /// request was sent, so time spent on the wire counts against the lease.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LeaseLost`] when that deadline has already passed: such a
    /// grant must never be handed out (the caller should release it).
    pub fn granted(
        key: LockKey,
        owner: OwnerId,
        token: FencingToken,
        ttl: Duration,
        sent_at: Instant,
        backend_data: String,
    ) -> Result<Self, LockError> {
        let validity_deadline = validity_deadline(sent_at, ttl);
        if validity_deadline <= Instant::now() {
            return Err(LockError::new(
                ErrorKind::LeaseLost,
                Operation::Acquire,
                "the grant arrived after its validity deadline",
            )
            .with_key(&key));
        }
        Ok(Self::from_parts(
            key,
            owner,
            token,
            ttl,
            validity_deadline,
            backend_data,
        ))
    }

    /// Rebuilds a lease from its parts without a deadline check, e.g. from a
    /// handle read in another process (its deadline is then `now`, so the
    /// lease must be renewed before it counts as valid locally).
    pub fn from_parts(
        key: LockKey,
        owner: OwnerId,
        token: FencingToken,
        ttl: Duration,
        validity_deadline: Instant,
        backend_data: String,
    ) -> Self {
        Self {
            key,
            owner,
            token,
            ttl_ns: ttl_ns(ttl),
            validity_deadline,
            backend_data: backend_data.into_boxed_str(),
            session: None,
            kind: None,
        }
    }

    /// Attaches the session signal of a session-based backend.
    #[must_use]
    pub fn with_session(mut self, session: watch::Receiver<SessionState>) -> Self {
        self.session = Some(session);
        self
    }

    /// Marks what this lease grants (default [`LeaseKind::Exclusive`]).
    #[must_use]
    pub fn with_kind(mut self, kind: LeaseKind) -> Self {
        self.kind = (kind != LeaseKind::Exclusive).then(|| Box::new(kind));
        self
    }

    /// What this lease grants: the mutex, a read or write share, permits.
    pub fn kind(&self) -> LeaseKind {
        self.kind.as_deref().copied().unwrap_or_default()
    }

    /// The key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The owner id of this grant.
    pub fn owner(&self) -> OwnerId {
        self.owner
    }

    /// The fencing token of this grant.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The TTL this lease was granted (and is renewed) with.
    pub fn ttl(&self) -> Duration {
        Duration::from_nanos(self.ttl_ns)
    }

    /// The local monotonic instant after which the lease must be presumed
    /// gone (unless renewed).
    pub fn validity_deadline(&self) -> Instant {
        self.validity_deadline
    }

    /// Moves the validity deadline after a successful renewal.
    pub fn set_validity_deadline(&mut self, deadline: Instant) {
        self.validity_deadline = deadline;
    }

    /// Backend-specific data needed to renew or release (an entry key, a
    /// node path, ...). Opaque to users.
    pub fn backend_data(&self) -> &str {
        &self.backend_data
    }

    /// The session signal, for session-based backends.
    pub fn session(&self) -> Option<&watch::Receiver<SessionState>> {
        self.session.as_ref()
    }

    /// A one-line text handle holding everything needed to renew or release
    /// this lease from another process:
    /// `v1.<owner>.<token>.<ttl ms>.<data hex>.<key hex>`, followed by
    /// `.<kind code>` (see [`LeaseKind::code`]) for any kind but the mutex.
    pub fn to_handle(&self) -> String {
        let mut handle = format!(
            "v1.{}.{}.{}.{}.{}",
            self.owner.to_hex(),
            self.token.get(),
            self.ttl().as_millis(),
            hex_encode(self.backend_data.as_bytes()),
            hex_encode(self.key.as_str().as_bytes()),
        );
        if let Some(kind) = &self.kind {
            handle.push('.');
            handle.push_str(&kind.code());
        }
        handle
    }

    /// Parses a handle made by [`Lease::to_handle`]. The lease's local
    /// deadline is set to now: renew it to learn whether it is still held.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for anything that is not a handle,
    /// including a TTL of zero or above [`MAX_TTL`](crate::MAX_TTL).
    pub fn from_handle(handle: &str) -> Result<Self, LockError> {
        let bad = |why: &str| {
            LockError::invalid_argument(Operation::Validate, format!("bad lock handle: {why}"))
        };
        let parts: Vec<&str> = handle.trim().split('.').collect();
        let (fields, kind) = match parts.as_slice() {
            [fields @ .., kind] if parts.len() == 7 => (fields, Some(*kind)),
            fields => (fields, None),
        };
        let [version, owner, token, ttl, data, key] = fields else {
            return Err(bad("expected 6 or 7 dot-separated fields"));
        };
        let kind = match kind {
            Some(code) => LeaseKind::from_code(code).map_err(|_| bad("kind"))?,
            None => LeaseKind::Exclusive,
        };
        if *version != "v1" {
            return Err(bad("unknown version"));
        }
        let owner = OwnerId::from_hex(owner).map_err(|_| bad("owner"))?;
        let token = token.parse::<u64>().map_err(|_| bad("token"))?;
        let ttl = ttl.parse::<u64>().map_err(|_| bad("ttl"))?;
        let ttl = Duration::from_millis(ttl);
        // No lease is granted outside these bounds, so no real handle has
        // such a TTL (a forged one would otherwise drive deadlines and
        // renewals with absurd durations).
        if ttl.is_zero() || ttl > crate::options::MAX_TTL {
            return Err(bad("ttl out of range"));
        }
        let data = hex_decode(data).ok_or_else(|| bad("backend data"))?;
        let key = hex_decode(key).ok_or_else(|| bad("key"))?;
        let key = LockKey::new(key)?;
        Ok(Self::from_parts(
            key,
            owner,
            FencingToken::new(token),
            ttl,
            Instant::now(),
            data,
        )
        .with_kind(kind))
    }
}

fn ttl_ns(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX)
}

fn hex_encode(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

fn hex_decode(text: &str) -> Option<String> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("token", &self.token)
            .field("kind", &self.kind())
            .field("ttl", &self.ttl())
            .field(
                "valid_for",
                &self
                    .validity_deadline
                    .saturating_duration_since(Instant::now()),
            )
            .finish_non_exhaustive()
    }
}

/// The clock-drift allowance subtracted from a lease's TTL when computing its
/// local validity deadline: 1% of the TTL plus 2 ms (the Redlock rule).
pub fn clock_drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// `sent_at + ttl - clock_drift(ttl)`: the local deadline of a lease whose
/// request was sent at `sent_at`.
pub fn validity_deadline(sent_at: Instant, ttl: Duration) -> Instant {
    let valid_for = ttl.saturating_sub(clock_drift(ttl));
    sent_at.checked_add(valid_for).unwrap_or(sent_at)
}

/// Who holds a key right now, as [`LockBackendExt::inspect`](crate::LockBackendExt::inspect) reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// The key.
    pub key: LockKey,
    /// The holder's owner value as the backend stores it (an owner id in
    /// hex, an etcd lease id, a ZooKeeper node name...).
    pub holder: String,
    /// The holder's fencing token, when the backend has one.
    pub token: Option<FencingToken>,
    /// Time left before the backend frees the key unless renewed, when known.
    pub remaining_ttl: Option<Duration>,
    /// Who took the grant (host, process, program, label, time), when the
    /// holder is one of ours and the backend keeps them.
    pub details: Option<HolderDetails>,
}

impl LockInfo {
    /// Whether two observations of a key name the same grant: the same
    /// holder with the same token, or both free (the remaining TTL and
    /// the details are not compared).
    pub fn same_holder(a: Option<&LockInfo>, b: Option<&LockInfo>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => a.holder == b.holder && a.token == b.token,
            _ => false,
        }
    }
}

impl From<LockInfo> for HolderInfo {
    /// The one holder of a mutex, as `inspect` reported it.
    fn from(info: LockInfo) -> Self {
        Self {
            kind: LeaseKind::Exclusive,
            holder: info.holder,
            token: info.token,
            remaining_ttl: info.remaining_ttl,
            details: info.details,
        }
    }
}

/// Which page of a listing to read: the argument of
/// [`Listing::list`](crate::Listing::list),
/// [`list_shared`](crate::Listing::list_shared) and
/// [`list_elections`](crate::Listing::list_elections).
///
/// ```
/// use lock_core::ListQuery;
///
/// let first = ListQuery::new("jobs/", 100);
/// assert_eq!(first.cursor, None);
/// // The page after one that handed out the cursor "c1":
/// let next = first.next_page(Some("c1".to_owned())).unwrap();
/// assert_eq!(next.cursor.as_deref(), Some("c1"));
/// // A page without a cursor was the last one.
/// assert!(next.next_page(None).is_none());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListQuery {
    /// Only the keys (or election names) that start with this; `""`: all.
    pub prefix: String,
    /// Where to continue: a previous page's `cursor`, as the same backend
    /// handed it out; `None` starts at the beginning.
    pub cursor: Option<String>,
    /// The most entries the page may hold: 1 to
    /// [`MAX_LIST_PAGE`](crate::MAX_LIST_PAGE) (backends refuse others
    /// with [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)).
    pub limit: usize,
}

impl ListQuery {
    /// The first page of the entries under `prefix`, at most `limit` of them.
    pub fn new(prefix: impl Into<String>, limit: usize) -> Self {
        Self {
            prefix: prefix.into(),
            cursor: None,
            limit,
        }
    }

    /// The same query continuing from `cursor` (`None`: from the start).
    #[must_use]
    pub fn after(mut self, cursor: Option<&str>) -> Self {
        self.cursor = cursor.map(str::to_owned);
        self
    }

    /// The query of the page after one whose cursor was `cursor`; `None`
    /// when that page was the last.
    #[must_use]
    pub fn next_page(&self, cursor: Option<String>) -> Option<Self> {
        cursor.map(|cursor| Self {
            prefix: self.prefix.clone(),
            cursor: Some(cursor),
            limit: self.limit,
        })
    }

    /// The cursor, borrowed.
    pub fn cursor(&self) -> Option<&str> {
        self.cursor.as_deref()
    }

    /// Prefix, cursor and limit, borrowed: what a driver's page scan reads.
    pub fn parts(&self) -> (&str, Option<&str>, usize) {
        (&self.prefix, self.cursor(), self.limit)
    }

    /// The same page of the keys under `prefix` instead.
    #[must_use]
    pub fn with_prefix(&self, prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            cursor: self.cursor.clone(),
            limit: self.limit,
        }
    }
}

/// One page of [`Listing::list`](crate::Listing::list).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockPage {
    /// The held locks found, in the backend's scan order.
    pub locks: Vec<LockInfo>,
    /// Where the next page starts; `None` when the scan is complete.
    pub cursor: Option<String>,
}

/// One key's holders in one [`LockShape`](crate::LockShape), as
/// [`Listing::list_shared`](crate::Listing::list_shared) reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedLockInfo {
    /// The key.
    pub key: LockKey,
    /// Its holders (never empty): the readers or the writer of a
    /// read-write lock, the permit holders of a semaphore, the one holder
    /// of a mutex.
    pub holders: Vec<HolderInfo>,
}

/// One page of [`Listing::list_shared`](crate::Listing::list_shared).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedPage {
    /// The held keys found, in the backend's scan order.
    pub locks: Vec<SharedLockInfo>,
    /// Where the next page starts; `None` when the scan is complete.
    pub cursor: Option<String>,
}

/// What [`Admin::gc`](crate::Admin::gc) removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Per-key records removed (token counters, rows).
    pub removed: u64,
    /// Records looked at.
    pub scanned: u64,
    /// The token floor after the run, where the backend keeps one: every
    /// later grant of a removed key gets a token above it.
    pub token_floor: Option<FencingToken>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TTLs are kept in nanoseconds: exact for every real TTL, saturating
    /// (never wrapping) for a nonsense one.
    #[test]
    fn lease_ttls_keep_their_nanoseconds_and_saturate() {
        let key = LockKey::new("k").unwrap();
        let lease = |ttl| {
            Lease::from_parts(
                key.clone(),
                OwnerId::random(),
                FencingToken::new(1),
                ttl,
                Instant::now(),
                String::new(),
            )
        };
        let odd = Duration::new(86_399, 999_999_999);
        assert_eq!(lease(odd).ttl(), odd);
        assert_eq!(lease(Duration::MAX).ttl(), Duration::from_nanos(u64::MAX));
    }

    /// Kept as two halves, an owner still orders and round-trips like the
    /// `u128` it stands for.
    #[test]
    fn owners_order_and_convert_like_u128() {
        let values = [
            0,
            1,
            u128::from(u64::MAX),
            1 << 64,
            (1 << 64) + 1,
            u128::MAX,
        ];
        for &a in &values {
            assert_eq!(OwnerId::from_u128(a).as_u128(), a);
            assert_eq!(OwnerId::from_u128(a).to_hex(), format!("{a:032x}"));
            for &b in &values {
                assert_eq!(OwnerId::from_u128(a).cmp(&OwnerId::from_u128(b)), a.cmp(&b));
            }
        }
    }

    #[tokio::test]
    async fn handle_round_trips() {
        let key = LockKey::new("jobs/nightly.run").unwrap();
        let lease = Lease::granted(
            key.clone(),
            OwnerId::random(),
            FencingToken::new(42),
            Duration::from_secs(5),
            Instant::now(),
            "/locks/a.b/0001".into(),
        )
        .unwrap();
        let back = Lease::from_handle(&lease.to_handle()).unwrap();
        assert_eq!(back.key(), &key);
        assert_eq!(back.owner(), lease.owner());
        assert_eq!(back.token(), FencingToken::new(42));
        assert_eq!(back.ttl(), Duration::from_secs(5));
        assert_eq!(back.backend_data(), "/locks/a.b/0001");
        assert_eq!(back.kind(), LeaseKind::Exclusive);
        let permits = lease.clone().with_kind(LeaseKind::permits(2, 5).unwrap());
        let back = Lease::from_handle(&permits.to_handle()).unwrap();
        assert_eq!(back.kind(), permits.kind());
        assert!(Lease::from_handle(&format!("{}.p9-5", lease.to_handle())).is_err());
        let forged = |ttl: &str| {
            let handle = lease.to_handle();
            let mut parts: Vec<&str> = handle.split('.').collect();
            parts[3] = ttl;
            parts.join(".")
        };
        assert!(Lease::from_handle(&forged("5000")).is_ok());
        for bad in ["0", "86400001", "18446744073709551615"] {
            let err = Lease::from_handle(&forged(bad)).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad}");
        }
        for bad in ["", "v1.x", "v2.a.b.c.d.e", "v1.00.1.1.00.00"] {
            assert!(Lease::from_handle(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn expired_grants_are_refused() {
        let sent = Instant::now()
            .checked_sub(Duration::from_secs(2))
            .unwrap_or_else(Instant::now);
        let err = Lease::granted(
            LockKey::new("k").unwrap(),
            OwnerId::random(),
            FencingToken::new(1),
            Duration::from_secs(1),
            sent,
            String::new(),
        )
        .unwrap_err();
        assert!(err.is_lost());
    }

    #[test]
    fn drift_follows_the_redlock_rule() {
        assert_eq!(
            clock_drift(Duration::from_secs(10)),
            Duration::from_millis(102)
        );
    }
}
