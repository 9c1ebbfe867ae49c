//! Read-write locks and semaphores (one server, Sentinel, Cluster): the
//! calls of `keys/shared.rs`, the waiting loop of a shared acquire, and
//! the release / downgrade / holders of the shared kinds (their renewals
//! are `renewal/shares.rs`). Redlock refuses them (see the crate docs).

pub(crate) mod holders;
pub(crate) mod refusals;

use std::sync::Arc;
use std::time::Duration;

use lock_core::{
    Downgrade, ErrorKind, HolderInfo, Lease, LeaseKind, LockError, LockKey, LockShape, Operation,
    async_trait,
};
use redis::Value;
use tokio::time::Instant;

use crate::connection::{Conn, Lane, Servers};
use crate::error::{NAME, unexpected};
use crate::grants::attempt::{AcquireCall, Attempt, granted};
use crate::grants::undo::Traces;
use crate::grants::{Grants, check_ttl};
use crate::keys::replies::{as_int, pair, token_of, ttl_ms};
use crate::keys::shared::{RwNames, SHARED, SharedNames};
use crate::waiting::retry::{entry_lease, wait_one_server};
use refusals::{REDLOCK_WHY, check_shared, not_held, redlock_unsupported};

/// A shared acquire's traces: a waiting entry, a grant whose answer was
/// lost.
impl Traces for SharedNames {
    async fn abandon(&self, servers: &Servers, owner: &str) -> Result<Value, LockError> {
        let timeout = servers.timeout();
        servers
            .first()
            .run_on(
                servers.undo_lane(Lane::of(owner)),
                Operation::Release,
                timeout,
                move |mut conn| async move {
                    match self {
                        SharedNames::Rw(n) => {
                            conn.eval(
                                &SHARED.rw_abandon,
                                &[
                                    &n.writer,
                                    &n.readers,
                                    &n.queue,
                                    &n.queue_expiry,
                                    &n.details,
                                    &n.writer_details,
                                ],
                                &[owner, &n.channel],
                            )
                            .await
                        }
                        SharedNames::Sem(n) => {
                            conn.eval(
                                &SHARED.remove,
                                &[
                                    &n.holders,
                                    &n.queue,
                                    &n.queue_expiry,
                                    &n.counts,
                                    &n.tokens,
                                    &n.details,
                                ],
                                &[owner, &n.channel, "3"],
                            )
                            .await
                        }
                    }
                },
            )
            .await
    }
}

/// Read-write locks and semaphores: their grants (a try, or waiting in
/// their queue), releases, downgrades and holders.
#[derive(Clone)]
pub(crate) struct Shared {
    grants: Grants,
}

impl Shared {
    pub(crate) fn new(grants: Grants) -> Self {
        Self { grants }
    }

    fn servers(&self) -> &Arc<Servers> {
        self.grants.servers()
    }

    /// The holders of `key`'s read-write lock or semaphore.
    pub(crate) async fn holders(
        &self,
        key: &LockKey,
        shape: LockShape,
    ) -> Result<Vec<HolderInfo>, LockError> {
        holders::holders(self.servers(), key, shape).await
    }

