//! The shared-kind checks of `tests/shared.rs`: recorded holdings, the
//! exclusion and limit checks over them, and the contenders (ours, or a
//! broken double writing the recipe's nodes) that produce them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{Lease, LeaseKind, LockBackend, LockBackendExt, LockKey, OwnerId};
use lock_zk::ZkBackend;
use tokio::time::{Instant, sleep};
use zookeeper_client as zk;

use crate::common::Standalone;
use crate::{TTL, permits, soon};

/// What one recorded holding was.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Held {
    Read,
    Write,
    Permits(u32),
}

/// One holding as its holder saw it: from just after the grant to just
/// before the release (inside the real holding, so a correct lock never
/// shows an overlap).
#[derive(Clone, Debug)]
pub(crate) struct Interval {
    pub(crate) held: Held,
    pub(crate) from: Instant,
    pub(crate) to: Instant,
    pub(crate) who: String,
}

pub(crate) type History = Arc<Mutex<Vec<Interval>>>;

pub(crate) fn record(history: &History, held: Held, from: Instant, who: &str) {
    history.lock().unwrap().push(Interval {
        held,
        from,
        to: Instant::now(),
        who: who.to_owned(),
    });
}

/// Every pair where a writer overlaps anyone else.
pub(crate) fn rw_violations(history: &[Interval]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, a) in history.iter().enumerate() {
        for b in &history[i + 1..] {
            let overlap = a.from < b.to && b.from < a.to;
            if overlap && (a.held == Held::Write || b.held == Held::Write) {
                out.push(format!(
                    "{:?} by {} overlaps {:?} by {}",
                    a.held, a.who, b.held, b.who
                ));
            }
        }
    }
    out
}

/// The most permits held at one instant, and the most readers.
pub(crate) fn peaks(history: &[Interval]) -> (u32, usize) {
    let mut events: Vec<(Instant, i64, i64)> = Vec::new();
    for i in history {
        let (p, r) = match i.held {
            Held::Permits(n) => (i64::from(n), 0),
            Held::Read => (0, 1),
            Held::Write => (0, 0),
        };
        events.push((i.from, p, r));
        events.push((i.to, -p, -r));
    }
    // Ends before starts at the same instant.
    events.sort_by(|a, b| a.0.cmp(&b.0).then((a.1 + a.2).cmp(&(b.1 + b.2))));
    let (mut permits, mut readers, mut max_p, mut max_r) = (0i64, 0i64, 0i64, 0i64);
    for (_, p, r) in events {
        permits += p;
        readers += r;
        max_p = max_p.max(permits);
        max_r = max_r.max(readers);
    }
    (
        u32::try_from(max_p).unwrap_or(u32::MAX),
        usize::try_from(max_r).unwrap_or(usize::MAX),
    )
}

/// A contender: our backend, or a broken double writing the recipe's
/// nodes with a raw client and ignoring what it should wait for.
#[derive(Clone)]
pub(crate) enum Actor {
    Ours(ZkBackend),
    /// Creates a read node and holds at once, writers or not.
    BrokenReader(zk::Client),
    /// Creates a lease node (no mutex, no count) and holds at once.
    BrokenPermit(zk::Client),
}

pub(crate) async fn broken_node(raw: &zk::Client, dir: &str, name: &str) -> String {
    let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let uuid = OwnerId::random().to_uuid();
    let prefix = format!("{dir}/_c_{uuid}-{name}");
    let (_, seq) = raw
        .create(&prefix, &[], &options)
        .await
        .expect("broken create");
    format!("{prefix}{seq}")
}

/// Holds `b`'s `lease` for `hold`, records it as `held` by `who`, and
/// releases it.
async fn hold_ours(
    b: &ZkBackend,
    lease: &Lease,
    hold: Duration,
    history: &History,
    held: Held,
    who: &str,
) {
    let from = Instant::now();
    sleep(hold).await;
    record(history, held, from, who);
    assert!(b.release(lease).await.expect("release"));
}

/// A broken node `name` in `dir`, held for `hold` and recorded as `held`
/// by `who (broken)`, then deleted.
async fn hold_broken(
    raw: &zk::Client,
    dir: &str,
    name: &str,
    hold: Duration,
    history: &History,
    held: Held,
    who: &str,
) {
    let path = broken_node(raw, dir, name).await;
    let from = Instant::now();
    sleep(hold).await;
    record(history, held, from, &format!("{who} (broken)"));
    raw.delete(&path, None).await.expect("broken delete");
}

