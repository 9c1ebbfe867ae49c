//! Renewing grants of this backend's own sessions: one at a time
//! (`renew_one`, which first checks that the entry still exists on the server)
//! and in batches (`renew_many`, one listing of each session's keys per
//! renewal round, shared by the round's batches: a client holding N locks
//! reads N keys per period, not N per batch).
//!
//! The session keeps its etcd lease alive on its own, so a renewal moves
//! the grant's own deadline in memory; what it asks the server is only
//! whether the entry is still there: an operator's `force_release` (or an
//! `etcdctl del`) deletes it behind the holder's back, and the holder's
//! next renewal must then fail `NotHeld`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn};
use lock_core::{
    ErrorKind, Lease, LeaseKind, LockError, Operation, RENEW_CONCURRENCY, SessionState,
    renew_concurrently, validity_deadline, with_timeout,
};
use tokio::time::Instant;

use crate::connection::{Connection, RenewRefused, Session, clean_up_later, txn_on};
use crate::error::{NAME, from_etcd};
use crate::grants::Grants;
use crate::keys;

/// The keys a session's lease had when they were last listed, as hashes
/// (8 bytes a key while the round lasts, not the key: a client may hold
/// 100,000; a collision, at odds of 2^-64, would only delay noticing one
/// deleted entry to the next round).
struct Attached {
    sent_at: Instant,
    /// The session's newest grant when the listing was asked for
    /// ([`Session::newest_grant`]): a grant created later may be missing
    /// from it. (Not the answer's header revision: the server reads that
    /// after it collected the keys, so an entry created in between counts
    /// in the revision but is not listed.)
    revision: i64,
    /// Sorted.
    keys: Arc<Vec<u64>>,
}

fn key_hash(key: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    key.hash(&mut hasher);
    hasher.finish()
}

/// A lease of one of this backend's sessions: its entry, the entry's
/// create revision and the session.
struct LocalGrant {
    entry: String,
    revision: i64,
    session: Arc<Session>,
}

fn not_held(lease: &Lease, why: &str) -> LockError {
    LockError::new(ErrorKind::NotHeld, Operation::Renew, why.to_owned())
        .with_key(lease.key())
        .with_backend(NAME)
}

const DELETED: &str =
    "the entry was deleted on the server (force-released, or deleted by an operator)";

/// Renewals of grants: `renew_many` and `renew_one`.
pub(crate) struct Renewal {
    conn: Arc<Connection>,
    grants: Grants,
    /// The keys each session's lease had at its last listing, shared by the
    /// renewal batches of one round.
    attached: tokio::sync::Mutex<HashMap<i64, Attached>>,
}

impl std::fmt::Debug for Renewal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewal").finish_non_exhaustive()
    }
}

impl Renewal {
    pub(crate) fn new(conn: Arc<Connection>, grants: Grants) -> Self {
        Self {
            conn,
            grants,
            attached: tokio::sync::Mutex::default(),
        }
    }

    /// Where `lease` lives if it is a grant of one of this backend's
    /// sessions, without a network call (`None` for a lease of another
    /// process or one that does not parse: `renew_one` handles those).
    fn local_grant(&self, lease: &Lease) -> Option<LocalGrant> {
        let op = Operation::Renew;
        let (entry, revision, lease_id) = if lease.kind() != LeaseKind::Exclusive {
            self.grants.parse_shared_lease(lease, op).ok()?
        } else if !lease.backend_data().is_empty() {
            self.grants.parse_lease(lease, op).ok()?
        } else {
            let session = self.conn.session_owning(lease.owner())?;
            let revision = i64::try_from(lease.token().get()).ok()?;
            let entry = format!("{}{}", self.conn.key_prefix(lease.key()), session.hex());
            (entry, revision, session.lease_id())
        };
        let session = self.conn.session_by_lease(lease_id)?;
        Some(LocalGrant {
            entry,
            revision,
            session,
        })
    }

    /// How long a renewal's check on the server may take
    /// ([`Session::call_budget`]).
    fn check_budget(&self, session: &Session) -> Duration {
        session.call_budget(self.conn.config.op_timeout)
    }

    /// Whether the entry created at `revision` still exists: one
    /// transaction comparing its create revision (no operations).
    async fn entry_exists(
        &self,
        entry: &str,
        revision: i64,
        budget: Duration,
    ) -> Result<bool, LockError> {
        let op = Operation::Renew;
        let txn = Txn::new().when([Compare::create_revision(entry, CompareOp::Equal, revision)]);
        let mut kv = self.conn.client.kv_client();
        let response = txn_on(&mut kv, budget, op, txn).await?;
        Ok(response.succeeded())
    }

