//! Operating cases for the lock shapes beyond the mutex: holder details of
//! readers, writers, permit holders and leaders, and `list_shared` /
//! `list_elections` (the [`Admin`](lock_core::Admin) facet) paging through
//! exactly what is held. Shapes are checked where the capabilities claim
//! them; a claimed shape refused as `Unsupported` fails.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use lock_core::{ErrorKind, HolderInfo, LeaseKind, ListQuery, LockBackend, LockShape};

use crate::harness::Harness;

use super::holder_details::{check_details, now_ms};
use super::*;

/// `try_acquire_kind` that must grant, or `Ok(None)` where the backend
/// does not claim the shape (its capabilities' `shared_locks` /
/// `semaphores`).
async fn take_kind(
    backend: &dyn LockBackend,
    key: &LockKey,
    kind: LeaseKind,
    ttl: Duration,
) -> Result<Option<Lease>, String> {
    let caps = backend.capabilities();
    let claimed = match kind.shape() {
        LockShape::ReadWrite => caps.shared_locks,
        LockShape::Semaphore => caps.semaphores,
        _ => true,
    };
    if !claimed {
        return Ok(None);
    }
    match backend.try_acquire_kind(key, kind, ttl).await {
        Ok(Some(lease)) => Ok(Some(lease)),
        Ok(None) => Err(format!("{kind} on a free {key} was refused")),
        Err(e) => Err(format!("{kind} on {key} (the shape is claimed): {e}")),
    }
}

/// The holders of `key` in `shape`, each checked to carry this process's
/// details within `[before, after]`; `expect` holders of that kind.
async fn holders_with_details(
    b: &dyn LockBackend,
    key: &LockKey,
    shape: LockShape,
    expect: (usize, LeaseKind),
    window: (u64, u64),
) -> Result<(), String> {
    let holders = b.holders(key, shape).await.map_err(fmt_err("holders"))?;
    ensure!(
        holders.len() == expect.0 && holders.iter().all(|h| h.kind == expect.1),
        "holders of {shape} {key}: {holders:?}, expected {} of {}",
        expect.0,
        expect.1
    );
    for holder in &holders {
        check_details(
            holder.details.as_ref(),
            window.0,
            window.1,
            &format!("{} of {key}", holder.kind),
        )?;
    }
    Ok(())
}

async fn release_all(backend: &dyn LockBackend, leases: &[Lease]) -> Result<(), String> {
    for lease in leases {
        ensure!(
            backend.release(lease).await.map_err(fmt_err("release"))?,
            "release of {} said not held",
            lease.key()
        );
    }
    Ok(())
}

