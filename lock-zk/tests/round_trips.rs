//! Round trips per acquire+release cycle, counted by the fault proxy
//! between the client and a real ZooKeeper server: our waiting acquire as
//! users write it and our `try_acquire` must each cost exactly the
//! hand-written floor's 2 (create with getChildren written behind it, then
//! delete; counted on the floor in `lock-bench`) on a free key, and so
//! must a campaign + resignation (Curator's latch nodes) on a free
//! election. A client that adds one request per cycle is counted one
//! higher and fails the same check (shown below with a backend that looks
//! at the key before acquiring).
//!
//! These counts are of the driver's requests, so the test sets
//! `TCP_NODELAY` on the `zookeeper-client` crate's socket itself (through
//! the proxy's address, [`nodelay_to`]): the crate writes each request as
//! its task takes it, with Nagle's algorithm on and no way to turn it off,
//! so a request made together with an earlier one may wait for the
//! earlier one's acknowledgement, which comes with its reply. On the
//! crate's own socket a cycle then costs 2 or 3, depending on whether the
//! crate's task wrote the create before the list was made (measured: 2.99
//! on an idle host, 2.03 on a loaded one); the last check below shows that
//! range. That round trip is the crate's (see `lock-bench`'s
//! `examples/zk_transport.rs` for its latency): the driver no longer
//! changes sockets it does not own.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::bench::{self, Contender};
use conformance::doubles::LooksFirst;
use conformance::proxy::{CycleCount, CyclePlan, FaultProxy};
use conformance::servers::zookeeper::ZkServer;
use lock_core::{LeaseKind, LockClient};

/// The hand-written floor's round trips per cycle (create with getChildren
/// written behind it, then delete), which `lock-bench`'s
/// `tests/zk_round_trips.rs` counts on the floor itself.
const FLOOR_ROUND_TRIPS: u64 = 2;

/// What the client crate's socket may add to a cycle on top of the
/// floor's count (Nagle's algorithm, see the module docs).
const NAGLE: u64 = 1;

/// Sets `TCP_NODELAY` on this process's TCP sockets connected to `peer`
/// (the client crate's connection to a proxy); returns how many.
fn nodelay_to(peer: SocketAddr) -> usize {
    use std::os::fd::{FromRawFd, OwnedFd};

    let mut set = 0;
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: duplicates whatever the number names now (EBADF when
        // nothing); the duplicate is owned, and closed, here alone.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            continue;
        }
        // SAFETY: `dup` was just made and nothing else knows of it.
        let stream = std::net::TcpStream::from(unsafe { OwnedFd::from_raw_fd(dup) });
        if stream.peer_addr().is_ok_and(|p| p == peer) && stream.set_nodelay(true).is_ok() {
            set += 1;
        }
    }
    set
}

const CYCLES: u64 = 100;
const TTL: Duration = Duration::from_secs(30);

/// Runs a few warm-up cycles (sessions, key directories) and lets what
/// they deferred pass, then counts `CYCLES` cycles and `tail` (requests a
/// cycle defers, such as a cleanup at the lease's TTL, belong to it), then
/// an idle stretch of the same length (background traffic: pings).
async fn count(proxy: &FaultProxy, tail: Duration, cycle: impl AsyncFnMut()) -> CycleCount {
    let plan = CyclePlan::new(5, CYCLES).with_tail(tail).with_idle();
    proxy.count_cycles(plan, cycle).await
}

