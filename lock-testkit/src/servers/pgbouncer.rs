//! PgBouncer (Debian `pgbouncer`) on loopback in front of a
//! [`PostgresServer`], in one of its three pool modes, run as the
//! `postgres` system user (it refuses to run as root).
//!
//! Its database `postgres` is the server's `postgres` database, reached as
//! the server's user ([`postgres::USER`](super::postgres::USER)) with trust
//! authentication, so [`PgBouncerServer::url`] is the server's URL with the
//! pooler's port: a client changes nothing else to go through it.

use std::fmt::Write as _;

use super::postgres::{PostgresServer, USER};
use super::{Kind, LoopbackServer};
use crate::netns::Placement;
use crate::process::{HarnessError, ServerSpec, find_binary, free_port, system_user, temp_dir};

/// The Debian package that provides PgBouncer.
pub const PACKAGE: &str = "pgbouncer";

/// Server connections PgBouncer keeps per database and user
/// (`default_pool_size`): enough for the suite's clients, few enough that
/// transaction pooling really shares them.
pub const POOL_SIZE: u32 = 8;

/// When PgBouncer hands a server connection back to its pool
/// (`pool_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMode {
    /// When the client disconnects: a client keeps one server connection
    /// (and its session state: advisory locks, `LISTEN`, prepared
    /// statements) for its whole life.
    Session,
    /// At the end of each transaction (a statement outside a transaction
    /// is one): successive transactions of one client may run on
    /// different server connections, and one server connection serves
    /// many clients.
    Transaction,
    /// After each statement; transactions of several statements are
    /// refused.
    Statement,
}

impl PoolMode {
    /// The `pool_mode` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Transaction => "transaction",
            Self::Statement => "statement",
        }
    }
}

/// One PgBouncer process on a free loopback port in front of a
/// PostgreSQL server (config, auth file and log `pgbouncer.log` in its
/// [`dir`](LoopbackServer::dir)). Stopped (SIGKILL) when dropped; the
/// PostgreSQL server is not touched.
pub type PgBouncerServer = LoopbackServer<PgBouncer>;

/// The [`Kind`] of a [`PgBouncerServer`].
#[derive(Debug)]
pub struct PgBouncer;

impl Kind for PgBouncer {}

/// The file name of the config in the pooler's directory.
const CONFIG: &str = "pgbouncer.ini";

impl PgBouncerServer {
    /// Starts PgBouncer in `mode` in front of `postgres` (a loopback
    /// server, [`PostgresServer::start`]) and waits until it accepts
    /// connections.
    ///
    /// # Errors
    ///
    /// A missing `pgbouncer` binary or `postgres` user
    /// ([`HarnessError::MissingBinary`]), or a pooler that does not start.
    pub async fn start(postgres: &PostgresServer, mode: PoolMode) -> Result<Self, HarnessError> {
        let binary = find_binary("pgbouncer", PACKAGE)?;
        let user = system_user("postgres").ok_or_else(|| HarnessError::MissingBinary {
            binary: "postgres (system user)".to_owned(),
            package: super::postgres::PACKAGE.to_owned(),
        })?;
        let dir = temp_dir("pgbouncer-")?;
        std::os::unix::fs::chown(dir.path(), Some(user.0), Some(user.1))?;
        let port = free_port()?;
        let auth = dir.path().join("users.txt");
        std::fs::write(&auth, format!("\"{USER}\" \"\"\n"))?;
        let mut config = String::new();
        let _ = writeln!(config, "[databases]");
        let _ = writeln!(
            config,
            "postgres = host={} port={} dbname=postgres user={USER}",
            postgres.addr(),
            postgres.port()
        );
        let _ = writeln!(config, "[pgbouncer]");
        for (name, value) in [
            ("listen_addr", "127.0.0.1".to_owned()),
            ("listen_port", port.to_string()),
            ("unix_socket_dir", String::new()),
            ("auth_type", "trust".to_owned()),
            ("auth_file", auth.display().to_string()),
            ("pool_mode", mode.as_str().to_owned()),
            ("default_pool_size", POOL_SIZE.to_string()),
            ("max_client_conn", "1000".to_owned()),
            // sqlx sends it in every startup packet; PgBouncer refuses a
            // client whose startup packet carries a parameter it does not
            // know (unless listed here).
            ("ignore_startup_parameters", "extra_float_digits".to_owned()),
            // The server is on loopback and restarted by some tests: come
            // back quickly.
            ("server_login_retry", "1".to_owned()),
            ("logfile", String::new()),
        ] {
            let _ = writeln!(config, "{name} = {value}");
        }
        let config_path = dir.path().join(CONFIG);
        std::fs::write(&config_path, config)?;
        for file in [&auth, &config_path] {
            std::os::unix::fs::chown(file, Some(user.0), Some(user.1))?;
        }
        let place = Placement::loopback();
        let mut spec = ServerSpec::new(
            format!("pgbouncer ({}) 127.0.0.1:{port}", mode.as_str()),
            binary,
            dir.path().join("pgbouncer.log"),
        )
        .args([config_path.as_os_str()])
        .ready(place.ready(port));
        spec.user = Some(user);
        spec.cwd = Some(dir.path().to_path_buf());
        let process = crate::process::ServerProcess::start(spec).await?;
        Ok(Self::new(process, port, place, dir))
    }

    /// `postgres://distlock@127.0.0.1:<pooler port>/postgres`: the
    /// PostgreSQL server's database through the pooler.
    pub fn url(&self) -> String {
        format!("postgres://{USER}@{}:{}/postgres", self.addr(), self.port())
    }
}
