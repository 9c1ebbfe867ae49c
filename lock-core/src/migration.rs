//! Moving a running fleet from one backend to another with no window in
//! which two processes hold the same key.
//!
//! # Phases
//!
//! Every process runs a [`MigrationBackend`] in one [`MigrationPhase`]:
//! `Old` (lock the old backend only), `Dual` (lock old, then new; release
//! both), `New` (lock the new backend only). Adjacent phases exclude each
//! other on every key: `Old` and `Dual` through the old backend, `Dual` and
//! `New` through the new one. Roll every process `Old → Dual`, then
//! `Dual → New`.
//!
//! # Dual grants
//!
//! A dual grant is two leases. The rules that keep it one lock:
//!
//! - **Old first, then new**, always: one global order, so dual processes
//!   never deadlock each other.
//! - **The old lease is renewed while waiting for the new one** (every
//!   TTL/3): a long wait on the new side never lets the old side lapse. If
//!   the old lease is refused a renewal (or its deadline passes) while
//!   waiting, the wait is withdrawn, the old lease released, and the
//!   acquire fails with [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost).
//! - **The composed deadline is the earlier of both sides'**, and a
//!   composed lease whose deadline has already passed is never handed out:
//!   both sides are released and the call fails with
//!   [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost).
//! - **Release attempts both sides** whatever happens to the first (new,
//!   then old), and reports the first error.
//! - **Renew renews both** concurrently; if either side is gone the renewal
//!   reports it ([`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld) / [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost) win over
//!   temporary errors), so the guard turns `Lost`.
//!
//! # Fencing tokens and epochs
//!
//! `Old` hands out the old backend's tokens unchanged. `Dual` and `New`
//! hand out `(epoch << 56) | t`, with `t` the new backend's token (which
//! must stay below 2^56) and `epoch` this migration's epoch in the top
//! byte: 1 for [`MigrationBackend::new`] (so the token is [`NEW_EPOCH`]` +
//! t`). Dual and new processes draw `t` from one monotonic source, so their
//! tokens interleave correctly, and each is above every old-backend token.
//!
//! **Nested migrations stack their epochs.** A fleet that later migrates
//! again wraps the first migration (kept in phase `New`) as the `old` side
//! of a second one. Its tokens are already in epoch 1, so the second
//! migration must stamp a higher epoch: build it with
//! [`MigrationBackend::stacked`], which takes the first migration itself
//! and uses `epoch = first.epoch() + 1` (the highest epoch the old side can
//! produce, plus one). A migration built with [`MigrationBackend::new`]
//! over an old side that hands out epoch tokens would let tokens go
//! backwards, so it refuses: every grant whose old-side token is already at
//! or above its own epoch is released and fails with [`ErrorKind::Config`](crate::ErrorKind::Config)
//! ("build it with `MigrationBackend::stacked`"). `Old` and `Dual` see the
//! old side's tokens, and the playbook passes every process through them
//! before `New`, so a misbuilt nesting is refused before any token could
//! regress.
//!
//! # The cutover guard (stragglers on `Old`)
//!
//! `Old` and `New` do not exclude each other through any lock. The playbook
//! says "never run them together", but a process still configured for
//! `Old` may be *waiting* for a key when the fleet moves to `New`: it holds
//! nothing, so `inspect` cannot show it, and once it gets the key it would
//! hold it beside a `New` process. The rollout guards itself against it,
//! using only the [`LockBackend`] trait of the old backend:
//!
//! 1. **Announcement.** Before its first grant, a process in phase `New`
//!    makes sure the *cutover marker* exists in the old backend: a lock on
//!    the reserved key `__distlock/migration-cutover/<name>` (see
//!    [`MigrationBackend::with_name`]), taken with [`MAX_TTL`] and never
//!    released. If `inspect` shows it free, the process takes it. Beside
//!    it, the process records the longest old lease it was configured for
//!    ([`with_old_lease_max`](MigrationBackend::with_old_lease_max)) as the
//!    reserved key `__distlock/migration-old-ttl/<name>/<milliseconds>` (a
//!    lock carries no payload through the [`LockBackend`] trait, so the
//!    value is the key's name).
//! 2. **Check after grant.** Every `Old` grant, *after* it obtained its
//!    old-backend lease, reads the marker (`inspect`). If the marker is set,
//!    the lease is released and the acquire fails with
//!    [`ErrorKind::Config`](crate::ErrorKind::Config): "this fleet has moved to the new backend;
//!    reconfigure". Every renewal of an old-only lease reads it too, after
//!    renewing; if set, the renewal fails with [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost) and
//!    the guard reports `Lost`. Such a lease is deliberately *not*
//!    released: its holder may still be inside its promised window, and
//!    freeing the old key early would let a `Dual` process in beside it.
//! 3. **Wait-out, key by key.** The wait-out is the longest old lease
//!    recorded beside the marker by any `New` process, or this process's
//!    own `old_lease_max` if that is longer (the facade defaults it to the
//!    configured TTL), plus the clock-drift allowance; the records are
//!    read when a marker is first seen and again before the wait-out is
//!    declared over. Until the marker is
//!    that old, a `New` grant of a key first takes that key once in the
//!    old backend (waiting, as any waiter, while an `Old` or `Dual`
//!    process holds it) and gives it straight back, then locks the new
//!    backend. Once the marker is that old, `New` grants go straight to
//!    the new backend. The marker's age is read from the old backend
//!    itself (`MAX_TTL` minus the remaining TTL `inspect` reports, for
//!    backends with per-lease TTLs), so a restarted `New` process whose
//!    marker is old already skips step 3 (a marker just renewed by its
//!    keeper, see step 4, reads as new: a process starting then waits out
//!    once more); where the backend cannot tell
//!    (per-session TTLs), the process counts from when it first saw the
//!    marker.
//! 4. **Keeping the marker while `New` runs.** Every `New` process runs a
//!    keeper on the renewal thread (see [`RenewalRuntime`](crate::RenewalRuntime)) that, every
//!    [`with_marker_refresh`](MigrationBackend::with_marker_refresh)
//!    interval ([`DEFAULT_MARKER_REFRESH`], 5 s), reads the marker and:
//!    sets it again when it is gone (force-released, its TTL run out, the
//!    session that held it ended, the store restarted empty); renews it
//!    when it set it itself and half its TTL is gone, so it never runs out
//!    while that process runs; and looks again right after another
//!    process's marker is due to run out. It keeps this process's record
//!    of the old TTL the same way. When the marker it reads is not the one
//!    it read last (another holder or token: it vanished and was set again
//!    in between), the wait-out starts over from the new marker: `New`
//!    grants take each key in the old backend again (step 3), so an `Old`
//!    lease granted while the marker was gone is waited out rather than
//!    joined, and its renewals fail from then on.
//!
//! **Why this closes the window.** Let `A` be the moment the current
//! marker was set. Take any `Old` grant or renewal and the marker read that
//! follows it. If the read came after `A` (and the marker was still
//! there), it saw the marker (the old backend is linearizable) and the
//! grant was refused (never handed out), or the renewal refused, leaving
//! the holder's previous deadline in force. If the read came before `A`,
//! so did the grant or renewal, and the promised window it produced ends
//! at most one old TTL later, before `A + old_lease_max`; it also ends
//! before the old backend frees the key (the local deadline is computed
//! from the send time minus drift), and a freed lease cannot be renewed.
//! So at any moment after `A`, an open `Old` promise on a key means the
//! old backend shows the key held. A `New` grant made before
//! `A + old_lease_max` first took the key in the old backend after `A`
//! (it confirmed the marker first): at that moment no pre-`A` promise on
//! it was open, and post-`A` `Old` grants are all refused, so none
//! overlaps the `New` grant. A `New` grant after `A + old_lease_max`
//! overlaps no pre-`A` promise either, since they all ended by then. When
//! the marker is set again, `A` moves to that moment and the keepers make
//! every `New` process wait out again from there. `Dual` needs no check:
//! it excludes `Old` through the old backend and `New` through the new
//! one.
//!
//! **Cost.** One extra `inspect` on the old backend per `Old`-phase acquire
//! and per renewal of an old-only lease. In phase `New`, until the marker
//! is older than the wait-out: one `inspect` of the marker and one
//! acquire + release of the key in the old backend per grant (a straggler
//! or dual holder delays it as it would a waiter), and a `list` of the
//! records when a marker is first seen and once more before its wait-out
//! is declared over (a grant whose wait for the key ran to the end of
//! the wait-out asks again, so a longer value recorded meanwhile still
//! counts); after that, nothing per grant. Each `New` process's keeper reads the
//! marker and its record once per refresh interval (two `inspect`s), and
//! renews or sets them again when needed.
//!
//! **Limits.** The marker can still go missing between two looks of the
//! keepers: from the moment it vanishes until the first `New` process's
//! next look (at most one refresh interval plus a round trip; about one
//! round trip when it runs out by its TTL, since the keepers look again
//! right then), an `Old` process is admitted, and on a key a `New` process
//! already holds, it holds beside it until its own lease ends (at most one
//! old TTL). Nothing is admitted beside `New` grants made after the marker
//! is back (they wait it out). The keeper needs the old backend: while it
//! cannot reach it, it logs and keeps trying, and `New` grants past the
//! wait-out go on (an `Old` process that can reach the old backend
//! meanwhile is guarded only by the marker still being there). A store
//! that loses data (Redis restarted without persistence) loses the marker
//! with everything else until the next look. Break the marker by hand
//! only on purpose: [`LockClient::force_release`](crate::LockClient::force_release)
//! and `distlock force-release` refuse reserved keys unless asked with
//! [`force_release_reserved`](crate::LockClient::force_release_reserved) /
//! `--reserved` (the [`Admin::force_release`](crate::Admin::force_release) primitive itself does
//! not check). The recorded wait-out is read with [`Listing::list`](crate::Listing::list);
//! an old side that cannot list (a [`MigrationBackend`] wrapped by
//! [`MigrationBackend::stacked`]) uses the local `old_lease_max` only.
//! The records say what the `New` processes were configured with, not
//! what `Old` processes actually use: set `old_lease_max` to at least the
//! longest TTL any `Old` process uses. Processes that lock the old backend
//! without this wrapper are not guarded (the playbook starts by putting
//! every process behind it in phase `Old`). A `New` process needs the old
//! backend reachable while the marker is younger than the wait-out (its
//! grants fail with the old backend's error meanwhile), and for its first
//! grant. Once no process can run phase `Old` any more (the old store is
//! retired), turn the keeper off with a zero refresh interval.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::LockBackend;
use crate::client::LockDefaults;
use crate::error::LockError;
use crate::key::LockKey;
use crate::options::MAX_TTL;

