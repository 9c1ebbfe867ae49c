//! PostgreSQL behind a pooler in transaction or statement pooling
//! (PgBouncer, and poolers that work the same way): a client connection
//! keeps its server connection only until the end of each transaction, so
//! state a client leaves on a server session (prepared statements,
//! advisory locks, `LISTEN`) may be another client's next.
//!
//! - **Row mode** (`pooler=transaction`, [`PooledPg`]): sqlx 0.9 prepares
//!   a statement with binds in one exchange (`Parse`/`Describe`/`Sync`)
//!   and runs it in another (`Bind`/`Execute`/`Sync`). A pooler hands the
//!   server connection back at the first `Sync` (the server is idle, out
//!   of any transaction), so the second exchange may reach another server
//!   connection, where our statement does not exist or (worse) another
//!   client's statement of the same name does. Cached statements have
//!   names (`sqlx_s_1`, ...) that every client reuses, so without a pooler
//!   that tracks them (PgBouncer 1.21+ `max_prepared_statements`) the
//!   second client on a server connection fails with "prepared statement
//!   \"sqlx_s_1\" already exists". `statement_cache_capacity=0` alone does
//!   not help: sqlx then still prepares named statements, it only stops
//!   reusing (and closing) them. So a statement with binds runs unnamed
//!   (`persistent(false)`) inside a transaction of its own (`BEGIN` ..
//!   `COMMIT`, simple-protocol messages), which keeps both exchanges on
//!   one server connection; statements without binds (the grant
//!   transactions' `BEGIN`/`COMMIT`, schema set-up) go as one
//!   simple-protocol message. Statements inside one of our transactions
//!   are not wrapped again.
//! - **Session mode** ([`refuse_transaction_pooling`]): an advisory lock
//!   lives on the server session that took it; behind transaction pooling
//!   that session serves other clients between our statements, and our
//!   unlock or keep-alive may run on another one. Session mode refuses to
//!   connect when it sees the pooler.

use lock_core::{ErrorKind, LockError, Operation};
use sqlx::postgres::{PgArguments, PgQueryResult, PgRow};
use sqlx::query::Query;
use sqlx::{Executor, PgConnection, Postgres};

use crate::config::{SqlConfig, SqlDialect};
use crate::connection::{DbConn, DbOptions};

/// A PostgreSQL connection through a pooler in transaction pooling: its
/// statements run the pooler-safe way (module docs).
#[derive(Debug)]
pub struct PooledPg {
    pub(crate) conn: PgConnection,
    /// Inside a transaction we opened with a statement of our own
    /// (`BEGIN` .. `COMMIT`/`ROLLBACK`): the pooler keeps the server
    /// connection until it ends, so statements are not wrapped again.
    in_transaction: bool,
}

/// A statement that opens or ends a transaction.
enum Control {
    Begin,
    End,
}

fn control(sql: &str) -> Option<Control> {
    let first = sql.split_whitespace().next()?.to_ascii_uppercase();
    match first.as_str() {
        "BEGIN" | "START" => Some(Control::Begin),
        "COMMIT" | "ROLLBACK" | "END" => Some(Control::End),
        _ => None,
    }
}

/// What a statement returns: rows, or the count of rows it changed.
enum Wanted {
    Rows,
    Count,
}

enum Answer {
    Rows(Vec<PgRow>),
    Count(u64),
}

impl PooledPg {
    pub(crate) fn new(conn: PgConnection) -> Self {
        Self {
            conn,
            in_transaction: false,
        }
    }

    /// The connection itself: a statement run on it directly is not
    /// pooler-safe (a prepared statement may be split across server
    /// connections, or left on one another client uses next).
    pub fn connection(&mut self) -> &mut PgConnection {
        &mut self.conn
    }

    /// Every row of `query` (the statement `sql`, which has binds unless
    /// `unbound`).
    pub(crate) async fn fetch_all(
        &mut self,
        sql: &str,
        unbound: bool,
        query: Query<'_, Postgres, PgArguments>,
    ) -> Result<Vec<PgRow>, sqlx::Error> {
        match self.run(sql, unbound, query, Wanted::Rows).await? {
            Answer::Rows(rows) => Ok(rows),
            Answer::Count(_) => Ok(Vec::new()),
        }
    }

