//! The ShedLock layout (`layout=shedlock`): our mutex on ShedLock's table,
//! so that ShedLock-scheduled jobs and ours exclude each other. See the
//! crate docs' "ShedLock layout" for the table, the statements and the
//! caveats.

mod admin;
mod sql;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::election::ElectionPage;
use lock_core::{
    Admin, Capabilities, ErrorKind, Facets, FencingScope, FencingToken, GcReport, GrantRequest,
    HolderInfo, Lease, LeaseKind, ListQuery, Listing, LockBackend, LockError, LockInfo, LockKey,
    LockPage, LockShape, Operation, OwnerId, RENEW_CONCURRENCY, SharedPage, TtlModel, WaitStrategy,
    check_ttl, renew_concurrently, unsupported_shape, validity_deadline, with_timeout,
};
use tokio::time::Instant;

use crate::config::{SqlConfig, SqlDialect, SqlLayout, SqlMode};
use crate::conn::retry_once;
use crate::conn::{ConnSet, DbOptions, SchemaRace, pool_size};
use crate::driver::{MIN_TTL, NAME};
use crate::error::{map_sqlx, timed};
use crate::granted::Grant;
use sql::{ShedSql, is_conflict};

/// The longest ShedLock lock name (its `name VARCHAR(64)` column).
pub const SHEDLOCK_MAX_NAME: usize = 64;

/// What `locked_by` holds for our grants: `<host>/distlock/<owner hex>`.
const OURS: &str = "/distlock/";

/// A mutex on ShedLock's table (`shedlock(name, lock_until, locked_at,
/// locked_by)`) with our fencing tokens in a side table
/// (`<table>_tokens(name, token)`), on PostgreSQL, MySQL/MariaDB or
/// SQLite. Opened by [`connect`](crate::connect) for a URL with
/// `layout=shedlock`, or [`SqlShedLockBackend::connect`].
///
/// Only the mutex: read-write locks and semaphores are
/// [`ErrorKind::Unsupported`]; `fair=true` is refused at connect
/// (`Unsupported`) and `mode=session` when the config is built
/// (`Config`). Cheap to clone.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lock_core::{LockBackend, LockBackendExt, LockKey};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let dir = tempfile::tempdir().expect("temp dir");
/// let url = format!("sqlite://{}?layout=shedlock", dir.path().join("jobs.db").display());
/// let backend = lock_sql::connect(&url).await?;
/// let key = LockKey::new("nightlyReport")?; // the ShedLock name, as-is
/// let lease = backend.try_acquire(&key, Duration::from_secs(5)).await?.expect("free");
/// assert!(backend.try_acquire(&key, Duration::from_secs(5)).await?.is_none());
/// assert!(backend.release(&lease).await?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqlShedLockBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: SqlConfig,
    sql: ShedSql,
    conns: ConnSet,
    /// `<host>` of `locked_by`.
    host: String,
}

impl fmt::Debug for SqlShedLockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlShedLockBackend")
            .field("config", &self.inner.config)
            .field("host", &self.inner.host)
            .finish_non_exhaustive()
    }
}

/// This host's name, as ShedLock writes it into `locked_by` (at most 128
/// printable characters; `localhost` when unknown).
fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let host: String = raw
        .trim()
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(128)
        .collect();
    if host.is_empty() {
        "localhost".to_owned()
    } else {
        host
    }
}