/// On a backend that claims holder details, every shape it has reports
/// them to another client: each of two readers and then the writer of a
/// read-write lock, each of two permit holders of a semaphore
/// ([`holders`](LockBackend::holders)), each key of a multi-lock set taken
/// in one exchange ([`try_acquire_all`](lock_core::LockSets::try_acquire_all),
/// where the backend has the `LockSets` facet), and an election's leader
/// ([`leader`](LockBackendExt::leader)): this process's host, pid and
/// program, and a grant time within the acquire.
pub async fn shared_holder_details_are_reported(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    if !a.capabilities().holder_details {
        return Ok(Outcome::Skipped(
            "the backend does not claim holder details".into(),
        ));
    }
    let ttl = h.ttl_for(&a.capabilities()).max(Duration::from_secs(5));
    let mut checked = Vec::new();

    let key = h.key("details-rw");
    let before = now_ms();
    if let Some(first) = take_kind(&*a, &key, LeaseKind::Read, ttl).await? {
        let second = take_kind(&*b, &key, LeaseKind::Read, ttl)
            .await?
            .ok_or("a second reader: the shape is no longer claimed")?;
        let window = (before, now_ms());
        holders_with_details(
            &*b,
            &key,
            LockShape::ReadWrite,
            (2, LeaseKind::Read),
            window,
        )
        .await?;
        release_all(&*a, &[first]).await?;
        release_all(&*b, &[second]).await?;
        let before = now_ms();
        let writer = take_kind(&*a, &key, LeaseKind::Write, ttl)
            .await?
            .ok_or("a writer: the shape is no longer claimed")?;
        let window = (before, now_ms());
        holders_with_details(
            &*b,
            &key,
            LockShape::ReadWrite,
            (1, LeaseKind::Write),
            window,
        )
        .await?;
        release_all(&*a, &[writer]).await?;
        checked.push("2 readers, a writer");
    }

    let key = h.key("details-sem");
    let permit = LeaseKind::permits(1, 3).map_err(|e| e.to_string())?;
    let before = now_ms();
    if let Some(first) = take_kind(&*a, &key, permit, ttl).await? {
        let second = take_kind(&*b, &key, permit, ttl)
            .await?
            .ok_or("a second permit: the shape is no longer claimed")?;
        let window = (before, now_ms());
        holders_with_details(&*b, &key, LockShape::Semaphore, (2, permit), window).await?;
        release_all(&*a, &[first]).await?;
        release_all(&*b, &[second]).await?;
        checked.push("2 permit holders");
    }

    // A multi-lock set taken in one exchange (where the backend has the
    // LockSets facet): every key of it carries the details.
    let set = [h.key("details-set/a"), h.key("details-set/b")];
    let before = now_ms();
    let taken = match a.facets().lock_sets {
        Some(_) => Some(a.try_acquire_all(&set, ttl).await),
        None => None,
    };
    match taken {
        None => {}
        Some(Ok(Some(leases))) => {
            let window = (before, now_ms());
            for key in &set {
                let info = b
                    .inspect(key)
                    .await
                    .map_err(fmt_err("inspect"))?
                    .ok_or_else(|| format!("{key} of a granted set has no holder"))?;
                check_details(
                    info.details.as_ref(),
                    window.0,
                    window.1,
                    &format!("{key} of a set"),
                )?;
            }
            release_all(&*a, &leases).await?;
            checked.push("a set of 2 keys");
        }
        Some(Ok(None)) => return Err("a set of free keys was refused".into()),
        // The facet may refuse a set it cannot take in one exchange.
        Some(Err(e)) if e.kind() == ErrorKind::Unsupported => {}
        Some(Err(e)) => return Err(format!("try_acquire_all: {e}")),
    }

    let election = h.key("details-elect");
    let before = now_ms();
    let term = a
        .campaign(&election, ttl, tokio::time::Instant::now() + ttl)
        .await
        .map_err(fmt_err("campaign"))?;
    let window = (before, now_ms());
    let leader = b
        .leader(&election)
        .await
        .map_err(fmt_err("leader"))?
        .ok_or("an election with a leader reported none")?;
    check_details(leader.details.as_ref(), window.0, window.1, "the leader")?;
    release_all(&*a, &[term]).await?;
    checked.push("a leader");
    Ok(Outcome::Passed(checked.join(", ")))
}

/// What one listed key is expected to show: its holders' kind and tokens.
struct Expected {
    kind: LeaseKind,
    tokens: Vec<lock_core::FencingToken>,
}

/// Pages through `list_shared(shape, prefix)` two keys at a time and
/// checks it found exactly `expected`: each key once, under the prefix,
/// with its holders' count, kind and tokens (where reported); the number
/// of pages.
async fn check_shared_listing(
    b: &dyn LockBackend,
    shape: LockShape,
    prefix: &str,
    expected: &HashMap<LockKey, Expected>,
) -> Result<usize, String> {
    let mut seen = HashSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        pages += 1;
        ensure!(
            pages <= 50,
            "list_shared did not finish within 50 pages of 2"
        );
        let page = served(
            b.list_shared(shape, &ListQuery::new(prefix, 2).after(cursor.as_deref()))
                .await,
            "Listing",
            &format!("list_shared({shape})"),
        )?;
        ensure!(
            page.locks.len() <= 2,
            "a page of 2 held {}",
            page.locks.len()
        );
        for lock in page.locks {
            ensure!(
                lock.key.as_str().starts_with(prefix),
                "list_shared({shape}) of {prefix:?} returned {}",
                lock.key
            );
            let want = expected.get(&lock.key).ok_or_else(|| {
                format!(
                    "list_shared({shape}) returned {}, which is not held",
                    lock.key
                )
            })?;
            check_listed(&lock.holders, want, shape, &lock.key)?;
            ensure!(
                seen.insert(lock.key.clone()),
                "list_shared({shape}) returned {} twice",
                lock.key
            );
        }
        match page.cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    ensure!(
        seen.len() == expected.len(),
        "list_shared({shape}) found {} of the {} held keys",
        seen.len(),
        expected.len()
    );
    Ok(pages)
}

