//! Scenarios around one holder: killed, paused, cut off by a partition.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lock_core::LockBackendExt;
use lock_core::{FencingToken, LockBackend, LockClient, LockKey};
use serde_json::json;
use tokio::time::{Instant, sleep};

use crate::cases::recorded_acquire;
use crate::history::{EventKind, History, Op};
use crate::resource::ResourceServer;

use super::*;

/// The holder process (`distlock run`, say) is killed with SIGKILL, its pid
/// alone and not its process group, as the OOM killer or a crash would end
/// it, while its command writes to the resource. Two things are judged:
/// another client must get the key (after the TTL or the session timeout:
/// how long is the figure), and the command must be gone before the
/// holder's deadline: a write that reaches the resource later than the
/// kill plus the TTL (no deadline of the killed holder can be later), or
/// after the next grant, is a command that outlived its lock: a
/// violation. Whatever the holder left behind is killed when the run ends.
pub async fn holder_killed(env: &ScenarioEnv) -> ScenarioReport {
    finish(holder_killed_inner(env).await)
}

pub(super) async fn holder_killed_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let observer = client(env).await?;
    let resource = ResourceServer::start()
        .await
        .map_err(|e| format!("resource server: {e}"))?;
    let runs = if env.quick { 2 } else { 5 };
    let mut samples = Vec::new();
    let mut outlived: Option<Duration> = None;
    let mut stopped_after = Duration::ZERO;
    for run in 0..runs {
        let key = key(&format!("killed-{run}"));
        let before = resource.arrivals().len();
        let Some((holder, _)) = start_holder(env, &*observer, &key, Some(&resource)).await? else {
            return Ok(ScenarioReport::skipped(
                "no holder process or URL for this target",
            ));
        };
        // The command is running once it has written.
        let until = Instant::now() + Duration::from_secs(5);
        while resource.arrivals().len() == before {
            if Instant::now() >= until {
                return Err("the holder's command never wrote to the resource".into());
            }
            sleep(Duration::from_millis(10)).await;
        }
        let groups = holder.child_groups();
        let killed_at = Instant::now();
        holder.signal(libc::SIGKILL);
        let bound = free_bound(env, &*observer);
        let lease = observer
            .acquire(&key, env.ttl, killed_at + bound)
            .await
            .map_err(|e| format!("the killed holder's lock was not freed within {bound:?}: {e}"))?;
        let granted_at = Instant::now();
        samples.push(granted_at - killed_at);
        // Watch past both the next grant and the latest deadline the
        // killed holder can have had.
        let latest_deadline = killed_at + env.ttl;
        let limit = latest_deadline.min(granted_at);
        tokio::time::sleep_until(granted_at.max(latest_deadline) + Duration::from_millis(300))
            .await;
        let _ = observer.release(&lease).await;
        let last = resource.arrivals()[before..]
            .iter()
            .filter(|a| lease_report(&a.line).is_none())
            .map(|a| a.at)
            .max()
            .unwrap_or(killed_at);
        stopped_after = stopped_after.max(last.saturating_duration_since(killed_at));
        if last > limit {
            let late = last - limit;
            outlived = Some(outlived.map_or(late, |o| o.max(late)));
        }
        // Clean up whatever survived, so the next run starts clean.
        holder.signal_children(&groups, libc::SIGKILL);
        drop(holder);
    }
    let mut figures = BTreeMap::new();
    figures.insert(
        "time_to_free_p50_ms".into(),
        ms(percentile(&mut samples, 0.5)),
    );
    figures.insert(
        "time_to_free_p99_ms".into(),
        ms(percentile(&mut samples, 0.99)),
    );
    figures.insert("command_last_write_after_kill_ms".into(), ms(stopped_after));
    figures.insert("runs".into(), json!(runs));
    let detail = match outlived {
        Some(late) => format!(
            "the killed holder's COMMAND KEPT RUNNING: it wrote {late:?} past the holder's deadline or the next grant; freed after {:?} (median of {runs})",
            percentile(&mut samples, 0.5)
        ),
        None => format!(
            "freed after {:?} (median of {runs}); the command's last write {stopped_after:?} after the kill",
            percentile(&mut samples, 0.5)
        ),
    };
    Ok(ScenarioReport::judged(
        false,
        outlived.is_some(),
        detail,
        figures,
    ))
}

