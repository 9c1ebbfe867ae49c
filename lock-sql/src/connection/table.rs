//! The row-mode lease table as every component of
//! [`SqlBackend`](crate::SqlBackend) reaches it: the configuration, the
//! dialect, the driver's own connections, the statements prepared for the
//! table, the users' pool and the process's wake-ups for the table. Opening
//! it checks the database answers and creates the schema.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use lock_core::{LockError, LockKey, Operation, with_timeout};

use crate::config::{NAME, SqlConfig};
use crate::connection::wake::Waits;
#[cfg(feature = "postgres")]
use crate::connection::wake::run_listener;
use crate::connection::{ConnSet, DbOptions, DbPool, SchemaRace, retry_once};
use crate::dialect::{self, Dialect, first_token, pool_size};
use crate::error::{is_duplicate_column, is_missing_column, map_sqlx};
use crate::keys::Statements;
use crate::keys::shared::SharedSql;

/// One backend's lease table and what reaches it.
pub(crate) struct Table {
    pub(crate) config: SqlConfig,
    /// What differs between the databases.
    pub(crate) dialect: &'static dyn Dialect,
    /// The lock statements' connections.
    pub(crate) conns: ConnSet,
    /// The users' pool (same database, same options).
    pub(crate) pool: DbPool,
    pub(crate) statements: Statements,
    /// The fair grant (`fair=true`; see `crate::waiting`).
    pub(crate) fair_grant: Arc<str>,
    /// The read-write locks' and semaphores' statements.
    pub(crate) shared: SharedSql,
    /// PostgreSQL's release notification channel.
    pub(crate) channel: String,
    /// Wake-ups and waiter counts, shared with the process's other clients
    /// of the same database and table.
    pub(crate) waits: Arc<Waits>,
}

impl Table {
    /// Opens the table of `config` (row mode, lease layout): a first
    /// connection, then the schema unless `create_table=false`.
    pub(crate) async fn open(config: SqlConfig) -> Result<Arc<Self>, LockError> {
        let dialect = dialect::of(config.dialect)?;
        let (options, pool) = dialect.open(&config)?;
        let mut statements = Statements::new(dialect, &config.table);
        let shared = SharedSql::new(dialect, &config.table);
        // The shared tables are created (and listed) with the lease table.
        statements.create.extend(shared.create.iter().cloned());
        // An in-memory SQLite database is private to this backend.
        let scope =
            (!config.is_memory()).then(|| format!("{}\n{}", config.driver_url(), config.table));
        let fair_grant = Arc::from(dialect.fair_grant_sql(
            &statements.quoted_table,
            &first_token(&statements.quoted_floor),
            &shared.waiters_table,
        ));
        let table = Arc::new(Self {
            conns: ConnSet::new(options, pool_size(&config), dialect.single_writer()),
            dialect,
            pool,
            statements,
            fair_grant,
            shared,
            channel: dialect::pg_channel(&config.table),
            waits: Waits::shared(scope),
            config,
        });
        table.prepare().await?;
        Ok(table)
    }

    /// A sqlx error of `operation` on `key`, mapped.
    pub(crate) fn err(&self, operation: Operation, key: &LockKey, err: sqlx::Error) -> LockError {
        map_sqlx(&self.config, operation, err).with_key(key)
    }

    /// The operation timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.config.op_timeout
    }

    /// The lease table's name, quoted.
    pub(crate) fn quoted_table(&self) -> &str {
        &self.statements.quoted_table
    }

    /// The token floor table's name, quoted.
    pub(crate) fn quoted_floor(&self) -> &str {
        &self.statements.quoted_floor
    }

    /// How the backend opens connections.
    pub(crate) fn connect_options(&self) -> &DbOptions {
        self.conns.options()
    }

    /// Closes the connections and the pool.
    pub(crate) async fn close(&self) {
        self.conns.close().await;
        self.pool.close().await;
    }

    /// Makes sure the PostgreSQL listener of this database and table runs
    /// in the process (no-op elsewhere). Failing to start it is not an
    /// error: waiters then rely on the bounded re-check.
    pub(crate) async fn ensure_listener(&self) {
        #[cfg(feature = "postgres")]
        if let DbOptions::Postgres(options) = self.connect_options() {
            let waits = &self.waits;
            let _ = tokio::time::timeout(
                self.timeout(),
                waits.listener.get_or_try_init(|| async {
                    // A pool of its own, so the listening connection never
                    // takes a connection the lock statements need.
                    let pool = sqlx::pool::PoolOptions::<sqlx::Postgres>::new()
                        .max_connections(1)
                        .acquire_timeout(self.timeout())
                        .connect_lazy_with(options.clone());
                    let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
                    listener.listen(&self.channel).await?;
                    let task = tokio::spawn(run_listener(listener, waits.sender()));
                    *waits
                        .listener_task
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Some(task);
                    Ok::<(), sqlx::Error>(())
                }),
            )
            .await;
        }
    }

    /// Checks the database answers and creates the tables.
    async fn prepare(&self) -> Result<(), LockError> {
        let config = &self.config;
        let budget = config.op_timeout.saturating_mul(2);
        with_timeout(budget, Operation::Connect, async {
            if !config.create_table {
                let ping: Arc<str> = Arc::from("SELECT 1");
                let dialect = self.dialect;
                return retry_once!(read, &self.conns, |conn| dialect.plain(conn, &ping))
                    .map_err(|e| map_sqlx(config, Operation::Connect, e));
            }
            // Another client creating the same tables at the same moment:
            // the loser tries again (see `SchemaRace`).
            let mut race = SchemaRace::within(config.op_timeout);
            loop {
                match self.create_schema().await {
                    Err(err) if race.again(&err).await => {}
                    other => break other.map_err(|e| map_sqlx(config, Operation::Connect, e)),
                }
            }
        })
        .await
        .map_err(|e| e.with_backend(NAME))
    }

    async fn create_schema(&self) -> Result<(), sqlx::Error> {
        let dialect = self.dialect;
        for statement in &self.statements.create {
            retry_once!(&self.conns, |conn| dialect.plain(conn, statement))?;
        }
        // The `details` column, for a lease table and a shared holders
        // table created before it.
        for table in [&self.statements.quoted_table, &self.shared.holders_table] {
            let add = Arc::from(self.dialect.add_details_sql(table));
            self.ensure_column(table, "details", &add).await?;
        }
        // The waiters' mark (PostgreSQL), likewise.
        if let Some(waiting) = &self.statements.waiting {
            let table = &self.statements.quoted_table;
            self.ensure_column(table, "waiters_until", &waiting.add_column)
                .await?;
        }
        Ok(())
    }

    /// Adds `column` to `table` with `alter` when a probe finds it missing
    /// (a table created by an older version); a probe first, as `ALTER
    /// TABLE` would wait for every open transaction on the table.
    async fn ensure_column(
        &self,
        table: &str,
        column: &str,
        alter: &Arc<str>,
    ) -> Result<(), sqlx::Error> {
        let dialect = self.dialect;
        let probe: Arc<str> = Arc::from(format!("SELECT {column} FROM {table} WHERE 1 = 0"));
        let mut checkout = self.conns.checkout(false).await?;
        let probed = dialect.plain(checkout.conn(), &probe).await;
        if !matches!(&probed, Err(e) if is_missing_column(e)) {
            checkout.finish(&probed);
            return probed;
        }
        tracing::info!(table, column, "adding a column the driver needs");
        let added = match dialect.plain(checkout.conn(), alter).await {
            Err(e) if is_duplicate_column(&e) => Ok(()),
            other => other,
        };
        checkout.finish(&added);
        added
    }
}