/// Whether `locked_by` has the shape of one of our grants.
fn is_ours(locked_by: &str) -> bool {
    locked_by
        .rsplit_once(OURS)
        .is_some_and(|(_, owner)| owner.len() == 32 && owner.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl SqlShedLockBackend {
    /// Connects with a URL (see [`SqlConfig::from_url`]); the URL must say
    /// `layout=shedlock`.
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

    /// Opens a first connection, creates ShedLock's table and the tokens
    /// table when missing (unless `create_table=false`; an existing table
    /// is never altered) and checks that both have the expected columns.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] when the config's layout is not
    /// [`SqlLayout::ShedLock`], for `mode=session`, a dialect whose cargo
    /// feature is off, options the driver rejects, or a table that is
    /// missing (with `create_table=false`) or lacks ShedLock's columns;
    /// [`ErrorKind::Unsupported`] for `fair=true`;
    /// [`ErrorKind::Unavailable`] / [`ErrorKind::Timeout`] when the database
    /// cannot be reached within the operation timeout;
    /// [`ErrorKind::Backend`] when creating a table fails.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes whatever was opened. A table created
    /// meanwhile stays (creation is idempotent).
    pub async fn connect(config: SqlConfig) -> Result<Self, LockError> {
        if config.layout != SqlLayout::ShedLock {
            return Err(LockError::config(
                "SqlShedLockBackend needs layout=shedlock (SqlLayout::ShedLock)",
            )
            .with_backend(NAME));
        }
        config.check_layout().map_err(|e| e.with_backend(NAME))?;
        if config.fair {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                Operation::Connect,
                "fair=true is not available with layout=shedlock: ShedLock's table has no \
                 waiter queue, and ShedLock's own clients would not respect one",
            )
            .with_backend(NAME));
        }
        let dialect = crate::dialect::of(config.dialect)?;
        let (options, _) = dialect.open(&config)?;
        let options = match options {
            // Like a JDBC client that sets no session time zone: ShedLock's
            // TIMESTAMP columns are read and written in the server's
            // default zone, so ours must be the same (sqlx would set +00:00).
            #[cfg(feature = "mysql")]
            DbOptions::MySql(o) => DbOptions::MySql(o.timezone(None::<String>)),
            other => other,
        };
        let backend = Self {
            inner: Arc::new(Inner {
                conns: ConnSet::new(options, pool_size(&config), dialect.single_writer()),
                sql: ShedSql::new(config.dialect, &config.table),
                host: host_name(),
                config,
            }),
        };
        backend.prepare().await?;
        Ok(backend)
    }

    /// The configuration.
    pub fn config(&self) -> &SqlConfig {
        &self.inner.config
    }

    /// The quoted ShedLock table.
    pub fn quoted_table(&self) -> &str {
        &self.inner.sql.quoted_table
    }

    /// The quoted tokens table (`<table>_tokens`).
    pub fn quoted_tokens_table(&self) -> &str {
        &self.inner.sql.quoted_tokens
    }

    /// The DDL this backend runs when the tables are missing (ShedLock's
    /// for this database, then the tokens table's), for teams that create
    /// them themselves (then connect with `create_table=false`).
    pub fn schema_sql(&self) -> Vec<String> {
        self.inner
            .sql
            .create
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// The lock statements, labelled (`grant`, `release`, `renew`,
    /// `inspect`, and the grant's helpers), as sent.
    pub fn statements_sql(&self) -> Vec<(&'static str, String)> {
        let statements = self.inner.sql.lock_statements();
        statements
            .into_iter()
            .map(|(label, sql)| (label, sql.to_owned()))
            .collect()
    }

    /// What our grant of `lease` writes into `locked_by`:
    /// `<host>/distlock/<owner hex>`.
    pub fn locked_by(&self, lease: &Lease) -> String {
        self.locked_by_owner(lease.owner())
    }

    fn locked_by_owner(&self, owner: OwnerId) -> String {
        format!("{}{OURS}{}", self.inner.host, owner.to_hex())
    }

    /// Closes the connections: later calls fail with
    /// [`ErrorKind::Unavailable`].
    ///
    /// # Errors
    ///
    /// None today; kept fallible like [`SqlBackend::close`](crate::SqlBackend::close).
    ///
    /// # Cancel safety
    ///
    /// Safe: new calls are refused once called.
    pub async fn close(&self) -> Result<(), LockError> {
        self.inner.conns.close().await;
        Ok(())
    }

    async fn prepare(&self) -> Result<(), LockError> {
        let config = &self.inner.config;
        let sql = &self.inner.sql;
        let conns = &self.inner.conns;
        with_timeout(
            config.op_timeout.saturating_mul(2),
            Operation::Connect,
            async {
                if config.create_table {
                    for statement in &sql.create {
                        // Another client creating the same tables at the
                        // same moment: the loser tries again (see
                        // `SchemaRace`).
                        let mut race = SchemaRace::within(config.op_timeout);
                        loop {
                            match retry_once!(conns, |conn| sql.plain(conn, statement)) {
                                Err(err) if race.again(&err).await => {}
                                other => {
                                    other.map_err(|e| map_sqlx(config, Operation::Connect, e))?;
                                    break;
                                }
                            }
                        }
                    }
                    self.ensure_details_column()
                        .await
                        .map_err(|e| map_sqlx(config, Operation::Connect, e))?;
                }
                for probe in &sql.probe {
                    match retry_once!(read, conns, |conn| sql.plain(conn, probe)) {
                        Err(sqlx::Error::Database(db)) => {
                            return Err(LockError::config(format!(
                                "layout=shedlock needs the tables {} (name, lock_until, locked_at, \
                             locked_by: ShedLock's) and {} (name, token){}: {}; the DDL is {:?}",
                                sql.quoted_table,
                                sql.quoted_tokens,
                                if config.create_table {
                                    ""
                                } else {
                                    " (create_table=false: they are not created)"
                                },
                                db.message(),
                                sql.create,
                            )));
                        }
                        other => other.map_err(|e| map_sqlx(config, Operation::Connect, e))?,
                    }
                }
                let mismatch = retry_once!(read, conns, |conn| sql
                    .collation_mismatch(conn, &config.table))
                .map_err(|e| map_sqlx(config, Operation::Connect, e))?;
                if let Some((lock, tokens)) = mismatch {
                    return Err(LockError::config(format!(
                        "{}.name has collation {lock} but {}.name has {tokens}: names equal for \
                     ShedLock must share one token row; give the tokens table ShedLock's \
                     collation",
                        sql.quoted_table, sql.quoted_tokens
                    )));
                }
                Ok(())
            },
        )
        .await
        .map_err(|e| e.with_backend(NAME))
    }

    /// One grant with its recovery: a grant whose connection broke may
    /// have committed before its reply was lost; the retry on a fresh
    /// connection cannot grant twice (our row is unexpired), and one
    /// inspect says whether the holder is us.
    async fn grant_row(
        &self,
        key: &LockKey,
        locked_by: &str,
        ttl: Duration,
    ) -> Result<Option<i64>, sqlx::Error> {
        let (sql, conns) = (&self.inner.sql, &self.inner.conns);
        let mut conflicts = 0;
        loop {
            let mut checkout = conns.checkout(false).await?;
            let mut result = sql
                .grant(checkout.conn(), key.as_str(), ttl, locked_by)
                .await;
            if checkout.finish(&result) {
                let mut checkout = conns.checkout(true).await?;
                result = async {
                    let conn = checkout.conn();
                    if let Some(token) = sql.grant(conn, key.as_str(), ttl, locked_by).await? {
                        return Ok(Some(token));
                    }
                    Ok(sql
                        .inspect(conn, key.as_str())
                        .await?
                        .and_then(|(by, token, _, _)| token.filter(|_| by == locked_by)))
                }
                .await;
                checkout.finish(&result);
            }
            match result {
                Err(e) if is_conflict(&e) && conflicts < 5 => {
                    conflicts += 1;
                    tokio::time::sleep(lock_core::random_delay(Duration::from_millis(2))).await;
                }
                other => return other,
            }
        }
    }

    fn check_key(key: &LockKey, operation: Operation) -> Result<(), LockError> {
        if key.as_str().chars().count() > SHEDLOCK_MAX_NAME {
            return Err(LockError::new(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "a ShedLock lock name has at most {SHEDLOCK_MAX_NAME} characters \
                     (its name VARCHAR(64) column)"
                ),
            )
            .with_key(key)
            .with_backend(NAME));
        }
        Ok(())
    }

    async fn try_once(
        &self,
        key: &LockKey,
        ttl: Duration,
        operation: Operation,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(ttl, MIN_TTL, operation).map_err(|e| e.with_key(key).with_backend(NAME))?;
        Self::check_key(key, operation)?;
        let owner = OwnerId::random();
        let locked_by = self.locked_by_owner(owner);
        let sent_at = Instant::now();
        let grant = self.grant_row(key, &locked_by, ttl);
        let granted = timed(&self.inner.config, operation, Some(key), grant).await?;
        let Some(token) = granted else {
            return Ok(None);
        };
        let grant = Grant {
            key,
            owner,
            token: FencingToken::new(u64::try_from(token).unwrap_or(0)),
            kind: LeaseKind::Exclusive,
            ttl,
            sent_at,
        };
        grant
            .lease_or_give_back(|stale| async move {
                let _ = self.release(&stale).await;
            })
            .await
            .map(Some)
    }
}