fn check_listed(
    holders: &[HolderInfo],
    want: &Expected,
    shape: LockShape,
    key: &LockKey,
) -> Result<(), String> {
    ensure!(
        holders.len() == want.tokens.len() && holders.iter().all(|h| h.kind == want.kind),
        "list_shared({shape}) shows {key} with {holders:?}, held by {} of {}",
        want.tokens.len(),
        want.kind
    );
    let mut listed: Vec<_> = holders.iter().filter_map(|h| h.token).collect();
    if listed.len() == holders.len() {
        listed.sort();
        let mut granted = want.tokens.clone();
        granted.sort();
        ensure!(
            listed == granted,
            "list_shared({shape}) shows tokens {listed:?} for {key}, granted {granted:?}"
        );
    }
    Ok(())
}

/// `list_shared` (the [`Listing`](lock_core::Listing) facet) pages through
/// exactly the read-write locks, or exactly the semaphores, held under a
/// prefix (each once, with every holder and its token; not the other
/// shapes' keys, not released ones), and `list_elections` exactly the
/// elections with a leader under a prefix, each with its term. Each shape
/// the capabilities claim is listed; `Unsupported` for one of them fails.
pub async fn list_finds_shared_locks(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    if b.facets().listing.is_none() {
        return Ok(without_facet("Listing", "list_shared, list_elections"));
    }
    let caps = b.capabilities();
    let ttl = h.ttl_for(&a.capabilities()).max(Duration::from_secs(5));
    let prefix = format!("{}/", h.key("lists").as_str());
    let key = |name: &str| LockKey::new(format!("{prefix}{name}")).map_err(|e| e.to_string());
    let mut held = Vec::new();
    let mut report = Vec::new();

    // A mutex under the prefix: no other shape lists it.
    held.push((a.clone(), take_free(&*a, &key("m")?, ttl).await?));

    let mut rw = HashMap::new();
    if let Some(r1) = take_kind(&*a, &key("r")?, LeaseKind::Read, ttl).await? {
        let r2 = take_kind(&*b, &key("r")?, LeaseKind::Read, ttl)
            .await?
            .ok_or("a second reader refused")?;
        let w = take_kind(&*a, &key("w")?, LeaseKind::Write, ttl)
            .await?
            .ok_or("a writer refused")?;
        let gone = take_kind(&*a, &key("gone")?, LeaseKind::Write, ttl)
            .await?
            .ok_or("a writer refused")?;
        release_all(&*a, &[gone]).await?;
        let outside = LockKey::new(format!("{}x", prefix.trim_end_matches('/')))
            .map_err(|e| e.to_string())?;
        let outside = take_kind(&*a, &outside, LeaseKind::Write, ttl)
            .await?
            .ok_or("a writer refused")?;
        rw.insert(
            key("r")?,
            Expected {
                kind: LeaseKind::Read,
                tokens: vec![r1.token(), r2.token()],
            },
        );
        rw.insert(
            key("w")?,
            Expected {
                kind: LeaseKind::Write,
                tokens: vec![w.token()],
            },
        );
        held.extend([
            (a.clone(), r1),
            (b.clone(), r2),
            (a.clone(), w),
            (a.clone(), outside),
        ]);
    }

    let mut sem = HashMap::new();
    let permit = LeaseKind::permits(1, 3).map_err(|e| e.to_string())?;
    if let Some(p1) = take_kind(&*a, &key("s")?, permit, ttl).await? {
        let p2 = take_kind(&*b, &key("s")?, permit, ttl)
            .await?
            .ok_or("a second permit refused")?;
        sem.insert(
            key("s")?,
            Expected {
                kind: permit,
                tokens: vec![p1.token(), p2.token()],
            },
        );
        held.extend([(a.clone(), p1), (b.clone(), p2)]);
    }

    let outcome = async {
        for (shape, expected) in [(LockShape::ReadWrite, &rw), (LockShape::Semaphore, &sem)] {
            if expected.is_empty() {
                report.push(format!("no {shape} locks"));
                continue;
            }
            let pages = check_shared_listing(&*b, shape, &prefix, expected).await?;
            report.push(format!("{shape}: {} keys, {pages} page(s)", expected.len()));
        }
        let elections = check_election_listing(&*a, &*b, &prefix, ttl).await?;
        report.push(elections);
        Ok::<_, String>(())
    }
    .await;
    for (backend, lease) in &held {
        let _ = backend.release(lease).await;
    }
    outcome?;
    let bad = b
        .list_shared(LockShape::ReadWrite, &ListQuery::new(&prefix, 0))
        .await;
    // `Unsupported` only where read-write locks are not claimed (a shape
    // the backend lacks); otherwise the bad page size is the error.
    ensure!(
        matches!(&bad, Err(e) if e.kind() == ErrorKind::InvalidArgument
            || (e.kind() == ErrorKind::Unsupported && !caps.shared_locks)),
        "a page of 0 locks was not refused: {bad:?}"
    );
    Ok(Outcome::Passed(report.join("; ")))
}

