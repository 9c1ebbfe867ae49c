//! [`Connection`]: one NATS client, its JetStream context and the bucket,
//! with every request bounded by the configured timeout.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::kv::{self, Store, Watch};
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::stream::StorageType;
use async_nats::{HeaderMap, HeaderValue, header};
use bytes::Bytes;
use lock_core::{ErrorKind, LockError, LockKey, Operation};

use crate::NAME;
use crate::config::NatsConfig;
use crate::error::{client_error, connect_error, timed_out};

/// How long a delete marker (a release's purge, an expiry's marker) stays
/// in the bucket: the server's minimum per-message TTL.
pub(crate) const MARKER_TTL: Duration = Duration::from_secs(1);

/// What a conditioned write met.
#[derive(Debug)]
pub(crate) enum Write {
    /// Stored at this revision.
    Stored(u64),
    /// The key's last revision was not the expected one.
    Conflict,
}

/// The client, the JetStream context and the bucket.
#[derive(Debug)]
pub(crate) struct Connection {
    // Kept so the connection lives as long as the backend.
    _client: async_nats::Client,
    jetstream: async_nats::jetstream::Context,
    store: Store,
    timeout: Duration,
}

impl Connection {
    /// Connects to the first reachable server and opens the bucket,
    /// creating it (history 1, per-message TTL, limit markers, the
    /// configured replicas) when it does not exist.
    pub(crate) async fn open(config: &NatsConfig) -> Result<Self, LockError> {
        let servers: Vec<String> = config
            .servers
            .iter()
            .map(|s| {
                if s.host.contains(':') {
                    format!("nats://[{}]:{}", s.host, s.port)
                } else {
                    format!("nats://{}:{}", s.host, s.port)
                }
            })
            .collect();
        let mut options = async_nats::ConnectOptions::new()
            .connection_timeout(config.connect_timeout)
            .request_timeout(Some(config.timeout));
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            options = options.user_and_password(user.clone(), password.expose().to_owned());
        }
        // The client tries each server once in turn: bound the whole.
        let budget = config.connect_timeout * u32::try_from(servers.len()).unwrap_or(u32::MAX)
            + config.timeout;
        let client = tokio::time::timeout(budget, options.connect(servers))
            .await
            .map_err(|_| timed_out(Operation::Connect, None))?
            .map_err(|e| {
                connect_error(ErrorKind::Unavailable, "cannot connect to a NATS server", e)
            })?;
        let mut jetstream = async_nats::jetstream::new(client.clone());
        jetstream.set_timeout(config.timeout);
        let store = tokio::time::timeout(config.timeout * 3, open_bucket(&jetstream, config))
            .await
            .map_err(|_| timed_out(Operation::Connect, None))??;
        if !store.stream.cached_info().config.allow_message_ttl {
            return Err(LockError::config(format!(
                "bucket {:?} has no per-message TTL: create it with limit markers \
                 (`nats kv add --marker-ttl 1s`), or let this backend create it",
                config.bucket
            ))
            .with_backend(NAME));
        }
        Ok(Self {
            _client: client,
            jetstream,
            store,
            timeout: config.timeout,
        })
    }

    async fn bounded<T>(
        &self,
        operation: Operation,
        key: &LockKey,
        request: impl Future<Output = T>,
    ) -> Result<T, LockError> {
        tokio::time::timeout(self.timeout, request)
            .await
            .map_err(|_| timed_out(operation, Some(key)))
    }

    fn subject(&self, kv_key: &str) -> String {
        let prefix = self.store.put_prefix.as_ref().unwrap_or(&self.store.prefix);
        format!("{prefix}{kv_key}")
    }

    /// Publishes `value` to `kv_key` if its last revision is `expected`
    /// (0: no message for the key), with a per-message TTL of `ttl`
    /// rounded up to whole seconds (the server's unit) and, for a purge,
    /// the KV purge headers.
    pub(crate) async fn write(
        &self,
        operation: Operation,
        key: &LockKey,
        kv_key: &str,
        change: Change,
        expected: u64,
        ttl: Duration,
    ) -> Result<Write, LockError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            HeaderValue::from(expected),
        );
        headers.insert(
            header::NATS_MESSAGE_TTL,
            HeaderValue::from(whole_seconds(ttl)),
        );
        let payload = match change {
            Change::Put(value) => value,
            Change::Purge => {
                headers.insert("KV-Operation", "PURGE");
                headers.insert(header::NATS_ROLLUP, "sub");
                Bytes::new()
            }
        };
        let subject = self.subject(kv_key);
        let context = &self.jetstream;
        let sent = self
            .bounded(operation, key, async {
                context
                    .publish_with_headers(subject, headers, payload)
                    .await?
                    .await
            })
            .await?;
        match sent {
            Ok(ack) => Ok(Write::Stored(ack.sequence)),
            Err(e) if is_wrong_last_sequence(&e) => Ok(Write::Conflict),
            Err(e) => Err(client_error(operation, key, e)),
        }
    }

    /// The key's last message (a value, or a delete, purge or expiry
    /// marker), if any, read from the stream's leader (`STREAM.MSG.GET`,
    /// not a direct get, which any replica may answer from behind).
    pub(crate) async fn last(
        &self,
        operation: Operation,
        key: &LockKey,
        kv_key: &str,
    ) -> Result<Option<Last>, LockError> {
        let subject = format!("{}{kv_key}", self.store.prefix);
        let got = self
            .bounded(
                operation,
                key,
                self.store.stream.get_last_raw_message_by_subject(&subject),
            )
            .await?;
        match got {
            Ok(message) => {
                let marker = message
                    .headers
                    .get("KV-Operation")
                    .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"))
                    || message.headers.get(header::NATS_MARKER_REASON).is_some();
                Ok(Some(Last {
                    revision: message.sequence,
                    is_value: !marker,
                    value: message.payload,
                }))
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(client_error(operation, key, e)),
        }
    }

    /// A watch of the bucket's new entries (deletes, purges and expiry
    /// markers included), for a waiter on `key`.
    pub(crate) async fn watch_bucket(&self, key: &LockKey) -> Result<Watch, LockError> {
        self.bounded(Operation::Acquire, key, self.store.watch_all())
            .await?
            .map_err(|e| client_error(Operation::Acquire, key, e))
    }
}

