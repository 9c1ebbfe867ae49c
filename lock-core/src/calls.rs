//! [`LockBackendExt`]: every call a tool or a test makes on a backend,
//! built on the kernel ([`LockBackend`]) and its [facets](crate::facets).
//! Implemented for every backend; nothing here can be overridden, so a
//! backend's abilities are exactly its kernel and the facets it has.

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::{GrantRequest, LockBackend};
use crate::election::record::{ElectionPage, Leader, election_lock_key};
use crate::error::{ErrorKind, LockError, Operation};
use crate::facets::WatchRequest;
use crate::key::LockKey;
use crate::kind::{LeaseKind, LockShape};
use crate::types::{GcReport, Lease, ListQuery, LockInfo, LockPage, SharedPage};

/// The calls on a backend beyond its kernel, built on it and its facets;
/// implemented for every backend and not overridable.
///
/// Each documents where it goes: the kernel, a facet, or (for a backend
/// without the facet) the fallback named; a facet-only call on a backend
/// without the facet answers [`ErrorKind::Unsupported`].
#[async_trait]
pub trait LockBackendExt: LockBackend {
    /// Tries once to take the mutex `key` for `ttl`: [`LockBackend::grant`]
    /// without a deadline. `Ok(None)` when someone else holds it.
    ///
    /// # Errors
    ///
    /// As [`LockBackend::grant`].
    ///
    /// # Cancel safety
    ///
    /// As [`LockBackend::grant`].
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.grant(GrantRequest::mutex(key, ttl)).await
    }

    /// Takes the mutex `key` for `ttl`, waiting until `deadline`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Contended`] at the deadline; as [`LockBackend::grant`].
    ///
    /// # Cancel safety
    ///
    /// As [`LockBackend::grant`].
    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        granted(
            self.grant(GrantRequest::mutex(key, ttl).until(deadline))
                .await,
            self.name(),
            key,
        )
    }

    /// Tries once to take a grant of `kind` on `key` for `ttl`.
    ///
    /// # Errors
    ///
    /// As [`LockBackend::grant`].
    ///
    /// # Cancel safety
    ///
    /// As [`LockBackend::grant`].
    async fn try_acquire_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        self.grant(GrantRequest::mutex(key, ttl).kind(kind)).await
    }

    /// Takes a grant of `kind` on `key` for `ttl`, waiting until
    /// `deadline`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Contended`] at the deadline; as [`LockBackend::grant`].
    ///
    /// # Cancel safety
    ///
    /// As [`LockBackend::grant`].
    async fn acquire_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        granted(
            self.grant(GrantRequest::mutex(key, ttl).kind(kind).until(deadline))
                .await,
            self.name(),
            key,
        )
    }

    /// Renews one lease: [`LockBackend::renew_many`] of that lease.
    ///
    /// # Errors
    ///
    /// As [`LockBackend::renew_many`] for the lease.
    ///
    /// # Cancel safety
    ///
    /// Safe: the renewal happened or did not; the lease stays valid until
    /// its previous deadline either way.
    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        self.renew_many(&[lease])
            .await
            .pop()
            .unwrap_or_else(|| Err(crate::renew_many::missing_result().with_backend(self.name())))
    }

    /// Who holds the mutex `key` right now, or `None` when it is free:
    /// [`LockBackend::holders`] of [`LockShape::Mutex`].
    ///
    /// # Errors
    ///
    /// As [`LockBackend::holders`].
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        Ok(self
            .holders(key, LockShape::Mutex)
            .await?
            .into_iter()
            .next()
            .map(|h| LockInfo {
                key: key.clone(),
                holder: h.holder,
                token: h.token,
                remaining_ttl: h.remaining_ttl,
                details: h.details,
            }))
    }

    /// [`Downgrade::downgrade`](crate::Downgrade::downgrade).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] without the facet; as the facet's call.
    ///
    /// # Cancel safety
    ///
    /// As the facet's call.
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        match self.facets().downgrade {
            Some(facet) => facet.downgrade(lease).await,
            None => Err(crate::backend::unsupported_kind(
                self.name(),
                lease.key(),
                LeaseKind::Read,
                Operation::Downgrade,
            )),
        }
    }

    /// [`LockSets::try_acquire_all`](crate::LockSets::try_acquire_all).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] without the facet (the caller takes the
    /// keys one by one); as the facet's call.
    ///
    /// # Cancel safety
    ///
    /// As the facet's call.
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        match self.facets().lock_sets {
            Some(facet) => facet.try_acquire_all(keys, ttl).await,
            None => Err(LockError::new(
                ErrorKind::Unsupported,
                Operation::TryAcquire,
                format!("{} takes a set of keys one key at a time", self.name()),
            )
            .with_key(keys.first().map_or("", LockKey::as_str))
            .with_backend(self.name())),
        }
    }

    /// [`Elections::campaign`](crate::Elections::campaign); without the
    /// facet, a waiting grant of the mutex
    /// [`election_lock_key`]`(election)`.
    ///
    /// # Errors
    ///
    /// As the facet's call, or as [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future withdraws the candidacy.
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        match self.facets().elections {
            Some(facet) => facet.campaign(election, ttl, deadline).await,
            None => {
                self.acquire(&election_lock_key(election)?, ttl, deadline)
                    .await
            }
        }
    }

    /// [`Elections::leader`](crate::Elections::leader); without the facet,
    /// the holder of the mutex [`campaign`](Self::campaign) takes.
    ///
    /// # Errors
    ///
    /// As the facet's call, or as [`inspect`](Self::inspect).
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        match self.facets().elections {
            Some(facet) => facet.leader(election).await,
            None => Ok(self
                .inspect(&election_lock_key(election)?)
                .await?
                .map(Leader::from_info)),
        }
    }

    /// [`Elections::watch_leader`](crate::Elections::watch_leader); without
    /// the facet, the election's mutex watched with
    /// [`watch_holder`](Self::watch_holder).
    ///
    /// # Errors
    ///
    /// As [`leader`](Self::leader).
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn watch_leader(
        &self,
        request: WatchRequest<'_, Leader>,
    ) -> Result<Option<Leader>, LockError> {
        match self.facets().elections {
            Some(facet) => facet.watch_leader(request).await,
            None => watch_mutex_leader(self, request).await,
        }
    }

    /// [`HolderWatch::watch_holder`](crate::HolderWatch::watch_holder);
    /// without the facet, [`inspect`](Self::inspect) every `poll`
    /// ([`poll_holder`]).
    ///
    /// # Errors
    ///
    /// As the facet's call, or as [`inspect`](Self::inspect).
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn watch_holder(
        &self,
        request: WatchRequest<'_, LockInfo>,
    ) -> Result<Option<LockInfo>, LockError> {
        match self.facets().holder_watch {
            Some(facet) => facet.watch_holder(request).await,
            None => poll_holder(self, request).await,
        }
    }

    /// [`Listing::list`](crate::Listing::list).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] without the facet; as the facet's call.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        match self.facets().listing {
            Some(listing) => listing.list(query).await,
            None => Err(no_admin(self.name(), "listing locks")),
        }
    }

    /// [`Listing::list_shared`](crate::Listing::list_shared).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] without the facet; as the facet's call.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        match self.facets().listing {
            Some(listing) => listing.list_shared(shape, query).await,
            None => Err(no_admin(self.name(), &format!("listing {shape} locks"))),
        }
    }

    /// [`Listing::list_elections`](crate::Listing::list_elections).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] without the facet; as the facet's call.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        match self.facets().listing {
            Some(listing) => listing.list_elections(query).await,
            None => Err(no_admin(self.name(), "listing elections")),
        }
    }

    /// [`Admin::force_release`](crate::Admin::force_release): breaks any
    /// key, reserved ones included (see
    /// [`LockClient::force_release`](crate::LockClient::force_release)).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] without the facet; as the facet's call.
    ///
    /// # Cancel safety
    ///
    /// As the facet's call.
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        match self.facets().admin {
            Some(admin) => admin.force_release(key).await,
            None => Err(no_admin(self.name(), "breaking locks (force-release)")),
        }
    }

    /// [`Admin::gc`](crate::Admin::gc).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] without the facet; as the facet's call.
    ///
    /// # Cancel safety
    ///
    /// As the facet's call.
    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError> {
        match self.facets().admin {
            Some(admin) => admin.gc(older_than).await,
            None => Err(no_admin(self.name(), "garbage collection of stale keys")),
        }
    }
}

