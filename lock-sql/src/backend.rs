//! [`SqlBackend`], row mode's backend: the components that own each concern
//! (grants, waiting, renewal, the shared kinds, sets, administration) over
//! one lease table, the kernel ([`LockBackend`]) delegating to them, and
//! its facets. The other modes' backends are this role's sub-modules:
//! `session.rs` (server-session locks), `shedlock.rs` (ShedLock's table),
//! `any.rs` (the one [`connect`](crate::connect) returns).

mod any;
pub(crate) mod session;
pub(crate) mod shedlock;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::FutureExt;
use lock_core::{
    Capabilities, Facets, FencingScope, GrantRequest, HolderInfo, HolderWatch, Lease, LeaseKind,
    LockBackend, LockError, LockInfo, LockKey, LockShape, TtlModel, WaitStrategy, WatchRequest,
};
use tokio::time::Instant;

pub use any::SqlAnyBackend;

use crate::admin::Administration;
use crate::config::{MIN_TTL, NAME, SqlConfig, SqlDialect};
use crate::connection::DbPool;
use crate::connection::table::Table;
use crate::grants::Grants;
use crate::guarded::OwnerPredicate;
use crate::renewal::Renewal;
use crate::sets::Sets;
use crate::shared::Shared;
use crate::waiting::Waiting;

/// A kernel call's future as `async_trait` boxes it.
pub(crate) type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, LockError>> + Send + 'a>>;

/// `renew_many`'s future as `async_trait` boxes it.
pub(crate) type Renewals<'a> =
    Pin<Box<dyn Future<Output = Vec<Result<Instant, LockError>>> + Send + 'a>>;

/// One kernel call of an `async_trait` impl written as `async_trait`
/// expands it, so that it can hand back a boxed future it already has
/// instead of boxing one more that only awaits it (an allocation and an
/// indirect poll per call): `$call` with its lifetimes besides `self`'s,
/// its arguments and its boxed future, and the expression that makes that
/// future. `$this` is `self`, named by the caller so that the expression
/// can use it.
macro_rules! kernel_call {
    ($this:ident, $call:ident<$($life:lifetime),+>($($arg:ident: $ty:ty),+ $(,)?)
        -> $future:ty => $body:expr) => {
        fn $call<'life0, $($life,)+ 'async_trait>(&'life0 $this, $($arg: $ty),+) -> $future
        where
            'life0: 'async_trait,
            $($life: 'async_trait,)+
            Self: 'async_trait,
        {
            $body
        }
    };
}
pub(crate) use kernel_call;

/// The kernel calls of a backend whose only shape is the mutex (session
/// mode, the ShedLock layout), written once: `grant` and `holders` by its
/// grants' [`MutexOnly`](crate::grants::MutexOnly) under the backend's name, `release` by its
/// grants, `renew_many` by its renewal (the backend's `inner.grants` and
/// `inner.renewal`). Placed in the backend's `#[async_trait] impl
/// LockBackend` (see [`kernel_call`]): the
/// grants' boxed futures go back as they are, the others are boxed once.
macro_rules! mutex_only_kernel {
    () => {
        $crate::backend::kernel_call!(self, grant<'life1>(request: lock_core::GrantRequest<'life1>)
            -> $crate::backend::Call<'async_trait, Option<lock_core::Lease>>
            => {
                let name = lock_core::LockBackend::name(self);
                $crate::grants::MutexOnly::grant_mutex(&self.inner.grants, name, request)
            });
        $crate::backend::kernel_call!(self, renew_many<'life1, 'life2>(
                leases: &'life1 [&'life2 lock_core::Lease]
            ) -> $crate::backend::Renewals<'async_trait>
            => Box::pin(self.inner.renewal.renew(leases)));
        $crate::backend::kernel_call!(self, release<'life1>(lease: &'life1 lock_core::Lease)
            -> $crate::backend::Call<'async_trait, bool>
            => Box::pin(self.inner.grants.release(lease)));
        $crate::backend::kernel_call!(self, holders<'life1>(
                key: &'life1 lock_core::LockKey,
                shape: lock_core::LockShape
            ) -> $crate::backend::Call<'async_trait, Vec<lock_core::HolderInfo>>
            => {
                let name = lock_core::LockBackend::name(self);
                $crate::grants::MutexOnly::mutex_holders(&self.inner.grants, name, key, shape)
            });
    };
}
pub(crate) use mutex_only_kernel;

