//! The etcd floors (`lock_bench::etcd`) on a real etcd: they issue the
//! driver's transactions on the driver's layout (`lock_etcd::keys`), so
//! they exclude and are excluded by the driver on the same name, never
//! steal a held key and leave no entry behind; and a floor cycle costs the
//! 2 requests it declares (the count the driver's own round-trip test,
//! `lock-etcd/tests/round_trips.rs`, holds the driver to).

use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::floor::RawFloor;
use conformance::proxy::FaultProxy;
use conformance::servers::etcd::EtcdServer;
use lock_bench::etcd::{EtcdFloor, EtcdPermitFloor};
use lock_core::{ErrorKind, Lease, LeaseKind, LockBackend, LockBackendExt, LockKey, OwnerId};
use lock_etcd::{EtcdBackend, EtcdConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn connect_for(server: &EtcdServer, prefix: &str, ttl: Duration) -> EtcdBackend {
    let config = EtcdConfig::new(server.endpoints())
        .prefix(prefix)
        .ttl(ttl)
        .op_timeout(Duration::from_secs(1));
    EtcdBackend::connect(config).await.expect("connect")
}

/// The entries under `prefix` on `b`'s server.
async fn raw_count(b: &EtcdBackend, prefix: impl Into<Vec<u8>>) -> i64 {
    let options = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    b.client()
        .kv_client()
        .get(prefix, Some(options))
        .await
        .expect("raw count")
        .count()
}

async fn granted(b: &dyn LockBackend, key: &LockKey, kind: LeaseKind, ttl: Duration) -> Lease {
    b.try_acquire_kind(key, kind, ttl)
        .await
        .unwrap()
        .expect("granted at once")
}

fn permits(count: u32, limit: u32) -> LeaseKind {
    LeaseKind::permits(count, limit).expect("permits")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn benchmark_floor_uses_the_driver_layout() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let ttl = Duration::from_secs(5);
    let floor = Arc::new(
        EtcdFloor::connect(&server.url("floor", "ttl=5s&timeout=1s"))
            .await
            .unwrap(),
    );
    let backend = connect_for(&server, "floor", ttl).await;
    let key = LockKey::new("k").unwrap();
    for _ in 0..3 {
        floor.cycle("k", ttl).await.unwrap();
    }
    let lease = granted(&backend, &key, LeaseKind::Exclusive, ttl).await;
    let err = floor.cycle("k", ttl).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended, "{err}");
    // The refused floor cycle removed its queued entry; ours still holds.
    assert_eq!(raw_count(&backend, "floor/k/").await, 1);
    assert_eq!(
        backend.inspect(&key).await.unwrap().unwrap().token,
        Some(lease.token())
    );
    assert!(backend.release(&lease).await.unwrap());
    // Parallel cycles on distinct keys, as the benchmarks run them.
    conformance::bench::floor_cycles_in_parallel(floor.clone(), ttl, 8, 20)
        .await
        .unwrap();
    let left = raw_count(&backend, "floor/").await;
    assert_eq!(left, 0, "the floor left entries behind");
    // Bad inputs are typed errors.
    conformance::bench::assert_floor_refuses_bad_input(&*floor, ttl, Duration::from_millis(10))
        .await;
    let err = EtcdFloor::connect("etcd://").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}

