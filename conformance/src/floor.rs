//! The raw floor of a backend: the minimal protocol exchange of one grant
//! and one release, written by hand on **one bare connection** of its own,
//! so that benchmarks can print "ours / floor" ratios that mean something.
//!
//! A floor never goes through the code it is compared with: not the
//! driver's pool, client, multiplexer, session table or renewal machinery.
//! It issues the same grant (same key layout, same fencing counter, same
//! release guard) with as few round trips as the protocol allows, and
//! nothing else. It is not a lock API: it never waits, never renews, and
//! does not clean up after a cancelled call beyond what its connection's
//! end does.
//!
//! Each floor holds one connection and serves one call at a time (calls
//! from several tasks queue on it), so "8 independent clients" means eight
//! floors, as it means eight clients of ours.

use std::time::Duration;

use async_trait::async_trait;

use lock_core::LockError;

/// What a floor's grant hands back, for its release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FloorGrant {
    /// The key as the caller named it.
    pub key: String,
    /// The owner value written with the grant.
    pub owner: String,
    /// The grant's fencing token (0 where the floor's protocol has none).
    pub token: u64,
    /// Whatever else the release needs (a node path, an entry name), in the
    /// floor's own format; empty when nothing.
    pub handle: String,
}

/// A hand-written grant and release on one bare connection.
///
/// Implementations document the exact requests of each call and the round
/// trips they cost.
#[async_trait]
pub trait RawFloor: Send + Sync {
    /// The backend's name, as its driver reports it.
    fn name(&self) -> &'static str;

    /// Round trips of one uncontended [`cycle`](Self::cycle), as the floor's
    /// protocol exchange makes them (what a proxy between it and the server
    /// counts).
    fn round_trips_per_cycle(&self) -> u32;

    /// One grant attempt: `Some` when granted, `None` when someone else
    /// holds `key` (the floor leaves nothing behind then).
    ///
    /// # Errors
    ///
    /// `InvalidArgument` for a key or TTL the driver would refuse; the
    /// driver's kinds (`Unavailable`, `Timeout`, `Backend`) for server
    /// failures.
    ///
    /// # Cancel safety
    ///
    /// Not a lock API: dropping the future after the request was sent may
    /// leave `key` held by this floor until `ttl` passes or the floor's
    /// connection ends.
    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError>;

    /// Gives `grant` back: `true` when it was still ours.
    ///
    /// # Errors
    ///
    /// As [`try_grant`](Self::try_grant).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the release in an unknown state; the grant
    /// then expires with its TTL.
    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError>;

    /// One grant (which must succeed) and its release.
    ///
    /// # Errors
    ///
    /// `Contended` when `key` was held; `NotHeld` when the release found
    /// the grant gone; otherwise as [`try_grant`](Self::try_grant).
    ///
    /// # Cancel safety
    ///
    /// As [`try_grant`](Self::try_grant).
    async fn cycle(&self, key: &str, ttl: Duration) -> Result<(), LockError> {
        use lock_core::{ErrorKind, Operation};
        let Some(grant) = self.try_grant(key, ttl).await? else {
            return Err(LockError::new(
                ErrorKind::Contended,
                Operation::TryAcquire,
                "the floor's key is held by another owner",
            )
            .with_backend(self.name()));
        };
        if self.release(&grant).await? {
            Ok(())
        } else {
            Err(LockError::new(
                ErrorKind::NotHeld,
                Operation::Release,
                "the floor's grant was gone at release",
            )
            .with_backend(self.name()))
        }
    }
}
