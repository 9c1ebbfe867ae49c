//! The pieces the legacy-layout tests share: a `Contender` (anything that
//! can try, wait for and release a lock on a Redis key: our backend, a
//! redis-py or node-redlock process, Redisson's scripts), the exclusion
//! check run in both directions, and the peer processes.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use conformance::process::in_ci;
use lock_core::{ErrorKind, Lease, LockBackend, LockBackendExt, LockKey};
use lock_redis::RedisBackend;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Mutex;
use tokio::time::{Instant, timeout};

/// The TTL every contender's lock gets.
pub const TTL: Duration = Duration::from_secs(5);
/// How long a "short wait" lasts.
pub const SHORT_WAIT_MS: u64 = 300;
/// How long the other side may take to get the key after a release.
pub const HANDOFF_WAIT_MS: u64 = 3000;

/// Something that locks a Redis key.
#[async_trait]
pub trait Contender: Send + Sync {
    fn name(&self) -> String;
    /// One try: `true` when it got the lock.
    async fn try_lock(&self, key: &str) -> Result<bool, String>;
    /// Waits up to `ms` for the lock.
    async fn wait_lock(&self, key: &str, ms: u64) -> Result<bool, String>;
    /// Releases the lock it holds on `key`: `true` when it was still its own.
    async fn unlock(&self, key: &str) -> Result<bool, String>;
}

/// Our backend as a contender (one lease per key).
pub struct Ours {
    pub label: String,
    pub backend: RedisBackend,
    pub leases: Mutex<HashMap<String, Lease>>,
}

impl Ours {
    pub fn new(label: &str, backend: RedisBackend) -> Self {
        Self {
            label: label.to_owned(),
            backend,
            leases: Mutex::default(),
        }
    }

    pub async fn lease(&self, key: &str) -> Option<Lease> {
        self.leases.lock().await.get(key).cloned()
    }
}

fn lock_key(key: &str) -> Result<LockKey, String> {
    LockKey::new(key).map_err(|e| e.to_string())
}

#[async_trait]
impl Contender for Ours {
    fn name(&self) -> String {
        self.label.clone()
    }

    async fn try_lock(&self, key: &str) -> Result<bool, String> {
        let lease = self
            .backend
            .try_acquire(&lock_key(key)?, TTL)
            .await
            .map_err(|e| e.to_string())?;
        let got = lease.is_some();
        if let Some(lease) = lease {
            self.leases.lock().await.insert(key.to_owned(), lease);
        }
        Ok(got)
    }

    async fn wait_lock(&self, key: &str, ms: u64) -> Result<bool, String> {
        let deadline = Instant::now() + Duration::from_millis(ms);
        match self.backend.acquire(&lock_key(key)?, TTL, deadline).await {
            Ok(lease) => {
                self.leases.lock().await.insert(key.to_owned(), lease);
                Ok(true)
            }
            Err(err) if err.kind() == ErrorKind::Contended => Ok(false),
            Err(err) => Err(err.to_string()),
        }
    }

    async fn unlock(&self, key: &str) -> Result<bool, String> {
        let Some(lease) = self.leases.lock().await.remove(key) else {
            return Ok(false);
        };
        self.backend
            .release(&lease)
            .await
            .map_err(|e| e.to_string())
    }
}

