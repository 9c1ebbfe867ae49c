//! redis-server on loopback, or on the hosts of a lab (a single server,
//! Redlock's independent servers, a master with a replica and sentinels).

use tempfile::TempDir;

use super::{Kind, LoopbackServer};
use crate::netns::{Lab, Placement};
use crate::process::{HarnessError, ServerProcess, ServerSpec, find_binary, free_port, temp_dir};

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

    /// As [`start`](Self::start), in the namespace of `lab`'s host named
    /// `host`, listening on its address (what [`url`](Self::url) names):
    /// reach it from the other hosts' namespaces.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); a lab without another host to reach it
    /// from.
    pub async fn start_in(lab: &Lab, host: &str) -> Result<Self, HarnessError> {
        Self::start_at(Placement::on(lab, host)?, &[]).await
    }

    /// One standalone server on each of `lab`'s hosts named in `hosts`
    /// (the nodes of a Redlock test whose holder a partition cuts off
    /// from every node).
    ///
    /// # Errors
    ///
    /// As [`start_in`](Self::start_in), for the first server that fails.
    pub async fn start_many_in(lab: &Lab, hosts: &[&str]) -> Result<Vec<Self>, HarnessError> {
        let mut servers = Vec::with_capacity(hosts.len());
        for host in hosts {
            servers.push(Self::start_in(lab, host).await?);
        }
        Ok(servers)
    }

    /// `redlock://<address>:<port>,...` over `servers` (no options).
    pub fn redlock_url(servers: &[Self]) -> String {
        let hosts: Vec<String> = servers
            .iter()
            .map(|s| format!("{}:{}", s.addr(), s.port()))
            .collect();
        format!("redlock://{}", hosts.join(","))
    }

    /// Starts a server with extra arguments (e.g. `--replicaof`).
    ///
    /// # Errors
    ///
    /// Missing binary, or a server that does not start.
    pub async fn start_with(extra: &[&str]) -> Result<Self, HarnessError> {
        Self::start_at(Placement::loopback(), extra).await
    }

    async fn start_at(place: Placement, extra: &[&str]) -> Result<Self, HarnessError> {
        let port = free_port()?;
        let listen = ["--port".to_owned(), port.to_string()];
        Self::launch(
            place,
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
        Self::launch(
            Placement::loopback(),
            label,
            "redis-tls-",
            port,
            listen,
            &[],
        )
        .await
    }

    /// Starts `redis-server` listening on `port` as `listen` says, in a
    /// fresh directory named from `dir_prefix`: on `place`'s address,
    /// without persistence, then `extra` arguments.
    async fn launch<const N: usize>(
        place: Placement,
        label: String,
        dir_prefix: &str,
        port: u16,
        listen: [String; N],
        extra: &[&str],
    ) -> Result<Self, HarnessError> {
        let binary = find_binary("redis-server", PACKAGE)?;
        let dir = temp_dir(dir_prefix)?;
        let mut spec = ServerSpec::new(label, binary, dir.path().join("redis.log"))
            .args(listen)
            .args([
                "--bind".to_owned(),
                place.addr().to_string(),
                "--dir".to_owned(),
                dir.path().display().to_string(),
            ])
            .args(super::fast_only(&["--save", "", "--appendonly", "no"]))
            .args(lab_args(&place))
            .args(extra.iter().copied())
            .ready(place.ready(port));
        spec.netns = place.netns();
        let process = ServerProcess::start(spec).await?;
        Ok(Self::new(process, port, place, dir))
    }

    /// `redis://<address>:<port>` (127.0.0.1, or its lab host's address).
    pub fn url(&self) -> String {
        format!("redis://{}:{}", self.addr(), self.port())
    }
}

