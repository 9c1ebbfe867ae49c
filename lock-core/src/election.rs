//! Leader election on any backend, on top of a renewed lock.
//!
//! A campaign for election `name` is a waiting acquire of the mutex
//! `election/<name>`: the holder leads, and its lock's fencing token is its
//! **term**, which strictly increases over terms on every backend with
//! fencing tokens (see [`Capabilities::fencing`](crate::Capabilities)). The
//! leadership is a guard: renewed on its own, with the same
//! `Held -> Suspect -> Lost` states, the same early `Lost` (no later than
//! the local validity deadline, before the store could elect anyone else)
//! and `run(work)`, which drops `work` when leadership is lost.
//!
//! Observers follow the leader without campaigning
//! ([`LockClient::leader`], [`LockClient::observe_leader`]).
//!
//! Every backend gets this generic election on its renewed mutex. A driver
//! may bring its store's own election layout instead (see
//! [`LockBackendExt::campaign`]): etcd's uses
//! the layout of etcd's `concurrency.Election` and ZooKeeper's that of
//! Curator's `LeaderLatch`, so `etcdctl elect` and Curator candidates see
//! the same leader as this crate's. Observers wake on the store's watch
//! where the driver has one, and poll otherwise.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use crate::calls::LockBackendExt;
use crate::client::LockClient;
use crate::error::{LockError, Operation};
use crate::facets::WatchRequest;
use crate::guard::LockGuard;
use crate::hold::LockState;
use crate::key::LockKey;
use crate::options::{check_ttl, saturating_add};
use crate::types::{FencingToken, OwnerId};

pub(crate) mod record;

pub use crate::calls::watch_mutex_leader;
use record::ELECTION_KEY_PREFIX;
pub use record::{ElectionInfo, ElectionPage, Leader, election_key, election_lock_key};

/// [`Listing::list_elections`](crate::Listing::list_elections)'s default, for a driver whose elections
/// are the default renewed mutex ([`election_lock_key`]): one page of the
/// mutexes under `election/<prefix>`, each as its election's leader.
///
/// # Errors
///
/// As [`Listing::list`](crate::Listing::list).
///
/// # Cancel safety
///
/// Safe: read-only.
pub async fn list_mutex_elections<B: crate::Listing + ?Sized>(
    backend: &B,
    query: &crate::ListQuery,
) -> Result<ElectionPage, LockError> {
    let page = backend
        .list(&query.with_prefix(election_key(&query.prefix)))
        .await?;
    let mut elections = Vec::with_capacity(page.locks.len());
    for info in page.locks {
        let Some(name) = info.key.as_str().strip_prefix(ELECTION_KEY_PREFIX) else {
            continue;
        };
        let Ok(election) = LockKey::new(name) else {
            continue;
        };
        elections.push(ElectionInfo {
            election,
            leader: Leader::from_info(info),
        });
    }
    Ok(ElectionPage {
        elections,
        cursor: page.cursor,
    })
}

/// A campaign, made by [`LockClient::elect`].
#[derive(Debug)]
#[must_use = "a campaign does nothing until awaited"]
pub struct Campaign<'a> {
    client: &'a LockClient,
    name: String,
    ttl: Option<Duration>,
    wait: Duration,
}

impl<'a> Campaign<'a> {
    pub(crate) fn new(client: &'a LockClient, name: &str) -> Self {
        Self {
            client,
            name: name.to_owned(),
            ttl: None,
            wait: Duration::MAX,
        }
    }

    /// The leadership's lease TTL (renewed; default: the client's).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long to campaign before giving up (default: for ever).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Campaigns until this client leads (or the wait ends).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for
    /// a bad name or TTL; [`ErrorKind::Contended`](crate::ErrorKind::Contended)
    /// when another candidate led for the whole wait; backend errors.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future withdraws the candidacy (as dropping a waiting
    /// acquire does): this client does not become leader afterwards.
    pub async fn campaign(self) -> Result<Leadership, LockError> {
        let backend = self.client.backend().clone();
        let name = LockKey::new(&self.name).map_err(|e| e.with_backend(backend.name()))?;
        let election = election_lock_key(&name).map_err(|e| e.with_backend(backend.name()))?;
        let defaults = self.client.defaults();
        let ttl = self.ttl.unwrap_or(defaults.ttl);
        check_ttl(ttl, backend.capabilities().min_ttl, Operation::Acquire)
            .map_err(|e| e.with_key(&election).with_backend(backend.name()))?;
        defaults
            .renewal
            .validate(ttl)
            .map_err(|e| e.with_key(&election).with_backend(backend.name()))?;
        let deadline = saturating_add(Instant::now(), self.wait);
        let span = tracing::debug_span!(
            "distlock.campaign",
            backend = backend.name(),
            election = %name,
            ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            wait_ms = u64::try_from(self.wait.as_millis()).unwrap_or(u64::MAX),
            term = tracing::field::Empty,
            owner = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let result = backend
            .campaign(&name, ttl, deadline)
            .instrument(span.clone())
            .await;
        crate::telemetry::record_grant(&span, &result, "term", "leading");
        let lease = result?;
        Ok(Leadership {
            guard: self.client.guard_for(lease, &defaults.renewal),
        })
    }
}

/// This client leads an election (until it resigns or loses leadership).
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
}