impl<B: LockBackend + ?Sized> LockBackendExt for B {}

/// A waiting grant's answer as a lease (a backend that answered "held"
/// despite the deadline is read as contended at it).
pub(crate) fn granted(
    found: Result<Option<Lease>, LockError>,
    backend: &'static str,
    key: &LockKey,
) -> Result<Lease, LockError> {
    found?.ok_or_else(|| {
        LockError::new(
            ErrorKind::Contended,
            Operation::Acquire,
            "the key was still held at the deadline",
        )
        .with_key(key)
        .with_backend(backend)
    })
}

fn no_admin(backend: &'static str, what: &str) -> LockError {
    crate::holder::unsupported_admin(backend, what)
}

/// How a backend without a [`HolderWatch`](crate::HolderWatch) facet is
/// watched: reads `backend`'s [`inspect`](LockBackendExt::inspect) every
/// `request.poll` (at least 5 ms) until the holder is no longer
/// `request.seen` or `request.deadline` passed.
///
/// # Errors
///
/// As [`LockBackendExt::inspect`](crate::LockBackendExt::inspect).
///
/// # Cancel safety
///
/// Safe: read-only.
pub async fn poll_holder<B: LockBackend + ?Sized>(
    backend: &B,
    request: WatchRequest<'_, LockInfo>,
) -> Result<Option<LockInfo>, LockError> {
    watch_holder_with(backend, request, std::future::pending).await
}

