//! The backend [`connect`](crate::connect) returns: row or session mode, as
//! the URL's `mode` option says.

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

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.get().try_acquire(key, ttl).await
    }

    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.get().acquire(key, ttl, deadline).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        self.get().renew(lease).await
    }

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        self.get().renew_many(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.get().release(lease).await
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
