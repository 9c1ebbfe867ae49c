//! etcd on loopback: one member, or a cluster of several members, with
//! kill / restart of a member and a way to find the leader.

use std::path::PathBuf;
use std::time::Duration;

use tempfile::TempDir;
use tokio::time::Instant;

use super::{LabNodes, http_get, ok_body};
use crate::process::{
    HarnessError, ServerProcess, ServerSpec, find_binary, free_port, log_tail, temp_dir,
};
use crate::proxy::FaultProxy;

/// The Debian package that provides `etcd`.
pub const PACKAGE: &str = "etcd-server";
/// The Debian package that provides `etcdctl`.
pub const CLIENT_PACKAGE: &str = "etcd-client";

/// Server-side TLS files for [`EtcdServer::start_tls`] (PEM paths).
#[derive(Clone, Debug)]
pub struct EtcdTlsFiles {
    /// The server certificate (`--cert-file`); it must name `127.0.0.1`.
    pub cert: PathBuf,
    /// Its private key (`--key-file`).
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by this CA
    /// (`--client-cert-auth --trusted-ca-file`).
    pub client_ca: Option<PathBuf>,
}

/// One member of an [`EtcdServer`].
#[derive(Debug)]
pub struct EtcdMember {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Plain-HTTP port for `/health` and `/metrics` when the client port
    /// speaks TLS (`--listen-metrics-urls`).
    metrics_port: Option<u16>,
    /// Where it listens (127.0.0.1, or its lab host's address).
    addr: std::net::Ipv4Addr,
    /// For a member in a lab: the namespace (`/run/netns/NAME`) of another
    /// host, where its health and metrics are read from.
    probe_from: Option<PathBuf>,
    process: ServerProcess,
}

impl EtcdMember {
    /// The member's name (`m0`, `m1`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `<address>:<client port>` (127.0.0.1 unless it runs in a lab).
    pub fn endpoint(&self) -> String {
        format!("{}:{}", self.addr, self.client_port)
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The peer port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// The process, for faults (pause, kill, restart).
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    /// `GET path` on its plain-HTTP port (`/health`, `/metrics`), from
    /// where it can be reached.
    async fn http_get(&self, path: &str) -> Option<String> {
        let port = self.metrics_port.unwrap_or(self.client_port);
        let from = self.probe_from.clone();
        let response = http_get(from, self.addr, port, path, Duration::from_secs(1)).await?;
        ok_body(&response).map(str::to_owned)
    }
}

/// A single etcd or a cluster of members on free loopback ports, each in
/// its own data directory under one temporary directory, with fast
/// elections (`--heartbeat-interval 50 --election-timeout 500`, so the
/// minimum lease TTL is 1 s). Stopped on drop.
#[derive(Debug)]
pub struct EtcdServer {
    members: Vec<EtcdMember>,
    dir: TempDir,
    tls: bool,
    /// With [`start_cluster_with_peer_proxies`](Self::start_cluster_with_peer_proxies):
    /// member `i`'s advertised peer URL is `peer_proxies[i]`, in front of
    /// its real peer port.
    peer_proxies: Vec<FaultProxy>,
}

impl EtcdServer {
    /// Starts a single member.
    ///
    /// # Errors
    ///
    /// Missing binary, or a server that does not become healthy.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_cluster(1).await
    }

    /// Starts a cluster of `size` members (at least 1) and waits until every
    /// member is healthy (a leader is elected).
    ///
    /// # Errors
    ///
    /// Missing binary, or members that do not become healthy.
    pub async fn start_cluster(size: usize) -> Result<Self, HarnessError> {
        Self::start_members(size, None, false, None).await
    }

