//! Test doubles: the memory service with one behaviour changed. A
//! [`Twist`] writes only what it changes (everything else is the memory
//! service's own); [`Double`] puts it over a memory service as a backend.
//!
//! Shared by the integration tests (`mod support;`) and the crate's unit
//! tests (declared once in lib.rs, `#[path]` to this file): each
//! includer names the crate under test `under_test` (`use lock_core as
//! under_test;`, or `use crate as under_test;` inside the crate).

// Every test crate that includes this uses a part of it.
#![allow(dead_code)]

use std::fmt;
use std::ops::Deref;
use std::time::Duration;

use tokio::time::Instant;

use super::under_test::election::Leader;
use super::under_test::{
    Capabilities, Lease, LeaseKind, LockBackend, LockClient, LockError, LockInfo, LockKey,
    MemoryBackend, async_trait,
};

/// What a test double changes of the memory service it wraps.
///
/// A grant passes [`before_grant`](Self::before_grant), the memory
/// service, [`after_grant`](Self::after_grant), then
/// [`granted`](Self::granted). The other mutex calls default to the memory
/// service's. The calls past the mutex's also get `plain`, the double
/// without that override (the trait's default over the double's mutex
/// calls), and default to it: a double that does not write one behaves as
/// a hand-written backend that left it out.
#[async_trait]
pub(crate) trait Twist: fmt::Debug + Send + Sync + 'static {
    /// The name the double reports.
    const NAME: &'static str;

    /// Before a mutex grant request reaches the memory service.
    async fn before_grant(&self) {}

    /// After the memory service answered a mutex grant request.
    async fn after_grant(&self) {}

    /// A mutex grant of the memory service, as handed to the caller.
    fn granted(&self, lease: Lease) -> Lease {
        lease
    }

    async fn renew(&self, memory: &MemoryBackend, lease: &Lease) -> Result<Instant, LockError> {
        memory.renew(lease).await
    }

    async fn release(&self, memory: &MemoryBackend, lease: &Lease) -> Result<bool, LockError> {
        memory.release(lease).await
    }

    async fn try_acquire_kind(
        &self,
        plain: &dyn LockBackend,
        _memory: &MemoryBackend,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        plain.try_acquire_kind(key, kind, ttl).await
    }

    async fn renew_many(
        &self,
        plain: &dyn LockBackend,
        _memory: &MemoryBackend,
        leases: &[&Lease],
    ) -> Vec<Result<Instant, LockError>> {
        plain.renew_many(leases).await
    }

    async fn campaign(
        &self,
        plain: &dyn LockBackend,
        _memory: &MemoryBackend,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        plain.campaign(election, ttl, deadline).await
    }

    async fn leader(
        &self,
        plain: &dyn LockBackend,
        _memory: &MemoryBackend,
        election: &LockKey,
    ) -> Result<Option<Leader>, LockError> {
        plain.leader(election).await
    }
}

/// A [`Twist`] over a memory service, as a backend (and, through `Deref`,
/// the twist's own state).
#[derive(Debug)]
pub(crate) struct Double<T> {
    memory: MemoryBackend,
    twist: T,
}

impl<T: Twist> Double<T> {
    /// `twist` over `memory` (a clone shares its locks).
    pub(crate) fn new(memory: MemoryBackend, twist: T) -> Self {
        Self { memory, twist }
    }

    /// The memory service behind the double, untwisted.
    pub(crate) fn memory(&self) -> &MemoryBackend {
        &self.memory
    }
}

impl<T> Deref for Double<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.twist
    }
}

#[async_trait]
impl<T: Twist> LockBackend for Double<T> {
    fn name(&self) -> &'static str {
        T::NAME
    }

    fn capabilities(&self) -> Capabilities {
        self.memory.capabilities()
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.twist.before_grant().await;
        let lease = self.memory.try_acquire(key, ttl).await?;
        self.twist.after_grant().await;
        Ok(lease.map(|lease| self.twist.granted(lease)))
    }

    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.twist.before_grant().await;
        let lease = self.memory.acquire(key, ttl, deadline).await?;
        self.twist.after_grant().await;
        Ok(self.twist.granted(lease))
    }

    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        self.twist.renew(&self.memory, lease).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.twist.release(&self.memory, lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.memory.inspect(key).await
    }

    async fn try_acquire_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        self.twist
            .try_acquire_kind(&Plain(self), &self.memory, key, kind, ttl)
            .await
    }

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        self.twist
            .renew_many(&Plain(self), &self.memory, leases)
            .await
    }

    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.twist
            .campaign(&Plain(self), &self.memory, election, ttl, deadline)
            .await
    }

    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        self.twist
            .leader(&Plain(self), &self.memory, election)
            .await
    }
}

/// A double's mutex calls alone: every other method is the trait's
/// default over them.
#[derive(Debug)]
struct Plain<'a, T>(&'a Double<T>);

#[async_trait]
impl<T: Twist> LockBackend for Plain<'_, T> {
    fn name(&self) -> &'static str {
        T::NAME
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.0.try_acquire(key, ttl).await
    }

    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.0.acquire(key, ttl, deadline).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        self.0.renew(lease).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.0.release(lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.0.inspect(key).await
    }
}

/// A grant of `key`, which must be free, for `ttl`.
pub(crate) async fn grant<B: LockBackend + ?Sized>(
    backend: &B,
    key: &LockKey,
    ttl: Duration,
) -> Lease {
    backend
        .try_acquire(key, ttl)
        .await
        .unwrap()
        .expect("the key is free")
}

/// Takes `key` on `client` (a 30 s TTL) and drops the guard: `backend`
/// (under `client`) must have it free again within a second, as
/// [`free_within_a_second`] checks with `released` and `ttl`.
pub(crate) async fn dropped_guard_frees(
    client: &LockClient,
    backend: &MemoryBackend,
    key: &LockKey,
    ttl: Duration,
    released: &str,
) {
    let guard = client
        .lock(key.as_str())
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    drop(guard);
    free_within_a_second(backend, key, ttl, released).await;
}

/// `key` is free again within a second (a dropped guard let it go): takes
/// it and releases it. `released` is the failure message, naming what
/// should have freed it.
pub(crate) async fn free_within_a_second<B: LockBackend + ?Sized>(
    backend: &B,
    key: &LockKey,
    ttl: Duration,
    released: &str,
) {
    let lease = backend
        .acquire(key, ttl, Instant::now() + Duration::from_secs(1))
        .await
        .expect(released);
    assert!(backend.release(&lease).await.unwrap());
}
