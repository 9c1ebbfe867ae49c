//! Beyond one mutex: elections and multi-locks on a real etcd server.
//!
//! Elections in the layout of etcd's `concurrency.Election`: interop with
//! the real `etcdctl elect` in both directions, one leader at a time among
//! our candidates (several per backend), terms that strictly increase, and
//! observers woken by the watch, and campaigns that end without winning
//! (dropped, or at their deadline) leave no candidacy. Each check is also
//! run on a broken candidate, and must fail there: one that takes
//! leadership without looking at older candidates ([`IgnoresOlder`]), one
//! that never withdraws ([`NeverWithdraws`]).
//!
//! Multi-locks: `try_acquire_all` takes a set in one transaction, all or
//! nothing; the check also runs on a broken variant that takes the keys
//! one by one and keeps them when refused ([`OneByOne`]), and must fail.
//!
//! Writes guarded by the store (`guarded_txn`): the shared guarded-write
//! cases on data in the same etcd, and on a store that writes without the
//! ownership compares, which they must catch (`compose/guarded.rs`).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::OrSkip;
use conformance::history::{History, Op};
use conformance::servers::etcd::EtcdServer;
use etcd_client::PutOptions;
use lock_core::election::{Leader, election_lock_key};
use lock_core::{
    ErrorKind, Facets, FencingToken, HolderDetails, Lease, LockBackend, LockBackendExt, LockClient,
    LockError, LockKey, OwnerId, WatchRequest,
};
use lock_etcd::{EtcdBackend, EtcdConfig};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::{Instant, sleep, timeout};

mod common;

const PREFIX: &str = "el";

async fn backend(server: &EtcdServer) -> EtcdBackend {
    connect_at(server, PREFIX).await
}

async fn connect_at(server: &EtcdServer, prefix: &str) -> EtcdBackend {
    EtcdBackend::connect(
        EtcdConfig::new(server.endpoints())
            .prefix(prefix)
            .ttl(Duration::from_secs(5))
            .op_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap()
}

/// The name `etcdctl elect` takes for our election `name` (crate docs).
fn etcdctl_name(name: &str) -> String {
    format!("{PREFIX}/{name}%elect")
}

/// `etcdctl elect <args>` with its output lines.
fn spawn_elect(
    etcdctl: &Path,
    endpoint: &str,
    args: &[&str],
) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new(etcdctl)
        .arg(format!("--endpoints={endpoint}"))
        .arg("elect")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>, within: Duration) -> Option<String> {
    timeout(within, lines.next_line()).await.ok()?.ok()?
}

/// SIGTERM: `etcdctl elect` resigns (or withdraws) and exits.
async fn terminate(mut child: Child) {
    let pid = libc::pid_t::try_from(child.id().unwrap()).unwrap();
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let _ = timeout(Duration::from_secs(5), child.wait()).await;
}

/// A broken candidate: it puts its entry in the election's layout (own
/// lease, `<election prefix><lease hex>`) and leads at once, ignoring
/// older candidates. Everything but its campaigns' leases goes to the
/// inner backend (`leader` and `watch_leader` read what etcd shows).
#[derive(Debug)]
struct IgnoresOlder {
    inner: EtcdBackend,
    lease: i64,
    counter: AtomicU64,
}

impl IgnoresOlder {
    async fn new(inner: EtcdBackend) -> Self {
        let grant = inner.client().clone().lease_grant(10, None).await.unwrap();
        let mut keeper = inner.client().clone();
        let lease = grant.id();
        tokio::spawn(async move {
            if let Ok((mut k, _s)) = keeper.lease_keep_alive(lease).await {
                while k.keep_alive().await.is_ok() {
                    sleep(Duration::from_secs(2)).await;
                }
            }
        });
        Self {
            inner,
            lease,
            counter: AtomicU64::new(0),
        }
    }
}

