//! The `etcd-client` crate alone: the driver's two transactions for a
//! mutex acquire + release on a free key, sent through the client library
//! the driver requires, with no lock-etcd code on the path but what builds
//! the requests.
//!
//! [`EtcdCrateAlone`] connects one `etcd_client::Client` on the crate's own
//! tonic channel with the driver's connect options
//! ([`EtcdConfig::client_options`]: leader required, the URL's connect
//! timeout, an HTTP/2 keep-alive that also runs while idle, the URL's
//! credentials), or takes a client it is given
//! ([`EtcdCrateAlone::on_client`]: the one a backend connected, or one on
//! another channel), grants one lease of the URL's TTL and keeps it alive
//! on one stream (every TTL/3), as the driver's session. A cycle, for
//! `distlock-compare compare` and the `etcd_parts` and `etcd_transport`
//! probes:
//!
//! 1. the create transaction of etcd's concurrency mutex
//!    ([`keys::create_txn`]): put `<prefix>/<key>/<lease hex>` (value
//!    `<owner hex> <holder details>`) with the lease if absent, and read the
//!    oldest entry under the key in the same revision (the failure branch
//!    reads our entry and the same oldest one); granted when the oldest is
//!    ours;
//! 2. the guarded delete ([`keys::guarded_delete`]): delete the entry only
//!    while its create revision and owner value are ours.
//!
//! Both requests are the driver's own builders, so they are the driver's
//! requests to the byte (but the owner id and the details' time). Each
//! transaction is bounded by the URL's operation timeout, as the driver
//! bounds each. Between the hand floor ([`EtcdFloor`](super::EtcdFloor):
//! the same transactions in gRPC by hand on one bare HTTP/2 connection)
//! and the driver, this is the client library's share. TLS URLs are
//! refused by [`EtcdCrateAlone::connect`] (the floor beside it has none).

use std::time::Duration;

use async_trait::async_trait;
use conformance::bench::Contender;
use lock_core::{ErrorKind, LockError, LockKey, Operation, OwnerId, with_timeout};
use lock_etcd::EtcdConfig;
use lock_etcd::etcd_client::{Client, KvClient, Txn, TxnOpResponse, TxnResponse};
use lock_etcd::keys::{self, key_prefix, mutex_value, plain_entry};

use super::{NAME, ttl_secs};

/// The driver's mutex cycle through `etcd-client` alone, on one client
/// and lease of its own; see the module docs.
///
/// Calls from several tasks share the client's channel: eight
/// independent clients are eight of these. Dropping it stops the
/// keep-alive and revokes the lease in the background.
pub struct EtcdCrateAlone {
    client: Client,
    /// Normalized prefix, without a trailing separator.
    prefix: String,
    lease_id: i64,
    lease_hex: String,
    op_timeout: Duration,
    keeper: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for EtcdCrateAlone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCrateAlone")
            .field("prefix", &self.prefix)
            .field("lease", &self.lease_hex)
            .finish_non_exhaustive()
    }
}

impl Drop for EtcdCrateAlone {
    fn drop(&mut self) {
        self.keeper.abort();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (mut client, lease) = (self.client.clone(), self.lease_id);
        runtime.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(2), client.lease_revoke(lease)).await;
        });
    }
}

/// An `etcd-client` error as a [`LockError`] of `operation`.
fn crate_error(operation: Operation, err: &lock_etcd::etcd_client::Error) -> LockError {
    LockError::new(
        ErrorKind::Backend,
        operation,
        format!("etcd-client alone: {err}"),
    )
    .with_backend(NAME)
}

