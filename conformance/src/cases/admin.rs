//! Cases on operating locks: holder details in `inspect`, and the
//! [`Admin`](lock_core::Admin) facet's calls (`list` of the held locks
//! under a prefix, `force_release` fencing out the old holder, `gc`
//! keeping tokens rising), run where the backend has that facet.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{ErrorKind, ListQuery, WatchRequest};

use crate::harness::Harness;
use crate::history::{FencedResource, History};

use super::holder_details::{check_details, now_ms};
use super::*;

/// A backend that claims holder details (`Capabilities::holder_details`)
/// shows, to another client, this process's host, pid and program and a
/// grant time between the moments before and after the acquire.
pub async fn holder_details_are_reported(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    if !a.capabilities().holder_details {
        return Ok(Outcome::Skipped(
            "the backend does not claim holder details".into(),
        ));
    }
    let ttl = h.ttl_for(&a.capabilities()).max(Duration::from_secs(5));
    let key = h.key("details");
    let before = now_ms();
    let lease = take_free(&*a, &key, ttl).await?;
    let after = now_ms();
    let info = b
        .inspect(&key)
        .await
        .map_err(fmt_err("inspect"))?
        .ok_or("inspect found no holder of a held key")?;
    check_details(info.details.as_ref(), before, after, "inspect")?;
    let details = info.details.ok_or("no details")?;
    ensure!(
        a.release(&lease).await.map_err(fmt_err("release"))?,
        "release said not held"
    );
    ensure!(
        b.inspect(&key).await.map_err(fmt_err("inspect"))?.is_none(),
        "a released key still reports a holder"
    );
    Ok(Outcome::Passed(format!(
        "{}@{} pid {} at {} ms",
        details.program, details.host, details.pid, details.granted_at_ms
    )))
}

/// `list` (the [`Listing`](lock_core::Listing) facet) pages through exactly
/// the held locks under a prefix: each once, with its token, none outside
/// the prefix, none released; a bad page size is refused.
pub async fn list_finds_held_locks(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    if b.facets().listing.is_none() {
        return Ok(without_facet("Listing", "list"));
    }
    let ttl = h.ttl_for(&a.capabilities()).max(Duration::from_secs(5));
    let prefix = format!("{}/", h.key("list").as_str());
    let empty = served(
        b.list(&ListQuery::new(&prefix, 10)).await,
        "Listing",
        "list",
    )?;
    ensure!(
        empty.locks.is_empty(),
        "an unused prefix lists {} lock(s)",
        empty.locks.len()
    );
    let mut held = Vec::new();
    for i in 0..5 {
        let key = LockKey::new(format!("{prefix}{i}")).map_err(|e| e.to_string())?;
        held.push(take_free(&*a, &key, ttl).await?);
    }
    // Beside the prefix, not under it.
    let outside = take_free(&*a, &h.key("listx"), ttl).await?;
    // The prefix without its slash is another key, not under it.
    let sibling = LockKey::new(prefix.trim_end_matches('/')).map_err(|e| e.to_string())?;
    let sibling = take_free(&*a, &sibling, ttl).await?;
    let released = held.pop().ok_or("no lease")?;
    ensure!(
        a.release(&released).await.map_err(fmt_err("release"))?,
        "release said not held"
    );

    let mut seen = HashSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        pages += 1;
        ensure!(pages <= 50, "list did not finish within 50 pages of 2");
        let page = served(
            b.list(&ListQuery::new(&prefix, 2).after(cursor.as_deref()))
                .await,
            "Listing",
            "list",
        )?;
        ensure!(
            page.locks.len() <= 2,
            "a page of 2 held {}",
            page.locks.len()
        );
        for info in page.locks {
            ensure!(
                info.key.as_str().starts_with(&prefix),
                "list of {prefix:?} returned {}",
                info.key
            );
            let lease = held
                .iter()
                .find(|l| l.key() == &info.key)
                .ok_or_else(|| format!("list returned {}, which is not held", info.key))?;
            if let Some(token) = info.token {
                ensure!(
                    token == lease.token(),
                    "list shows token {token} for {}, granted {}",
                    info.key,
                    lease.token()
                );
            }
            ensure!(
                info.remaining_ttl.is_none_or(|left| left <= ttl),
                "remaining TTL {:?} above the TTL {ttl:?}",
                info.remaining_ttl
            );
            ensure!(
                seen.insert(info.key.clone()),
                "list returned {} twice",
                info.key
            );
        }
        match page.cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    ensure!(
        seen.len() == held.len(),
        "list found {} of the {} held locks",
        seen.len(),
        held.len()
    );
    let bad = b.list(&ListQuery::new(&prefix, 0)).await;
    ensure!(
        matches!(&bad, Err(e) if e.kind() == ErrorKind::InvalidArgument),
        "a page of 0 locks was not refused: {bad:?}"
    );
    for lease in held.iter().chain([&outside, &sibling]) {
        let _ = a.release(lease).await;
    }
    Ok(Outcome::Passed(format!(
        "{} held locks in {pages} page(s)",
        seen.len()
    )))
}

