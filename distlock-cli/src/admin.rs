//! The operator's commands: `inspect`'s output, `force-release`, `watch`
//! and `gc` (`list` and `leader` are in `listing`).

use std::time::Duration;

use lock_core::{
    FencingToken, HolderDetails, HolderInfo, LockBackendExt, LockClient, LockError, LockInfo,
    LockKey, LockShape, Operation, WatchRequest,
};
use serde_json::{Value, json};

use crate::exit;

/// `2026-12-02T01:02:03.456Z` for milliseconds since the Unix epoch.
pub(crate) fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX);
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

pub(crate) fn details_json(details: Option<&HolderDetails>) -> Value {
    details.map_or(Value::Null, |d| {
        json!({
            "host": d.host,
            "pid": d.pid,
            "program": d.program,
            "label": d.label,
            "granted_at": utc(d.granted_at_ms),
            "granted_at_ms": d.granted_at_ms,
        })
    })
}

/// A held lock as JSON (`inspect --json`, `list --json`).
pub(crate) fn info_json(info: &LockInfo) -> Value {
    json!({
        "key": info.key.as_str(),
        "held": true,
        "holder": info.holder,
        "token": info.token.map(FencingToken::get),
        "remaining_ttl_ms": info.remaining_ttl.map(|d| d.as_millis()),
        "details": details_json(info.details.as_ref()),
    })
}

pub(crate) fn ttl_text(t: Option<Duration>) -> String {
    t.map_or("-".to_owned(), distlock::format_duration)
}

pub(crate) fn token_text(t: Option<FencingToken>) -> String {
    t.map_or("-".to_owned(), |t| t.to_string())
}

/// A held lock in one line: key, holder, token, TTL, then who and since
/// when where the backend keeps it.
pub(crate) fn info_line(info: &LockInfo) -> String {
    let mut line = format!(
        "{} held by {} token {} ttl {}",
        info.key,
        info.holder,
        token_text(info.token),
        ttl_text(info.remaining_ttl)
    );
    line.push_str(&details_text(info.details.as_ref()));
    line
}

/// ` (program pid P on host since T, label L)`, or nothing without details.
pub(crate) fn details_text(details: Option<&HolderDetails>) -> String {
    let Some(d) = details else {
        return String::new();
    };
    let mut text = format!(
        " ({} pid {} on {} since {}",
        d.program,
        d.pid,
        d.host,
        utc(d.granted_at_ms)
    );
    if let Some(label) = &d.label {
        text.push_str(&format!(", label {label}"));
    }
    text.push(')');
    text
}

/// One holder of a read-write lock or semaphore as JSON.
pub(crate) fn holder_json(shape: LockShape, h: &HolderInfo) -> Value {
    json!({
        "shape": shape.as_str(),
        "kind": h.kind.code(),
        "holder": h.holder,
        "token": h.token.map(FencingToken::get),
        "remaining_ttl_ms": h.remaining_ttl.map(|d| d.as_millis()),
        "details": details_json(h.details.as_ref()),
    })
}

/// One holder of a read-write lock or semaphore in one line.
pub(crate) fn holder_line(key: &LockKey, shape: LockShape, h: &HolderInfo) -> String {
    format!(
        "{key} {shape} {} by {} token {} ttl {}{}",
        h.kind,
        h.holder,
        token_text(h.token),
        ttl_text(h.remaining_ttl),
        details_text(h.details.as_ref())
    )
}

/// `distlock inspect`.
pub(crate) async fn inspect(client: &LockClient, key: &str, json: bool) -> Result<u8, LockError> {
    let info = client.inspect(key).await?;
    let caps = client.capabilities();
    let lock_key = LockKey::new(key)?;
    let mut shared = Vec::new();
    for (shape, has) in [
        (LockShape::ReadWrite, caps.shared_locks),
        (LockShape::Semaphore, caps.semaphores),
    ] {
        if has {
            for holder in client.backend().holders(&lock_key, shape).await? {
                shared.push((shape, holder));
            }
        }
    }
    if json {
        let holders: Vec<_> = shared
            .iter()
            .map(|(shape, h)| holder_json(*shape, h))
            .collect();
        let mut value = match &info {
            Some(info) => info_json(info),
            None => json!({ "key": key, "held": false }),
        };
        value["shared_holders"] = Value::Array(holders);
        println!("{value}");
        return Ok(0);
    }
    match &info {
        Some(info) => println!("{}", info_line(info)),
        None if shared.is_empty() => println!("{key} is free"),
        None => {}
    }
    for (shape, h) in &shared {
        println!("{}", holder_line(&lock_key, *shape, h));
    }
    Ok(0)
}

/// Who runs this process, for the log of a forced release.
fn operator() -> String {
    let user = std::env::var("SUDO_USER")
        .or_else(|_| std::env::var("USER"))
        .unwrap_or_else(|_| format!("uid {}", real_uid()));
    let details = HolderDetails::current();
    format!("{user} on {} (pid {})", details.host, details.pid)
}

/// The real user id, read from `/proc`.
fn real_uid() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .unwrap_or_else(|| "?".to_owned())
}