async fn waiting_cycle(client: &LockClient, key: &str) {
    bench::waiting_cycle(client, key, TTL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_costs_what_the_floor_costs() {
    let Some(server) = ZkServer::start().await.or_skip() else {
        return;
    };
    let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, server.node().client_port()));
    // One proxy per client, so that each count sees only its own
    // connection (and its own background pings). A short session: leases
    // are capped at it, so whatever a cycle defers to its lease's TTL
    // happens within the counted tail.
    let session = Duration::from_secs(2);
    let tail = session + Duration::from_millis(500);
    let url = |proxy: &FaultProxy| {
        format!(
            "zk://127.0.0.1:{}/rt?session_timeout={}ms&timeout=3s",
            proxy.port(),
            session.as_millis()
        )
    };

    let expected = FLOOR_ROUND_TRIPS;

    let ours_proxy = FaultProxy::start(upstream).await.unwrap();
    let client = LockClient::new(lock_zk::connect(&url(&ours_proxy)).await.unwrap());
    assert_eq!(nodelay_to(ours_proxy.addr()), 1, "one connection");
    let counted = count(&ours_proxy, tail, || waiting_cycle(&client, "wait")).await;
    println!(
        "lock(k).ttl(30s).wait(60s).acquire() + release(): {:.2} per cycle ({counted:?})",
        counted.per_cycle()
    );
    counted
        .check(expected)
        .expect("a waiting acquire on a free key costs the floor's round trips");

    let counted = count(&ours_proxy, tail, || bench::try_cycle(&client, "try", TTL)).await;
    println!(
        "try_acquire() + release(): {:.2} per cycle ({counted:?})",
        counted.per_cycle()
    );
    counted
        .check(expected)
        .expect("try_acquire + release costs the floor's round trips");

    // An election in Curator's latch layout costs the same on a free
    // election: create and list in one exchange, then delete.
    let counted = count(&ours_proxy, tail, || async {
        let leadership = client
            .elect("rt-elect")
            .ttl(TTL)
            .wait(bench::CONTENDED_LIMIT)
            .campaign()
            .await
            .expect("campaign on a free election");
        leadership.resign().await.expect("resign");
    })
    .await;
    println!(
        "elect(e).campaign() + resign(): {:.2} per cycle ({counted:?})",
        counted.per_cycle()
    );
    counted
        .check(expected)
        .expect("a campaign + resignation costs the mutex's round trips");
    // A read-write lock's grants: the node's create with the directory's
    // list and both epoch reads behind it (one round trip), a write grant
    // then storing its epoch (one more), and the release's delete.
    for (kind, expected_rw) in [(LeaseKind::Read, 2), (LeaseKind::Write, 3)] {
        let contender = bench::Ours::with_kind(client.clone(), TTL, kind);
        let key = format!("rt-{kind}");
        let counted = count(&ours_proxy, tail, || async {
            contender.cycle(&key).await.expect("a free read-write lock");
        })
        .await;
        println!(
            "{kind} lock + release: {:.2} per cycle ({counted:?})",
            counted.per_cycle()
        );
        counted
            .check(expected_rw)
            .unwrap_or_else(|e| panic!("a {kind} grant + release: {e}"));
    }
    assert_eq!(ours_proxy.connections(), 1, "one session, one connection");

    // The check can fail: one extra request per cycle is counted. And the
    // crate's own socket (Nagle's algorithm on). Each on its own proxy,
    // counted at the same time (only the run's length is shared).
    let broken_proxy = FaultProxy::start(upstream).await.unwrap();
    let broken = LockClient::from_arc(Arc::new(LooksFirst(Arc::new(
        lock_zk::ZkBackend::connect(lock_zk::ZkConfig::from_url(&url(&broken_proxy)).unwrap())
            .await
            .unwrap(),
    ))));
    assert_eq!(nodelay_to(broken_proxy.addr()), 1, "one connection");
    let plain_proxy = FaultProxy::start(upstream).await.unwrap();
    let plain = LockClient::new(lock_zk::connect(&url(&plain_proxy)).await.unwrap());
    let (broken_counted, counted) = tokio::join!(
        count(&broken_proxy, tail, || waiting_cycle(&broken, "broken")),
        count(&plain_proxy, tail, || waiting_cycle(&plain, "plain")),
    );
    println!(
        "broken (a look before each acquire): {:.2} per cycle ({broken_counted:?})",
        broken_counted.per_cycle()
    );
    assert!(
        broken_counted.check(expected).is_err(),
        "{broken_counted:?}"
    );
    broken_counted
        .check(expected + 1)
        .expect("one extra request per cycle is counted once");

    // The crate's own socket: between the floor's count and one more per
    // cycle, as the module docs say.
    println!(
        "on the crate's own socket: {:.2} per cycle ({counted:?})",
        counted.per_cycle()
    );
    assert!(
        counted.check(expected).is_ok() || counted.check(expected + NAGLE).is_ok(),
        "{counted:?}"
    );
}