/// A holder process (`distlock run`, say) is paused (SIGSTOP, with the
/// command it runs) past its deadline while another client takes the key
/// and writes to the protected resource. On resume the paused command
/// itself writes to the resource with the token it holds, as a process
/// that does not know it was paused would, and the holder must then learn
/// it lost the lock. The resource records every write (token, writer,
/// time) and the history checker judges them from the grant order. Three
/// findings, each judged on its own:
///
/// - **Exclusion**: the other client must not be granted the key before
///   the deadline the paused holder believes it has. Its promised window
///   runs to an upper bound of that deadline, from the TTL of its own
///   lease and the moment it was stopped (see [`holder_deadline_bound`]);
///   a grant inside it is a violation, for every backend. The holder is
///   resumed only once that bound has passed, so every write it makes
///   after resuming is one of a holder whose lease is over.
/// - **Fencing**: a write of the older grant that a token-checking
///   resource would let in after the newer holder's write (a stale write
///   accepted), or the newer holder's write refused, is a violation.
///   Without fencing tokens this is a negative control: the stale write
///   must be observed getting in (flagged); a resumed holder that made no
///   write leaves nothing observed, and the negative control fails (the
///   instrument failed), as the fenced judgment does.
/// - **Lost signal**: the holder must report the loss with exit 76 (lost
///   while the command ran). Anything else (77, the command's own status,
///   still running) is a violation even where fencing protected the
///   resource: a holder that does not learn of its loss keeps acting on
///   it.
pub async fn holder_paused(env: &ScenarioEnv) -> ScenarioReport {
    finish(holder_paused_inner(env).await)
}

/// An upper bound of the deadline a holder stopped at `stopped_at` can
/// believe it has, for a lease of `ttl` (the TTL of the holder's own
/// lease, as its `DISTLOCK_HANDLE` says: a backend may have raised the TTL
/// asked for).
///
/// Every driver dates a deadline with [`lock_core::validity_deadline`]:
/// the send time of the request that set it plus at most the lease's TTL,
/// minus the drift allowance (lock-core's contract: "a lease's local
/// validity deadline is `sent_at + ttl - drift`"). The request that set
/// the holder's current deadline is its acquire, sent before the scenario
/// saw the grant, or a renewal, sent while the holder ran: either way no
/// later than `stopped_at`, read once every thread of the holder process
/// is seen stopped. A renewal sent before the stop whose reply comes after
/// the resume is covered the same way. `validity_deadline` grows with the
/// send time, so this bound is at or after any deadline the holder can
/// believe: the promised window errs long (more chances to catch an
/// overlap), never short. It is late by the time between the holder's
/// latest request and the stop, which the scenario keeps short by
/// stopping the holder just after a renewal reached the server (seen as
/// the server's expiry moving forward); the drift allowance then keeps the
/// bound before the server's own expiry on a correct backend.
///
/// A renewal the holder sends after the resume (answered by a server that
/// should have refused it) is not covered: that holder does not learn of
/// its loss, which the lost-signal finding judges.
pub fn holder_deadline_bound(stopped_at: Instant, ttl: Duration) -> Instant {
    lock_core::validity_deadline(stopped_at, ttl)
}

/// Stops the holder process (SIGSTOP, and waits until every thread of it
/// is stopped) just after a renewal of its grant (`token`) reached the
/// server, and returns when it was stopped, with how long before that the
/// renewal arrived at most (`None` when no stop could be aligned).
///
/// A renewal is seen as the server's expiry (the remaining TTL `inspect`
/// reports, added to the time of its answer) moving forward by more than a
/// tenth of the TTL; it arrived after the previous look was sent. A stop
/// that comes later than half the drift allowance after that look (a slow
/// round trip, the scheduler) is undone (SIGCONT: the holder lost a few
/// milliseconds) and the next renewal is awaited, for at most eight times
/// the TTL (some 24 renewal intervals: on a loaded machine most stops miss
/// the budget, 20 of 28 tries in 8 runs with four busy loops on two CPUs
/// and a 1 s TTL, where six intervals left runs unaligned); then, or
/// without a remaining TTL to read, the holder is stopped where it is.
/// Only the tightness of
/// [`holder_deadline_bound`] depends on this, never its soundness: on a
/// correct backend the other half of the drift allowance keeps the bound
/// before the server's expiry.
async fn stop_after_renewal(
    holder: &Holder,
    observer: &dyn LockBackend,
    key: &LockKey,
    token: Option<FencingToken>,
    ttl: Duration,
) -> Result<(Instant, Option<Duration>), String> {
    let stop = || async {
        holder.signal(libc::SIGSTOP);
        holder.wait_stopped(Duration::from_secs(2)).await?;
        Ok::<_, String>(Instant::now())
    };
    let budget = lock_core::clock_drift(ttl) / 2;
    let step = ttl / 10;
    let until = Instant::now() + ttl * 8;
    let mut baseline: Option<Instant> = None;
    let mut previous_look: Option<Instant> = None;
    while Instant::now() < until {
        let look = Instant::now();
        let Ok(Some(info)) = observer.inspect(key).await else {
            break;
        };
        let (Some(remaining), true) = (info.remaining_ttl, info.token == token) else {
            break;
        };
        // The server read its remaining TTL before its answer came: the
        // estimate is late by at most a round trip, far below `step`.
        let expiry = Instant::now() + remaining;
        match (baseline, previous_look) {
            (Some(b), Some(since)) if expiry > b + step => {
                let stopped_at = stop().await?;
                let lag = stopped_at - since;
                if lag <= budget {
                    return Ok((stopped_at, Some(lag)));
                }
                holder.signal(libc::SIGCONT);
                baseline = None;
                previous_look = None;
                continue;
            }
            (Some(b), _) => baseline = Some(b.min(expiry)),
            (None, _) => baseline = Some(expiry),
        }
        previous_look = Some(look);
        // No sleep: each look is a round trip already, and every moment
        // between the renewal and the stop makes the bound later.
        tokio::task::yield_now().await;
    }
    Ok((stop().await?, None))
}

