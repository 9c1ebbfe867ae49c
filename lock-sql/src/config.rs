//! One configuration struct, built from a URL or with a builder.

use std::fmt;
use std::time::Duration;

use lock_core::endpoint::Endpoint;
use lock_core::{LockError, RetryPolicy};

/// The driver's name, which its errors carry.
pub(crate) const NAME: &str = "sql";

/// The shortest TTL accepted in row mode: the database clocks have
/// microsecond precision, but a lease must outlive the clock-drift
/// allowance and a round trip to be of any use.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The shortest TTL of session mode on PostgreSQL
/// (`idle_session_timeout` has millisecond precision).
pub const PG_SESSION_MIN_TTL: Duration = Duration::from_millis(10);

/// The shortest TTL of session mode on MySQL/MariaDB (`wait_timeout`
/// counts whole seconds).
pub const MYSQL_SESSION_MIN_TTL: Duration = Duration::from_secs(1);

/// The SQL dialect a [`SqlConfig`] talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SqlDialect {
    /// PostgreSQL (`postgres://`, `postgresql://`).
    Postgres,
    /// MySQL or MariaDB (`mysql://`, `mariadb://`).
    MySql,
    /// SQLite (`sqlite://path`, `sqlite::memory:`).
    Sqlite,
}

impl SqlDialect {
    /// A short, stable name (`"postgres"`, `"mysql"`, `"sqlite"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::MySql => "mysql",
            Self::Sqlite => "sqlite",
        }
    }
}

impl fmt::Display for SqlDialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How locks are held: rows of a lease table, or server-session locks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SqlMode {
    /// A unique-row lease table ([`SqlBackend`](crate::SqlBackend)), the default.
    #[default]
    Row,
    /// Server-session locks: PostgreSQL advisory locks, MySQL/MariaDB
    /// `GET_LOCK` ([`SqlSessionBackend`](crate::SqlSessionBackend)).
    Session,
}

impl SqlMode {
    /// `"row"` or `"session"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Row => "row",
            Self::Session => "session",
        }
    }
}

/// Which table layout row mode uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SqlLayout {
    /// Our lease table (`name, owner, token, expires_at`), the default.
    #[default]
    Lease,
    /// ShedLock's table (`name, lock_until, locked_at, locked_by`), so that
    /// ShedLock-scheduled jobs and ours exclude each other
    /// ([`SqlShedLockBackend`](crate::SqlShedLockBackend); the crate docs'
    /// "ShedLock layout").
    ShedLock,
}

impl SqlLayout {
    /// `"lease"` or `"shedlock"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lease => "lease",
            Self::ShedLock => "shedlock",
        }
    }
}

/// Session mode on MariaDB: how long a grant is held before its holder
/// row is written, by default (see `SqlConfig::publish_delay`).
pub(crate) const DEFAULT_PUBLISH_DELAY: Duration = Duration::from_millis(10);

/// The longest accepted `publish_delay` (`inspect` of a lock younger than
/// it waits for its row).
pub(crate) const MAX_PUBLISH_DELAY: Duration = Duration::from_secs(1);

/// The default lease table name.
pub const DEFAULT_TABLE: &str = "distlock_leases";

/// The default table name of the ShedLock layout (ShedLock's own default).
pub const SHEDLOCK_TABLE: &str = "shedlock";

/// The longest accepted table name (PostgreSQL's identifier limit minus
/// room for the notification channel's prefix).
pub const MAX_TABLE_LEN: usize = 48;