    /// Renews a grant of our own session whose entry was seen on the server
    /// after `sent_at`: moves its deadline (no network call). An entry seen
    /// gone is forgotten by the caller before this.
    fn renew_local(
        &self,
        lease: &Lease,
        grant: LocalGrant,
        sent_at: Instant,
    ) -> Result<Instant, LockError> {
        let op = Operation::Renew;
        let LocalGrant {
            entry,
            revision,
            session,
        } = grant;
        if !session.holds(&entry, revision, lease.owner()) {
            return Err(not_held(lease, "the lease was released or lost"));
        }
        if let SessionState::Lost(reason) = session.state() {
            return Err(LockError::new(ErrorKind::LeaseLost, op, reason)
                .with_key(lease.key())
                .with_backend(NAME));
        }
        let deadline = session
            .deadline()
            .min(validity_deadline(sent_at, lease.ttl()));
        if deadline <= Instant::now() {
            return Err(LockError::new(
                ErrorKind::LeaseLost,
                op,
                "the session's lease deadline passed",
            )
            .with_key(lease.key())
            .with_backend(NAME));
        }
        let due = sent_at.checked_add(lease.ttl()).unwrap_or(sent_at);
        match session.renew_held(&entry, revision, lease.owner(), sent_at, due) {
            Ok(()) => Ok(deadline),
            Err(RenewRefused::NotHeld) => Err(not_held(lease, "the lease was released or lost")),
            Err(RenewRefused::Expired) => {
                clean_up_later(&self.conn.client, session, entry, lease.owner(), revision);
                Err(not_held(
                    lease,
                    "the lock's TTL ran out before this renewal; its entry is deleted",
                ))
            }
        }
    }

    /// `renew_one` of a grant of our own session: checks that its entry still
    /// exists (one request), then moves its deadline.
    async fn renew_own(&self, lease: &Lease, grant: LocalGrant) -> Result<Instant, LockError> {
        if !grant
            .session
            .holds(&grant.entry, grant.revision, lease.owner())
        {
            return Err(not_held(lease, "the lease was released or lost"));
        }
        let budget = self.check_budget(&grant.session);
        let sent_at = Instant::now();
        let exists = self
            .entry_exists(&grant.entry, grant.revision, budget)
            .await
            .map_err(|e| e.with_key(lease.key()))?;
        if !exists {
            grant.session.forget_grant(&grant.entry, grant.revision);
            return Err(not_held(lease, DELETED));
        }
        self.renew_local(lease, grant, sent_at)
    }

    /// The keys attached to the session's lease, with the moment the
    /// listing was asked for: one `LeaseTimeToLive` request, reused by the
    /// other batches of the same renewal round (asked within a sixth of the
    /// session's TTL; a round's batches are due together, the next round
    /// comes a third of the TTL later) as long as the session had handed
    /// out `newest`, the newest entry the batch asks about, before the
    /// listing was asked for (an entry created after the listing is
    /// missing from it, and must not be taken for one deleted behind our
    /// back). `Ok(None)`: the server no longer has the lease.
    async fn attached_keys(
        &self,
        lease_id: i64,
        session: &Session,
        newest: i64,
    ) -> Result<Option<(Instant, Arc<Vec<u64>>)>, LockError> {
        let op = Operation::Renew;
        // Held across the request: a batch that comes while another asks
        // waits for its answer instead of asking again.
        let mut cache = self.attached.lock().await;
        let fresh_for = session.server_ttl() / 6;
        if let Some(seen) = cache.get(&lease_id)
            && seen.sent_at.elapsed() < fresh_for
            && seen.revision >= newest
        {
            return Ok(Some((seen.sent_at, seen.keys.clone())));
        }
        let revision = session.newest_grant();
        let sent_at = Instant::now();
        let listed = session
            .list_keys(&self.conn.client, self.conn.config.op_timeout, op)
            .await?;
        let Some(answer) = listed else {
            cache.remove(&lease_id);
            return Ok(None);
        };
        // etcd lists a lease's keys in no promised order.
        let mut hashes: Vec<u64> = answer.keys().iter().map(|k| key_hash(k)).collect();
        hashes.sort_unstable();
        let keys = Arc::new(hashes);
        // Forget sessions that are gone, so the map stays as small as the
        // live sessions.
        cache.retain(|_, seen| seen.sent_at.elapsed() < fresh_for.max(Duration::from_secs(60)));
        cache.insert(
            lease_id,
            Attached {
                sent_at,
                revision,
                keys: keys.clone(),
            },
        );
        Ok(Some((sent_at, keys)))
    }