/// A signed duration in milliseconds: `to - from`.
fn signed_ms(from: Instant, to: Instant) -> serde_json::Value {
    let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
    if to >= from {
        json!(ms(to - from))
    } else {
        json!(-ms(from - to))
    }
}

pub(super) async fn holder_paused_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let other = client(env).await?;
    let caps = other.capabilities();
    let fenced = caps.has_fencing();
    let key = key("paused");
    // One clock for everything, from before the holder starts.
    let history = Arc::new(History::new());
    let resource = ResourceServer::start()
        .await
        .map_err(|e| format!("resource server: {e}"))?;
    // The holder's grant comes after its process starts: the earliest its
    // window can begin.
    let started = Instant::now();
    let Some((mut holder, token_a)) = start_holder(env, &*other, &key, Some(&resource)).await?
    else {
        return Ok(ScenarioReport::skipped(
            "no holder process or URL for this target",
        ));
    };
    // Wait for the holder's lease report and its first write, so the pause
    // lands mid-work.
    let until = Instant::now() + Duration::from_secs(5);
    let holder_ttl = loop {
        let arrivals = resource.arrivals();
        let wrote = arrivals.iter().any(|a| lease_report(&a.line).is_none());
        if let (Some(lease), true) = (reported_lease(&arrivals), wrote) {
            break lease.ttl();
        }
        if Instant::now() >= until {
            return Err(
                "the holder's command did not report its lease (a `lease $DISTLOCK_HANDLE` line) and write to the resource within 5 s: its deadline cannot be bounded (the instrument failed)"
                    .into(),
            );
        }
        sleep(Duration::from_millis(10)).await;
    };
    let groups = holder.child_groups();
    let (paused_at, renewal_lag) =
        stop_after_renewal(&holder, &*other, &key, token_a, holder_ttl).await?;
    holder.signal_children(&groups, libc::SIGSTOP);
    if caps.ttl_model == lock_core::TtlModel::PerProcess {
        return paused_per_process(&mut holder, &groups, &*other, &key, env.ttl, holder_ttl).await;
    }
    let deadline_bound = holder_deadline_bound(paused_at, holder_ttl);
    let rec_a = history.process();
    let rec_b = history.process();
    let token_of = |t: Option<FencingToken>| t.filter(|_| fenced);
    rec_a.record_at(
        started,
        EventKind::Ok,
        Op::Acquire,
        &key,
        token_of(token_a),
        Some(deadline_bound),
    );
    let bound = free_bound(env, &*other).max(holder_ttl * 2 + Duration::from_secs(2));
    let lease_b = recorded_acquire(&*other, &rec_b, &key, env.ttl, paused_at + bound)
        .await
        .map_err(|e| format!("the paused holder's lock was not freed within {bound:?}: {e}"))?;
    let granted_at = Instant::now();
    rec_b.wrote(&key, token_of(Some(lease_b.token())));
    // Resume past the holder's deadline bound: every write it makes from
    // here is one of a holder whose lease is over, whatever it believed.
    tokio::time::sleep_until(deadline_bound + Duration::from_millis(1)).await;
    // Resume the command first: it acts on what it believes before the
    // lock keeper can tell it anything.
    let resumed_at = Instant::now();
    holder.signal_children(&groups, libc::SIGCONT);
    let until = Instant::now() + Duration::from_secs(3);
    while !resource.arrivals().iter().any(|a| a.at >= resumed_at) && Instant::now() < until {
        sleep(Duration::from_millis(5)).await;
    }
    holder.signal(libc::SIGCONT);
    let mut exit_code = None;
    let mut noticed_after = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = holder.child.try_wait() {
            exit_code = status.code();
            noticed_after = Some(resumed_at.elapsed());
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    let _ = recorded_release(&*other, &rec_b, &lease_b).await;
    let writes: Vec<_> = resource
        .arrivals()
        .into_iter()
        .filter(|a| lease_report(&a.line).is_none())
        .collect();
    let late_writes = writes.iter().filter(|a| a.at >= resumed_at).count();
    for write in &writes {
        let token = write.line.parse::<u64>().ok().map(FencingToken::new);
        rec_a.record_at(
            write.at,
            EventKind::Ok,
            Op::Write,
            &key,
            token_of(token),
            None,
        );
    }
    let report = history.check();

    let mut violations = Vec::new();
    // Exclusion: the next grant inside the paused holder's window (or
    // handed out already past its own deadline). Only a stop aligned to a
    // renewal makes the bound tight enough to judge: unaligned (no
    // remaining TTL to watch, as in SQL session mode), the holder's real
    // deadline lies up to a renewal interval (or more, if renewals were
    // failing) before the bound, and a grant in between proves nothing:
    // said, not judged.
    let mut exclusion_judged = true;
    if report.overlap_count > 0 {
        if renewal_lag.is_some() {
            violations.push(format!(
                "another client was granted the key {} ms BEFORE the paused holder's deadline could be over",
                signed_ms(granted_at, deadline_bound)
            ));
        } else {
            exclusion_judged = false;
        }
    }
    if report.grants_past_deadline > 0 {
        violations.push("the next grant was handed out past its own deadline".to_owned());
    }
    let exclusion = if exclusion_judged {
        format!(
            "next grant {} ms after the paused holder's deadline bound",
            signed_ms(deadline_bound, granted_at)
        )
    } else {
        format!(
            "next grant {} ms before a deadline bound not aligned to a renewal: not judged",
            signed_ms(granted_at, deadline_bound)
        )
    };
    // Fencing: a stale write getting in, or the current holder's write
    // refused (its token was not above the paused holder's).
    let stale_seen = report.stale_writes_accepted > 0;
    let unprotected = stale_seen || report.current_holder_writes_rejected > 0;
    let fencing = if late_writes == 0 {
        "the resumed holder made no write: nothing was observed to judge (the instrument failed)"
            .to_owned()
    } else {
        format!(
            "of its {late_writes} write(s) after resuming, {} got in past the newer holder's write; {} write(s) of a current holder refused",
            report.stale_writes_accepted, report.current_holder_writes_rejected
        )
    };
    let negative_control = if fenced {
        if late_writes == 0 {
            violations.push(fencing.clone());
        } else if unprotected {
            violations.push(format!(
                "the tokens did not protect the resource: {fencing}"
            ));
        }
        None
    } else {
        // The negative control: without tokens the paused holder's late
        // write must be seen getting in after the newer holder's.
        Some(late_writes > 0 && stale_seen)
    };
    // The lost signal, on its own.
    let noticed = exit_code == Some(EXIT_LOCK_LOST);
    let lost_signal = format!(
        "resumed holder {} its loss ({})",
        if noticed {
            "reported"
        } else {
            "did NOT report"
        },
        exit_code.map_or("still running".to_owned(), |c| format!("exit {c}"))
    );
    if !noticed {
        violations.push(format!(
            "{lost_signal}, where exit {EXIT_LOCK_LOST} was due"
        ));
    }

    let mut figures = BTreeMap::new();
    figures.insert("paused_for_ms".into(), ms(resumed_at - paused_at));
    figures.insert("holder_ttl_ms".into(), ms(holder_ttl));
    figures.insert(
        "stopped_after_renewal_at_most_ms".into(),
        json!(renewal_lag.map(|d| (d.as_secs_f64() * 1e4).round() / 10.0)),
    );
    figures.insert(
        "next_grant_after_deadline_bound_ms".into(),
        signed_ms(deadline_bound, granted_at),
    );
    figures.insert("overlapping_grants".into(), json!(report.overlap_count));
    figures.insert("exclusion_judged".into(), json!(exclusion_judged));
    if let Some(d) = noticed_after {
        figures.insert("lost_signal_after_resume_ms".into(), ms(d));
    }
    figures.insert("holder_exit_code".into(), json!(exit_code));
    figures.insert("lost_signal_reported".into(), json!(noticed));
    figures.insert("writes_after_resume".into(), json!(late_writes));
    figures.insert(
        "stale_writes_accepted".into(),
        json!(report.stale_writes_accepted),
    );
    figures.insert("writes_rejected".into(), json!(report.writes_rejected));
    figures.insert(
        "current_holder_writes_rejected".into(),
        json!(report.current_holder_writes_rejected),
    );
    Ok(ScenarioReport::from_findings(
        negative_control,
        &violations,
        format!(
            "exclusion: {exclusion}; fencing{}: {fencing}; lost signal: {lost_signal} ({})",
            if fenced { "" } else { " (negative control)" },
            report.summary()
        ),
        figures,
    ))
}

