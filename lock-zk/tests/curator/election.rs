//! Elections against Curator's `LeaderLatch` on [`ZkBackend::latch_path`]:
//! one leader at a time as both sides see it, in both directions; terms
//! increase across our terms and Curator's; observers wake on a ZooKeeper
//! watch. Each check is shown failing on a broken variant: candidates
//! that misread the latch (any node leads; Curator's nodes ignored; the
//! trait's generic election on a mutex, what this driver did before), and
//! an observer that polls instead of watching.

use std::sync::Arc;
use std::time::Duration;

use lock_core::election::{Leader, election_lock_key};
use lock_core::{
    ErrorKind, Lease, ListQuery, LockBackend, LockBackendExt, LockError, LockKey, OwnerId,
    WatchRequest,
};
use lock_zk::ZkBackend;
use tokio::time::{Instant, sleep, timeout};
use zookeeper_client as zk;

use crate::peer::setup;
use crate::{TTL, key, soon};

/// At most one of `claims` (who, claims to lead) at the same instant.
fn one_leader(claims: &[(&str, bool)]) -> Result<(), String> {
    let leaders: Vec<&str> = claims
        .iter()
        .filter(|(_, leads)| *leads)
        .map(|(who, _)| *who)
        .collect();
    if leaders.len() > 1 {
        Err(format!("{} leaders at once: {leaders:?}", leaders.len()))
    } else {
        Ok(())
    }
}

/// Watches `election` from `observer` (which last saw `seen`), runs
/// `change` (which must change the leader), and says how soon the
/// observer returned with a different leader. The observer is given a
/// poll interval of a minute and a deadline of 4 s: only a watch wakes it
/// within the 2 s this allows.
async fn observer_wakes<F>(
    observer: Arc<dyn LockBackend>,
    election: &LockKey,
    seen: Leader,
    change: F,
) -> Result<Duration, String>
where
    F: std::future::Future<Output = ()>,
{
    let watching = {
        let (observer, election, seen) = (observer.clone(), election.clone(), seen.clone());
        tokio::spawn(async move {
            let now = observer
                .watch_leader(WatchRequest::new(
                    &election,
                    Some(&seen),
                    Duration::from_secs(60),
                    soon(4_000),
                ))
                .await;
            (Instant::now(), now)
        })
    };
    sleep(Duration::from_millis(300)).await;
    if watching.is_finished() {
        return Err("the observer returned before the leader changed".to_owned());
    }
    let changed = Instant::now();
    change.await;
    let (woke, now) = watching.await.map_err(|e| e.to_string())?;
    let now = now.map_err(|e| e.to_string())?;
    if Leader::same(now.as_ref(), Some(&seen)) {
        return Err(format!("the observer still reports {seen:?}"));
    }
    let after = woke.saturating_duration_since(changed);
    if after > Duration::from_secs(2) {
        return Err(format!(
            "the observer saw the new leader {after:?} after the change (no watch)"
        ));
    }
    Ok(after)
}