/// `force_release` (the [`Admin`](lock_core::Admin) facet) breaks a held
/// lock: it returns the broken holder, the next grant's token is above the
/// broken one (where the backend fences), a resource checking tokens then
/// rejects the old holder's late write, the old holder can neither renew
/// nor release, and a free key reports nothing broken.
pub async fn force_release_fences_the_old_holder(h: &Harness) -> CaseResult {
    let (a, admin) = two_clients(h).await?;
    if admin.facets().admin.is_none() {
        return Ok(without_facet("Admin", "force_release"));
    }
    let c = h.client().await.map_err(fmt_err("connecting a client"))?;
    let caps = a.capabilities();
    let ttl = h.ttl_for(&caps).max(Duration::from_secs(10));
    let key = h.key("force");
    let none = served(admin.force_release(&key).await, "Admin", "force_release")?;
    ensure!(
        none.is_none(),
        "a free key reported a broken holder: {none:?}"
    );
    let history = Arc::new(History::new());
    let (rec_a, rec_c) = (history.process(), history.process());
    let resource = FencedResource::new();
    let old = take_free(&*a, &key, ttl).await?;
    ensure!(
        resource.write(&rec_a, &key, old.token(), |v| *v += 1),
        "the first holder's write was rejected"
    );
    let broken = served(admin.force_release(&key).await, "Admin", "force_release")?
        .ok_or("force_release of a held key reported nothing broken")?;
    if let Some(token) = broken.token {
        ensure!(
            token == old.token(),
            "force_release broke token {token}, the holder had {}",
            old.token()
        );
    }
    let next = c
        .acquire(
            &key,
            ttl,
            tokio::time::Instant::now() + Duration::from_secs(10),
        )
        .await
        .map_err(fmt_err("acquire after force_release"))?;
    let mut fenced = "no fencing on this backend".to_owned();
    if caps.has_fencing() {
        ensure!(
            next.token() > old.token(),
            "the next grant's token {} is not above the broken {}",
            next.token(),
            old.token()
        );
        ensure!(
            resource.write(&rec_c, &key, next.token(), |v| *v += 1),
            "the next holder's write was rejected"
        );
        ensure!(
            !resource.write(&rec_a, &key, old.token(), |v| *v += 1),
            "the broken holder's late write was accepted"
        );
        fenced = format!(
            "token {} -> {}, late write rejected",
            old.token(),
            next.token()
        );
    }
    match a.renew(&old).await {
        Ok(_) => return Err("the broken holder could still renew".into()),
        Err(e) if e.is_not_held() || e.is_lost() => {}
        Err(e) => return Err(format!("renew of the broken lease: {e}")),
    }
    ensure!(
        !a.release(&old).await.map_err(fmt_err("release"))?,
        "the broken holder's release said held"
    );
    let info = c
        .inspect(&key)
        .await
        .map_err(fmt_err("inspect"))?
        .ok_or("the new holder is not shown")?;
    if let Some(token) = info.token {
        ensure!(token == next.token(), "inspect shows token {token}");
    }
    ensure!(
        c.release(&next).await.map_err(fmt_err("release"))?,
        "the new holder's release said not held"
    );
    Ok(Outcome::Passed(fenced))
}