#[async_trait]
impl LockBackend for SqlShedLockBackend {
    fn name(&self) -> &'static str {
        match self.inner.config.dialect {
            SqlDialect::Postgres => "postgres-shedlock",
            SqlDialect::MySql => "mysql-shedlock",
            SqlDialect::Sqlite => "sqlite-shedlock",
        }
    }

    // Every field is set today; `..minimal()` keeps a field added later
    // at its conservative default.
    #[allow(clippy::needless_update)]
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // Our grants only: a ShedLock holder has no token (crate docs).
            fencing: FencingScope::PerKey,
            fencing_survives_failover: true,
            grants_survive_restart: true,
            waiting: WaitStrategy::Poll,
            fifo: false,
            ttl_model: TtlModel::PerLease,
            linearizable: true,
            min_ttl: MIN_TTL,
            shared_locks: false,
            semaphores: false,
            // In the tokens table, beside ShedLock's row (shedlock/admin.rs).
            holder_details: true,
            ..Capabilities::minimal()
        }
    }

    /// The mutex only: ShedLock's table has no shared kinds.
    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        request.mutex_only(LockBackend::name(self))?;
        let GrantRequest {
            key, ttl, deadline, ..
        } = request;
        match deadline {
            None => self.try_take(key, ttl).await,
            Some(deadline) => self.take_waiting(key, ttl, deadline).await.map(Some),
        }
    }

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        renew_concurrently(leases, RENEW_CONCURRENCY, |lease| self.renew_one(lease)).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let key = lease.key();
        let locked_by = self.locked_by(lease);
        let sql = &self.inner.sql;
        timed(&self.inner.config, Operation::Release, Some(key), async {
            retry_once!(&self.inner.conns, |conn| sql.release(
                conn,
                key.as_str(),
                &locked_by
            ))
        })
        .await
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        if shape != LockShape::Mutex {
            return Err(unsupported_shape(LockBackend::name(self), key, shape));
        }
        Ok(lock_core::kind::mutex_holders(
            self.inspect_mutex(key).await?,
        ))
    }

    /// Elections are the default renewed mutex; holders are watched by
    /// polling.
    fn facets(&self) -> Facets<'_> {
        Facets {
            listing: Some(self),
            admin: Some(self),
            ..Facets::default()
        }
    }
}

