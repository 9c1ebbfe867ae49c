//! redis-server on loopback.

use tempfile::TempDir;

use super::{Kind, LoopbackServer};
use crate::process::{
    HarnessError, Ready, ServerProcess, ServerSpec, find_binary, free_port, temp_dir,
};

/// The Debian package that provides `redis-server`.
pub const PACKAGE: &str = "redis-server";

/// One redis-server, without persistence, on a free loopback port.
pub type RedisServer = LoopbackServer<Redis>;

/// The [`Kind`] of a [`RedisServer`].
#[derive(Debug)]
pub struct Redis;

impl Kind for Redis {}

impl RedisServer {
    /// Starts a standalone server.
    ///
    /// # Errors
    ///
    /// Missing binary, or a server that does not start.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(&[]).await
    }

    /// Starts `n` independent standalone servers (the nodes of a Redlock
    /// test).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start), for the first server that fails.
    pub async fn start_many(n: usize) -> Result<Vec<Self>, HarnessError> {
        let mut servers = Vec::with_capacity(n);
        for _ in 0..n {
            servers.push(Self::start().await?);
        }
        Ok(servers)
    }

    /// `redlock://127.0.0.1:<port>,...` over `servers` (no options).
    pub fn redlock_url(servers: &[Self]) -> String {
        let hosts: Vec<String> = servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redlock://{}", hosts.join(","))
    }

    /// Starts a server with extra arguments (e.g. `--replicaof`).
    ///
    /// # Errors
    ///
    /// Missing binary, or a server that does not start.
    pub async fn start_with(extra: &[&str]) -> Result<Self, HarnessError> {
        let port = free_port()?;
        let listen = ["--port".to_owned(), port.to_string()];
        Self::launch(
            format!("redis-server :{port}"),
            "redis-",
            port,
            listen,
            extra,
        )
        .await
    }

    /// Starts a server that only speaks TLS (`--port 0 --tls-port <port>`),
    /// with this server certificate, key and CA (PEM files), not requiring
    /// client certificates (`--tls-auth-clients no`). [`port`](Self::port)
    /// is the TLS port; [`url`](Self::url) is not meaningful for it (use
    /// `rediss://127.0.0.1:<port>`).
    ///
    /// # Errors
    ///
    /// Missing binary, or a server that does not start (e.g. a redis-server
    /// built without TLS).
    pub async fn start_tls(
        cert_file: &std::path::Path,
        key_file: &std::path::Path,
        ca_file: &std::path::Path,
    ) -> Result<Self, HarnessError> {
        let port = free_port()?;
        let listen = [
            "--port".to_owned(),
            "0".to_owned(),
            "--tls-port".to_owned(),
            port.to_string(),
            "--tls-cert-file".to_owned(),
            cert_file.display().to_string(),
            "--tls-key-file".to_owned(),
            key_file.display().to_string(),
            "--tls-ca-cert-file".to_owned(),
            ca_file.display().to_string(),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ];
        let label = format!("redis-server tls :{port}");
        Self::launch(label, "redis-tls-", port, listen, &[]).await
    }

    /// Starts `redis-server` listening on `port` as `listen` says, in a
    /// fresh directory named from `dir_prefix`: on loopback, without
    /// persistence, then `extra` arguments.
    async fn launch<const N: usize>(
        label: String,
        dir_prefix: &str,
        port: u16,
        listen: [String; N],
        extra: &[&str],
    ) -> Result<Self, HarnessError> {
        let binary = find_binary("redis-server", PACKAGE)?;
        let dir = temp_dir(dir_prefix)?;
        let spec = ServerSpec::new(label, binary, dir.path().join("redis.log"))
            .args(listen)
            .args([
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
        Ok(Self::new(process, port, dir))
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port())
    }
}

/// The Debian package that provides `redis-cli` (cluster creation).
pub const TOOLS_PACKAGE: &str = "redis-tools";

impl RedisServer {
    /// Starts a replica of `master` (asynchronous replication).
    ///
    /// # Errors
    ///
    /// Missing binary, or a server that does not start.
    pub async fn start_replica_of(master: &RedisServer) -> Result<Self, HarnessError> {
        let port = master.port().to_string();
        Self::start_with(&["--replicaof", "127.0.0.1", &port]).await
    }

    /// Runs `redis-cli -p <port> <args...>` and returns its output.
    ///
    /// # Errors
    ///
    /// Missing `redis-cli`, or the command failing.
    pub fn cli(&self, args: &[&str]) -> Result<String, HarnessError> {
        redis_cli(self.port, args)
    }

    /// Promotes this replica to a master (`REPLICAOF NO ONE`).
    ///
    /// # Errors
    ///
    /// As [`cli`](Self::cli).
    pub fn promote(&self) -> Result<(), HarnessError> {
        self.cli(&["REPLICAOF", "NO", "ONE"]).map(|_| ())
    }