/// What a lease row in a table guarantees, whichever layout holds it (the
/// row mode's lease table, ShedLock's): a token per key bumped in the
/// grant's committed statement, so durable across a restart; a TTL per
/// lease; one primary ordering every grant of a row; the holder details
/// the grant writes beside it. Waiting, fairness and the shared kinds are
/// each layout's own; a field added to [`Capabilities`] later stays at its
/// conservative default.
pub(crate) fn lease_row_capabilities() -> Capabilities {
    Capabilities {
        fencing: FencingScope::PerKey,
        fencing_survives_failover: true,
        grants_survive_restart: true,
        ttl_model: TtlModel::PerLease,
        linearizable: true,
        min_ttl: MIN_TTL,
        holder_details: true,
        ..Capabilities::minimal()
    }
}

/// A lock service on a SQL table: PostgreSQL, MySQL/MariaDB or SQLite.
///
/// Cheap to clone: clones share one set of connections. See the crate docs
/// for the table, the statements and the caveats.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lock_core::{LockBackend, LockBackendExt, LockKey};
/// use lock_sql::SqlBackend;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let backend = SqlBackend::connect_url("sqlite::memory:").await?;
/// let key = LockKey::new("reports")?;
/// let lease = backend.try_acquire(&key, Duration::from_secs(5)).await?.expect("free");
/// assert!(backend.try_acquire(&key, Duration::from_secs(5)).await?.is_none());
/// assert!(backend.release(&lease).await?);
/// let again = backend.try_acquire(&key, Duration::from_secs(5)).await?.expect("free again");
/// assert!(again.token() > lease.token());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqlBackend {
    inner: Arc<Parts>,
}

/// The components, each owning its concern, over one table.
struct Parts {
    table: Arc<Table>,
    grants: Grants,
    waiting: Waiting,
    renewal: Renewal,
    shared: Shared,
    sets: Sets,
    admin: Administration,
}

impl fmt::Debug for SqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlBackend")
            .field("config", &self.inner.table.config)
            .finish_non_exhaustive()
    }
}

impl SqlBackend {
    /// Connects with a URL (see [`SqlConfig::from_url`]).
    ///
    /// # Errors
    ///
    /// As [`SqlConfig::from_url`] and [`connect`](Self::connect).
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes whatever was opened.
    pub async fn connect_url(url: &str) -> Result<Self, LockError> {
        Self::connect(SqlConfig::from_url(url)?).await
    }

