//! Network faults in the kernel, not in a proxy: network namespaces on a
//! bridge, and a blackhole made of traffic-control queues.
//!
//! A userspace proxy cannot show what a real partition does to TCP: its
//! own sockets answer the server's keep-alive probes and its connections
//! end cleanly. A [`Lab`] makes one namespace per host (a server, a
//! holder, an observer, the members of a cluster) and a *wire* namespace
//! with a bridge; each host is joined to the bridge by a veth pair and has
//! a **loopback-range address** (`127.0.1.1`, `127.0.1.2`, ...) with
//! `route_localnet` set and `lo` left down, so nothing reaches any other
//! network. A server runs in its host's namespace
//! ([`ServerSpec::netns`](crate::process::ServerSpec::netns)), a client in
//! another, either as a process ([`Namespace::command`]) or as a thread
//! that enters it before it opens any socket ([`Namespace::spawn`], which
//! runs its own runtime there).
//!
//! [`Lab::isolate`] cuts a host off from every other one in the kernel,
//! [`Lab::cut_from`] from some hosts (a cluster member from its peers),
//! [`Lab::cut_connections`] only the TCP connections to one port of one
//! host, [`Lab::cut_connection`] a single one: the packets are dropped on the *wire's* side, on the bridge
//! ports' egress queues (an `htb` class of 8 bits per second and a
//! one-byte burst holding a `pfifo` of length 0), through `u32` filters
//! on the source address (and ports): on the port towards each end, for
//! the packets that come from the other end. No host drops a packet on its own
//! queue, where its TCP would take the drop for local congestion and
//! retry its keep-alive probe without counting it: each end sees the
//! other go silent, as across a real network. [`Lab::heal`] removes the
//! queues. Every namespace (and with it every veth end) is deleted on
//! drop; namespaces that a killed test process left behind are deleted by
//! the next [`Lab::new`].
//!
//! Needs root and iproute2 (`ip`, `tc`).

use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::process::{HarnessError, find_binary, run_to_end};

pub use crate::netns_thread::{spawn_in, spawn_runtime_in};

/// The Debian package with `ip` and `tc`.
pub const PACKAGE: &str = "iproute2";

/// The prefix of every namespace this module makes (`dlk<pid>x<n>...`).
const PREFIX: &str = "dlk";

/// One network namespace, deleted on drop.
#[derive(Debug)]
pub struct Namespace {
    name: String,
    ip: PathBuf,
}