/// The permit floor takes permits of the driver's semaphores (same layout,
/// same limit rule) and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_floor_uses_the_driver_layout() {
    const PREFIX: &str = "shared";
    let ttl = Duration::from_secs(2);
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let real = connect_for(&server, PREFIX, ttl).await;
    let floor = EtcdPermitFloor::from_backend(&real, 1, 2)
        .await
        .expect("floor");
    assert_eq!(floor.round_trips_per_cycle(), 2);
    let k = LockKey::new(format!("floor-{}", &OwnerId::random().to_hex()[..8])).unwrap();
    let sem_entries = || raw_count(&real, format!("{PREFIX}/{}%sem/", k.as_str()));
    for _ in 0..3 {
        floor.cycle(k.as_str(), ttl).await.expect("cycle");
    }
    let held = granted(&real, &k, permits(2, 2), ttl).await;
    assert!(
        floor.try_grant(k.as_str(), ttl).await.unwrap().is_none(),
        "the floor overfilled"
    );
    assert!(real.release(&held).await.unwrap());
    let one = granted(&real, &k, permits(1, 2), ttl).await;
    let grant = floor
        .try_grant(k.as_str(), ttl)
        .await
        .unwrap()
        .expect("the floor's permit");
    assert!(grant.token > one.token().get());
    assert!(
        real.try_acquire_kind(&k, permits(1, 2), ttl)
            .await
            .unwrap()
            .is_none(),
        "3 of 2"
    );
    assert!(floor.release(&grant).await.unwrap());
    assert!(real.release(&one).await.unwrap());
    let wrong = granted(&real, &k, permits(1, 3), ttl).await;
    let refused = floor.try_grant(k.as_str(), ttl).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidArgument);
    assert!(real.release(&wrong).await.unwrap());
    assert_eq!(sem_entries().await, 0);
    // The hooks' permit floor: one permit of 4.
    let url = server.url(PREFIX, "ttl=2s&timeout=1s");
    let hooks = lock_bench::for_driver("etcd");
    let described = (hooks.permit_floor.expect("permit floor"))(&url)
        .await
        .expect("connect")
        .expect("a floor");
    let three = granted(&real, &k, permits(3, 4), ttl).await;
    described
        .cycle(k.as_str(), ttl)
        .await
        .expect("the 4th permit");
    assert!(real.release(&three).await.unwrap());
    assert!(hooks.floor.is_some(), "the etcd mutex floor is a hook");
}

/// The sum of the server's `grpc_server_msg_received_total` counters.
async fn requests_received(endpoint: &str) -> u64 {
    let mut stream = TcpStream::connect(endpoint).await.expect("metrics");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n")
        .await
        .expect("metrics request");
    let mut body = String::new();
    stream
        .read_to_string(&mut body)
        .await
        .expect("metrics answer");
    body.lines()
        .filter(|line| line.starts_with("grpc_server_msg_received_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|value| {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let value = value as u64;
            value
        })
        .sum()
}

/// A floor cycle costs the requests it declares (the server's own counters,
/// with the background traffic of an idle stretch as long subtracted), over
/// one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_cycle_costs_what_it_declares() {
    const CYCLES: u32 = 200;
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let endpoint = server.endpoints()[0].clone();
    let proxy = FaultProxy::start(endpoint.parse().unwrap()).await.unwrap();
    let url = format!("etcd://127.0.0.1:{}/rt?ttl=30s", proxy.port());
    let floor = EtcdFloor::connect(&url).await.unwrap();
    let ttl = Duration::from_secs(30);
    assert_eq!(floor.round_trips_per_cycle(), 2);
    for _ in 0..5 {
        floor.cycle("floor", ttl).await.unwrap();
    }
    let before = requests_received(&endpoint).await;
    let started = tokio::time::Instant::now();
    for _ in 0..CYCLES {
        floor.cycle("floor", ttl).await.unwrap();
    }
    let took = started.elapsed();
    let after = requests_received(&endpoint).await;
    tokio::time::sleep(took).await;
    let idle = requests_received(&endpoint).await - after;
    #[allow(clippy::cast_precision_loss)]
    let per_cycle = (after - before).saturating_sub(idle) as f64 / f64::from(CYCLES);
    println!("floor: {per_cycle:.2} requests per cycle");
    assert!(
        (per_cycle - f64::from(floor.round_trips_per_cycle())).abs() < 0.5,
        "{per_cycle:.2} requests per cycle"
    );
    assert_eq!(proxy.connections(), 1, "the floor has one connection");
}
