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
//!   acquire fails with [`ErrorKind::LeaseLost`].
//! - **The composed deadline is the earlier of both sides'**, and a
//!   composed lease whose deadline has already passed is never handed out:
//!   both sides are released and the call fails with
//!   [`ErrorKind::LeaseLost`].
//! - **Release attempts both sides** whatever happens to the first (new,
//!   then old), and reports the first error.
//! - **Renew renews both** concurrently; if either side is gone the renewal
//!   reports it ([`ErrorKind::NotHeld`] / [`ErrorKind::LeaseLost`] win over
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
//! or above its own epoch is released and fails with [`ErrorKind::Config`]
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
//!    renewed or released. If `inspect` shows it free, the process takes it.
//! 2. **Check after grant.** Every `Old` grant, *after* it obtained its
//!    old-backend lease, reads the marker (`inspect`). If the marker is set,
//!    the lease is released and the acquire fails with
//!    [`ErrorKind::Config`]: "this fleet has moved to the new backend;
//!    reconfigure". Every renewal of an old-only lease reads it too, after
//!    renewing; if set, the renewal fails with [`ErrorKind::LeaseLost`] and
//!    the guard reports `Lost`. Such a lease is deliberately *not*
//!    released: its holder may still be inside its promised window, and
//!    freeing the old key early would let a `Dual` process in beside it.
//! 3. **Wait-out, key by key.** Until the marker is older than the longest
//!    lease any `Old` process can hold
//!    ([`with_old_lease_max`](MigrationBackend::with_old_lease_max); the
//!    facade defaults it to the configured TTL) plus the clock-drift
//!    allowance, a `New` grant of a key first takes that key once in the
//!    old backend (waiting, as any waiter, while an `Old` or `Dual`
//!    process holds it) and gives it straight back, then locks the new
//!    backend. Once the marker is that old, `New` grants go straight to
//!    the new backend and never touch the old one again. The marker's age
//!    is read from the old backend itself (`MAX_TTL` minus the remaining
//!    TTL `inspect` reports, for backends with per-lease TTLs), so a
//!    restarted `New` process whose marker is old already skips step 3;
//!    where the backend cannot tell (per-session TTLs), the process counts
//!    from when it first saw the marker.
//!
//! **Why this closes the window.** Let `A` be the moment the marker was
//! created. Take any `Old` grant or renewal and the marker read that
//! follows it. If the read came after `A`, it saw the marker (the old
//! backend is linearizable) and the grant was refused (never handed out),
//! or the renewal refused, leaving the holder's previous deadline in force.
//! If the read came before `A`, so did the grant or renewal, and the
//! promised window it produced ends at most one old TTL later, before
//! `A + old_lease_max`; it also ends before the old backend frees the key
//! (the local deadline is computed from the send time minus drift), and a
//! freed lease cannot be renewed. So at any moment after `A`, an open `Old`
//! promise on a key means the old backend shows the key held. A `New`
//! grant made before `A + old_lease_max` first took the key in the old
//! backend after `A` (it confirmed the marker first): at that moment no
//! pre-`A` promise on it was open, and post-`A` `Old` grants are all
//! refused, so none overlaps the `New` grant. A `New` grant after
//! `A + old_lease_max` overlaps no pre-`A` promise either, since they all
//! ended by then. `Dual` needs no check: it excludes `Old` through the old
//! backend and `New` through the new one.
//!
//! **Cost.** One extra `inspect` on the old backend per `Old`-phase acquire
//! and per renewal of an old-only lease. In phase `New`, until the marker
//! is older than the wait-out: one `inspect` of the marker and one
//! acquire + release of the key in the old backend per grant (a straggler
//! or dual holder delays it as it would a waiter); after that, nothing.
//!
//! **Limits.** The guard lasts as long as the old backend keeps the marker:
//! [`MAX_TTL`] (24 h) on backends with per-lease TTLs (Redis, SQL, memory);
//! on backends whose locks hang off a client session (etcd, ZooKeeper as
//! the *old* side) only while the announcing process's session lives. A
//! store that loses data (Redis restarted without persistence) loses the
//! marker with everything else. Set `old_lease_max` to at least the longest
//! TTL any `Old` process uses. Processes that lock the old backend without
//! this wrapper are not guarded (the playbook starts by putting every
//! process behind it in phase `Old`). A `New` process needs the old backend
//! reachable while the marker is younger than the wait-out (its grants
//! fail with the old backend's error meanwhile), and for its first grant.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Mutex, watch};
use tokio::time::{Instant, sleep, sleep_until};

