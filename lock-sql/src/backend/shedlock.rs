//! The ShedLock layout (`layout=shedlock`): our mutex on ShedLock's table,
//! so that ShedLock-scheduled jobs and ours exclude each other. See the
//! crate docs' "ShedLock layout" for the table, the statements and the
//! caveats.
//!
//! [`SqlShedLockBackend`]'s components: the table (`crate::connection::shedlock`),
//! the grants (`crate::grants::shedlock`), the renewals
//! (`crate::renewal::shedlock`) and the operating calls
//! (`crate::admin::shedlock`); the `locked_by` layout is in
//! `crate::keys::shedlock`.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::{
    Capabilities, ErrorKind, Facets, Lease, LockBackend, LockError, Operation, WaitStrategy,
};

use super::mutex_only_kernel;
use crate::admin::shedlock::ShedAdmin;
use crate::config::{NAME, SqlConfig, SqlDialect, SqlLayout};
use crate::connection::shedlock::ShedTable;
use crate::grants::shedlock::ShedGrants;
use crate::renewal::shedlock::ShedRenewal;

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
    inner: Arc<Parts>,
}

/// The components, each owning its concern, over ShedLock's table.
struct Parts {
    table: Arc<ShedTable>,
    grants: ShedGrants,
    renewal: ShedRenewal,
    admin: ShedAdmin,
}

impl fmt::Debug for SqlShedLockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlShedLockBackend")
            .field("config", &self.inner.table.config)
            .field("host", &self.inner.table.host())
            .finish_non_exhaustive()
    }
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
        let table = ShedTable::open(config).await?;
        let name = backend_name(table.config.dialect);
        let parts = Parts {
            grants: ShedGrants::new(Arc::clone(&table)),
            renewal: ShedRenewal::new(Arc::clone(&table)),
            admin: ShedAdmin::new(Arc::clone(&table), name),
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

    /// The quoted ShedLock table.
    pub fn quoted_table(&self) -> &str {
        &self.inner.table.sql.quoted_table
    }

    /// The quoted tokens table (`<table>_tokens`).
    pub fn quoted_tokens_table(&self) -> &str {
        &self.inner.table.sql.quoted_tokens
    }

    /// The DDL this backend runs when the tables are missing (ShedLock's
    /// for this database, then the tokens table's), for teams that create
    /// them themselves (then connect with `create_table=false`).
    pub fn schema_sql(&self) -> Vec<String> {
        self.inner
            .table
            .sql
            .create
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// The lock statements, labelled (`grant`, `release`, `renew`,
    /// `inspect`, and the grant's helpers), as sent.
    pub fn statements_sql(&self) -> Vec<(&'static str, String)> {
        let statements = self.inner.table.sql.lock_statements();
        statements
            .into_iter()
            .map(|(label, sql)| (label, sql.to_owned()))
            .collect()
    }

    /// What our grant of `lease` writes into `locked_by`:
    /// `<host>/distlock/<owner hex>`.
    pub fn locked_by(&self, lease: &Lease) -> String {
        self.inner.table.locked_by(lease.owner())
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
        self.inner.table.conns.close().await;
        Ok(())
    }
}

/// The backend's name on `dialect`.
fn backend_name(dialect: SqlDialect) -> &'static str {
    match dialect {
        SqlDialect::Postgres => "postgres-shedlock",
        SqlDialect::MySql => "mysql-shedlock",
        SqlDialect::Sqlite => "sqlite-shedlock",
    }
}

#[async_trait]
impl LockBackend for SqlShedLockBackend {
    fn name(&self) -> &'static str {
        backend_name(self.inner.table.config.dialect)
    }

    // Fencing: our grants only, a ShedLock holder has no token (crate
    // docs). Holder details: in the tokens table, beside ShedLock's row
    // (`crate::admin::shedlock`).
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            waiting: WaitStrategy::Poll,
            fifo: false,
            shared_locks: false,
            semaphores: false,
            ..crate::backend::lease_row_capabilities()
        }
    }

    // The mutex only: ShedLock's table has no shared kinds.
    mutex_only_kernel!();

    /// Elections are the default renewed mutex; holders are watched by
    /// polling.
    fn facets(&self) -> Facets<'_> {
        Facets {
            listing: Some(&self.inner.admin),
            admin: Some(&self.inner.admin),
            ..Facets::default()
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn our_locked_by_is_recognised() {
        assert!(crate::keys::shedlock::is_ours(
            "web-1/distlock/0123456789abcdef0123456789ABCDEF"
        ));
        assert!(!crate::keys::shedlock::is_ours("web-1"));
        assert!(!crate::keys::shedlock::is_ours("web-1/distlock/xyz"));
        assert!(!crate::keys::shedlock::host_name().is_empty());
        assert_eq!(
            crate::keys::shedlock::tokens_table("app.shedlock"),
            "app.shedlock_tokens"
        );
    }
}
