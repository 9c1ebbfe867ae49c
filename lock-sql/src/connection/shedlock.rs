//! The ShedLock layout's table as its components reach it: the
//! configuration, the statements, the driver's own connections, and this
//! host's name for `locked_by`. Opening it checks (and, unless
//! `create_table=false`, creates) ShedLock's table and the tokens table.

use std::sync::Arc;

use lock_core::{LockError, Operation, OwnerId, with_timeout};

use crate::config::{NAME, SqlConfig, SqlDialect};
use crate::connection::{ConnSet, DbOptions, SchemaRace, retry_once};
use crate::dialect::pool_size;
use crate::error::{is_duplicate_column, is_missing_column, map_sqlx};
use crate::keys::shedlock::{ShedSql, host_name, locked_by};

/// ShedLock's table and what reaches it.
pub(crate) struct ShedTable {
    pub(crate) config: SqlConfig,
    pub(crate) sql: ShedSql,
    pub(crate) conns: ConnSet,
    /// `<host>` of `locked_by`.
    host: String,
}

impl ShedTable {
    /// Opens the table of `config` (checked to be the ShedLock layout by
    /// the backend).
    pub(crate) async fn open(config: SqlConfig) -> Result<Arc<Self>, LockError> {
        let dialect = crate::dialect::of(config.dialect)?;
        let (options, _) = dialect.open(&config)?;
        let options = match options {
            // Like a JDBC client that sets no session time zone: ShedLock's
            // TIMESTAMP columns are read and written in the server's
            // default zone, so ours must be the same (sqlx would set +00:00).
            #[cfg(feature = "mysql")]
            DbOptions::MySql(o) => DbOptions::MySql(o.timezone(None::<String>)),
            // A MySQL-only build has no other variant.
            #[cfg_attr(
                not(any(feature = "postgres", feature = "sqlite")),
                allow(unreachable_patterns)
            )]
            other => other,
        };
        let table = Arc::new(Self {
            conns: ConnSet::new(options, pool_size(&config), dialect.single_writer()),
            sql: ShedSql::new(config.dialect, &config.table),
            host: host_name(),
            config,
        });
        table.prepare().await?;
        Ok(table)
    }

    /// What our grant by `owner` writes into `locked_by`.
    pub(crate) fn locked_by(&self, owner: OwnerId) -> String {
        locked_by(&self.host, owner)
    }

    /// The host name our grants write.
    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    async fn prepare(&self) -> Result<(), LockError> {
        let config = &self.config;
        let sql = &self.sql;
        let conns = &self.conns;
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

    /// Adds `details` to a tokens table created before it.
    async fn ensure_details_column(&self) -> Result<(), sqlx::Error> {
        let inner = self;
        let k = &inner.sql.quoted_tokens;
        let probe: Arc<str> = Arc::from(format!("SELECT details FROM {k} WHERE 1 = 0"));
        let mut checkout = inner.conns.checkout(false).await?;
        let probed = inner.sql.plain(checkout.conn(), &probe).await;
        if !matches!(&probed, Err(e) if is_missing_column(e)) {
            checkout.finish(&probed);
            return probed;
        }
        let kind = match inner.config.dialect {
            SqlDialect::Sqlite => "TEXT".to_owned(),
            _ => format!("VARCHAR({})", crate::keys::shedlock::SIDE_DETAILS_LEN),
        };
        let alter: Arc<str> = Arc::from(format!("ALTER TABLE {k} ADD COLUMN details {kind}"));
        let added = match inner.sql.plain(checkout.conn(), &alter).await {
            Err(e) if is_duplicate_column(&e) => Ok(()),
            other => other,
        };
        checkout.finish(&added);
        added
    }
}
