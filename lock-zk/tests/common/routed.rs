//! A peer process of the interop tests (Curator, kazoo): commands on its
//! stdin, each answer line routed by its request id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;
use tokio::time::timeout;

type Routes = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<String>>>>;

/// The peer's stdin and the routes of its answers.
pub struct Routed {
    name: &'static str,
    prefix: &'static str,
    stdin: tokio::sync::Mutex<ChildStdin>,
    routes: Routes,
    next: std::sync::atomic::AtomicU64,
}

/// One request and its answers.
pub struct Request {
    name: &'static str,
    pub id: String,
    pub answers: mpsc::UnboundedReceiver<String>,
}

impl Request {
    /// The next answer, which must come within `within`.
    pub async fn answer(&mut self, within: Duration) -> String {
        let name = self.name;
        timeout(within, self.answers.recv())
            .await
            .unwrap_or_else(|_| panic!("{name} request {} did not answer in {within:?}", self.id))
            .unwrap_or_else(|| panic!("{name} peer gone"))
    }

    /// No answer within `within` (still waiting).
    pub async fn silent(&mut self, within: Duration) -> bool {
        timeout(within, self.answers.recv()).await.is_err()
    }
}

impl Routed {
    /// Takes `child`'s stdin and stdout (both piped) and waits up to 30 s
    /// for its `ready` line; `exited` is the failure when it ends first.
    /// Request ids are `prefix` and a number; `name` names the peer in
    /// failures.
    pub async fn start(
        child: &mut Child,
        name: &'static str,
        prefix: &'static str,
        exited: &str,
    ) -> Self {
        let stdout = child.stdout.take().expect("stdout");
        let stdin = child.stdin.take().expect("stdin");
        let routes: Routes = Arc::default();
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
            .unwrap_or_else(|_| panic!("{name} peer did not connect within 30 s"))
            .unwrap_or_else(|_| panic!("{exited}"));
        Self {
            name,
            prefix,
            stdin: tokio::sync::Mutex::new(stdin),
            routes,
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Writes one command line.
    pub async fn send(&self, line: &str) {
        let mut stdin = self.stdin.lock().await;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap_or_else(|e| panic!("write to the {} peer: {e}", self.name));
        stdin.flush().await.expect("flush");
    }

    /// Sends `command` under a new request id; its answers come to the
    /// returned request.
    pub async fn request(&self, command: &str) -> Request {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("{}{n}", self.prefix);
        let (tx, rx) = mpsc::unbounded_channel();
        self.routes.lock().unwrap().insert(id.clone(), tx);
        self.send(&format!("{id} {command}")).await;
        Request {
            name: self.name,
            id,
            answers: rx,
        }
    }

    /// [`Routed::request`] and its first answer (within 20 s).
    pub async fn take(&self, command: &str) -> (Request, String) {
        let mut request = self.request(command).await;
        let answer = request.answer(Duration::from_secs(20)).await;
        (request, answer)
    }

    /// Releases what `request` holds: the peer must answer `released`.
    pub async fn release(&self, request: &mut Request) {
        self.send(&format!("{} release", request.id)).await;
        let answer = request.answer(Duration::from_secs(10)).await;
        assert_eq!(
            answer, "released",
            "{} release of {}",
            self.name, request.id
        );
    }
}