use crate::backend::LockBackend;
use crate::capabilities::{Capabilities, FencingScope, TtlModel, WaitStrategy};
use crate::client::LockDefaults;
use crate::error::{ErrorKind, LockError, Operation};
use crate::key::LockKey;
use crate::options::MAX_TTL;
use crate::types::{FencingToken, Lease, LockInfo, OwnerId, SessionState, clock_drift};

/// Tokens granted through the new backend of a migration built with
/// [`MigrationBackend::new`] carry this epoch (1) in their top byte, so
/// every one of them is greater than any token of the old backend (whose
/// raw tokens must stay below 2^56).
pub const NEW_EPOCH: u64 = 1 << EPOCH_SHIFT;

const EPOCH_SHIFT: u32 = 56;

/// The prefix of the reserved keys that hold cutover markers in the old
/// backend (see the [module docs](self)).
pub const CUTOVER_KEY_PREFIX: &str = "__distlock/migration-cutover/";

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
    /// [`ErrorKind::Config`] for anything else.
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

/// This process's view of the cutover, shared by clones and
/// [`with_phase`](MigrationBackend::with_phase) copies.
#[derive(Debug, Default)]
struct Cutover {
    /// The marker was seen older than the wait-out: `New` grants need no
    /// look at the old backend any more.
    done: AtomicBool,
    /// One marker check / announcement at a time.
    turn: Mutex<()>,
    /// When this process first saw the marker (its age where the backend
    /// cannot tell).
    first_seen: std::sync::Mutex<Option<Instant>>,
}

