//! redis-server on loopback.

use std::path::PathBuf;

use tempfile::TempDir;

use crate::process::{
    HarnessError, Ready, ServerProcess, ServerSpec, find_binary, free_port, temp_dir,
};

/// The Debian package that provides `redis-server`.
pub const PACKAGE: &str = "redis-server";

/// One redis-server, without persistence, on a free loopback port.
#[derive(Debug)]
pub struct RedisServer {
    process: ServerProcess,
    port: u16,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a standalone server.
    ///
    /// # Errors
    ///
    /// Missing binary, or a server that does not start.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(&[]).await
    }

    /// Starts a server with extra arguments (e.g. `--replicaof`).
    ///
    /// # Errors
    ///
    /// Missing binary, or a server that does not start.
    pub async fn start_with(extra: &[&str]) -> Result<Self, HarnessError> {
        let binary = find_binary("redis-server", PACKAGE)?;
        let dir = temp_dir("redis-")?;
        let port = free_port()?;
        let spec = ServerSpec::new(
            format!("redis-server :{port}"),
            binary,
            dir.path().join("redis.log"),
        )
        .args([
            "--port".to_owned(),
            port.to_string(),
            "--bind".to_owned(),
            "127.0.0.1".to_owned(),
            "--dir".to_owned(),
            dir.path().display().to_string(),
            "--save".to_owned(),
            String::new(),
            "--appendonly".to_owned(),
            "no".to_owned(),
        ])
        .args(extra.iter().copied())
        .ready(Ready::Port(port));
        let process = ServerProcess::start(spec).await?;
        Ok(Self { process, port, dir })
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data directory.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// The process, for faults (pause, kill, restart).
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}