/// Tokens granted through the new backend of a migration built with
/// [`MigrationBackend::new`] carry this epoch (1) in their top byte, so
/// every one of them is greater than any token of the old backend (whose
/// raw tokens must stay below 2^56).
pub const NEW_EPOCH: u64 = 1 << EPOCH_SHIFT;

const EPOCH_SHIFT: u32 = 56;

/// The prefix of the reserved keys that hold cutover markers in the old
/// backend (see the [module docs](self)).
pub const CUTOVER_KEY_PREFIX: &str = "__distlock/migration-cutover/";

/// The mark phase `Dual` puts before a holder it found in the old backend
/// only (`inspect`, `leader`, and so `watch_holder`): a process still on
/// phase `Old`, or a dual grant half-way (its old side taken, its new side
/// not yet; or on release, its new side already given back). A watcher
/// polling a dual-phase key can see such a holder for a moment around
/// every dual grant and release.
pub const OLD_ONLY_MARK: &str = "old-only:";

/// Whether `holder` (a [`LockInfo::holder`](crate::LockInfo::holder) or
/// [`Leader::holder`](crate::election::Leader::holder)) carries the
/// [`OLD_ONLY_MARK`] of a migration's dual phase.
pub fn is_old_only(holder: &str) -> bool {
    holder.starts_with(OLD_ONLY_MARK)
}

