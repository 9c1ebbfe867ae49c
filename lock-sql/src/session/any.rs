//! The backend [`connect`](crate::connect) returns: row or session mode, as
//! the URL's `mode` option says.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    Capabilities, GcReport, HolderInfo, Lease, LeaseKind, ListQuery, LockBackend, LockError,
    LockInfo, LockKey, LockPage, LockShape, SharedPage, election::ElectionPage,
};
use tokio::time::Instant;

use super::SqlSessionBackend;
use crate::config::{SqlConfig, SqlLayout, SqlMode};
use crate::{SqlBackend, SqlShedLockBackend};

/// A call's future as `async_trait` boxes it.
type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, LockError>> + Send + 'a>>;

/// A SQL lock backend in either mode ([`SqlBackend`] for `mode=row`, the
/// default; [`SqlSessionBackend`] for `mode=session`), or on ShedLock's
/// table ([`SqlShedLockBackend`] for `layout=shedlock`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum SqlAnyBackend {
    /// A unique-row lease table.
    Row(SqlBackend),
    /// Server-session locks.
    Session(SqlSessionBackend),
    /// ShedLock's table (`layout=shedlock`).
    ShedLock(SqlShedLockBackend),
}

impl SqlAnyBackend {
    /// Connects in the mode and layout `config` names.
    ///
    /// # Errors
    ///
    /// As [`SqlBackend::connect`], [`SqlSessionBackend::connect`] or
    /// [`SqlShedLockBackend::connect`].
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes whatever was opened.
    pub async fn connect(config: SqlConfig) -> Result<Self, LockError> {
        if config.table_layout() == SqlLayout::ShedLock {
            return Ok(Self::ShedLock(SqlShedLockBackend::connect(config).await?));
        }
        match config.lock_mode() {
            SqlMode::Session => Ok(Self::Session(SqlSessionBackend::connect(config).await?)),
            _ => Ok(Self::Row(SqlBackend::connect(config).await?)),
        }
    }

    /// The row-mode backend, if this is one.
    pub fn as_row(&self) -> Option<&SqlBackend> {
        match self {
            Self::Row(backend) => Some(backend),
            Self::Session(_) | Self::ShedLock(_) => None,
        }
    }

    /// The session-mode backend, if this is one.
    pub fn as_session(&self) -> Option<&SqlSessionBackend> {
        match self {
            Self::Session(backend) => Some(backend),
            Self::Row(_) | Self::ShedLock(_) => None,
        }
    }

    /// The ShedLock-layout backend, if this is one.
    pub fn as_shedlock(&self) -> Option<&SqlShedLockBackend> {
        match self {
            Self::ShedLock(backend) => Some(backend),
            Self::Row(_) | Self::Session(_) => None,
        }
    }

    fn get(&self) -> &dyn LockBackend {
        match self {
            Self::Row(backend) => backend,
            Self::Session(backend) => backend,
            Self::ShedLock(backend) => backend,
        }
    }
}

#[async_trait]
impl LockBackend for SqlAnyBackend {
    fn name(&self) -> &'static str {
        self.get().name()
    }

    fn capabilities(&self) -> Capabilities {
        self.get().capabilities()
    }

    // The four calls of every lock's life hand back the inner backend's
    // boxed future as it is, rather than boxing a second future that only
    // awaits it (an allocation and an indirect poll per call).

    fn try_acquire<'life0, 'life1, 'async_trait>(
        &'life0 self,
        key: &'life1 LockKey,
        ttl: Duration,
    ) -> Call<'async_trait, Option<Lease>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        self.get().try_acquire(key, ttl)
    }

    fn acquire<'life0, 'life1, 'async_trait>(
        &'life0 self,
        key: &'life1 LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Call<'async_trait, Lease>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        self.get().acquire(key, ttl, deadline)
    }

    fn renew<'life0, 'life1, 'async_trait>(
        &'life0 self,
        lease: &'life1 Lease,
    ) -> Call<'async_trait, Instant>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        self.get().renew(lease)
    }

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        self.get().renew_many(leases).await
    }

    fn release<'life0, 'life1, 'async_trait>(
        &'life0 self,
        lease: &'life1 Lease,
    ) -> Call<'async_trait, bool>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        self.get().release(lease)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.get().inspect(key).await
    }

    async fn try_acquire_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        self.get().try_acquire_kind(key, kind, ttl).await
    }

    async fn acquire_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.get().acquire_kind(key, kind, ttl, deadline).await
    }

    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.get().downgrade(lease).await
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        self.get().holders(key, shape).await
    }

    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        self.get().list(query).await
    }

    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        self.get().list_shared(shape, query).await
    }

    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        self.get().list_elections(query).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.get().force_release(key).await
    }

    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError> {
        self.get().gc(older_than).await
    }
}
