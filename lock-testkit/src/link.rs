//! An in-process stand-in for a network link with faults, for backends
//! that have no socket to put a [`FaultProxy`](crate::proxy::FaultProxy)
//! in front of (the in-memory backend and test doubles built on it).
//!
//! Each call crosses the link twice: the request leg, then the server (the
//! wrapped backend) runs it, then the reply leg. Each leg waits the
//! latency (± jitter) that was set when the call was sent; a partition holds a leg until healed (a
//! request the caller gave up on is still delivered afterwards, as TCP
//! would deliver buffered bytes); a blackhole drops it; a reset fails the
//! calls in flight. The caller waits at most its operation timeout (plus
//! the wait of a waiting acquire) and then gets a `Timeout` error, as a
//! driver would.
//!
//! The wrapped backend computes deadlines on its own clock when it runs
//! the request, which is the server's receive time: no later than the
//! server's own expiry, so the link passes them through. A grant whose
//! deadline has passed by the time its reply arrives is released and
//! refused, as drivers refuse it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::election::{ElectionPage, Leader};
use lock_core::{
    Admin, Downgrade, Elections, ErrorKind, Facets, GcReport, GrantRequest, HolderInfo,
    HolderWatch, Lease, ListQuery, Listing, LockBackend, LockBackendExt, LockError, LockInfo,
    LockKey, LockPage, LockSets, LockShape, LockWrapper, Operation, RENEW_CONCURRENCY, SharedPage,
    WatchRequest, renew_concurrently,
};
use tokio::sync::{oneshot, watch};
use tokio::time::{Instant, sleep, timeout};

use crate::faults::{FaultState, Flow, delay_for};

fn rng_seed() -> u64 {
    #[allow(clippy::cast_possible_truncation)] // low bits of a random value
    let seed = lock_core::OwnerId::random().as_u128() as u64;
    seed | 1
}

type Call<T> = Pin<Box<dyn Future<Output = Result<T, LockError>> + Send>>;

/// A [`LockBackend`] reached through an in-process link with the faults of
/// a [`FaultProxy`](crate::proxy::FaultProxy) (made by
/// [`FaultProxy::in_process`](crate::proxy::FaultProxy::in_process)).
///
/// A [`LockWrapper`]: the kernel's calls cross the link, and so does every
/// call of each facet the inner backend has (the link has exactly the
/// inner backend's facets).
#[derive(Debug)]
pub struct FaultLink {
    inner: Arc<dyn LockBackend>,
    state: watch::Receiver<FaultState>,
    op_timeout: Duration,
}

/// Why a leg did not get through.
enum Broken {
    /// Dropped by a blackhole.
    Dropped,
    /// The connection was cut (reset) or the proxy is gone.
    Cut,
}

impl FaultLink {
    pub(crate) fn new(
        inner: Arc<dyn LockBackend>,
        state: watch::Receiver<FaultState>,
        op_timeout: Duration,
    ) -> Self {
        Self {
            inner,
            state,
            op_timeout,
        }
    }

    /// One crossing of the link. The request leg takes the latency set
    /// when it starts and returns it; the reply leg of the same call takes
    /// that latency too (`fixed`), so a call is slowed by the latency of
    /// the moment it was sent, whatever changes while it is in flight.
    async fn leg(
        state: &mut watch::Receiver<FaultState>,
        generation: u64,
        fixed: Option<(Duration, Duration)>,
    ) -> Result<(Duration, Duration), Broken> {
        loop {
            let current = *state.borrow_and_update();
            if current.generation != generation {
                return Err(Broken::Cut);
            }
            match current.flow {
                Flow::Pass => {
                    let (latency, jitter) = fixed.unwrap_or((current.latency, current.jitter));
                    let mut rng = rng_seed();
                    let delay = delay_for(latency, jitter, &mut rng);
                    if !delay.is_zero() {
                        sleep(delay).await;
                    }
                    return if state.borrow().generation == generation {
                        Ok((latency, jitter))
                    } else {
                        Err(Broken::Cut)
                    };
                }
                Flow::Blackhole => return Err(Broken::Dropped),
                Flow::Partition => {
                    if state.changed().await.is_err() {
                        return Err(Broken::Cut);
                    }
                }
            }
        }
    }