/// (a) We lead: Curator's latch waits and names our owner value as the
/// leader; it leads once we resign (an observer of ours wakes at once).
/// (b) Curator leads: our campaign waits, `leader()` names Curator's
/// participant id, and we lead once Curator closes its latch, ahead of a
/// Curator latch that joined after us. Then: a campaign past its deadline
/// is `Contended` and leaves no node; an unrenewed leadership ends at its
/// TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_leader_latch_and_our_campaigns_see_one_leader() {
    let (target, bs, peer) = setup(3).await;
    let e = key("elect");
    let path = bs[0].latch_path(&e);

    // (a) Ours first.
    let ours = bs[0]
        .campaign(&e, TTL, soon(5_000))
        .await
        .expect("our campaign on a free election");
    assert_eq!(ours.key(), &election_lock_key(&e).unwrap());
    let me = ours.owner().to_hex();
    let mut c1 = peer.latch(&path, "curator-a").await;
    assert_eq!(peer.ask(&mut c1, "await 500").await, "waiting");
    assert_eq!(peer.ask(&mut c1, "has").await, "has false");
    assert_eq!(
        peer.ask(&mut c1, "leader").await,
        format!("leads true {me}")
    );
    let seen = bs[1].leader(&e).await.unwrap().expect("a leader");
    assert_eq!(seen.holder, me);
    assert_eq!(seen.term, Some(ours.token()));
    // Our details ride in the latch node's name: Curator's participant id
    // (checked above) is still the owner hex alone.
    assert_eq!(
        seen.details.as_ref().map(|d| d.pid),
        Some(std::process::id()),
        "{seen:?}"
    );
    let mine = bs[0].leader(&e).await.unwrap().expect("a leader");
    assert!(mine.remaining_ttl.is_some_and(|left| left <= TTL));
    bs[0].renew(&ours).await.expect("renew the leadership");
    assert!(bs[0].renew_many(&[&ours]).await[0].is_ok());

    let b2: Arc<dyn LockBackend> = Arc::new(bs[2].clone());
    let after = observer_wakes(b2.clone(), &e, seen.clone(), async {
        assert!(bs[0].release(&ours).await.unwrap(), "resign");
    })
    .await
    .expect("our observer wakes when we resign");
    println!("observer woke {after:?} after our resignation");
    assert_eq!(peer.ask(&mut c1, "await 5000").await, "leader");
    assert_eq!(peer.ask(&mut c1, "has").await, "has true");
    let curator = bs[1].leader(&e).await.unwrap().expect("Curator leads");
    assert_eq!(curator.holder, "curator-a");
    assert_eq!(curator.details, None, "Curator's leader has no details");
    let listed = bs[1]
        .list_elections(&ListQuery::new(e.as_str(), 10))
        .await
        .unwrap();
    let listed = listed
        .elections
        .iter()
        .find(|i| i.election == e)
        .expect("the election listed");
    assert_eq!(listed.leader.holder, "curator-a");
    assert_eq!(listed.leader.term, curator.term);
    assert!(
        curator.term > seen.term,
        "terms increase: {curator:?} after {seen:?}"
    );
    assert_eq!(curator.remaining_ttl, None);
    assert!(
        bs[0].renew(&ours).await.is_err(),
        "a resigned leadership renews"
    );

    // (b) Curator first: our campaign waits behind it.
    let waiting = {
        let (b, e) = (bs[1].clone(), e.clone());
        tokio::spawn(async move { b.campaign(&e, TTL, soon(10_000)).await })
    };
    sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "our campaign beside Curator's leader"
    );
    assert_eq!(peer.ask(&mut c1, "has").await, "has true");
    assert_eq!(
        one_leader(&[("curator-a", true), ("ours", waiting.is_finished())]),
        Ok(())
    );
    let mut c2 = peer.latch(&path, "curator-b").await;
    assert_eq!(peer.ask(&mut c2, "await 300").await, "waiting");
    let after = observer_wakes(b2, &e, curator.clone(), async {
        assert_eq!(peer.ask(&mut c1, "close").await, "closed");
    })
    .await
    .expect("our observer wakes when Curator's leader closes its latch");
    println!("observer woke {after:?} after Curator closed its latch");
    let lease = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("our campaign ends once Curator's leader is gone")
        .unwrap()
        .expect("we lead after Curator");
    assert!(lease.token() > curator.term.unwrap(), "terms increase");
    let us = lease.owner().to_hex();
    assert_eq!(bs[0].leader(&e).await.unwrap().unwrap().holder, us);
    // Curator's later latch queued behind our waiting candidate.
    assert_eq!(peer.ask(&mut c2, "await 300").await, "waiting");
    assert_eq!(
        peer.ask(&mut c2, "leader").await,
        format!("leads true {us}")
    );
    assert!(bs[1].release(&lease).await.unwrap());
    assert_eq!(peer.ask(&mut c2, "await 5000").await, "leader");
    let last = bs[0].leader(&e).await.unwrap().unwrap();
    assert_eq!(last.holder, "curator-b");
    assert!(last.term.unwrap() > lease.token());
    assert_eq!(peer.ask(&mut c2, "close").await, "closed");
    // Curator's `close` deletes its node in the background: allow it a
    // moment to arrive.
    let mut left = bs[0].leader(&e).await.unwrap();
    for _ in 0..100 {
        if left.is_none() {
            break;
        }
        sleep(Duration::from_millis(20)).await;
        left = bs[0].leader(&e).await.unwrap();
    }
    assert_eq!(left, None, "a leader after Curator's last latch closed");

    // A campaign that cannot lead before its deadline is `Contended` and
    // leaves no candidate behind.
    let held = bs[0].campaign(&e, TTL, soon(2_000)).await.unwrap();
    let err = bs[1].campaign(&e, TTL, soon(200)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended, "{err}");
    let raw = target.raw().await;
    sleep(Duration::from_millis(200)).await;
    assert_eq!(raw.list_children(&path).await.unwrap().len(), 1);
    assert!(bs[0].release(&held).await.unwrap());

    // A leadership that is not renewed ends at its TTL: the backend's
    // expiry deletes the latch node (so Curator's candidates move up).
    let short = Duration::from_millis(800);
    let unrenewed = bs[0].campaign(&e, short, soon(2_000)).await.unwrap();
    let granted = Instant::now();
    let mut gone = None;
    while granted.elapsed() < Duration::from_secs(3) {
        let left = raw.list_children(&path).await.map_or(0, |c| c.len());
        if left == 0 {
            gone = Some(granted.elapsed());
            break;
        }
        sleep(Duration::from_millis(20)).await;
    }
    let gone = gone.expect("the unrenewed leadership's latch node is deleted");
    println!("unrenewed leadership (TTL {short:?}) gone after {gone:?}");
    assert!(gone >= short, "deleted before its TTL: {gone:?}");
    assert_eq!(bs[1].leader(&e).await.unwrap(), None);
    let err = bs[0].renew(&unrenewed).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
}

