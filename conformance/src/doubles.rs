//! Deliberately broken backends, for the tests that prove a check can
//! fail: a [`Flawed`] backend runs every call through a correct inner
//! backend (normally the in-memory service) and lets a [`Flaw`] spoil what
//! comes back, the way a driver bug would. [`FlawedTarget`] makes them a
//! [`Target`], with a proxied client over the in-process fault link so the
//! proxy scenarios run against them too.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::election::ElectionPage;
use lock_core::{
    Admin, Capabilities, Downgrade, Facets, GcReport, GrantRequest, HolderInfo, HolderWatch, Lease,
    LeaseKind, ListQuery, Listing, LockBackend, LockBackendExt, LockError, LockInfo, LockKey,
    LockPage, LockShape, LockWrapper, MemoryBackend, OwnerId, SharedPage, WatchRequest,
};
use tokio::time::Instant;

use crate::harness::Target;
use crate::process::HarnessError;
use crate::proxy::FaultProxy;

/// What a [`Flawed`] backend gets wrong. Every hook defaults to the
/// correct behaviour, so a flaw overrides only its own mistake.
pub trait Flaw: fmt::Debug + Send + Sync + 'static {
    /// The name reported by the backend.
    fn name(&self) -> &'static str {
        "flawed"
    }

    /// The capabilities reported, from the inner backend's.
    fn capabilities(&self, inner: Capabilities) -> Capabilities {
        inner
    }

    /// A grant of the inner backend, as handed to the caller.
    fn grant(&self, lease: Lease) -> Lease {
        lease
    }

    /// The inner backend found the key held: a flaw may grant anyway.
    fn contended(&self, key: &LockKey, ttl: Duration) -> Option<Lease> {
        let _ = (key, ttl);
        None
    }

    /// The inner backend's answer to a renewal, as handed to the caller.
    ///
    /// # Errors
    ///
    /// Whatever the flaw makes of `result`.
    fn renew(
        &self,
        lease: &Lease,
        result: Result<Instant, LockError>,
    ) -> Result<Instant, LockError> {
        let _ = lease;
        result
    }

    /// The inner backend's answer to a release, as handed to the caller.
    ///
    /// # Errors
    ///
    /// Whatever the flaw makes of `result`.
    fn release(&self, lease: &Lease, result: Result<bool, LockError>) -> Result<bool, LockError> {
        let _ = lease;
        result
    }

    /// The kind asked of the inner backend for a request of `kind` (a
    /// flaw may serve reads as writes).
    fn inner_kind(&self, kind: LeaseKind) -> LeaseKind {
        kind
    }

    /// The inner backend refused a grant of `kind`: a flaw may grant
    /// anyway (a reader beside a writer, one permit too many).
    fn contended_kind(&self, key: &LockKey, kind: LeaseKind, ttl: Duration) -> Option<Lease> {
        let _ = (key, kind, ttl);
        None
    }

    /// Whether a downgrade releases the write lease and then takes a read
    /// lease (leaving a gap a writer can enter) instead of converting it.
    fn downgrade_with_gap(&self) -> bool {
        false
    }

    /// Whether a waiting writer only polls (never queues), so a stream of
    /// readers can keep it out for ever.
    fn writers_poll(&self) -> bool {
        false
    }

    /// The inner backend's `inspect` answer (the mutex's holder), as
    /// handed to the caller (then through [`holders`](Self::holders)).
    fn inspect(&self, info: Option<LockInfo>) -> Option<LockInfo> {
        info
    }

    /// The inner backend's `list` page, as handed to the caller.
    fn list(&self, page: LockPage) -> LockPage {
        page
    }

    /// The inner backend's `holders` answer (of any shape), as handed to
    /// the caller.
    fn holders(&self, holders: Vec<HolderInfo>) -> Vec<HolderInfo> {
        holders
    }

    /// The inner backend's `list_shared` page, as handed to the caller.
    fn list_shared(&self, page: SharedPage) -> SharedPage {
        page
    }

    /// `force_release` of `key` happened in the inner backend.
    fn forced(&self, key: &LockKey) {
        let _ = key;
    }

    /// Whether `watch_holder` misses every change: the backend then claims
    /// a [`HolderWatch`] facet that sleeps to its deadline and reports the
    /// holder the caller had seen.
    fn watch_misses(&self) -> bool {
        false
    }

    /// Whether `renew_many` is a no-op that says it renewed: it sends
    /// nothing and answers each lease with a fresh deadline (its TTL from
    /// now), like a driver whose batched renewal never reaches the server.
    /// `renew` stays correct.
    fn renew_many_is_a_no_op(&self) -> bool {
        false
    }
}