/// One direction: `first` takes `key`; while it holds it, `second`'s try
/// and short wait are refused; after `first` releases, `second` gets it
/// within [`HANDOFF_WAIT_MS`] (and releases). Every violation is reported.
pub async fn excludes(
    first: &dyn Contender,
    second: &dyn Contender,
    key: &str,
) -> Result<(), String> {
    let (a, b) = (first.name(), second.name());
    if !first.try_lock(key).await? {
        return Err(format!("{a} could not take the free key {key}"));
    }
    let mut problems = Vec::new();
    if second.try_lock(key).await? {
        problems.push(format!("{b}'s try got {key} while {a} held it"));
        second.unlock(key).await?;
    }
    if second.wait_lock(key, SHORT_WAIT_MS).await? {
        problems.push(format!("{b}'s short wait got {key} while {a} held it"));
        second.unlock(key).await?;
    }
    if !first.unlock(key).await? {
        problems.push(format!("{a}'s release found {key} not its own"));
    }
    if second.wait_lock(key, HANDOFF_WAIT_MS).await? {
        if !second.unlock(key).await? {
            problems.push(format!("{b}'s release found {key} not its own"));
        }
    } else {
        problems.push(format!("{b} did not get {key} after {a} released it"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// Both directions, each on a fresh key of its own (`<key>` and `<key>-b`).
pub async fn excludes_both_ways(
    x: &dyn Contender,
    y: &dyn Contender,
    key: &str,
) -> Result<(), String> {
    let one = excludes(x, y, key).await;
    let two = excludes(y, x, &format!("{key}-b")).await;
    match (one, two) {
        (Ok(()), Ok(())) => Ok(()),
        (one, two) => Err(format!("{:?} / {:?}", one.err(), two.err())),
    }
}

/// A random suffix for a test's keys.
pub fn unique(name: &str) -> String {
    format!("{name}-{}", &lock_core::OwnerId::random().to_hex()[..8])
}

/// A missing legacy client: a failure under CI, a printed skip otherwise.
fn missing(what: &str, message: String) -> Option<PathBuf> {
    assert!(!in_ci(), "CI requires the legacy clients: {message}");
    eprintln!("SKIPPED ({what} missing): {message}");
    None
}

/// The virtualenv python with redis-py (`DISTLOCK_LEGACY_PYTHON`, by
/// default `target/legacy-clients/venv/bin/python`), or `None` (skip;
/// under CI a failure naming the installer).
pub fn python() -> Option<PathBuf> {
    conformance::OrSkip::or_skip(conformance::legacy::legacy_python())
}

/// The folder with node-redlock's `node_modules` (`DISTLOCK_LEGACY_NODE_DIR`,
/// by default `target/legacy-clients/node`), or `None` (skip) when it or
/// `node` is missing.
pub fn node_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("DISTLOCK_LEGACY_NODE_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/legacy-clients/node"),
        PathBuf::from,
    );
    let has_node = std::process::Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if has_node && dir.join("node_modules/redlock/package.json").is_file() {
        return Some(dir);
    }
    missing(
        "node-redlock",
        format!(
            "node or {}/node_modules/redlock is missing: run scripts/legacy-clients.sh (it \
             installs Debian's nodejs and npm, then redlock 4.2.0 and ioredis; \
             DISTLOCK_LEGACY_NODE_DIR overrides the folder)",
            dir.display()
        ),
    )
}

/// A legacy client as a process: one command a line on stdin, one answer a
/// line on stdout (see `tests/legacy/*_peer.*`).
pub struct Peer {
    label: String,
    _child: Child,
    io: Mutex<(ChildStdin, Lines<BufReader<ChildStdout>>)>,
}

impl Peer {
    /// Starts `program args...` and waits for its `ready`.
    pub async fn start(label: &str, mut command: Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the {label} peer: {e}"));
        let stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = timeout(Duration::from_secs(30), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("the {label} peer was not ready within 30 s"));
        assert_eq!(
            first.ok().flatten().as_deref(),
            Some("ready"),
            "the {label} peer did not start"
        );
        Self {
            label: label.to_owned(),
            _child: child,
            io: Mutex::new((stdin, lines)),
        }
    }

    /// The redis-py `Lock` peer on one server.
    pub async fn redis_py(python: &PathBuf, port: u16) -> Self {
        let mut command = Command::new(python);
        command
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/legacy/redis_py_peer.py"
            ))
            .arg("127.0.0.1")
            .arg(port.to_string())
            .arg(TTL.as_millis().to_string());
        Self::start("redis-py", command).await
    }

    /// The node-redlock peer on these servers (one, or a Redlock set).
    pub async fn redlock(node_dir: &std::path::Path, ports: &[u16]) -> Self {
        let mut command = Command::new("node");
        command
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/legacy/redlock_peer.js"
            ))
            .arg(TTL.as_millis().to_string())
            .args(ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .env("NODE_PATH", node_dir.join("node_modules"));
        Self::start("node-redlock", command).await
    }

    /// Sends one command and reads its answer.
    pub async fn ask(&self, line: &str) -> Result<String, String> {
        let mut io = self.io.lock().await;
        let (stdin, lines) = &mut *io;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(|e| format!("{} peer: {e}", self.label))?;
        stdin.flush().await.map_err(|e| e.to_string())?;
        let answer = timeout(Duration::from_secs(20), lines.next_line())
            .await
            .map_err(|_| format!("{} peer: no answer to {line:?}", self.label))?
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{} peer exited", self.label))?;
        if answer.starts_with("error") {
            return Err(format!("{} peer: {line:?}: {answer}", self.label));
        }
        Ok(answer)
    }
}

fn granted(answer: &str) -> Result<bool, String> {
    match answer.split_whitespace().next() {
        Some("ok") => Ok(true),
        Some("busy") => Ok(false),
        _ => Err(format!("unexpected answer {answer:?}")),
    }
}

#[async_trait]
impl Contender for Peer {
    fn name(&self) -> String {
        self.label.clone()
    }

    async fn try_lock(&self, key: &str) -> Result<bool, String> {
        granted(&self.ask(&format!("try {key}")).await?)
    }

    async fn wait_lock(&self, key: &str, ms: u64) -> Result<bool, String> {
        granted(&self.ask(&format!("wait {key} {ms}")).await?)
    }

    async fn unlock(&self, key: &str) -> Result<bool, String> {
        match self.ask(&format!("release {key}")).await?.as_str() {
            "released" => Ok(true),
            "not-held" => Ok(false),
            other => Err(format!("unexpected answer {other:?}")),
        }
    }
}
