//! Row mode's mutex grant (one statement that inserts the row or takes
//! over an expired one, bumping the token), its release and its holder;
//! and [`Grant`], a grant the database confirmed turned into its lease (or
//! given back when it arrived too late): one path for the mutex, ShedLock
//! and shared grants.

pub(crate) mod session;
pub(crate) mod shedlock;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    FencingToken, GrantRequest, HolderDetails, HolderInfo, Lease, LeaseKind, LockError, LockInfo,
    LockKey, LockShape, Operation, OwnerId, check_ttl, unsupported_shape,
};
use tokio::time::Instant;

use crate::config::{MIN_TTL, NAME};
use crate::connection::table::Table;
use crate::connection::{ConnSet, retry_once};
use crate::dialect::{GrantValues, LeaseRow};
use crate::error::timed;

/// A grant the database confirmed: `token` for `key` and `owner`, asked
/// for at `sent_at`.
pub(crate) struct Grant<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) owner: OwnerId,
    pub(crate) token: FencingToken,
    pub(crate) kind: LeaseKind,
    pub(crate) ttl: Duration,
    pub(crate) sent_at: Instant,
}

impl Grant<'_> {
    /// The grant's lease; when it arrived too late to be of use (after its
    /// validity deadline), `give_back` releases it rather than let it
    /// block others until its TTL, and the lease's error is returned.
    pub(crate) async fn lease_or_give_back<F: Future<Output = ()>>(
        self,
        give_back: impl FnOnce(Lease) -> F,
    ) -> Result<Lease, LockError> {
        let Self {
            key,
            owner,
            token,
            kind,
            ttl,
            sent_at,
        } = self;
        match Lease::granted(key.clone(), owner, token, ttl, sent_at, String::new()) {
            Ok(lease) => Ok(lease.with_kind(kind)),
            Err(err) => {
                let stale =
                    Lease::from_parts(key.clone(), owner, token, ttl, sent_at, String::new());
                // Boxed: a rare path whose future (a release) would
                // otherwise make every grant's future that much larger.
                Box::pin(give_back(stale.with_kind(kind))).await;
                Err(err.with_backend(NAME))
            }
        }
    }
}

/// The mutex lease of a grant statement's answer (`None`: the lock is
/// held), through [`Grant::lease_or_give_back`]: the row mode's and the
/// ShedLock layout's grants end here.
pub(crate) async fn mutex_lease<F: Future<Output = ()>>(
    granted: Option<FencingToken>,
    key: &LockKey,
    owner: OwnerId,
    ttl: Duration,
    sent_at: Instant,
    give_back: impl FnOnce(Lease) -> F,
) -> Result<Option<Lease>, LockError> {
    let Some(token) = granted else {
        return Ok(None);
    };
    let grant = Grant {
        key,
        owner,
        token,
        kind: LeaseKind::Exclusive,
        ttl,
        sent_at,
    };
    grant.lease_or_give_back(give_back).await.map(Some)
}

/// The grants of a mode whose only shape is the mutex (session mode, the
/// ShedLock layout): the kernel's `grant` and `holders` of such a backend
/// are written once, here, over its three calls.
#[async_trait]
pub(crate) trait MutexOnly: Send + Sync {
    /// A mutex grant: one try (the lease, or `None` when held) without a
    /// deadline, else a wait until the deadline (a `Contended` error when
    /// still held then).
    async fn take(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError>;

    /// The key's holder.
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError>;

    /// `grant` of backend `name`: the mutex, tried once or waited for;
    /// the shared kinds refused.
    async fn grant_mutex(
        &self,
        name: &'static str,
        request: GrantRequest<'_>,
    ) -> Result<Option<Lease>, LockError> {
        request.mutex_only(name)?;
        self.take(request).await
    }

    /// `holders` of backend `name`: the mutex's, the other shapes refused.
    async fn mutex_holders(
        &self,
        name: &'static str,
        key: &LockKey,
        shape: LockShape,
    ) -> Result<Vec<HolderInfo>, LockError> {
        if shape != LockShape::Mutex {
            return Err(unsupported_shape(name, key, shape));
        }
        Ok(lock_core::kind::mutex_holders(self.inspect(key).await?))
    }
}

/// Row mode's try-once mutex grant, release and holder.
#[derive(Clone)]
pub(crate) struct Grants {
    inner: Arc<Table>,
}

impl Grants {
    pub(crate) fn new(inner: Arc<Table>) -> Self {
        Self { inner }
    }

