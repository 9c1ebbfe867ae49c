//! Cases on leader election (`LockClient::elect`), on whatever layout the
//! driver campaigns with (its own, or the generic renewed mutex): one
//! leader at a time in the recorded history, terms that increase, observers
//! that follow the leader, and a leader cut off from the store or stalled
//! past its TTL that is replaced only after its leadership ended.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::election::Leader;
use lock_core::{LockClient, TtlModel};
use tokio::time::{Instant, sleep, timeout};

use crate::harness::Harness;
use crate::history::History;
use crate::recording::{RecordingBackend, record_lost};

use super::*;

/// Candidates' recorded clients, one process each in `history`.
async fn candidates(
    h: &Harness,
    history: &Arc<History>,
    n: usize,
) -> Result<Vec<LockClient>, String> {
    Ok(clients(h, n)
        .await?
        .into_iter()
        .map(|c| LockClient::from_arc(Arc::new(RecordingBackend::new(c, history.process())) as _))
        .collect())
}

/// The checker's verdict on an election history, as a case error.
fn check_terms(history: &History, fenced: bool) -> Result<String, String> {
    check_history(history, fenced, "two leaders at once", "terms")
}

/// Three candidates campaign, lead briefly and resign in a loop while an
/// observer follows: the history never has two leaders at once, terms
/// strictly increase (with fencing), each leader's `leader()` names its own
/// term, and every term the observer reports is one a candidate won.
pub async fn one_leader_at_a_time(h: &Harness) -> CaseResult {
    let history = Arc::new(History::new());
    let voters = candidates(h, &history, 3).await?;
    let caps = voters[0].backend().capabilities();
    let ttl = h.ttl_for(&caps).max(Duration::from_secs(2));
    let name = h.key("elect").as_str().to_owned();
    let observer = LockClient::from_arc(h.client().await.map_err(fmt_err("observer"))?);
    let mut observed = observer.observe_leader(&name, Duration::from_millis(20));
    let seen: Arc<Mutex<Vec<Option<Leader>>>> = Arc::default();
    let watching = {
        let seen = seen.clone();
        tokio::spawn(async move {
            while observed.changed().await.is_ok() {
                let now = observed.borrow_and_update().clone();
                seen.lock().unwrap_or_else(|e| e.into_inner()).push(now);
            }
        })
    };
    let run = h.config().loop_run.min(Duration::from_secs(60));
    let end = Instant::now() + run;
    let mut tasks = Vec::new();
    for (i, client) in voters.into_iter().enumerate() {
        let name = name.clone();
        let history = history.clone();
        tasks.push(tokio::spawn(async move {
            let mut terms = Vec::new();
            let rec = history.process();
            while Instant::now() < end {
                let leading = client
                    .elect(&name)
                    .ttl(ttl)
                    .wait(run + Duration::from_secs(30))
                    .campaign()
                    .await
                    .map_err(fmt_err("campaign"))?;
                record_lost(leading.guard(), &rec);
                if terms.len() % 4 == 0 {
                    let now = client.leader(&name).await.map_err(fmt_err("leader"))?;
                    let term = now.as_ref().and_then(|l| l.term);
                    if term.is_some() && term != Some(leading.term()) {
                        return Err(format!(
                            "two leaders at once: leader() named term {term:?} while term {} led",
                            leading.term()
                        ));
                    }
                    if now.is_none() {
                        return Err("leader() named nobody while a candidate led".into());
                    }
                }
                terms.push(leading.term().get());
                sleep(Duration::from_millis(5 + 7 * i as u64)).await;
                if !leading.is_leader() {
                    return Err(format!("term {} lost its leadership", leading.term()));
                }
                leading.resign().await.map_err(fmt_err("resign"))?;
                // Give the others a chance on backends that are not fair.
                sleep(Duration::from_millis(2)).await;
            }
            Ok::<Vec<u64>, String>(terms)
        }));
    }
    let mut won = BTreeSet::new();
    let mut per_candidate = Vec::new();
    for task in tasks {
        let terms = timeout(run + Duration::from_secs(60), task)
            .await
            .map_err(|_| "a candidate never finished".to_owned())?
            .map_err(|e| format!("candidate task: {e}"))??;
        per_candidate.push(terms.len());
        won.extend(terms);
    }
    // Let the observer see the last resignation.
    sleep(Duration::from_millis(200)).await;
    watching.abort();
    let summary = check_terms(&history, caps.has_fencing())?;
    let terms: usize = per_candidate.iter().sum();
    ensure!(terms >= 3, "only {terms} term(s) in {run:?}");
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let leaders: Vec<&Leader> = seen.iter().flatten().collect();
    ensure!(
        !leaders.is_empty(),
        "the observer saw no leader in {terms} terms"
    );
    for leader in &leaders {
        if let Some(term) = leader.term {
            ensure!(
                won.contains(&term.get()),
                "the observer reported term {term}, which no candidate won"
            );
        }
    }
    Ok(Outcome::Passed(format!(
        "{terms} terms ({per_candidate:?} per candidate), observer saw {} leaders; {summary}",
        leaders.len()
    )))
}

