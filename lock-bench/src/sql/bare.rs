//! The floors' own connection: one bare sqlx connection of the configured
//! database, opened from the driver's URL options (the driver's connection
//! type, never one of its connections), and the few helpers the floors'
//! hand-written statements need. Nothing here is shared with the driver's
//! statement code.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conformance::floor::FloorGrant;
use lock_core::{ErrorKind, LockError, LockKey, Operation, OwnerId, check_ttl, with_timeout};
use lock_sql::keys::{DbConn, DbOptions};
use lock_sql::sqlx::{self, AssertSqlSafe};
use lock_sql::{MIN_TTL, SqlConfig, SqlDialect};

use super::NAME;

/// The same body for every connection type (each arm is typed by its own
/// connection): for statements that bind the same values on every
/// database.
macro_rules! on_conn {
    ($conn:expr, |$c:ident| $body:expr) => {
        match $conn {
            lock_sql::keys::DbConn::Postgres($c) => $body,
            lock_sql::keys::DbConn::PostgresPooled(pooled) => {
                let $c = pooled.connection();
                $body
            }
            lock_sql::keys::DbConn::MySql($c) => $body,
            lock_sql::keys::DbConn::Sqlite($c) => $body,
        }
    };
}
pub(super) use on_conn;

/// The floors run on direct connections: a URL with `pooler=transaction`
/// (lock-sql's pooler-safe statements) has no bare floor here.
pub(super) fn pooled() -> sqlx::Error {
    sqlx::Error::Protocol(
        "the bare floors run on direct connections (no pooler=transaction)".into(),
    )
}

/// One bare connection, never pooled, never shared with the driver.
pub(super) type Bare = DbConn;

/// SQL text the floor built once (the table name spliced in, quoted).
pub(super) type Text = Arc<str>;

/// `text` as sqlx takes it, without copying it.
pub(super) fn sql(text: &Text) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(text))
}

/// A TTL in microseconds, as every statement binds it.
pub(super) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// SQLite's clock: the host's, in microseconds since the Unix epoch.
pub(super) fn unix_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, micros)
}

/// Quotes each part of a validated (schema-qualified) name.
pub(super) fn quoted(dialect: SqlDialect, name: &str) -> String {
    let quote = if dialect == SqlDialect::MySql {
        '`'
    } else {
        '"'
    };
    name.split('.')
        .map(|part| format!("{quote}{part}{quote}"))
        .collect::<Vec<_>>()
        .join(".")
}

/// The driver's token floor table (`<table>_floor`): a first grant of a
/// key starts above it.
pub(super) fn token_floor(dialect: SqlDialect, table: &str) -> (String, Text) {
    let f = quoted(dialect, &format!("{table}_floor"));
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {f} (id INTEGER NOT NULL PRIMARY KEY, token BIGINT NOT NULL)"
    );
    (
        format!("(SELECT COALESCE(MAX(token), 0) + 1 FROM {f})"),
        create.into(),
    )
}

/// `map_sqlx` for the floor: the driver's error kinds.
pub(super) fn failed(
    config: &SqlConfig,
    operation: Operation,
) -> impl Fn(sqlx::Error) -> LockError {
    move |e| lock_sql::keys::map_error(config, operation, e)
}

/// What a floor's errors are labelled with and the shortest TTL it takes:
/// the driver's row mode ([`ROW`]) or its session mode.
#[derive(Clone, Copy, Debug)]
pub(super) struct Label {
    pub(super) name: &'static str,
    pub(super) min_ttl: Duration,
}

/// The row floors' label: the driver's.
pub(super) const ROW: Label = Label {
    name: NAME,
    min_ttl: MIN_TTL,
};

/// A floor grant's key and owner: the key and TTL checked as the driver
/// checks them, a fresh owner.
pub(super) fn grant_args(
    label: Label,
    key: &str,
    ttl: Duration,
) -> Result<(LockKey, String), LockError> {
    let key = LockKey::new(key)?;
    check_ttl(ttl, label.min_ttl, Operation::TryAcquire)
        .map_err(|e| e.with_key(&key).with_backend(label.name))?;
    Ok((key, OwnerId::random().to_hex()))
}

/// A floor release's key and token (a SQL token fits in a `BIGINT`).
pub(super) fn release_args(grant: &FloorGrant) -> Result<(LockKey, i64), LockError> {
    let key = LockKey::new(&grant.key)?;
    let token = i64::try_from(grant.token).map_err(|_| {
        LockError::new(
            ErrorKind::InvalidArgument,
            Operation::Release,
            "a SQL token fits in a BIGINT",
        )
        .with_key(&key)
        .with_backend(NAME)
    })?;
    Ok((key, token))
}

/// A floor's statements `run` for `operation` on `key`, within the
/// operation timeout, failing with the driver's error kinds.
pub(super) async fn timed<T>(
    config: &SqlConfig,
    label: Label,
    operation: Operation,
    key: &LockKey,
    run: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, LockError> {
    with_timeout(config.timeout(), operation, async {
        run.await.map_err(failed(config, operation))
    })
    .await
    .map_err(|e| e.with_key(key).with_backend(label.name))
}

/// What a floor's try_grant answers for the grant's `token`.
pub(super) fn granted(key: &LockKey, owner: String, token: Option<i64>) -> Option<FloorGrant> {
    token.map(|token| FloorGrant {
        key: key.as_str().to_owned(),
        owner,
        token: u64::try_from(token).unwrap_or(0),
        handle: String::new(),
    })
}

/// The floors' own calls on the driver's connection type.
pub(super) trait BareExt: Sized {
    /// Opens one connection with the driver's connect options (parsed from
    /// the URL: the driver's own, SQLite's busy timeout and WAL included;
    /// only the sqlx options are taken, never the driver's connections),
    /// then runs `setup` (table creation) on it when the URL asks for it.
    async fn open(config: &SqlConfig, setup: &[Text]) -> Result<Self, LockError>;

    /// [`open`](Self::open) on `options` (the URL's, with settings a floor
    /// added to them).
    async fn open_with(
        config: &SqlConfig,
        options: DbOptions,
        setup: &[Text],
    ) -> Result<Self, LockError>;

    /// Runs `text` with no binds (setup, `BEGIN`, `COMMIT`, `ROLLBACK`).
    async fn run(&mut self, text: &Text) -> Result<(), sqlx::Error>;
}

impl BareExt for Bare {
    async fn open(config: &SqlConfig, setup: &[Text]) -> Result<Self, LockError> {
        let options = lock_sql::keys::connect_options(config)?;
        Self::open_with(config, options, setup).await
    }

    async fn open_with(
        config: &SqlConfig,
        options: DbOptions,
        setup: &[Text],
    ) -> Result<Self, LockError> {
        let err = failed(config, Operation::Connect);
        let mut conn = with_timeout(config.timeout(), Operation::Connect, async {
            options.connect().await.map_err(&err)
        })
        .await?;
        if config.creates_table() {
            for create in setup {
                with_timeout(config.timeout(), Operation::Connect, async {
                    conn.run(create).await.map_err(&err)
                })
                .await?;
            }
        }
        Ok(conn)
    }

    async fn run(&mut self, text: &Text) -> Result<(), sqlx::Error> {
        on_conn!(self, |c| sqlx::query(sql(text)).execute(c).await.map(drop))
    }
}