/// A client is cut off (through a fault proxy) while it holds the lock:
/// its lost signal must fire before the server lets another client in.
pub async fn client_partitioned(env: &ScenarioEnv) -> ScenarioReport {
    finish(client_partitioned_inner(env).await)
}

pub(super) async fn client_partitioned_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let Some((cut_client, proxy)) = proxied_client(env).await? else {
        return Ok(ScenarioReport::skipped(NO_PROXY));
    };
    let other = client(env).await?;
    let key = key("partitioned");
    let guard = LockClient::from_arc(cut_client)
        .lock(key.as_str())
        .ttl(env.ttl)
        .acquire()
        .await
        .map_err(|e| format!("acquire through the proxy: {e}"))?;
    sleep(env.ttl / 2).await;
    proxy.partition();
    let cut_at = Instant::now();
    let bound = free_bound(env, &*other);
    let (lost_at, granted) = tokio::join!(
        async {
            guard.lost().await;
            Instant::now()
        },
        async {
            let r = other.acquire(&key, env.ttl, cut_at + bound).await;
            (r, Instant::now())
        }
    );
    let (grant, granted_at) = granted;
    proxy.heal();
    let lease = grant.map_err(|e| format!("the partitioned holder's lock was never freed: {e}"))?;
    let _ = other.release(&lease).await;
    let mut figures = BTreeMap::new();
    figures.insert("lost_signal_latency_ms".into(), ms(lost_at - cut_at));
    figures.insert("time_to_free_ms".into(), ms(granted_at - cut_at));
    let violated = lost_at > granted_at;
    // Positive: the holder knew before anyone else was let in.
    let margin_ms = if violated {
        -((lost_at - granted_at).as_secs_f64() * 1e3)
    } else {
        (granted_at - lost_at).as_secs_f64() * 1e3
    };
    figures.insert("lost_before_grant_ms".into(), json!(margin_ms));
    Ok(ScenarioReport::judged(
        false,
        violated,
        if violated {
            format!(
                "another client was granted {:?} BEFORE the cut-off holder was told",
                lost_at - granted_at
            )
        } else {
            format!(
                "lost signal {:?} before another client was granted",
                granted_at - lost_at
            )
        },
        figures,
    ))
}

