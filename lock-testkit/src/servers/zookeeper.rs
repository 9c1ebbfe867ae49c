//! ZooKeeper 3.8 on loopback: one standalone server, or an ensemble of
//! several servers (quorum peers) with kill / restart of a single member
//! and a way to find the leader (the `srvr` four-letter word). Either can
//! also run on the hosts of a lab (`start_in`), client and peer ports on
//! the hosts' addresses.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;
use tokio::time::Instant;

use crate::netns::{Lab, Placement};
use crate::process::{HarnessError, ServerProcess, ServerSpec, find_binary, free_port, temp_dir};
use crate::proxy::FaultProxy;

/// The Debian package that provides ZooKeeper (and pulls in Java).
pub const PACKAGE: &str = "zookeeper";

/// Where Debian puts the server's jar.
pub const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// Debian's SLF4J binding that logs to stderr (package `libslf4j-java`, a
/// dependency of `zookeeper`).
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";

/// The server's tick in milliseconds. Session timeouts are clamped by the
/// server to 2–20 ticks, i.e. 1 s to 10 s.
pub const TICK_MS: u64 = 500;

/// The default `syncLimit` (in ticks): how long a follower keeps serving
/// without hearing from its leader, and how long a leader keeps a silent
/// follower.
pub const SYNC_LIMIT_TICKS: u32 = 5;

/// What `srvr` says about a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZkMode {
    /// A single server, not part of an ensemble.
    Standalone,
    /// The ensemble's leader.
    Leader,
    /// A follower.
    Follower,
    /// An observer.
    Observer,
}

/// One ZooKeeper server process (standalone or a member of an ensemble).
#[derive(Debug)]
pub struct ZkNode {
    id: u32,
    process: ServerProcess,
    client_port: u16,
    place: Placement,
    dir: TempDir,
}