    /// Opens a first connection, checks the database answers and creates
    /// the lease table when it is missing (unless disabled).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for options the driver rejects, a dialect
    /// whose cargo feature is off, or `mode=session` (that is
    /// [`SqlSessionBackend`](crate::SqlSessionBackend));
    /// [`ErrorKind::Unavailable`](lock_core::ErrorKind::Unavailable) / [`ErrorKind::Timeout`](lock_core::ErrorKind::Timeout) when the database
    /// cannot be reached within the operation timeout;
    /// [`ErrorKind::Backend`](lock_core::ErrorKind::Backend) when creating the table fails.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes whatever was opened. A table created
    /// meanwhile stays (creation is idempotent).
    pub async fn connect(config: SqlConfig) -> Result<Self, LockError> {
        if config.lock_mode() == crate::SqlMode::Session {
            // Silently taking row locks for a URL that asks for session
            // locks would let two fleets believe they exclude each other.
            return Err(LockError::config(
                "mode=session is the session-lock backend: open it with lock_sql::connect \
                 or SqlSessionBackend, not SqlBackend",
            )
            .with_backend(NAME));
        }
        crate::config::refuse_shedlock(&config, "SqlBackend")?;
        let table = Table::open(config).await?;
        let grants = Grants::new(Arc::clone(&table));
        let shared = Shared::new(Arc::clone(&table));
        let parts = Parts {
            waiting: Waiting::new(Arc::clone(&table), grants.clone(), shared.clone()),
            renewal: Renewal::new(Arc::clone(&table)),
            sets: Sets::new(Arc::clone(&table), grants.clone()),
            admin: Administration::new(Arc::clone(&table)),
            grants,
            shared,
            table,
        };
        Ok(Self {
            inner: Arc::new(parts),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SqlConfig {
        &self.inner.table.config
    }

    /// The dialect.
    pub fn dialect(&self) -> SqlDialect {
        self.inner.table.config.dialect
    }

    /// A PostgreSQL pool on the same database, to run your own (e.g.
    /// fenced) statements on. The lock statements never use it: it opens
    /// its connections when you first use it, and as a sqlx pool it pings
    /// each connection as it returns (a second round trip per statement).
    #[cfg(feature = "postgres")]
    pub fn pg_pool(&self) -> Option<&sqlx::PgPool> {
        #[allow(unreachable_patterns)] // with only this feature on
        match &self.inner.table.pool {
            DbPool::Postgres(pool) => Some(pool),
            _ => None,
        }
    }

    /// A MySQL/MariaDB pool on the same database, to run your own (e.g.
    /// fenced) statements on; see [`pg_pool`](Self::pg_pool).
    #[cfg(feature = "mysql")]
    pub fn mysql_pool(&self) -> Option<&sqlx::MySqlPool> {
        #[allow(unreachable_patterns)] // with only this feature on
        match &self.inner.table.pool {
            DbPool::MySql(pool) => Some(pool),
            _ => None,
        }
    }

    /// A SQLite pool on the same database (an in-memory one included), to
    /// run your own (e.g. fenced) statements on; see
    /// [`pg_pool`](Self::pg_pool).
    #[cfg(feature = "sqlite")]
    pub fn sqlite_pool(&self) -> Option<&sqlx::SqlitePool> {
        #[allow(unreachable_patterns)] // with only this feature on
        match &self.inner.table.pool {
            DbPool::Sqlite(pool) => Some(pool),
            _ => None,
        }
    }

    /// The lease table's name, quoted for this dialect.
    pub fn quoted_table(&self) -> &str {
        self.inner.table.quoted_table()
    }

    /// The schema this backend creates, for teams that create it themselves
    /// (then connect with `create_table=false`).
    pub fn schema_sql(&self) -> Vec<String> {
        self.inner
            .table
            .statements
            .create
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// Closes the connections and the pool: later calls fail with
    /// [`ErrorKind::Unavailable`](lock_core::ErrorKind::Unavailable).
    ///
    /// # Errors
    ///
    /// None today; kept fallible for future drivers.
    ///
    /// # Cancel safety
    ///
    /// Safe: new calls are refused once called; idle connections not yet
    /// closed are dropped with the backend.
    pub async fn close(&self) -> Result<(), LockError> {
        self.inner.table.close().await;
        Ok(())
    }

    /// The [`OwnerPredicate`] of `lease` (a mutex lease of this backend,
    /// `guard.lease()`), for a write guarded by the lease table itself:
    /// its placeholders start at `first_placeholder` (PostgreSQL `$n`,
    /// SQLite `?n`; MySQL's are positional `?`, whatever the number).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`](lock_core::ErrorKind::Unsupported) for a
    /// read, write or semaphore lease (they have no row in the lease
    /// table); [`ErrorKind::InvalidArgument`](lock_core::ErrorKind::InvalidArgument)
    /// for `first_placeholder == 0` or a token above `i64::MAX`. Nothing is
    /// sent to the database.
    pub fn owner_predicate(
        &self,
        lease: &Lease,
        first_placeholder: usize,
    ) -> Result<OwnerPredicate, LockError> {
        OwnerPredicate::new(&self.inner.table, lease, first_placeholder)
    }
}

#[async_trait]
impl LockBackend for SqlBackend {
    fn name(&self) -> &'static str {
        self.inner.table.dialect.name()
    }

    // The token is bumped in the same committed statement as the grant,
    // and a row `gc` deletes leaves its token in the floor that a new row
    // starts above: a restart of the database keeps them (see the crate
    // docs for asynchronous replicas). The `details` column is written by
    // the grant (crate::admin).
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // Behind a transaction pooler no `LISTEN` runs: waiters poll.
            waiting: if self.inner.table.dialect.notified()
                && !self.inner.table.config.transaction_pooler
            {
                WaitStrategy::Notify
            } else {
                WaitStrategy::Poll
            },
            // Fair mode queues mutex waiters by a database-assigned id.
            fifo: self.inner.table.config.fair,
            // Table mode (crate::shared); session mode has neither.
            shared_locks: true,
            semaphores: true,
            ..lease_row_capabilities()
        }
    }

    // Each kind of grant boxed on its own, not the one `async fn` of all
    // four that `async_trait` would box: that future is as large as the
    // largest (the shared kinds' waiting grant), and boxing it copied it
    // whole at every mutex grant (callgrind of sql_parts' SqlBackend side:
    // ~9,800 instructions of memcpy per acquire, a sixth of the cycle's).
    kernel_call!(self, grant<'life1>(request: GrantRequest<'life1>)
    -> Call<'async_trait, Option<Lease>>
    => {
        let GrantRequest {
            key,
            kind,
            ttl,
            deadline,
        } = request;
        let parts = &self.inner;
        match (kind, deadline) {
            (LeaseKind::Exclusive, None) => Box::pin(parts.grants.try_take(key, ttl)),
            (LeaseKind::Exclusive, Some(deadline)) => Box::pin(
                // Mapped in place, not awaited in an async block: that
                // block's future would hold the grant's and its own state.
                parts
                    .waiting
                    .take_waiting(key, ttl, deadline)
                    .map(|granted| granted.map(Some)),
            ),
            (kind, None) => Box::pin(parts.shared.try_share(key, kind, ttl)),
            (kind, Some(deadline)) => Box::pin(async move {
                parts
                    .shared
                    .acquire_share(key, kind, ttl, deadline)
                    .await
                    .map(Some)
            }),
        }
    });