/// How to reach the database and how to use it.
///
/// Built from a URL with [`SqlConfig::from_url`] or with the builder
/// methods. Recognized query options (removed before the URL is handed to
/// the database driver; every other option is passed through, e.g.
/// `sslmode` or SQLite's `mode=rwc`):
///
/// | option | meaning | default |
/// |---|---|---|
/// | `table` | lease table name (`[A-Za-z_][A-Za-z0-9_]*`, optionally `schema.table`) | `distlock_leases` |
/// | `ttl` | default TTL for users of this config (`30s`, `500ms`, `2m`; a unit is required) | `30s` |
/// | `timeout` | operation timeout of every database call | `5s` |
/// | `pool_size` | maximum pooled connections | 10 (SQLite file: 4, `:memory:`: 1) |
/// | `busy_timeout` | SQLite busy timeout (waiting for another process's write lock) | `5s` |
/// | `recheck` | PostgreSQL waiters' bounded re-check interval besides `NOTIFY` | `1s` |
/// | `publish_delay` | session mode on MariaDB: how long a grant is held before its holder row is written; on PostgreSQL, before a quiet grant is published in `application_name` (`0ms`: right after the grant, still off the caller's path; see the crate docs) | `10ms` |
/// | `create_table` | create the table if missing (`true`/`false`) | `true` |
/// | `mode` | `row` (lease table) or `session` (server-session locks; PostgreSQL and MySQL/MariaDB only) | `row` |
/// | `fair` | FIFO mutex waiting (`true`/`false`; row mode only, see the crate docs' "Fair mode") | `false` |
/// | `layout` | `lease` (our table) or `shedlock` (ShedLock's table, mutex only; see the crate docs' "ShedLock layout") | `lease` |
/// | `pooler` | `transaction`: PostgreSQL is reached through a pooler in transaction pooling (PgBouncer); each statement then runs unnamed inside a transaction of its own (row mode, lease layout only). `none`: no such pooler | `none` |
///
/// With `layout=shedlock` the table defaults to `shedlock` (`table`
/// overrides it).
///
/// On SQLite `mode=ro|rw|rwc|memory` stays SQLite's own option (passed
/// through); `mode=session` is refused there.
/// The `Debug` output never shows a password.
#[derive(Clone)]
pub struct SqlConfig {
    pub(crate) dialect: SqlDialect,
    /// The URL handed to sqlx (our options removed). May hold a password.
    pub(crate) driver_url: String,
    /// The same with the password replaced, for messages.
    pub(crate) redacted_url: String,
    pub(crate) password: Option<String>,
    pub(crate) table: String,
    pub(crate) default_ttl: Duration,
    pub(crate) op_timeout: Duration,
    pub(crate) pool_size: Option<u32>,
    pub(crate) busy_timeout: Duration,
    pub(crate) recheck: Duration,
    /// Session mode on MariaDB: a grant's holder row is written once the
    /// lock has been held this long (see `grants::session`, "Lazy holder
    /// rows").
    pub(crate) publish_delay: Duration,
    pub(crate) create_table: bool,
    pub(crate) poll: RetryPolicy,
    pub(crate) mode: SqlMode,
    pub(crate) fair: bool,
    pub(crate) layout: SqlLayout,
    /// `pooler=transaction`: PostgreSQL through a pooler in transaction
    /// pooling (see `connection::pooler`).
    pub(crate) transaction_pooler: bool,
    /// Whether the table was named (`table=` or [`SqlConfig::table`]).
    table_explicit: bool,
}

impl fmt::Debug for SqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlConfig")
            .field("dialect", &self.dialect)
            .field("url", &self.redacted_url)
            .field("table", &self.table)
            .field("default_ttl", &self.default_ttl)
            .field("op_timeout", &self.op_timeout)
            .field("pool_size", &self.pool_size)
            .field("busy_timeout", &self.busy_timeout)
            .field("recheck", &self.recheck)
            .field("publish_delay", &self.publish_delay)
            .field("create_table", &self.create_table)
            .field("mode", &self.mode)
            .field("fair", &self.fair)
            .field("layout", &self.layout)
            .field("transaction_pooler", &self.transaction_pooler)
            .finish_non_exhaustive()
    }
}