#[lock_core::async_trait]
impl lock_core::LockWrapper for IgnoresOlder {
    fn inner(&self) -> &dyn LockBackend {
        &self.inner
    }
    fn name(&self) -> &'static str {
        "etcd-ignores-older"
    }
    /// Each lease through this double's `renew_one` (the inner backend's
    /// batch knows nothing of the broken candidacies).
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        lock_core::renew_concurrently(leases, lock_core::RENEW_CONCURRENCY, |lease| {
            self.renew_one(lease)
        })
        .await
    }
    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let Some(entry) = lease.backend_data().strip_prefix("broken:") else {
            return self.inner.release(lease).await;
        };
        let deleted = self
            .inner
            .client()
            .clone()
            .delete(entry, None)
            .await
            .unwrap();
        Ok(deleted.deleted() == 1)
    }
    /// The inner backend's facets, with this double's elections.
    fn facets(&self) -> Facets<'_> {
        Facets {
            elections: Some(self),
            ..self.inner.facets()
        }
    }
}

impl IgnoresOlder {
    async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        let Some(entry) = lease.backend_data().strip_prefix("broken:") else {
            return self.inner.renew(lease).await;
        };
        let found = self.inner.client().clone().get(entry, None).await.unwrap();
        if found.kvs().is_empty() {
            return Err(LockError::new(
                ErrorKind::NotHeld,
                lock_core::Operation::Renew,
                "gone",
            ));
        }
        Ok(Instant::now() + lease.ttl())
    }
}

/// Leads at once; `leader` and `watch_leader` are the inner backend's.
#[lock_core::async_trait]
impl lock_core::Elections for IgnoresOlder {
    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        LockBackendExt::leader(&self.inner, election).await
    }
    async fn watch_leader(
        &self,
        request: WatchRequest<'_, Leader>,
    ) -> Result<Option<Leader>, LockError> {
        LockBackendExt::watch_leader(&self.inner, request).await
    }
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        _deadline: Instant,
    ) -> Result<Lease, LockError> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let entry = format!("{}/{:x}-{n}", etcdctl_name(election.as_str()), self.lease);
        let owner = OwnerId::random();
        let sent_at = Instant::now();
        let put = self
            .inner
            .client()
            .clone()
            .put(
                entry.as_str(),
                owner.to_hex(),
                Some(PutOptions::new().with_lease(self.lease)),
            )
            .await
            .unwrap();
        let revision = u64::try_from(put.header().unwrap().revision()).unwrap();
        Lease::granted(
            election_lock_key(election)?,
            owner,
            FencingToken::new(revision),
            ttl,
            sent_at,
            format!("broken:{entry}"),
        )
    }
}

