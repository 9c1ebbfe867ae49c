//! What an election is in the store and as observers see it: its lock key
//! and its leader. The data the kernel's facets and calls speak in; the
//! campaign API is [`election`](super).

use std::time::Duration;

use crate::error::LockError;
use crate::key::LockKey;
use crate::types::{FencingToken, LockInfo};

/// What [`election_key`] puts before an election's name.
pub(crate) const ELECTION_KEY_PREFIX: &str = "election/";

/// The lock key an election's campaigns take.
pub fn election_key(name: &str) -> String {
    format!("{ELECTION_KEY_PREFIX}{name}")
}

/// The lock key of the election named `election` (a valid key itself):
/// what [`LockBackendExt::campaign`](crate::LockBackendExt::campaign)'s lease is
/// keyed on.
///
/// # Errors
///
/// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) when
/// the prefixed key is too long.
pub fn election_lock_key(election: &LockKey) -> Result<LockKey, LockError> {
    LockKey::new(election_key(election.as_str()))
}

/// The current leader of an election, as observers see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leader's owner value as the backend stores it.
    pub holder: String,
    /// Its term (its lock's fencing token), where the backend has tokens.
    pub term: Option<FencingToken>,
    /// Time left before the store frees the leadership unless renewed.
    pub remaining_ttl: Option<Duration>,
    /// Who campaigned (host, process, program, label, time of the win),
    /// when the leader is one of ours and the backend keeps them.
    pub details: Option<crate::holder::HolderDetails>,
}

impl Leader {
    /// The leader a lock's holder is.
    pub fn from_info(info: LockInfo) -> Self {
        Self {
            holder: info.holder,
            term: info.token,
            remaining_ttl: info.remaining_ttl,
            details: info.details,
        }
    }

    /// Whether two observations name the same leader in the same term (the
    /// remaining TTL is not compared).
    pub fn same(a: Option<&Leader>, b: Option<&Leader>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => a.holder == b.holder && a.term == b.term,
            _ => false,
        }
    }
}

/// An election with a leader, as
/// [`Listing::list_elections`](crate::Listing::list_elections)
/// reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionInfo {
    /// The election's name.
    pub election: LockKey,
    /// Its leader.
    pub leader: Leader,
}

/// One page of [`Listing::list_elections`](crate::Listing::list_elections).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ElectionPage {
    /// The elections found with a leader, in the backend's scan order.
    pub elections: Vec<ElectionInfo>,
    /// Where the next page starts; `None` when the scan is complete.
    pub cursor: Option<String>,
}
