//! The hand-written permit floor ([`ZkPermitFloor`]) against a real
//! ZooKeeper server: its permits count against the driver's on the same
//! semaphore (and the driver's against its), limits must agree, and a
//! cycle costs the 5 round trips it declares, counted by a fault proxy
//! (the driver's own permit cycle is counted beside it: one more, its
//! early look at the limit before the mutex).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use conformance::OrSkip;
use conformance::floor::RawFloor;
use conformance::proxy::{CyclePlan, FaultProxy};
use conformance::servers::zookeeper::ZkServer;
use lock_bench::zk::ZkPermitFloor;
use lock_core::{ErrorKind, LeaseKind, LockBackend, LockBackendExt, LockKey};

const TTL: Duration = Duration::from_secs(30);

/// Sets `TCP_NODELAY` on this process's TCP sockets connected to `peer`:
/// the driver's count is of its requests, and the `zookeeper-client`
/// crate's socket keeps Nagle's algorithm on, which may hold a request made
/// together with an earlier one until that one is answered (see lock-zk's
/// `tests/round_trips.rs`).
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
const CYCLES: u64 = 50;

fn permits(count: u32, limit: u32) -> LeaseKind {
    LeaseKind::permits(count, limit).expect("permits")
}

/// Round trips per cycle over `CYCLES` cycles, the idle background
/// (pings over as long a stretch) subtracted.
async fn per_cycle(proxy: &FaultProxy, cycle: impl AsyncFnMut()) -> f64 {
    let plan = CyclePlan::new(3, CYCLES).with_idle();
    proxy.count_cycles(plan, cycle).await.per_cycle()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_floor_counts_with_the_driver_and_costs_what_it_declares() {
    let Some(server) = ZkServer::start().await.or_skip() else {
        return;
    };
    let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, server.node().client_port()));
    let url = |port: u16| format!("zk://127.0.0.1:{port}/pf?session_timeout=4s&timeout=3s");
    let direct = url(server.node().client_port());
    let floor = ZkPermitFloor::connect(&direct, 2).await.expect("floor");
    assert_eq!(floor.limit(), 2);
    let backend = lock_zk::connect(&direct).await.expect("backend");
    let key = LockKey::new("sem-floor").unwrap();

    // The driver holds 2 of 2: the floor gets nothing.
    let both = backend
        .try_acquire_kind(&key, permits(2, 2), TTL)
        .await
        .unwrap()
        .expect("2 of 2");
    assert!(floor.try_grant("sem-floor", TTL).await.unwrap().is_none());
    assert!(backend.release(&both).await.unwrap());
    // The driver holds 1: the floor gets the other, and the driver none.
    let one = backend
        .try_acquire_kind(&key, permits(1, 2), TTL)
        .await
        .unwrap()
        .expect("1 of 2");
    let grant = floor
        .try_grant("sem-floor", TTL)
        .await
        .unwrap()
        .expect("the floor's permit");
    assert!(grant.token > one.token().get());
    assert!(
        backend
            .try_acquire_kind(&key, permits(1, 2), TTL)
            .await
            .unwrap()
            .is_none(),
        "a third permit of 2 beside the floor's"
    );
    assert!(floor.release(&grant).await.unwrap());
    assert!(!floor.release(&grant).await.unwrap(), "released twice");
    let again = backend
        .try_acquire_kind(&key, permits(1, 2), TTL)
        .await
        .unwrap()
        .expect("the floor's permit came back");
    // Another limit while in use is refused, by both.
    let other = ZkPermitFloor::connect(&direct, 3).await.expect("floor");
    let err = other.try_grant("sem-floor", TTL).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    backend.release(&one).await.unwrap();
    backend.release(&again).await.unwrap();
    assert_eq!(
        ZkPermitFloor::connect(&direct, 0).await.unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );

    // Round trips, one proxy per client.
    let floor_proxy = FaultProxy::start(upstream).await.unwrap();
    let floor = ZkPermitFloor::connect(&url(floor_proxy.port()), 4)
        .await
        .expect("floor");
    let declared = floor.round_trips_per_cycle();
    let per = per_cycle(&floor_proxy, || async {
        floor.cycle("rt", TTL).await.expect("floor cycle");
    })
    .await;
    println!("permit floor: {per:.2} round trips per cycle (declares {declared})");
    assert!((per - f64::from(declared)).abs() < 0.5, "{per}");

    let ours_proxy = FaultProxy::start(upstream).await.unwrap();
    let ours = lock_zk::connect(&url(ours_proxy.port())).await.unwrap();
    assert_eq!(nodelay_to(ours_proxy.addr()), 1, "one connection");
    let k = LockKey::new("rt-ours").unwrap();
    let per = per_cycle(&ours_proxy, || async {
        let lease = ours
            .try_acquire_kind(&k, permits(1, 4), TTL)
            .await
            .unwrap()
            .expect("free");
        assert!(ours.release(&lease).await.unwrap());
    })
    .await;
    println!("driver try_acquire_kind(1 of 4) + release: {per:.2} round trips per cycle");
    assert!((per - f64::from(declared + 1)).abs() < 0.5, "{per}");
}