/// How often a `New` process checks the cutover marker by default (see
/// [`MigrationBackend::with_marker_refresh`]).
pub const DEFAULT_MARKER_REFRESH: Duration = Duration::from_secs(5);

/// The migration name used when none is given.
pub const DEFAULT_MIGRATION_NAME: &str = "default";

/// What a refused straggler is told.
const MOVED: &str =
    "this fleet has moved to the new backend; reconfigure this process for phase `new`";

/// Where one process stands in a migration.
///
/// Roll every process `Old → Dual`, and only when none is left on `Old`,
/// `Dual → New`. Adjacent phases exclude each other on every key: `Old` and
/// `Dual` through the old backend, `Dual` and `New` through the new one.
/// `Old` and `New` exclude each other only through the cutover guard (see
/// the module docs): an `Old` process is refused once a `New` one started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MigrationPhase {
    /// Lock through the old backend only (tokens: the old backend's own).
    Old,
    /// Lock the old backend, then the new one; release both (tokens: the
    /// new backend's, in the new epoch).
    Dual,
    /// Lock through the new backend only (tokens: the new backend's, in the
    /// new epoch).
    New,
}

impl MigrationPhase {
    /// Parses `old`, `dual` or `new`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for anything else.
    pub fn parse(text: &str) -> Result<Self, LockError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "old" => Ok(Self::Old),
            "dual" => Ok(Self::Dual),
            "new" => Ok(Self::New),
            other => Err(LockError::config(format!(
                "unknown migration phase {other:?}: expected old, dual or new"
            ))),
        }
    }

    /// `old`, `dual` or `new`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Old => "old",
            Self::Dual => "dual",
            Self::New => "new",
        }
    }
}

