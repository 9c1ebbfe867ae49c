//! Other libraries' locks as processes: the legacy fleet of a migration.
//!
//! A [`LegacyPeer`] is one process running another library's lock (redis-py's
//! `Lock` on Redis, kazoo's `Lock` on ZooKeeper; `peer.py` beside this file),
//! driven one command at a time over stdin. The [`rollout`] module runs a
//! migration whose first phase is such a fleet.
//!
//! The Python is the virtualenv `scripts/legacy-clients.sh` installs
//! (`DISTLOCK_LEGACY_PYTHON`, by default `target/legacy-clients/venv/bin/python`
//! of the workspace); [`legacy_python`] reports it missing as a
//! [`HarnessError::MissingBinary`], so `or_skip` fails under CI.

pub mod rollout;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use lock_testkit::HarnessError;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::timeout;

const PEER: &str = include_str!("peer.py");

/// How long a peer may take to answer beyond the wait it was given.
const ANSWER_SLACK: Duration = Duration::from_secs(10);

/// Which legacy client a peer runs.
#[derive(Clone, Debug)]
pub enum LegacyKind {
    /// redis-py's `Lock`: `SET <key> <random token> NX PX <ttl>` on the
    /// exact key, released by a compare-and-delete script.
    RedisPy {
        /// Server host.
        host: String,
        /// Server port.
        port: u16,
    },
    /// kazoo's `Lock` on the ZooKeeper path `<key>`: ephemeral sequential
    /// `<id>__lock__<seq>` nodes; the session is the lease (no TTL).
    Kazoo {
        /// `host:port[,host:port...]`.
        hosts: String,
    },
}

impl LegacyKind {
    /// A short name for reports (`redis-py`, `kazoo`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::RedisPy { .. } => "redis-py",
            Self::Kazoo { .. } => "kazoo",
        }
    }

    fn args(&self) -> Vec<String> {
        match self {
            Self::RedisPy { host, port } => vec!["redis".into(), host.clone(), port.to_string()],
            Self::Kazoo { hosts } => vec!["kazoo".into(), hosts.clone()],
        }
    }
}

/// The legacy clients' Python.
///
/// # Errors
///
/// [`HarnessError::MissingBinary`] naming `scripts/legacy-clients.sh` when
/// it is not there.
pub fn legacy_python() -> Result<PathBuf, HarnessError> {
    let path = std::env::var_os("DISTLOCK_LEGACY_PYTHON").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../target/legacy-clients/venv/bin/python")
        },
        PathBuf::from,
    );
    if path.is_file() {
        Ok(path)
    } else {
        Err(HarnessError::MissingBinary {
            binary: path.display().to_string(),
            package: "kazoo and redis from PyPI: run scripts/legacy-clients.sh".to_owned(),
        })
    }
}

/// One legacy client process. Killed when dropped.
#[derive(Debug)]
pub struct LegacyPeer {
    kind: &'static str,
    _child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl LegacyPeer {
    /// Starts a peer and waits (at most 30 s) until it is connected.
    ///
    /// # Errors
    ///
    /// The process cannot start, exits, or does not connect in time.
    pub async fn start(python: &std::path::Path, kind: &LegacyKind) -> Result<Self, String> {
        let mut child = Command::new(python)
            .arg("-c")
            .arg(PEER)
            .args(kind.args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run {} ({e})", python.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let mut peer = Self {
            kind: kind.name(),
            _child: child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        };
        let ready = peer.answer(Duration::from_secs(30)).await?;
        if ready != "ready" {
            return Err(format!("{} peer did not start: {ready}", peer.kind));
        }
        Ok(peer)
    }

    async fn answer(&mut self, within: Duration) -> Result<String, String> {
        match timeout(within, self.lines.next_line()).await {
            Ok(Ok(Some(line))) => Ok(line),
            Ok(Ok(None)) => Err(format!("the {} peer exited", self.kind)),
            Ok(Err(e)) => Err(format!("reading the {} peer: {e}", self.kind)),
            Err(_) => Err(format!(
                "the {} peer did not answer in {within:?}",
                self.kind
            )),
        }
    }

    async fn call(&mut self, line: String, within: Duration) -> Result<String, String> {
        self.stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("writing to the {} peer: {e}", self.kind))?;
        self.answer(within).await
    }

    /// Takes the lock on `key`, waiting up to `wait` (zero: one try).
    /// `ttl` is the lock's expiry where the client has one (redis-py).
    /// `Ok(None)`: not granted. `Ok(Some(offset))`: granted; the
    /// successful try began `offset` after the command reached the peer
    /// (so after the call began), where the client's TTL starts; kazoo,
    /// whose lock lasts as long as its session, says zero.
    ///
    /// # Errors
    ///
    /// The client's error, or no answer within `wait` plus 10 s.
    pub async fn acquire(
        &mut self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Duration>, String> {
        let line = format!("acquire {key} {} {}\n", ttl.as_millis(), wait.as_millis());
        let answer = self.call(line, wait + ANSWER_SLACK).await?;
        match answer.split_once(' ').unwrap_or((answer.as_str(), "")) {
            ("busy", "") => Ok(None),
            ("ok", "") => Ok(Some(Duration::ZERO)),
            ("ok", ms) => ms
                .parse::<f64>()
                .ok()
                .filter(|ms| ms.is_finite() && *ms >= 0.0)
                .map(|ms| Some(Duration::from_secs_f64(ms / 1000.0)))
                .ok_or_else(|| format!("{} acquire {key}: bad answer {answer:?}", self.kind)),
            _ => Err(format!("{} acquire {key}: {answer}", self.kind)),
        }
    }

    /// Releases the lock on `key` this peer holds.
    ///
    /// # Errors
    ///
    /// The client's error (for redis-py, a lock that expired and is no
    /// longer its own), or no answer within 10 s.
    pub async fn release(&mut self, key: &str) -> Result<(), String> {
        match self
            .call(format!("release {key}\n"), ANSWER_SLACK)
            .await?
            .as_str()
        {
            "released" => Ok(()),
            other => Err(format!("{} release {key}: {other}", self.kind)),
        }
    }

    /// The client's name (`redis-py`, `kazoo`).
    pub fn kind(&self) -> &'static str {
        self.kind
    }
}
