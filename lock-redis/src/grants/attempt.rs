//! What one acquire attempt found, and the pieces every acquire script
//! call takes.

use std::time::Duration;

use lock_core::{FencingToken, Lease, LockError, LockKey, Operation, OwnerId};
use tokio::time::Instant;

use crate::error::NAME;
use crate::keys::replies::{pttl, ttl_ms};

/// What one acquire attempt found.
pub(crate) enum Attempt {
    Granted(Lease),
    /// Someone else holds the key; `retry_in` is when it expires at the
    /// latest (from its PTTL) or `None` when unknown. `split` says that a
    /// Redlock attempt won some nodes but not a majority.
    Held {
        retry_in: Option<Duration>,
        split: bool,
    },
}

impl Attempt {
    /// Refused by a one-server script that answered the blocker's PTTL
    /// `ms`; -1 is a foreign holder without TTL: re-check at the interval.
    pub(crate) fn held(ms: i64) -> Self {
        Self::Held {
            retry_in: (ms != -1).then(|| pttl(ms).unwrap_or(Duration::ZERO)),
            split: false,
        }
    }
}

/// One acquire script call on one server (fair mutex, shared kinds), as
/// every attempt of an acquire sends it: the key, the lease TTL, the
/// owner (the same for every attempt of one waiting acquire: it is the
/// queue entry's id), the waiting entry's lease and the operation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AcquireCall<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) ttl: Duration,
    pub(crate) owner: OwnerId,
    /// Join the queue (or refresh our entry) with an entry lease that long
    /// when refused; `None` for a try.
    pub(crate) wait: Option<Duration>,
    pub(crate) op: Operation,
}

impl<'a> AcquireCall<'a> {
    /// A try (no waiting entry) by a new owner.
    pub(crate) fn new(key: &'a LockKey, ttl: Duration, op: Operation) -> Self {
        Self {
            key,
            ttl,
            owner: OwnerId::random(),
            wait: None,
            op,
        }
    }

    /// This call, registering a waiting entry of `entry` when refused.
    pub(crate) fn waiting(self, entry: Option<Duration>) -> Self {
        Self {
            wait: entry,
            ..self
        }
    }

    /// The texts the script takes besides its key names.
    pub(crate) fn texts(&self) -> AcquireTexts {
        AcquireTexts::new(self.owner, self.ttl, self.wait)
    }

    /// The lease this call was granted with `token`, sent at `sent_at`.
    pub(crate) fn granted(
        &self,
        token: FencingToken,
        sent_at: Instant,
    ) -> Result<Lease, LockError> {
        granted(self.key, self.owner, token, self.ttl, sent_at)
    }
}

/// The texts a one-server acquire script (fair mutex, shared kinds) takes
/// besides its key names.
pub(crate) struct AcquireTexts {
    pub(crate) owner: String,
    pub(crate) ttl: String,
    /// The waiting entry's lease, or "0" for a try (register no entry).
    pub(crate) wait: String,
    /// The holder's details, written beside the grant by the script itself.
    pub(crate) details: String,
}

impl AcquireTexts {
    pub(crate) fn new(owner: OwnerId, ttl: Duration, wait: Option<Duration>) -> Self {
        Self {
            owner: owner.to_hex(),
            ttl: ttl_ms(ttl),
            wait: wait.map_or_else(|| "0".to_owned(), ttl_ms),
            details: lock_core::HolderDetails::encode_current(),
        }
    }
}

/// A lease granted by an attempt sent at `sent_at`.
pub(crate) fn granted(
    key: &LockKey,
    owner: OwnerId,
    token: FencingToken,
    ttl: Duration,
    sent_at: Instant,
) -> Result<Lease, LockError> {
    Lease::granted(key.clone(), owner, token, ttl, sent_at, String::new())
        .map_err(|e| e.with_backend(NAME))
}