    /// Sends `call` across the link and waits for its reply for at most
    /// `budget`.
    async fn call<T: Send + 'static>(
        &self,
        op: Operation,
        key: Option<&LockKey>,
        budget: Duration,
        call: Call<T>,
    ) -> Result<T, LockError> {
        let generation = self.state.borrow().generation;
        let (tx, rx) = oneshot::channel();
        let mut request_state = self.state.clone();
        // The request travels on its own: once sent, it reaches the server
        // even if the caller stops waiting.
        tokio::spawn(async move {
            if let Ok(latency) = Self::leg(&mut request_state, generation, None).await {
                let _ = tx.send((call.await, latency));
            }
        });
        let mut reply_state = self.state.clone();
        let about = |error: LockError| {
            let error = error.with_backend(self.inner.name());
            match key {
                Some(key) => error.with_key(key),
                None => error,
            }
        };
        let unreachable =
            |what: &str| about(LockError::new(ErrorKind::Unavailable, op, what.to_owned()));
        let exchange = async {
            let Ok((result, latency)) = rx.await else {
                // Dropped or cut on the way there; a drop looks like
                // silence to the caller.
                if reply_state.borrow().generation == generation {
                    std::future::pending::<()>().await;
                }
                return Err(unreachable("connection reset"));
            };
            match Self::leg(&mut reply_state, generation, Some(latency)).await {
                Ok(_) => result,
                Err(Broken::Cut) => Err(unreachable("connection reset")),
                Err(Broken::Dropped) => {
                    std::future::pending::<()>().await;
                    Err(unreachable("reply dropped"))
                }
            }
        };
        match timeout(budget, exchange).await {
            Ok(result) => result,
            Err(_) => Err(about(LockError::new(
                ErrorKind::Timeout,
                op,
                format!("no reply within {budget:?}"),
            ))),
        }
    }

    /// Refuses (and gives back) a grant whose reply came after its
    /// deadline.
    fn fresh(&self, lease: Lease) -> Result<Lease, LockError> {
        if lease.validity_deadline() > Instant::now() {
            return Ok(lease);
        }
        let inner = self.inner.clone();
        let key = lease.key().clone();
        tokio::spawn(async move {
            let _ = inner.release(&lease).await;
        });
        Err(LockError::new(
            ErrorKind::LeaseLost,
            Operation::Acquire,
            "the grant arrived after its validity deadline",
        )
        .with_key(&key)
        .with_backend(self.inner.name()))
    }
}

#[async_trait]
impl LockWrapper for FaultLink {
    fn inner(&self) -> &dyn LockBackend {
        &*self.inner
    }

    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let (inner, k) = (self.inner.clone(), request.key.clone());
        let (kind, ttl, deadline) = (request.kind, request.ttl, request.deadline);
        let call: Call<Option<Lease>> = Box::pin(async move {
            inner
                .grant(GrantRequest {
                    key: &k,
                    kind,
                    ttl,
                    deadline,
                })
                .await
        });
        let budget = match deadline {
            None => self.op_timeout,
            Some(deadline) => deadline.saturating_duration_since(Instant::now()) + self.op_timeout,
        };
        match self
            .call(request.operation(), Some(request.key), budget, call)
            .await?
        {
            Some(lease) => self.fresh(lease).map(Some),
            None => Ok(None),
        }
    }

    /// Each lease crosses the link on its own (as a driver renewing one
    /// by one), at most [`RENEW_CONCURRENCY`] at a time.
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        renew_concurrently(leases, RENEW_CONCURRENCY, |lease| self.renew_one(lease)).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let (inner, l) = (self.inner.clone(), lease.clone());
        let call: Call<bool> = Box::pin(async move { inner.release(&l).await });
        self.call(Operation::Release, Some(lease.key()), self.op_timeout, call)
            .await
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        let (inner, k) = (self.inner.clone(), key.clone());
        let call: Call<Vec<HolderInfo>> = Box::pin(async move { inner.holders(&k, shape).await });
        self.call(Operation::Inspect, Some(key), self.op_timeout, call)
            .await
    }

    /// The inner backend's facets, each call across the link.
    fn facets(&self) -> Facets<'_> {
        let inner = self.inner.facets();
        Facets {
            listing: inner.listing.map(|_| self as &dyn Listing),
            admin: inner.admin.map(|_| self as &dyn Admin),
            elections: inner.elections.map(|_| self as &dyn Elections),
            lock_sets: inner.lock_sets.map(|_| self as &dyn LockSets),
            downgrade: inner.downgrade.map(|_| self as &dyn Downgrade),
            holder_watch: inner.holder_watch.map(|_| self as &dyn HolderWatch),
        }
    }
}

impl FaultLink {
    async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        let (inner, l) = (self.inner.clone(), lease.clone());
        let call: Call<Instant> = Box::pin(async move { inner.renew(&l).await });
        self.call(Operation::Renew, Some(lease.key()), self.op_timeout, call)
            .await
    }
}

