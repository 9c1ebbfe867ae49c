//! Read-write locks and semaphores (one server, Sentinel, Cluster): the
//! calls of `shared_scripts.rs`, the waiting loop of a shared acquire, and
//! the renew / release / downgrade / holders of the shared kinds. Redlock
//! refuses them (see the crate docs).

use std::time::Duration;

use lock_core::{
    ErrorKind, FencingToken, HolderDetails, HolderInfo, Lease, LeaseKind, LockError, LockKey,
    LockShape, Operation, OwnerId, RENEW_CONCURRENCY, renew_concurrently,
};
use redis::Value;
use tokio::time::Instant;

use super::attempt::{AcquireTexts, Attempt, Traces, granted};
use super::{Inner, RedisBackend};
use crate::batch::MAX_BATCH;
use crate::error::{NAME, copy_for_each, renewed_until, unexpected};
use crate::keys::shared::{RwNames, SHARED, SemNames};
use crate::keys::{as_int, details_of, pttl, text, ttl_ms};

/// Why Redlock has no read-write locks or semaphores.
const REDLOCK_WHY: &str = "Redlock does not provide read-write locks or semaphores: its \
    majority rule over independent nodes gives no consistent order of readers, writers or \
    permits across nodes (two majorities can each count a different set of holders), so \
    neither exclusion nor the permit limit could be promised";

/// The Redis names of a lock of one shared shape.
#[derive(Clone, Debug)]
enum Names {
    Rw(RwNames),
    Sem(SemNames),
}

impl Names {
    fn channel(&self) -> &str {
        match self {
            Self::Rw(n) => &n.channel,
            Self::Sem(n) => &n.channel,
        }
    }
}

