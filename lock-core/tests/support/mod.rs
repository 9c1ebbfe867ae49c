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
    Capabilities, Elections, Facets, GrantRequest, HolderInfo, Lease, LockBackend, LockBackendExt,
    LockClient, LockError, LockKey, LockShape, MemoryBackend, RENEW_CONCURRENCY, WatchRequest,
    async_trait, poll_leader, renew_concurrently,
};

/// What a test double changes of the memory service it wraps.
///
/// A grant (of any kind, tried once or waited for) passes
/// [`before_grant`](Self::before_grant), the memory service,
/// [`after_grant`](Self::after_grant), then [`granted`](Self::granted).
/// Renewals, releases and elections default to the memory service's
/// (a batch renewal to [`renew`](Self::renew) of each lease). The double
/// has an [`Elections`] facet only when [`ELECTIONS`](Self::ELECTIONS)
/// says so; otherwise it elects through the mutex, as a backend without
/// the facet does. It has no other facet: a double is a hand-written
/// backend of the kernel alone.
#[async_trait]
pub(crate) trait Twist: fmt::Debug + Send + Sync + 'static {
    /// The name the double reports.
    const NAME: &'static str;

    /// Whether [`campaign`](Self::campaign) and [`leader`](Self::leader)
    /// are the double's own elections (an [`Elections`] facet).
    const ELECTIONS: bool = false;

    /// Before a grant request reaches the memory service.
    async fn before_grant(&self) {}

    /// After the memory service answered a grant request.
    async fn after_grant(&self) {}

    /// A grant of the memory service, as handed to the caller.
    fn granted(&self, lease: Lease) -> Lease {
        lease
    }

    /// One lease's renewal.
    async fn renew(&self, memory: &MemoryBackend, lease: &Lease) -> Result<Instant, LockError> {
        memory.renew(lease).await
    }

    /// A batch's renewal: [`renew`](Self::renew) of each lease.
    async fn renew_many(
        &self,
        memory: &MemoryBackend,
        leases: &[&Lease],
    ) -> Vec<Result<Instant, LockError>> {
        renew_concurrently(leases, RENEW_CONCURRENCY, |lease| self.renew(memory, lease)).await
    }

    async fn release(&self, memory: &MemoryBackend, lease: &Lease) -> Result<bool, LockError> {
        memory.release(lease).await
    }

    /// The facet's campaign, when [`ELECTIONS`](Self::ELECTIONS).
    async fn campaign(
        &self,
        memory: &MemoryBackend,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        memory.campaign(election, ttl, deadline).await
    }

    /// The facet's leader, when [`ELECTIONS`](Self::ELECTIONS).
    async fn leader(
        &self,
        memory: &MemoryBackend,
        election: &LockKey,
    ) -> Result<Option<Leader>, LockError> {
        memory.leader(election).await
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

    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        self.twist.before_grant().await;
        let lease = self.memory.grant(request).await?;
        self.twist.after_grant().await;
        Ok(lease.map(|lease| self.twist.granted(lease)))
    }

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        self.twist.renew_many(&self.memory, leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.twist.release(&self.memory, lease).await
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        self.memory.holders(key, shape).await
    }

    fn facets(&self) -> Facets<'_> {
        Facets {
            elections: T::ELECTIONS.then_some(self as &dyn Elections),
            ..Facets::default()
        }
    }
}

#[async_trait]
impl<T: Twist> Elections for Double<T> {
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.twist
            .campaign(&self.memory, election, ttl, deadline)
            .await
    }

    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        self.twist.leader(&self.memory, election).await
    }

    async fn watch_leader(
        &self,
        request: WatchRequest<'_, Leader>,
    ) -> Result<Option<Leader>, LockError> {
        poll_leader(self, request).await
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