/// `rounds` turns of `actor` on `k`: readers and writers (every third turn
/// of an even-numbered actor writes), each holding a few milliseconds.
pub(crate) async fn rw_turns(
    actor: Actor,
    k: LockKey,
    dir: String,
    n: usize,
    rounds: usize,
    history: History,
) {
    let who = format!("actor {n}");
    for round in 0..rounds {
        let write = n.is_multiple_of(2) && round.is_multiple_of(3);
        let hold = Duration::from_millis(3 + (n as u64 * 7 + round as u64 * 5) % 12);
        match &actor {
            Actor::Ours(b) => {
                let kind = if write {
                    LeaseKind::Write
                } else {
                    LeaseKind::Read
                };
                let lease = b
                    .acquire_kind(&k, kind, TTL, soon(20_000))
                    .await
                    .expect("acquire under contention");
                let held = if write { Held::Write } else { Held::Read };
                hold_ours(b, &lease, hold, &history, held, &who).await;
            }
            Actor::BrokenReader(raw) => {
                hold_broken(raw, &dir, "__READ__", hold * 3, &history, Held::Read, &who).await;
            }
            Actor::BrokenPermit(_) => unreachable!(),
        }
    }
}

/// Every actor's `rw_turns` at once: the holdings they recorded.
pub(crate) async fn rw_contention(
    actors: Vec<Actor>,
    k: &LockKey,
    dir: &str,
    rounds: usize,
) -> Vec<Interval> {
    contention(actors, |n, actor, history| {
        rw_turns(actor, k.clone(), dir.to_owned(), n, rounds, history)
    })
    .await
}

/// Runs `turns` of each actor (its number, itself, the shared history) in
/// a task of its own; the history once all are done.
async fn contention<F, T>(actors: Vec<Actor>, turns: F) -> Vec<Interval>
where
    F: Fn(usize, Actor, History) -> T,
    T: Future<Output = ()> + Send + 'static,
{
    let history: History = Arc::default();
    let tasks: Vec<_> = actors
        .into_iter()
        .enumerate()
        .map(|(n, actor)| tokio::spawn(turns(n, actor, history.clone())))
        .collect();
    for task in tasks {
        task.await.expect("contender");
    }
    history.lock().unwrap().clone()
}

/// A standalone server and `n` backends on it, or `None` (skip) when
/// ZooKeeper is missing.
pub(crate) async fn started(n: usize) -> Option<(Standalone, Vec<ZkBackend>)> {
    let target = Standalone::start().await?;
    let bs = target.backends(n).await;
    Some((target, bs))
}

/// One holding of ours (`ours`, granted just before the call) with a
/// broken node `name` created in `dir` beside it and held 10 ms (`broken`,
/// by a broken `who`), then deleted: the two holdings.
pub(crate) async fn beside_broken(
    raw: &zk::Client,
    dir: &str,
    name: &str,
    ours: Held,
    broken: Held,
    who: &str,
) -> Vec<Interval> {
    let from = Instant::now();
    let node = broken_node(raw, dir, name).await;
    let b_from = Instant::now();
    sleep(Duration::from_millis(10)).await;
    let history: History = Arc::default();
    record(&history, broken, b_from, &format!("broken {who}"));
    raw.delete(&node, None).await.unwrap();
    record(&history, ours, from, "ours");
    history.lock().unwrap().clone()
}

/// `rounds` permit requests of `actor` (1 or 2 of `limit`).
pub(crate) async fn permit_turns(
    actor: Actor,
    k: LockKey,
    dir: String,
    n: usize,
    limit: u32,
    rounds: usize,
    history: History,
) {
    let who = format!("actor {n}");
    for round in 0..rounds {
        let count = if (n + round).is_multiple_of(3) { 2 } else { 1 };
        let hold = Duration::from_millis(3 + (n as u64 * 5 + round as u64 * 3) % 10);
        match &actor {
            Actor::Ours(b) => {
                let lease = b
                    .acquire_kind(&k, permits(count, limit), TTL, soon(20_000))
                    .await
                    .expect("permits under contention");
                hold_ours(b, &lease, hold, &history, Held::Permits(count), &who).await;
            }
            Actor::BrokenPermit(raw) => {
                let leases = format!("{dir}/leases");
                let held = Held::Permits(1);
                hold_broken(raw, &leases, "lease-", hold * 2, &history, held, &who).await;
            }
            Actor::BrokenReader(_) => unreachable!(),
        }
    }
}

/// Every actor's `permit_turns` at once: the holdings they recorded.
pub(crate) async fn permit_contention(
    actors: Vec<Actor>,
    k: &LockKey,
    dir: &str,
    limit: u32,
    rounds: usize,
) -> Vec<Interval> {
    contention(actors, |n, actor, history| {
        permit_turns(actor, k.clone(), dir.to_owned(), n, limit, rounds, history)
    })
    .await
}