    /// Refuses `list_shared` of a read-write lock or a semaphore where
    /// there are none: Redlock and the legacy layouts.
    pub(crate) fn check_listing(&self) -> Result<(), LockError> {
        let op = Operation::Inspect;
        if self.servers().redlock {
            return Err(LockError::new(ErrorKind::Unsupported, op, REDLOCK_WHY).with_backend(NAME));
        }
        let layout = self.servers().config.layout;
        if layout.is_legacy() {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                op,
                format!(
                    "layout={} has the mutex only: read-write locks and semaphores need \
                     layout=native",
                    layout.as_str()
                ),
            )
            .with_backend(NAME));
        }
        Ok(())
    }

    /// One acquire script call for a shared kind. `call.wait`: register
    /// as a waiter for that long when refused (writers and permit requests
    /// of a waiting acquire). The same owner may be sent again: the scripts
    /// return the grant they made.
    async fn shared_attempt(
        &self,
        call: AcquireCall<'_>,
        kind: LeaseKind,
        names: &SharedNames,
        timeout: Duration,
    ) -> Result<Attempt, LockError> {
        let AcquireCall { key, op, .. } = call;
        let texts = call.texts();
        let (owner_ref, ttl_ref) = (texts.owner.as_str(), texts.ttl.as_str());
        let (wait_flag, details) = (texts.wait.as_str(), texts.details.as_str());
        let sent_at = Instant::now();
        let script = move |mut conn: Conn| async move {
            match (names, kind) {
                (SharedNames::Sem(n), LeaseKind::Permits { count, limit }) => {
                    let (count, limit) = (count.to_string(), limit.to_string());
                    conn.eval(
                        &SHARED.sem_acquire,
                        &[
                            &n.holders,
                            &n.counts,
                            &n.tokens,
                            &n.queue,
                            &n.queue_expiry,
                            &n.counters,
                            &n.details,
                        ],
                        &[
                            owner_ref, ttl_ref, &count, &limit, wait_flag, &n.channel, details,
                        ],
                    )
                    .await
                }
                (SharedNames::Rw(n), kind) => {
                    let side = if kind == LeaseKind::Read { "r" } else { "w" };
                    conn.eval(
                        &SHARED.rw_acquire,
                        &[
                            &n.writer,
                            &n.readers,
                            &n.queue,
                            &n.queue_expiry,
                            &n.counters,
                            &n.details,
                            &n.writer_details,
                        ],
                        &[owner_ref, ttl_ref, side, wait_flag, &n.channel, details],
                    )
                    .await
                }
                (SharedNames::Sem(_), _) => Ok(Value::Nil),
            }
        };
        let (value, acked) = self
            .grants
            .run_grant(
                self.servers().first(),
                Lane::of(&texts.owner),
                op,
                timeout,
                script,
                |value| matches!(pair(value, op), Ok((1, _))),
            )
            .await?;
        match pair(&value, op)? {
            (1, n) => {
                self.grants
                    .confirm_one_server_grant(names, &texts.owner, op, acked, key)
                    .await?;
                let lease = call
                    .granted(token_of(n, op, &value)?, sent_at)?
                    .with_kind(kind);
                Ok(Attempt::Granted(lease))
            }
            // -1: a writer key without TTL (a foreign client).
            (0, ms) => Ok(Attempt::held(ms)),
            (-1, limit) => Err(LockError::invalid_argument(
                op,
                format!("the semaphore is in use with a limit of {limit} permits, not {kind}"),
            )
            .with_backend(NAME)
            .with_key(key)),
            _ => Err(unexpected(op, &value)),
        }
    }

    /// `try_acquire_kind` for a read, write or permit grant.
    pub(crate) async fn try_acquire(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        let call = AcquireCall::new(key, ttl, Operation::TryAcquire);
        check_shared(self.servers(), key, kind, ttl, call.op)?;
        let names = self.servers().keys.shared(key, kind);
        // Armed until the answer is seen: a lost answer may hide a grant.
        let guard = self.grants.withdraw_guard(&names, call.owner);
        let timeout = self.servers().timeout();
        let attempt = self.shared_attempt(call, kind, &names, timeout).await;
        // A refused argument (a semaphore in use with another limit): the
        // script wrote nothing.
        guard.settle_try(attempt, |err| err.kind() == ErrorKind::InvalidArgument)
    }

    /// `acquire_kind` for a read, write or permit grant: one try (on a free
    /// lock that is the whole acquire, one round trip), then subscribe and
    /// re-try on every release notification and when the blocker's TTL
    /// ends. Writers and permit requests register as waiters on their first
    /// refused try (in the same script call) and refresh that entry while
    /// they wait; it is withdrawn when the acquire ends without a lease
    /// (at once at the deadline, in the background when dropped).
    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let call = AcquireCall::new(key, ttl, Operation::Acquire);
        check_shared(self.servers(), key, kind, ttl, call.op)?;
        let names = self.servers().keys.shared(key, kind);
        let guard = self.grants.withdraw_guard(&names, call.owner);
        match self.wait_shared(call, kind, deadline, &names).await {
            Ok(lease) => {
                guard.disarm();
                Ok(lease)
            }
            Err(err) => {
                if err.kind() == ErrorKind::Contended {
                    // Readers blocked by our waiting entry go on at once.
                    guard.withdraw().await;
                }
                Err(err)
            }
        }
    }

    async fn wait_shared(
        &self,
        call: AcquireCall<'_>,
        kind: LeaseKind,
        deadline: Instant,
        names: &SharedNames,
    ) -> Result<Lease, LockError> {
        // Readers never queue. A waiting entry lives for a short time of
        // its own (at most the lease's TTL, about three re-check intervals)
        // and is refreshed by every attempt, at least every third of it:
        // a waiter that died stops blocking others soon, whatever its TTL.
        let registers = kind != LeaseKind::Read;
        let entry = registers.then(|| entry_lease(&self.servers().config, call.ttl));
        let refresh = entry.map_or(Duration::MAX, |entry| entry / 3);
        let call = call.waiting(entry);
        wait_one_server(
            self.servers(),
            call.key,
            names.channel(),
            deadline,
            refresh,
            move |timeout| self.shared_attempt(call, kind, names, timeout),
        )
        .await
    }

    /// `release` of a read, write or permit lease.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let op = Operation::Release;
        let key = lease.key();
        let kind = lease.kind();
        if self.servers().redlock {
            return Err(redlock_unsupported(key, op));
        }
        let owner = lease.owner().to_hex();
        let owner = owner.as_str();
        let names = self.servers().keys.shared(key, kind);
        let names = &names;
        let scripts = &self.servers().scripts;
        let timeout = self.servers().timeout();
        let value = self
            .servers()
            .first()
            .run_on(Lane::ANY, op, timeout, move |mut conn| async move {
                match names {
                    // The writer: the mutex's compare-and-delete (its
                    // details with it) + publish.
                    SharedNames::Rw(n) if kind == LeaseKind::Write => {
                        conn.eval(
                            &scripts.release,
                            &[&n.writer, &n.writer_details],
                            &[owner, &n.channel],
                        )
                        .await
                    }
                    SharedNames::Rw(n) => {
                        conn.eval(
                            &SHARED.remove,
                            &[&n.readers, &n.details],
                            &[owner, &n.channel, "1"],
                        )
                        .await
                    }
                    SharedNames::Sem(n) => {
                        conn.eval(
                            &SHARED.remove,
                            &[&n.holders, &n.counts, &n.tokens, &n.details],
                            &[owner, &n.channel, "1"],
                        )
                        .await
                    }
                }
            })
            .await
            .map_err(|e| e.with_key(key))?;
        Ok(as_int(&value, op)? == 1)
    }

    /// `downgrade`: the write entry goes and the same owner joins the
    /// readers with the same token, in one script.
    pub(crate) async fn downgrade_write(&self, lease: &Lease) -> Result<Lease, LockError> {
        let op = Operation::Downgrade;
        let key = lease.key();
        if self.servers().redlock {
            return Err(redlock_unsupported(key, op));
        }
        if lease.kind() != LeaseKind::Write {
            return Err(not_held(
                op,
                key,
                &format!(
                    "only a write lease can be downgraded, not a {} lease",
                    lease.kind()
                ),
            ));
        }
        check_ttl(lease.ttl(), op, key)?;
        let n = RwNames::new(self.servers().keys.prefix(), key);
        let owner = lease.owner().to_hex();
        let ttl_text = ttl_ms(lease.ttl());
        let (n, owner_ref, ttl_ref) = (&n, owner.as_str(), ttl_text.as_str());
        let sent_at = Instant::now();
        let timeout = self.servers().timeout();
        let value = self
            .servers()
            .first()
            .run_on(Lane::ANY, op, timeout, move |mut conn| async move {
                conn.eval(
                    &SHARED.rw_downgrade,
                    &[
                        &n.writer,
                        &n.readers,
                        &n.counters,
                        &n.details,
                        &n.writer_details,
                    ],
                    &[owner_ref, ttl_ref, &n.channel],
                )
                .await
            })
            .await
            .map_err(|e| e.with_key(key))?;
        match pair(&value, op)? {
            (1, token) => Ok(granted(
                key,
                lease.owner(),
                token_of(token, op, &value)?,
                lease.ttl(),
                sent_at,
            )?
            .with_kind(LeaseKind::Read)),
            (0, _) => Err(not_held(op, key, "the write lease is not held any more")),
            _ => Err(unexpected(op, &value)),
        }
    }
}

#[async_trait]
impl Downgrade for Shared {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.servers()
            .keys
            .refuse_legacy(Operation::Downgrade, "read-write locks", lease.key())?;
        self.downgrade_write(lease).await
    }
}