#[async_trait]
impl Admin for SqlShedLockBackend {
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.force_release_row(key).await
    }

    /// Collects nothing, by design: ShedLock's rows are ShedLock's (it
    /// keeps freed rows for ever), and our tokens rows are the only record
    /// of each name's last fencing token (ShedLock's grants could not
    /// start above a floor of ours), so no row is ever deletable. Answers
    /// an empty report: nothing removed, nothing to run again for.
    ///
    /// # Errors
    ///
    /// None.
    ///
    /// # Cancel safety
    ///
    /// Safe: nothing is sent.
    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError> {
        let _ = older_than;
        tracing::debug!(
            "gc on the ShedLock layout: nothing to collect (ShedLock's rows are ShedLock's, \
             the tokens rows are each name's only record of its last token)"
        );
        Ok(GcReport::default())
    }
}

#[async_trait]
impl Listing for SqlShedLockBackend {
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        self.list_rows(query).await
    }

    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        match shape {
            LockShape::Mutex => lock_core::list_mutex_shared(self, query).await,
            other => {
                let name = LockBackend::name(self);
                Err(LockError::new(
                    ErrorKind::Unsupported,
                    Operation::Inspect,
                    format!("{name} does not support listing {other} locks"),
                )
                .with_backend(name))
            }
        }
    }

    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        lock_core::election::list_mutex_elections(self, query).await
    }
}

