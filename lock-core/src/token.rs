//! Fencing tokens.

use std::fmt;

/// A number that strictly increases with every grant of a key (see the
/// backend's [`Capabilities::fencing`](crate::Capabilities::fencing) for its
/// scope). A protected resource accepts a write only if its token is greater
/// than the last one it accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw value.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
