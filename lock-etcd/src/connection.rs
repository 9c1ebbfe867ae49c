//! Making and keeping the etcd client and its sessions: endpoints,
//! timeouts, credentials and TLS; the session leases (one per TTL in whole
//! seconds, more when one fills) and their retirement; the entries in
//! flight and their cleanup; the single calls every component sends.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, GetResponse, KvClient, Txn, TxnResponse};
use lock_core::election::election_key;
use lock_core::{ErrorKind, LockError, LockKey, LockShape, Operation, OwnerId, with_timeout};

use crate::config::EtcdConfig;
use crate::error::{NAME, from_etcd, relabel};
use crate::keys::{election_prefix, key_prefix, shape_prefix};

mod cleanup;
mod members;
mod retire;
mod session;

pub(crate) use cleanup::{PendingEntry, clean_up_later};
pub(crate) use session::{RenewRefused, Session, revoke_in_background, ttl_secs};

/// The client, the configuration and the sessions, shared by every
/// component of one backend.
pub(crate) struct Connection {
    pub(crate) client: Client,
    pub(crate) config: EtcdConfig,
    /// Normalized prefix, without a trailing separator.
    pub(crate) prefix: String,
    /// The sessions of each server TTL (in whole seconds): usually one;
    /// another is started when those alive have no room left (see
    /// [`session::LISTING_BUDGET`]).
    sessions: Mutex<HashMap<u64, Vec<Arc<Session>>>>,
    /// Serializes session creation so concurrent acquires grant one lease.
    creating: tokio::sync::Mutex<()>,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sessions: Vec<String> = lock(&self.sessions)
            .values()
            .flatten()
            .map(|s| format!("{s:?}"))
            .collect();
        f.debug_struct("Connection")
            .field("config", &self.config)
            .field("sessions", &sessions)
            .finish_non_exhaustive()
    }
}