/// JetStream's "wrong last sequence" (error code 10164): async-nats
/// names it by kind from one server, but passes it as `Other` with the
/// server's error as source from a clustered stream.
fn is_wrong_last_sequence(error: &PublishError) -> bool {
    if error.kind() == PublishErrorKind::WrongLastSequence {
        return true;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(e) = source {
        let text = e.to_string();
        if text.contains("10164") || text.contains("wrong last sequence") {
            return true;
        }
        source = e.source();
    }
    false
}

/// A key's last message.
#[derive(Debug)]
pub(crate) struct Last {
    /// Its revision (stream sequence).
    pub(crate) revision: u64,
    /// A value, not a delete, purge or expiry marker.
    pub(crate) is_value: bool,
    /// The value.
    pub(crate) value: Bytes,
}

/// What a conditioned write stores.
pub(crate) enum Change {
    /// A value (a grant or a renewal).
    Put(Bytes),
    /// A purge of the key's history (a release).
    Purge,
}

/// A TTL in the server's unit, rounded up: the server never frees a key
/// before its holder's local validity ends.
pub(crate) fn whole_seconds(ttl: Duration) -> u64 {
    ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)
}

async fn open_bucket(
    jetstream: &async_nats::jetstream::Context,
    config: &NatsConfig,
) -> Result<Store, LockError> {
    if let Ok(store) = jetstream.get_key_value(config.bucket.clone()).await {
        return Ok(store);
    }
    let created = jetstream
        .create_key_value(kv::Config {
            bucket: config.bucket.clone(),
            description: "distlock locks".into(),
            history: 1,
            storage: StorageType::File,
            num_replicas: config.replicas.unwrap_or(1),
            limit_markers: Some(MARKER_TTL),
            ..kv::Config::default()
        })
        .await;
    match created {
        Ok(store) => Ok(store),
        // Another client may have created it in between.
        Err(create) => jetstream
            .get_key_value(config.bucket.clone())
            .await
            .map_err(|_| {
                connect_error(
                    ErrorKind::Unavailable,
                    "cannot open or create the JetStream key-value bucket",
                    create,
                )
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_seconds() {
        assert_eq!(whole_seconds(Duration::from_millis(1000)), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(2500)), 3);
    }
}
