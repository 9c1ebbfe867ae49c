//! Scenarios around one holder: killed, paused, cut off by a partition.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{FencingToken, LockClient};
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

/// A holder process is paused (SIGSTOP, with the command it runs) past
/// its TTL while another client takes the key and writes to the protected
/// resource. On resume the paused process itself writes to the resource
/// with the token it holds, as a process that does not know it was paused
/// would, and must then learn it lost the lock (exit 76). The resource
/// records every write (token, writer, time) and the history checker judges
/// them from the grant order: a write of the older grant that a
/// token-checking resource would let in after the newer holder's write is
/// a stale write accepted. Without fencing tokens this is a negative
/// control: the stale write must be observed getting in.
pub async fn holder_paused(env: &ScenarioEnv) -> ScenarioReport {
    finish(holder_paused_inner(env).await)
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
    let Some((mut holder, token_a)) = start_holder(env, &*other, &key, Some(&resource)).await?
    else {
        return Ok(ScenarioReport::skipped(
            "no holder process or URL for this target",
        ));
    };
    let seen_at = Instant::now();
    // Wait for the holder's first write, so the pause lands mid-work.
    let until = Instant::now() + Duration::from_secs(5);
    while resource.arrivals().is_empty() {
        if Instant::now() >= until {
            return Err("the holder process never wrote to the resource".into());
        }
        sleep(Duration::from_millis(10)).await;
    }
    let groups = holder.child_groups();
    holder.signal(libc::SIGSTOP);
    holder.signal_children(&groups, libc::SIGSTOP);
    let paused_at = Instant::now();
    let rec_a = history.process();
    let rec_b = history.process();
    // The holder's grant as observed: held from when it was first seen (or
    // first wrote) until it was paused; what it did after is judged.
    let first_write = resource.arrivals().first().map_or(seen_at, |a| a.at);
    let token_of = |t: Option<FencingToken>| t.filter(|_| fenced);
    rec_a.record_at(
        first_write.min(seen_at),
        EventKind::Ok,
        Op::Acquire,
        &key,
        token_of(token_a),
        Some(paused_at),
    );
    let bound = free_bound(env, &*other);
    let lease_b = recorded_acquire(&*other, &rec_b, &key, env.ttl, paused_at + bound)
        .await
        .map_err(|e| format!("the paused holder's lock was not freed within {bound:?}: {e}"))?;
    rec_b.wrote(&key, token_of(Some(lease_b.token())));
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
    let arrivals = resource.arrivals();
    let late_writes = arrivals.iter().filter(|a| a.at >= resumed_at).count();
    for arrival in &arrivals {
        let token = arrival.line.parse::<u64>().ok().map(FencingToken::new);
        rec_a.record_at(
            arrival.at,
            EventKind::Ok,
            Op::Write,
            &key,
            token_of(token),
            None,
        );
    }
    if late_writes == 0 {
        return Err(
            "the resumed holder made no write: nothing was observed to judge (the instrument failed)"
                .into(),
        );
    }
    let report = history.check();
    // A stale write getting in, or the current holder's write refused (its
    // token was not above the paused holder's): either way the tokens did
    // not protect the resource.
    let stale_accepted =
        report.stale_writes_accepted > 0 || report.current_holder_writes_rejected > 0;
    let mut figures = BTreeMap::new();
    figures.insert("paused_for_ms".into(), ms(resumed_at - paused_at));
    if let Some(d) = noticed_after {
        figures.insert("lost_signal_after_resume_ms".into(), ms(d));
    }
    figures.insert("holder_exit_code".into(), json!(exit_code));
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
    let noticed = exit_code == Some(76);
    let violated = stale_accepted || !noticed;
    Ok(ScenarioReport::judged(
        !fenced,
        violated,
        format!(
            "resumed holder {} its loss ({}); of its {late_writes} write(s) after resuming, {} got in past the newer holder's write ({})",
            if noticed {
                "reported"
            } else {
                "did NOT report"
            },
            exit_code.map_or("still running".to_owned(), |c| format!("exit {c}")),
            report.stale_writes_accepted,
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