/// A std mutex's guard, whether or not a panic poisoned it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Connection {
    /// Connects the client and grants the default session's lease; the
    /// sweeper that retires idle sessions runs until the connection is
    /// dropped.
    pub(crate) async fn open(config: EtcdConfig) -> Result<Arc<Self>, LockError> {
        let (client, urls, options) = connect_client(&config).await?;
        let prefix = config.prefix.trim_end_matches('/').to_owned();
        let connection = Arc::new(Self {
            client,
            prefix,
            sessions: Mutex::new(HashMap::new()),
            creating: tokio::sync::Mutex::new(()),
            config,
        });
        let ttl = connection.config.ttl;
        connection
            .session_for(ttl, Operation::Connect)
            .await
            .map_err(|e| e.with_backend(NAME))?;
        retire::retire_idle_sessions(&connection);
        members::watch_members(Arc::downgrade(&connection), urls, options);
        Ok(connection)
    }

    /// `<prefix>/<escaped key>/` ([`key_prefix`]).
    pub(crate) fn key_prefix(&self, key: &LockKey) -> String {
        key_prefix(&self.prefix, key)
    }

    /// Where the grants of `shape` on `key` live ([`shape_prefix`]).
    pub(crate) fn shape_prefix(&self, key: &LockKey, shape: LockShape) -> String {
        shape_prefix(&self.prefix, key, shape)
    }

    /// Where an election's candidates live ([`election_prefix`]).
    pub(crate) fn election_prefix(&self, election: &LockKey) -> String {
        election_prefix(&self.prefix, election)
    }

    /// The election prefix of a leadership lease, from its key
    /// (`election/<name>`); `None` for any other key.
    pub(crate) fn election_prefix_of(&self, lease_key: &LockKey) -> Option<String> {
        let name = lease_key.as_str().strip_prefix(&election_key(""))?;
        let election = LockKey::new(name).ok()?;
        Some(self.election_prefix(&election))
    }

    /// The lease ids (hex) of every live session used for `secs`, oldest
    /// first.
    pub(crate) fn session_leases(&self, secs: u64) -> Vec<String> {
        lock(&self.sessions)
            .get(&secs)
            .into_iter()
            .flatten()
            .filter(|s| s.is_alive())
            .map(|s| s.lease_hex())
            .collect()
    }

    /// Revokes every session lease (see `EtcdBackend::close`).
    pub(crate) async fn close(&self) -> Result<(), LockError> {
        let sessions: Vec<Arc<Session>> =
            lock(&self.sessions).drain().flat_map(|(_, s)| s).collect();
        let mut first_error = None;
        for session in sessions {
            session.lose("the backend was closed");
            let mut lease_client = self.client.lease_client();
            let result = with_timeout(self.config.op_timeout, Operation::Release, async {
                lease_client
                    .revoke(session.lease_id())
                    .await
                    .map_err(|e| from_etcd(Operation::Release, e))
            })
            .await;
            match result {
                Ok(_) => {}
                Err(err) if err.kind() == ErrorKind::LeaseLost => {}
                Err(err) => {
                    revoke_in_background(&self.client, session.lease_id(), session.server_ttl());
                    first_error.get_or_insert(err);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The first live session for `ttl` with room for a grant, if any.
    fn session_with_room(&self, secs: u64) -> Option<Arc<Session>> {
        lock(&self.sessions)
            .get(&secs)?
            .iter()
            .find(|s| s.is_alive() && s.has_room())
            .cloned()
    }

    /// A live session for `ttl` with room for a grant, granting a new lease
    /// if there is none. Sessions of `ttl` no longer alive are dropped (and
    /// declared lost) then.
    pub(crate) async fn session_for(
        &self,
        ttl: Duration,
        op: Operation,
    ) -> Result<Arc<Session>, LockError> {
        let secs = ttl_secs(ttl);
        if let Some(s) = self.session_with_room(secs) {
            return Ok(s);
        }
        // Boxed: starting a session (a lease grant and a keep-alive stream)
        // is rare, and its futures inline would make every acquire's
        // future (which async_trait boxes and copies) tens of kilobytes.
        Box::pin(self.start_session(secs, op)).await
    }

    /// [`Self::session_for`]'s slow path: a new session for `secs`.
    async fn start_session(&self, secs: u64, op: Operation) -> Result<Arc<Session>, LockError> {
        let _creating = self.creating.lock().await;
        if let Some(s) = self.session_with_room(secs) {
            return Ok(s);
        }
        let ttl_i64 = i64::try_from(secs)
            .map_err(|_| LockError::invalid_argument(op, "TTL too large for an etcd lease"))?;
        let root = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let session = Session::start(&self.client, &root, ttl_i64, self.config.op_timeout)
            .await
            .map_err(|e| relabel(e, op))?;
        let mut sessions = lock(&self.sessions);
        let of_ttl = sessions.entry(secs).or_default();
        of_ttl.retain(|old| {
            let alive = old.is_alive();
            if !alive {
                old.lose("replaced by a new session");
            }
            alive
        });
        of_ttl.push(session.clone());
        Ok(session)
    }

    /// The session that handed out `owner` ([`Session::owns`]).
    pub(crate) fn session_owning(&self, owner: OwnerId) -> Option<Arc<Session>> {
        lock(&self.sessions)
            .values()
            .flatten()
            .find(|s| s.owns(owner))
            .cloned()
    }

    /// The session of the etcd lease `lease_id`, if it is ours.
    pub(crate) fn session_by_lease(&self, lease_id: i64) -> Option<Arc<Session>> {
        lock(&self.sessions)
            .values()
            .flatten()
            .find(|s| s.lease_id() == lease_id)
            .cloned()
    }

    /// A pending entry under `key_prefix` with a name and an owner id of
    /// `session`'s, armed before its create is sent.
    pub(crate) fn claim_pending(
        &self,
        session: &Arc<Session>,
        key_prefix: &str,
    ) -> PendingEntry<'_> {
        PendingEntry {
            client: &self.client,
            session: session.clone(),
            entry: session.claim_entry(key_prefix),
            owner: session.new_owner(),
            create: None,
            revision: None,
            armed: true,
            op_timeout: self.config.op_timeout,
        }
    }

    /// One transaction, bounded by the operation timeout.
    pub(crate) async fn txn(&self, op: Operation, txn: Txn) -> Result<TxnResponse, LockError> {
        let mut kv = self.client.kv_client();
        txn_on(&mut kv, self.config.op_timeout, op, txn).await
    }

    /// One range read bounded by the operation timeout, for a waiter's
    /// probes: `None` when it failed (the waiter re-reads later anyway).
    pub(crate) async fn read_quietly(
        &self,
        key: impl Into<Vec<u8>>,
        options: GetOptions,
    ) -> Option<GetResponse> {
        let mut kv = self.client.kv_client();
        tokio::time::timeout(self.config.op_timeout, kv.get(key, Some(options)))
            .await
            .ok()?
            .ok()
    }

    /// An upper bound of the time left to an entry of another backend on
    /// `lease_id` (as `inspect` reports it; `None` when it cannot be read,
    /// or for an entry without a lease).
    pub(crate) async fn lease_ttl(&self, lease_id: i64, op: Operation) -> Option<Duration> {
        if lease_id == 0 {
            return None;
        }
        let mut lease_client = self.client.lease_client();
        let ttl = with_timeout(self.config.op_timeout, op, async {
            lease_client
                .time_to_live(lease_id, None)
                .await
                .map_err(|e| from_etcd(op, e))
        })
        .await
        .ok()?;
        // Another backend deletes the entry at its own deadline, which etcd
        // cannot show: at most the lock's TTL after its last renewal, and the
        // lease's granted TTL is that TTL rounded up. A crashed holder's
        // entry goes with the lease, within the same bound. So the granted
        // TTL is an upper bound of the time left; the lease's remaining TTL
        // is not.
        u64::try_from(ttl.granted_ttl())
            .ok()
            .filter(|_| ttl.ttl() > 0)
            .map(|granted| {
                Duration::from_secs(granted)
                    .max(Duration::from_secs(u64::try_from(ttl.ttl()).unwrap_or(0)))
            })
    }
}

/// One transaction on `kv`, bounded by `timeout`: [`Connection::txn`] for
/// a future that owns its client, or with a budget of its own.
pub(crate) async fn txn_on(
    kv: &mut KvClient,
    timeout: Duration,
    op: Operation,
    txn: Txn,
) -> Result<TxnResponse, LockError> {
    with_timeout(timeout, op, async {
        kv.txn(txn).await.map_err(|e| from_etcd(op, e))
    })
    .await
    .map_err(|e| e.with_backend(NAME))
}

/// Validates `config` and connects an etcd client with it (no lease yet),
/// on `etcd-client`'s own channel (tonic's, balanced over the endpoints),
/// with the options of [`EtcdConfig::client_options`] (among them an
/// HTTP/2 keep-alive that also runs while idle, so that a connection that
/// stops answering is dropped before a call waits on it).
///
/// Returns the client, the endpoints as it was given them (with their
/// scheme, as `Client::remove_endpoint` needs them) and its options.
async fn connect_client(
    config: &EtcdConfig,
) -> Result<(Client, Vec<String>, ConnectOptions), LockError> {
    config.validate()?;
    let options = config.client_options()?;
    let urls = config.endpoint_urls();
    let client = with_timeout(
        config.connect_timeout + config.op_timeout,
        Operation::Connect,
        async {
            Client::connect(&urls, Some(options.clone()))
                .await
                .map_err(|e| from_etcd(Operation::Connect, e))
        },
    )
    .await?;
    Ok((client, urls, options))
}