/// The mutex's calls, which [`LockBackend::grant`] and
/// [`LockBackend::renew_many`] reach.
impl SqlShedLockBackend {
    async fn try_take(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.try_once(key, ttl, Operation::TryAcquire).await
    }

    async fn take_waiting(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let poll = self.inner.config.poll;
        let mut backoff = poll.backoff();
        loop {
            if let Some(lease) = self.try_once(key, ttl, Operation::Acquire).await? {
                return Ok(lease);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(LockError::new(
                    ErrorKind::Contended,
                    Operation::Acquire,
                    "still held (by ShedLock or by us) at the wait deadline",
                )
                .with_key(key)
                .with_backend(NAME));
            }
            let delay = backoff.next_delay().unwrap_or(poll.max);
            tokio::time::sleep_until((now + delay).min(deadline)).await;
        }
    }

    async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        let key = lease.key();
        let ttl = lease.ttl();
        check_ttl(ttl, MIN_TTL, Operation::Renew)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        let locked_by = self.locked_by(lease);
        let sql = &self.inner.sql;
        let sent_at = Instant::now();
        let renewed = timed(&self.inner.config, Operation::Renew, Some(key), async {
            retry_once!(&self.inner.conns, |conn| sql.renew(
                conn,
                key.as_str(),
                &locked_by,
                ttl
            ))
        })
        .await?;
        if renewed {
            Ok(validity_deadline(sent_at, ttl))
        } else {
            Err(LockError::new(
                ErrorKind::NotHeld,
                Operation::Renew,
                "the lease expired, was released, or belongs to someone else",
            )
            .with_key(key)
            .with_backend(NAME))
        }
    }

    async fn inspect_mutex(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let sql = &self.inner.sql;
        let row = timed(&self.inner.config, Operation::Inspect, Some(key), async {
            retry_once!(read, &self.inner.conns, |conn| sql
                .inspect(conn, key.as_str()))
        })
        .await?;
        Ok(
            row.map(|(locked_by, token, remaining_us, details)| LockInfo {
                details: sql::details_of(&locked_by, details.as_deref()),
                key: key.clone(),
                // A ShedLock holder's token is not its own: none.
                token: token
                    .filter(|_| is_ours(&locked_by))
                    .and_then(|t| u64::try_from(t).ok())
                    .map(FencingToken::new),
                holder: locked_by,
                remaining_ttl: Some(Duration::from_micros(
                    u64::try_from(remaining_us).unwrap_or(0),
                )),
            }),
        )
    }
}

/// The layout check of [`crate::SqlBackend::connect`] and
/// [`crate::SqlSessionBackend::connect`]: both refuse `layout=shedlock`.
pub(crate) fn refuse_shedlock(config: &SqlConfig, opener: &str) -> Result<(), LockError> {
    if config.layout == SqlLayout::ShedLock {
        let what = if config.mode == SqlMode::Session {
            "layout=shedlock cannot be combined with mode=session"
        } else {
            "layout=shedlock is the ShedLock backend: open it with lock_sql::connect or \
             SqlShedLockBackend"
        };
        return Err(LockError::config(format!("{what}, not {opener}")).with_backend(NAME));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_locked_by_is_recognised() {
        assert!(is_ours("web-1/distlock/0123456789abcdef0123456789ABCDEF"));
        assert!(!is_ours("web-1"));
        assert!(!is_ours("web-1/distlock/xyz"));
        assert!(!host_name().is_empty());
        assert_eq!(sql::tokens_table("app.shedlock"), "app.shedlock_tokens");
    }
}
