//! The raw floor of an acquire+release cycle, for benchmarks.
//!
//! [`EtcdFloor::cycle`] issues exactly the two transactions of the driver's
//! uncontended path, by hand with the same etcd client: the create
//! transaction of etcd's concurrency mutex (put `<prefix>/<key>/<lease hex>`
//! with a pre-granted lease if absent, and read the oldest entry under the
//! key in the same revision) and the guarded delete (delete the entry only if
//! its create revision and owner value are still ours). That is two round
//! trips per cycle, the same as [`EtcdBackend`](crate::EtcdBackend)'s
//! `try_acquire` + `release` once its session exists, without the driver's
//! bookkeeping (session table, entry-name registry, pending-entry cleanup,
//! lease objects and their session signals).
//!
//! The lease is granted once by [`EtcdFloor::connect`] (with the URL's
//! `ttl`) and kept alive for the floor's lifetime, like the driver's
//! session; no lease is granted per cycle.
//!
//! It exists so benchmarks (`distlock compare`, this crate's `bench`
//! example) can report "ours / floor" ratios measured in one run. It is not
//! a lock API: use [`EtcdBackend`](crate::EtcdBackend) for that.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use lock_core::{ErrorKind, LockError, LockKey, Operation, OwnerId, check_ttl, with_timeout};

use crate::config::EtcdConfig;
use crate::driver::{
    Created, MIN_TTL, connect_client, create_txn, guarded_delete, key_prefix, relabel, ttl_secs,
};
use crate::error::{NAME, from_etcd};
use crate::session::{Session, revoke_in_background};

/// Hand-issued create and guarded-delete transactions with one pre-granted,
/// kept-alive lease: the floor our acquire+release cycle is measured
/// against.
///
/// Dropping it stops the keep-alive and revokes the lease in the
/// background.
pub struct EtcdFloor {
    client: Client,
    /// Normalized prefix, without a trailing separator.
    prefix: String,
    session: Arc<Session>,
    lease_hex: String,
    op_timeout: Duration,
}

impl fmt::Debug for EtcdFloor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdFloor")
            .field("prefix", &self.prefix)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl Drop for EtcdFloor {
    fn drop(&mut self) {
        revoke_in_background(
            &self.client,
            self.session.lease_id(),
            self.session.server_ttl(),
        );
    }
}

impl EtcdFloor {
    /// Connects like [`crate::connect`] (same URL syntax and options) and
    /// grants one lease of the URL's `ttl`, kept alive (every TTL/3) until
    /// the floor is dropped.
    ///
    /// # Errors
    ///
    /// As [`crate::connect`]: [`ErrorKind::Config`] for a bad URL or
    /// rejected credentials, [`ErrorKind::Unavailable`] /
    /// [`ErrorKind::Timeout`] when etcd cannot be reached or the lease
    /// cannot be granted in time.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave a granted lease behind; it expires with
    /// its TTL.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = EtcdConfig::from_url(url)?;
        let client = connect_client(&config).await?;
        Self::start(client, &config).await
    }

    /// The floor on an existing backend's client (same connection, prefix
    /// and timeouts), with a lease of its own granted now (of the backend's
    /// configured `ttl`), so ours and the floor share the connection.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unavailable`] / [`ErrorKind::Timeout`] when the lease
    /// cannot be granted in time.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave a granted lease behind; it expires with
    /// its TTL.
    pub async fn from_backend(backend: &crate::EtcdBackend) -> Result<Self, LockError> {
        Self::start(backend.client().clone(), backend.config()).await
    }

    async fn start(client: Client, config: &EtcdConfig) -> Result<Self, LockError> {
        let ttl = i64::try_from(ttl_secs(config.ttl)).map_err(|_| {
            LockError::invalid_argument(Operation::Connect, "TTL too large for an etcd lease")
        })?;
        let session = Session::start(&client, ttl, config.op_timeout)
            .await
            .map_err(|e| relabel(e, Operation::Connect))?;
        Ok(Self {
            lease_hex: session.lease_hex(),
            prefix: config.prefix.trim_end_matches('/').to_owned(),
            op_timeout: config.op_timeout,
            client,
            session,
        })
    }

    /// One acquire + one release of `key` by hand: the create transaction
    /// (our entry must be the oldest under the key) and the guarded delete,
    /// each bounded by the configured operation timeout.
    ///
    /// `ttl` is checked as the driver checks it; the entry lives on the
    /// floor's one lease (granted with the URL's `ttl`), as the driver's
    /// entries live on their session's lease.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for a key or TTL the driver would
    /// refuse; [`ErrorKind::Contended`] when the key is held by someone else
    /// (our entry is then deleted again) or when this floor already has an
    /// entry under it (a concurrent cycle on the same key); [`ErrorKind::NotHeld`]
    /// when the guarded delete found the entry gone (the lease was lost);
    /// `Unavailable` / `Timeout` / `Backend` / `LeaseLost` for etcd
    /// failures.
    ///
    /// # Cancel safety
    ///
    /// Not a lock API: dropping the future after the create was sent may
    /// leave the entry behind on the floor's lease; later cycles on `key`
    /// then fail with `Contended` until the floor is dropped (its lease is
    /// revoked) or the lease expires.
    pub async fn cycle(&self, key: &str, ttl: Duration) -> Result<(), LockError> {
        let key = LockKey::new(key)?;
        let op = Operation::TryAcquire;
        check_ttl(ttl, MIN_TTL, op).map_err(|e| e.with_key(&key).with_backend(NAME))?;
        let key_prefix = key_prefix(&self.prefix, &key);
        let entry = format!("{key_prefix}{}", self.lease_hex);
        let owner = OwnerId::random();
        let mut kv = self.client.kv_client();
        let txn = create_txn(&key_prefix, &entry, self.session.lease_id(), owner);
        let response = with_timeout(self.op_timeout, op, async {
            kv.txn(txn).await.map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_key(&key).with_backend(NAME))?;
        let created = Created::from_response(&response, owner);
        let contended = |why: &str| {
            LockError::new(ErrorKind::Contended, op, why.to_owned())
                .with_key(&key)
                .with_backend(NAME)
        };
        if !response.succeeded() {
            return Err(contended(
                "the floor already has an entry under this key (concurrent cycle on one key)",
            ));
        }
        let Some(revision) = created.my_revision else {
            return Err(LockError::new(
                ErrorKind::Backend,
                op,
                "unexpected etcd answer: no revision for our entry",
            )
            .with_key(&key)
            .with_backend(NAME));
        };
        let op = Operation::Release;
        let response = with_timeout(self.op_timeout, op, async {
            kv.txn(guarded_delete(&entry, revision, owner))
                .await
                .map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_key(&key).with_backend(NAME))?;
        if created.owner_revision != Some(revision) {
            // An older entry holds the key: ours was only queued (and is
            // gone again now).
            return Err(contended("the key is held by another owner"));
        }
        if !response.succeeded() {
            return Err(LockError::new(
                ErrorKind::NotHeld,
                op,
                "the floor's entry was gone at release (lease lost?)",
            )
            .with_key(&key)
            .with_backend(NAME));
        }
        Ok(())
    }
}