    /// Mutex leases in batches (one `UPDATE` per batch, `renewal.rs`), the
    /// shared kinds one by one.
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        let parts = &self.inner;
        if leases.iter().all(|l| l.kind() == LeaseKind::Exclusive) {
            return parts.renewal.renew(leases).await;
        }
        let (mutexes, others): (Vec<usize>, Vec<usize>) =
            (0..leases.len()).partition(|&i| leases[i].kind() == LeaseKind::Exclusive);
        let batch: Vec<&Lease> = mutexes.iter().map(|&i| leases[i]).collect();
        let mut results: Vec<Option<Result<Instant, LockError>>> =
            std::iter::repeat_with(|| None).take(leases.len()).collect();
        for (i, result) in mutexes.into_iter().zip(parts.renewal.renew(&batch).await) {
            results[i] = Some(result);
        }
        for i in others {
            results[i] = Some(parts.shared.renew_share(leases[i]).await);
        }
        results.into_iter().flatten().collect()
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        match lease.kind() {
            LeaseKind::Exclusive => self.inner.grants.release(lease).await,
            _ => self.inner.shared.release_share(lease).await,
        }
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        match shape {
            LockShape::ReadWrite | LockShape::Semaphore => {
                self.inner.shared.share_holders(key, shape).await
            }
            _ => Ok(lock_core::kind::mutex_holders(
                self.inner.grants.inspect(key).await?,
            )),
        }
    }

    /// Elections are the default renewed mutex (no facet of their own):
    /// their observers wake as [`HolderWatch`] does for that mutex.
    fn facets(&self) -> Facets<'_> {
        let parts = &self.inner;
        Facets {
            listing: Some(&parts.admin),
            admin: Some(&parts.admin),
            lock_sets: Some(&parts.sets),
            downgrade: Some(&parts.shared),
            holder_watch: Some(self),
            ..Facets::default()
        }
    }
}

/// On the backend rather than a component: the watch reads the holder
/// through the kernel (`inspect`), woken by the waiting component's
/// notifications.
#[async_trait]
impl HolderWatch for SqlBackend {
    async fn watch_holder(
        &self,
        request: WatchRequest<'_, LockInfo>,
    ) -> Result<Option<LockInfo>, LockError> {
        let waiting = &self.inner.waiting;
        waiting.watch_holder(self, request).await
    }
}