    /// Starts a cluster like [`start_cluster`](Self::start_cluster) whose
    /// peer traffic goes through fault proxies: each member listens for
    /// peers on its own port but advertises (and is listed in every
    /// member's `--initial-cluster` at) a proxy in front of it, so every
    /// connection a peer opens to it crosses that proxy.
    /// [`partition_member`](Self::partition_member) holds that proxy's
    /// traffic.
    ///
    /// # Errors
    ///
    /// Missing binary, or members that do not become healthy.
    pub async fn start_cluster_with_peer_proxies(size: usize) -> Result<Self, HarnessError> {
        Self::start_members(size, None, true, None).await
    }

    /// Starts a single member whose client port speaks only TLS with these
    /// files (`https://127.0.0.1:<port>`); `/health` and `/metrics` are
    /// served over plain HTTP on a separate port (`--listen-metrics-urls`),
    /// so health checks and [`leader`](Self::leader) still work.
    ///
    /// # Errors
    ///
    /// Missing binary, or a server that does not become healthy (e.g. a
    /// certificate etcd cannot load: see the log tail in the error).
    pub async fn start_tls(tls: EtcdTlsFiles) -> Result<Self, HarnessError> {
        Self::start_members(1, Some(tls), false, None).await
    }

    /// Starts one member on each of `lab`'s hosts named in `hosts`, each in
    /// its host's namespace and listening on its address, so that
    /// [`Lab::isolate`](crate::netns::Lab::isolate) cuts a member off from
    /// its peers (or a client host off from the cluster) in the kernel.
    /// The lab needs a host that runs no member: health is read from there.
    ///
    /// # Errors
    ///
    /// As [`start_cluster`](Self::start_cluster); a setup error without a
    /// host to read health from.
    pub async fn start_in(lab: &crate::netns::Lab, hosts: &[&str]) -> Result<Self, HarnessError> {
        let placement = LabNodes::on(lab, hosts, "EtcdServer", "member")?;
        Self::start_members(hosts.len(), None, false, Some(placement)).await
    }

