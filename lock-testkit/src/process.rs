//! Real server processes for tests: found on PATH, started on free loopback
//! ports in temporary directories, paused, killed, restarted, and stopped on
//! drop.

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

/// Why the harness could not provide a server.
#[derive(Debug)]
#[non_exhaustive]
pub enum HarnessError {
    /// The server's binary is not installed.
    MissingBinary {
        /// The program looked for.
        binary: String,
        /// The Debian package that provides it.
        package: String,
    },
    /// The server started but did not become ready in time.
    NotReady {
        /// Which server.
        name: String,
        /// The end of its log, for diagnosis.
        log_tail: String,
    },
    /// A setup command failed.
    Setup {
        /// What was being done.
        what: String,
        /// Its output.
        output: String,
    },
    /// An I/O error while starting or signalling.
    Io(io::Error),
}

impl fmt::Display for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingBinary { binary, package } => write!(
                f,
                "`{binary}` not found: install the Debian package `{package}` (apt-get install -y {package})"
            ),
            Self::NotReady { name, log_tail } => {
                write!(
                    f,
                    "{name} did not become ready; end of its log:\n{log_tail}"
                )
            }
            Self::Setup { what, output } => write!(f, "{what} failed:\n{output}"),
            Self::Io(err) => write!(f, "I/O error: {err}"),
        }
    }
}

impl std::error::Error for HarnessError {}

impl From<io::Error> for HarnessError {
    fn from(err: io::Error) -> Self {
        Self::Io(err)
    }
}

/// Turns a harness result into "run" or "skip" for a test.
pub trait OrSkip<T> {
    /// `Some(value)` on success. A missing binary prints a skip notice with
    /// the install hint and returns `None` locally, but **panics under CI**
    /// (`CI` set in the environment): there a missing server is a failure,
    /// never a silent pass. Any other harness error panics.
    fn or_skip(self) -> Option<T>;
}

impl<T> OrSkip<T> for Result<T, HarnessError> {
    fn or_skip(self) -> Option<T> {
        match self {
            Ok(value) => Some(value),
            Err(err @ HarnessError::MissingBinary { .. }) => {
                if in_ci() {
                    panic!("CI requires every server: {err}");
                }
                eprintln!("SKIPPED (server missing): {err}");
                None
            }
            Err(err) => panic!("test server could not be started: {err}"),
        }
    }
}

/// Whether we run under CI (`CI` set to anything but `false`/`0`/empty).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Finds `binary` on PATH (and in the few places Debian puts server
/// binaries outside it), or names the `package` to install.
///
/// # Errors
///
/// [`HarnessError::MissingBinary`].
pub fn find_binary(binary: &str, package: &str) -> Result<PathBuf, HarnessError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let extra = [
        PathBuf::from("/usr/sbin"),
        PathBuf::from("/sbin"),
        PathBuf::from("/usr/lib/postgresql/15/bin"),
        PathBuf::from("/usr/lib/postgresql/16/bin"),
        PathBuf::from("/usr/lib/postgresql/17/bin"),
    ];
    std::env::split_paths(&path)
        .chain(extra)
        .map(|dir| dir.join(binary))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| HarnessError::MissingBinary {
            binary: binary.to_owned(),
            package: package.to_owned(),
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A free TCP port on 127.0.0.1 for a server this process is about to start.
///
/// A port the kernel hands out for `bind(0)` comes from its ephemeral range,
/// which is also where every outgoing connection on the machine takes its
/// local port: between our check and the server's own `bind`, a client of
/// some other test could take it, and the server (a ZooKeeper peer, say)
/// fails to start. Ports are therefore drawn below the ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`), where the kernel never
/// assigns one, and reserved across processes: each is `flock`ed through a
/// file in `$TMPDIR/distlock-test-ports` for the life of this process, so
/// two test binaries running at once never draw the same port.
///
/// # Errors
///
/// When no port can be bound.
pub fn free_port() -> Result<u16, HarnessError> {
    static TAKEN: Mutex<Vec<(u16, Option<std::fs::File>)>> = Mutex::new(Vec::new());
    let mut taken = TAKEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (low, high) = reserved_range();
    let span = u32::from(high - low);
    if span > 0 {
        let mut next = std::process::id().wrapping_mul(7919)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
        for _ in 0..256 {
            next = next.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let port = low + u16::try_from((next >> 8) % span).unwrap_or(0);
            if taken.iter().any(|(p, _)| *p == port) {
                continue;
            }
            let Some(reservation) = reserve(port) else {
                continue;
            };
            if TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).is_ok() {
                taken.push((port, Some(reservation)));
                return Ok(port);
            }
        }
    }
    // No room below the ephemeral range (or all of it busy): fall back to
    // the kernel's choice, remembered so that this process never hands it
    // out twice.
    for _ in 0..64 {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        let port = listener.local_addr()?.port();
        if !taken.iter().any(|(p, _)| *p == port) {
            taken.push((port, None));
            return Ok(port);
        }
    }
    Err(HarnessError::Io(io::Error::other("no free port found")))
}