impl SqlConfig {
    /// Parses a URL: `postgres://`, `postgresql://`, `mysql://`,
    /// `mariadb://`, `sqlite://path`, `sqlite::memory:`, with the query
    /// options listed on [`SqlConfig`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for an unknown
    /// scheme, a bad option value or a bad table name. The message never
    /// contains the password.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let endpoint = Endpoint::parse(url).map_err(|_| {
            LockError::config(
                "SQL URL has no scheme (expected postgres://, mysql://, sqlite://...)",
            )
        })?;
        Self::from_endpoint(endpoint)
    }

    /// The config of a parsed URL (what the facade hands the driver; see
    /// [`from_url`](Self::from_url) for the URL's form).
    ///
    /// # Errors
    ///
    /// As [`from_url`](Self::from_url).
    pub fn from_endpoint(mut endpoint: Endpoint) -> Result<Self, LockError> {
        let dialect = match endpoint.scheme() {
            "postgres" | "postgresql" => SqlDialect::Postgres,
            "mysql" | "mariadb" => SqlDialect::MySql,
            "sqlite" => SqlDialect::Sqlite,
            other => {
                return Err(LockError::config(format!(
                    "unknown SQL URL scheme {other:?} (expected postgres, postgresql, mysql, mariadb or sqlite)"
                )));
            }
        };
        // Everything after `scheme:` is handed to sqlx as written.
        let base = endpoint
            .raw_base()
            .split_once(':')
            .map_or("", |(_, base)| base)
            .to_owned();
        // sqlx knows `mysql://` only; MariaDB speaks the same protocol.
        let driver_scheme = dialect.as_str();
        let password = match dialect {
            SqlDialect::Sqlite => None,
            _ => endpoint.password().map(|p| p.expose().to_owned()),
        };
        let mut config = Self::new_raw(dialect, String::new(), password);
        let options = endpoint.options();
        let positive = |option: &str, value: Option<Duration>| match value {
            Some(d) if d.is_zero() => Err(LockError::config(format!(
                "{option} must be a positive duration, like 30s, 500ms or 2m"
            ))),
            other => Ok(other),
        };
        if let Some(table) = options.text("table")? {
            config = config.table(&table)?;
        }
        if let Some(ttl) = positive("ttl", options.duration("ttl")?)? {
            config.default_ttl = ttl;
        }
        if let Some(timeout) = positive("timeout", options.duration("timeout")?)? {
            config = config.op_timeout(timeout)?;
        }
        if let Some(size) = options.number::<u32>("pool_size")? {
            if size == 0 {
                return Err(LockError::config("pool_size must be a positive integer"));
            }
            config.pool_size = Some(size);
        }
        if let Some(timeout) = positive("busy_timeout", options.duration("busy_timeout")?)? {
            config.busy_timeout = timeout;
        }
        if let Some(recheck) = positive("recheck", options.duration("recheck")?)? {
            config.recheck = recheck;
        }
        if let Some(delay) = options.duration("publish_delay")? {
            config = config.publish_delay(delay)?;
        }
        if let Some(create) = options.flag("create_table")? {
            config.create_table = create;
        }
        if let Some(fair) = options.flag("fair")? {
            config.fair = fair;
        }
        if let Some(layout) = options.text("layout")? {
            config = config.layout(parse_layout(&layout)?);
        }
        if let Some(pooler) = options.text("pooler")? {
            config.transaction_pooler = match pooler.as_str() {
                "transaction" => true,
                "none" => false,
                other => {
                    return Err(LockError::config(format!(
                        "pooler must be transaction or none, not {other:?}"
                    )));
                }
            };
        }
        // On SQLite `mode` is SQLite's own option, except for our two values.
        let mut sqlite_mode = None;
        if let Some(mode) = options.text("mode")? {
            match (dialect, mode.as_str()) {
                (SqlDialect::Sqlite, "session") => {
                    return Err(LockError::config(
                        "mode=session needs a database server (PostgreSQL or MySQL/MariaDB): \
                         SQLite has no server session to hold a lock",
                    ));
                }
                // Our default, spelled out: not SQLite's own `mode`.
                (SqlDialect::Sqlite, "row") => {}
                (SqlDialect::Sqlite, _) => sqlite_mode = Some(mode),
                _ => config.mode = parse_mode(&mode)?,
            }
        }
        let mut passthrough = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in endpoint.take_options().into_unread() {
            passthrough.append_pair(&name, &value);
        }
        if dialect == SqlDialect::Sqlite {
            // The embedded default should just work: create the file.
            match sqlite_mode {
                Some(mode) => passthrough.append_pair("mode", &mode),
                None if !is_sqlite_memory(&base) => passthrough.append_pair("mode", "rwc"),
                None => &mut passthrough,
            };
        }
        let passthrough = passthrough.finish();
        let mut driver_url = format!("{driver_scheme}:{base}");
        if !passthrough.is_empty() {
            driver_url.push('?');
            driver_url.push_str(&passthrough);
        }
        config.redacted_url = redact(&driver_url, config.password.as_deref());
        config.driver_url = driver_url;
        config.check_layout()?;
        Ok(config)
    }

    fn new_raw(dialect: SqlDialect, driver_url: String, password: Option<String>) -> Self {
        Self {
            dialect,
            redacted_url: redact(&driver_url, password.as_deref()),
            driver_url,
            password,
            table: DEFAULT_TABLE.to_owned(),
            default_ttl: Duration::from_secs(30),
            op_timeout: Duration::from_secs(5),
            pool_size: None,
            busy_timeout: Duration::from_secs(5),
            recheck: Duration::from_secs(1),
            publish_delay: DEFAULT_PUBLISH_DELAY,
            create_table: true,
            poll: RetryPolicy {
                initial: Duration::from_millis(5),
                max: Duration::from_millis(100),
                multiplier: 2,
                max_attempts: None,
            },
            mode: SqlMode::Row,
            fair: false,
            layout: SqlLayout::Lease,
            transaction_pooler: false,
            table_explicit: false,
        }
    }

    /// Session mode has no table: refuses it with the ShedLock layout.
    pub(crate) fn check_layout(&self) -> Result<(), LockError> {
        if self.layout == SqlLayout::ShedLock && self.mode == SqlMode::Session {
            return Err(LockError::config(
                "layout=shedlock is a row-mode table layout: it cannot be combined with \
                 mode=session (ShedLock locks are rows of its table, not server sessions)",
            ));
        }
        if self.transaction_pooler {
            let refused = if self.dialect != SqlDialect::Postgres {
                Some("pooler=transaction is for PostgreSQL (PgBouncer and the like)")
            } else if self.mode == SqlMode::Session {
                Some(
                    "pooler=transaction cannot be combined with mode=session: session mode holds \
                     its locks on a server session, which a transaction pooler shares between \
                     clients; use row mode (leave out mode=session) or transaction-scoped locks, \
                     or point session mode at PostgreSQL itself or at a session-pooling port",
                )
            } else if self.layout == SqlLayout::ShedLock {
                Some(
                    "pooler=transaction is supported by the lease layout only, not layout=shedlock",
                )
            } else {
                None
            };
            if let Some(refused) = refused {
                return Err(LockError::config(refused));
            }
        }
        Ok(())
    }

    /// Says that PostgreSQL is reached through a pooler in transaction
    /// pooling, such as PgBouncer with `pool_mode = transaction` (the
    /// URL's `pooler=transaction`): each statement with parameters then
    /// runs unnamed inside a transaction of its own (`BEGIN`, the
    /// statement's two exchanges, `COMMIT`: four round trips where a
    /// direct connection needs one), so that no prepared statement is
    /// left on, or looked for on, a server connection another client
    /// uses next. Waiters poll (every `recheck` at most) instead of
    /// listening: `LISTEN` does not survive transaction pooling. For
    /// PostgreSQL in row mode with the lease layout (a URL that combines
    /// it with anything else is refused; session mode refuses a pooler it
    /// detects at connect).
    #[must_use]
    pub fn transaction_pooler(mut self, through_pooler: bool) -> Self {
        self.transaction_pooler = through_pooler;
        self
    }

    /// Uses `table` as the lease table (validated: letters, digits and `_`,
    /// not starting with a digit, optionally one `schema.` prefix, at most
    /// [`MAX_TABLE_LEN`] bytes). It is quoted, never spliced unvalidated.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for an invalid name.
    pub fn table(mut self, table: &str) -> Result<Self, LockError> {
        validate_table(table)?;
        self.table = table.to_owned();
        self.table_explicit = true;
        Ok(self)
    }

    /// Sets the operation timeout of every database call (also the pool's
    /// connection-acquire timeout).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for a zero timeout.
    pub fn op_timeout(mut self, timeout: Duration) -> Result<Self, LockError> {
        if timeout.is_zero() {
            return Err(LockError::config("the operation timeout must be positive"));
        }
        self.op_timeout = timeout;
        Ok(self)
    }

    /// Sets the default TTL suggested to users of this configuration.
    #[must_use]
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// Sets the maximum number of pooled connections.
    #[must_use]
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = Some(size.max(1));
        self
    }

    /// Sets SQLite's busy timeout (how long a write waits for another
    /// connection's or process's write lock).
    #[must_use]
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Sets how long a session-mode grant on MariaDB is held before its
    /// holder row (what `inspect`, `list` and `force_release` read) is
    /// written, off the caller's path; a lock released sooner never writes
    /// one.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) above 1 s
    /// (`inspect` of a lock younger than the delay waits for its row).
    pub fn publish_delay(mut self, delay: Duration) -> Result<Self, LockError> {
        if delay > MAX_PUBLISH_DELAY {
            return Err(LockError::config(format!(
                "publish_delay must be at most {MAX_PUBLISH_DELAY:?} (inspect waits for it)"
            )));
        }
        self.publish_delay = delay;
        Ok(self)
    }

    /// Sets PostgreSQL waiters' re-check interval (a waiter re-tries at the
    /// latest after this long even without a notification, and at the
    /// holder's expiry if that comes sooner).
    #[must_use]
    pub fn recheck(mut self, interval: Duration) -> Self {
        self.recheck = interval.max(Duration::from_millis(1));
        self
    }

    /// Whether to create the lease table when it is missing (default true).
    #[must_use]
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// Sets the backoff of polling waiters (MySQL/MariaDB, SQLite).
    #[must_use]
    pub fn poll_policy(mut self, policy: RetryPolicy) -> Self {
        self.poll = policy;
        self
    }

    /// Chooses row or session mode (see [`SqlMode`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for
    /// [`SqlMode::Session`] on SQLite.
    pub fn mode(mut self, mode: SqlMode) -> Result<Self, LockError> {
        if mode == SqlMode::Session && self.dialect == SqlDialect::Sqlite {
            return Err(LockError::config(
                "mode=session needs a database server (PostgreSQL or MySQL/MariaDB)",
            ));
        }
        self.mode = mode;
        Ok(self)
    }

    /// Turns FIFO waiting for the mutex on or off (the URL's `fair=true`;
    /// row mode only: a session-mode backend refuses it at connect with
    /// [`ErrorKind::Unsupported`](lock_core::ErrorKind::Unsupported)).
    #[must_use]
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Chooses the table layout (the URL's `layout=lease|shedlock`). With
    /// [`SqlLayout::ShedLock`] the table defaults to [`SHEDLOCK_TABLE`]
    /// unless a table was named (before or after this call).
    #[must_use]
    pub fn layout(mut self, layout: SqlLayout) -> Self {
        self.layout = layout;
        if !self.table_explicit {
            self.table = match layout {
                SqlLayout::ShedLock => SHEDLOCK_TABLE,
                SqlLayout::Lease => DEFAULT_TABLE,
            }
            .to_owned();
        }
        self
    }

    /// The table layout.
    pub fn table_layout(&self) -> SqlLayout {
        self.layout
    }

    /// Whether mutex waiters queue in arrival order (`fair=true`).
    pub fn is_fair(&self) -> bool {
        self.fair
    }

    /// Row or session mode.
    pub fn lock_mode(&self) -> SqlMode {
        self.mode
    }

    /// The dialect.
    pub fn dialect(&self) -> SqlDialect {
        self.dialect
    }

    /// The lease table name.
    pub fn table_name(&self) -> &str {
        &self.table
    }

    /// The default TTL for users of this configuration.
    pub fn ttl(&self) -> Duration {
        self.default_ttl
    }

    /// The operation timeout.
    pub fn timeout(&self) -> Duration {
        self.op_timeout
    }

    /// Whether connecting creates the tables when missing
    /// (`create_table`, on by default).
    pub fn creates_table(&self) -> bool {
        self.create_table
    }

    /// The connection URL with any password replaced by `***`.
    pub fn redacted_url(&self) -> &str {
        &self.redacted_url
    }

    /// The connection URL as handed to sqlx (may contain a password).
    pub(crate) fn driver_url(&self) -> &str {
        &self.driver_url
    }

    pub(crate) fn is_memory(&self) -> bool {
        self.dialect == SqlDialect::Sqlite
            && (self.driver_url.starts_with("sqlite::memory:")
                || self.driver_url.contains("mode=memory")
                || self.driver_url.starts_with("sqlite://:memory:"))
    }

    /// Removes the password from a message that might echo it.
    pub(crate) fn scrub(&self, text: &str) -> String {
        match &self.password {
            Some(pw) if !pw.is_empty() => text.replace(pw.as_str(), "***"),
            _ => text.to_owned(),
        }
    }
}

