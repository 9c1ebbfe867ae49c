//! The memory backend's read-write locks and semaphores: per key, a list of
//! holders (each a lease of its own) and one FIFO queue of waiters.
//!
//! A request is granted when it fits beside the current holders *and* no
//! earlier waiter is still queued: a waiting writer therefore keeps new
//! readers out (no writer starvation), and a waiting request for many
//! permits is not overtaken by later small ones. A release, an expiry or a
//! downgrade hands the key on to the head of the queue, as far as the
//! queue fits.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{MemoryBackend, NAME, Queue, Registration};
use crate::backend::GrantRequest;
use crate::error::{ErrorKind, LockError, Operation};
use crate::holder::HolderDetails;
use crate::key::LockKey;
use crate::kind::{HolderInfo, LeaseKind, LockShape};
use crate::types::{FencingToken, Lease, ListQuery, OwnerId, SharedLockInfo, SharedPage};

pub(super) type SharedKeys = HashMap<(LockShape, LockKey), SharedState>;

#[derive(Debug, Default)]
pub(super) struct SharedState {
    holders: Vec<ShareHolder>,
    waiters: VecDeque<ShareWaiter>,
    /// The token of the last write grant (read grants carry it); kept while
    /// the key is idle so read tokens never go back to 0.
    epoch: u64,
    /// The semaphore's limit while anyone holds or waits.
    limit: Option<u32>,
}

#[derive(Debug)]
struct ShareHolder {
    owner: OwnerId,
    kind: LeaseKind,
    token: u64,
    expires_at: Instant,
    granted_at_ms: u64,
}

impl ShareHolder {
    fn info(&self, now: Instant) -> HolderInfo {
        HolderInfo {
            kind: self.kind,
            holder: self.owner.to_hex(),
            token: Some(FencingToken::new(self.token)),
            remaining_ttl: Some(self.expires_at.saturating_duration_since(now)),
            details: Some(HolderDetails::of_this_process(self.granted_at_ms)),
        }
    }
}

#[derive(Debug)]
struct ShareWaiter {
    id: u64,
    kind: LeaseKind,
    ttl: Duration,
    tx: oneshot::Sender<Lease>,
}

impl SharedState {
    fn reap(&mut self, now: Instant) {
        self.holders.retain(|h| h.expires_at > now);
        self.waiters.retain(|w| !w.tx.is_closed());
        if self.holders.is_empty() && self.waiters.is_empty() {
            self.limit = None;
        }
    }

    /// Whether `kind` fits beside the current holders (queue ignored).
    fn fits(&self, kind: LeaseKind) -> bool {
        match kind {
            LeaseKind::Read => self.holders.iter().all(|h| h.kind == LeaseKind::Read),
            LeaseKind::Write | LeaseKind::Exclusive => self.holders.is_empty(),
            LeaseKind::Permits { count, limit } => {
                let held: u64 = self
                    .holders
                    .iter()
                    .map(|h| match h.kind {
                        LeaseKind::Permits { count, .. } => u64::from(count),
                        _ => u64::from(limit),
                    })
                    .sum();
                held + u64::from(count) <= u64::from(limit)
            }
        }
    }

    /// Refuses a semaphore limit other than the one in use.
    fn check_limit(&self, kind: LeaseKind, key: &LockKey) -> Result<(), LockError> {
        if let (LeaseKind::Permits { limit, .. }, Some(in_use)) = (kind, self.limit)
            && limit != in_use
        {
            return Err(LockError::invalid_argument(
                Operation::Acquire,
                format!(
                    "the semaphore is in use with a limit of {in_use} permits; this request says {limit}"
                ),
            )
            .with_key(key)
            .with_backend(NAME));
        }
        Ok(())
    }

    fn note_limit(&mut self, kind: LeaseKind) {
        if let LeaseKind::Permits { limit, .. } = kind {
            self.limit = Some(limit);
        }
    }

    fn holder_mut(&mut self, owner: OwnerId, kind: LeaseKind) -> Option<&mut ShareHolder> {
        self.holders
            .iter_mut()
            .find(|h| h.owner == owner && h.kind == kind)
    }
}

impl Queue for SharedState {
    fn hand_off(&mut self, backend: &MemoryBackend, key: &LockKey, now: Instant) {
        backend.hand_off_shares(key, self, now);
    }

    fn next_expiry(&self) -> Option<Instant> {
        self.holders.iter().map(|h| h.expires_at).min()
    }

