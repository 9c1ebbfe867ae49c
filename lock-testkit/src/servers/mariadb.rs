//! MariaDB on loopback (or on a lab host), with a database and a password
//! user created over the server's Unix socket.

use std::process::Command;

use super::{Kind, LoopbackServer};
use crate::netns::{Lab, Placement};
use crate::process::{
    HarnessError, ServerProcess, ServerSpec, find_binary, free_port, run_setup, temp_dir,
};

/// The Debian package that provides MariaDB.
pub const PACKAGE: &str = "mariadb-server";

/// The database created for tests.
pub const DATABASE: &str = "distlock";
/// The user created for tests.
pub const USER: &str = "distlock";
/// Its password (a test server on loopback only).
pub const PASSWORD: &str = "distlock-test-pw";

/// One MariaDB server on a free loopback port, binary log off (data in
/// `data/` of its [`dir`](LoopbackServer::dir)).
pub type MariaDbServer = LoopbackServer<MariaDb>;

/// The [`Kind`] of a [`MariaDbServer`].
#[derive(Debug)]
pub struct MariaDb;

impl Kind for MariaDb {}

impl MariaDbServer {
    /// Initializes a data directory, starts the server and creates
    /// [`DATABASE`] and [`USER`].
    ///
    /// # Errors
    ///
    /// Missing binaries, a failing setup, or a server that does not start.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_at(Placement::loopback()).await
    }

    /// As [`start`](Self::start), in the namespace of `lab`'s host named
    /// `host`, listening on its address (what [`url`](Self::url) names),
    /// with [`USER`] allowed from every loopback-range address (the lab's
    /// other hosts). The setup still goes over the Unix socket, which no
    /// network namespace hides.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); a lab without another host to reach it
    /// from.
    pub async fn start_in(lab: &Lab, host: &str) -> Result<Self, HarnessError> {
        Self::start_at(Placement::on(lab, host)?).await
    }

    async fn start_at(place: Placement) -> Result<Self, HarnessError> {
        let mariadbd = find_binary("mariadbd", PACKAGE)?;
        let install = find_binary("mariadb-install-db", PACKAGE)?;
        let client = find_binary("mariadb", "mariadb-client")?;
        let dir = temp_dir("mariadb-")?;
        let data = dir.path().join("data");
        install_db(&install, &data)?;
        let port = free_port()?;
        let socket = dir.path().join("mysqld.sock");
        let mut spec = ServerSpec::new(
            format!("mariadbd {}:{port}", place.addr()),
            mariadbd,
            dir.path().join("mariadb.log"),
        )
        .args([
            "--no-defaults".to_owned(),
            "--user=root".to_owned(),
            format!("--datadir={}", data.display()),
            format!("--port={port}"),
            format!("--bind-address={}", place.addr()),
            format!("--socket={}", socket.display()),
            format!("--pid-file={}", dir.path().join("mysqld.pid").display()),
            format!("--log-error={}", dir.path().join("error.log").display()),
            "--skip-log-bin".to_owned(),
            "--max-connections=500".to_owned(),
        ])
        .args(super::fast_only(&["--innodb-flush-log-at-trx-commit=2"]))
        .ready(place.ready(port));
        // A lab host has no name service to ask who 127.0.1.N is.
        if place.is_in_lab() {
            spec = spec.args(["--skip-name-resolve"]);
        }
        spec.netns = place.netns();
        // The lab's clients come from the other loopback-range addresses.
        let client_host = if place.is_in_lab() {
            "127.0.0.0/255.0.0.0"
        } else {
            "127.0.0.1"
        };
        let process = ServerProcess::start(spec).await?;
        let server = Self::new(process, port, place, dir);
        let sql = format!(
            "CREATE DATABASE IF NOT EXISTS {DATABASE}; \
             CREATE USER IF NOT EXISTS '{USER}'@'{client_host}' IDENTIFIED BY '{PASSWORD}'; \
             CREATE USER IF NOT EXISTS '{USER}'@'localhost' IDENTIFIED BY '{PASSWORD}'; \
             GRANT ALL ON {DATABASE}.* TO '{USER}'@'{client_host}'; \
             GRANT ALL ON {DATABASE}.* TO '{USER}'@'localhost'; \
             FLUSH PRIVILEGES;"
        );
        let mut last = None;
        // The port opens slightly before the socket accepts root.
        for _ in 0..100 {
            let mut setup = Command::new(&client);
            setup
                .arg("--no-defaults")
                .arg(format!("--socket={}", socket.display()))
                .args(["-uroot", "-e", &sql]);
            match run_setup(setup, None, "creating the test database and user") {
                Ok(()) => return Ok(server),
                Err(err) => last = Some(err),
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Err(last.unwrap_or_else(|| HarnessError::Io(std::io::Error::other("setup failed"))))
    }

    /// Kills the server (SIGKILL, a crash) and starts it again on the same
    /// port and data directory.
    ///
    /// # Errors
    ///
    /// When it does not come back.
    pub async fn restart(&mut self) -> Result<(), HarnessError> {
        self.process.restart().await
    }

    /// `mysql://distlock:<password>@<address>:<port>/distlock` (127.0.0.1,
    /// or its lab host's address).
    pub fn url(&self) -> String {
        format!(
            "mysql://{USER}:{PASSWORD}@{}:{}/{DATABASE}",
            self.addr(),
            self.port
        )
    }
}

/// Runs `mariadb-install-db` into `data`, once more in a clean directory if
/// it fails (it failed once in a CI run on 2026-12-05, saying only that
/// the system tables could not be installed); a second failure carries the
/// bootstrap's own log from the data directory.
fn install_db(install: &std::path::Path, data: &std::path::Path) -> Result<(), HarnessError> {
    let run = || {
        let mut init = Command::new(install);
        init.args([
            "--no-defaults",
            "--user=root",
            "--auth-root-authentication-method=socket",
            "--skip-test-db",
        ])
        .arg(format!("--datadir={}", data.display()));
        run_setup(init, None, "mariadb-install-db")
    };
    if run().is_ok() {
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(data);
    run().map_err(|err| match err {
        HarnessError::Setup { what, mut output } => {
            for entry in std::fs::read_dir(data).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "err" || e == "log")
                    && let Ok(text) = std::fs::read_to_string(&path)
                {
                    output.push_str(&format!("\n--- {}:\n{text}", path.display()));
                }
            }
            HarnessError::Setup { what, output }
        }
        other => other,
    })
}