/// `gc` (the [`Admin`](lock_core::Admin) facet) collects without letting
/// a token go backwards: after runs of `gc` with no age limit (until one
/// removes nothing, at most 20), a held key keeps its holder, its token and
/// its renewals, and a freed key's next grant gets a token above its last
/// one (where the backend fences). A backend that keeps no per-key state
/// answers an empty report, which passes.
pub async fn gc_keeps_tokens_rising(h: &Harness) -> CaseResult {
    let (a, admin) = two_clients(h).await?;
    if admin.facets().admin.is_none() {
        return Ok(without_facet("Admin", "gc"));
    }
    let caps = a.capabilities();
    let ttl = h.ttl_for(&caps).max(Duration::from_secs(5));
    let (freed, held) = (h.key("gc-freed"), h.key("gc-held"));
    let first = take_free(&*a, &freed, ttl).await?;
    ensure!(
        a.release(&first).await.map_err(fmt_err("release"))?,
        "release said not held"
    );
    let kept = take_free(&*a, &held, ttl).await?;
    let (mut removed, mut runs) = (0, 0);
    loop {
        runs += 1;
        let report = served(admin.gc(Duration::ZERO).await, "Admin", "gc")?;
        removed += report.removed;
        if report.removed == 0 || runs == 20 {
            break;
        }
    }
    let info = admin
        .inspect(&held)
        .await
        .map_err(fmt_err("inspect"))?
        .ok_or("gc freed a held key")?;
    if let Some(token) = info.token {
        ensure!(
            token == kept.token(),
            "after gc the held key shows token {token}, granted {}",
            kept.token()
        );
    }
    a.renew(&kept)
        .await
        .map_err(fmt_err("renew of a held key after gc"))?;
    let next = take_free(&*a, &freed, ttl).await?;
    let mut fenced = "no fencing on this backend".to_owned();
    if caps.has_fencing() {
        ensure!(
            next.token() > first.token(),
            "after gc the freed key's next token {} is not above its last {}",
            next.token(),
            first.token()
        );
        fenced = format!("freed key's token {} -> {}", first.token(), next.token());
    }
    ensure!(
        a.release(&next).await.map_err(fmt_err("release"))?,
        "release said not held"
    );
    ensure!(
        a.release(&kept).await.map_err(fmt_err("release"))?,
        "the held key's release after gc said not held"
    );
    Ok(Outcome::Passed(format!(
        "{removed} record(s) removed in {runs} run(s); held key kept; {fenced}"
    )))
}

/// `watch_holder` (what `distlock watch` follows) reports every change of
/// a key's holder, in order: a grant, its release, the next grant, each
/// within 5 s of the change; and with nothing changing it returns at its
/// deadline, with the key still free. Polled every 100 ms here, so every
/// backend runs it; the drivers with watches run
/// [`watch_sees_changes`] with a poll of a minute in their own tests,
/// which only a notification passes.
pub async fn watch_follows_the_holder(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let ttl = h.ttl_for(&a.capabilities()).max(Duration::from_secs(5));
    let key = h.key("watch");
    watch_sees_changes(b, a, &key, ttl, Duration::from_millis(100))
        .await
        .map(Outcome::Passed)
}