/// (b) `etcdctl elect <name> p` leads: `leader()` reports its proposal, an
/// observer and our campaign wait, and we win (through the watch, long
/// before etcdctl's 60 s session TTL) when it resigns on SIGTERM. Returns
/// the hand-over time, or what went wrong.
async fn waits_while_etcdctl_leads(
    ours: Arc<dyn LockBackend>,
    etcdctl: &Path,
    endpoint: &str,
    name: &str,
) -> Result<Duration, String> {
    let election = LockKey::new(name).unwrap();
    let (child, mut out) = spawn_elect(etcdctl, endpoint, &[&etcdctl_name(name), "p"]);
    let key = next_line(&mut out, Duration::from_secs(10))
        .await
        .ok_or("etcdctl did not lead")?;
    assert_eq!(
        next_line(&mut out, Duration::from_secs(2)).await.as_deref(),
        Some("p")
    );
    assert!(
        key.starts_with(&format!("{}/", etcdctl_name(name))),
        "{key}"
    );
    let theirs = ours
        .leader(&election)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no leader")?;
    if theirs.holder != "p" {
        return Err(format!(
            "leader() reported {theirs:?}, not etcdctl's proposal"
        ));
    }
    let observer = {
        let (ours, election, seen) = (ours.clone(), election.clone(), theirs.clone());
        tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(20);
            // A long poll: an observer woken in time was woken by the watch.
            ours.watch_leader(WatchRequest::new(
                &election,
                Some(&seen),
                Duration::from_secs(30),
                until,
            ))
            .await
        })
    };
    let campaign = {
        let (ours, election) = (ours.clone(), election.clone());
        tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(20);
            ours.campaign(&election, Duration::from_secs(5), until)
                .await
        })
    };
    sleep(Duration::from_millis(500)).await;
    if campaign.is_finished() {
        terminate(child).await;
        let lease = campaign.await.unwrap().map_err(|e| e.to_string())?;
        let _ = ours.release(&lease).await;
        return Err(format!(
            "our campaign won (term {}) while etcdctl led",
            lease.token()
        ));
    }
    if observer.is_finished() {
        return Err("the observer returned while the leader was unchanged".into());
    }
    let resigned = Instant::now();
    terminate(child).await;
    let lease = timeout(Duration::from_secs(5), campaign)
        .await
        .map_err(|_| "our campaign did not win after etcdctl resigned")?
        .unwrap()
        .map_err(|e| e.to_string())?;
    let handover = resigned.elapsed();
    let seen = timeout(Duration::from_secs(5), observer)
        .await
        .map_err(|_| "the observer did not wake")?
        .unwrap()
        .map_err(|e| e.to_string())?;
    let now = ours
        .leader(&election)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no leader after")?;
    if now.holder != lease.owner().to_hex() || now.term != Some(lease.token()) {
        return Err(format!("leader() is {now:?} after our win"));
    }
    if seen.as_ref().is_some_and(|s| s.holder == "p") {
        return Err(format!("the observer still saw etcdctl: {seen:?}"));
    }
    if theirs.term >= Some(lease.token()) {
        return Err(format!(
            "our term {} is not above etcdctl's {:?}",
            lease.token(),
            theirs.term
        ));
    }
    if !ours.release(&lease).await.map_err(|e| e.to_string())? {
        return Err("our resignation found nothing".into());
    }
    Ok(handover)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_and_our_candidates_see_one_leader() {
    let Some((server, etcdctl)) = common::server_and_etcdctl().await else {
        return;
    };
    let endpoint = server.endpoints().join(",");
    let ours = backend(&server).await;
    let client = LockClient::new(ours.clone());

    // (a) We lead: `etcdctl elect -l` prints our entry and value (our
    // owner id, a space and our holder details), and a campaigning
    // `etcdctl elect` does not win until we resign.
    let leading = client
        .elect("jobs")
        .ttl(Duration::from_secs(5))
        .campaign()
        .await
        .unwrap();
    assert_eq!(leading.key().as_str(), "election/jobs");
    let lease_hex = ours.session_lease(Duration::from_secs(5)).unwrap();
    let (listener, mut heard) = spawn_elect(&etcdctl, &endpoint, &["-l", &etcdctl_name("jobs")]);
    assert_eq!(
        next_line(&mut heard, Duration::from_secs(10)).await,
        Some(format!("{}/{lease_hex}", etcdctl_name("jobs")))
    );
    let proposal = next_line(&mut heard, Duration::from_secs(2))
        .await
        .expect("etcdctl elect -l printed no value");
    let details = proposal
        .strip_prefix(&format!("{} ", leading.owner().to_hex()))
        .and_then(HolderDetails::decode)
        .unwrap_or_else(|| panic!("etcdctl elect -l printed {proposal:?}"));
    assert_eq!(details.pid, std::process::id());
    let (contender, mut out) = spawn_elect(&etcdctl, &endpoint, &[&etcdctl_name("jobs"), "p"]);
    assert_eq!(
        next_line(&mut out, Duration::from_secs(1)).await,
        None,
        "etcdctl elect won while we led"
    );
    let ours_now = client.leader("jobs").await.unwrap().unwrap();
    assert_eq!(ours_now.holder, leading.owner().to_hex());
    assert_eq!(ours_now.term, Some(leading.term()));
    assert_eq!(ours_now.details, Some(details), "the details etcdctl saw");
    let our_term = leading.term();
    let resigned = Instant::now();
    assert!(leading.resign().await.unwrap());
    let key = next_line(&mut out, Duration::from_secs(5))
        .await
        .expect("etcdctl did not win after we resigned");
    assert!(
        key.starts_with(&format!("{}/", etcdctl_name("jobs"))),
        "{key}"
    );
    assert_eq!(
        next_line(&mut out, Duration::from_secs(2)).await.as_deref(),
        Some("p")
    );
    println!("us -> etcdctl elect handover: {:?}", resigned.elapsed());
    // The listener follows: etcdctl's entry and proposal.
    assert_eq!(
        next_line(&mut heard, Duration::from_secs(5)).await,
        Some(key)
    );
    assert_eq!(
        next_line(&mut heard, Duration::from_secs(2))
            .await
            .as_deref(),
        Some("p")
    );
    let theirs = client.leader("jobs").await.unwrap().unwrap();
    assert_eq!(theirs.holder, "p");
    assert_eq!(theirs.details, None, "etcdctl's proposal has no details");
    assert!(theirs.term.unwrap() > our_term);
    assert!(
        theirs.remaining_ttl.is_some_and(|t| t > Duration::ZERO),
        "{theirs:?}"
    );
    terminate(contender).await;
    terminate(listener).await;
    assert_eq!(client.leader("jobs").await.unwrap(), None);

    // (b) etcdctl leads: we wait, see its proposal, and win when it exits.
    let handover = waits_while_etcdctl_leads(Arc::new(ours.clone()), &etcdctl, &endpoint, "batch")
        .await
        .unwrap();
    println!("etcdctl elect -> us handover: {handover:?}");
    assert!(handover < Duration::from_secs(3), "{handover:?}");

    // The check fails on a candidate that ignores older ones.
    let broken = IgnoresOlder::new(ours.clone()).await;
    let err = waits_while_etcdctl_leads(Arc::new(broken), &etcdctl, &endpoint, "broken")
        .await
        .unwrap_err();
    println!("broken candidate caught: {err}");
    assert!(err.contains("while etcdctl led"), "{err}");
}

