//! The backend [`connect`](crate::connect) returns: row or session mode, as
//! the URL's `mode` option says.

use lock_core::{
    GrantRequest, HolderInfo, Lease, LockBackend, LockError, LockKey, LockShape, LockWrapper,
};

use super::{Call, Renewals, kernel_call};
use crate::config::{SqlConfig, SqlLayout, SqlMode};
use crate::{SqlBackend, SqlSessionBackend, SqlShedLockBackend};

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

    /// The [`OwnerPredicate`](crate::OwnerPredicate) of a mutex `lease`
    /// in row mode, as [`SqlBackend::owner_predicate`].
    ///
    /// # Errors
    ///
    /// As [`SqlBackend::owner_predicate`]; in session mode and on
    /// ShedLock's layout (not offered there),
    /// [`ErrorKind::Unsupported`](lock_core::ErrorKind::Unsupported).
    pub fn owner_predicate(
        &self,
        lease: &Lease,
        first_placeholder: usize,
    ) -> Result<crate::OwnerPredicate, LockError> {
        match self {
            Self::Row(backend) => backend.owner_predicate(lease, first_placeholder),
            Self::Session(backend) => backend.owner_predicate(lease, first_placeholder),
            Self::ShedLock(_) => Err(crate::guarded::unsupported(
                lease,
                "an ownership predicate is offered on row mode's lease table, not on \
                 ShedLock's layout: guard the write with the fencing token instead",
            )),
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

/// Every call goes to the backend held, unchanged, and so do its facets:
/// a row-mode `SqlAnyBackend` has the row mode's admin, lock sets,
/// downgrades and holder watch, a session-mode one the session mode's
/// admin.
impl LockWrapper for SqlAnyBackend {
    fn inner(&self) -> &dyn LockBackend {
        self.get()
    }

    // The kernel's calls hand back the inner backend's boxed future as it
    // is, rather than boxing one more future of their own that only awaits
    // it (an allocation and an indirect poll per call; the blanket
    // `LockBackend` impl of every wrapper boxes one around it already).

    kernel_call!(self, grant<'life1>(request: GrantRequest<'life1>)
        -> Call<'async_trait, Option<Lease>> => self.get().grant(request));
    kernel_call!(self, renew_many<'life1, 'life2>(leases: &'life1 [&'life2 Lease])
        -> Renewals<'async_trait> => self.get().renew_many(leases));
    kernel_call!(self, release<'life1>(lease: &'life1 Lease)
        -> Call<'async_trait, bool> => self.get().release(lease));
    kernel_call!(self, holders<'life1>(key: &'life1 LockKey, shape: LockShape)
        -> Call<'async_trait, Vec<HolderInfo>> => self.get().holders(key, shape));
}