/// A candidate for the one-leader check: ours, or a broken double that
/// writes Curator's latch nodes but misreads them.
enum Candidate {
    Ours(ZkBackend),
    /// Leads as soon as its node exists (leader = any node).
    AnyNode(zk::Client),
    /// Ranks only nodes whose data is an owner value of ours (Curator's
    /// nodes ignored).
    IgnoresCurator(zk::Client),
    /// The trait's generic election (the mutex `election/<name>`).
    Generic(Defaults),
}

impl Candidate {
    fn name(&self) -> &'static str {
        match self {
            Self::Ours(_) => "ours",
            Self::AnyNode(_) => "broken: any node leads",
            Self::IgnoresCurator(_) => "broken: Curator's nodes ignored",
            Self::Generic(_) => "broken: the generic election on the mutex",
        }
    }

    /// Campaigns for up to `wait`; whether it then claims to lead (it
    /// steps down again before returning).
    async fn claims(&self, election: &LockKey, path: &str, wait: Duration) -> bool {
        let raw = match self {
            Self::Ours(backend) => {
                let deadline = Instant::now() + wait;
                return match backend.campaign(election, TTL, deadline).await {
                    Ok(lease) => {
                        backend.release(&lease).await.unwrap();
                        true
                    }
                    Err(err) if err.kind() == ErrorKind::Contended => false,
                    Err(err) => panic!("our campaign failed: {err}"),
                };
            }
            Self::Generic(backend) => {
                let deadline = Instant::now() + wait;
                let lease = backend.campaign(election, TTL, deadline).await;
                return match lease {
                    Ok(lease) => {
                        backend.release(&lease).await.unwrap();
                        true
                    }
                    Err(err) if err.kind() == ErrorKind::Contended => false,
                    Err(err) => panic!("the generic campaign failed: {err}"),
                };
            }
            Self::AnyNode(raw) | Self::IgnoresCurator(raw) => raw,
        };
        let owner = OwnerId::random();
        let hex = owner.to_hex();
        let uuid = crate::common::dashed(&hex);
        let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let (_, seq) = raw
            .create(
                &format!("{path}/_c_{uuid}-latch-"),
                hex.as_bytes(),
                &options,
            )
            .await
            .expect("broken candidate's node");
        let mine = format!("{path}/_c_{uuid}-latch-{seq}");
        let leads = match self {
            Self::AnyNode(_) => true,
            _ => {
                let mut ranked = Vec::new();
                for child in raw.list_children(path).await.unwrap() {
                    let (data, _) = raw.get_data(&format!("{path}/{child}")).await.unwrap();
                    let ours = std::str::from_utf8(&data)
                        .ok()
                        .is_some_and(|d| OwnerId::from_hex(d).is_ok());
                    let seq = child.rsplit_once("latch-").map(|(_, s)| s.to_owned());
                    if let (true, Some(seq)) = (ours, seq) {
                        ranked.push((seq, child));
                    }
                }
                ranked.sort();
                ranked
                    .first()
                    .is_some_and(|(_, first)| mine.ends_with(first))
            }
        };
        raw.delete(&mine, None).await.unwrap();
        leads
    }
}

