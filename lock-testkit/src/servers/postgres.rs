//! PostgreSQL on loopback, run as the `postgres` system user (it refuses
//! to run as root). The `postgres` binary is started directly (not through
//! `pg_ctl`), so pause / kill / restart reach the real server's process
//! group.

use std::process::Command;

use super::{Kind, LoopbackServer};
use crate::netns::{Lab, Placement};
use crate::process::{
    HarnessError, ServerProcess, ServerSpec, find_binary, free_port, run_setup, system_user,
    temp_dir,
};

/// The Debian package that provides PostgreSQL.
pub const PACKAGE: &str = "postgresql";

/// The database user created by `initdb` (trust authentication).
pub const USER: &str = "distlock";

/// One PostgreSQL server on a free loopback port, `fsync=off` (data in
/// `data/` of its [`dir`](LoopbackServer::dir), log in `postgres.log`). Its
/// [`process`](LoopbackServer::process) is the postmaster's: prefer
/// [`pause`](Self::pause), [`kill`](Self::kill) and
/// [`restart`](Self::restart), which also reach the backends.
pub type PostgresServer = LoopbackServer<Postgres>;

/// The [`Kind`] of a [`PostgresServer`]: dropped, it kills the postmaster
/// and every backend.
#[derive(Debug)]
pub struct Postgres;

impl Kind for Postgres {
    fn on_drop(server: &mut PostgresServer) {
        let _ = server.kill();
    }
}

impl PostgresServer {
    /// Initializes a cluster in a temporary directory and starts it.
    ///
    /// # Errors
    ///
    /// Missing binaries or `postgres` user, a failing `initdb`, or a server
    /// that does not start.
    pub async fn start() -> Result<Self, HarnessError> {
        let server = Self::start_at(Placement::loopback()).await?;
        server.wait_accepting().await?;
        Ok(server)
    }