/// `distlock force-release`: breaks the lock, says what the next holder's
/// token will be above, and logs who did it.
pub(crate) async fn force_release(
    client: &LockClient,
    key: &str,
    yes_unfenced: bool,
    reserved: bool,
    json: bool,
) -> Result<u8, LockError> {
    let caps = client.capabilities();
    let key = LockKey::new(key)?;
    if key.is_reserved() && !reserved {
        return Err(LockError::invalid_argument(
            Operation::Release,
            format!(
                "{key} is one of distlock's own keys (a migration's cutover marker or its record): \
                 breaking it lets processes still on phase `old` in beside `new` holders; \
                 pass --reserved to break it anyway"
            ),
        )
        .with_key(&key));
    }
    if !caps.has_fencing() && !yes_unfenced {
        return Err(LockError::config(format!(
            "{} gives no fencing tokens: the broken holder's late writes could not be told \
             from the next holder's; pass --yes-unfenced to break {key} anyway",
            client.backend().name()
        )));
    }
    let broken = if reserved {
        client.force_release_reserved(key.as_str()).await?
    } else {
        client.force_release(key.as_str()).await?
    };
    let who = operator();
    match &broken {
        Some(info) => {
            tracing::warn!(key = %key, holder = %info.holder, token = ?info.token.map(FencingToken::get), operator = %who, "lock broken by force-release");
            eprintln!(
                "distlock: {who} broke {key} (holder {}, token {})",
                info.holder,
                token_text(info.token)
            );
        }
        None => eprintln!("distlock: {who}: {key} was free, nothing broken"),
    }
    if json {
        println!(
            "{}",
            json!({
                "key": key.as_str(),
                "broken": broken.as_ref().map(info_json),
                "fenced": caps.has_fencing(),
                "operator": who,
            })
        );
    } else if let Some(info) = &broken {
        match (caps.has_fencing(), info.token) {
            (true, Some(token)) => println!(
                "broke {} ({}); the next grant's token is above {token}: a resource that checks \
                 tokens rejects the old holder's writes once the next holder has written",
                info.key,
                info_line(info)
            ),
            (true, None) => println!(
                "broke {} ({}); its holder was not ours (no token): nothing fences its late writes",
                info.key,
                info_line(info)
            ),
            (false, _) => println!(
                "broke {} ({}); UNFENCED: this backend has no tokens, the old holder's late writes \
                 cannot be rejected",
                info.key,
                info_line(info)
            ),
        }
    } else {
        println!("{key} is free");
    }
    Ok(if broken.is_some() { 0 } else { exit::NOT_HELD })
}

/// `distlock watch`: a line each time the holder changes (woken by the
/// store's watch where the driver has one, see
/// [`HolderWatch::watch_holder`](lock_core::HolderWatch::watch_holder),
/// polled every `interval` otherwise), until interrupted or after
/// `changes` changes.
pub(crate) async fn watch(
    client: &LockClient,
    key: &str,
    interval: Duration,
    changes: Option<u64>,
    json: bool,
) -> Result<u8, LockError> {
    let backend = client.backend();
    let lock_key = LockKey::new(key).map_err(|e| e.with_backend(backend.name()))?;
    let print = |info: &Option<LockInfo>| {
        let at = utc(u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis(),
        )
        .unwrap_or(u64::MAX));
        if json {
            let value = match info {
                Some(i) => info_json(i),
                None => json!({ "key": key, "held": false }),
            };
            println!("{}", json!({ "at": at, "lock": value }));
        } else {
            match info {
                Some(i) => println!("{at} {}", info_line(i)),
                None => println!("{at} {key} is free"),
            }
        }
    };
    let mut last = client.inspect(key).await?;
    print(&last);
    let mut seen = 0u64;
    loop {
        // Come back now and then even when nothing changes (a watch that
        // silently stalled is replaced).
        let until = tokio::time::Instant::now() + interval.max(Duration::from_secs(30));
        let now = backend
            .watch_holder(WatchRequest::new(&lock_key, last.as_ref(), interval, until))
            .await?;
        if !LockInfo::same_holder(now.as_ref(), last.as_ref()) {
            print(&now);
            seen += 1;
            if changes.is_some_and(|n| seen >= n) {
                return Ok(0);
            }
        }
        last = now;
    }
}

/// `distlock gc`: collects in bounded calls until one removes nothing.
pub(crate) async fn gc(
    client: &LockClient,
    older_than: Duration,
    json: bool,
) -> Result<u8, LockError> {
    const MAX_CALLS: usize = 10_000;
    let (mut removed, mut scanned, mut floor) = (0u64, 0u64, None);
    for _ in 0..MAX_CALLS {
        let report = client.backend().gc(older_than).await?;
        removed += report.removed;
        scanned += report.scanned;
        floor = report.token_floor.or(floor);
        if report.removed == 0 {
            break;
        }
    }
    if json {
        println!(
            "{}",
            json!({ "removed": removed, "scanned": scanned, "token_floor": floor.map(FencingToken::get) })
        );
    } else {
        println!(
            "removed {removed} stale record(s) of keys unused for {} ({scanned} looked at){}",
            distlock::format_duration(older_than),
            floor.map_or(String::new(), |f| format!(
                "; new grants of removed keys start above token {f}"
            ))
        );
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(utc(1_796_174_147_626), "2026-12-02T01:15:47.626Z");
    }
}