/// A correct backend with a [`Flaw`] on top.
///
/// Its facets: [`Admin`] where the inner backend has one (its pages and
/// forced releases pass through the flaw), [`Downgrade`] where the inner
/// backend has one or the flaw downgrades with a gap, and [`HolderWatch`]
/// when the flaw's watch misses every change (otherwise `watch_holder`
/// polls this backend's flawed `inspect`). No elections of its own (a
/// campaign is a grant of the election's mutex, through the flaw) and no
/// lock sets (a set is taken key by key, through the flaw).
#[derive(Debug)]
pub struct Flawed<F> {
    inner: Arc<dyn LockBackend>,
    flaw: Arc<F>,
}

impl<F: Flaw> Flawed<F> {
    /// `inner` with `flaw`.
    pub fn new(inner: Arc<dyn LockBackend>, flaw: Arc<F>) -> Self {
        Self { inner, flaw }
    }

    /// A mutex tried once: the inner grant through the flaw, or the flaw's
    /// grant of a held key.
    async fn try_take(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        Ok(match self.inner.try_acquire(key, ttl).await? {
            Some(lease) => Some(self.flaw.grant(lease)),
            None => self.flaw.contended(key, ttl),
        })
    }

    /// A mutex waited for: tried once through the flaw, then the inner
    /// wait.
    async fn take_waiting(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        if let Some(lease) = self.try_take(key, ttl).await? {
            return Ok(lease);
        }
        Ok(self
            .flaw
            .grant(self.inner.acquire(key, ttl, deadline).await?))
    }

    /// A share tried once, of the kind the flaw asks for.
    async fn try_share(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        let asked = self.flaw.inner_kind(kind);
        Ok(match self.inner.try_acquire_kind(key, asked, ttl).await? {
            Some(lease) => Some(self.flaw.grant(lease)),
            None => self.flaw.contended_kind(key, kind, ttl),
        })
    }

    /// A share waited for (a writer only polling, where the flaw says so).
    async fn share_waiting(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        if let Some(lease) = self.try_share(key, kind, ttl).await? {
            return Ok(lease);
        }
        if kind == LeaseKind::Write && self.flaw.writers_poll() {
            while Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if let Some(lease) = self.try_share(key, kind, ttl).await? {
                    return Ok(lease);
                }
            }
            return Err(LockError::new(
                lock_core::ErrorKind::Contended,
                lock_core::Operation::Acquire,
                "still held at the deadline",
            ));
        }
        let asked = self.flaw.inner_kind(kind);
        Ok(self
            .flaw
            .grant(self.inner.acquire_kind(key, asked, ttl, deadline).await?))
    }
}

#[async_trait]
impl<F: Flaw> LockWrapper for Flawed<F> {
    fn inner(&self) -> &dyn LockBackend {
        &*self.inner
    }

