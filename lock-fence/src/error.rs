//! What a fenced write answers when it does not land.

use std::fmt;

/// Why a fenced write did not land.
#[derive(Debug)]
#[non_exhaustive]
pub enum FenceError {
    /// The token is below the last one the resource accepted: the writer's
    /// lock was lost (or handed on) and someone newer wrote since.
    Stale {
        /// The resource written to.
        resource: String,
        /// The writer's token.
        token: u64,
        /// The last token the resource accepted.
        current: u64,
    },
    /// Bad input (a table name, a resource name, a token out of range).
    InvalidArgument(String),
    /// The store failed (the write may or may not have landed only where
    /// the store itself says so; the token check did not refuse it).
    Store(Box<dyn std::error::Error + Send + Sync>),
}

impl FenceError {
    /// Whether this is a refusal of a stale token.
    pub fn is_stale(&self) -> bool {
        matches!(self, Self::Stale { .. })
    }

    /// The resource's current token, for a refusal.
    pub fn current_token(&self) -> Option<u64> {
        match self {
            Self::Stale { current, .. } => Some(*current),
            _ => None,
        }
    }

    pub(crate) fn store(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Store(Box::new(err))
    }
}

impl fmt::Display for FenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stale {
                resource,
                token,
                current,
            } => write!(
                f,
                "stale fencing token {token} for {resource:?}: the resource already accepted token {current}"
            ),
            Self::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            Self::Store(err) => write!(f, "store error: {err}"),
        }
    }
}

impl std::error::Error for FenceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Store(err) => Some(&**err),
            _ => None,
        }
    }
}