    /// The rows `query` changed (as [`fetch_all`](Self::fetch_all)).
    pub(crate) async fn execute(
        &mut self,
        sql: &str,
        unbound: bool,
        query: Query<'_, Postgres, PgArguments>,
    ) -> Result<u64, sqlx::Error> {
        match self.run(sql, unbound, query, Wanted::Count).await? {
            Answer::Count(n) => Ok(n),
            Answer::Rows(_) => Ok(0),
        }
    }

    async fn run(
        &mut self,
        sql: &str,
        unbound: bool,
        query: Query<'_, Postgres, PgArguments>,
        wanted: Wanted,
    ) -> Result<Answer, sqlx::Error> {
        if unbound {
            // One simple-protocol message: one server connection.
            let result = self.simple(sql, &wanted).await;
            match control(sql) {
                Some(Control::Begin) => self.in_transaction = result.is_ok(),
                Some(Control::End) => self.in_transaction = false,
                None => {}
            }
            return result;
        }
        let query = query.persistent(false);
        if self.in_transaction {
            return Self::extended(&mut self.conn, query, &wanted).await;
        }
        sqlx::raw_sql("BEGIN").execute(&mut self.conn).await?;
        match Self::extended(&mut self.conn, query, &wanted).await {
            Ok(answer) => {
                sqlx::raw_sql("COMMIT").execute(&mut self.conn).await?;
                Ok(answer)
            }
            Err(err) => {
                // The statement's own error is the answer; a failing
                // rollback shows up as a broken connection next time.
                let _ = sqlx::raw_sql("ROLLBACK").execute(&mut self.conn).await;
                Err(err)
            }
        }
    }

    async fn simple(&mut self, sql: &str, wanted: &Wanted) -> Result<Answer, sqlx::Error> {
        let raw = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()));
        Ok(match wanted {
            Wanted::Rows => Answer::Rows(raw.fetch_all(&mut self.conn).await?),
            Wanted::Count => {
                let done: PgQueryResult = raw.execute(&mut self.conn).await?;
                Answer::Count(done.rows_affected())
            }
        })
    }

    async fn extended(
        conn: &mut PgConnection,
        query: Query<'_, Postgres, PgArguments>,
        wanted: &Wanted,
    ) -> Result<Answer, sqlx::Error> {
        Ok(match wanted {
            Wanted::Rows => Answer::Rows(conn.fetch_all(query).await?),
            Wanted::Count => Answer::Count(conn.execute(query).await?.rows_affected()),
        })
    }
}

/// Every row of `query` (the statement `sql`, with binds) on a PostgreSQL
/// connection, the pooler-safe way when it goes through one.
pub(crate) async fn pg_fetch_all(
    conn: &mut DbConn,
    sql: &str,
    query: Query<'_, Postgres, PgArguments>,
) -> Result<Vec<PgRow>, sqlx::Error> {
    match conn {
        DbConn::Postgres(c) => c.fetch_all(query).await,
        DbConn::PostgresPooled(p) => p.fetch_all(sql, false, query).await,
        #[allow(unreachable_patterns)] // with only PostgreSQL compiled in
        _ => Err(crate::dialect::wrong_conn("postgres")),
    }
}

/// How many times [`refuse_transaction_pooling`] compares.
const PROBES: usize = 3;