/// The check behind [`watch_follows_the_holder`]: `watcher` follows `key`
/// (polling every `poll` where the driver has no watch) while `holder`
/// takes it, releases it and takes it again, each step once the watcher
/// reported the one before (so no change can hide behind the next). Fails
/// when a change is missed, reported out of order, or seen later than 5 s
/// after it happened. The description of what was seen on success.
pub async fn watch_sees_changes(
    watcher: Arc<dyn LockBackend>,
    holder: Arc<dyn LockBackend>,
    key: &LockKey,
    ttl: Duration,
    poll: Duration,
) -> Result<String, String> {
    const LATE: Duration = Duration::from_secs(5);
    let quiet = Instant::now();
    let free = watcher
        .watch_holder(WatchRequest::new(
            key,
            None,
            poll,
            quiet + Duration::from_millis(300),
        ))
        .await
        .map_err(fmt_err("watch_holder"))?;
    ensure!(free.is_none(), "a free key watched as held by {free:?}");
    ensure!(
        quiet.elapsed() >= Duration::from_millis(300),
        "watch_holder returned after {:?}, before its deadline, with nothing changed",
        quiet.elapsed()
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let follower = {
        let (watcher, key) = (watcher.clone(), key.clone());
        tokio::spawn(async move {
            let mut seen: Option<lock_core::LockInfo> = None;
            loop {
                let until = Instant::now() + LATE + LATE;
                match watcher
                    .watch_holder(WatchRequest::new(&key, seen.as_ref(), poll, until))
                    .await
                {
                    Ok(now) => {
                        if !lock_core::LockInfo::same_holder(now.as_ref(), seen.as_ref())
                            && tx.send(now.clone()).is_err()
                        {
                            return;
                        }
                        seen = now;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        })
    };
    let mut steps = Vec::new();
    let result = async {
        let first = take_free(&*holder, key, ttl).await?;
        steps.push(reported(&mut rx, Some(first.token()), "a grant").await?);
        ensure!(
            holder.release(&first).await.map_err(fmt_err("release"))?,
            "release said not held"
        );
        steps.push(reported(&mut rx, None, "a release").await?);
        let second = take_free(&*holder, key, ttl).await?;
        steps.push(reported(&mut rx, Some(second.token()), "the next grant").await?);
        holder.release(&second).await.map_err(fmt_err("release"))?;
        Ok::<_, String>(())
    }
    .await;
    follower.abort();
    result?;
    Ok(format!(
        "grant, release, grant seen after {steps:?} (poll {poll:?})"
    ))
}

/// Waits (up to 5 s) for the watcher's next report (`None`: free, else
/// the holder as the backend reports it) and checks it is `want` (`None`:
/// free; a holder with that token, or with none where the backend reports
/// no tokens, as Redlock); how long it took.
///
/// A holder marked [`lock_core::OLD_ONLY_MARK`] is passed over: a
/// migration's dual phase takes the old store and then the new one (and
/// gives them back in the other order), so a read can fall between the two
/// halves of one grant or release; that half-way holder is not a step.
async fn reported(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Option<lock_core::LockInfo>>,
    want: Option<lock_core::FencingToken>,
    what: &str,
) -> Result<Duration, String> {
    const LATE: Duration = Duration::from_secs(5);
    let started = Instant::now();
    let got = loop {
        let report = tokio::time::timeout_at(started + LATE, rx.recv())
            .await
            .map_err(|_| format!("the watch did not report {what} within {LATE:?}"))?
            .ok_or("the watcher stopped")?;
        match report {
            Some(info) if lock_core::is_old_only(&info.holder) => continue,
            report => break report.map(|info| info.token),
        }
    };
    let matches = match (got, want) {
        (None, None) => true,
        (Some(token), Some(want)) => token.is_none_or(|t| t == want),
        _ => false,
    };
    ensure!(
        matches,
        "after {what} the watch reported {got:?}, not the holder with token {want:?}"
    );
    Ok(started.elapsed())
}

/// Reads `key`'s holder through `watcher`, then watches it (`poll`, for at
/// most `limit`) while `act` runs 200 ms into the watch; what the watch
/// returned and how long it took. Driver tests use it to show a release
/// waking their watch long before `poll`, and an unannounced change (an
/// expiry, a key deleted by hand) seen only at `limit`.
pub async fn watch_across(
    watcher: Arc<dyn LockBackend>,
    key: &LockKey,
    poll: Duration,
    limit: Duration,
    act: impl std::future::Future<Output = ()>,
) -> Result<(Option<lock_core::LockInfo>, Duration), String> {
    let seen = watcher.inspect(key).await.map_err(fmt_err("inspect"))?;
    ensure!(seen.is_some(), "{key} is not held before the watch");
    let watching = {
        let key = key.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let now = watcher
                .watch_holder(WatchRequest::new(
                    &key,
                    seen.as_ref(),
                    poll,
                    started + limit,
                ))
                .await;
            (now, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    act.await;
    let (now, waited) = watching.await.map_err(|e| e.to_string())?;
    Ok((now.map_err(fmt_err("watch_holder"))?, waited))
}