    fn name(&self) -> &'static str {
        self.flaw.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.flaw.capabilities(self.inner.capabilities())
    }

    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let GrantRequest {
            key,
            kind,
            ttl,
            deadline,
        } = request;
        match (kind, deadline) {
            (LeaseKind::Exclusive, None) => self.try_take(key, ttl).await,
            (LeaseKind::Exclusive, Some(deadline)) => {
                self.take_waiting(key, ttl, deadline).await.map(Some)
            }
            (kind, None) => self.try_share(key, kind, ttl).await,
            (kind, Some(deadline)) => self.share_waiting(key, kind, ttl, deadline).await.map(Some),
        }
    }

    /// The inner batch, each answer through the flaw.
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        if self.flaw.renew_many_is_a_no_op() {
            let now = Instant::now();
            return leases
                .iter()
                .map(|lease| Ok(lock_core::validity_deadline(now, lease.ttl())))
                .collect();
        }
        let mut results = self.inner.renew_many(leases).await.into_iter();
        leases
            .iter()
            .map(|lease| {
                let result = results.next().unwrap_or_else(|| {
                    Err(LockError::new(
                        lock_core::ErrorKind::Backend,
                        lock_core::Operation::Renew,
                        "no answer for this lease in the batch",
                    ))
                });
                self.flaw.renew(lease, result)
            })
            .collect()
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let result = self.inner.release(lease).await;
        self.flaw.release(lease, result)
    }

    /// The mutex's holder through the flaw's `inspect`, then every shape's
    /// holders through its `holders`.
    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        let holders = match shape {
            LockShape::Mutex => {
                lock_core::kind::mutex_holders(self.flaw.inspect(self.inner.inspect(key).await?))
            }
            shape => self.inner.holders(key, shape).await?,
        };
        Ok(self.flaw.holders(holders))
    }

    fn facets(&self) -> Facets<'_> {
        let inner = self.inner.facets();
        Facets {
            listing: inner.listing.map(|_| self as &dyn Listing),
            admin: inner.admin.map(|_| self as &dyn Admin),
            downgrade: (inner.downgrade.is_some() || self.flaw.downgrade_with_gap())
                .then_some(self as &dyn Downgrade),
            holder_watch: self.flaw.watch_misses().then_some(self as &dyn HolderWatch),
            ..Facets::default()
        }
    }
}

#[async_trait]
impl<F: Flaw> Admin for Flawed<F> {
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let broken = self.inner.force_release(key).await?;
        self.flaw.forced(key);
        Ok(broken)
    }

    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError> {
        self.inner.gc(older_than).await
    }
}

#[async_trait]
impl<F: Flaw> Listing for Flawed<F> {
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        Ok(self.flaw.list(self.inner.list(query).await?))
    }

    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        if shape == LockShape::Mutex {
            // Through this wrapper's `list`, so the flaw's page is listed.
            return lock_core::list_mutex_shared(self, query).await;
        }
        Ok(self
            .flaw
            .list_shared(self.inner.list_shared(shape, query).await?))
    }

    /// The default elections' mutexes, through this wrapper's `list`.
    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        lock_core::election::list_mutex_elections(self, query).await
    }
}

#[async_trait]
impl<F: Flaw> Downgrade for Flawed<F> {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        if !self.flaw.downgrade_with_gap() {
            return self.inner.downgrade(lease).await;
        }
        self.inner.release(lease).await?;
        // The gap: anyone waiting for the write lock gets it now.
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let deadline = Instant::now() + lease.ttl();
        self.inner
            .acquire_kind(lease.key(), LeaseKind::Read, lease.ttl(), deadline)
            .await
    }
}

/// Present only for a flaw whose watch misses every change.
#[async_trait]
impl<F: Flaw> HolderWatch for Flawed<F> {
    async fn watch_holder(
        &self,
        request: WatchRequest<'_, LockInfo>,
    ) -> Result<Option<LockInfo>, LockError> {
        if self.flaw.watch_misses() {
            tokio::time::sleep_until(request.deadline).await;
            return Ok(request.seen.cloned());
        }
        // Polls this wrapper's `inspect`, so the flaw's answer is watched.
        lock_core::poll_holder(self, request).await
    }
}

/// A broken driver for round-trip checks: it looks at the key (one
/// [`inspect`](LockBackendExt::inspect)) before every waiting mutex grant,
/// one extra round trip per cycle that a round-trip count must see. It
/// has no `LockSets` and no `Elections` facet, so a multi-lock takes its
/// keys one by one (a look per key) and a campaign is its mutex grant
/// (looked at first); every other facet is the inner backend's.
#[derive(Debug)]
pub struct LooksFirst(pub Arc<dyn LockBackend>);

#[async_trait]
impl LockWrapper for LooksFirst {
    fn inner(&self) -> &dyn LockBackend {
        &*self.0
    }

    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        if request.kind == LeaseKind::Exclusive && request.deadline.is_some() {
            assert!(
                self.0.inspect(request.key).await?.is_none(),
                "the key is free"
            );
        }
        self.0.grant(request).await
    }

    fn facets(&self) -> Facets<'_> {
        Facets {
            lock_sets: None,
            elections: None,
            ..self.0.facets()
        }
    }
}

/// A broken driver for the memory check of held locks at scale
/// ([`crate::scale`]): the inner backend, plus a kilobyte of client-side
/// renewal state per lease it renewed and did not release.
#[derive(Debug)]
pub struct KilobytePerLease {
    inner: Arc<dyn LockBackend>,
    state: std::sync::Mutex<std::collections::HashMap<u128, Vec<u8>>>,
}

