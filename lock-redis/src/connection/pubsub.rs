//! Release notifications: one pub/sub connection per node, shared by every
//! waiter of the backend, subscribed only to the channels someone waits on.
//!
//! A waiting acquire watches a channel only after its first try found the
//! key held (see `Waiting::take`), so an uncontended acquire never
//! touches the pub/sub connection; the connection itself is made on the
//! first subscription and kept (idle) afterwards.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use lock_core::RetryPolicy;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::connection::node::Node;

enum Command {
    Subscribe(String, oneshot::Sender<()>),
    Unsubscribe(String),
}

struct Entry {
    refs: usize,
    notify: Arc<Notify>,
}

struct Shared {
    channels: Mutex<HashMap<String, Entry>>,
    commands: Vec<mpsc::UnboundedSender<Command>>,
}

impl Shared {
    fn channels(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wake_all(&self) {
        for entry in self.channels().values() {
            entry.notify.notify_waiters();
        }
    }
}

/// The subscriber tasks of one backend (one per node).
pub(crate) struct Notifier {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    confirm_timeout: Duration,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("nodes", &self.tasks.len())
            .finish_non_exhaustive()
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Notifier {
    /// Starts one subscriber task per node (they connect lazily, when the
    /// first waiter subscribes). Must run inside a Tokio runtime.
    pub(crate) fn new(nodes: &[Arc<Node>], confirm_timeout: Duration) -> Self {
        let mut receivers = Vec::new();
        let mut commands = Vec::new();
        for _ in nodes {
            let (tx, rx) = mpsc::unbounded_channel();
            commands.push(tx);
            receivers.push(rx);
        }
        let shared = Arc::new(Shared {
            channels: Mutex::new(HashMap::new()),
            commands,
        });
        let tasks = nodes
            .iter()
            .zip(receivers)
            .map(|(node, rx)| tokio::spawn(subscriber(node.clone(), Arc::downgrade(&shared), rx)))
            .collect();
        Self {
            shared,
            tasks,
            confirm_timeout,
        }
    }

    /// Registers interest in `channel`; the first watcher of a channel waits
    /// (boundedly) until the subscription is confirmed, so a release after
    /// this returns is not missed.
    pub(crate) async fn watch(&self, channel: &str, deadline: tokio::time::Instant) -> Watch {
        let mut confirmations = Vec::new();
        let notify = {
            let mut channels = self.shared.channels();
            let entry = channels.entry(channel.to_owned()).or_insert_with(|| Entry {
                refs: 0,
                notify: Arc::new(Notify::new()),
            });
            entry.refs += 1;
            if entry.refs == 1 {
                for tx in &self.shared.commands {
                    let (reply, confirmed) = oneshot::channel();
                    if tx
                        .send(Command::Subscribe(channel.to_owned(), reply))
                        .is_ok()
                    {
                        confirmations.push(confirmed);
                    }
                }
            }
            entry.notify.clone()
        };
        let watch = Watch {
            shared: self.shared.clone(),
            channel: channel.to_owned(),
            notify,
        };
        if !confirmations.is_empty() {
            // A node that cannot subscribe drops its reply at once; a slow
            // one is not waited for past the timeout (waiters re-check anyway).
            let until = deadline.min(tokio::time::Instant::now() + self.confirm_timeout);
            let _ =
                tokio::time::timeout_at(until, futures_util::future::join_all(confirmations)).await;
        }
        watch
    }
}

/// Interest in one channel; unsubscribes when the last watcher is dropped.
pub(crate) struct Watch {
    shared: Arc<Shared>,
    channel: String,
    notify: Arc<Notify>,
}

impl Watch {
    /// Woken (all waiters at once) when a release is published on the
    /// channel or a subscriber reconnects.
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut channels = self.shared.channels();
        if let Some(entry) = channels.get_mut(&self.channel) {
            entry.refs = entry.refs.saturating_sub(1);
            if entry.refs == 0 {
                channels.remove(&self.channel);
                // Sent under the lock so a later re-subscribe is ordered after it.
                for tx in &self.shared.commands {
                    let _ = tx.send(Command::Unsubscribe(self.channel.clone()));
                }
            }
        }
    }
}

async fn subscriber(
    node: Arc<Node>,
    shared: Weak<Shared>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let policy = RetryPolicy {
        initial: Duration::from_millis(50),
        max: Duration::from_secs(2),
        multiplier: 2,
        max_attempts: None,
    };
    let mut backoff = policy.backoff();
    let timeout = node.timeout();
    // Replies owed to waiters whose subscription waits for a connection.
    let mut owed: Vec<oneshot::Sender<()>> = Vec::new();
    loop {
        // Connect only while someone waits.
        let wanted = |shared: &Weak<Shared>| {
            shared
                .upgrade()
                .map(|s| s.channels().keys().cloned().collect::<Vec<_>>())
        };
        let Some(current) = wanted(&shared) else {
            return;
        };
        if current.is_empty() {
            match commands.recv().await {
                None => return,
                // A subscription is wanted: connect, then confirm it (the
                // channel is in the registry and gets subscribed below).
                Some(Command::Subscribe(_, reply)) => owed.push(reply),
                Some(Command::Unsubscribe(_)) => continue,
            }
        }
        let pubsub = match node.pubsub().await {
            Ok(pubsub) => pubsub,
            Err(err) => {
                tracing::debug!(node = node.label(), %err, "pub/sub connection failed; waiters fall back to re-checks");
                let delay = backoff.next_delay().unwrap_or(policy.max);
                let sleep = tokio::time::sleep(delay);
                tokio::pin!(sleep);
                // Drain commands meanwhile: unconfirmed subscribers are told
                // at once (by dropping the reply) instead of waiting.
                owed.clear();
                loop {
                    tokio::select! {
                        () = &mut sleep => break,
                        cmd = commands.recv() => if cmd.is_none() { return },
                    }
                }
                continue;
            }
        };
        let (mut sink, mut stream) = pubsub.split();
        let mut current = wanted(&shared).unwrap_or_default();
        current.dedup();
        if !current.is_empty()
            && !matches!(
                tokio::time::timeout(timeout, sink.subscribe(&current)).await,
                Ok(Ok(()))
            )
        {
            continue;
        }
        backoff = policy.backoff();
        for reply in owed.drain(..) {
            let _ = reply.send(());
        }
        // A release may have been published while we were not subscribed.
        if let Some(shared) = shared.upgrade() {
            shared.wake_all();
        }
        loop {
            tokio::select! {
                message = stream.next() => {
                    let Some(message) = message else { break };
                    let Some(shared) = shared.upgrade() else { return };
                    if let Some(entry) = shared.channels().get(message.get_channel_name()) {
                        entry.notify.notify_waiters();
                    }
                }
                command = commands.recv() => {
                    let ok = match command {
                        None => return,
                        Some(Command::Subscribe(channel, reply)) => {
                            let ok = matches!(
                                tokio::time::timeout(timeout, sink.subscribe(&channel)).await,
                                Ok(Ok(()))
                            );
                            if ok {
                                let _ = reply.send(());
                            }
                            ok
                        }
                        Some(Command::Unsubscribe(channel)) => matches!(
                            tokio::time::timeout(timeout, sink.unsubscribe(&channel)).await,
                            Ok(Ok(()))
                        ),
                    };
                    if !ok {
                        break;
                    }
                }
            }
        }
        tracing::debug!(node = node.label(), "pub/sub connection lost; reconnecting");
        // Waiters re-check now rather than at their next interval.
        if let Some(shared) = shared.upgrade() {
            shared.wake_all();
        }
    }
}