    /// One grant of `key` to `owner`: `Some(token)` when granted, `None`
    /// when someone else holds it.
    ///
    /// When the connection breaks under the statement, its reply may have
    /// been lost after the grant committed. The grant then runs once more,
    /// with the same owner, on a fresh connection: it cannot grant twice (a
    /// row we hold is unexpired, so the statement leaves it alone), and
    /// when it finds the row held, one inspect on the same connection tells
    /// whether the holder is `owner`, in which case the first grant did
    /// commit and its token is ours. Without this the lost grant would hold
    /// the key for its whole TTL while its requester waited behind it.
    ///
    /// `grant` is the statement and `values` its values (see
    /// [`grant_statement`](Self::grant_statement)), both by reference: a
    /// copy kept across an await, here or in the statement's boxed future,
    /// made the futures larger (each past the allocator's 1,032-byte
    /// per-thread cache in turn).
    async fn grant_once(
        &self,
        grant: &Arc<str>,
        values: &GrantValues<'_>,
    ) -> Result<Option<i64>, sqlx::Error> {
        let (conns, dialect) = (&self.inner.conns, self.inner.dialect);
        // `ConnSet::checkout` written out: its future holds the checkout it
        // answers at once, which would make every grant's future larger.
        let mut checkout = match conns.checkout_now(false, true) {
            Some(checkout) => checkout,
            None => Box::pin(conns.checkout_waiting(false, true)).await?,
        };
        // Boxed, as in `retry_once!`: statement futures are kilobytes.
        let result = Box::pin(dialect.grant(checkout.conn(), grant, values)).await;
        if !checkout.finish(&result) {
            return result;
        }
        // Boxed: a rare path, whose state would make every grant's future
        // larger.
        Box::pin(self.grant_again(grant, *values)).await
    }

    /// The grant statement for `values`, and the values it binds (a mark
    /// only for the waiter's statement, where the dialect has one).
    fn grant_statement<'v>(&self, mut values: GrantValues<'v>) -> (&Arc<str>, GrantValues<'v>) {
        let statements = &self.inner.statements;
        let grant = match (values.ahead, values.mark_for, &statements.waiting) {
            (Some(_), _, _) => &self.inner.fair_grant,
            (None, Some(_), Some(waiting)) => &waiting.grant,
            (None, _, _) => &statements.grant,
        };
        if values.ahead.is_some() || statements.waiting.is_none() {
            values.mark_for = None;
        }
        (grant, values)
    }

    /// [`grant_once`](Self::grant_once)'s second run, on a fresh connection
    /// after the first one broke under statement `grant`.
    async fn grant_again(
        &self,
        grant: &Arc<str>,
        values: GrantValues<'_>,
    ) -> Result<Option<i64>, sqlx::Error> {
        let (key, owner) = (values.key, values.owner);
        let (conns, dialect) = (&self.inner.conns, self.inner.dialect);
        let statements = &self.inner.statements;
        tracing::debug!(
            key = key.as_str(),
            "database connection broke under a grant; retrying on a fresh one"
        );
        let mut checkout = conns.checkout(true).await?;
        let result = Box::pin(async {
            let conn = checkout.conn();
            if let Some(token) = dialect.grant(conn, grant, &values).await? {
                return Ok(Some(token));
            }
            let holder = dialect.inspect(conn, &statements.inspect, key).await?;
            Ok(holder.and_then(|(holder, token, _, _)| {
                (holder.as_deref() == Some(owner)).then_some(token)
            }))
        })
        .await;
        checkout.finish(&result);
        result
    }

    /// One grant statement with its retries: `Some(token)` when the row was
    /// inserted or an expired one taken over, `None` when someone holds it.
    async fn grant_row(
        &self,
        key: &LockKey,
        owner: OwnerId,
        ttl: Duration,
        ahead: Option<i64>,
        mark_for: Option<Duration>,
    ) -> Result<Option<u64>, sqlx::Error> {
        let owner = owner.hex();
        let (grant, values) = self.grant_statement(GrantValues {
            key,
            owner: owner.as_str(),
            ttl,
            ahead,
            mark_for,
        });
        // A statement that lost a deadlock or serialization conflict
        // (InnoDB's gap locks on concurrent first inserts of one key) was
        // rolled back and changed nothing: run it again.
        let mut attempts = 0;
        let token = loop {
            match self.grant_once(grant, &values).await {
                Err(sqlx::Error::Database(db))
                    if attempts < 5 && matches!(db.code().as_deref(), Some("40001" | "40P01")) =>
                {
                    attempts += 1;
                    tokio::time::sleep(lock_core::random_delay(Duration::from_millis(2))).await;
                }
                other => break other?,
            }
        };
        Ok(token.map(|t| u64::try_from(t).unwrap_or(0)))
    }