/// Refuses session mode on `config` when its connections go through a
/// pooler in transaction or statement pooling (PostgreSQL; other
/// databases pass). The probes connect without session mode's startup
/// settings (PgBouncer refuses `options` unless told to ignore it).
///
/// Two client connections A and B each read their server session's pid
/// (`pg_backend_pid()`, simple protocol), [`PROBES`] times in turn. Either
/// sign proves pooling per transaction: A and B answer the same pid (two
/// live client connections on one server session), or A's pid changes
/// (one client connection moved between server sessions). Neither can
/// happen directly on PostgreSQL or through session pooling, so those
/// always pass. PgBouncer hands the most recently used idle server
/// connection out first, so on a pooler that is not busy the first probe
/// already shows it; a pooler so busy that A and B get other, steady
/// server connections every time could go unnoticed (hence the
/// documentation's "never point session mode at a transaction-pooling
/// port").
///
/// # Errors
///
/// [`ErrorKind::Unsupported`] naming the modes to use instead;
/// [`ErrorKind::Unavailable`] when the database cannot be reached,
/// [`ErrorKind::Timeout`] when the probes take longer than `budget`.
///
/// # Cancel safety
///
/// Safe: dropping it closes the two probe connections.
pub(crate) async fn refuse_transaction_pooling(
    config: &SqlConfig,
    budget: std::time::Duration,
) -> Result<(), LockError> {
    if config.dialect != SqlDialect::Postgres {
        return Ok(());
    }
    #[allow(irrefutable_let_patterns)] // with only PostgreSQL compiled in
    let DbOptions::Postgres(pg) = crate::dialect::of(config.dialect)?.connect_options(config)?
    else {
        return Ok(());
    };
    tokio::time::timeout(budget, probe_pids(&pg))
        .await
        .unwrap_or_else(|_| {
            Err(LockError::new(
                ErrorKind::Timeout,
                Operation::Connect,
                "the check for a transaction pooler did not finish within twice the operation \
                 timeout",
            ))
        })
}

async fn probe_pids(pg: &sqlx::postgres::PgConnectOptions) -> Result<(), LockError> {
    let probe = DbOptions::Postgres(pg.clone());
    let unavailable = |e: sqlx::Error| {
        LockError::new(
            ErrorKind::Unavailable,
            Operation::Connect,
            "could not open the connections that check for a transaction pooler",
        )
        .with_source(e)
    };
    let mut a = probe.connect().await.map_err(unavailable)?;
    let mut b = probe.connect().await.map_err(unavailable)?;
    let mut first_a = None;
    for _ in 0..PROBES {
        let pid_a = backend_pid(&mut a).await.map_err(unavailable)?;
        let pid_b = backend_pid(&mut b).await.map_err(unavailable)?;
        let moved = first_a.is_some_and(|first| first != pid_a);
        first_a.get_or_insert(pid_a);
        if pid_a == pid_b || moved {
            a.close().await;
            b.close().await;
            return Err(transaction_pooling_refused());
        }
    }
    a.close().await;
    b.close().await;
    Ok(())
}

/// The refusal [`refuse_transaction_pooling`] answers.
pub(crate) fn transaction_pooling_refused() -> LockError {
    LockError::new(
        ErrorKind::Unsupported,
        Operation::Connect,
        "session mode (mode=session) needs a server session of its own, and these connections \
         share server sessions: a pooler in transaction or statement pooling (PgBouncer) sits \
         in front of PostgreSQL. Its advisory locks would be held on a session other clients' \
         statements run on, and its unlock and keep-alive could land on another session. Use \
         row mode instead (leave out mode=session and add pooler=transaction) or \
         transaction-scoped locks, or point session mode at PostgreSQL itself or at a \
         session-pooling port",
    )
}

/// The server session's pid, through the simple protocol (one message:
/// never split by a pooler, no prepared statement left behind).
async fn backend_pid(conn: &mut DbConn) -> Result<i32, sqlx::Error> {
    use sqlx::Row;
    let row = match conn {
        DbConn::Postgres(c) => {
            sqlx::raw_sql("SELECT pg_backend_pid()")
                .fetch_one(&mut *c)
                .await?
        }
        DbConn::PostgresPooled(p) => {
            sqlx::raw_sql("SELECT pg_backend_pid()")
                .fetch_one(&mut p.conn)
                .await?
        }
        #[allow(unreachable_patterns)] // with only PostgreSQL compiled in
        _ => return Err(crate::dialect::wrong_conn("postgres")),
    };
    row.try_get(0)
}