    async fn start_members(
        size: usize,
        tls: Option<EtcdTlsFiles>,
        proxied_peers: bool,
        placement: Option<LabNodes>,
    ) -> Result<Self, HarnessError> {
        let binary = find_binary("etcd", PACKAGE)?;
        // Data on tmpfs when there is one, for the functional tests: etcd
        // fsyncs its WAL on every write, which on a shared disk makes tests
        // slow and noisy. On disk under the servers' defaults.
        let on_tmpfs = match super::durability() {
            super::Durability::Fast => tempfile::Builder::new()
                .prefix("etcd-")
                .tempdir_in("/dev/shm")
                .ok(),
            super::Durability::ServerDefaults => None,
        };
        let dir = match on_tmpfs {
            Some(dir) => dir,
            None => temp_dir("etcd-")?,
        };
        let mut ports = Vec::new();
        for i in 0..size.max(1) {
            let metrics = if tls.is_some() {
                Some(free_port()?)
            } else {
                None
            };
            ports.push((format!("m{i}"), free_port()?, free_port()?, metrics));
        }
        let mut peer_proxies = Vec::new();
        if proxied_peers {
            for (_, _, peer, _) in &ports {
                let upstream = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, *peer));
                peer_proxies.push(FaultProxy::start(upstream).await?);
            }
        }
        // The peer URL others reach a member at: its proxy's, when it has one.
        let advertised = |index: usize, peer: u16| {
            peer_proxies
                .get(index)
                .map_or(peer, |p: &FaultProxy| p.port())
        };
        let addr_of = |index: usize| LabNodes::addr(placement.as_ref(), index);
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (name, _, peer, _))| {
                format!("{name}=http://{}:{}", addr_of(i), advertised(i, *peer))
            })
            .collect::<Vec<_>>()
            .join(",");
        // The same token for every member (it seeds the cluster id).
        let token = format!("distlock-{}", ports[0].1);
        let mut members = Vec::new();
        let client_scheme = if tls.is_some() { "https" } else { "http" };
        for (index, (name, client_port, peer_port, metrics_port)) in ports.into_iter().enumerate() {
            let data = dir.path().join(&name);
            let addr = addr_of(index);
            let client_url = format!("{client_scheme}://{addr}:{client_port}");
            let peer_url = format!("http://{addr}:{peer_port}");
            let advertised_peer_url = format!("http://{addr}:{}", advertised(index, peer_port));
            // No readiness check here: a member only serves clients once a
            // quorum is up, so all are started first and checked after.
            let spec = ServerSpec::new(
                format!("etcd {name} :{client_port}"),
                binary.clone(),
                dir.path().join(format!("{name}.log")),
            )
            .args([
                "--name".to_owned(),
                name.clone(),
                "--data-dir".to_owned(),
                data.display().to_string(),
                "--listen-client-urls".to_owned(),
                client_url.clone(),
                "--advertise-client-urls".to_owned(),
                client_url,
                "--listen-peer-urls".to_owned(),
                peer_url,
                "--initial-advertise-peer-urls".to_owned(),
                advertised_peer_url,
                "--initial-cluster".to_owned(),
                initial_cluster.clone(),
                "--initial-cluster-state".to_owned(),
                "new".to_owned(),
                "--initial-cluster-token".to_owned(),
                token.clone(),
                "--heartbeat-interval".to_owned(),
                "50".to_owned(),
                "--election-timeout".to_owned(),
                "500".to_owned(),
                "--log-level".to_owned(),
                "warn".to_owned(),
            ]);
            let spec = match &tls {
                None => spec,
                Some(tls) => {
                    let mut args = vec![
                        "--cert-file".to_owned(),
                        tls.cert.display().to_string(),
                        "--key-file".to_owned(),
                        tls.key.display().to_string(),
                    ];
                    if let Some(port) = metrics_port {
                        args.push("--listen-metrics-urls".to_owned());
                        args.push(format!("http://127.0.0.1:{port}"));
                    }
                    if let Some(ca) = &tls.client_ca {
                        args.push("--client-cert-auth".to_owned());
                        args.push("--trusted-ca-file".to_owned());
                        args.push(ca.display().to_string());
                    }
                    spec.args(args)
                }
            };
            let mut spec = spec;
            spec.netns = LabNodes::netns(placement.as_ref(), index);
            let process = ServerProcess::start(spec).await?;
            members.push(EtcdMember {
                name,
                client_port,
                peer_port,
                metrics_port,
                addr,
                probe_from: placement.as_ref().map(|p| p.probe_from.clone()),
                process,
            });
        }
        let server = Self {
            members,
            dir,
            tls: tls.is_some(),
            peer_proxies,
        };
        for i in 0..server.members.len() {
            server.wait_healthy(i, Duration::from_secs(30)).await?;
        }
        Ok(server)
    }

    /// Every member's `127.0.0.1:<port>`.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdMember::endpoint).collect()
    }

    /// `etcd://<every endpoint>/<prefix>` (`etcds://` for a server started
    /// with [`start_tls`](Self::start_tls)), with `query` appended when not
    /// empty (e.g. `ttl=1s`).
    pub fn url(&self, prefix: &str, query: &str) -> String {
        let scheme = if self.tls { "etcds" } else { "etcd" };
        let mut url = format!("{scheme}://{}/{prefix}", self.endpoints().join(","));
        if !query.is_empty() {
            url.push('?');
            url.push_str(query);
        }
        url
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there is no member (never: at least one is started).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `index`.
    ///
    /// # Panics
    ///
    /// When `index` is out of range.
    pub fn member(&mut self, index: usize) -> &mut EtcdMember {
        &mut self.members[index]
    }

    /// Whether the client ports speak TLS ([`start_tls`](Self::start_tls)).
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The temporary directory holding every member's data and log.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// The index of the member that currently says it is the leader (from
    /// its `/metrics`), or `None` when no running member does.
    pub async fn leader(&self) -> Option<usize> {
        for (i, member) in self.members.iter().enumerate() {
            if member.process.pid().is_none() || member.process.is_paused() {
                continue;
            }
            if let Some(metrics) = member.http_get("/metrics").await
                && metrics
                    .lines()
                    .any(|line| line.trim() == "etcd_server_is_leader 1")
            {
                return Some(i);
            }
        }
        None
    }

    /// Waits until some member is the leader.
    ///
    /// # Errors
    ///
    /// [`HarnessError::NotReady`] when none is within `timeout`.
    pub async fn wait_leader(&self, timeout: Duration) -> Result<usize, HarnessError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(leader) = self.leader().await {
                return Ok(leader);
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::NotReady {
                    name: "etcd cluster (no leader)".to_owned(),
                    log_tail: self.log_tails(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until member `index` answers `/health` with `true`.
    ///
    /// # Errors
    ///
    /// [`HarnessError::NotReady`] with its log's tail.
    pub async fn wait_healthy(&self, index: usize, timeout: Duration) -> Result<(), HarnessError> {
        let member = &self.members[index];
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(body) = member.http_get("/health").await
                && body.contains("\"health\":\"true\"")
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::NotReady {
                    name: format!("etcd {}", member.name),
                    log_tail: log_tail(&self.dir.path().join(format!("{}.log", member.name))),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills member `index` (SIGKILL).
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent.
    pub fn kill(&mut self, index: usize) -> Result<(), HarnessError> {
        self.members[index].process.kill()
    }

    /// Restarts member `index` with its data and waits until it is healthy.
    ///
    /// # Errors
    ///
    /// When it does not come back.
    pub async fn restart(&mut self, index: usize) -> Result<(), HarnessError> {
        self.members[index].process.restart().await?;
        self.wait_healthy(index, Duration::from_secs(30)).await
    }

    /// Whether peer traffic goes through proxies
    /// ([`start_cluster_with_peer_proxies`](Self::start_cluster_with_peer_proxies)).
    pub fn has_peer_proxies(&self) -> bool {
        !self.peer_proxies.is_empty()
    }

    /// Partitions member `index` from the others: its peer proxy holds all
    /// traffic until [`heal_member`](Self::heal_member). Every connection a
    /// peer opens to the member crosses that proxy, which carries the
    /// member's outgoing raft stream messages (etcd's peers dial the
    /// streams they read from) and the peers' pipelined requests to it, so
    /// its votes, acknowledgements and heartbeats reach nobody; what the
    /// others stream to it over connections it dialed still arrives (it
    /// learns of new terms, and steps down). Returns `false` without peer
    /// proxies.
    pub fn partition_member(&self, index: usize) -> bool {
        match self.peer_proxies.get(index) {
            Some(proxy) => {
                proxy.partition();
                true
            }
            None => false,
        }
    }

    /// Undoes [`partition_member`](Self::partition_member) (held traffic
    /// then flows on).
    pub fn heal_member(&self, index: usize) {
        if let Some(proxy) = self.peer_proxies.get(index) {
            proxy.heal();
        }
    }

    /// Pauses every member (SIGSTOP).
    ///
    /// # Errors
    ///
    /// When a signal cannot be sent.
    pub fn pause_all(&mut self) -> Result<(), HarnessError> {
        for member in &mut self.members {
            if member.process.pid().is_some() {
                member.process.pause()?;
            }
        }
        Ok(())
    }

    /// Resumes every member (SIGCONT).
    ///
    /// # Errors
    ///
    /// When a signal cannot be sent.
    pub fn resume_all(&mut self) -> Result<(), HarnessError> {
        for member in &mut self.members {
            if member.process.pid().is_some() {
                member.process.resume()?;
            }
        }
        Ok(())
    }

    fn log_tails(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                format!(
                    "== {} ==\n{}",
                    m.name,
                    log_tail(&self.dir.path().join(format!("{}.log", m.name)))
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The `etcdctl` binary, or the package to install.
///
/// # Errors
///
/// [`HarnessError::MissingBinary`].
pub fn etcdctl() -> Result<PathBuf, HarnessError> {
    find_binary("etcdctl", CLIENT_PACKAGE)
}
