//! The Curator peer process of `tests/curator.rs`: `CuratorPeer.java`
//! compiled once per test process against Debian's jars, run with commands
//! on stdin and answers routed by request id.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use lock_zk::ZkBackend;
use tokio::process::{Child, Command};

use crate::common::Standalone;
pub(crate) use crate::common::routed::Request;
use crate::common::routed::Routed;

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
    io: Routed,
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
        let io = Routed::start(
            &mut child,
            "Curator",
            "c",
            "Curator peer exited before connecting",
        )
        .await;
        Self { child, io }
    }

    pub(crate) async fn send(&self, line: &str) {
        self.io.send(line).await;
    }

    /// Starts an acquisition: `mutex|read|write <path> <wait ms>` or
    /// `sem <path> <wait ms> <limit> <count>`.
    pub(crate) async fn acquire(&self, command: &str) -> Request {
        self.io.request(command).await
    }

    /// Acquires and waits for the answer (`ok`, `busy`, `error ...`).
    pub(crate) async fn take(&self, command: &str) -> (Request, String) {
        self.io.take(command).await
    }

    pub(crate) async fn release(&self, request: &mut Request) {
        self.io.release(request).await;
    }
}

pub(crate) async fn setup(n: usize) -> (Standalone, Vec<ZkBackend>, Peer) {
    // Compile first: missing Java or jars fail before anything starts.
    compiled();
    let target = Standalone::start()
        .await
        .expect("the Curator interop tests need ZooKeeper (Debian package zookeeper)");
    let backends = target.backends(n).await;
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