/// Our backend with the generic election for `campaign` (a waiting acquire
/// of the mutex `election/<name>`, blind to the latch) and a polling
/// `watch_leader`, the latch's `leader` kept: what this driver did before
/// it had the latch. The broken variant of the observer check, and a
/// candidate of the one-leader check.
#[derive(Debug)]
struct Defaults(ZkBackend);

#[lock_core::async_trait]
impl lock_core::LockWrapper for Defaults {
    fn inner(&self) -> &dyn LockBackend {
        &self.0
    }

    /// Our facets, with the elections below instead of the latch's.
    fn facets(&self) -> lock_core::Facets<'_> {
        lock_core::Facets {
            elections: Some(self),
            ..self.0.facets()
        }
    }
}

#[lock_core::async_trait]
impl lock_core::Elections for Defaults {
    /// The default: a waiting acquire of the election's mutex.
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.0
            .acquire(&election_lock_key(election)?, ttl, deadline)
            .await
    }

    /// Our `leader` (the latch's).
    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        LockBackendExt::leader(&self.0, election).await
    }

    /// The polling default: our `leader` (the latch's) read every `poll`.
    async fn watch_leader(
        &self,
        request: WatchRequest<'_, Leader>,
    ) -> Result<Option<Leader>, LockError> {
        lock_core::poll_leader(&self.0, request).await
    }
}

/// With Curator's latch leading, our candidate does not claim to lead; the
/// one-leader check catches the three broken candidates. Our observer wakes on
/// a leader change within 2 s with a poll interval of a minute; the same
/// check catches an observer that polls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_election_checks_catch_broken_candidates_and_a_polling_observer() {
    let (target, bs, peer) = setup(2).await;
    let e = key("elect-broken");
    let path = bs[0].latch_path(&e);
    let mut c = peer.latch(&path, "curator-a").await;
    assert_eq!(peer.ask(&mut c, "await 5000").await, "leader");

    let candidates = [
        Candidate::Ours(bs[0].clone()),
        Candidate::AnyNode(target.raw().await),
        Candidate::IgnoresCurator(target.raw().await),
        Candidate::Generic(Defaults(bs[1].clone())),
    ];
    for candidate in &candidates {
        let claims = candidate
            .claims(&e, &path, Duration::from_millis(500))
            .await;
        let curator = peer.ask(&mut c, "has").await == "has true";
        let verdict = one_leader(&[("curator-a", curator), (candidate.name(), claims)]);
        println!("{}: {verdict:?}", candidate.name());
        match candidate {
            Candidate::Ours(_) => verdict.expect("ours beside Curator's leader"),
            _ => assert!(verdict.is_err(), "the check missed {}", candidate.name()),
        }
    }
    assert_eq!(peer.ask(&mut c, "close").await, "closed");

    // The observer check: ours passes, the polling variant is caught.
    for (observer, polls) in [
        (Arc::new(bs[1].clone()) as Arc<dyn LockBackend>, false),
        (Arc::new(Defaults(bs[1].clone())), true),
    ] {
        let lease = bs[0].campaign(&e, TTL, soon(5_000)).await.unwrap();
        let seen = bs[1].leader(&e).await.unwrap().expect("we lead");
        let verdict = observer_wakes(observer, &e, seen, async {
            assert!(bs[0].release(&lease).await.unwrap());
        })
        .await;
        println!("observer (polling double: {polls}): {verdict:?}");
        if polls {
            assert!(verdict.is_err(), "the check missed a polling observer");
        } else {
            verdict.expect("our observer wakes on the watch");
        }
    }
}