    /// `renew_many`: the grants of each of our sessions with one
    /// `LeaseTimeToLive` request listing the keys attached to its lease
    /// (an entry missing from the list was deleted behind our back), the
    /// rest (leases of other processes) with `renew_one`.
    pub(crate) async fn renew_batch(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        let op = Operation::Renew;
        let mut results: Vec<Option<Result<Instant, LockError>>> =
            std::iter::repeat_with(|| None).take(leases.len()).collect();
        let mut by_session: HashMap<i64, Vec<(usize, LocalGrant)>> = HashMap::new();
        let mut others = Vec::new();
        for (i, lease) in leases.iter().enumerate() {
            match self.local_grant(lease) {
                Some(grant) => by_session
                    .entry(grant.session.lease_id())
                    .or_default()
                    .push((i, grant)),
                None => others.push(i),
            }
        }
        for (lease_id, grants) in by_session {
            let Some(session) = grants.first().map(|(_, g)| g.session.clone()) else {
                continue;
            };
            let newest = grants.iter().map(|(_, g)| g.revision).max().unwrap_or(0);
            let answer = self.attached_keys(lease_id, &session, newest).await;
            match answer {
                // The TTL is in whole seconds, rounded down: 0 for a live
                // lease with less than a second left; -1 for a lease the
                // server no longer has.
                Ok(Some((sent_at, attached))) => {
                    for (i, grant) in grants {
                        let lease = leases[i];
                        results[i] =
                            Some(if attached.contains(&key_hash(grant.entry.as_bytes())) {
                                self.renew_local(lease, grant, sent_at)
                            } else {
                                grant.session.forget_grant(&grant.entry, grant.revision);
                                Err(not_held(lease, DELETED))
                            });
                    }
                }
                Ok(None) => {
                    for (i, grant) in grants {
                        grant
                            .session
                            .lose("the lease expired on the server (TTL 0)");
                        results[i] = Some(Err(LockError::new(
                            ErrorKind::LeaseLost,
                            op,
                            "the session's lease is gone on the server",
                        )
                        .with_key(leases[i].key())
                        .with_backend(NAME)));
                    }
                }
                Err(err) => {
                    for (i, _) in grants {
                        results[i] = Some(Err(LockError::new(err.kind(), op, err.to_string())
                            .with_key(leases[i].key())
                            .with_backend(NAME)));
                    }
                }
            }
        }
        if !others.is_empty() {
            let rest: Vec<&Lease> = others.iter().map(|&i| leases[i]).collect();
            let renewed =
                renew_concurrently(&rest, RENEW_CONCURRENCY, |lease| self.renew_one(lease)).await;
            for (i, result) in others.into_iter().zip(renewed) {
                results[i] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(
                        LockError::new(ErrorKind::Backend, op, "no renewal result for this lease")
                            .with_backend(NAME),
                    )
                })
            })
            .collect()
    }

    /// Renews one lease: a grant of our own session moves its deadline
    /// once its entry is seen still there; a lease of another process has
    /// its etcd lease refreshed and its entry checked.
    pub(crate) async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        let op = Operation::Renew;
        let not_held = |why: &str| {
            LockError::new(ErrorKind::NotHeld, op, why.to_owned())
                .with_key(lease.key())
                .with_backend(NAME)
        };
        let Some((entry, revision, lease_id)) = self.grants.resolve_lease(lease, op).await? else {
            return Err(not_held("the entry is gone"));
        };
        if let Some(session) = self.conn.session_by_lease(lease_id) {
            // Our own session keeps the etcd lease alive, and this backend
            // deletes the entry at the grant's own deadline: renewing moves
            // that deadline, once the entry is seen still there (one
            // request: it may have been force-released).
            let grant = LocalGrant {
                entry,
                revision,
                session,
            };
            return self.renew_own(lease, grant).await;
        }
        // A lease of another process (rebuilt from a handle): refresh its
        // etcd lease once and check the entry is still the same one.
        let sent_at = Instant::now();
        let mut lease_client = self.conn.client.lease_client();
        let kept = with_timeout(self.conn.config.op_timeout, op, async {
            lease_client
                .keep_alive(lease_id)
                .await
                .map_err(|e| from_etcd(op, e))
        })
        .await;
        match kept {
            Ok(_) => {}
            Err(err) if err.kind() == ErrorKind::LeaseLost => {
                return Err(not_held("the etcd lease is gone"));
            }
            Err(err) => return Err(err.with_key(lease.key())),
        }
        let granted = with_timeout(self.conn.config.op_timeout, op, async {
            lease_client
                .time_to_live(lease_id, None)
                .await
                .map_err(|e| from_etcd(op, e))
        })
        .await
        .map_err(|e| e.with_key(lease.key()))?;
        let mut compares = vec![Compare::create_revision(
            entry.as_str(),
            CompareOp::Equal,
            revision,
        )];
        if lease.kind() == LeaseKind::Exclusive {
            compares.extend(keys::owner_compares(&entry, lease.owner()));
        } else {
            compares.extend(keys::shared_owner_compares(
                &entry,
                lease.kind(),
                lease.owner(),
            ));
        }
        let txn = Txn::new().when(compares);
        if !self
            .conn
            .txn(op, txn)
            .await
            .map_err(|e| e.with_key(lease.key()))?
            .succeeded()
        {
            return Err(not_held("the entry is gone or was re-created"));
        }
        let server_ttl = u64::try_from(granted.granted_ttl())
            .map(Duration::from_secs)
            .unwrap_or(Duration::ZERO);
        let deadline = validity_deadline(sent_at, lease.ttl().min(server_ttl));
        if deadline <= Instant::now() {
            return Err(not_held("the etcd lease has no time left"));
        }
        Ok(deadline)
    }
}