/// How an election without a notification is watched: reads `backend`'s
/// [`leader`](LockBackendExt::leader) every `request.poll` (at least 5 ms)
/// until the leader is no longer `request.seen` or `request.deadline`
/// passed.
///
/// # Errors
///
/// As [`LockBackendExt::leader`](crate::LockBackendExt::leader).
///
/// # Cancel safety
///
/// Safe: read-only.
pub async fn poll_leader<B: LockBackend + ?Sized>(
    backend: &B,
    request: WatchRequest<'_, Leader>,
) -> Result<Option<Leader>, LockError> {
    watch_with(
        || backend.leader(request.key),
        |now| !Leader::same(now, request.seen),
        request,
        std::future::pending,
    )
    .await
}

/// [`poll_holder`] that also wakes early: before each read it calls `arm`,
/// whose future (already listening when `arm` returns, so a change during
/// the read is not missed) completes on the store's notification that the
/// holder may have changed; the read is then repeated at once. A driver
/// whose store announces some changes (a release message) but not others
/// (an expiry) watches this way.
///
/// # Errors
///
/// As [`LockBackendExt::inspect`](crate::LockBackendExt::inspect).
///
/// # Cancel safety
///
/// Safe: read-only (what `arm` subscribed is dropped with its future).
pub async fn watch_holder_with<B, A, F>(
    backend: &B,
    request: WatchRequest<'_, LockInfo>,
    arm: A,
) -> Result<Option<LockInfo>, LockError>
where
    B: LockBackend + ?Sized,
    A: FnMut() -> F,
    F: std::future::Future<Output = ()>,
{
    watch_with(
        || backend.inspect(request.key),
        |now| !LockInfo::same_holder(now, request.seen),
        request,
        arm,
    )
    .await
}

/// The loop of the polling watches: `read` until `changed` says what it
/// read is no longer what the caller saw, or `deadline` passed; between
/// reads, `poll` (at least 5 ms) or the wake of the future `arm` returned
/// before the read, whichever comes first.
async fn watch_with<T, R, RF, A, F>(
    mut read: R,
    changed: impl Fn(Option<&T>) -> bool,
    request: WatchRequest<'_, T>,
    mut arm: A,
) -> Result<Option<T>, LockError>
where
    R: FnMut() -> RF,
    RF: std::future::Future<Output = Result<Option<T>, LockError>>,
    A: FnMut() -> F,
    F: std::future::Future<Output = ()>,
{
    let WatchRequest { poll, deadline, .. } = request;
    let poll = poll.max(Duration::from_millis(5));
    loop {
        let woken = arm();
        let now = read().await?;
        if changed(now.as_ref()) || Instant::now() >= deadline {
            return Ok(now);
        }
        tokio::select! {
            () = woken => {}
            () = tokio::time::sleep_until(deadline.min(Instant::now() + poll)) => {}
        }
    }
}

/// [`LockBackendExt::watch_leader`] for a
/// driver whose elections are the default renewed mutex
/// ([`election_lock_key`]) and whose
/// [`watch_holder`](LockBackendExt::watch_holder) wakes on the store's
/// notification: the leader is watched as that mutex's holder.
///
/// # Errors
///
/// A name too long for the prefixed key; as
/// [`LockBackendExt::inspect`].
///
/// # Cancel safety
///
/// Safe: read-only.
pub async fn watch_mutex_leader<B: LockBackendExt + ?Sized>(
    backend: &B,
    request: WatchRequest<'_, Leader>,
) -> Result<Option<Leader>, LockError> {
    let key = election_lock_key(request.key)?;
    let seen = request.seen.map(|l| LockInfo {
        key: key.clone(),
        holder: l.holder.clone(),
        token: l.term,
        remaining_ttl: l.remaining_ttl,
        details: l.details.clone(),
    });
    Ok(backend
        .watch_holder(WatchRequest::new(
            &key,
            seen.as_ref(),
            request.poll,
            request.deadline,
        ))
        .await?
        .map(Leader::from_info))
}
