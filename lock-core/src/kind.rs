//! Kinds of grant beyond the mutex: read and write shares of a read-write
//! lock, and permits of a counting semaphore.
//!
//! Every kind is a [`Lease`](crate::Lease) like the mutex's: its own owner,
//! TTL, renewal, lost signal and fencing token, renewed and released through
//! the same [`LockBackendExt::renew`](crate::LockBackendExt::renew) and
//! [`release`](crate::LockBackend::release), which read the lease's
//! [`kind`](crate::Lease::kind).
//!
//! # Namespaces
//!
//! A mutex, a read-write lock and a semaphore named by the same key are
//! three different locks: each [`LockShape`] has its own layout on every
//! backend (as Curator's `InterProcessMutex` and `InterProcessReadWriteLock`
//! on different paths are different locks). Only the grants of one shape on
//! one key exclude each other.
//!
//! # What the fencing tokens promise
//!
//! Within the backend's [`FencingScope`](crate::FencingScope):
//!
//! - **Mutex, write and permit grants** carry a token strictly greater than
//!   the token of every earlier grant of the same key and shape (read grants
//!   included).
//! - **A read grant** carries the token of the write grant whose data it
//!   reads: the most recent write grant of the key before it (0 when the key
//!   never had a writer). Readers of one write epoch therefore carry equal
//!   tokens, a reader never carries a token above a later writer's, and a
//!   resource that stores the token of the last write it accepted can tell
//!   readers of an older epoch apart. A writer that
//!   [downgrades](crate::LockGuard::downgrade) keeps its token, which is the
//!   epoch of what it wrote.
//! - A permit grant's token orders permit grants; permits of one semaphore
//!   are held concurrently by design, so a resource protected by a
//!   semaphore uses the token to reject a *stale* holder, not to serialise
//!   holders.

use std::fmt;
use std::time::Duration;

use crate::error::{LockError, Operation};
use crate::token::FencingToken;

/// The largest semaphore limit (permits per key) any backend accepts.
pub const MAX_PERMITS: u32 = 1 << 20;

/// Which family of lock a key names; each has its own namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum LockShape {
    /// The exclusive lock ([`LeaseKind::Exclusive`]).
    Mutex,
    /// A read-write lock ([`LeaseKind::Read`], [`LeaseKind::Write`]).
    ReadWrite,
    /// A counting semaphore ([`LeaseKind::Permits`]).
    Semaphore,
}

impl LockShape {
    /// A short, stable, lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mutex => "mutex",
            Self::ReadWrite => "rwlock",
            Self::Semaphore => "semaphore",
        }
    }
}

impl fmt::Display for LockShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a lease grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum LeaseKind {
    /// The mutex: one holder per key.
    #[default]
    Exclusive,
    /// A read share of a read-write lock: many readers, no writer.
    Read,
    /// The write side of a read-write lock: one writer, no reader.
    Write,
    /// `count` permits of a semaphore of `limit` permits.
    Permits {
        /// Permits held by this lease (at least 1, at most `limit`).
        count: u32,
        /// The semaphore's size, which every client must agree on.
        limit: u32,
    },
}

impl LeaseKind {
    /// `count` permits of a semaphore of `limit`, checked.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// when `limit` is 0 or above [`MAX_PERMITS`], or `count` is 0 or above
    /// `limit`.
    pub fn permits(count: u32, limit: u32) -> Result<Self, LockError> {
        let kind = Self::Permits { count, limit };
        kind.validate(Operation::Validate)?;
        Ok(kind)
    }

    /// The shape (namespace) this kind belongs to.
    pub fn shape(self) -> LockShape {
        match self {
            Self::Exclusive => LockShape::Mutex,
            Self::Read | Self::Write => LockShape::ReadWrite,
            Self::Permits { .. } => LockShape::Semaphore,
        }
    }

    /// Checks the permit counts (other kinds are always valid).
    ///
    /// # Errors
    ///
    /// As [`permits`](Self::permits).
    pub fn validate(self, operation: Operation) -> Result<(), LockError> {
        if let Self::Permits { count, limit } = self {
            if limit == 0 || limit > MAX_PERMITS {
                return Err(LockError::invalid_argument(
                    operation,
                    format!("a semaphore needs 1 to {MAX_PERMITS} permits, got {limit}"),
                ));
            }
            if count == 0 || count > limit {
                return Err(LockError::invalid_argument(
                    operation,
                    format!("cannot take {count} permits of a semaphore of {limit}"),
                ));
            }
        }
        Ok(())
    }