impl Leadership {
    /// The term: strictly greater than every earlier term of this election
    /// (on a backend with fencing tokens). Hand it to what the leader
    /// writes to, as a fencing token.
    pub fn term(&self) -> FencingToken {
        self.guard.token()
    }

    /// This leader's owner value.
    pub fn owner(&self) -> OwnerId {
        self.guard.owner()
    }

    /// The election's lock key.
    pub fn key(&self) -> LockKey {
        self.guard.key()
    }

    /// `Held` while leading; `Suspect` when renewals fail; `Lost` once
    /// leadership is (or may be) gone, no later than the local deadline.
    pub fn state(&self) -> LockState {
        self.guard.state()
    }

    /// Whether this client leads and may act on it right now.
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// A receiver of state changes.
    pub fn subscribe(&self) -> watch::Receiver<LockState> {
        self.guard.subscribe()
    }

    /// Resolves when leadership is lost (or resigned), with the reason.
    ///
    /// # Cancel safety
    ///
    /// Safe: it only watches.
    pub async fn lost(&self) -> String {
        self.guard.lost().await
    }

    /// Runs `work` while leading; drops it as soon as leadership is lost.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost) when leadership
    /// was lost before `work` finished.
    ///
    /// # Cancel safety
    ///
    /// Dropping this future drops `work`; this client still leads.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, LockError> {
        self.guard.run(work).await
    }

    /// Steps down, so another candidate can lead. Returns `Ok(true)` when
    /// this client still led.
    ///
    /// # Errors
    ///
    /// The backend's release errors; the leadership then ends with its TTL.
    ///
    /// # Cancel safety
    ///
    /// As [`LockGuard::release`].
    pub async fn resign(self) -> Result<bool, LockError> {
        self.guard.release().await
    }

    /// The leadership's lock guard.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The leadership as its lock guard (releasing it resigns).
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }
}

impl LockClient {
    /// Starts a campaign in election `name` (see [`crate::election`]).
    pub fn elect(&self, name: &str) -> Campaign<'_> {
        Campaign::new(self, name)
    }

    /// Who leads election `name` right now (`None`: nobody).
    ///
    /// # Errors
    ///
    /// A bad name; the backend's inspect errors.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    pub async fn leader(&self, name: &str) -> Result<Option<Leader>, LockError> {
        let backend = self.backend();
        let name = LockKey::new(name).map_err(|e| e.with_backend(backend.name()))?;
        let span =
            tracing::debug_span!("distlock.leader", backend = backend.name(), election = %name);
        backend.leader(&name).instrument(span).await
    }

    /// Follows election `name`'s leader without campaigning: the receiver
    /// sees every change of leader (or `None` between leaders), as soon as
    /// the store's watch reports it where the driver has one, and within
    /// `every` otherwise. Observation stops when every receiver is dropped.
    /// Errors reading the leader keep the last value (and are retried after
    /// `every`); a bad name leaves the receiver at `None`.
    ///
    /// Must be called inside a Tokio runtime (it spawns the observer).
    pub fn observe_leader(&self, name: &str, every: Duration) -> watch::Receiver<Option<Leader>> {
        let (tx, rx) = watch::channel(None);
        let backend = self.backend().clone();
        let every = every.max(Duration::from_millis(10));
        let Ok(name) = LockKey::new(name) else {
            return rx;
        };
        tokio::spawn(async move {
            // The first read may find nobody: `None` is the initial value.
            let mut seen: Option<Leader> = None;
            loop {
                // Wake at least every few seconds to notice closed receivers.
                let until = Instant::now() + every.max(Duration::from_secs(5));
                let read = tokio::select! {
                    () = tx.closed() => return,
                    read = backend.watch_leader(WatchRequest::new(&name, seen.as_ref(), every, until)) => read,
                };
                match read {
                    Ok(now) => {
                        if !Leader::same(now.as_ref(), seen.as_ref()) {
                            tx.send_replace(now.clone());
                        }
                        seen = now;
                    }
                    Err(_) => tokio::select! {
                        () = tx.closed() => return,
                        () = tokio::time::sleep(every) => {}
                    },
                }
            }
        });
        rx
    }
}