impl KilobytePerLease {
    /// `inner` with a kilobyte per renewed lease.
    pub fn new(inner: Arc<dyn LockBackend>) -> Self {
        Self {
            inner,
            state: std::sync::Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u128, Vec<u8>>> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl LockWrapper for KilobytePerLease {
    fn inner(&self) -> &dyn LockBackend {
        &*self.inner
    }
    fn name(&self) -> &'static str {
        "broken-kilobyte-per-lease"
    }
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        {
            let mut state = self.state();
            for lease in leases {
                state
                    .entry(lease.owner().as_u128())
                    .or_insert_with(|| vec![0u8; 1024]);
            }
        }
        self.inner.renew_many(leases).await
    }
    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.state().remove(&lease.owner().as_u128());
        self.inner.release(lease).await
    }
}

/// A grant made up by a flaw, unknown to the inner service.
///
/// # Errors
///
/// Never in practice (the deadline is fresh).
pub fn rogue_lease(
    key: &LockKey,
    ttl: Duration,
    token: lock_core::FencingToken,
) -> Result<Lease, LockError> {
    Lease::granted(
        key.clone(),
        OwnerId::random(),
        token,
        ttl,
        Instant::now(),
        String::new(),
    )
}

/// A lease with another deadline (and the same everything else).
pub fn with_deadline(lease: &Lease, deadline: Instant) -> Lease {
    Lease::from_parts(
        lease.key().clone(),
        lease.owner(),
        lease.token(),
        lease.ttl(),
        deadline,
        lease.backend_data().to_owned(),
    )
}

/// A [`Flaw`] on a fresh in-memory service, as a [`Target`]. Its proxied
/// client is the flawed backend over the in-process fault link (the flaw
/// sits in the client, where a driver's bug would).
#[derive(Debug)]
pub struct FlawedTarget<F> {
    service: MemoryBackend,
    flaw: Arc<F>,
}

impl<F: Flaw> FlawedTarget<F> {
    /// `flaw` on a fresh in-memory service.
    pub fn new(flaw: F) -> Self {
        Self {
            service: MemoryBackend::new(),
            flaw: Arc::new(flaw),
        }
    }

    /// The flaw (shared by every client).
    pub fn flaw(&self) -> &F {
        &self.flaw
    }
}

#[async_trait]
impl<F: Flaw> Target for FlawedTarget<F> {
    fn name(&self) -> String {
        self.flaw.name().to_owned()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(Flawed::new(
            Arc::new(self.service.clone()),
            self.flaw.clone(),
        )))
    }

    async fn proxied_client(
        &self,
    ) -> Result<Option<(Arc<dyn LockBackend>, FaultProxy)>, HarnessError> {
        let (link, proxy) =
            FaultProxy::in_process(Arc::new(self.service.clone()), Duration::from_secs(1));
        Ok(Some((
            Arc::new(Flawed::new(link, self.flaw.clone())),
            proxy,
        )))
    }
}

/// A [`Flaw`] for the lost-signal checks: the client believes every lease
/// runs an hour longer than the store keeps it (a driver that dates its
/// deadlines wrong), so its lost signal comes long after another client
/// could have the key.
#[derive(Debug, Default)]
pub struct HourLongerLeases;

impl Flaw for HourLongerLeases {
    fn grant(&self, lease: Lease) -> Lease {
        with_deadline(
            &lease,
            lease.validity_deadline() + Duration::from_secs(3600),
        )
    }

    fn renew(
        &self,
        _lease: &Lease,
        result: Result<Instant, LockError>,
    ) -> Result<Instant, LockError> {
        result.map(|deadline| deadline + Duration::from_secs(3600))
    }
}

/// `open` with `flaw` on every client it opens.
pub fn flawed_opener<F: Flaw + 'static>(
    open: crate::deploy::Opener,
    flaw: Arc<F>,
) -> crate::deploy::Opener {
    Arc::new(move |url: String| {
        let (open, flaw) = (open.clone(), flaw.clone());
        Box::pin(async move {
            let inner = open(url).await?;
            Ok(Arc::new(Flawed::new(inner, flaw)) as Arc<dyn LockBackend>)
        })
    })
}
