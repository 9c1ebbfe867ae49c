//! MariaDB on loopback, with a database and a password user created over
//! the server's Unix socket.

use std::process::Command;

use super::{Kind, LoopbackServer};
use crate::process::{
    HarnessError, Ready, ServerProcess, ServerSpec, find_binary, free_port, run_setup, temp_dir,
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
        let mariadbd = find_binary("mariadbd", PACKAGE)?;
        let install = find_binary("mariadb-install-db", PACKAGE)?;
        let client = find_binary("mariadb", "mariadb-client")?;
        let dir = temp_dir("mariadb-")?;
        let data = dir.path().join("data");
        install_db(&install, &data)?;
        let port = free_port()?;
        let socket = dir.path().join("mysqld.sock");
        let spec = ServerSpec::new(
            format!("mariadbd :{port}"),
            mariadbd,
            dir.path().join("mariadb.log"),
        )
        .args([
            "--no-defaults".to_owned(),
            "--user=root".to_owned(),
            format!("--datadir={}", data.display()),
            format!("--port={port}"),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--socket={}", socket.display()),
            format!("--pid-file={}", dir.path().join("mysqld.pid").display()),
            format!("--log-error={}", dir.path().join("error.log").display()),
            "--skip-log-bin".to_owned(),
            "--innodb-flush-log-at-trx-commit=2".to_owned(),
            "--max-connections=500".to_owned(),
        ])
        .ready(Ready::Port(port));
        let process = ServerProcess::start(spec).await?;
        let server = Self::new(process, port, dir);
        let sql = format!(
            "CREATE DATABASE IF NOT EXISTS {DATABASE}; \
             CREATE USER IF NOT EXISTS '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'; \
             CREATE USER IF NOT EXISTS '{USER}'@'localhost' IDENTIFIED BY '{PASSWORD}'; \
             GRANT ALL ON {DATABASE}.* TO '{USER}'@'127.0.0.1'; \
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

    /// `mysql://distlock:<password>@127.0.0.1:<port>/distlock`.
    pub fn url(&self) -> String {
        format!(
            "mysql://{USER}:{PASSWORD}@127.0.0.1:{}/{DATABASE}",
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