    /// One try: the lease, or `None` when held. `ahead`: the fair grant,
    /// behind no live waiter queued before this id.
    pub(crate) async fn try_once(
        &self,
        key: &LockKey,
        ttl: Duration,
        operation: Operation,
        ahead: Option<i64>,
    ) -> Result<Option<Lease>, LockError> {
        self.try_marking(key, ttl, operation, ahead, None).await
    }

    /// [`try_once`](Self::try_once); with `mark_for` (a waiter, on
    /// PostgreSQL), a held row is marked waited for that long in the same
    /// statement, so that its release notifies (see
    /// [`WaitingSql`](crate::dialect::WaitingSql)).
    pub(crate) async fn try_marking(
        &self,
        key: &LockKey,
        ttl: Duration,
        operation: Operation,
        ahead: Option<i64>,
        mark_for: Option<Duration>,
    ) -> Result<Option<Lease>, LockError> {
        let owner = OwnerId::random();
        let sent_at = Instant::now();
        let grant = self.grant_row(key, owner, ttl, ahead, mark_for);
        let granted = timed(&self.inner.config, operation, Some(key), grant).await?;
        mutex_lease(
            granted.map(FencingToken::new),
            key,
            owner,
            ttl,
            sent_at,
            |stale| async move {
                let _ = self.release(&stale).await;
            },
        )
        .await
    }

    /// The try-once grant of a mutex.
    pub(crate) async fn try_take(
        &self,
        key: &LockKey,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(ttl, MIN_TTL, Operation::TryAcquire)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        // Fair: not while anyone waits (every live waiter is ahead).
        let ahead = self.inner.config.fair.then_some(i64::MAX);
        self.try_marking(key, ttl, Operation::TryAcquire, ahead, None)
            .await
    }

    /// Marks `key`'s held row waited for during `mark_for`, so that its
    /// release notifies (a holder watch on PostgreSQL, see
    /// [`WaitingSql`](crate::dialect::WaitingSql)); nothing elsewhere. A
    /// failure is ignored: the watch's poll still bounds its wait.
    pub(crate) async fn mark_waited(&self, key: &LockKey, mark_for: Duration) {
        let inner = &self.inner;
        let Some(waiting) = &inner.statements.waiting else {
            return;
        };
        let dialect = inner.dialect;
        let _ = timed(&inner.config, Operation::Inspect, Some(key), async {
            retry_once!(&inner.conns, |conn| dialect.mark_waited(
                conn,
                &waiting.mark,
                key,
                mark_for
            ))
        })
        .await;
    }

    /// The guarded release of a mutex lease: whether it was still ours.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let inner = &self.inner;
        let key = lease.key();
        let statement = &inner.statements.release;
        let owner = lease.owner().hex();
        let row = LeaseRow::of(lease, owner.as_str());
        let channel = &inner.channel;
        let dialect = inner.dialect;
        let released = timed(&inner.config, Operation::Release, Some(key), async {
            retry_once!(&inner.conns, |conn| dialect
                .release(conn, statement, &row, channel))
        })
        .await?;
        if released && !dialect.notified() {
            // Wake this process's waiters at once; other processes poll.
            // (PostgreSQL's NOTIFY reaches every waiter, ours included.)
            inner.waits.released(key.as_str());
        }
        Ok(released)
    }

    /// The key's unexpired holder with the details its grant wrote (once
    /// more on a fresh connection when the connection broke).
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let inner = &self.inner;
        let (statement, dialect) = (&inner.statements.inspect, inner.dialect);
        let row = timed(&inner.config, Operation::Inspect, Some(key), async {
            retry_once!(read, &inner.conns, |conn| dialect
                .inspect(conn, statement, key))
        })
        .await?;
        Ok(row.map(|(owner, token, remaining_us, details)| LockInfo {
            details: details.as_deref().and_then(HolderDetails::decode),
            key: key.clone(),
            holder: owner.unwrap_or_default(),
            token: u64::try_from(token).ok().map(FencingToken::new),
            remaining_ttl: Some(crate::dialect::remaining(remaining_us)),
        }))
    }
}
