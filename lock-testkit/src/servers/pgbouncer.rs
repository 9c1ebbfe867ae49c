//! PgBouncer (Debian `pgbouncer`) on loopback (or on a lab host,
//! [`PgBouncerServer::start_in`]) in front of a [`PostgresServer`], in one
//! of its three pool modes, run as the `postgres` system user (it refuses
//! to run as root).
//!
//! Its database `postgres` is the server's `postgres` database, reached as
//! the server's user ([`postgres::USER`](super::postgres::USER)) with trust
//! authentication, so [`PgBouncerServer::url`] is the server's URL with the
//! pooler's port: a client changes nothing else to go through it.

use std::fmt::Write as _;

use super::postgres::{PostgresServer, USER};
use super::{Kind, LoopbackServer};
use crate::netns::{Lab, Placement};
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
        Self::start_at(Placement::loopback(), postgres, mode, &[]).await
    }

    /// As [`start`](Self::start), in the namespace of `lab`'s host named
    /// `host`, listening on its address: reach it with [`url`](Self::url)
    /// from the other hosts' namespaces. `postgres` runs on a lab host too
    /// ([`PostgresServer::start_in`]): another one, reached at its address
    /// (a link [`Lab::isolate`] or [`Lab::cut_from`] can cut), or the same
    /// one, reached through its Unix socket (a host cannot reach its own
    /// address).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); a setup error when `postgres` is not in
    /// a lab.
    pub async fn start_in(
        lab: &Lab,
        host: &str,
        postgres: &PostgresServer,
        mode: PoolMode,
    ) -> Result<Self, HarnessError> {
        Self::start_in_with(lab, host, postgres, mode, &[]).await
    }

    /// As [`start_in`](Self::start_in), with `settings` added to (or
    /// replacing those of) the `[pgbouncer]` section: `("tcp_keepidle",
    /// "5")`, `("client_idle_timeout", "30")`...
    ///
    /// # Errors
    ///
    /// As [`start_in`](Self::start_in).
    pub async fn start_in_with(
        lab: &Lab,
        host: &str,
        postgres: &PostgresServer,
        mode: PoolMode,
        settings: &[(&str, &str)],
    ) -> Result<Self, HarnessError> {
        Self::start_at(Placement::on(lab, host)?, postgres, mode, settings).await
    }

    async fn start_at(
        place: Placement,
        postgres: &PostgresServer,
        mode: PoolMode,
        settings: &[(&str, &str)],
    ) -> Result<Self, HarnessError> {
        let binary = find_binary("pgbouncer", PACKAGE)?;
        let user = system_user("postgres").ok_or_else(|| HarnessError::MissingBinary {
            binary: "postgres (system user)".to_owned(),
            package: super::postgres::PACKAGE.to_owned(),
        })?;
        let server_host = if postgres.placement().netns() == place.netns() {
            if place.is_in_lab() {
                // Its own address is out of reach in a lab namespace (lo
                // is down): the server's Unix socket.
                postgres.dir().display().to_string()
            } else {
                postgres.addr().to_string()
            }
        } else if postgres.placement().is_in_lab() && place.is_in_lab() {
            postgres.addr().to_string()
        } else {
            return Err(HarnessError::Setup {
                what: format!("placing pgbouncer at {}", place.addr()),
                output: "the pooler and its PostgreSQL server must both be on loopback or both \
                         in one lab"
                    .into(),
            });
        };
        let dir = temp_dir("pgbouncer-")?;
        std::os::unix::fs::chown(dir.path(), Some(user.0), Some(user.1))?;
        let port = free_port()?;
        let auth = dir.path().join("users.txt");
        std::fs::write(&auth, format!("\"{USER}\" \"\"\n"))?;
        let mut config = String::new();
        let _ = writeln!(config, "[databases]");
        let _ = writeln!(
            config,
            "postgres = host={server_host} port={} dbname=postgres user={USER}",
            postgres.port()
        );
        let _ = writeln!(config, "[pgbouncer]");
        let defaults = [
            ("listen_addr", place.addr().to_string()),
            ("listen_port", port.to_string()),
            ("unix_socket_dir", String::new()),
            ("auth_type", "trust".to_owned()),
            ("auth_file", auth.display().to_string()),
            ("pool_mode", mode.as_str().to_owned()),
            ("default_pool_size", POOL_SIZE.to_string()),
            ("max_client_conn", "1000".to_owned()),
            // sqlx sends extra_float_digits in every startup packet, and
            // lock-sql's session mode `options` (its `-c` settings);
            // PgBouncer 1.18 refuses a client whose startup packet carries
            // a parameter it does not know, unless listed here (it then
            // drops it: see docs/backends/sql.md, "Behind PgBouncer").
            (
                "ignore_startup_parameters",
                "extra_float_digits,options".to_owned(),
            ),
            // The server is on loopback and restarted by some tests: come
            // back quickly.
            ("server_login_retry", "1".to_owned()),
            ("logfile", String::new()),
        ];
        for (name, value) in defaults {
            if !settings.iter().any(|(n, _)| *n == name) {
                let _ = writeln!(config, "{name} = {value}");
            }
        }
        for (name, value) in settings {
            let _ = writeln!(config, "{name} = {value}");
        }
        let config_path = dir.path().join(CONFIG);
        std::fs::write(&config_path, config)?;
        for file in [&auth, &config_path] {
            std::os::unix::fs::chown(file, Some(user.0), Some(user.1))?;
        }
        let mut spec = ServerSpec::new(
            format!("pgbouncer ({}) {}:{port}", mode.as_str(), place.addr()),
            binary,
            dir.path().join("pgbouncer.log"),
        )
        .args([config_path.as_os_str()])
        .ready(place.ready(port));
        spec.netns = place.netns();
        spec.user = Some(user);
        spec.cwd = Some(dir.path().to_path_buf());
        let process = crate::process::ServerProcess::start(spec).await?;
        Ok(Self::new(process, port, place, dir))
    }

    /// `postgres://distlock@<address>:<pooler port>/postgres` (127.0.0.1,
    /// or the lab host's address for a pooler started with
    /// [`start_in`](Self::start_in)): the PostgreSQL server's database
    /// through the pooler.
    pub fn url(&self) -> String {
        format!("postgres://{USER}@{}:{}/postgres", self.addr(), self.port())
    }
}