impl ZkNode {
    /// The member id (`myid`), 1-based; 0 for a standalone server.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// `<address>:<client port>` (127.0.0.1, or its lab host's address).
    pub fn address(&self) -> String {
        format!("{}:{}", self.place.addr(), self.client_port)
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The data directory (holds `zoo.cfg` and the server log `zk.log`).
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// The process, for faults (pause, kill, restart).
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    /// Pauses the member (SIGSTOP) and waits until every thread of the JVM
    /// is actually stopped. `kill(2)` only queues the signal: the group stop
    /// takes effect when a thread of the process next runs, which on a
    /// loaded machine can be tens of milliseconds later, and meanwhile the
    /// server keeps answering requests.
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent, or the process (not running, a
    /// zombie) does not reach the stopped state within a few seconds.
    pub fn pause(&mut self) -> Result<(), HarnessError> {
        // `ServerProcess::pause` waits until the JVM's threads are stopped.
        self.process.pause()
    }

    /// Runs a four-letter-word command (`srvr`, `ruok`, `stat`...) and
    /// returns the answer, or `None` when the server does not answer
    /// within `timeout` (paused, killed, starting).
    pub fn four_letter(&self, command: &str, timeout: Duration) -> Option<String> {
        four_letter(&self.place, self.client_port, command, timeout)
    }

    /// The member's role, or `None` while it is not serving (election in
    /// progress, paused, killed).
    pub fn mode(&self) -> Option<ZkMode> {
        let answer = self.four_letter("srvr", Duration::from_millis(500))?;
        let mode = answer
            .lines()
            .find_map(|line| line.strip_prefix("Mode:"))?
            .trim()
            .to_owned();
        match mode.as_str() {
            "standalone" => Some(ZkMode::Standalone),
            "leader" => Some(ZkMode::Leader),
            "follower" => Some(ZkMode::Follower),
            "observer" => Some(ZkMode::Observer),
            _ => None,
        }
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// A four-letter word to the server at `place`'s address on `port`, sent
/// from where it is reached.
fn four_letter(place: &Placement, port: u16, command: &str, timeout: Duration) -> Option<String> {
    let addr = SocketAddr::from((place.addr(), port));
    let command = command.to_owned();
    place
        .reach(move || four_letter_to(addr, &command, timeout))
        .ok()
        .flatten()
}

fn four_letter_to(addr: SocketAddr, command: &str, timeout: Duration) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    stream.write_all(command.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

/// Checks that the server answering on the node's client port is this
/// node's own JVM (its `dataDir`), not another server that happened to get
/// the same port (ports come from `free_port()`, which only knows its own
/// process): faults applied to our process would not reach that one.
fn check_identity(node: &ZkNode) -> Result<(), HarnessError> {
    let expected = format!("dataDir={}", node.dir.path().display());
    match node.four_letter("conf", Duration::from_secs(2)) {
        Some(conf) if conf.lines().any(|l| l.trim().starts_with(&expected)) => Ok(()),
        other => Err(HarnessError::NotReady {
            name: format!(
                "zookeeper #{} (port {} is answered by another server: {:?})",
                node.id,
                node.client_port,
                other
                    .unwrap_or_default()
                    .lines()
                    .find(|l| l.starts_with("dataDir="))
            ),
            log_tail: crate::process::log_tail(&node.dir.path().join("zk.log")),
        }),
    }
}

/// Starts one JVM for `dir/zoo.cfg`, at `place`.
async fn spawn_node(
    id: u32,
    dir: TempDir,
    (place, client_port): (Placement, u16),
    config: &str,
    properties: &[String],
) -> Result<ZkNode, HarnessError> {
    let java = find_binary("java", PACKAGE)?;
    if !Path::new(ZOOKEEPER_JAR).is_file() {
        return Err(HarnessError::MissingBinary {
            binary: ZOOKEEPER_JAR.to_owned(),
            package: PACKAGE.to_owned(),
        });
    }
    let cfg = dir.path().join("zoo.cfg");
    std::fs::write(&cfg, config)?;
    if id > 0 {
        std::fs::write(dir.path().join("myid"), format!("{id}\n"))?;
    }
    // Debian's /usr/share/java holds half a dozen SLF4J bindings and the
    // first found wins; naming slf4j-simple first makes the server's own
    // warnings and errors (a port it cannot bind, an election that does not
    // finish) reach zk.log, which a failed start prints.
    let classpath = format!(
        "{}:{SLF4J_SIMPLE_JAR}:{ZOOKEEPER_JAR}:/usr/share/java/*",
        dir.path().display()
    );
    let mut spec = ServerSpec::new(
        format!("zookeeper #{id} {}:{client_port}", place.addr()),
        java,
        dir.path().join("zk.log"),
    )
    .args([
        // ZooKeeper's own start script defaults to a 1000 MB heap; 100,000
        // held locks keep about 210 MB live (a node and its key directory
        // each), which a 256 MB heap turns into back-to-back full
        // collections and expired sessions. The maximum costs nothing until
        // it is used.
        "-Xmx1g".to_owned(),
        "-XX:+UseSerialGC".to_owned(),
        "-Dzookeeper.admin.enableServer=false".to_owned(),
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn".to_owned(),
    ])
    .args(properties.iter().cloned())
    .args([
        "-cp".to_owned(),
        classpath,
        "org.apache.zookeeper.server.quorum.QuorumPeerMain".to_owned(),
        cfg.display().to_string(),
    ])
    .ready(place.ready(client_port));
    spec.netns = place.netns();
    let process = ServerProcess::start(spec).await?;
    Ok(ZkNode {
        id,
        process,
        client_port,
        place,
        dir,
    })
}

fn base_config(dir: &Path, (addr, client_port): (Ipv4Addr, u16), sync_limit: u32) -> String {
    format!(
        "tickTime={TICK_MS}\ninitLimit=10\nsyncLimit={sync_limit}\ndataDir={}\nclientPort={client_port}\n\
         clientPortAddress={addr}\nadmin.enableServer=false\nmaxClientCnxns=0\n\
         4lw.commands.whitelist=*\n",
        dir.display()
    )
}

/// Waits until every node in `nodes` answers `srvr` with a mode.
async fn wait_serving(nodes: &[&ZkNode], timeout: Duration) -> Result<(), HarnessError> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut all = true;
        for node in nodes {
            let (place, port) = (node.place.clone(), node.client_port);
            let serving = tokio::task::spawn_blocking(move || {
                four_letter(&place, port, "srvr", Duration::from_millis(500))
                    .is_some_and(|a| a.contains("Mode:"))
            })
            .await
            .unwrap_or(false);
            if !serving {
                all = false;
                break;
            }
        }
        if all {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let tail = nodes
                .iter()
                .map(|n| {
                    format!(
                        "--- node {} ---\n{}",
                        n.id,
                        crate::process::log_tail(&n.dir.path().join("zk.log"))
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            return Err(HarnessError::NotReady {
                name: "zookeeper (not serving)".to_owned(),
                log_tail: tail,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A standalone ZooKeeper server.
#[derive(Debug)]
pub struct ZkServer {
    node: ZkNode,
}

impl ZkServer {
    /// Starts a standalone server on a free port and waits until it serves.
    ///
    /// # Errors
    ///
    /// Missing Java or ZooKeeper, or a server that does not start.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(&[]).await
    }

    /// [`start`](Self::start) with the server checking for empty container
    /// nodes every `every` (ZooKeeper's default is 60 s): a container a
    /// client left empty is deleted within `every`, so what depends on a
    /// container outliving its children shows within a test's time.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn start_reaping_containers(every: Duration) -> Result<Self, HarnessError> {
        Self::start_with(&[format!(
            "-Dznode.container.checkIntervalMs={}",
            every.as_millis().max(1)
        )])
        .await
    }

    /// As [`start`](Self::start), in the namespace of `lab`'s host named
    /// `host`, its client port on the host's address (what
    /// [`url`](Self::url) names): reach it from the other hosts'
    /// namespaces.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); a lab without another host to reach it
    /// from.
    pub async fn start_in(lab: &Lab, host: &str) -> Result<Self, HarnessError> {
        Self::start_at(Placement::on(lab, host)?, &[]).await
    }

    /// A standalone server whose JVM also gets `properties` (`-D...`).
    async fn start_with(properties: &[String]) -> Result<Self, HarnessError> {
        Self::start_at(Placement::loopback(), properties).await
    }

    async fn start_at(place: Placement, properties: &[String]) -> Result<Self, HarnessError> {
        let dir = temp_dir("zookeeper-")?;
        let port = free_port()?;
        let config = base_config(dir.path(), (place.addr(), port), SYNC_LIMIT_TICKS);
        let node = spawn_node(0, dir, (place, port), &config, properties).await?;
        wait_serving(&[&node], Duration::from_secs(60)).await?;
        check_identity(&node)?;
        Ok(Self { node })
    }

    /// `<address>:<port>`: a connect string.
    pub fn connect_string(&self) -> String {
        self.node.address()
    }

    /// `zk://<address>:<port>`.
    pub fn url(&self) -> String {
        format!("zk://{}", self.node.address())
    }

    /// The server.
    pub fn node(&self) -> &ZkNode {
        &self.node
    }

    /// The server, for faults (pause, kill, restart through `process()`).
    pub fn node_mut(&mut self) -> &mut ZkNode {
        &mut self.node
    }

    /// Pauses the server (SIGSTOP) and waits until it is actually stopped
    /// (see [`ZkNode::pause`]).
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent or the server does not stop.
    pub fn pause(&mut self) -> Result<(), HarnessError> {
        self.node.pause()
    }

    /// Resumes the server (SIGCONT).
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent.
    pub fn resume(&mut self) -> Result<(), HarnessError> {
        self.node.process.resume()
    }
}

/// An ensemble of ZooKeeper servers on loopback.
#[derive(Debug)]
pub struct ZkEnsemble {
    nodes: Vec<ZkNode>,
    /// With [`ZkEnsemble::start_with_peer_proxies`]: one proxy per directed
    /// peer link `(from, to, proxy)`, carrying both the quorum and the
    /// election connections `from` opens towards `to`.
    peer_links: Vec<PeerLink>,
}

/// The proxies `from` uses to reach `to`'s quorum and election ports.
#[derive(Debug)]
struct PeerLink {
    from: usize,
    to: usize,
    quorum: FaultProxy,
    election: FaultProxy,
}

impl ZkEnsemble {
    /// Starts `size` quorum peers (3 is the usual choice) and waits until
    /// every one serves (a leader was elected).
    ///
    /// # Errors
    ///
    /// Missing Java or ZooKeeper, or an ensemble that does not form.
    pub async fn start(size: usize) -> Result<Self, HarnessError> {
        let places = vec![Placement::loopback(); size.max(1)];
        Self::start_inner(places, SYNC_LIMIT_TICKS, false).await
    }

    /// Starts one member on each of `lab`'s hosts named in `hosts`, each
    /// in its host's namespace with its client, quorum and election ports
    /// on the host's address, so that [`Lab::isolate`] cuts a client (or
    /// a member) off in the kernel.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); a lab without another host to reach a
    /// member from.
    pub async fn start_in(lab: &Lab, hosts: &[&str]) -> Result<Self, HarnessError> {
        let places = hosts
            .iter()
            .map(|host| Placement::on(lab, host))
            .collect::<Result<Vec<_>, _>>()?;
        Self::start_inner(places, SYNC_LIMIT_TICKS, false).await
    }

    /// Like [`start`](Self::start), but every member reaches every other
    /// one through a [`FaultProxy`] of its own (each member's config names
    /// the others by their proxies' ports, itself by its real ports), so
    /// that [`partition_member`](Self::partition_member) can cut one member
    /// off from the rest of the ensemble while its clients stay connected.
    /// `sync_limit` (ticks of [`TICK_MS`]) is how long a cut-off follower
    /// keeps serving its clients from its own, possibly stale, state.
    ///
    /// ZooKeeper may answer an election connection from a lower member id
    /// by connecting back to the address that member advertised (its real
    /// port): during an election some traffic can bypass the proxies. The
    /// quorum connection of a follower to its leader always uses the
    /// follower's config, i.e. the proxy.
    ///
    /// # Errors
    ///
    /// Missing Java or ZooKeeper, or an ensemble that does not form.
    pub async fn start_with_peer_proxies(
        size: usize,
        sync_limit: u32,
    ) -> Result<Self, HarnessError> {
        let places = vec![Placement::loopback(); size.max(1)];
        Self::start_inner(places, sync_limit, true).await
    }

    /// One member at each of `places` (the peer proxies, with `proxied`,
    /// are on loopback: for loopback members only).
    async fn start_inner(
        places: Vec<Placement>,
        sync_limit: u32,
        proxied: bool,
    ) -> Result<Self, HarnessError> {
        let mut members = Vec::new();
        for index in 0..places.len() {
            let id = u32::try_from(index + 1).unwrap_or(u32::MAX);
            members.push((
                id,
                temp_dir("zookeeper-")?,
                free_port()?,
                free_port()?,
                free_port()?,
            ));
        }
        let mut peer_links = Vec::new();
        if proxied {
            for from in 0..members.len() {
                for (to, (_, _, _, quorum, election)) in members.iter().enumerate() {
                    if from != to {
                        peer_links.push(PeerLink {
                            from,
                            to,
                            quorum: FaultProxy::start(loopback(*quorum)).await?,
                            election: FaultProxy::start(loopback(*election)).await?,
                        });
                    }
                }
            }
        }
        let mut nodes = Vec::new();
        let ids: Vec<(u32, Ipv4Addr, u16, u16)> = members
            .iter()
            .zip(&places)
            .map(|((id, _, _, quorum, election), place)| (*id, place.addr(), *quorum, *election))
            .collect();
        for (index, ((id, dir, client, _, _), place)) in members.into_iter().zip(places).enumerate()
        {
            let servers: String = ids
                .iter()
                .enumerate()
                .map(|(to, (peer_id, addr, quorum, election))| {
                    match peer_links.iter().find(|l| l.from == index && l.to == to) {
                        Some(link) => format!(
                            "server.{peer_id}=127.0.0.1:{}:{}\n",
                            link.quorum.port(),
                            link.election.port()
                        ),
                        None => format!("server.{peer_id}={addr}:{quorum}:{election}\n"),
                    }
                })
                .collect();
            let base = base_config(dir.path(), (place.addr(), client), sync_limit);
            let config = format!("{base}{servers}");
            nodes.push(spawn_node(id, dir, (place, client), &config, &[]).await?);
        }
        let ensemble = Self { nodes, peer_links };
        ensemble.wait_serving(Duration::from_secs(90)).await?;
        for node in &ensemble.nodes {
            check_identity(node)?;
        }
        Ok(ensemble)
    }

    /// `<address>:a,<address>:b,...`: the connect string of every member.
    pub fn connect_string(&self) -> String {
        self.nodes
            .iter()
            .map(ZkNode::address)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `zk://<address>:a,<address>:b,...`.
    pub fn url(&self) -> String {
        format!("zk://{}", self.connect_string())
    }

    /// The members.
    pub fn nodes(&self) -> &[ZkNode] {
        &self.nodes
    }

    /// One member, by index (0-based), for faults.
    pub fn node_mut(&mut self, index: usize) -> Option<&mut ZkNode> {
        self.nodes.get_mut(index)
    }

    /// Cuts member `index` (0-based) off from every other member: the peer
    /// proxies in both directions hold their traffic (connections stay
    /// open, as in a network partition), while the member's client port is
    /// untouched, so its clients stay connected to it.
    ///
    /// # Errors
    ///
    /// [`HarnessError::Setup`] when the ensemble was not started with
    /// [`start_with_peer_proxies`](Self::start_with_peer_proxies) or
    /// `index` is not a member.
    pub fn partition_member(&self, index: usize) -> Result<(), HarnessError> {
        for link in self.member_links(index)? {
            link.quorum.partition();
            link.election.partition();
        }
        Ok(())
    }

    /// Ends [`partition_member`](Self::partition_member): held traffic
    /// flows on.
    ///
    /// # Errors
    ///
    /// As for [`partition_member`](Self::partition_member).
    pub fn heal_member(&self, index: usize) -> Result<(), HarnessError> {
        for link in self.member_links(index)? {
            link.quorum.heal();
            link.election.heal();
        }
        Ok(())
    }

    fn member_links(&self, index: usize) -> Result<Vec<&PeerLink>, HarnessError> {
        if self.peer_links.is_empty() || index >= self.nodes.len() {
            return Err(HarnessError::Setup {
                what: format!("partitioning zookeeper member {index}"),
                output: "the ensemble has no peer proxies (start_with_peer_proxies) or no such \
                         member"
                    .to_owned(),
            });
        }
        Ok(self
            .peer_links
            .iter()
            .filter(|l| l.from == index || l.to == index)
            .collect())
    }

    /// The index of the current leader, if one is serving.
    pub async fn leader(&self) -> Option<usize> {
        let members: Vec<(Placement, u16)> = self
            .nodes
            .iter()
            .map(|n| (n.place.clone(), n.client_port))
            .collect();
        tokio::task::spawn_blocking(move || {
            members.iter().position(|(place, port)| {
                four_letter(place, *port, "srvr", Duration::from_millis(500))
                    .is_some_and(|a| a.contains("Mode: leader"))
            })
        })
        .await
        .ok()
        .flatten()
    }

    /// Waits until every running (not killed, not paused) member serves.
    ///
    /// # Errors
    ///
    /// [`HarnessError::NotReady`] with the members' log tails.
    pub async fn wait_serving(&self, timeout: Duration) -> Result<(), HarnessError> {
        let running: Vec<&ZkNode> = self
            .nodes
            .iter()
            .filter(|n| n.process.pid().is_some() && !n.process.is_paused())
            .collect();
        wait_serving(&running, timeout).await
    }

    /// Pauses every member (SIGSTOP) and waits until each is actually
    /// stopped (see [`ZkNode::pause`]).
    ///
    /// # Errors
    ///
    /// When a signal cannot be sent or a member does not stop.
    pub fn pause_all(&mut self) -> Result<(), HarnessError> {
        // Each pause returns once that member has stopped.
        for node in &mut self.nodes {
            node.process.pause()?;
        }
        Ok(())
    }

    /// Resumes every member (SIGCONT).
    ///
    /// # Errors
    ///
    /// When a signal cannot be sent.
    pub fn resume_all(&mut self) -> Result<(), HarnessError> {
        for node in &mut self.nodes {
            if node.process.is_paused() {
                node.process.resume()?;
            }
        }
        Ok(())
    }
}