/// A leader whose link to the store stalls past its TTL (a paused process:
/// its renewals arrive late), then one cut off (a partition): each time the
/// other candidate is elected only after the old leadership ended (it says
/// `Lost` first), with a higher term, and the old leader does not lead
/// again once its link works.
pub async fn deposed_leader_steps_down(h: &Harness) -> CaseResult {
    let result = deposed_inner(h).await;
    h.target()
        .heal()
        .await
        .map_err(|e| format!("heal failed: {e}"))?;
    result
}

async fn deposed_inner(h: &Harness) -> CaseResult {
    let history = Arc::new(History::new());
    let mut figures = Vec::new();
    let mut fenced = true;
    for (round, fault) in ["stalled", "partitioned"].into_iter().enumerate() {
        let proxied = h
            .target()
            .proxied_client()
            .await
            .map_err(|e| format!("proxied client: {e}"))?;
        let Some((cut, proxy)) = proxied else {
            return Ok(Outcome::Skipped(
                "the target cannot cut one client off".into(),
            ));
        };
        let caps = cut.capabilities();
        fenced &= caps.has_fencing();
        let ttl = h.ttl_for(&caps);
        let replaced_within = match caps.ttl_model {
            TtlModel::PerLease => ttl * 4 + h.config().margin * 2,
            _ => Duration::from_secs(30),
        };
        let name = h.key(&format!("deposed-{round}")).as_str().to_owned();
        let old = LockClient::from_arc(Arc::new(RecordingBackend::new(cut, history.process())));
        let other = candidates(h, &history, 1).await?.remove(0);
        // A little latency on the leader's link: a term dated from the
        // reply instead of the request would promise more than the store
        // keeps, and the next leader would be elected inside it.
        proxy.set_latency(ttl / 10, Duration::ZERO);
        let leading = old
            .elect(&name)
            .ttl(ttl)
            .wait(Duration::from_secs(10))
            .campaign()
            .await
            .map_err(fmt_err("first campaign"))?;
        let rec = history.process();
        record_lost(leading.guard(), &rec);
        let challenger = {
            let (other, name) = (other.clone(), name.clone());
            tokio::spawn(async move {
                other
                    .elect(&name)
                    .ttl(ttl)
                    .wait(Duration::from_secs(90))
                    .campaign()
                    .await
            })
        };
        sleep(ttl / 2).await;
        let faulted_at = Instant::now();
        match fault {
            "stalled" => proxy.set_latency(ttl * 3, Duration::ZERO),
            _ => proxy.partition(),
        }
        let lost = timeout(replaced_within + ttl * 2, leading.lost()).await;
        ensure!(lost.is_ok(), "{fault}: the old leader never said Lost");
        let lost_after = faulted_at.elapsed();
        let new = timeout(replaced_within + Duration::from_secs(10), challenger)
            .await
            .map_err(|_| format!("{fault}: no new leader within {replaced_within:?}"))?
            .map_err(|e| format!("challenger task: {e}"))?
            .map_err(fmt_err("challenger's campaign"))?;
        record_lost(new.guard(), &rec);
        let replaced_after = faulted_at.elapsed();
        ensure!(
            new.term() > leading.term() || !caps.has_fencing(),
            "{fault}: the new term {} is not above the old {}",
            new.term(),
            leading.term()
        );
        proxy.heal();
        proxy.set_latency(Duration::ZERO, Duration::ZERO);
        // The old leader's link works again: it must not lead again.
        sleep(ttl).await;
        ensure!(
            !leading.is_leader(),
            "{fault}: the deposed leader says it leads again"
        );
        ensure!(new.is_leader(), "{fault}: the new leader lost its term");
        let _ = leading.resign().await;
        new.resign().await.map_err(fmt_err("resign"))?;
        figures.push(format!(
            "{fault}: Lost after {lost_after:?}, replaced after {replaced_after:?}"
        ));
    }
    let summary = check_terms(&history, fenced)?;
    Ok(Outcome::Passed(format!(
        "{}; {summary}",
        figures.join("; ")
    )))
}

/// A leader on `candidate` is seen by an observer on `observer` (polling
/// only every minute), and its resignation within 1 s: what a driver
/// whose observers wake on the store's notification must show (a polling
/// observer sees the resignation after the minute).
pub async fn observer_sees_resignation(
    candidate: Arc<dyn LockBackend>,
    observer: Arc<dyn LockBackend>,
) -> Result<Duration, String> {
    let (candidate, observer) = (
        lock_core::LockClient::from_arc(candidate),
        lock_core::LockClient::from_arc(observer),
    );
    let leading = candidate
        .elect("observed")
        .campaign()
        .await
        .map_err(fmt_err("campaign"))?;
    let mut seen = observer.observe_leader("observed", Duration::from_secs(60));
    let term = Some(leading.term());
    tokio::time::timeout(
        Duration::from_secs(5),
        seen.wait_for(|l| l.as_ref().is_some_and(|l| l.term == term)),
    )
    .await
    .map_err(|_| "the observer did not see the leader within 5 s".to_string())?
    .map_err(|e| e.to_string())?;
    let resigned = Instant::now();
    ensure!(
        leading.resign().await.map_err(fmt_err("resign"))?,
        "resign: not leading"
    );
    tokio::time::timeout(Duration::from_secs(1), seen.wait_for(Option::is_none))
        .await
        .map_err(|_| "the observer did not see the resignation within 1 s".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(resigned.elapsed())
}