impl EtcdCrateAlone {
    /// Parses `url` like [`lock_etcd::connect`], connects one client of the
    /// crate with the driver's options ([`EtcdConfig::client_options`])
    /// and grants its lease, kept alive until this is dropped.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for a bad URL or a TLS one;
    /// [`ErrorKind::Backend`] when etcd refuses the connection or the
    /// lease; `Timeout` past the URL's connect and operation timeouts.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave a granted lease behind; it expires
    /// with its TTL.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = EtcdConfig::from_url(url)?;
        config.validate()?;
        if config.tls.is_some() {
            return Err(LockError::config(
                "etcd-client alone is measured on plaintext members only (as the floor)",
            )
            .with_backend(NAME));
        }
        let op = Operation::Connect;
        let options = config.client_options()?;
        let client = with_timeout(config.connect_timeout + config.op_timeout, op, async {
            Client::connect(config.endpoint_urls(), Some(options))
                .await
                .map_err(|e| crate_error(op, &e))
        })
        .await?;
        Self::on_client(client, &config).await
    }

    /// The same on `client` (say the one a backend connected,
    /// [`EtcdBackend::client`](lock_etcd::EtcdBackend::client), or one on
    /// another channel), with `config`'s prefix, TTL and operation timeout:
    /// grants its lease there, kept alive until this is dropped.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Backend`] when etcd refuses the lease; `Timeout` past
    /// the operation timeout.
    ///
    /// # Cancel safety
    ///
    /// As [`EtcdCrateAlone::connect`].
    pub async fn on_client(mut client: Client, config: &EtcdConfig) -> Result<Self, LockError> {
        let op = Operation::Connect;
        let ttl = i64::try_from(ttl_secs(config.ttl))
            .map_err(|_| LockError::invalid_argument(op, "TTL too large for an etcd lease"))?;
        let (lease_id, granted, keep) = with_timeout(config.op_timeout, op, async {
            let lease = client
                .lease_grant(ttl, None)
                .await
                .map_err(|e| crate_error(op, &e))?;
            let keep = client
                .lease_keep_alive(lease.id())
                .await
                .map_err(|e| crate_error(op, &e))?;
            Ok((lease.id(), lease.ttl(), keep))
        })
        .await?;
        let every = Duration::from_secs(u64::try_from(granted).unwrap_or(1).max(1)) / 3;
        let (mut keeper, mut answers) = keep;
        let keeper = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if keeper.keep_alive().await.is_err() {
                    return;
                }
                if !matches!(answers.message().await, Ok(Some(_))) {
                    return;
                }
            }
        });
        Ok(Self {
            client,
            prefix: config.prefix.trim_end_matches('/').to_owned(),
            lease_id,
            lease_hex: format!("{lease_id:x}"),
            op_timeout: config.op_timeout,
            keeper,
        })
    }

    /// One transaction on a handle of the client's channel, bounded by
    /// the operation timeout.
    async fn txn(&self, op: Operation, txn: Txn) -> Result<TxnResponse, LockError> {
        let mut kv: KvClient = self.client.kv_client();
        with_timeout(self.op_timeout, op, async {
            kv.txn(txn).await.map_err(|e| crate_error(op, &e))
        })
        .await
    }

    /// The driver's two transactions on the free `key`.
    async fn exchange(&self, key: &LockKey) -> Result<(), LockError> {
        let op = Operation::Acquire;
        let prefix = key_prefix(&self.prefix, key);
        let entry = plain_entry(&prefix, &self.lease_hex);
        let owner = OwnerId::random();
        let create = keys::create_txn(&prefix, &entry, self.lease_id, mutex_value(owner));
        let created = self.txn(op, create).await?;
        let revision = created.header().map_or(0, |h| h.revision());
        let oldest = match created.op_responses().get(1) {
            Some(TxnOpResponse::Get(get)) => get.kvs().first().map(|kv| kv.create_revision()),
            _ => None,
        };
        if !created.succeeded() || oldest != Some(revision) {
            return Err(LockError::new(
                ErrorKind::Contended,
                op,
                "etcd-client alone: the key was held",
            ));
        }
        let delete = keys::guarded_delete(&entry, revision, owner);
        let deleted = self.txn(Operation::Release, delete).await?;
        if !deleted.succeeded() {
            return Err(LockError::new(
                ErrorKind::NotHeld,
                Operation::Release,
                "etcd-client alone: our entry was gone at release",
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl Contender for EtcdCrateAlone {
    /// One acquire + release of the free `key`: two transactions.
    async fn cycle(&self, key: &str) -> Result<(), LockError> {
        let key = LockKey::new(key)?;
        self.exchange(&key)
            .await
            .map_err(|e| e.with_key(&key).with_backend(NAME))
    }
}