/// What a server on a lab host needs besides its address: without a
/// password, protected mode accepts clients from 127.0.0.1 and ::1 alone,
/// and the lab's clients come from the other loopback-range addresses.
fn lab_args(place: &Placement) -> Vec<String> {
    if place.is_in_lab() {
        vec!["--protected-mode".to_owned(), "no".to_owned()]
    } else {
        Vec::new()
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
        Self::start_with(&["--replicaof", &master.addr().to_string(), &port]).await
    }

    /// Starts a master and a replica of it (asynchronous replication),
    /// and waits until the replica is in sync: the deployment of the
    /// checks of `WAIT` and of failover losses.
    ///
    /// # Errors
    ///
    /// Missing binary, a server that does not start, or a replica that
    /// does not sync within 20 s.
    pub async fn start_with_synced_replica() -> Result<(Self, Self), HarnessError> {
        let master = Self::start().await?;
        let replica = Self::start_replica_of(&master).await?;
        replica
            .wait_replica_synced(std::time::Duration::from_secs(20))
            .await?;
        Ok((master, replica))
    }

    /// As [`start_replica_of`](Self::start_replica_of), on `lab`'s host
    /// named `host` (see [`start_in`](Self::start_in)), for a `master` on
    /// another host of the same lab.
    ///
    /// # Errors
    ///
    /// As [`start_in`](Self::start_in).
    pub async fn start_replica_in(
        master: &RedisServer,
        lab: &Lab,
        host: &str,
    ) -> Result<Self, HarnessError> {
        let port = master.port().to_string();
        let master_addr = master.addr().to_string();
        Self::start_at(
            Placement::on(lab, host)?,
            &["--replicaof", &master_addr, &port],
        )
        .await
    }

    /// Runs `redis-cli -h <address> -p <port> <args...>` (from another
    /// host's namespace for a server on a lab host) and returns its output.
    ///
    /// # Errors
    ///
    /// Missing `redis-cli`, or the command failing.
    pub fn cli(&self, args: &[&str]) -> Result<String, HarnessError> {
        redis_cli_at(self.placement(), self.port, args)
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
                    name: format!("redis replica {}:{}", self.addr(), self.port),
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
    redis_cli_at(&Placement::loopback(), port, args)
}

/// Runs `redis-cli -h <address> -p <port> <args...>` for a server placed
/// at `place`, from where it is reached.
///
/// # Errors
///
/// Missing `redis-cli`, or the command failing.
pub fn redis_cli_at(place: &Placement, port: u16, args: &[&str]) -> Result<String, HarnessError> {
    let cli = find_binary("redis-cli", TOOLS_PACKAGE)?;
    let output = place
        .command(cli)
        .args(["-h", &place.addr().to_string(), "-p", &port.to_string()])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() && !text.starts_with("ERR") {
        Ok(text)
    } else {
        Err(HarnessError::Setup {
            what: format!("redis-cli -h {} -p {port} {}", place.addr(), args.join(" ")),
            output: format!("{text}{}", String::from_utf8_lossy(&output.stderr)),
        })
    }
}

/// One Redis Sentinel monitoring one master (1 s down-after, a 5 s TILT
/// period).
#[derive(Debug)]
pub struct RedisSentinel {
    process: ServerProcess,
    port: u16,
    place: Placement,
    master_name: String,
    _dir: TempDir,
}

impl RedisSentinel {
    /// Starts a sentinel on loopback that monitors `master_port` (on
    /// 127.0.0.1) as `master_name`, quorum 1.
    ///
    /// # Errors
    ///
    /// Missing binary, or a sentinel that does not start.
    pub async fn start(master_name: &str, master_port: u16) -> Result<Self, HarnessError> {
        let master = (std::net::Ipv4Addr::LOCALHOST, master_port);
        Self::start_at(Placement::loopback(), master_name, master, 1).await
    }

    /// Starts a sentinel in the namespace of `lab`'s host named `host`,
    /// listening on its address, that monitors `master` (on another host
    /// of the lab) as `master_name`; `quorum` sentinels must agree that
    /// the master is down.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn start_in(
        lab: &Lab,
        host: &str,
        master_name: &str,
        master: &RedisServer,
        quorum: usize,
    ) -> Result<Self, HarnessError> {
        let place = Placement::on(lab, host)?;
        Self::start_at(place, master_name, (master.addr(), master.port()), quorum).await
    }

    async fn start_at(
        place: Placement,
        master_name: &str,
        (master_addr, master_port): (std::net::Ipv4Addr, u16),
        quorum: usize,
    ) -> Result<Self, HarnessError> {
        let binary = find_binary("redis-server", PACKAGE)?;
        let dir = temp_dir("redis-sentinel-")?;
        let port = free_port()?;
        let conf = dir.path().join("sentinel.conf");
        let protected = if place.is_in_lab() {
            "protected-mode no\n"
        } else {
            ""
        };
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind {addr}\n{protected}dir {dir}\n\
                 sentinel monitor {master_name} {master_addr} {master_port} {quorum}\n\
                 sentinel down-after-milliseconds {master_name} 1000\n\
                 sentinel failover-timeout {master_name} 5000\n\
                 sentinel parallel-syncs {master_name} 1\n",
                addr = place.addr(),
                dir = dir.path().display()
            ),
        )?;
        let mut spec = ServerSpec::new(
            format!("redis-sentinel {}:{port}", place.addr()),
            binary,
            dir.path().join("sentinel.log"),
        )
        .args([conf.display().to_string(), "--sentinel".to_owned()])
        .ready(place.ready(port));
        spec.netns = place.netns();
        let process = ServerProcess::start(spec).await?;
        // A sentinel that sees its clock jump by over 2 s (it was frozen)
        // acts on nothing for the TILT period, 30 s by default: 5 s here,
        // so that a paused deployment fails over again soon after. Redis
        // 7.0 has `SENTINEL DEBUG`; an older one keeps its 30 s.
        let _ = redis_cli_at(&place, port, &["SENTINEL", "DEBUG", "tilt-period", "5000"]);
        Ok(Self {
            process,
            port,
            place,
            master_name: master_name.to_owned(),
            _dir: dir,
        })
    }

    /// The sentinel's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The sentinel's address (127.0.0.1, or its lab host's).
    pub fn addr(&self) -> std::net::Ipv4Addr {
        self.place.addr()
    }

    /// The monitored master's name.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// `redis+sentinel://<address>:<port>/<master>`.
    pub fn url(&self) -> String {
        format!(
            "redis+sentinel://{}:{}/{}",
            self.addr(),
            self.port,
            self.master_name
        )
    }

    /// The port of the master the sentinel currently reports.
    ///
    /// # Errors
    ///
    /// When `redis-cli` fails or the answer cannot be read.
    pub fn master_port(&self) -> Result<u16, HarnessError> {
        self.master_addr().map(|(_, port)| port)
    }

    /// The address and port of the master the sentinel currently reports.
    ///
    /// # Errors
    ///
    /// When `redis-cli` fails or the answer cannot be read.
    pub fn master_addr(&self) -> Result<(String, u16), HarnessError> {
        let out = redis_cli_at(
            &self.place,
            self.port,
            &["SENTINEL", "get-master-addr-by-name", &self.master_name],
        )?;
        let mut lines = out.lines().map(str::trim);
        match (lines.next(), lines.next().and_then(|p| p.parse().ok())) {
            (Some(addr), Some(port)) if !addr.is_empty() => Ok((addr.to_owned(), port)),
            _ => Err(HarnessError::Setup {
                what: "reading the master address from the sentinel".to_owned(),
                output: out,
            }),
        }
    }

    /// The flags the sentinel keeps on the master (`SENTINEL MASTER`):
    /// `master` alone while it sees it up and no failover under way;
    /// `s_down`, `o_down`, `failover_in_progress`, ... added otherwise.
    ///
    /// # Errors
    ///
    /// When `redis-cli` fails or the answer has no flags.
    pub fn master_flags(&self) -> Result<String, HarnessError> {
        let out = redis_cli_at(
            &self.place,
            self.port,
            &["SENTINEL", "MASTER", &self.master_name],
        )?;
        let mut lines = out.lines().map(str::trim);
        while let Some(key) = lines.next() {
            let value = lines.next();
            if key == "flags"
                && let Some(flags) = value
            {
                return Ok(flags.to_owned());
            }
        }
        Err(HarnessError::Setup {
            what: "reading the master's flags from the sentinel".to_owned(),
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
            if let Ok(out) = redis_cli_at(
                &self.place,
                self.port,
                &["SENTINEL", "replicas", &self.master_name],
            ) && out.contains("slave")
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HarnessError::NotReady {
                    name: format!(
                        "redis-sentinel {}:{} (no replica discovered)",
                        self.addr(),
                        self.port
                    ),
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
        redis_cli_at(
            &self.place,
            self.port,
            &["SENTINEL", "FAILOVER", &self.master_name],
        )
        .map(|_| ())
    }

    /// The process, for faults.
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}

/// A master, a replica of it and sentinels watching it (a majority of the
/// sentinels is the quorum): a Sentinel deployment, on loopback
/// ([`start`](Self::start)) or each process on a lab host of its own
/// ([`start_in`](Self::start_in)), which [`Lab::isolate`] can cut a client
/// off from and [`Lab::cut_from`](crate::netns::Lab::cut_from) the master
/// from its peers.
///
/// Its two data nodes are started alike, as masters without persistence
/// (both with full syncs that start at once), the second made a replica
/// of the first with `REPLICAOF`: a node killed and started again comes
/// back empty and a master, whichever role it had, and is given its role
/// again ([`replicate`](Self::replicate), [`SentinelGroup::node`] and
/// [`RedisServer::promote`]).
#[derive(Debug)]
pub struct SentinelGroup {
    /// The data nodes: the one started as the master, then its replica
    /// (the sentinels may have swapped their roles since).
    nodes: [RedisServer; 2],
    sentinels: Vec<RedisSentinel>,
}

/// Sentinels of a [`SentinelGroup`] started on loopback.
const LOOPBACK_SENTINELS: usize = 3;

/// How long a [`SentinelGroup`] waits for its replica to sync and its
/// sentinels to discover it.
const SENTINEL_GROUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

impl SentinelGroup {
    /// Starts the master on `lab`'s host `master`, its replica on
    /// `replica`, and one sentinel on each of `sentinels`, all watching the
    /// master as `master_name`; returns once the replica is in sync and
    /// every sentinel knows it. They are set up and probed from the first
    /// host of the lab that runs none of them (so that cutting the master
    /// from its peers leaves them reachable from there), or from another
    /// host of the group when every host runs one.
    ///
    /// # Errors
    ///
    /// Missing binaries, servers that do not start, or a replica that
    /// does not sync (or is not discovered) within 20 s.
    pub async fn start_in(
        lab: &Lab,
        master: &str,
        replica: &str,
        sentinels: &[&str],
        master_name: &str,
    ) -> Result<Self, HarnessError> {
        let outside = lab
            .hosts()
            .iter()
            .map(crate::netns::Host::name)
            .find(|h| *h != master && *h != replica && !sentinels.contains(h));
        let place = |host: &str| match outside {
            Some(from) => Placement::on_via(lab, host, from),
            None => Placement::on(lab, host),
        };
        let sentinels = sentinels
            .iter()
            .map(|host| place(host))
            .collect::<Result<Vec<_>, _>>()?;
        Self::start_at([place(master)?, place(replica)?], sentinels, master_name).await
    }

    /// Starts the master, its replica and three sentinels (quorum 2) on
    /// loopback, as [`start_in`](Self::start_in) does on a lab.
    ///
    /// # Errors
    ///
    /// As [`start_in`](Self::start_in).
    pub async fn start(master_name: &str) -> Result<Self, HarnessError> {
        let sentinels = vec![Placement::loopback(); LOOPBACK_SENTINELS];
        Self::start_at(
            [Placement::loopback(), Placement::loopback()],
            sentinels,
            master_name,
        )
        .await
    }

    async fn start_at(
        [master, replica]: [Placement; 2],
        sentinels: Vec<Placement>,
        master_name: &str,
    ) -> Result<Self, HarnessError> {
        // Full syncs start at once (the default waits 5 s for more
        // replicas); either node may become the master.
        let fast_sync = ["--repl-diskless-sync-delay", "0"];
        let nodes = [
            RedisServer::start_at(master, &fast_sync).await?,
            RedisServer::start_at(replica, &fast_sync).await?,
        ];
        let mut group = Self {
            nodes,
            sentinels: Vec::with_capacity(sentinels.len()),
        };
        group.replicate(1, 0)?;
        group.nodes[1]
            .wait_replica_synced(SENTINEL_GROUP_TIMEOUT)
            .await?;
        let quorum = sentinels.len() / 2 + 1;
        let watched = (group.nodes[0].addr(), group.nodes[0].port());
        for place in sentinels {
            group
                .sentinels
                .push(RedisSentinel::start_at(place, master_name, watched, quorum).await?);
        }
        for sentinel in &group.sentinels {
            sentinel.wait_replica_known(SENTINEL_GROUP_TIMEOUT).await?;
        }
        Ok(group)
    }

    /// `redis+sentinel://<sentinel>,<sentinel>.../<master name>`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("{}:{}", s.addr(), s.port()))
            .collect();
        let name = self.sentinels.first().map_or("", |s| s.master_name());
        format!("redis+sentinel://{}/{name}", hosts.join(","))
    }

    /// The node started as the master.
    pub fn master(&mut self) -> &mut RedisServer {
        &mut self.nodes[0]
    }

    /// The node started as the replica.
    pub fn replica(&mut self) -> &mut RedisServer {
        &mut self.nodes[1]
    }

    /// Data node `index`: 0 the one started as the master, 1 its replica.
    ///
    /// # Panics
    ///
    /// When `index` is not 0 or 1.
    pub fn node(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// Both data nodes, as [`node`](Self::node) numbers them.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The sentinels.
    pub fn sentinels(&mut self) -> &mut [RedisSentinel] {
        &mut self.sentinels
    }

    /// The data node (0 or 1, as [`node`](Self::node)) a majority of the
    /// sentinels name the master now.
    ///
    /// # Errors
    ///
    /// When no node is named by a majority (the sentinels do not answer,
    /// or disagree, as they do for a moment during a failover).
    pub fn current_master(&self) -> Result<usize, HarnessError> {
        let views = self.master_views();
        let majority = self.sentinels.len() / 2 + 1;
        (0..self.nodes.len())
            .find(|i| views.iter().filter(|v| v.as_ref() == Ok(i)).count() >= majority)
            .ok_or_else(|| Self::no_master(&views))
    }

    /// The data node every sentinel names the master now, while none of
    /// them sees it down or has a failover under way (its flags are
    /// `master` alone, [`RedisSentinel::master_flags`]).
    ///
    /// # Errors
    ///
    /// When a sentinel does not answer with a node of the group, they
    /// disagree, or one of them sees the master down or is failing over.
    pub fn agreed_master(&self) -> Result<usize, HarnessError> {
        let views = self.master_views();
        let master = match views.first() {
            Some(Ok(first)) if views.iter().all(|v| v.as_ref() == Ok(first)) => *first,
            _ => return Err(Self::no_master(&views)),
        };
        for sentinel in &self.sentinels {
            let flags = sentinel.master_flags()?;
            if flags != "master" {
                return Err(HarnessError::Setup {
                    what: format!("sentinel {}:{}", sentinel.addr(), sentinel.port()),
                    output: format!("master flags {flags}"),
                });
            }
        }
        Ok(master)
    }

    /// What each sentinel names the master: a node of the group, or what
    /// it said instead.
    fn master_views(&self) -> Vec<Result<usize, String>> {
        self.sentinels
            .iter()
            .map(|sentinel| {
                let (addr, port) = sentinel.master_addr().map_err(|e| e.to_string())?;
                self.nodes
                    .iter()
                    .position(|n| n.addr().to_string() == addr && n.port() == port)
                    .ok_or_else(|| format!("{addr}:{port}"))
            })
            .collect()
    }

    fn no_master(views: &[Result<usize, String>]) -> HarnessError {
        let views: Vec<String> = views
            .iter()
            .map(|v| match v {
                Ok(i) => format!("node {i}"),
                Err(other) => other.clone(),
            })
            .collect();
        HarnessError::Setup {
            what: "asking the sentinels for the master".to_owned(),
            output: views.join("; "),
        }
    }

    /// Makes data node `replica` a replica of data node `master`
    /// (`REPLICAOF`; nothing changes when it already is one).
    ///
    /// # Errors
    ///
    /// As [`RedisServer::cli`].
    pub fn replicate(&self, replica: usize, master: usize) -> Result<(), HarnessError> {
        let (addr, port) = (
            self.nodes[master].addr().to_string(),
            self.nodes[master].port().to_string(),
        );
        self.nodes[replica]
            .cli(&["REPLICAOF", &addr, &port])
            .map(|_| ())
    }

    /// Whether data node `index` says it is a master (`INFO replication`);
    /// `false` when it does not answer.
    pub fn is_master(&self, index: usize) -> bool {
        self.nodes[index]
            .cli(&["INFO", "replication"])
            .is_ok_and(|info| info.contains("role:master"))
    }

    /// Whether data node `replica` is a replica of data node `master`
    /// with its link up; `false` when it does not answer.
    pub fn is_replica_of(&self, replica: usize, master: usize) -> bool {
        let Ok(info) = self.nodes[replica].cli(&["INFO", "replication"]) else {
            return false;
        };
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
                .map(str::to_owned)
        };
        let master = &self.nodes[master];
        field("role").as_deref() == Some("slave")
            && field("master_host") == Some(master.addr().to_string())
            && field("master_port") == Some(master.port().to_string())
            && field("master_link_status").as_deref() == Some("up")
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