/// Two elections led under `prefix` (and one resigned) must be listed
/// exactly, each with its term.
async fn check_election_listing(
    a: &dyn LockBackend,
    b: &dyn LockBackend,
    prefix: &str,
    ttl: Duration,
) -> Result<String, String> {
    let deadline = || tokio::time::Instant::now() + ttl;
    let name = |n: &str| LockKey::new(format!("{prefix}{n}")).map_err(|e| e.to_string());
    let e1 = a
        .campaign(&name("e1")?, ttl, deadline())
        .await
        .map_err(fmt_err("campaign"))?;
    let e2 = b
        .campaign(&name("e2")?, ttl, deadline())
        .await
        .map_err(fmt_err("campaign"))?;
    let resigned = a
        .campaign(&name("e3")?, ttl, deadline())
        .await
        .map_err(fmt_err("campaign"))?;
    let result = async {
        ensure!(
            a.release(&resigned).await.map_err(fmt_err("resign"))?,
            "resignation said not leading"
        );
        let terms: HashMap<LockKey, Option<lock_core::FencingToken>> = [
            (name("e1")?, Some(e1.token())),
            (name("e2")?, Some(e2.token())),
        ]
        .into();
        let mut seen = HashSet::new();
        let mut cursor: Option<String> = None;
        let mut pages = 0;
        loop {
            pages += 1;
            ensure!(pages <= 50, "list_elections did not finish within 50 pages");
            let page = served(
                b.list_elections(&ListQuery::new(prefix, 1).after(cursor.as_deref()))
                    .await,
                "Listing",
                "list_elections",
            )?;
            for info in page.elections {
                let term = terms.get(&info.election).ok_or_else(|| {
                    format!(
                        "list_elections returned {}, which has no leader",
                        info.election
                    )
                })?;
                if let Some(listed) = info.leader.term {
                    ensure!(
                        Some(listed) == *term,
                        "list_elections shows term {listed} for {}, won with {term:?}",
                        info.election
                    );
                }
                ensure!(
                    seen.insert(info.election.clone()),
                    "list_elections returned {} twice",
                    info.election
                );
            }
            match page.cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        ensure!(
            seen.len() == terms.len(),
            "list_elections found {} of the {} led elections",
            seen.len(),
            terms.len()
        );
        Ok(format!("elections: 2 leaders, {pages} page(s)"))
    }
    .await;
    let _ = a.release(&e1).await;
    let _ = b.release(&e2).await;
    result
}