/// Candidates campaign, lead for a few milliseconds and resign in a loop
/// for `run`; returns the history's verdict: no two leaders at once, terms
/// strictly increasing.
async fn one_leader_at_a_time(
    candidates: Vec<Arc<dyn LockBackend>>,
    name: &str,
    run: Duration,
) -> Result<usize, String> {
    let election = LockKey::new(name).unwrap();
    let history = Arc::new(History::new());
    let end = Instant::now() + run;
    let mut tasks = Vec::new();
    for (i, backend) in candidates.into_iter().enumerate() {
        let rec = history.process();
        let election = election.clone();
        tasks.push(tokio::spawn(async move {
            let key = election_lock_key(&election).unwrap();
            let mut terms = 0_usize;
            while Instant::now() < end {
                rec.invoke(Op::Acquire, &key, None);
                let lease = backend
                    .campaign(
                        &election,
                        Duration::from_secs(5),
                        Instant::now() + Duration::from_secs(20),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                rec.acquired(&key, lease.token(), lease.validity_deadline());
                if lease.key() != &key {
                    return Err(format!("a leadership keyed on {}", lease.key()));
                }
                let deadline = backend
                    .renew(&lease)
                    .await
                    .map_err(|e| format!("renew: {e}"))?;
                rec.renewed(&key, lease.token(), deadline);
                terms += 1;
                sleep(Duration::from_millis(3 + 2 * i as u64)).await;
                rec.invoke(Op::Release, &key, Some(lease.token()));
                let held = backend.release(&lease).await.map_err(|e| e.to_string())?;
                rec.released(&key, lease.token(), held);
                if !held {
                    return Err(format!(
                        "term {} was gone at its resignation",
                        lease.token()
                    ));
                }
                match backend.renew(&lease).await {
                    Err(err) if err.kind() == ErrorKind::NotHeld => {}
                    other => return Err(format!("renew after resigning: {other:?}")),
                }
                sleep(Duration::from_millis(1)).await;
            }
            Ok::<usize, String>(terms)
        }));
    }
    let mut terms = 0;
    for task in tasks {
        terms += timeout(run + Duration::from_secs(30), task)
            .await
            .map_err(|_| "a candidate never finished")?
            .unwrap()?;
    }
    let report = history.check();
    if !report.is_exclusive() {
        return Err(format!("two leaders at once: {}", report.summary()));
    }
    if report.token_regressions > 0 || report.duplicate_tokens > 0 {
        return Err(format!(
            "terms did not strictly increase: {}",
            report.summary()
        ));
    }
    Ok(terms)
}

/// Our candidates (two backends, two candidates each, so that one session
/// has two entries under the election), while the generic election's mutex
/// `election/<name>` is held by someone else (disjoint layouts), and an
/// observer woken by the watch; then the same with a broken candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_with_several_candidates_per_session() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let (a, b) = (backend(&server).await, backend(&server).await);
    let mutex = a
        .try_acquire(
            &LockKey::new("election/race").unwrap(),
            Duration::from_secs(10),
        )
        .await
        .unwrap()
        .expect("the generic election's mutex is a key of its own");
    let mut observer = LockClient::new(b.clone()).observe_leader("race", Duration::from_secs(30));
    let seen: Arc<std::sync::Mutex<Vec<Option<Leader>>>> = Arc::default();
    let watching = {
        let seen = seen.clone();
        tokio::spawn(async move {
            while observer.changed().await.is_ok() {
                let now = observer.borrow_and_update().clone();
                seen.lock().unwrap().push(now);
            }
        })
    };
    let candidates: Vec<Arc<dyn LockBackend>> = vec![
        Arc::new(a.clone()),
        Arc::new(a.clone()),
        Arc::new(b.clone()),
        Arc::new(b.clone()),
    ];
    let started = Instant::now();
    let terms = one_leader_at_a_time(candidates, "race", Duration::from_secs(2))
        .await
        .unwrap();
    println!("{terms} terms in {:?}", started.elapsed());
    assert!(terms >= 20, "only {terms} terms");
    // The observer saw the leaders come and go, and nobody after the last
    // resignation (its poll is 30 s: the watch woke it).
    sleep(Duration::from_millis(300)).await;
    watching.abort();
    let seen = seen.lock().unwrap().clone();
    let leaders = seen.iter().flatten().count();
    println!("the observer saw {leaders} leaders");
    assert!(leaders >= 5, "the observer saw {seen:?}");
    assert_eq!(seen.last(), Some(&None), "{seen:?}");
    assert!(a.release(&mutex).await.unwrap());
    let left = common::raw_count(&a, format!("{}/", etcdctl_name("race"))).await;
    assert_eq!(left, 0, "candidates left behind");

    // The check fails with one candidate that ignores older ones.
    let broken: Vec<Arc<dyn LockBackend>> = vec![
        Arc::new(a.clone()),
        Arc::new(IgnoresOlder::new(b.clone()).await),
    ];
    let err = one_leader_at_a_time(broken, "race-broken", Duration::from_secs(1))
        .await
        .unwrap_err();
    println!("broken candidate caught: {err}");
    assert!(err.contains("two leaders at once"), "{err}");
}