    /// As [`start`](Self::start), in the namespace of `lab`'s host named
    /// `host`, listening on its address: reach it with
    /// [`url`](Self::url) from the other hosts' namespaces.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn start_in(lab: &Lab, host: &str) -> Result<Self, HarnessError> {
        let server = Self::start_at(Placement::on(lab, host)?).await?;
        server.wait_accepting().await?;
        Ok(server)
    }

    async fn start_at(place: Placement) -> Result<Self, HarnessError> {
        let postgres = find_binary("postgres", PACKAGE)?;
        let initdb = find_binary("initdb", PACKAGE)?;
        let user = system_user("postgres").ok_or_else(|| HarnessError::MissingBinary {
            binary: "postgres (system user)".to_owned(),
            package: PACKAGE.to_owned(),
        })?;
        let dir = temp_dir("postgres-")?;
        chown(dir.path(), user)?;
        let data = dir.path().join("data");
        let mut init = Command::new(&initdb);
        init.arg("-D")
            .arg(&data)
            .args(["-U", USER, "-A", "trust", "--no-sync", "-E", "UTF8"])
            .env("LC_ALL", "C");
        run_setup(init, Some(user), "initdb")?;
        if place.is_in_lab() {
            // initdb trusts 127.0.0.1 alone; the lab's clients come from
            // the other loopback-range addresses.
            use std::io::Write;
            let mut hba = std::fs::OpenOptions::new()
                .append(true)
                .open(data.join("pg_hba.conf"))?;
            writeln!(hba, "host all all 127.0.0.0/8 trust")?;
        }
        let port = free_port()?;
        let socket_dir = dir.path().display().to_string();
        let mut spec = ServerSpec::new(
            format!("postgres {}:{port}", place.addr()),
            postgres,
            dir.path().join("postgres.log"),
        )
        .args([
            "-D".to_owned(),
            data.display().to_string(),
            "-p".to_owned(),
            port.to_string(),
            "-c".to_owned(),
            format!("listen_addresses={}", place.addr()),
            "-k".to_owned(),
            socket_dir,
            "-c".to_owned(),
            "max_connections=200".to_owned(),
        ])
        .args(super::fast_only(&["-c", "fsync=off"]))
        .ready(place.ready(port));
        spec.netns = place.netns();
        spec.user = Some(user);
        spec.cwd = Some(dir.path().to_path_buf());
        let process = ServerProcess::start(spec).await?;
        Ok(Self::new(process, port, place, dir))
    }

    /// The port opens a little before the server accepts queries (startup
    /// recovery): wait for `pg_isready` when it is installed.
    async fn wait_accepting(&self) -> Result<(), HarnessError> {
        let Ok(isready) = find_binary("pg_isready", PACKAGE) else {
            return Ok(());
        };
        for _ in 0..200 {
            let status = self
                .placement()
                .command(&isready)
                .args(["-h", &self.addr().to_string(), "-p", &self.port.to_string()])
                .args(["-U", USER, "-d", "postgres"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()?;
            if status.success() {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Err(HarnessError::NotReady {
            name: format!("postgres {}:{}", self.addr(), self.port),
            log_tail: crate::process::log_tail(&self.dir.path().join("postgres.log")),
        })
    }

    /// Kills the server (SIGKILL of the postmaster and every backend, a
    /// crash) and starts it again on the same port and data directory,
    /// waiting until it accepts queries.
    ///
    /// # Errors
    ///
    /// When it does not come back.
    pub async fn restart(&mut self) -> Result<(), HarnessError> {
        self.kill()?;
        self.process.restart().await?;
        self.wait_accepting().await
    }

    /// Kills the postmaster and every backend with SIGKILL, and returns
    /// once they are gone (at most 10 s).
    ///
    /// The postmaster is frozen first, so that it forks no backend after
    /// its children are listed: one forked in between outlived the kill
    /// (it exits on its own once it notices the postmaster gone), and a
    /// postmaster started meanwhile refused to start ("pre-existing shared
    /// memory block ... is still in use"). Waiting for the killed backends
    /// closes the same window for the listed ones.
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent.
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        if let Some(pid) = self.process.pid()
            && !self.process.is_paused()
        {
            signal(pid, libc::SIGSTOP);
            // A postmaster that cannot be seen stopped has exited.
            let _ = crate::process::wait_stopped(pid, std::time::Duration::from_secs(5));
        }
        let children = self.children();
        for &pid in &children {
            signal(pid, libc::SIGKILL);
        }
        self.process.kill()?;
        wait_gone(&children, std::time::Duration::from_secs(10));
        Ok(())
    }

    /// Freezes the postmaster and every backend (SIGSTOP). PostgreSQL puts
    /// each backend in a session of its own (`setsid`), so signalling the
    /// postmaster's process group alone would leave open connections
    /// answering.
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent.
    pub fn pause(&mut self) -> Result<(), HarnessError> {
        self.process.pause()?;
        for pid in self.children() {
            signal(pid, libc::SIGSTOP);
        }
        Ok(())
    }

    /// Resumes what [`pause`](Self::pause) froze (SIGCONT).
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent.
    pub fn resume(&mut self) -> Result<(), HarnessError> {
        for pid in self.children() {
            signal(pid, libc::SIGCONT);
        }
        self.process.resume()
    }

    /// Whether [`pause`](Self::pause) is in force.
    pub fn is_paused(&self) -> bool {
        self.process.is_paused()
    }

    /// The postmaster's child processes (backends and workers), from /proc.
    fn children(&self) -> Vec<u32> {
        let Some(parent) = self.process.pid() else {
            return Vec::new();
        };
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(|entry| {
                let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                // The command may contain spaces: fields follow the last ')'.
                let after = &stat[stat.rfind(')')? + 1..];
                let ppid: u32 = after.split_whitespace().nth(1)?.parse().ok()?;
                (ppid == parent).then_some(pid)
            })
            .collect()
    }

    /// `postgres://distlock@<address>:<port>/postgres` (127.0.0.1, or
    /// the lab host's address for a server started with
    /// [`start_in`](Self::start_in)).
    pub fn url(&self) -> String {
        self.url_at(self.addr())
    }

    /// `postgres://distlock@<addr>:<port>/postgres`.
    pub fn url_at(&self, addr: std::net::Ipv4Addr) -> String {
        format!("postgres://{USER}@{addr}:{}/postgres", self.port)
    }
}

/// Waits (at most `timeout`) until none of `pids` runs: each is gone from
/// /proc or a zombie (a zombie holds no memory; with its parent killed it
/// waits for init to reap it).
fn wait_gone(pids: &[u32], timeout: std::time::Duration) {
    let deadline = std::time::Instant::now() + timeout;
    let running = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let state = stat[stat.rfind(')')? + 1..].trim_start().chars().next()?;
                Some(state != 'Z')
            })
            .unwrap_or(false)
    };
    while pids.iter().any(running) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) on a child process of our server; no memory is
        // shared. A process that already exited is ignored.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

fn chown(path: &std::path::Path, (uid, gid): (u32, u32)) -> Result<(), HarnessError> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| HarnessError::Io(std::io::Error::other(e)))?;
    // SAFETY: chown(2) on a NUL-terminated path we own; no memory is shared.
    let rc = unsafe { libc::chown(c_path.as_ptr(), uid, gid) };
    if rc == 0 {
        Ok(())
    } else {
        Err(HarnessError::Io(std::io::Error::last_os_error()))
    }
}