/// A backend that migrates locks from `old` to `new` in phases.
///
/// See the [module docs](self) for the dual-grant rules, the token epochs
/// and the cutover guard that refuses `Old` stragglers.
///
/// # Fencing tokens across the rollout
///
/// `Old` hands out the old backend's tokens unchanged, so putting a fleet
/// behind this wrapper in phase `Old` changes nothing. `Dual` and `New`
/// hand out `(epoch << 56) | t` where `t` is the new backend's token: dual
/// and new processes draw from one monotonic source, so their tokens
/// interleave correctly, and every one of them is above every old-backend
/// token.
///
/// Safety holds at every boundary: a resource that checks tokens never
/// accepts a write out of order. The cost is liveness during the `Old +
/// Dual` stretch only: once a `Dual` process has written, writes from
/// processes still on `Old` carry lower tokens and are **rejected** by the
/// resource until they move to `Dual`. `Dual + New` costs nothing.
///
/// After the migration, keep this wrapper in phase `New` (a thin
/// pass-through): dropping it would hand out raw new-backend tokens, lower
/// than the epoch tokens the resource has already seen.
#[derive(Clone, Debug)]
pub struct MigrationBackend {
    old: Arc<dyn LockBackend>,
    new: Arc<dyn LockBackend>,
    phase: MigrationPhase,
    epoch: u8,
    name: String,
    cutover_key: LockKey,
    old_lease_max: Duration,
    marker_refresh: Duration,
    cutover: Arc<Cutover>,
}

impl MigrationBackend {
    /// Wraps the two backends in `phase`, with epoch 1, the migration name
    /// [`DEFAULT_MIGRATION_NAME`] and a wait-out of the default TTL
    /// ([`LockDefaults`], 30 s).
    pub fn new(
        old: Arc<dyn LockBackend>,
        new: Arc<dyn LockBackend>,
        phase: MigrationPhase,
    ) -> Self {
        Self::build(old, new, phase, 1)
    }

    /// A second migration over a first one (kept in phase `New`): `first`
    /// becomes the old side, and this migration stamps the next epoch
    /// (`first.epoch() + 1`), so its tokens stay above every token `first`
    /// can hand out. Its name defaults to `<first's name>.<epoch>` and its
    /// wait-out and marker refresh interval to `first`'s.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when `first` already uses the last epoch (255).
    pub fn stacked(
        first: MigrationBackend,
        new: Arc<dyn LockBackend>,
        phase: MigrationPhase,
    ) -> Result<Self, LockError> {
        let epoch = first.epoch.checked_add(1).ok_or_else(|| {
            LockError::config("cannot stack another migration: epoch 255 is the last one")
        })?;
        let name = format!("{}.{epoch}", first.name);
        let (old_lease_max, marker_refresh) = (first.old_lease_max, first.marker_refresh);
        let mut stacked = Self::build(Arc::new(first), new, phase, epoch).with_name(&name)?;
        stacked.old_lease_max = old_lease_max;
        stacked.marker_refresh = marker_refresh;
        Ok(stacked)
    }