    fn withdraw(&mut self, id: u64, raced: Option<Lease>) {
        self.waiters.retain(|w| w.id != id);
        if let Some(lease) = raced {
            self.holders
                .retain(|h| !(h.owner == lease.owner() && h.kind == lease.kind()));
        }
    }

    fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.waiters.is_empty() && self.epoch == 0
    }
}

impl MemoryBackend {
    fn shared_keys(&self) -> std::sync::MutexGuard<'_, SharedKeys> {
        super::locked(&self.inner.shared)
    }

    fn grant_share(
        &self,
        key: &LockKey,
        state: &mut SharedState,
        kind: LeaseKind,
        ttl: Duration,
        now: Instant,
    ) -> Lease {
        let owner = OwnerId::random();
        let token = match kind {
            LeaseKind::Read => state.epoch,
            _ => {
                let token = self.next_token();
                if kind == LeaseKind::Write {
                    state.epoch = token;
                }
                token
            }
        };
        state.note_limit(kind);
        state.holders.push(ShareHolder {
            owner,
            kind,
            token,
            expires_at: now + ttl,
            granted_at_ms: crate::holder::now_ms(),
        });
        super::fresh_lease(key, owner, token, ttl, now).with_kind(kind)
    }

    /// Grants the head of the queue while it fits (under the store's lock;
    /// each grant dated when it is made, as [`MemoryBackend::hand_off`]
    /// explains).
    fn hand_off_shares(&self, key: &LockKey, state: &mut SharedState, now: Instant) {
        state.reap(now);
        while let Some(head) = state.waiters.front() {
            if head.tx.is_closed() {
                state.waiters.pop_front();
                continue;
            }
            if !state.fits(head.kind) {
                return;
            }
            let Some(waiter) = state.waiters.pop_front() else {
                return;
            };
            let lease = self.grant_share(key, state, waiter.kind, waiter.ttl, Instant::now());
            if waiter.tx.send(lease).is_err() {
                state.holders.pop();
            }
        }
    }

    fn check_kind(kind: LeaseKind, key: &LockKey, operation: Operation) -> Result<(), LockError> {
        kind.validate(operation)
            .map_err(|e| e.with_key(key).with_backend(NAME))
    }

    /// A try of `request` (a read, write or permit grant).
    pub(super) async fn try_acquire_share(
        &self,
        request: GrantRequest<'_>,
    ) -> Result<Option<Lease>, LockError> {
        let GrantRequest { key, kind, ttl, .. } = request;
        Self::check_kind(kind, key, Operation::TryAcquire)?;
        self.check_fault(Operation::TryAcquire).await?;
        let now = Instant::now();
        let mut keys = self.shared_keys();
        let state = keys.entry((kind.shape(), key.clone())).or_default();
        state.reap(now);
        state.check_limit(kind, key)?;
        if !state.waiters.is_empty() || !state.fits(kind) {
            return Ok(None);
        }
        Ok(Some(self.grant_share(key, state, kind, ttl, now)))
    }

    /// `request` (a read, write or permit grant), waiting until `deadline`.
    pub(super) async fn acquire_share(
        &self,
        request: GrantRequest<'_>,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let GrantRequest { key, kind, ttl, .. } = request;
        Self::check_kind(kind, key, Operation::Acquire)?;
        self.check_fault(Operation::Acquire).await?;
        let shape = kind.shape();
        let (tx, rx) = oneshot::channel();
        let id = self.inner.next_waiter.fetch_add(1, Ordering::Relaxed);
        let expiry = {
            let now = Instant::now();
            let mut keys = self.shared_keys();
            let state = keys.entry((shape, key.clone())).or_default();
            state.reap(now);
            state.check_limit(kind, key)?;
            if state.waiters.is_empty() && state.fits(kind) {
                return Ok(self.grant_share(key, state, kind, ttl, now));
            }
            state.note_limit(kind);
            state.waiters.push_back(ShareWaiter { id, kind, ttl, tx });
            state.next_expiry()
        };
        let granted = Registration::new(
            self,
            key,
            (&self.inner.shared, (shape, key.clone())),
            id,
            rx,
        )
        .wait(expiry, deadline, || {
            format!("cannot take {kind} before the wait deadline")
        })
        .await?;
        super::arrived(granted, |lease| {
            self.release_share(lease);
        })
    }

    fn not_held(lease: &Lease, operation: Operation) -> LockError {
        LockError::new(
            ErrorKind::NotHeld,
            operation,
            "the lease expired or belongs to someone else",
        )
        .with_key(lease.key())
        .with_backend(NAME)
    }

    pub(super) fn renew_share(&self, lease: &Lease) -> Result<Instant, LockError> {
        let now = Instant::now();
        let mut keys = self.shared_keys();
        let kind = lease.kind();
        let held = keys
            .get_mut(&(kind.shape(), lease.key().clone()))
            .and_then(|state| {
                state.reap(now);
                state.holder_mut(lease.owner(), kind)
            });
        match held {
            Some(holder) => {
                holder.expires_at = now + lease.ttl();
                Ok(crate::types::validity_deadline(now, lease.ttl()))
            }
            None => Err(Self::not_held(lease, Operation::Renew)),
        }
    }

    pub(super) fn release_share(&self, lease: &Lease) -> bool {
        let now = Instant::now();
        let kind = lease.kind();
        let map_key = (kind.shape(), lease.key().clone());
        let mut keys = self.shared_keys();
        let Some(state) = keys.get_mut(&map_key) else {
            return false;
        };
        state.reap(now);
        let before = state.holders.len();
        state
            .holders
            .retain(|h| !(h.owner == lease.owner() && h.kind == kind));
        let ours = state.holders.len() < before;
        self.hand_off_shares(lease.key(), state, now);
        if state.is_idle() {
            keys.remove(&map_key);
        }
        ours
    }

    pub(super) async fn downgrade_share(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.check_fault(Operation::Downgrade).await?;
        if lease.kind() != LeaseKind::Write {
            return Err(Self::not_held(lease, Operation::Downgrade));
        }
        let now = Instant::now();
        let mut keys = self.shared_keys();
        let Some(state) = keys.get_mut(&(LockShape::ReadWrite, lease.key().clone())) else {
            return Err(Self::not_held(lease, Operation::Downgrade));
        };
        state.reap(now);
        let Some(holder) = state.holder_mut(lease.owner(), LeaseKind::Write) else {
            return Err(Self::not_held(lease, Operation::Downgrade));
        };
        // In place: the same owner, token and expiry, now a reader; no
        // instant without a holder.
        holder.kind = LeaseKind::Read;
        let expires_at = holder.expires_at;
        let read = Lease::from_parts(
            lease.key().clone(),
            lease.owner(),
            lease.token(),
            lease.ttl(),
            lease.validity_deadline().min(expires_at),
            String::new(),
        )
        .with_kind(LeaseKind::Read);
        self.hand_off_shares(lease.key(), state, now);
        Ok(read)
    }

    pub(super) async fn share_holders(
        &self,
        key: &LockKey,
        shape: LockShape,
    ) -> Result<Vec<HolderInfo>, LockError> {
        self.check_fault(Operation::Inspect).await?;
        let now = Instant::now();
        let mut keys = self.shared_keys();
        let Some(state) = keys.get_mut(&(shape, key.clone())) else {
            return Ok(Vec::new());
        };
        self.hand_off_shares(key, state, now);
        Ok(state.holders.iter().map(|h| h.info(now)).collect())
    }

    /// The keys of `shape` under `prefix` with holders, in key order after
    /// `cursor`, at most `limit`.
    pub(super) async fn list_shares(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        let (prefix, cursor, limit) = query.parts();
        self.check_fault(Operation::Inspect).await?;
        let now = Instant::now();
        let mut keys = self.shared_keys();
        let mut found: Vec<(&LockKey, &mut SharedState)> = keys
            .iter_mut()
            .filter(|((s, k), _)| {
                *s == shape
                    && k.as_str().starts_with(prefix)
                    && cursor.is_none_or(|c| k.as_str() > c)
            })
            .map(|((_, k), state)| (k, state))
            .collect();
        found.sort_by(|a, b| a.0.cmp(b.0));
        let mut page = SharedPage::default();
        for (key, state) in found {
            state.reap(now);
            if state.holders.is_empty() {
                continue;
            }
            if page.locks.len() == limit {
                page.cursor = page.locks.last().map(|l| l.key.as_str().to_owned());
                break;
            }
            page.locks.push(SharedLockInfo {
                key: key.clone(),
                holders: state.holders.iter().map(|h| h.info(now)).collect(),
            });
        }
        Ok(page)
    }
}