impl Namespace {
    /// Makes a namespace named `<prefix><pid>x<n><role>`, with
    /// `route_localnet` set and `lo` down.
    fn create(role: &str) -> Result<Self, HarnessError> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let ip = find_binary("ip", PACKAGE)?;
        let name = format!(
            "{PREFIX}{}x{}{role}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        run_to_end(
            Command::new(&ip).args(["netns", "add", &name]),
            "ip netns add",
        )?;
        let ns = Self { name, ip };
        ns.run("sysctl", &["-qw", "net.ipv4.conf.all.route_localnet=1"])?;
        ns.run("sysctl", &["-qw", "net.ipv4.conf.default.route_localnet=1"])?;
        Ok(ns)
    }

    /// Its name (for `ip netns exec`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip netns exec NAME program`: a process in this namespace.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(&self.ip);
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Runs `program args` in the namespace to the end.
    ///
    /// # Errors
    ///
    /// [`HarnessError::Setup`] with its output when it fails.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<(), HarnessError> {
        let mut cmd = self.command(program);
        cmd.args(args);
        run_to_end(
            &mut cmd,
            &format!("{program} {} in {}", args.join(" "), self.name),
        )
    }

    /// Runs `work` on a new thread that has entered this namespace: every
    /// socket it (and every thread it starts, such as a runtime's workers)
    /// opens is in the namespace.
    ///
    /// # Errors
    ///
    /// The thread's result is an error when the namespace cannot be
    /// entered.
    pub fn spawn<F, R>(&self, work: F) -> std::thread::JoinHandle<std::io::Result<R>>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        spawn_in(self.path(), work)
    }

    /// Whether a TCP connection to `addr:port` from this namespace succeeds
    /// (within 500 ms).
    pub fn connects(&self, addr: Ipv4Addr, port: u16) -> bool {
        self.spawn(move || {
            std::net::TcpStream::connect_timeout(
                &(addr, port).into(),
                std::time::Duration::from_millis(500),
            )
            .is_ok()
        })
        .join()
        .is_ok_and(|r| r.unwrap_or(false))
    }

    /// `/run/netns/NAME`, what `setns` opens.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new(&self.ip)
            .args(["netns", "delete", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// One host of a [`Lab`]: a namespace on the bridge with one address.
#[derive(Debug)]
pub struct Host {
    name: String,
    addr: Ipv4Addr,
    /// Its veth end in the wire's namespace (a bridge port).
    port: String,
    netns: Namespace,
}

impl Host {
    /// The name it was given in [`Lab::new`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its address (`127.0.1.N`).
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// Its namespace.
    pub fn netns(&self) -> &Namespace {
        &self.netns
    }
}

/// Hosts on one bridge, each in a namespace of its own (see the module
/// docs). Dropped, it deletes every namespace it made.
#[derive(Debug)]
pub struct Lab {
    hosts: Vec<Host>,
    wire: Namespace,
    tc: PathBuf,
    /// The bridge ports that have the dropping queues.
    shaped: std::sync::Mutex<Vec<String>>,
}

/// One condition of a dropping filter (all of a filter's must hold).
#[derive(Clone, Copy, Debug)]
enum DropMatch {
    /// The packet's source address.
    From(Ipv4Addr),
    /// A TCP packet to this port.
    ToPort(u16),
    /// A TCP packet from this port.
    FromPort(u16),
}

impl DropMatch {
    /// Its words in a `tc filter ... u32` command (the ports assume an IP
    /// header without options, as every packet here has).
    fn u32_words(self) -> Vec<String> {
        let words: Vec<String> = match self {
            Self::From(addr) => vec!["ip".into(), "src".into(), format!("{addr}/32")],
            Self::ToPort(port) => vec![
                "ip".into(),
                "protocol".into(),
                "6".into(),
                "0xff".into(),
                "match".into(),
                "ip".into(),
                "dport".into(),
                port.to_string(),
                "0xffff".into(),
            ],
            Self::FromPort(port) => vec![
                "ip".into(),
                "protocol".into(),
                "6".into(),
                "0xff".into(),
                "match".into(),
                "ip".into(),
                "sport".into(),
                port.to_string(),
                "0xffff".into(),
            ],
        };
        std::iter::once("match".to_owned()).chain(words).collect()
    }
}

impl Lab {
    /// Makes a host per name, `127.0.1.1` for the first, `127.0.1.2` for
    /// the second, and so on, all on one bridge (after deleting what a
    /// killed test process left behind).
    ///
    /// # Errors
    ///
    /// [`HarnessError::MissingBinary`] without iproute2; a setup error when
    /// this process may not make namespaces (not root), or with more than
    /// 250 hosts.
    pub fn new(names: &[&str]) -> Result<Self, HarnessError> {
        remove_orphans();
        let ip = find_binary("ip", PACKAGE)?;
        let tc = find_binary("tc", PACKAGE)?;
        if names.len() > 250 {
            return Err(HarnessError::Setup {
                what: "Lab::new".into(),
                output: "at most 250 hosts".into(),
            });
        }
        let wire = Namespace::create("w")?;
        wire.run("ip", &["link", "add", "br0", "type", "bridge"])?;
        wire.run("ip", &["link", "set", "br0", "up"])?;
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let mut hosts = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let n = u8::try_from(i + 1).unwrap_or(u8::MAX);
            let addr = Ipv4Addr::new(127, 0, 1, n);
            let netns = Namespace::create(&format!("h{n}"))?;
            // Interface names are at most 15 bytes and are made in this
            // process's namespace first: unique per process and link.
            let link = NEXT.fetch_add(1, Ordering::Relaxed);
            let pid = std::process::id() % 100_000;
            let port = format!("dkw{pid}x{link}");
            let dev = format!("dkh{pid}x{link}");
            run_to_end(
                Command::new(&ip).args([
                    "link",
                    "add",
                    &port,
                    "netns",
                    &wire.name,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &dev,
                    "netns",
                    &netns.name,
                ]),
                "ip link add (veth)",
            )?;
            wire.run("ip", &["link", "set", &port, "master", "br0"])?;
            wire.run("ip", &["link", "set", &port, "up"])?;
            netns.run(
                "sysctl",
                &["-qw", &format!("net.ipv4.conf.{dev}.route_localnet=1")],
            )?;
            netns.run("ip", &["addr", "add", &format!("{addr}/24"), "dev", &dev])?;
            netns.run("ip", &["link", "set", &dev, "up"])?;
            hosts.push(Host {
                name: (*name).to_owned(),
                addr,
                port,
                netns,
            });
        }
        Ok(Self {
            hosts,
            wire,
            tc,
            shaped: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Every host, in the order given to [`new`](Self::new).
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// A host other than `name` (to reach `name` from), if any.
    pub fn other_than(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name != name)
    }

    /// The host named `name`.
    ///
    /// # Panics
    ///
    /// When there is none (a test's own mistake).
    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name:?} in this lab"))
    }

    /// Cuts `name` off from every other host, both ways, until
    /// [`heal`](Self::heal): its packets are dropped on the wire (see the
    /// module docs).
    ///
    /// # Errors
    ///
    /// When `tc` fails.
    pub fn isolate(&self, name: &str) -> Result<(), HarnessError> {
        let others: Vec<&str> = self
            .hosts
            .iter()
            .filter(|h| h.name != name)
            .map(|h| h.name.as_str())
            .collect();
        self.cut_from(name, &others)
    }

    /// Cuts the links between `name` and each of `peers`, both ways, until
    /// [`heal`](Self::heal); every other link stays up (a cluster member
    /// cut from the other members while its clients still reach it, or a
    /// client cut from one member of several).
    ///
    /// # Errors
    ///
    /// When `tc` fails.
    pub fn cut_from(&self, name: &str, peers: &[&str]) -> Result<(), HarnessError> {
        let a = self.host(name);
        for peer in peers {
            let b = self.host(peer);
            self.drop_on(b, &[DropMatch::From(a.addr)])?;
            self.drop_on(a, &[DropMatch::From(b.addr)])?;
        }
        Ok(())
    }

    /// Cuts the TCP connections between host `client` and port `port` of
    /// host `server`, both ways, until [`heal`](Self::heal): every other
    /// packet between them (other ports, other protocols) still passes. A
    /// client cut from one server of several on one host, or from its
    /// server while its other traffic flows.
    ///
    /// # Errors
    ///
    /// When `tc` fails.
    pub fn cut_connections(
        &self,
        client: &str,
        server: &str,
        port: u16,
    ) -> Result<(), HarnessError> {
        let c = self.host(client);
        let s = self.host(server);
        self.drop_on(s, &[DropMatch::From(c.addr), DropMatch::ToPort(port)])?;
        self.drop_on(c, &[DropMatch::From(s.addr), DropMatch::FromPort(port)])
    }

    /// Cuts one TCP connection, between `client`'s port `client_port` and
    /// `server`'s port `port`, both ways, until [`heal`](Self::heal): the
    /// client's other connections (a pool's) still pass.
    ///
    /// # Errors
    ///
    /// When `tc` fails.
    pub fn cut_connection(
        &self,
        client: &str,
        client_port: u16,
        server: &str,
        port: u16,
    ) -> Result<(), HarnessError> {
        let c = self.host(client);
        let s = self.host(server);
        self.drop_on(
            s,
            &[
                DropMatch::From(c.addr),
                DropMatch::FromPort(client_port),
                DropMatch::ToPort(port),
            ],
        )?;
        self.drop_on(
            c,
            &[
                DropMatch::From(s.addr),
                DropMatch::FromPort(port),
                DropMatch::ToPort(client_port),
            ],
        )
    }

    /// Drops, on the egress queue of the bridge port towards `host`, every
    /// packet that meets all of `matches` (the port's queues are made the
    /// first time; each call adds a filter).
    fn drop_on(&self, host: &Host, matches: &[DropMatch]) -> Result<(), HarnessError> {
        let port = host.port.as_str();
        let mut shaped = self.shaped.lock().unwrap_or_else(|e| e.into_inner());
        if !shaped.iter().any(|p| p == port) {
            // Class 1:1 drops (8 bit/s, one-byte burst, a queue of 0);
            // class 1:2, the default, passes.
            let steps: [&[&str]; 4] = [
                &[
                    "qdisc", "replace", "dev", port, "root", "handle", "1:", "htb", "default", "2",
                ],
                &[
                    "class", "replace", "dev", port, "parent", "1:", "classid", "1:1", "htb",
                    "rate", "8bit", "ceil", "8bit", "burst", "1", "cburst", "1",
                ],
                &[
                    "class", "replace", "dev", port, "parent", "1:", "classid", "1:2", "htb",
                    "rate", "10gbit",
                ],
                &[
                    "qdisc", "replace", "dev", port, "parent", "1:1", "handle", "10:", "pfifo",
                    "limit", "0",
                ],
            ];
            for step in steps {
                self.tc(step)?;
            }
            shaped.push(port.to_owned());
        }
        let mut filter: Vec<String> = [
            "filter", "add", "dev", port, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        for m in matches {
            filter.extend(m.u32_words());
        }
        filter.extend(["flowid".to_owned(), "1:1".to_owned()]);
        let words: Vec<&str> = filter.iter().map(String::as_str).collect();
        self.tc(&words)
    }

    fn tc(&self, args: &[&str]) -> Result<(), HarnessError> {
        let mut cmd = self.wire.command(&self.tc);
        cmd.args(args);
        run_to_end(&mut cmd, &format!("tc {}", args.join(" ")))
    }

    /// Lets every packet through again (undoes every cut).
    ///
    /// # Errors
    ///
    /// When `tc` fails for a reason other than nothing to remove.
    pub fn heal(&self) -> Result<(), HarnessError> {
        let mut shaped = self.shaped.lock().unwrap_or_else(|e| e.into_inner());
        for host in &self.hosts {
            let output = self
                .wire
                .command(&self.tc)
                .args(["qdisc", "del", "dev", &host.port, "root"])
                .stdin(Stdio::null())
                .output()?;
            let text = String::from_utf8_lossy(&output.stderr);
            if !output.status.success()
                && !text.contains("No such file")
                && !text.contains("Cannot delete qdisc with handle of zero")
            {
                return Err(HarnessError::Setup {
                    what: "tc qdisc del".into(),
                    output: text.into_owned(),
                });
            }
        }
        shaped.clear();
        Ok(())
    }

    /// Waits (at most `timeout`) until `addr:port` answers from every other
    /// host's namespace (a host cannot reach its own address: `lo` is down
    /// in its namespace, and local delivery goes through `lo`).
    ///
    /// # Errors
    ///
    /// [`HarnessError::NotReady`] when it does not.
    pub fn wait_listening(
        &self,
        addr: Ipv4Addr,
        port: u16,
        timeout: std::time::Duration,
    ) -> Result<(), HarnessError> {
        let until = std::time::Instant::now() + timeout;
        while !self
            .hosts
            .iter()
            .filter(|h| h.addr != addr)
            .all(|h| h.netns.connects(addr, port))
        {
            if std::time::Instant::now() >= until {
                return Err(HarnessError::NotReady {
                    name: format!("{addr}:{port} in a lab"),
                    log_tail: String::new(),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(())
    }
}

/// Where a test server runs: on `127.0.0.1` in this process's namespace
/// (the default), or on a lab host's address in that host's namespace
/// ([`Placement::on`]), where it is checked and set up from another host's
/// namespace (a host cannot reach its own address). The spawners of
/// [`crate::servers`] take one, so that every server kind can be put on a
/// lab host the same way.
#[derive(Clone, Debug)]
pub struct Placement {
    addr: Ipv4Addr,
    /// The server's namespace (`/run/netns/NAME`), for a lab host.
    netns: Option<PathBuf>,
    /// Another host's namespace (name and path), and `ip`, to reach the
    /// server from.
    reach_from: Option<(String, PathBuf, PathBuf)>,
}

impl Default for Placement {
    fn default() -> Self {
        Self::loopback()
    }
}

impl Placement {
    /// `127.0.0.1` in this process's namespace.
    pub fn loopback() -> Self {
        Self {
            addr: Ipv4Addr::LOCALHOST,
            netns: None,
            reach_from: None,
        }
    }

    /// `lab`'s host named `host`: its namespace and address, reached from
    /// the first other host (any host can reach every other one until
    /// [`Lab::isolate`]).
    ///
    /// # Errors
    ///
    /// A setup error when the lab has no other host; a missing `ip`.
    pub fn on(lab: &Lab, host: &str) -> Result<Self, HarnessError> {
        let prober = lab.other_than(host).ok_or_else(|| HarnessError::Setup {
            what: format!("placing a server on lab host {host:?}"),
            output: "the lab needs another host to reach the server from".into(),
        })?;
        Self::on_via(lab, host, prober.name())
    }

    /// `lab`'s host named `host`, as [`on`](Self::on), reached from the
    /// host named `from` (one that the faults of a test leave connected
    /// to it).
    ///
    /// # Errors
    ///
    /// A setup error when `from` is `host`; a missing `ip`.
    ///
    /// # Panics
    ///
    /// When the lab has no host of either name (a test's own mistake).
    pub fn on_via(lab: &Lab, host: &str, from: &str) -> Result<Self, HarnessError> {
        if host == from {
            return Err(HarnessError::Setup {
                what: format!("placing a server on lab host {host:?}"),
                output: "a host cannot reach its own address: probe from another".into(),
            });
        }
        let prober = lab.host(from);
        let host = lab.host(host);
        Ok(Self {
            addr: host.addr(),
            netns: Some(host.netns().path()),
            reach_from: Some((
                prober.netns().name().to_owned(),
                prober.netns().path(),
                find_binary("ip", PACKAGE)?,
            )),
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// The namespace to start the server in
    /// ([`ServerSpec::netns`](crate::process::ServerSpec::netns)); `None`
    /// for this process's.
    pub fn netns(&self) -> Option<PathBuf> {
        self.netns.clone()
    }

    /// Whether it is on a lab host.
    pub fn is_in_lab(&self) -> bool {
        self.netns.is_some()
    }

    /// The readiness check of a server listening on `port` here: a TCP
    /// connection from where it is reached.
    pub fn ready(&self, port: u16) -> crate::process::Ready {
        match &self.reach_from {
            None => crate::process::Ready::Port(port),
            Some((_, path, _)) => crate::process::Ready::Reachable {
                addr: self.addr,
                port,
                from: path.clone(),
            },
        }
    }

    /// A command run where the server can be reached from (a client tool:
    /// `redis-cli -h <addr>`, `pg_isready`...).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        match &self.reach_from {
            None => Command::new(program),
            Some((name, _, ip)) => {
                let mut cmd = Command::new(ip);
                cmd.args(["netns", "exec", name]).arg(program);
                cmd
            }
        }
    }

    /// Runs `work` where the server can be reached from (on a thread in
    /// that namespace for a lab host), and returns its result.
    ///
    /// # Errors
    ///
    /// When the namespace cannot be entered.
    pub fn reach<F, R>(&self, work: F) -> std::io::Result<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        match &self.reach_from {
            None => Ok(work()),
            Some((_, path, _)) => spawn_in(path.clone(), work)
                .join()
                .map_err(|_| std::io::Error::other("the probe thread panicked"))?,
        }
    }
}

/// Deletes namespaces of ours whose process is gone.
fn remove_orphans() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    let Ok(ip) = find_binary("ip", PACKAGE) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('x').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new(&ip)
                .args(["netns", "delete", &name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}