impl Cutover {
    fn first_seen(&self) -> Option<Instant> {
        *self
            .first_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_first_seen(&self, at: Option<Instant>) {
        *self
            .first_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = at;
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
    /// wait-out to `first`'s.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] when `first` already uses the last epoch (255).
    pub fn stacked(
        first: MigrationBackend,
        new: Arc<dyn LockBackend>,
        phase: MigrationPhase,
    ) -> Result<Self, LockError> {
        let epoch = first.epoch.checked_add(1).ok_or_else(|| {
            LockError::config("cannot stack another migration: epoch 255 is the last one")
        })?;
        let name = format!("{}.{epoch}", first.name);
        let old_lease_max = first.old_lease_max;
        let mut stacked = Self::build(Arc::new(first), new, phase, epoch).with_name(&name)?;
        stacked.old_lease_max = old_lease_max;
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
    /// [`ErrorKind::Config`] when the name is empty or makes an invalid key.
    pub fn with_name(mut self, name: &str) -> Result<Self, LockError> {
        let name = name.trim();
        if name.is_empty() {
            return Err(LockError::config("the migration name must not be empty"));
        }
        self.cutover_key = LockKey::new(format!("{CUTOVER_KEY_PREFIX}{name}")).map_err(|e| {
            LockError::config(format!("bad migration name {name:?}: {}", e.message()))
        })?;
        self.name = name.to_owned();
        self.cutover = Arc::default();
        Ok(self)
    }

    /// Sets the wait-out: the longest TTL any process in phase `Old` holds
    /// a lease with. A `New` process makes no grant until the cutover
    /// marker is this old (plus the drift allowance). Capped at
    /// [`MAX_TTL`].
    #[must_use]
    pub fn with_old_lease_max(mut self, old_lease_max: Duration) -> Self {
        self.old_lease_max = old_lease_max.min(MAX_TTL);
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

    /// The wait-out (see [`with_old_lease_max`](Self::with_old_lease_max)).
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

    fn epoch_base(&self) -> u64 {
        u64::from(self.epoch) << EPOCH_SHIFT
    }

    fn epoch_token(&self, lease: &Lease) -> Result<FencingToken, LockError> {
        let raw = lease.token().get();
        if raw >= NEW_EPOCH {
            return Err(LockError::new(
                ErrorKind::Backend,
                Operation::Acquire,
                format!("new backend token {raw} does not fit below 2^56; cannot place it in the migration epoch"),
            )
            .with_key(lease.key()));
        }
        Ok(FencingToken::new(self.epoch_base() | raw))
    }

    /// Refuses an old-side grant whose token is already in this
    /// migration's epoch or above: our own tokens would not stay above it.
    fn check_old_epoch(&self, old: &Lease, operation: Operation) -> Result<(), LockError> {
        let epoch = old.token().get() >> EPOCH_SHIFT;
        if epoch >= u64::from(self.epoch) {
            return Err(LockError::new(
                ErrorKind::Config,
                operation,
                format!(
                    "the old backend hands out tokens of migration epoch {epoch} (is it itself a migration?); \
                     this migration stamps epoch {}, so its tokens would not stay above them: \
                     build it with MigrationBackend::stacked",
                    self.epoch
                ),
            )
            .with_key(old.key()));
        }
        Ok(())
    }

    fn check_key(&self, key: &LockKey, operation: Operation) -> Result<(), LockError> {
        if *key == self.cutover_key {
            return Err(LockError::invalid_argument(
                operation,
                "this key holds the migration's cutover marker and cannot be locked through it",
            )
            .with_key(key));
        }
        Ok(())
    }

    /// Builds the composite lease handed to users.
    ///
    /// Fails with [`ErrorKind::LeaseLost`] when the composed deadline (the
    /// earlier of both sides') has already passed: such a lease is never
    /// handed out.
    fn compose(&self, old: Option<&Lease>, new: Option<&Lease>) -> Result<Lease, LockError> {
        let (key, ttl) = match (old, new) {
            (_, Some(l)) | (Some(l), None) => (l.key().clone(), l.ttl()),
            (None, None) => {
                return Err(LockError::new(
                    ErrorKind::Backend,
                    Operation::Acquire,
                    "empty migration lease",
                ));
            }
        };
        let token = match new {
            Some(new) => self.epoch_token(new)?,
            None => old.map(Lease::token).unwrap_or(FencingToken::new(0)),
        };
        let deadline = [old, new]
            .into_iter()
            .flatten()
            .map(Lease::validity_deadline)
            .min()
            .unwrap_or_else(Instant::now);
        if deadline <= Instant::now() {
            return Err(LockError::new(
                ErrorKind::LeaseLost,
                Operation::Acquire,
                "the migration lease's deadline (the earlier of its two sides') had already passed when both sides were granted",
            )
            .with_key(&key));
        }
        let owner = OwnerId::random();
        let data = format!(
            "m1|{}|{}|{}",
            owner.to_hex(),
            old.map_or_else(|| "-".to_owned(), Lease::to_handle),
            new.map_or_else(|| "-".to_owned(), Lease::to_handle)
        );
        let lease = Lease::from_parts(key, owner, token, ttl, deadline, data);
        let sessions: Vec<watch::Receiver<SessionState>> = [old, new]
            .into_iter()
            .flatten()
            .filter_map(|l| l.session().cloned())
            .collect();
        Ok(match sessions.len() {
            0 => lease,
            1 => lease.with_session(sessions.into_iter().next().expect("one session")),
            _ => lease.with_session(merge_sessions(sessions)),
        })
    }

    /// Composes, or releases both sides and fails.
    async fn finish(&self, old: Option<Lease>, new: Option<Lease>) -> Result<Lease, LockError> {
        match self.compose(old.as_ref(), new.as_ref()) {
            Ok(lease) => Ok(lease),
            Err(e) => {
                self.release_parts(old.as_ref(), new.as_ref()).await;
                Err(e)
            }
        }
    }

    /// Best-effort release of both parts (new, then old), each attempted.
    async fn release_parts(&self, old: Option<&Lease>, new: Option<&Lease>) {
        if let Some(new) = new {
            let _ = self.new.release(new).await;
        }
        if let Some(old) = old {
            let _ = self.old.release(old).await;
        }
    }

    /// Splits a composite lease back into its parts.
    fn split(
        lease: &Lease,
        operation: Operation,
    ) -> Result<(Option<Lease>, Option<Lease>), LockError> {
        let bad = || {
            LockError::invalid_argument(operation, "not a lease of a migration backend")
                .with_key(lease.key())
        };
        let mut parts = lease.backend_data().split('|');
        if parts.next() != Some("m1") {
            return Err(bad());
        }
        // The composite's owner is part of its identity: a lease with the
        // same inner handles but another owner is not ours.
        if parts.next() != Some(lease.owner().to_hex().as_str()) {
            return Err(LockError::new(
                ErrorKind::NotHeld,
                operation,
                "the lease's owner does not match its migration grant",
            )
            .with_key(lease.key()));
        }
        let mut part = || -> Result<Option<Lease>, LockError> {
            match parts.next().ok_or_else(bad)? {
                "-" => Ok(None),
                handle => Lease::from_handle(handle).map(Some),
            }
        };
        let old = part()?;
        let new = part()?;
        Ok((old, new))
    }

    fn empty_error(operation: Operation) -> LockError {
        LockError::invalid_argument(operation, "migration lease holds no backend lease")
    }

    /// The cutover check of the `Old` phase, made after the old-backend
    /// grant or renewal: fails when the marker is set (or cannot be read).
    async fn check_not_cut_over(
        &self,
        key: &LockKey,
        operation: Operation,
    ) -> Result<(), LockError> {
        match self.old.inspect(&self.cutover_key).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => {
                let kind = if operation == Operation::Renew {
                    ErrorKind::LeaseLost
                } else {
                    ErrorKind::Config
                };
                let detail = if operation == Operation::Renew {
                    "; the old-backend lease is left to expire"
                } else {
                    ""
                };
                Err(LockError::new(
                    kind,
                    operation,
                    format!(
                        "{MOVED} (the cutover marker {:?} of migration {:?} is set in the old backend{detail})",
                        self.cutover_key.as_str(),
                        self.name
                    ),
                )
                .with_key(key))
            }
            Err(e) => Err(LockError::new(
                e.kind(),
                operation,
                format!(
                    "cannot read the migration's cutover marker: {}",
                    e.message()
                ),
            )
            .with_key(key)
            .with_source(e)),
        }
    }

    /// An `Old`-phase grant: refused (and released) when its token is in
    /// our epoch or the fleet has cut over.
    async fn admit_old(&self, old: Lease, operation: Operation) -> Result<Lease, LockError> {
        let checked = match self.check_old_epoch(&old, operation) {
            Ok(()) => self.check_not_cut_over(old.key(), operation).await,
            Err(e) => Err(e),
        };
        if let Err(e) = checked {
            let _ = self.old.release(&old).await;
            return Err(e);
        }
        self.finish(Some(old), None).await
    }

    /// Phase `New`: makes sure the cutover marker exists in the old
    /// backend (announcing it if not). `None` once the marker is older than
    /// the wait-out (from then on the old backend is not consulted again);
    /// otherwise the instant at which it will be.
    async fn cutover_pending(&self) -> Result<Option<Instant>, LockError> {
        if self.cutover.done.load(Ordering::Acquire) {
            return Ok(None);
        }
        let _turn = self.cutover.turn.lock().await;
        if self.cutover.done.load(Ordering::Acquire) {
            return Ok(None);
        }
        let needed = self.old_lease_max + clock_drift(self.old_lease_max);
        let server_age_counts = self.old.capabilities().ttl_model == TtlModel::PerLease;
        let mut attempts = 0;
        let (now, server_age) = loop {
            let now = Instant::now();
            match self.old.inspect(&self.cutover_key).await? {
                Some(info) => {
                    let age = info
                        .remaining_ttl
                        .filter(|_| server_age_counts)
                        .map(|left| MAX_TTL.saturating_sub(left));
                    break (now, age);
                }
                None => {
                    self.cutover.set_first_seen(None);
                    if self
                        .old
                        .try_acquire(&self.cutover_key, MAX_TTL)
                        .await?
                        .is_some()
                    {
                        // Never renewed or released: it lasts its TTL.
                        tracing::info!(
                            migration = %self.name,
                            marker = %self.cutover_key,
                            "announced the cutover to the new backend in the old backend"
                        );
                        break (now, Some(Duration::ZERO));
                    }
                    // Someone announced between our read and our take.
                    attempts += 1;
                    if attempts >= 5 {
                        return Err(LockError::new(
                            ErrorKind::Unavailable,
                            Operation::Acquire,
                            "the migration's cutover marker is neither readable nor free in the old backend",
                        )
                        .with_key(&self.cutover_key));
                    }
                    sleep(Duration::from_millis(5)).await;
                }
            }
        };
        let first_seen = self.cutover.first_seen().unwrap_or(now);
        self.cutover.set_first_seen(Some(first_seen));
        let age = server_age
            .unwrap_or(Duration::ZERO)
            .max(now.saturating_duration_since(first_seen));
        if age >= needed {
            self.cutover.done.store(true, Ordering::Release);
            return Ok(None);
        }
        Ok(Some(now.checked_add(needed - age).unwrap_or(now)))
    }

    /// Phase `New` before the wait-out has passed: proves that no `Old`
    /// promise on `key` is open by taking `key` once in the old backend
    /// (after the marker was confirmed) and giving it straight back.
    /// `Ok(false)` when the key stayed held at `deadline`.
    async fn clear_old_side(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Option<Instant>,
        ready_at: Instant,
    ) -> Result<bool, LockError> {
        let old = match deadline {
            None => match self.old.try_acquire(key, ttl).await? {
                Some(old) => old,
                None => return Ok(false),
            },
            Some(deadline) => match self.old.acquire(key, ttl, deadline.min(ready_at)).await {
                Ok(old) => old,
                // Held all along until the wait-out passed: every old
                // promise has ended by now.
                Err(e) if e.is_contended() && Instant::now() >= ready_at => return Ok(true),
                Err(e) if e.is_contended() => return Ok(false),
                Err(e) => return Err(e),
            },
        };
        // If this release fails the old lease expires with its TTL; `Old`
        // processes are refused meanwhile and `Dual` ones wait.
        let _ = self.old.release(&old).await;
        Ok(true)
    }

    fn cutover_contended(&self, key: &LockKey) -> LockError {
        LockError::new(
            ErrorKind::Contended,
            Operation::Acquire,
            "still held in the old backend at the wait deadline (phase new takes each key once in the old backend until the cutover's wait-out has passed)",
        )
        .with_key(key)
    }

    /// Phase `Dual`: waits for the new-side grant while renewing the old
    /// lease. Hands the old lease back (with its current deadline) either
    /// way.
    async fn acquire_new_keeping_old(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
        mut old: Lease,
    ) -> (Lease, Result<Lease, LockError>) {
        enum Step {
            Granted(Result<Lease, LockError>),
            Renewed(Result<Instant, LockError>),
            Renew,
            OldExpired,
        }
        let interval = (ttl / 3).max(Duration::from_millis(1));
        let acquire = self.new.acquire(key, ttl, deadline);
        tokio::pin!(acquire);
        let mut next_renewal = Instant::now() + interval;
        let mut renewal: Option<Renewal> = None;
        loop {
            let old_deadline = old.validity_deadline();
            let step = tokio::select! {
                biased;
                granted = &mut acquire => Step::Granted(granted),
                renewed = poll_renewal(&mut renewal), if renewal.is_some() => Step::Renewed(renewed),
                () = sleep_until(next_renewal), if renewal.is_none() => Step::Renew,
                () = sleep_until(old_deadline) => Step::OldExpired,
            };
            match step {
                Step::Granted(granted) => return (old, granted),
                Step::Renew => {
                    let (backend, lease) = (self.old.clone(), old.clone());
                    renewal = Some(Box::pin(async move { backend.renew(&lease).await }));
                }
                Step::Renewed(Ok(until)) => {
                    renewal = None;
                    old.set_validity_deadline(until);
                    next_renewal = Instant::now() + interval;
                }
                Step::Renewed(Err(e))
                    if matches!(e.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost) =>
                {
                    let lost = LockError::new(
                        ErrorKind::LeaseLost,
                        Operation::Acquire,
                        format!("the old backend's lease was lost while waiting for the new backend: {}", e.message()),
                    )
                    .with_key(key)
                    .with_source(e);
                    return (old, Err(lost));
                }
                Step::Renewed(Err(_)) => {
                    renewal = None;
                    next_renewal = Instant::now() + (interval / 4).max(Duration::from_millis(5));
                }
                Step::OldExpired => {
                    let lost = LockError::new(
                        ErrorKind::LeaseLost,
                        Operation::Acquire,
                        "the old backend's lease ran out (renewals failed) while waiting for the new backend",
                    )
                    .with_key(key);
                    return (old, Err(lost));
                }
            }
        }
    }
}

/// An old-side renewal in flight while a dual acquire waits.
type Renewal = Pin<Box<dyn Future<Output = Result<Instant, LockError>> + Send>>;

async fn poll_renewal(renewal: &mut Option<Renewal>) -> Result<Instant, LockError> {
    match renewal {
        Some(future) => future.as_mut().await,
        None => std::future::pending().await,
    }
}

/// The first error of two, preferring a final one (the lease is gone) over
/// a temporary one.
fn worse(a: LockError, b: LockError) -> LockError {
    let lost = |e: &LockError| matches!(e.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost);
    if !lost(&a) && lost(&b) { b } else { a }
}

/// One receiver that is `Lost` when any input is lost, `Suspect` when any
/// is suspect, `Alive` otherwise.
fn merge_sessions(inputs: Vec<watch::Receiver<SessionState>>) -> watch::Receiver<SessionState> {
    let combine = |inputs: &[watch::Receiver<SessionState>]| {
        let states: Vec<SessionState> = inputs.iter().map(|r| r.borrow().clone()).collect();
        if let Some(lost) = states.iter().find(|s| matches!(s, SessionState::Lost(_))) {
            lost.clone()
        } else if states.contains(&SessionState::Suspect) {
            SessionState::Suspect
        } else {
            SessionState::Alive
        }
    };
    let (tx, rx) = watch::channel(combine(&inputs));
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(async move {
            let mut inputs = inputs;
            loop {
                let changed = inputs.iter_mut().map(|r| Box::pin(r.changed()));
                let (result, _, _) = futures_select_all(changed.collect()).await;
                let state = if result.is_err() {
                    SessionState::Lost("session closed".to_owned())
                } else {
                    combine(&inputs)
                };
                let terminal = matches!(state, SessionState::Lost(_));
                if tx.send(state).is_err() || terminal {
                    return;
                }
            }
        });
    }
    rx
}

/// The first of several futures to finish (a tiny `select_all`).
async fn futures_select_all<F: std::future::Future + Unpin>(
    mut futures: Vec<F>,
) -> (F::Output, usize, Vec<F>) {
    std::future::poll_fn(move |cx| {
        for (i, fut) in futures.iter_mut().enumerate() {
            if let std::task::Poll::Ready(out) = std::pin::Pin::new(fut).poll(cx) {
                return std::task::Poll::Ready((out, i, Vec::new()));
            }
        }
        std::task::Poll::Pending
    })
    .await
}

#[async_trait]
impl LockBackend for MigrationBackend {
    fn name(&self) -> &'static str {
        "migration"
    }

    fn capabilities(&self) -> Capabilities {
        let old = self.old.capabilities();
        let new = self.new.capabilities();
        match self.phase {
            MigrationPhase::Old => old,
            MigrationPhase::New => Capabilities {
                fencing: match new.fencing {
                    FencingScope::None => FencingScope::None,
                    _ => FencingScope::PerKey,
                },
                ..new
            },
            MigrationPhase::Dual => Capabilities {
                fencing: match new.fencing {
                    FencingScope::None => FencingScope::None,
                    _ => FencingScope::PerKey,
                },
                fencing_survives_failover: new.fencing_survives_failover,
                grants_survive_restart: new.grants_survive_restart && old.grants_survive_restart,
                waiting: if old.waiting == WaitStrategy::Notify
                    && new.waiting == WaitStrategy::Notify
                {
                    WaitStrategy::Notify
                } else {
                    WaitStrategy::Poll
                },
                fifo: false,
                ttl_model: if old.ttl_model == TtlModel::PerSession
                    || new.ttl_model == TtlModel::PerSession
                {
                    TtlModel::PerSession
                } else {
                    TtlModel::PerLease
                },
                // Exclusion in this phase rests on both stores.
                linearizable: old.linearizable && new.linearizable,
                min_ttl: old.min_ttl.max(new.min_ttl),
                shared_locks: false,
                semaphores: false,
            },
        }
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.check_key(key, Operation::TryAcquire)?;
        match self.phase {
            MigrationPhase::Old => match self.old.try_acquire(key, ttl).await? {
                Some(old) => self.admit_old(old, Operation::TryAcquire).await.map(Some),
                None => Ok(None),
            },
            MigrationPhase::New => {
                if let Some(ready_at) = self.cutover_pending().await?
                    && !self.clear_old_side(key, ttl, None, ready_at).await?
                {
                    return Ok(None);
                }
                match self.new.try_acquire(key, ttl).await? {
                    Some(new) => self.finish(None, Some(new)).await.map(Some),
                    None => Ok(None),
                }
            }
            MigrationPhase::Dual => {
                let Some(old) = self.old.try_acquire(key, ttl).await? else {
                    return Ok(None);
                };
                if let Err(e) = self.check_old_epoch(&old, Operation::TryAcquire) {
                    let _ = self.old.release(&old).await;
                    return Err(e);
                }
                let new = match self.new.try_acquire(key, ttl).await {
                    Ok(Some(new)) => new,
                    other => {
                        // Never keep the first lock without the second.
                        let _ = self.old.release(&old).await;
                        return other.map(|_| None);
                    }
                };
                self.finish(Some(old), Some(new)).await.map(Some)
            }
        }
    }

    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.check_key(key, Operation::Acquire)?;
        match self.phase {
            MigrationPhase::Old => {
                let old = self.old.acquire(key, ttl, deadline).await?;
                self.admit_old(old, Operation::Acquire).await
            }
            MigrationPhase::New => {
                if let Some(ready_at) = self.cutover_pending().await?
                    && !self
                        .clear_old_side(key, ttl, Some(deadline), ready_at)
                        .await?
                {
                    return Err(self.cutover_contended(key));
                }
                let new = self.new.acquire(key, ttl, deadline).await?;
                self.finish(None, Some(new)).await
            }
            MigrationPhase::Dual => {
                // Always old first, then new: one global order, no deadlock
                // between dual processes.
                let old = self.old.acquire(key, ttl, deadline).await?;
                // Gives the old lease back if this future is dropped.
                let mut pending = ReleaseOnDrop::new(self.old.clone(), old.clone());
                if let Err(e) = self.check_old_epoch(&old, Operation::Acquire) {
                    pending.disarm();
                    let _ = self.old.release(&old).await;
                    return Err(e);
                }
                let (old, new) = self.acquire_new_keeping_old(key, ttl, deadline, old).await;
                pending.disarm();
                match new {
                    Ok(new) => self.finish(Some(old), Some(new)).await,
                    Err(e) => {
                        let _ = self.old.release(&old).await;
                        Err(e)
                    }
                }
            }
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        let (old, new) = Self::split(lease, Operation::Renew)?;
        match (&old, &new) {
            (Some(old), Some(new)) => {
                let (a, b) = tokio::join!(self.old.renew(old), self.new.renew(new));
                match (a, b) {
                    (Ok(a), Ok(b)) => Ok(a.min(b)),
                    (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
                    (Err(a), Err(b)) => Err(worse(a, b)),
                }
            }
            (Some(old), None) => {
                let until = self.old.renew(old).await?;
                // An old-only lease belongs to phase `Old`: once the fleet
                // has cut over it may not be extended (the new deadline is
                // not handed back, so the previous one stays in force).
                self.check_not_cut_over(lease.key(), Operation::Renew)
                    .await?;
                Ok(until)
            }
            (None, Some(new)) => self.new.renew(new).await,
            (None, None) => Err(Self::empty_error(Operation::Renew)),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let (old, new) = match Self::split(lease, Operation::Release) {
            Ok(parts) => parts,
            Err(e) if e.is_not_held() => return Ok(false),
            Err(e) => return Err(e),
        };
        if old.is_none() && new.is_none() {
            return Err(Self::empty_error(Operation::Release));
        }
        // Reverse of the acquire order: new, then old; the second is
        // attempted whatever happened to the first.
        let new_result = match &new {
            Some(new) => Some(self.new.release(new).await),
            None => None,
        };
        let old_result = match &old {
            Some(old) => Some(self.old.release(old).await),
            None => None,
        };
        let mut held = true;
        let mut first_error = None;
        for result in [new_result, old_result].into_iter().flatten() {
            match result {
                Ok(h) => held &= h,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(held),
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.check_key(key, Operation::Inspect)?;
        let base = self.epoch_base();
        let epoch = |mut info: LockInfo| {
            info.token = info.token.map(|t| FencingToken::new(base | t.get()));
            info
        };
        match self.phase {
            MigrationPhase::Old => self.old.inspect(key).await,
            MigrationPhase::New => Ok(self.new.inspect(key).await?.map(epoch)),
            MigrationPhase::Dual => {
                if let Some(info) = self.new.inspect(key).await? {
                    return Ok(Some(epoch(info)));
                }
                // Held in the old store only: a process still on `old` (or a
                // dual acquire half-way). Say so, so operators can find them.
                Ok(self.old.inspect(key).await?.map(|mut info| {
                    info.holder = format!("old-only:{}", info.holder);
                    info
                }))
            }
        }
    }
}

/// Releases a lease in the background if the acquire that holds it is
/// dropped before it can hand it out.
struct ReleaseOnDrop {
    backend: Arc<dyn LockBackend>,
    lease: Option<Lease>,
}

impl ReleaseOnDrop {
    fn new(backend: Arc<dyn LockBackend>, lease: Lease) -> Self {
        Self {
            backend,
            lease: Some(lease),
        }
    }

    fn disarm(&mut self) {
        self.lease = None;
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if let (Some(lease), Ok(handle)) =
            (self.lease.take(), tokio::runtime::Handle::try_current())
        {
            let backend = self.backend.clone();
            handle.spawn(async move {
                let _ = backend.release(&lease).await;
            });
        }
    }
}

#[cfg(test)]
mod tests;
