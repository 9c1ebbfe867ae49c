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
//! This is the generic election every backend gets; it is not the layout
//! of etcd's `concurrency.Election` or of Curator's `LeaderLatch`, so those
//! clients do not see this leader.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

use crate::client::LockClient;
use crate::error::LockError;
use crate::guard::{LockGuard, LockState};
use crate::key::LockKey;
use crate::types::{FencingToken, OwnerId};

/// The lock key an election's campaigns take.
pub fn election_key(name: &str) -> String {
    format!("election/{name}")
}

/// The current leader of an election, as observers see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leader's owner value as the backend stores it.
    pub holder: String,
    /// Its term (its lock's fencing token), where the backend has tokens.
    pub term: Option<FencingToken>,
    /// Time left before the store frees the leadership unless renewed.
    pub remaining_ttl: Option<Duration>,
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
        let mut request = self.client.lock(election_key(&self.name)).wait(self.wait);
        if let Some(ttl) = self.ttl {
            request = request.ttl(ttl);
        }
        Ok(Leadership {
            guard: request.acquire().await?,
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
        Ok(self.inspect(election_key(name)).await?.map(|info| Leader {
            holder: info.holder,
            term: info.token,
            remaining_ttl: info.remaining_ttl,
        }))
    }

    /// Follows election `name`'s leader without campaigning: the receiver
    /// sees every change of leader (or `None` between leaders), checked
    /// every `every`. Observation stops when every receiver is dropped.
    /// Errors reading the leader keep the last value.
    ///
    /// Must be called inside a Tokio runtime (it spawns the observer).
    pub fn observe_leader(&self, name: &str, every: Duration) -> watch::Receiver<Option<Leader>> {
        let (tx, rx) = watch::channel(None);
        let client = self.clone();
        let name = name.to_owned();
        let every = every.max(Duration::from_millis(10));
        tokio::spawn(async move {
            loop {
                if let Ok(leader) = client.leader(&name).await {
                    let who = |l: &Option<Leader>| l.as_ref().map(|l| (l.holder.clone(), l.term));
                    if who(&tx.borrow()) != who(&leader) {
                        tx.send_replace(leader);
                    }
                }
                tokio::select! {
                    () = tx.closed() => return,
                    () = tokio::time::sleep(every) => {}
                }
            }
        });
        rx
    }
}