/// Ports `free_port` draws from: from 20000 (or the ephemeral range's
/// start minus 8192, if lower) up to where the ephemeral range starts.
fn reserved_range() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let low = 20000.min(ephemeral_low.saturating_sub(8192)).max(1024);
    (low, ephemeral_low.max(low))
}

/// Locks `$TMPDIR/distlock-test-ports/<port>` for this process's life;
/// `None` when another process holds it.
fn reserve(port: u16) -> Option<std::fs::File> {
    // Made once per process, not once per port.
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    let dir = DIR
        .get_or_init(|| {
            let dir = std::env::temp_dir().join("distlock-test-ports");
            std::fs::create_dir_all(&dir).ok().map(|()| dir)
        })
        .as_ref()?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
        .ok()?;
    file.try_lock().ok()?;
    Some(file)
}

/// How to tell that a server is ready.
#[derive(Clone, Debug)]
pub enum Ready {
    /// A TCP connection to this loopback port succeeds.
    Port(u16),
    /// A TCP connection to `addr:port` from the network namespace at
    /// `from` (`/run/netns/NAME`) succeeds: a server on a lab host (see
    /// [`crate::netns::Placement`]).
    Reachable {
        /// The server's address.
        addr: Ipv4Addr,
        /// Its port.
        port: u16,
        /// The namespace to connect from.
        from: PathBuf,
    },
    /// A command exits with status 0 (e.g. `redis-cli ping`).
    Command(Vec<OsString>),
}

/// Everything needed to start (and restart) one server.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    /// A name for messages (`"redis-server :6379"`).
    pub name: String,
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Extra environment.
    pub env: Vec<(OsString, OsString)>,
    /// Working directory.
    pub cwd: Option<PathBuf>,
    /// Run as this user and group id (PostgreSQL refuses to run as root).
    pub user: Option<(u32, u32)>,
    /// Readiness checks, all of which must pass.
    pub ready: Vec<Ready>,
    /// How long to wait for readiness.
    pub ready_timeout: Duration,
    /// Where the server's stdout and stderr go.
    pub log: PathBuf,
    /// Run in this network namespace (its `/run/netns/NAME` path, see
    /// [`crate::netns`]) instead of this process's.
    pub netns: Option<PathBuf>,
}

impl ServerSpec {
    /// A spec with defaults: no env, no user change, 30 s readiness timeout.
    pub fn new(name: impl Into<String>, program: PathBuf, log: PathBuf) -> Self {
        Self {
            name: name.into(),
            program,
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
            user: None,
            ready: Vec::new(),
            ready_timeout: Duration::from_secs(30),
            log,
            netns: None,
        }
    }

    /// Appends arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Adds a readiness check.
    #[must_use]
    pub fn ready(mut self, ready: Ready) -> Self {
        self.ready.push(ready);
        self
    }
}

/// A running server process, in its own process group. Killed (the whole
/// group) on drop; also killed if the test process dies (parent-death
/// signal), so crashed tests leave nothing running.
#[derive(Debug)]
pub struct ServerProcess {
    spec: ServerSpec,
    child: Option<Child>,
    paused: bool,
}

impl ServerProcess {
    /// Starts the server and waits until it is ready.
    ///
    /// # Errors
    ///
    /// I/O errors, or [`HarnessError::NotReady`] with the log's tail.
    pub async fn start(spec: ServerSpec) -> Result<Self, HarnessError> {
        let mut server = Self {
            spec,
            child: None,
            paused: false,
        };
        server.spawn().await?;
        Ok(server)
    }