/// A broken candidate that never withdraws: it puts its entry (as
/// [`IgnoresOlder`] does) and then waits for ever, so a dropped campaign
/// leaves its candidacy behind.
#[derive(Debug)]
struct NeverWithdraws(IgnoresOlder);

#[lock_core::async_trait]
impl lock_core::LockWrapper for NeverWithdraws {
    fn inner(&self) -> &dyn LockBackend {
        &self.0
    }
    fn name(&self) -> &'static str {
        "etcd-never-withdraws"
    }
    /// The inner double's facets, with this double's elections.
    fn facets(&self) -> Facets<'_> {
        Facets {
            elections: Some(self),
            ..LockBackend::facets(&self.0)
        }
    }
}

#[lock_core::async_trait]
impl lock_core::Elections for NeverWithdraws {
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let _entry = LockBackendExt::campaign(&self.0, election, ttl, deadline).await?;
        std::future::pending().await
    }
    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        LockBackendExt::leader(&self.0, election).await
    }
    async fn watch_leader(
        &self,
        request: WatchRequest<'_, Leader>,
    ) -> Result<Option<Leader>, LockError> {
        LockBackendExt::watch_leader(&self.0, request).await
    }
}

/// Candidates under the election `name` (ours have prefix [`PREFIX`]).
async fn candidacies(raw: &EtcdBackend, name: &str) -> i64 {
    common::raw_count(raw, format!("{}/", etcdctl_name(name))).await
}

