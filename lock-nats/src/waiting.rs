//! [`Waiting`]: a waiting grant, woken by a watch on the bucket.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::kv::Operation as KvOperation;
use futures_util::StreamExt;
use lock_core::{ErrorKind, LockError, LockKey, Operation, OwnerId, random_delay};
use tokio::sync::broadcast;
use tokio::time::{Instant, sleep_until};

use crate::NAME;
use crate::connection::Connection;
use crate::error::timed_out;
use crate::grants::Grants;

/// How long a waiter trusts the watch before it tries again anyway (a
/// watch that a server restart or a leader change cut without a word).
pub const RECHECK: Duration = Duration::from_millis(500);

/// How long a try may take when the waiting deadline is due or past.
const LAST_TRY: Duration = Duration::from_millis(250);

/// How often the watch task checks whether anyone still waits; it ends
/// (and its consumer with it) when nobody does.
const IDLE_CHECK: Duration = Duration::from_secs(5);

/// Keys freed in the bucket (deletes, purges and expiry markers), from
/// one watch of the whole bucket per backend value, opened by the first
/// waiter and closed when no waiter is left. One JetStream consumer per
/// backend, however many keys it waits for: a consumer per wait would
/// linger on the server (ordered consumers are removed 30 s after their
/// client lets go) and hit the stream's consumer limit.
#[derive(Debug, Default)]
struct Freed {
    sender: Mutex<Option<broadcast::Sender<Arc<str>>>>,
}

impl Freed {
    /// A receiver of freed keys, opening the watch when none runs.
    async fn subscribe(
        self: &Arc<Self>,
        connection: &Connection,
        key: &LockKey,
    ) -> Result<broadcast::Receiver<Arc<str>>, LockError> {
        if let Some(sender) = self
            .sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            return Ok(sender.subscribe());
        }
        let mut watch = connection.watch_bucket(key).await?;
        let mut slot = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = slot.as_ref() {
            // Another waiter opened one meanwhile; ours is dropped.
            return Ok(sender.subscribe());
        }
        let (sender, receiver) = broadcast::channel(1024);
        *slot = Some(sender.clone());
        drop(slot);
        let freed = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    next = watch.next() => next,
                    () = tokio::time::sleep(IDLE_CHECK) => {
                        if sender.receiver_count() == 0 {
                            break;
                        }
                        continue;
                    }
                };
                match next {
                    Some(Ok(entry)) if entry.operation == KvOperation::Put => {}
                    Some(Ok(entry)) => {
                        let _ = sender.send(entry.key.into());
                    }
                    Some(Err(_)) | None => break,
                }
            }
            // Closed: the next waiter opens a new watch; the current ones
            // see their receiver close and recheck on their own.
            let mut slot = freed.sender.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.as_ref().is_some_and(|s| s.same_channel(&sender)) {
                *slot = None;
            }
        });
        Ok(receiver)
    }
}

/// Waits for a key: tries the create, and while the key is held tries
/// again whenever the bucket's watch reports the key deleted, purged or
/// expired (and every [`RECHECK`] at the latest).
#[derive(Debug, Clone)]
pub(crate) struct Waiting {
    connection: Arc<Connection>,
    grants: Grants,
    freed: Arc<Freed>,
}

impl Waiting {
    pub(crate) fn new(connection: Arc<Connection>, grants: Grants) -> Self {
        Self {
            connection,
            grants,
            freed: Arc::default(),
        }
    }

    /// Takes `kv_key` for `owner` before `deadline`: its revision and the
    /// instant the successful request was sent.
    pub(crate) async fn take(
        &self,
        key: &LockKey,
        kv_key: &str,
        owner: OwnerId,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<(u64, Instant), LockError> {
        let mut freed: Option<broadcast::Receiver<Arc<str>>> = None;
        loop {
            let sent_at = Instant::now();
            // A try answers by the deadline (or shortly after, for a
            // deadline that is due): a server without a stream leader
            // would otherwise hold it for the whole request timeout. A
            // create cut off here may still land: its key then expires
            // with its TTL.
            let bound = deadline.max(sent_at + LAST_TRY);
            let tried = tokio::time::timeout_at(
                bound,
                self.grants
                    .try_take(Operation::Acquire, key, kv_key, owner, ttl),
            )
            .await
            .map_err(|_| timed_out(Operation::Acquire, Some(key)))?;
            if let Some(revision) = tried? {
                return Ok((revision, sent_at));
            }
            if Instant::now() >= deadline {
                return Err(contended(key));
            }
            // Subscribed after the first try, then tried again at once: a
            // release between the try and the subscription is not missed.
            let Some(receiver) = freed.as_mut() else {
                let opened = self.freed.subscribe(&self.connection, key);
                match tokio::time::timeout_at(deadline, opened).await {
                    Ok(receiver) => freed = Some(receiver?),
                    Err(_) => return Err(contended(key)),
                }
                continue;
            };
            let recheck = (Instant::now() + RECHECK + random_delay(RECHECK / 4)).min(deadline);
            let closed = loop {
                tokio::select! {
                    next = receiver.recv() => match next {
                        Ok(freed_key) if &*freed_key == kv_key => break false,
                        Ok(_) => {}
                        Err(broadcast::error::RecvError::Lagged(_)) => break false,
                        Err(broadcast::error::RecvError::Closed) => break true,
                    },
                    () = sleep_until(recheck) => break false,
                }
            };
            if closed {
                freed = None;
            }
        }
    }
}

fn contended(key: &LockKey) -> LockError {
    LockError::new(
        ErrorKind::Contended,
        Operation::Acquire,
        "the key was still held at the deadline",
    )
    .with_key(key)
    .with_backend(NAME)
}
