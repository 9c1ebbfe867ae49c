//! The `etcd-client` crate alone: the driver's two transactions for a
//! mutex acquire + release on a free key, sent through the client library
//! the driver requires, with no lock-etcd code on the path but its key
//! layout.
//!
//! [`EtcdCrateAlone`] connects one `etcd_client::Client` on the crate's own
//! tonic channel with the driver's connect options (leader required, the
//! URL's connect timeout, an HTTP/2 keep-alive of 2 s that also runs while
//! idle, the URL's credentials), grants one lease of the URL's TTL and
//! keeps it alive on one stream (every TTL/3), as the driver's session.
//! A cycle is the `etcd_parts` probe's crate side, written once here for
//! `distlock-compare compare`:
//!
//! 1. the create transaction of etcd's concurrency mutex: put
//!    `<prefix>/<key>/<lease hex>` (value `<owner hex> <holder details>`)
//!    with the lease if absent, and read the oldest entry under the key in
//!    the same revision (the failure branch reads our entry and the same
//!    oldest one); granted when the oldest is ours;
//! 2. the guarded delete: delete the entry only while its create revision
//!    and owner value are ours.
//!
//! Each transaction is bounded by the URL's operation timeout, as the
//! driver bounds each. Between the hand floor
//! ([`EtcdFloor`](super::EtcdFloor): the same transactions in gRPC by hand
//! on one bare HTTP/2 connection) and the driver, this is the client
//! library's share. TLS URLs are refused (the floor beside it has none).

use std::time::Duration;

use async_trait::async_trait;
use conformance::bench::Contender;
use lock_core::{ErrorKind, LockError, LockKey, Operation, OwnerId, with_timeout};
use lock_etcd::EtcdConfig;
use lock_etcd::etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KvClient, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use lock_etcd::keys::{key_prefix, mutex_value, plain_entry};

use super::{NAME, ttl_secs};

/// The driver's HTTP/2 keep-alive: a ping every 2 s, 2 s to answer it.
const KEEP_ALIVE: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(2));

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

/// The oldest entry under a key's prefix (the holder), as the driver reads
/// it.
fn oldest_entry() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

impl EtcdCrateAlone {
    /// Parses `url` like [`lock_etcd::connect`], connects one client of the
    /// crate with the driver's options and grants its lease, kept alive
    /// until this is dropped.
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
        let (interval, timeout) = KEEP_ALIVE;
        let mut options = ConnectOptions::new()
            .with_require_leader(true)
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(interval, timeout)
            .with_keep_alive_while_idle(true);
        if let Some(user) = &config.user {
            options = options.with_user(user.clone(), config.password.clone().unwrap_or_default());
        }
        let urls: Vec<String> = config
            .endpoints
            .iter()
            .map(|endpoint| format!("http://{endpoint}"))
            .collect();
        let ttl = i64::try_from(ttl_secs(config.ttl))
            .map_err(|_| LockError::invalid_argument(op, "TTL too large for an etcd lease"))?;
        let budget = config.connect_timeout + config.op_timeout;
        let (client, lease_id, granted, keep) = with_timeout(budget, op, async {
            let mut client = Client::connect(&urls, Some(options))
                .await
                .map_err(|e| crate_error(op, &e))?;
            let lease = client
                .lease_grant(ttl, None)
                .await
                .map_err(|e| crate_error(op, &e))?;
            let keep = client
                .lease_keep_alive(lease.id())
                .await
                .map_err(|e| crate_error(op, &e))?;
            Ok((client, lease.id(), lease.ttl(), keep))
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
        let get_owner = TxnOp::get(prefix.as_str(), Some(oldest_entry()));
        let create = Txn::new()
            .when([Compare::create_revision(
                entry.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::put(
                    entry.as_str(),
                    mutex_value(owner),
                    Some(PutOptions::new().with_lease(self.lease_id)),
                ),
                get_owner.clone(),
            ])
            .or_else([TxnOp::get(entry.as_str(), None), get_owner]);
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
        let owner = owner.to_hex();
        let above = format!("{owner}!");
        let delete = Txn::new()
            .when([
                Compare::create_revision(entry.as_str(), CompareOp::Equal, revision),
                Compare::value(entry.as_str(), CompareOp::Greater, owner.as_str()),
                Compare::value(entry.as_str(), CompareOp::Less, above),
            ])
            .and_then([TxnOp::delete(entry.as_str(), None::<DeleteOptions>)]);
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