    async fn spawn(&mut self) -> Result<(), HarnessError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.spec.log)?;
        let mut cmd = Command::new(&self.spec.program);
        cmd.args(&self.spec.args)
            .envs(self.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(cwd) = &self.spec.cwd {
            cmd.current_dir(cwd);
        }
        self.child = Some(spawn_owned(cmd, self.spec.user, self.spec.netns.clone())?);
        self.paused = false;
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> Result<(), HarnessError> {
        let deadline = Instant::now() + self.spec.ready_timeout;
        for check in self.spec.ready.clone() {
            loop {
                if let Some(child) = &mut self.child
                    && let Ok(Some(status)) = child.try_wait()
                {
                    return Err(self.not_ready(&format!("exited with {status}")));
                }
                if check_ready(&check).await {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(self.not_ready("timed out"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    fn not_ready(&self, why: &str) -> HarnessError {
        HarnessError::NotReady {
            name: format!("{} ({why})", self.spec.name),
            log_tail: log_tail(&self.spec.log),
        }
    }

    /// The process id (of the group leader), while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The spec it was started with.
    pub fn spec(&self) -> &ServerSpec {
        &self.spec
    }

    /// Whether it is paused.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Freezes the whole process group (SIGSTOP): connections stay open but
    /// nothing is answered, like a long GC pause or a hung host. Returns once
    /// every thread of the server process is stopped.
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent, or the process does not stop within
    /// a few seconds (it died, or is a zombie).
    pub fn pause(&mut self) -> Result<(), HarnessError> {
        self.signal(libc::SIGSTOP)?;
        self.paused = true;
        // A signal is only queued when kill(2) returns: the server keeps
        // answering for a moment (over 15 ms seen for a loaded JVM). Wait
        // until it has really stopped, so a fault starts when we say.
        match self.pid() {
            Some(pid) => wait_stopped(pid, Duration::from_secs(5)),
            None => Ok(()),
        }
    }

    /// Resumes a paused server (SIGCONT).
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent.
    pub fn resume(&mut self) -> Result<(), HarnessError> {
        self.signal(libc::SIGCONT)?;
        self.paused = false;
        Ok(())
    }

    /// Kills the whole process group with SIGKILL and reaps it: a crash, no
    /// chance to flush anything.
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent.
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        if let Some(mut child) = self.child.take() {
            // Group-wide, so worker processes (PostgreSQL backends) die too.
            let _ = signal_group(child.id(), libc::SIGKILL);
            let _ = child.kill();
            child.wait()?;
        }
        self.paused = false;
        Ok(())
    }

    /// Stops politely (SIGTERM, then SIGKILL after `grace`).
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent.
    pub async fn stop(&mut self, grace: Duration) -> Result<(), HarnessError> {
        if let Some(child) = &mut self.child {
            if self.paused {
                let _ = signal_group(child.id(), libc::SIGCONT);
            }
            let _ = signal_group(child.id(), libc::SIGTERM);
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    self.child = None;
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.kill()
    }

    /// Kills (if running) and starts again with the same spec: same port,
    /// same data directory.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn restart(&mut self) -> Result<(), HarnessError> {
        self.kill()?;
        self.spawn().await
    }

    fn signal(&self, sig: libc::c_int) -> Result<(), HarnessError> {
        match &self.child {
            Some(child) => signal_group(child.id(), sig).map_err(HarnessError::Io),
            None => Err(HarnessError::Io(io::Error::other(format!(
                "{} is not running",
                self.spec.name
            )))),
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

fn signal_group(pid: u32, sig: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
    // SAFETY: kill(2) with a negative pid signals the process group we
    // created for this child; it has no memory-safety preconditions.
    let rc = unsafe { libc::kill(-pid, sig) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

async fn check_ready(check: &Ready) -> bool {
    match check {
        Ready::Port(port) => tokio::time::timeout(
            Duration::from_millis(500),
            tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, *port)),
        )
        .await
        .is_ok_and(|r| r.is_ok()),
        Ready::Reachable { addr, port, from } => {
            let (addr, port) = (*addr, *port);
            let connected = crate::netns_thread::spawn_in(from.clone(), move || {
                std::net::TcpStream::connect_timeout(
                    &SocketAddr::from((addr, port)),
                    Duration::from_millis(500),
                )
                .is_ok()
            });
            tokio::task::spawn_blocking(move || connected.join())
                .await
                .is_ok_and(|joined| matches!(joined, Ok(Ok(true))))
        }
        Ready::Command(argv) => {
            let Some((program, args)) = argv.split_first() else {
                return true;
            };
            let status = tokio::process::Command::new(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .status();
            matches!(
                tokio::time::timeout(Duration::from_secs(5), status).await,
                Ok(Ok(s)) if s.success()
            )
        }
    }
}

/// Waits until every thread of `pid` is in the stopped state (`T` in
/// `/proc/<pid>/task/*/stat`).
///
/// # Errors
///
/// When `/proc` cannot be read or the process is not stopped in time.
pub fn wait_stopped(pid: u32, timeout: Duration) -> Result<(), HarnessError> {
    let deadline = std::time::Instant::now() + timeout;
    let tasks = PathBuf::from(format!("/proc/{pid}/task"));
    loop {
        let mut states = Vec::new();
        for entry in std::fs::read_dir(&tasks)?.flatten() {
            // A thread may exit between the listing and the read.
            if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat"))
                && let Some((_, rest)) = stat.rsplit_once(')')
                && let Some(state) = rest.trim_start().chars().next()
            {
                states.push(state);
            }
        }
        if !states.is_empty() && states.iter().all(|s| matches!(s, 'T' | 't')) {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(HarnessError::Io(std::io::Error::other(format!(
                "process {pid} not stopped {timeout:?} after SIGSTOP (thread states {states:?})"
            ))));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The last lines of a log file.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Runs a setup command to completion (e.g. `initdb`), as `user` if given.
///
/// # Errors
///
/// [`HarnessError::Setup`] with its output when it fails.
pub fn run_setup(
    mut cmd: Command,
    user: Option<(u32, u32)>,
    what: &str,
) -> Result<(), HarnessError> {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    run_to_end(&mut cmd, what)
}

/// Runs `cmd` to completion, stdin closed.
///
/// # Errors
///
/// [`HarnessError::Setup`] named `what`, with its output, when it fails.
pub(crate) fn run_to_end(cmd: &mut Command, what: &str) -> Result<(), HarnessError> {
    let output = cmd.stdin(Stdio::null()).output()?;
    if output.status.success() {
        Ok(())
    } else {
        Err(HarnessError::Setup {
            what: what.to_owned(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }
}

/// The latest `Instant` this platform has (std does not say where time
/// ends: found by taking every step that still fits), for tests of
/// deadlines near it.
pub fn end_of_time() -> Instant {
    let mut at = Instant::now();
    let mut step = Duration::from_secs(1 << 62);
    while !step.is_zero() {
        match at.checked_add(step) {
            Some(later) => at = later,
            None => step /= 2,
        }
    }
    at
}

type SpawnRequest = (
    Command,
    Option<(u32, u32)>,
    Option<PathBuf>,
    mpsc::Sender<io::Result<Child>>,
);

/// Spawns on one long-lived thread: the parent-death signal fires when the
/// *thread* that forked exits, and test threads end early.
fn spawn_owned(
    cmd: Command,
    user: Option<(u32, u32)>,
    netns: Option<PathBuf>,
) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("server-spawner".into())
            .spawn(move || {
                for (cmd, user, netns, reply) in rx {
                    let _ = reply.send(spawn_now(cmd, user, netns));
                }
            })
            .expect("spawning the server-spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    sender
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send((cmd, user, netns, reply_tx))
        .map_err(|_| io::Error::other("server spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("server spawner thread is gone"))?
}

fn spawn_now(
    mut cmd: Command,
    user: Option<(u32, u32)>,
    netns: Option<PathBuf>,
) -> io::Result<Child> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    // Entering a network namespace needs root: in the child it comes before
    // the change of user, which the closure then makes itself (std would
    // make it before any closure runs).
    let netns = netns.map(std::fs::File::open).transpose()?;
    let netns_fd = netns.as_ref().map(AsRawFd::as_raw_fd);
    if let Some((uid, gid)) = user
        && netns_fd.is_none()
    {
        cmd.uid(uid).gid(gid);
    }
    let late_user = user.filter(|_| netns_fd.is_some());
    cmd.process_group(0);
    // SAFETY: the closure runs in the forked child before exec and only
    // calls setns(2), setgroups(2), setgid(2), setuid(2), prctl(2) and
    // getppid(2), which are async-signal-safe; the namespace descriptor
    // stays open in the parent until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = netns_fd
                && libc::setns(fd, libc::CLONE_NEWNET) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if let Some((uid, gid)) = late_user
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0)
            {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() == 1 {
                return Err(io::Error::other("parent exited"));
            }
            Ok(())
        });
    }
    let child = cmd.spawn();
    drop(netns);
    child
}

/// The uid and gid of a system user (e.g. `postgres`), read from
/// `/etc/passwd`.
pub fn system_user(name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.first() == Some(&name) && fields.len() > 3 {
            Some((fields[2].parse().ok()?, fields[3].parse().ok()?))
        } else {
            None
        }
    })
}

/// A fresh temporary directory for one server.
///
/// # Errors
///
/// I/O errors.
pub fn temp_dir(prefix: &str) -> Result<tempfile::TempDir, HarnessError> {
    Ok(tempfile::Builder::new().prefix(prefix).tempdir()?)
}
