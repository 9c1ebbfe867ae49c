//! What the operating cases check of a grant's holder details: that they
//! name this process and a grant time inside the acquire, on the wall
//! clock the details are written with.

use std::time::{SystemTime, UNIX_EPOCH};

use lock_core::HolderDetails;

/// Milliseconds since the Unix epoch on this machine's wall clock, the
/// clock of [`HolderDetails::granted_at_ms`].
pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Checks that `details` name this process and a grant time within
/// `[before, after]` (the granting process's clock, this one).
pub(super) fn check_details(
    details: Option<&HolderDetails>,
    before: u64,
    after: u64,
    what: &str,
) -> Result<(), String> {
    let details = details.ok_or_else(|| format!("{what}: no holder details for our own grant"))?;
    let here = HolderDetails::current();
    ensure!(
        details.host == here.host && details.pid == here.pid && details.program == here.program,
        "{what}: the details name another process: {details:?}, this one is {here:?}"
    );
    ensure!(
        (before..=after).contains(&details.granted_at_ms),
        "{what}: grant time {} outside the acquire [{before}, {after}] ms",
        details.granted_at_ms
    );
    Ok(())
}