/// A shared acquire's traces: a waiting entry, a grant whose answer was
/// lost.
impl Traces for Names {
    async fn abandon(&self, inner: &Inner, owner: &str) -> Result<Value, LockError> {
        let timeout = inner.config.operation_timeout;
        inner.nodes[0]
            .run(Operation::Release, timeout, move |mut conn| async move {
                match self {
                    Names::Rw(n) => {
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
                    Names::Sem(n) => {
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
            })
            .await
    }
}

fn redlock_unsupported(key: &LockKey, op: Operation) -> LockError {
    LockError::new(ErrorKind::Unsupported, op, REDLOCK_WHY)
        .with_backend(NAME)
        .with_key(key)
}

fn not_held(op: Operation, key: &LockKey, why: &str) -> LockError {
    LockError::new(ErrorKind::NotHeld, op, why.to_owned())
        .with_backend(NAME)
        .with_key(key)
}

/// `{flag, n}` of an acquire or downgrade script.
fn pair(value: &Value, op: Operation) -> Result<(i64, i64), LockError> {
    if let Value::Array(items) = value {
        match items.as_slice() {
            [flag, n] => return Ok((as_int(flag, op)?, as_int(n, op)?)),
            [flag] => return Ok((as_int(flag, op)?, 0)),
            _ => {}
        }
    }
    Err(unexpected(op, value))
}

/// A share's entry in its shape's details hash (`''`: none).
fn share_details(value: &Value) -> Option<HolderDetails> {
    text(value).and_then(|t| HolderDetails::decode(&t))
}

fn token_of(n: i64, op: Operation, value: &Value) -> Result<FencingToken, LockError> {
    u64::try_from(n)
        .map(FencingToken::new)
        .map_err(|_| unexpected(op, value))
}

impl RedisBackend {
    /// Checks a request for a shared kind before anything is sent.
    fn check_shared(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        op: Operation,
    ) -> Result<(), LockError> {
        self.check_ttl(ttl, op, key)?;
        kind.validate(op)
            .map_err(|e| e.with_backend(NAME).with_key(key))?;
        if self.inner.redlock {
            return Err(redlock_unsupported(key, op));
        }
        Ok(())
    }

    /// Refuses `list_shared` of a read-write lock or a semaphore where
    /// there are none: Redlock and the legacy layouts.
    pub(super) fn check_shared_listing(&self) -> Result<(), LockError> {
        let op = Operation::Inspect;
        if self.inner.redlock {
            return Err(LockError::new(ErrorKind::Unsupported, op, REDLOCK_WHY).with_backend(NAME));
        }
        let layout = self.inner.config.layout;
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

    fn shared_names(&self, key: &LockKey, kind: LeaseKind) -> Names {
        let prefix = &self.inner.config.prefix;
        match kind.shape() {
            LockShape::Semaphore => Names::Sem(SemNames::new(prefix, key)),
            _ => Names::Rw(RwNames::new(prefix, key)),
        }
    }

    /// One acquire script call for a shared kind. `wait`: register as a
    /// waiter for that long when refused (writers and permit requests of a
    /// waiting acquire; `None` for a try). The same `owner` may be sent
    /// again: the scripts return the grant they made.
    #[allow(clippy::too_many_arguments)]
    async fn shared_attempt(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        owner: OwnerId,
        names: &Names,
        wait: Option<Duration>,
        op: Operation,
        timeout: Duration,
    ) -> Result<Attempt, LockError> {
        let texts = AcquireTexts::new(owner, ttl, wait);
        let (owner_ref, ttl_ref) = (texts.owner.as_str(), texts.ttl.as_str());
        let (wait_flag, details) = (texts.wait.as_str(), texts.details.as_str());
        let sent_at = Instant::now();
        let script = move |mut conn: crate::conn::Conn| async move {
            match (names, kind) {
                (Names::Sem(n), LeaseKind::Permits { count, limit }) => {
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
                (Names::Rw(n), kind) => {
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
                (Names::Sem(_), _) => Ok(Value::Nil),
            }
        };
        let (value, acked) = self
            .run_grant(&self.inner.nodes[0], op, timeout, script, |value| {
                matches!(pair(value, op), Ok((1, _)))
            })
            .await?;
        match pair(&value, op)? {
            (1, n) => {
                self.confirm_one_server_grant(names, &texts.owner, op, acked, key)
                    .await?;
                let lease =
                    granted(key, owner, token_of(n, op, &value)?, ttl, sent_at)?.with_kind(kind);
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
    pub(super) async fn try_acquire_shared(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        let op = Operation::TryAcquire;
        self.check_shared(key, kind, ttl, op)?;
        let names = self.shared_names(key, kind);
        let owner = OwnerId::random();
        // Armed until the answer is seen: a lost answer may hide a grant.
        let guard = self.withdraw_guard(&names, owner);
        let timeout = self.inner.config.operation_timeout;
        let attempt = self
            .shared_attempt(key, kind, ttl, owner, &names, None, op, timeout)
            .await;
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
    pub(super) async fn acquire_shared(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let op = Operation::Acquire;
        self.check_shared(key, kind, ttl, op)?;
        let names = self.shared_names(key, kind);
        let owner = OwnerId::random();
        let guard = self.withdraw_guard(&names, owner);
        match self
            .wait_shared(key, kind, ttl, deadline, owner, &names)
            .await
        {
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
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Instant,
        owner: OwnerId,
        names: &Names,
    ) -> Result<Lease, LockError> {
        let op = Operation::Acquire;
        // Readers never queue. A waiting entry lives for a short time of
        // its own (at most the lease's TTL, about three re-check intervals)
        // and is refreshed by every attempt, at least every third of it:
        // a waiter that died stops blocking others soon, whatever its TTL.
        let registers = kind != LeaseKind::Read;
        let entry = registers.then(|| self.entry_lease(ttl));
        let refresh = entry.map_or(Duration::MAX, |entry| entry / 3);
        self.wait_one_server(key, names.channel(), deadline, refresh, move |timeout| {
            self.shared_attempt(key, kind, ttl, owner, names, entry, op, timeout)
        })
        .await
    }

    /// `renew` of a read, write or permit lease.
    pub(super) async fn renew_shared(&self, lease: &Lease) -> Result<Instant, LockError> {
        let op = Operation::Renew;
        let key = lease.key();
        let kind = lease.kind();
        self.check_shared(key, kind, lease.ttl(), op)?;
        let owner = lease.owner().to_hex();
        let timeout = self.inner.config.operation_timeout;
        let (renewed, sent_at) = match self.shared_names(key, kind) {
            Names::Rw(n) if kind == LeaseKind::Write => {
                // The writer is a plain string like the mutex: the mutex's
                // batched compare-and-pexpire serves it.
                self.inner.renewers[0]
                    .renew(&n.writer, &owner, lease.ttl(), timeout)
                    .await
                    .map_err(|e| e.with_key(key))?
            }
            names => {
                let ttl_text = ttl_ms(lease.ttl());
                let sent_at = Instant::now();
                let (owner, ttl_text) = (owner.as_str(), ttl_text.as_str());
                let names = &names;
                let value = self.inner.nodes[0]
                    .run(op, timeout, move |mut conn| async move {
                        match names {
                            Names::Rw(n) => {
                                conn.eval(
                                    &SHARED.zrenew,
                                    &[&n.readers, &n.details],
                                    &[owner, ttl_text],
                                )
                                .await
                            }
                            Names::Sem(n) => {
                                conn.eval(
                                    &SHARED.zrenew,
                                    &[&n.holders, &n.counts, &n.tokens, &n.details],
                                    &[owner, ttl_text],
                                )
                                .await
                            }
                        }
                    })
                    .await
                    .map_err(|e| e.with_key(key))?;
                (as_int(&value, op)? == 1, sent_at)
            }
        };
        if !renewed {
            return Err(not_held(
                op,
                key,
                "the lock is not held by this lease any more",
            ));
        }
        renewed_until(sent_at, lease.ttl(), op).map_err(|e| e.with_key(key))
    }

    /// `renew_many` with leases of other kinds than the mutex: the mutex
    /// leases in one pipeline (as before), the read and permit leases in
    /// another (one `ZRENEW` each, `MAX_BATCH` per round trip), the write
    /// leases through the mutex's renewal batcher (their key is a plain
    /// string like the mutex's).
    pub(super) async fn renew_mixed(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        let mut groups: [Vec<usize>; 3] = Default::default();
        for (i, lease) in leases.iter().enumerate() {
            let group = match lease.kind() {
                LeaseKind::Exclusive => 0,
                LeaseKind::Write => 1,
                _ => 2,
            };
            groups[group].push(i);
        }
        let pick = |group: &[usize]| group.iter().map(|&i| leases[i]).collect::<Vec<&Lease>>();
        let (mutex, write, shares) = (pick(&groups[0]), pick(&groups[1]), pick(&groups[2]));
        let (mutex, write, shares) = futures_util::future::join3(
            self.renew_pipelined(&mutex),
            renew_concurrently(&write, RENEW_CONCURRENCY, |lease| self.renew_one(lease)),
            self.renew_shares(&shares),
        )
        .await;
        let mut results: Vec<Option<Result<Instant, LockError>>> =
            std::iter::repeat_with(|| None).take(leases.len()).collect();
        for (group, answers) in groups.iter().zip([mutex, write, shares]) {
            for (&i, answer) in group.iter().zip(answers) {
                results[i] = Some(answer);
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(
                        LockError::new(ErrorKind::Backend, Operation::Renew, "no result")
                            .with_backend(NAME),
                    )
                })
            })
            .collect()
    }

    /// Read and permit leases renewed in pipelines of `ZRENEW` calls, as
    /// [`renew_shared`](Self::renew_shared) renews one.
    async fn renew_shares(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        let op = Operation::Renew;
        let mut results: Vec<Option<Result<Instant, LockError>>> =
            std::iter::repeat_with(|| None).take(leases.len()).collect();
        let mut calls: Vec<(usize, Vec<String>, [String; 2])> = Vec::new();
        for (i, lease) in leases.iter().enumerate() {
            let (key, kind) = (lease.key(), lease.kind());
            if let Err(err) = self.check_shared(key, kind, lease.ttl(), op) {
                results[i] = Some(Err(err));
                continue;
            }
            let keys = match self.shared_names(key, kind) {
                Names::Rw(n) => vec![n.readers, n.details],
                Names::Sem(n) => vec![n.holders, n.counts, n.tokens, n.details],
            };
            calls.push((i, keys, [lease.owner().to_hex(), ttl_ms(lease.ttl())]));
        }
        let node = &self.inner.nodes[0];
        let timeout = self.inner.config.operation_timeout;
        for chunk in calls.chunks(MAX_BATCH) {
            let args: Vec<(Vec<&str>, Vec<&str>)> = chunk
                .iter()
                .map(|(_, keys, args)| {
                    (
                        keys.iter().map(String::as_str).collect(),
                        args.iter().map(String::as_str).collect(),
                    )
                })
                .collect();
            let sent_at = Instant::now();
            let args = &args;
            let answer = node
                .run(op, timeout, move |mut conn| async move {
                    conn.eval_many(&SHARED.zrenew, args).await
                })
                .await;
            for (position, (i, _, _)) in chunk.iter().enumerate() {
                let lease = leases[*i];
                let result = match &answer {
                    Ok(replies) => match replies.get(position) {
                        Some(Ok(Value::Int(1))) => renewed_until(sent_at, lease.ttl(), op),
                        Some(Ok(Value::Int(0))) => Err(not_held(
                            op,
                            lease.key(),
                            "the lock is not held by this lease any more",
                        )),
                        Some(Ok(other)) => Err(unexpected(op, other)),
                        Some(Err(err)) => Err(node.map_err(op, err.clone())),
                        None => {
                            Err(
                                LockError::new(ErrorKind::Backend, op, "short pipeline answer")
                                    .with_backend(NAME),
                            )
                        }
                    },
                    Err(err) => Err(copy_for_each(err, op)),
                };
                results[*i] = Some(result.map_err(|e| e.with_key(lease.key())));
            }
        }
        lock_core::results_in_order(results, NAME)
    }

    /// `release` of a read, write or permit lease.
    pub(super) async fn release_shared(&self, lease: &Lease) -> Result<bool, LockError> {
        let op = Operation::Release;
        let key = lease.key();
        let kind = lease.kind();
        if self.inner.redlock {
            return Err(redlock_unsupported(key, op));
        }
        let owner = lease.owner().to_hex();
        let owner = owner.as_str();
        let names = self.shared_names(key, kind);
        let names = &names;
        let scripts = &self.inner.scripts;
        let value = self.inner.nodes[0]
            .run(
                op,
                self.inner.config.operation_timeout,
                move |mut conn| async move {
                    match names {
                        // The writer: the mutex's compare-and-delete (its
                        // details with it) + publish.
                        Names::Rw(n) if kind == LeaseKind::Write => {
                            conn.eval(
                                &scripts.release,
                                &[&n.writer, &n.writer_details],
                                &[owner, &n.channel],
                            )
                            .await
                        }
                        Names::Rw(n) => {
                            conn.eval(
                                &SHARED.remove,
                                &[&n.readers, &n.details],
                                &[owner, &n.channel, "1"],
                            )
                            .await
                        }
                        Names::Sem(n) => {
                            conn.eval(
                                &SHARED.remove,
                                &[&n.holders, &n.counts, &n.tokens, &n.details],
                                &[owner, &n.channel, "1"],
                            )
                            .await
                        }
                    }
                },
            )
            .await
            .map_err(|e| e.with_key(key))?;
        Ok(as_int(&value, op)? == 1)
    }

    /// `downgrade`: the write entry goes and the same owner joins the
    /// readers with the same token, in one script.
    pub(super) async fn downgrade_shared(&self, lease: &Lease) -> Result<Lease, LockError> {
        let op = Operation::Downgrade;
        let key = lease.key();
        if self.inner.redlock {
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
        self.check_ttl(lease.ttl(), op, key)?;
        let n = RwNames::new(&self.inner.config.prefix, key);
        let owner = lease.owner().to_hex();
        let ttl_text = ttl_ms(lease.ttl());
        let (n, owner_ref, ttl_ref) = (&n, owner.as_str(), ttl_text.as_str());
        let sent_at = Instant::now();
        let value = self.inner.nodes[0]
            .run(
                op,
                self.inner.config.operation_timeout,
                move |mut conn| async move {
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
                },
            )
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

    /// `holders` of a read-write lock or a semaphore.
    pub(super) async fn holders_shared(
        &self,
        key: &LockKey,
        shape: LockShape,
    ) -> Result<Vec<HolderInfo>, LockError> {
        let op = Operation::Inspect;
        if self.inner.redlock {
            return Err(redlock_unsupported(key, op));
        }
        let prefix = &self.inner.config.prefix;
        let (rw, sem) = (RwNames::new(prefix, key), SemNames::new(prefix, key));
        let (rw, sem) = (&rw, &sem);
        let value = self.inner.nodes[0]
            .run(
                op,
                self.inner.config.operation_timeout,
                move |mut conn| async move {
                    if shape == LockShape::Semaphore {
                        conn.eval(
                            &SHARED.sem_holders,
                            &[
                                &sem.holders,
                                &sem.counts,
                                &sem.tokens,
                                &sem.counters,
                                &sem.details,
                            ],
                            &[],
                        )
                        .await
                    } else {
                        conn.eval(
                            &SHARED.rw_holders,
                            &[
                                &rw.writer,
                                &rw.readers,
                                &rw.counters,
                                &rw.details,
                                &rw.writer_details,
                            ],
                            &[],
                        )
                        .await
                    }
                },
            )
            .await
            .map_err(|e| e.with_key(key))?;
        let Value::Array(items) = &value else {
            return Err(unexpected(op, &value));
        };
        let int = |v: &Value| as_int(v, op);
        let ms = |v: &Value| int(v).map(pttl);
        let mut out = Vec::new();
        if shape == LockShape::Semaphore {
            let [limit, rest @ ..] = items.as_slice() else {
                return Err(unexpected(op, &value));
            };
            let limit = u32::try_from(int(limit)?).map_err(|_| unexpected(op, &value))?;
            for holder in rest.chunks(5) {
                let [owner, left, count, token, details] = holder else {
                    return Err(unexpected(op, &value));
                };
                let count = u32::try_from(int(count)?).map_err(|_| unexpected(op, &value))?;
                out.push(HolderInfo {
                    details: share_details(details),
                    kind: LeaseKind::permits(count, limit.max(count))
                        .map_err(|_| unexpected(op, &value))?,
                    holder: text(owner).unwrap_or_default(),
                    token: Some(token_of(int(token)?, op, &value)?),
                    remaining_ttl: ms(left)?,
                });
            }
            return Ok(out);
        }
        let [writer, writer_ttl, epoch, writer_side, readers @ ..] = items.as_slice() else {
            return Err(unexpected(op, &value));
        };
        // The writer's token is the epoch (set by its grant); every live
        // reader was granted after it, or by its downgrade, so carries it too.
        let epoch = token_of(int(epoch)?, op, &value)?;
        let writer = text(writer).unwrap_or_default();
        if !writer.is_empty() {
            out.push(HolderInfo {
                details: text(writer_side).and_then(|side| details_of(&writer, &side)),
                kind: LeaseKind::Write,
                holder: writer,
                token: Some(epoch),
                remaining_ttl: ms(writer_ttl)?,
            });
        }
        for reader in readers.chunks(3) {
            let [owner, left, details] = reader else {
                return Err(unexpected(op, &value));
            };
            out.push(HolderInfo {
                details: share_details(details),
                kind: LeaseKind::Read,
                holder: text(owner).unwrap_or_default(),
                token: Some(epoch),
                remaining_ttl: ms(left)?,
            });
        }
        Ok(out)
    }
}