// The facets below are offered only when the inner backend has them (see
// `facets`), so each call reaches the inner backend's facet.

#[async_trait]
impl Admin for FaultLink {
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let (inner, k) = (self.inner.clone(), key.clone());
        let call: Call<Option<LockInfo>> = Box::pin(async move { inner.force_release(&k).await });
        self.call(Operation::Release, Some(key), self.op_timeout, call)
            .await
    }

    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError> {
        let inner = self.inner.clone();
        let call: Call<GcReport> = Box::pin(async move { inner.gc(older_than).await });
        self.call(Operation::Inspect, None, self.op_timeout, call)
            .await
    }
}

#[async_trait]
impl Listing for FaultLink {
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        let (inner, q) = (self.inner.clone(), query.clone());
        let call: Call<LockPage> = Box::pin(async move { inner.list(&q).await });
        self.call(Operation::Inspect, None, self.op_timeout, call)
            .await
    }

    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        let (inner, q) = (self.inner.clone(), query.clone());
        let call: Call<SharedPage> = Box::pin(async move { inner.list_shared(shape, &q).await });
        self.call(Operation::Inspect, None, self.op_timeout, call)
            .await
    }

    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        let (inner, q) = (self.inner.clone(), query.clone());
        let call: Call<ElectionPage> = Box::pin(async move { inner.list_elections(&q).await });
        self.call(Operation::Inspect, None, self.op_timeout, call)
            .await
    }
}

#[async_trait]
impl Elections for FaultLink {
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let (inner, e) = (self.inner.clone(), election.clone());
        let call: Call<Lease> = Box::pin(async move { inner.campaign(&e, ttl, deadline).await });
        let budget = deadline.saturating_duration_since(Instant::now()) + self.op_timeout;
        let lease = self
            .call(Operation::Acquire, Some(election), budget, call)
            .await?;
        self.fresh(lease)
    }

    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        let (inner, e) = (self.inner.clone(), election.clone());
        let call: Call<Option<Leader>> = Box::pin(async move { inner.leader(&e).await });
        self.call(Operation::Inspect, Some(election), self.op_timeout, call)
            .await
    }

    async fn watch_leader(
        &self,
        request: WatchRequest<'_, Leader>,
    ) -> Result<Option<Leader>, LockError> {
        let WatchRequest {
            key: election,
            poll,
            deadline,
            ..
        } = request;
        let (inner, e, seen) = (self.inner.clone(), election.clone(), request.seen.cloned());
        let call: Call<Option<Leader>> = Box::pin(async move {
            let request = WatchRequest::new(&e, seen.as_ref(), poll, deadline);
            inner.watch_leader(request).await
        });
        let budget = deadline.saturating_duration_since(Instant::now()) + self.op_timeout;
        self.call(Operation::Inspect, Some(election), budget, call)
            .await
    }
}

#[async_trait]
impl LockSets for FaultLink {
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        let Some(first) = keys.first() else {
            return self.inner.try_acquire_all(keys, ttl).await;
        };
        let (inner, ks) = (self.inner.clone(), keys.to_vec());
        let call: Call<Option<Vec<Lease>>> =
            Box::pin(async move { inner.try_acquire_all(&ks, ttl).await });
        match self
            .call(Operation::TryAcquire, Some(first), self.op_timeout, call)
            .await?
        {
            Some(leases) => leases
                .into_iter()
                .map(|lease| self.fresh(lease))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            None => Ok(None),
        }
    }
}

#[async_trait]
impl Downgrade for FaultLink {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        let (inner, l) = (self.inner.clone(), lease.clone());
        let call: Call<Lease> = Box::pin(async move { inner.downgrade(&l).await });
        self.call(
            Operation::Downgrade,
            Some(lease.key()),
            self.op_timeout,
            call,
        )
        .await
    }
}

#[async_trait]
impl HolderWatch for FaultLink {
    async fn watch_holder(
        &self,
        request: WatchRequest<'_, LockInfo>,
    ) -> Result<Option<LockInfo>, LockError> {
        let WatchRequest {
            key,
            poll,
            deadline,
            ..
        } = request;
        let (inner, k, seen) = (self.inner.clone(), key.clone(), request.seen.cloned());
        let call: Call<Option<LockInfo>> = Box::pin(async move {
            let request = WatchRequest::new(&k, seen.as_ref(), poll, deadline);
            inner.watch_holder(request).await
        });
        let budget = deadline.saturating_duration_since(Instant::now()) + self.op_timeout;
        self.call(Operation::Inspect, Some(key), budget, call).await
    }
}