    /// Waits until this replica reports its link to the master up.
    ///
    /// # Errors
    ///
    /// [`HarnessError::NotReady`] after `timeout`.
    pub async fn wait_replica_synced(
        &self,
        timeout: std::time::Duration,
    ) -> Result<(), HarnessError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(info) = self.cli(&["INFO", "replication"])
                && info.contains("master_link_status:up")
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HarnessError::NotReady {
                    name: format!("redis replica :{}", self.port),
                    log_tail: self.cli(&["INFO", "replication"]).unwrap_or_default(),
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// Runs `redis-cli -h 127.0.0.1 -p <port> <args...>`.
///
/// # Errors
///
/// Missing `redis-cli`, or the command failing.
pub fn redis_cli(port: u16, args: &[&str]) -> Result<String, HarnessError> {
    let cli = find_binary("redis-cli", TOOLS_PACKAGE)?;
    let output = std::process::Command::new(cli)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() && !text.starts_with("ERR") {
        Ok(text)
    } else {
        Err(HarnessError::Setup {
            what: format!("redis-cli -p {port} {}", args.join(" ")),
            output: format!("{text}{}", String::from_utf8_lossy(&output.stderr)),
        })
    }
}

/// One Redis Sentinel monitoring one master (quorum 1, 1 s down-after).
#[derive(Debug)]
pub struct RedisSentinel {
    process: ServerProcess,
    port: u16,
    master_name: String,
    _dir: TempDir,
}

impl RedisSentinel {
    /// Starts a sentinel that monitors `master_port` as `master_name`.
    ///
    /// # Errors
    ///
    /// Missing binary, or a sentinel that does not start.
    pub async fn start(master_name: &str, master_port: u16) -> Result<Self, HarnessError> {
        let binary = find_binary("redis-server", PACKAGE)?;
        let dir = temp_dir("redis-sentinel-")?;
        let port = free_port()?;
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {master_name} 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds {master_name} 1000\n\
                 sentinel failover-timeout {master_name} 5000\n\
                 sentinel parallel-syncs {master_name} 1\n",
                dir = dir.path().display()
            ),
        )?;
        let spec = ServerSpec::new(
            format!("redis-sentinel :{port}"),
            binary,
            dir.path().join("sentinel.log"),
        )
        .args([conf.display().to_string(), "--sentinel".to_owned()])
        .ready(Ready::Port(port));
        let process = ServerProcess::start(spec).await?;
        Ok(Self {
            process,
            port,
            master_name: master_name.to_owned(),
            _dir: dir,
        })
    }

    /// The sentinel's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The monitored master's name.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// `redis+sentinel://127.0.0.1:<port>/<master>`.
    pub fn url(&self) -> String {
        format!(
            "redis+sentinel://127.0.0.1:{}/{}",
            self.port, self.master_name
        )
    }

    /// The port of the master the sentinel currently reports.
    ///
    /// # Errors
    ///
    /// When `redis-cli` fails or the answer cannot be read.
    pub fn master_port(&self) -> Result<u16, HarnessError> {
        let out = redis_cli(
            self.port,
            &["SENTINEL", "get-master-addr-by-name", &self.master_name],
        )?;
        out.lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .ok_or_else(|| HarnessError::Setup {
                what: "reading the master address from the sentinel".to_owned(),
                output: out,
            })
    }

    /// Waits until the sentinel has discovered at least one replica.
    ///
    /// # Errors
    ///
    /// [`HarnessError::NotReady`] after `timeout`.
    pub async fn wait_replica_known(
        &self,
        timeout: std::time::Duration,
    ) -> Result<(), HarnessError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(out) = redis_cli(self.port, &["SENTINEL", "replicas", &self.master_name])
                && out.contains("slave")
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HarnessError::NotReady {
                    name: format!("redis-sentinel :{} (no replica discovered)", self.port),
                    log_tail: crate::process::log_tail(&self.process.spec().log),
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Forces a failover (`SENTINEL FAILOVER <master>`).
    ///
    /// # Errors
    ///
    /// When the sentinel refuses.
    pub fn failover(&self) -> Result<(), HarnessError> {
        redis_cli(self.port, &["SENTINEL", "FAILOVER", &self.master_name]).map(|_| ())
    }

    /// The process, for faults.
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}

/// A Redis Cluster of masters without replicas, created with
/// `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` (at least 3) cluster-enabled servers and joins them.
    ///
    /// Each node's cluster bus gets a port of its own from [`free_port`]
    /// (`--cluster-port`): by default it is the client port + 10000, which
    /// for the harness's ports lies in the kernel's ephemeral range, where
    /// any outgoing connection on the machine may hold it (a node then
    /// fails to start: "Failed listening on port ... (cluster)").
    ///
    /// # Errors
    ///
    /// Missing binaries, servers that do not start, or a cluster that does
    /// not reach `cluster_state:ok`.
    pub async fn start(masters: usize) -> Result<Self, HarnessError> {
        let mut nodes = Vec::new();
        for _ in 0..masters.max(3) {
            let bus = free_port()?.to_string();
            nodes.push(
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &bus,
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
                .await?,
            );
        }
        let cli = find_binary("redis-cli", TOOLS_PACKAGE)?;
        let mut cmd = std::process::Command::new(cli);
        cmd.arg("--cluster").arg("create");
        for node in &nodes {
            cmd.arg(format!("127.0.0.1:{}", node.port()));
        }
        cmd.args(["--cluster-replicas", "0", "--cluster-yes"]);
        crate::process::run_setup(cmd, None, "redis-cli --cluster create")?;
        let cluster = Self { nodes };
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let ok = cluster.nodes.iter().all(|n| {
                n.cli(&["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            });
            if ok {
                return Ok(cluster);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HarnessError::NotReady {
                    name: "redis cluster".to_owned(),
                    log_tail: cluster.nodes[0]
                        .cli(&["CLUSTER", "INFO"])
                        .unwrap_or_default(),
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// `redis+cluster://127.0.0.1:<p1>,127.0.0.1:<p2>,...`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The servers.
    pub fn nodes(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }
}