    fn build(
        old: Arc<dyn LockBackend>,
        new: Arc<dyn LockBackend>,
        phase: MigrationPhase,
        epoch: u8,
    ) -> Self {
        Self {
            old,
            new,
            phase,
            epoch,
            name: DEFAULT_MIGRATION_NAME.to_owned(),
            cutover_key: LockKey::new(format!("{CUTOVER_KEY_PREFIX}{DEFAULT_MIGRATION_NAME}"))
                .expect("the default cutover key is a valid key"),
            old_lease_max: LockDefaults::default().ttl,
            marker_refresh: DEFAULT_MARKER_REFRESH,
            cutover: Arc::default(),
        }
    }

    /// Names this migration: its cutover marker is the old backend's key
    /// `__distlock/migration-cutover/<name>`. Every process of one fleet
    /// must use the same name; two migrations that share an old backend
    /// need different ones.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when the name is empty or makes an invalid key.
    pub fn with_name(mut self, name: &str) -> Result<Self, LockError> {
        let name = name.trim();
        if name.is_empty() {
            return Err(LockError::config("the migration name must not be empty"));
        }
        let bad = |e: LockError| {
            LockError::config(format!("bad migration name {name:?}: {}", e.message()))
        };
        self.cutover_key = LockKey::new(format!("{CUTOVER_KEY_PREFIX}{name}")).map_err(bad)?;
        // The longest record key this name makes must be valid too.
        marker::record_key(name, MAX_TTL).map_err(bad)?;
        self.name = name.to_owned();
        self.cutover = Arc::default();
        Ok(self)
    }

    /// Sets the wait-out: the longest TTL any process in phase `Old` holds
    /// a lease with. A `New` process records it beside the cutover marker
    /// and makes no grant without first taking the key in the old backend
    /// until the marker is as old as the longest value any `New` process
    /// recorded there, or this one if longer (plus the drift allowance).
    /// Capped at [`MAX_TTL`].
    #[must_use]
    pub fn with_old_lease_max(mut self, old_lease_max: Duration) -> Self {
        self.old_lease_max = old_lease_max.min(MAX_TTL);
        self
    }

    /// How often a `New` process makes sure the cutover marker is still
    /// set in the old backend, setting it again if it vanished (default
    /// [`DEFAULT_MARKER_REFRESH`]; see the module docs). This bounds how
    /// long the marker can stay missing while `New` processes run. Zero
    /// turns the keeper off: only for when no process can run phase `Old`
    /// any more (the old store is gone).
    #[must_use]
    pub fn with_marker_refresh(mut self, every: Duration) -> Self {
        self.marker_refresh = every;
        self
    }

    /// The phase.
    pub fn phase(&self) -> MigrationPhase {
        self.phase
    }

    /// The epoch stamped in the top byte of `Dual` and `New` tokens.
    pub fn epoch(&self) -> u8 {
        self.epoch
    }

    /// The migration's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The old backend's key that holds the cutover marker.
    pub fn cutover_key(&self) -> &LockKey {
        &self.cutover_key
    }

    /// This process's wait-out (see
    /// [`with_old_lease_max`](Self::with_old_lease_max); a longer one
    /// recorded beside the marker by another `New` process wins).
    pub fn old_lease_max(&self) -> Duration {
        self.old_lease_max
    }

    /// The same backends in another phase.
    #[must_use]
    pub fn with_phase(&self, phase: MigrationPhase) -> Self {
        Self {
            phase,
            ..self.clone()
        }
    }
}

mod backend;
mod cutover;
mod dual;
mod marker;

use marker::Cutover;

#[cfg(test)]
mod tests;