/// While `leader` leads, a campaign of `ours` that is dropped, and one that
/// reaches its deadline (`Contended`), leave no candidacy behind (within
/// 2 s: the drop's delete runs in the background).
async fn withdrawn_campaigns_leave_nothing(
    ours: Arc<dyn LockBackend>,
    leader: &EtcdBackend,
    name: &str,
) -> Result<(), String> {
    let election = LockKey::new(name).unwrap();
    let ttl = Duration::from_secs(5);
    let leading = leader
        .campaign(&election, ttl, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    let left_after = |what: &'static str| async move {
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            let n = candidacies(leader, name).await;
            if n == 1 {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(format!("{} candidacy left behind by {what}", n - 1));
            }
            sleep(Duration::from_millis(50)).await;
        }
    };
    let dropped = {
        let (ours, election) = (ours.clone(), election.clone());
        tokio::spawn(async move {
            ours.campaign(&election, ttl, Instant::now() + Duration::from_secs(30))
                .await
        })
    };
    sleep(Duration::from_millis(300)).await;
    if dropped.is_finished() {
        return Err("a campaign won while another candidate led".into());
    }
    dropped.abort();
    let _ = dropped.await;
    left_after("a dropped campaign").await?;
    let ended = timeout(
        Duration::from_secs(3),
        ours.campaign(&election, ttl, Instant::now() + Duration::from_millis(300)),
    )
    .await
    .map_err(|_| "a campaign ran past its deadline")?;
    match ended {
        Err(err) if err.kind() == ErrorKind::Contended => {}
        other => return Err(format!("a campaign at its deadline: {other:?}")),
    }
    left_after("a campaign that reached its deadline").await?;
    assert!(leader.release(&leading).await.unwrap());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withdrawn_campaigns_leave_no_candidacy() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let (a, b) = (backend(&server).await, backend(&server).await);
    withdrawn_campaigns_leave_nothing(Arc::new(b.clone()), &a, "quit")
        .await
        .unwrap();
    assert_eq!(candidacies(&a, "quit").await, 0);
    // The check fails on a candidate that never withdraws.
    let broken = NeverWithdraws(IgnoresOlder::new(b.clone()).await);
    let err = withdrawn_campaigns_leave_nothing(Arc::new(broken), &a, "quit-broken")
        .await
        .unwrap_err();
    println!("broken candidate caught: {err}");
    assert!(err.contains("left behind by a dropped campaign"), "{err}");
}

// Multi-locks in one transaction.
#[path = "compose/multi.rs"]
mod multi;

// Writes guarded by the lock's entry.
#[path = "compose/guarded.rs"]
mod guarded;
