//! Interop with nats-py (PyPI `nats-py`, installed by
//! `scripts/legacy-clients.sh`, run with `DISTLOCK_LEGACY_PYTHON`): a
//! Python client doing a KV `create` on the same key and our lock exclude
//! each other both ways, on one nats-server.

mod common;

use std::process::Stdio;
use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::nats::{BUCKET, NatsServer};
use lock_core::{LockBackend, LockBackendExt, LockKey};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const TTL: Duration = Duration::from_secs(5);

struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Peer {
    async fn start(python: &std::path::Path, server: &NatsServer) -> Self {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/nats_py_peer.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(format!("nats://127.0.0.1:{}", server.port()))
            .arg(BUCKET)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the nats-py peer");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut peer = Self {
            child,
            stdin,
            lines,
        };
        assert_eq!(peer.read().await, "ready");
        peer
    }

    async fn read(&mut self) -> String {
        let line = tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
            .await
            .expect("the peer answers")
            .expect("read");
        if let Some(line) = line {
            return line;
        }
        let mut stderr = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = tokio::io::AsyncReadExt::read_to_string(&mut err, &mut stderr).await;
        }
        let status = self.child.wait().await;
        panic!("the nats-py peer exited ({status:?}): {stderr}");
    }

    async fn ask(&mut self, command: &str) -> String {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        self.read().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_py_create_and_our_lock_exclude_each_other() {
    let Some(python) = conformance::legacy::legacy_python().or_skip() else {
        return;
    };
    let Some(server) = NatsServer::start().await.or_skip() else {
        return;
    };
    // Ours first: it creates the bucket the peer opens.
    let ours = lock_nats::connect(&server.url(BUCKET))
        .await
        .expect("connect");
    let mut peer = Peer::start(&python, &server).await;
    let key: LockKey = common::key("jobs/interop");
    let kv_key = ours.kv_key(&key);
    assert_eq!(kv_key, key.as_str(), "a plain key is the KV key as it is");

    // We hold it: the peer's create is refused.
    let lease = ours.try_acquire(&key, TTL).await.unwrap().expect("free");
    assert_eq!(peer.ask(&format!("create {kv_key}")).await, "exists");
    assert!(ours.release(&lease).await.unwrap());

    // Released (a purge marker is left): the peer's create succeeds.
    let answer = peer.ask(&format!("create {kv_key}")).await;
    assert!(answer.starts_with("ok "), "{answer}");
    // The peer holds it: our try and a short wait are refused.
    assert!(ours.try_acquire(&key, TTL).await.unwrap().is_none());
    let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
    let waited = ours.acquire(&key, TTL, deadline).await.unwrap_err();
    assert!(waited.is_contended(), "{waited}");
    let info = ours.inspect(&key).await.unwrap().expect("held by the peer");
    assert_eq!(info.holder, "nats-py-peer");

    // The peer deletes it: a waiter of ours is woken and takes it.
    let waiter = {
        let (ours, key) = (ours.clone(), key.clone());
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            ours.acquire(&key, TTL, deadline).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(peer.ask(&format!("delete {kv_key}")).await, "deleted");
    let lease = waiter.await.unwrap().expect("woken by the peer's delete");
    assert_eq!(peer.ask(&format!("create {kv_key}")).await, "exists");
    assert!(ours.release(&lease).await.unwrap());
    peer.stdin.write_all(b"exit\n").await.unwrap();
}
