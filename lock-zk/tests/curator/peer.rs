//! The Curator peer process of `tests/curator.rs`: `CuratorPeer.java`
//! compiled once per test process against Debian's jars, run with commands
//! on stdin and answers routed by request id.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use lock_zk::ZkBackend;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::time::timeout;

use crate::common::Standalone;

const JAVA_SOURCE: &str = include_str!("CuratorPeer.java");

/// The jars the peer needs, with the Debian package that installs each.
const JARS: &[(&str, &str)] = &[
    ("curator-recipes", "libcurator-recipes-java"),
    ("curator-framework", "libcurator-framework-java"),
    ("curator-client", "libcurator-client-java"),
    ("zookeeper", "libzookeeper-java"),
    ("zookeeper-jute", "libzookeeper-java"),
    ("guava", "libguava-java"),
    ("slf4j-api", "libslf4j-java"),
    ("slf4j-nop", "libslf4j-java"),
    ("netty-handler", "libnetty-java"),
    ("netty-transport", "libnetty-java"),
    ("netty-common", "libnetty-java"),
    ("netty-buffer", "libnetty-java"),
    ("netty-codec", "libnetty-java"),
    ("netty-resolver", "libnetty-java"),
    ("netty-transport-native-epoll", "libnetty-java"),
    ("netty-transport-native-unix-common", "libnetty-java"),
    ("metrics-core", "libdropwizard-metrics-java"),
];

/// The class path, checked: a missing jar or `javac` is a failure naming
/// the package.
fn classpath() -> String {
    let mut parts = Vec::new();
    for (jar, package) in JARS {
        let path = format!("/usr/share/java/{jar}.jar");
        assert!(
            Path::new(&path).is_file(),
            "{path} is missing: install the Debian package {package} \
             (the Curator interop tests need libcurator-recipes-java and its dependencies)"
        );
        parts.push(path);
    }
    parts.join(":")
}

/// Compiles the peer once per test process; returns its class directory.
pub(crate) fn compiled() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let cp = classpath();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("curator-peer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("class dir");
        let source = dir.join("CuratorPeer.java");
        std::fs::write(&source, JAVA_SOURCE).expect("write the Java source");
        let out = std::process::Command::new("javac")
            .arg("-cp")
            .arg(&cp)
            .arg("-d")
            .arg(&dir)
            .arg(&source)
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run javac ({e}): install the Debian package default-jdk-headless")
            });
        assert!(
            out.status.success(),
            "javac failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

/// One Curator process: commands on stdin, answers routed by request id.
pub(crate) struct Peer {
    pub(crate) child: Child,
    stdin: tokio::sync::Mutex<ChildStdin>,
    routes: Arc<Mutex<HashMap<String, mpsc::UnboundedSender<String>>>>,
    next: std::sync::atomic::AtomicU64,
}

/// One Curator acquisition.
pub(crate) struct Request {
    pub(crate) id: String,
    pub(crate) answers: mpsc::UnboundedReceiver<String>,
}

impl Request {
    pub(crate) async fn answer(&mut self, within: Duration) -> String {
        timeout(within, self.answers.recv())
            .await
            .unwrap_or_else(|_| panic!("Curator request {} did not answer in {within:?}", self.id))
            .expect("Curator peer gone")
    }
}

impl Peer {
    pub(crate) async fn start(connect: &str, session_ms: u64) -> Self {
        let dir = compiled();
        let cp = format!("{}:{}", dir.display(), classpath());
        let mut child = Command::new("java")
            .args([
                "-Xshare:auto",
                "-XX:TieredStopAtLevel=1",
                "-XX:+UseSerialGC",
                "-cp",
            ])
            .arg(cp)
            .arg("CuratorPeer")
            .arg(connect)
            .arg(session_ms.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run java ({e}): install the Debian package default-jdk-headless")
            });
        let stdout = child.stdout.take().expect("stdout");
        let stdin = child.stdin.take().expect("stdin");
        let routes: Arc<Mutex<HashMap<String, mpsc::UnboundedSender<String>>>> = Arc::default();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        {
            let routes = routes.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                let mut ready = Some(ready_tx);
                while let Ok(Some(line)) = lines.next_line().await {
                    if line == "ready" {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    let (id, rest) = line.split_once(' ').unwrap_or((&line, ""));
                    if let Some(tx) = routes.lock().unwrap().get(id) {
                        let _ = tx.send(rest.to_owned());
                    }
                }
            });
        }
        timeout(Duration::from_secs(30), ready_rx)
            .await
            .expect("Curator peer did not connect within 30 s")
            .expect("Curator peer exited before connecting");
        Self {
            child,
            stdin: tokio::sync::Mutex::new(stdin),
            routes,
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub(crate) async fn send(&self, line: &str) {
        let mut stdin = self.stdin.lock().await;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to Curator peer");
        stdin.flush().await.expect("flush");
    }

    /// Starts an acquisition: `mutex|read|write <path> <wait ms>` or
    /// `sem <path> <wait ms> <limit> <count>`.
    pub(crate) async fn acquire(&self, command: &str) -> Request {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("c{n}");
        let (tx, rx) = mpsc::unbounded_channel();
        self.routes.lock().unwrap().insert(id.clone(), tx);
        self.send(&format!("{id} {command}")).await;
        Request { id, answers: rx }
    }

    /// Acquires and waits for the answer (`ok`, `busy`, `error ...`).
    pub(crate) async fn take(&self, command: &str) -> (Request, String) {
        let mut request = self.acquire(command).await;
        let answer = request.answer(Duration::from_secs(20)).await;
        (request, answer)
    }

    pub(crate) async fn release(&self, request: &mut Request) {
        self.send(&format!("{} release", request.id)).await;
        let answer = request.answer(Duration::from_secs(10)).await;
        assert_eq!(answer, "released", "Curator release of {}", request.id);
    }
}

pub(crate) async fn setup(n: usize) -> (Standalone, Vec<ZkBackend>, Peer) {
    // Compile first: missing Java or jars fail before anything starts.
    compiled();
    let target = Standalone::start()
        .await
        .expect("the Curator interop tests need ZooKeeper (Debian package zookeeper)");
    let mut backends = Vec::new();
    for _ in 0..n {
        backends.push(target.backend().await.expect("backend"));
    }
    let connect = target.base_url().trim_start_matches("zk://").to_owned();
    let peer = Peer::start(&connect, 2_000).await;
    (target, backends, peer)
}

impl Peer {
    /// Starts a Curator `LeaderLatch` on `path` with `participant` as its
    /// id; the returned request carries the latch's later answers.
    pub(crate) async fn latch(&self, path: &str, participant: &str) -> Request {
        let (request, answer) = self.take(&format!("latch {path} {participant}")).await;
        assert_eq!(answer, "started", "Curator latch on {path}");
        request
    }

    /// One latch command (`await <ms>`, `has`, `leader`, `close`) and its
    /// answer.
    pub(crate) async fn ask(&self, latch: &mut Request, command: &str) -> String {
        self.send(&format!("{} {command}", latch.id)).await;
        latch.answer(Duration::from_secs(20)).await
    }
}