fn is_sqlite_memory(base: &str) -> bool {
    base == ":memory:" || base == "//:memory:" || base.is_empty() || base == "//"
}

fn redact(url: &str, password: Option<&str>) -> String {
    let out = lock_core::redact_url(url);
    // A password that also appears elsewhere (percent-encoded forms aside).
    match password {
        Some(pw) if !pw.is_empty() => out.replace(pw, "***"),
        _ => out,
    }
}

/// Validates a table name: `[A-Za-z_][A-Za-z0-9_]*`, optionally
/// `schema.table`, at most [`MAX_TABLE_LEN`] bytes.
pub(crate) fn validate_table(table: &str) -> Result<(), LockError> {
    let ident_ok = |part: &str| {
        let mut chars = part.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let parts: Vec<&str> = table.split('.').collect();
    if table.len() > MAX_TABLE_LEN || parts.len() > 2 || !parts.iter().all(|p| ident_ok(p)) {
        return Err(LockError::config(format!(
            "invalid table name {table:?}: use letters, digits and '_' (not starting with a digit), \
             optionally one 'schema.' prefix, at most {MAX_TABLE_LEN} bytes"
        )));
    }
    Ok(())
}

fn parse_layout(value: &str) -> Result<SqlLayout, LockError> {
    match value {
        "lease" => Ok(SqlLayout::Lease),
        "shedlock" => Ok(SqlLayout::ShedLock),
        other => Err(LockError::config(format!(
            "layout must be lease or shedlock, got {other:?}"
        ))),
    }
}

fn parse_mode(value: &str) -> Result<SqlMode, LockError> {
    match value {
        "row" => Ok(SqlMode::Row),
        "session" => Ok(SqlMode::Session),
        other => Err(LockError::config(format!(
            "mode must be row or session, got {other:?}"
        ))),
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
    use lock_core::ErrorKind;

    #[test]
    fn parses_every_scheme() {
        for (url, dialect) in [
            ("postgres://u@h/db", SqlDialect::Postgres),
            ("postgresql://u@h/db", SqlDialect::Postgres),
            ("mysql://u@h/db", SqlDialect::MySql),
            ("mariadb://u@h/db", SqlDialect::MySql),
            ("sqlite://locks.db", SqlDialect::Sqlite),
            ("sqlite::memory:", SqlDialect::Sqlite),
        ] {
            assert_eq!(
                SqlConfig::from_url(url).unwrap().dialect(),
                dialect,
                "{url}"
            );
        }
        let maria = SqlConfig::from_url("mariadb://u@h:3306/db").unwrap();
        assert_eq!(maria.driver_url(), "mysql://u@h:3306/db");
        assert!(SqlConfig::from_url("sqlite::memory:").unwrap().is_memory());
    }

    #[test]
    fn options_are_taken_out_and_the_rest_passed_through() {
        let config = SqlConfig::from_url(
            "postgres://u:pw@h/db?table=app.locks&ttl=2s&timeout=750ms&sslmode=disable&pool_size=3&recheck=200ms&create_table=false",
        )
        .unwrap();
        assert_eq!(config.table_name(), "app.locks");
        assert_eq!(config.ttl(), Duration::from_secs(2));
        assert_eq!(config.timeout(), Duration::from_millis(750));
        assert_eq!(config.pool_size, Some(3));
        assert_eq!(config.recheck, Duration::from_millis(200));
        assert!(!config.create_table);
        assert_eq!(config.driver_url(), "postgres://u:pw@h/db?sslmode=disable");
    }

    #[test]
    fn sqlite_files_are_created_by_default() {
        let config = SqlConfig::from_url("sqlite:///tmp/x.db").unwrap();
        assert_eq!(config.driver_url(), "sqlite:///tmp/x.db?mode=rwc");
        let config = SqlConfig::from_url("sqlite://x.db?mode=rw").unwrap();
        assert_eq!(config.driver_url(), "sqlite://x.db?mode=rw");
    }

    #[test]
    fn passwords_never_show() {
        let url = "mysql://app:s3cr%40t-pw@db.example:3306/locks?table=t";
        let config = SqlConfig::from_url(url).unwrap();
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cr"), "{debug}");
        assert!(debug.contains("app:***@db.example"), "{debug}");
        assert_eq!(config.scrub("oops s3cr@t-pw leaked"), "oops *** leaked");
        let err = SqlConfig::from_url("mysql://app:s3cr3t@h/db?ttl=bogus").unwrap_err();
        assert!(!err.to_string().contains("s3cr3t"));
    }

    #[test]
    fn bad_input_is_a_config_error() {
        for url in [
            "",
            "redis://h",
            "nothing",
            "postgres://h/db?table=bad-name",
            "postgres://h/db?table=1abc",
            "postgres://h/db?table=a.b.c",
            "postgres://h/db?table=x%3B%20drop%20table%20y",
            "postgres://h/db?ttl=0",
            "postgres://h/db?ttl=-1s",
            "postgres://h/db?timeout=abc",
            "postgres://h/db?pool_size=0",
            "postgres://h/db?create_table=maybe",
            "postgres://h/db?create_table=",
            "postgres://h/db?ttl=1s&ttl=2s",
        ] {
            let err = SqlConfig::from_url(url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{url}");
        }
        let long = "t".repeat(MAX_TABLE_LEN + 1);
        assert!(SqlConfig::from_url(&format!("sqlite::memory:?table={long}")).is_err());
    }

    #[test]
    fn mode_option() {
        let row = SqlConfig::from_url("postgres://u@h/db").unwrap();
        assert_eq!(row.lock_mode(), SqlMode::Row);
        let session = SqlConfig::from_url("mariadb://u@h/db?mode=session&ttl=2s").unwrap();
        assert_eq!(session.lock_mode(), SqlMode::Session);
        assert_eq!(session.driver_url(), "mysql://u@h/db");
        let err = SqlConfig::from_url("postgres://u@h/db?mode=rows").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.message().contains("mode"), "{err}");
        let err = SqlConfig::from_url("sqlite:///tmp/x.db?mode=session").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.message().contains("mode=session"), "{err}");
        // SQLite's own `mode` still passes through; `mode=row` is ours.
        let ro = SqlConfig::from_url("sqlite://x.db?mode=ro").unwrap();
        assert_eq!(ro.driver_url(), "sqlite://x.db?mode=ro");
        let row = SqlConfig::from_url("sqlite://x.db?mode=row").unwrap();
        assert_eq!(row.driver_url(), "sqlite://x.db?mode=rwc");
        let sqlite = SqlConfig::from_url("sqlite::memory:").unwrap();
        assert!(sqlite.mode(SqlMode::Session).is_err());
    }

    #[test]
    fn layout_option() {
        let shed = SqlConfig::from_url("postgres://u@h/db?layout=shedlock").unwrap();
        assert_eq!(shed.table_layout(), SqlLayout::ShedLock);
        assert_eq!(shed.table_name(), SHEDLOCK_TABLE);
        assert_eq!(shed.driver_url(), "postgres://u@h/db");
        let named =
            SqlConfig::from_url("mysql://u@h/db?table=app.jobs_lock&layout=shedlock").unwrap();
        assert_eq!(named.table_name(), "app.jobs_lock");
        let lease = SqlConfig::from_url("sqlite://x.db?layout=lease").unwrap();
        assert_eq!(lease.table_layout(), SqlLayout::Lease);
        assert_eq!(lease.table_name(), DEFAULT_TABLE);
        // The builder: the default table follows the layout, a named one stays.
        let built = SqlConfig::from_url("sqlite://x.db")
            .unwrap()
            .layout(SqlLayout::ShedLock);
        assert_eq!(built.table_name(), SHEDLOCK_TABLE);
        let built = SqlConfig::from_url("sqlite://x.db")
            .unwrap()
            .table("jobs")
            .unwrap()
            .layout(SqlLayout::ShedLock);
        assert_eq!(built.table_name(), "jobs");
        for url in [
            "postgres://u@h/db?layout=shed",
            "postgres://u@h/db?layout=",
            "postgres://u@h/db?layout=shedlock&mode=session",
        ] {
            let err = SqlConfig::from_url(url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{url}");
            assert!(err.message().contains("layout"), "{url}: {err}");
        }
    }

    #[test]
    fn pooler_option() {
        let config = SqlConfig::from_url("postgres://u@h/db?pooler=transaction").unwrap();
        assert!(config.transaction_pooler);
        assert!(!config.driver_url().contains("pooler"), "ours, not sqlx's");
        let config = SqlConfig::from_url("postgres://u@h/db?pooler=none").unwrap();
        assert!(!config.transaction_pooler);
        for (url, says) in [
            ("postgres://u@h/db?pooler=session", "transaction or none"),
            (
                "postgres://u@h/db?pooler=transaction&mode=session",
                "row mode",
            ),
            (
                "postgres://u@h/db?pooler=transaction&layout=shedlock",
                "lease layout",
            ),
            ("mysql://u@h/db?pooler=transaction", "PostgreSQL"),
        ] {
            let err = SqlConfig::from_url(url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{url}");
            assert!(err.message().contains(says), "{url}: {err}");
        }
    }
}
