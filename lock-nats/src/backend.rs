//! [`NatsBackend`]: the kernel over a JetStream key-value bucket.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    Capabilities, Facets, FencingScope, FencingToken, GrantRequest, HolderInfo, Lease, LeaseKind,
    LockBackend, LockError, LockKey, LockShape, OwnerId, RENEW_CONCURRENCY, TtlModel, WaitStrategy,
    check_ttl, renew_concurrently, unsupported_shape,
};
use tokio::time::Instant;

use crate::NAME;
use crate::config::NatsConfig;
use crate::connection::Connection;
use crate::grants::Grants;
use crate::keys::{Value, kv_key};
use crate::renewal::Renewal;
use crate::waiting::Waiting;

/// The shortest TTL: NATS per-message TTLs are whole seconds, at least one.
pub const MIN_TTL: Duration = Duration::from_secs(1);

/// What this backend guarantees (see the crate docs for each field).
pub const CAPABILITIES: Capabilities = Capabilities {
    // The token is the create's revision: the bucket stream's sequence,
    // which strictly increases over every write to the bucket (so over
    // successive grants of each key, and across keys of one bucket; not
    // across buckets).
    fencing: FencingScope::PerKey,
    // The sequence is replicated by the stream's Raft group with the
    // entry: a new leader continues it. A bucket deleted and created
    // again starts over at 1.
    fencing_survives_failover: true,
    // Entries are in the stream's file store (replicated with replicas > 1).
    grants_survive_restart: true,
    waiting: WaitStrategy::Notify,
    fifo: false,
    ttl_model: TtlModel::PerLease,
    // A JetStream stream is a Raft group: writes conditioned on the last
    // sequence are linearizable (one server with replicas 1).
    linearizable: true,
    min_ttl: MIN_TTL,
    shared_locks: false,
    semaphores: false,
    holder_details: true,
    max_held: None,
};

/// Locks in a NATS JetStream key-value bucket.
///
/// Clones share one connection.
#[derive(Clone)]
pub struct NatsBackend {
    config: Arc<NatsConfig>,
    grants: Grants,
    waiting: Waiting,
    renewal: Arc<Renewal>,
    connection: Arc<Connection>,
}

impl fmt::Debug for NatsBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl NatsBackend {
    /// Connects and opens (or creates) the bucket.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unavailable`](lock_core::ErrorKind::Unavailable) when
    /// no server answers or JetStream is not enabled,
    /// [`ErrorKind::Timeout`](lock_core::ErrorKind::Timeout) when one does
    /// not answer within the timeouts, and
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for a bucket
    /// without per-message TTL.
    ///
    /// # Cancel safety
    ///
    /// Safe: nothing is held until it returns (a bucket may have been
    /// created).
    pub async fn connect(config: NatsConfig) -> Result<Self, LockError> {
        let connection = Arc::new(Connection::open(&config).await?);
        let grants = Grants::new(connection.clone());
        Ok(Self {
            config: Arc::new(config),
            waiting: Waiting::new(connection.clone(), grants.clone()),
            grants,
            renewal: Arc::new(Renewal::new(connection.clone())),
            connection,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &NatsConfig {
        &self.config
    }

    /// The KV key of `key`'s mutex in the bucket (what another NATS client
    /// creates to take the same lock).
    pub fn kv_key(&self, key: &LockKey) -> String {
        kv_key(key)
    }

    fn lease(
        request: &GrantRequest<'_>,
        owner: OwnerId,
        revision: u64,
        sent_at: Instant,
    ) -> Result<Lease, LockError> {
        Lease::granted(
            request.key.clone(),
            owner,
            FencingToken::new(revision),
            request.ttl,
            sent_at,
            revision.to_string(),
        )
        .map_err(|e| e.with_backend(NAME))
    }
}

#[async_trait]
impl LockBackend for NatsBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// A KV create; a waiting grant watches the key between tries.
    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let key = request.key;
        let op = request.operation();
        request.mutex_only(NAME)?;
        check_ttl(request.ttl, CAPABILITIES.min_ttl, op)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        let kv = kv_key(key);
        let owner = OwnerId::random();
        let (revision, sent_at) = match request.deadline {
            None => {
                let sent_at = Instant::now();
                match self
                    .grants
                    .try_take(op, key, &kv, owner, request.ttl)
                    .await?
                {
                    Some(revision) => (revision, sent_at),
                    None => return Ok(None),
                }
            }
            Some(deadline) => {
                self.waiting
                    .take(key, &kv, owner, request.ttl, deadline)
                    .await?
            }
        };
        self.renewal.remember(owner, revision);
        match Self::lease(&request, owner, revision, sent_at) {
            Ok(lease) => Ok(Some(lease)),
            Err(late) => {
                // Arrived after its validity: give it back.
                let _ = self
                    .renewal
                    .release(&Lease::from_parts(
                        key.clone(),
                        owner,
                        FencingToken::new(revision),
                        request.ttl,
                        Instant::now(),
                        revision.to_string(),
                    ))
                    .await;
                Err(late)
            }
        }
    }

    /// One conditioned update per lease, several in flight at once.
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        renew_concurrently(leases, RENEW_CONCURRENCY, |lease| self.renewal.renew(lease)).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        match self.renewal.release(lease).await? {
            Some(marker) => {
                self.grants.note_marker(&kv_key(lease.key()), marker);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// No facet.
    fn facets(&self) -> Facets<'_> {
        Facets::default()
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        if shape != LockShape::Mutex {
            return Err(unsupported_shape(NAME, key, shape));
        }
        let last = self
            .connection
            .last(lock_core::Operation::Inspect, key, &kv_key(key))
            .await?;
        Ok(last
            .filter(|l| l.is_value)
            .map(|e| {
                let value = Value::decode(&e.value);
                HolderInfo {
                    kind: LeaseKind::Exclusive,
                    holder: value.owner,
                    token: Some(value.token.unwrap_or(FencingToken::new(e.revision))),
                    remaining_ttl: None,
                    details: value.details,
                }
            })
            .into_iter()
            .collect())
    }
}