/// A paused holder where leases are per process (a file lock): the kernel
/// keeps a stopped process's locks, so the key must stay taken however
/// long the pause lasts (three of the holder's TTLs here: any grant
/// meanwhile is a violation), and the holder goes on once resumed.
async fn paused_per_process(
    holder: &mut Holder,
    groups: &[libc::pid_t],
    other: &dyn LockBackend,
    key: &LockKey,
    ttl: Duration,
    holder_ttl: Duration,
) -> Result<ScenarioReport, String> {
    let paused_for = holder_ttl * 3;
    let asked = Instant::now();
    let taken = other.acquire(key, ttl, asked + paused_for).await;
    holder.signal_children(groups, libc::SIGCONT);
    holder.signal(libc::SIGCONT);
    let mut figures = BTreeMap::new();
    figures.insert("paused_ms".into(), ms(asked.elapsed()));
    match taken {
        Err(e) if e.is_contended() => Ok(ScenarioReport::judged(
            false,
            false,
            format!(
                "leases are per process: the stopped holder kept its lock for {paused_for:?} (no grant to anyone else) and went on when resumed"
            ),
            figures,
        )),
        Ok(lease) => {
            let _ = other.release(&lease).await;
            Ok(ScenarioReport::judged(
                false,
                true,
                format!(
                    "token {} granted while the stopped holder still held its per-process lock",
                    lease.token()
                ),
                figures,
            ))
        }
        Err(e) => Err(format!("the other client's acquire failed: {e}")),
    }
}