    /// Whether a grant of `self` may coexist with a grant of `other` on the
    /// same key (permits: ignoring how many are left).
    pub fn compatible_with(self, other: Self) -> bool {
        matches!(
            (self, other),
            (Self::Read, Self::Read) | (Self::Permits { .. }, Self::Permits { .. })
        )
    }

    /// The compact text form used in handles and by drivers that store the
    /// kind: `x`, `r`, `w`, `p<count>-<limit>`.
    pub fn code(self) -> String {
        match self {
            Self::Exclusive => "x".to_owned(),
            Self::Read => "r".to_owned(),
            Self::Write => "w".to_owned(),
            Self::Permits { count, limit } => format!("p{count}-{limit}"),
        }
    }

    /// Parses [`code`](Self::code).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for
    /// anything else.
    pub fn from_code(code: &str) -> Result<Self, LockError> {
        let bad =
            || LockError::invalid_argument(Operation::Validate, format!("bad lease kind {code:?}"));
        match code {
            "x" => Ok(Self::Exclusive),
            "r" => Ok(Self::Read),
            "w" => Ok(Self::Write),
            _ => {
                let rest = code.strip_prefix('p').ok_or_else(bad)?;
                let (count, limit) = rest.split_once('-').ok_or_else(bad)?;
                let count = count.parse().map_err(|_| bad())?;
                let limit = limit.parse().map_err(|_| bad())?;
                Self::permits(count, limit).map_err(|_| bad())
            }
        }
    }
}

impl fmt::Display for LeaseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exclusive => f.write_str("exclusive"),
            Self::Read => f.write_str("read"),
            Self::Write => f.write_str("write"),
            Self::Permits { count, limit } => write!(f, "{count} of {limit} permits"),
        }
    }
}

/// One holder of a key, as
/// [`LockBackend::holders`](crate::LockBackend::holders) reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderInfo {
    /// What it holds.
    pub kind: LeaseKind,
    /// Its owner value as the backend stores it.
    pub holder: String,
    /// Its fencing token, when the backend has one.
    pub token: Option<FencingToken>,
    /// Time left before the backend frees its share unless renewed.
    pub remaining_ttl: Option<Duration>,
    /// Who took the share (host, process, program, label, time), when the
    /// holder is one of ours and the backend keeps them.
    pub details: Option<crate::holder::HolderDetails>,
}

/// A mutex's holders from what `inspect` reported: none or one (what a
/// driver's [`holders`](crate::LockBackend::holders) answers for
/// [`LockShape::Mutex`]).
pub fn mutex_holders<I: Into<HolderInfo>>(info: Option<I>) -> Vec<HolderInfo> {
    info.map(Into::into).into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn codes_round_trip_and_bad_ones_are_refused() {
        for kind in [
            LeaseKind::Exclusive,
            LeaseKind::Read,
            LeaseKind::Write,
            LeaseKind::permits(3, 10).unwrap(),
        ] {
            assert_eq!(LeaseKind::from_code(&kind.code()).unwrap(), kind);
        }
        for bad in [
            "", "p", "p1", "p0-3", "p4-3", "p1-0", "q", "p1-2-3", "p-1-2",
        ] {
            let err = LeaseKind::from_code(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad}");
        }
        assert!(LeaseKind::permits(1, MAX_PERMITS + 1).is_err());
    }

    #[test]
    fn only_readers_and_permits_share() {
        use LeaseKind::*;
        let p = LeaseKind::permits(1, 2).unwrap();
        assert!(Read.compatible_with(Read));
        assert!(p.compatible_with(p));
        for (a, b) in [
            (Read, Write),
            (Write, Write),
            (Write, Read),
            (Exclusive, Exclusive),
        ] {
            assert!(!a.compatible_with(b), "{a} {b}");
        }
        assert_eq!(p.shape(), LockShape::Semaphore);
        assert_eq!(Write.shape(), LockShape::ReadWrite);
    }
}
