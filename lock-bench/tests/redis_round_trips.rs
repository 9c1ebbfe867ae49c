//! Round trips per acquire+release cycle, counted by the fault proxy
//! (request/response turns on every connection through it, so the pub/sub
//! connection's turns count too), for our user API and for the hand-written
//! floors, on one server and on Redlock. An extra round trip per cycle
//! fails these tests: `an_extra_round_trip_is_caught` shows the count
//! seeing one. (Before the waiting acquire was fixed, it subscribed before
//! its first try and unsubscribed after: 4 round trips per waiting cycle
//! on a free key, which `waiting_acquire_costs_what_the_floor_costs`
//! refuses.) Fair mode costs the same on a free key; `lock_all` of free
//! keys is one round trip (one script), where the one-key-at-a-time path
//! costs one per key.

use std::net::SocketAddr;
use std::time::Duration;

use conformance::OrSkip;
use conformance::bench;
use conformance::floor::RawFloor;
use conformance::proxy::{CycleCount, CyclePlan, FaultProxy, count_cycles};
use conformance::servers::redis::RedisServer;
use lock_bench::redis::{RedisFloor, RedlockFloor};
use lock_core::{LockClient, LockError, LockGuard, LockKey};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep};

const CYCLES: u64 = 50;
const WARM_UP: usize = 5;
const TTL: Duration = Duration::from_secs(30);

/// A waiting acquire of `c` by `waiter` (for at most 8 s) on a task of
/// its own: its outcome and when it ended.
fn spawn_waiter(
    waiter: &LockClient,
) -> tokio::task::JoinHandle<(Result<LockGuard, LockError>, Instant)> {
    let waiter = waiter.clone();
    tokio::spawn(async move {
        let guard = waiter
            .lock("c")
            .ttl(TTL)
            .wait(Duration::from_secs(8))
            .acquire()
            .await;
        (guard, Instant::now())
    })
}

fn server_addr(server: &RedisServer) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], server.port()))
}

/// Round trips per cycle on each of `proxies` (rounded to the nearest
/// whole number), over `CYCLES` cycles after a warm-up.
async fn per_cycle(proxies: &[&FaultProxy], cycle: impl AsyncFnMut()) -> Vec<u64> {
    count_cycles(proxies, CyclePlan::new(WARM_UP, CYCLES), cycle)
        .await
        .iter()
        .map(CycleCount::rounded)
        .collect()
}

async fn waiting_cycle(client: &LockClient, key: &str) {
    bench::waiting_cycle(client, key, TTL).await;
}

async fn try_cycle(client: &LockClient, key: &str) {
    bench::try_cycle(client, key, TTL).await;
}

async fn floor_cycle(floor: &dyn RawFloor, key: &str) {
    floor.cycle(key, TTL).await.expect("floor cycle");
}

/// A bare connection that sends one `PING` per call: the "one extra round
/// trip" a worse cycle would make.
struct Pinger(TcpStream);

impl Pinger {
    async fn connect(proxy: &FaultProxy) -> Self {
        let stream = TcpStream::connect(proxy.addr()).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Self(stream)
    }

    async fn ping(&mut self) {
        self.0
            .write_all(b"*1\r\n$4\r\nPING\r\n")
            .await
            .expect("send");
        let mut reply = [0u8; 7];
        self.0.read_exact(&mut reply).await.expect("PONG");
        assert_eq!(&reply, b"+PONG\r\n");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_acquire_costs_what_the_floor_costs() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let ours_proxy = FaultProxy::start(server_addr(&server)).await.unwrap();
    let floor_proxy = FaultProxy::start(server_addr(&server)).await.unwrap();
    let backend = lock_redis::connect(&format!("redis://127.0.0.1:{}", ours_proxy.port()))
        .await
        .unwrap();
    let client = LockClient::new(backend);
    let floor = RedisFloor::connect(&format!("redis://127.0.0.1:{}", floor_proxy.port()))
        .await
        .unwrap();
    assert_eq!(floor.round_trips_per_cycle(), 2);

    let floor_rt = per_cycle(&[&floor_proxy], async || floor_cycle(&floor, "f").await).await;
    assert_eq!(
        floor_rt,
        [u64::from(floor.round_trips_per_cycle())],
        "floor"
    );

    let waiting = per_cycle(&[&ours_proxy], async || waiting_cycle(&client, "w").await).await;
    assert_eq!(
        waiting, floor_rt,
        "a waiting acquire + release on a free key must cost what the floor's cycle costs"
    );
    // The notification machinery was never touched: no pub/sub connection.
    assert_eq!(
        ours_proxy.connections(),
        lanes(),
        "only the data connections"
    );

    let trying = per_cycle(&[&ours_proxy], async || try_cycle(&client, "t").await).await;
    assert_eq!(trying, floor_rt, "try_acquire + release");
}

/// The count sees one extra request per cycle: the floor's cycle plus a
/// `PING` through the same proxy counts 3, and fails the equality the
/// tests above assert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extra_round_trip_is_caught() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let proxy = FaultProxy::start(server_addr(&server)).await.unwrap();
    let floor = RedisFloor::connect(&format!("redis://127.0.0.1:{}", proxy.port()))
        .await
        .unwrap();
    let mut pinger = Pinger::connect(&proxy).await;
    let worse = per_cycle(&[&proxy], async || {
        floor_cycle(&floor, "x").await;
        pinger.ping().await;
    })
    .await;
    assert_eq!(worse, [3]);
    assert_ne!(worse, [u64::from(floor.round_trips_per_cycle())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_costs_two_round_trips_per_node_like_its_floor() {
    let Some(servers) = RedisServer::start_many(3).await.or_skip() else {
        return;
    };
    let mut ours_proxies = Vec::new();
    let mut floor_proxies = Vec::new();
    for server in &servers {
        ours_proxies.push(FaultProxy::start(server_addr(server)).await.unwrap());
        floor_proxies.push(FaultProxy::start(server_addr(server)).await.unwrap());
    }
    let url = |proxies: &[FaultProxy]| {
        let hosts: Vec<String> = proxies
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port()))
            .collect();
        format!("redlock://{}", hosts.join(","))
    };
    let client = LockClient::new(lock_redis::connect(&url(&ours_proxies)).await.unwrap());
    let floor = RedlockFloor::connect(&url(&floor_proxies)).await.unwrap();
    assert_eq!(floor.round_trips_per_cycle(), 6);
    let ours_proxies: Vec<&FaultProxy> = ours_proxies.iter().collect();
    let floor_proxies: Vec<&FaultProxy> = floor_proxies.iter().collect();

    let floor_rt = per_cycle(&floor_proxies, async || floor_cycle(&floor, "f").await).await;
    assert_eq!(floor_rt, [2, 2, 2], "floor, per node");
    assert_eq!(
        floor_rt.iter().sum::<u64>(),
        u64::from(floor.round_trips_per_cycle())
    );
    let waiting = per_cycle(&ours_proxies, async || waiting_cycle(&client, "w").await).await;
    assert_eq!(waiting, floor_rt, "waiting acquire + release, per node");
    let trying = per_cycle(&ours_proxies, async || try_cycle(&client, "t").await).await;
    assert_eq!(trying, floor_rt, "try_acquire + release, per node");
    // A Redlock node keeps one data connection by default.
    for proxy in &ours_proxies {
        assert_eq!(proxy.connections(), 1, "no pub/sub connection on free keys");
    }
}

/// The data connections the driver opens to each server (its default
/// `connections`, all opened at connect).
fn lanes() -> u64 {
    u64::try_from(lock_redis::DEFAULT_CONNECTIONS).expect("a few connections")
}

/// Subscribers of `channel` on the server, asked on a bare connection.
async fn subscribers(server: &RedisServer, channel: &str) -> i64 {
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut conn)
        .await
        .unwrap();
    counts.first().map_or(0, |(_, n)| *n)
}

/// A waiter on a held key is woken by the release notification (the
/// re-check interval is 10 s, so a grant within a second is the
/// notification), and a release that lands between the waiter's first
/// try and its subscription is not missed: the waiter tries again once
/// subscribed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_waiting_acquire_is_notified_and_retries_after_subscribing() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let url = format!("{}?recheck=10s", server.url());
    let holder = LockClient::new(lock_redis::connect(&url).await.unwrap());
    let proxy = FaultProxy::start(server_addr(&server)).await.unwrap();
    let waiter_backend =
        lock_redis::connect(&format!("redis://127.0.0.1:{}?recheck=10s", proxy.port()))
            .await
            .unwrap();
    let channel = format!(
        "{}:released",
        waiter_backend.redis_key(&LockKey::new("c").unwrap())
    );
    let waiter = LockClient::new(waiter_backend);

    // 1. Notified: the waiter subscribes, the holder releases.
    let held = holder.lock("c").ttl(TTL).acquire().await.unwrap();
    let task = spawn_waiter(&waiter);
    let until = Instant::now() + Duration::from_secs(5);
    while subscribers(&server, &channel).await == 0 {
        assert!(Instant::now() < until, "the waiter never subscribed");
        sleep(Duration::from_millis(10)).await;
    }
    let released_at = Instant::now();
    assert!(held.release().await.unwrap());
    let (guard, granted_at) = task.await.unwrap();
    let guard = guard.expect("the waiter is granted after the release");
    assert!(
        granted_at - released_at < Duration::from_secs(1),
        "granted {:?} after the release: not woken by the notification",
        granted_at - released_at
    );
    assert!(guard.release().await.unwrap());
    // Once the waiter is done, it unsubscribes.
    let until = Instant::now() + Duration::from_secs(5);
    while subscribers(&server, &channel).await != 0 {
        assert!(Instant::now() < until, "the waiter never unsubscribed");
        sleep(Duration::from_millis(10)).await;
    }

    // 2. The release lands after the waiter's first try reached the server
    //    and before its subscription: 300 ms each way on the waiter's link
    //    leaves that window wide open. No notification will come (it was
    //    published before the subscription); only the re-try after
    //    subscribing gets the lock before the 10 s re-check (and the 8 s
    //    deadline).
    let held = holder.lock("c").ttl(TTL).acquire().await.unwrap();
    proxy.set_latency(Duration::from_millis(300), Duration::ZERO);
    proxy.reset_counters();
    let started = Instant::now();
    let task = spawn_waiter(&waiter);
    let until = Instant::now() + Duration::from_secs(5);
    while proxy.bytes().0 == 0 {
        assert!(
            Instant::now() < until,
            "the waiter's first try never went out"
        );
        sleep(Duration::from_millis(5)).await;
    }
    // The first try is at the server (forwarded after its delay); its
    // "held" answer is on its way back.
    sleep(Duration::from_millis(50)).await;
    assert_eq!(
        subscribers(&server, &channel).await,
        0,
        "the waiter subscribed before its first try"
    );
    assert!(held.release().await.unwrap());
    let (guard, granted_at) = task.await.unwrap();
    let guard = guard.expect("the re-try after subscribing is granted");
    assert!(
        granted_at - started < Duration::from_secs(6),
        "granted after {:?}",
        granted_at - started
    );
    proxy.set_latency(Duration::ZERO, Duration::ZERO);
    assert!(guard.release().await.unwrap());
}

/// Fair mode on a free key with an empty queue costs what the unfair
/// mutex costs: one script call for a try or a waiting acquire (the queue
/// is only touched once the key is contended), one for the release; no
/// pub/sub connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_costs_what_the_floor_costs_on_a_free_key() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let proxy = FaultProxy::start(server_addr(&server)).await.unwrap();
    let url = format!("redis://127.0.0.1:{}?fair=true", proxy.port());
    let client = LockClient::new(lock_redis::connect(&url).await.unwrap());
    assert!(client.backend().capabilities().fifo);
    let waiting = per_cycle(&[&proxy], async || waiting_cycle(&client, "w").await).await;
    assert_eq!(waiting, [2], "fair waiting acquire + release on a free key");
    let trying = per_cycle(&[&proxy], async || try_cycle(&client, "t").await).await;
    assert_eq!(trying, [2], "fair try_acquire + release on a free key");
    assert_eq!(
        proxy.connections(),
        lanes(),
        "no pub/sub connection on free keys"
    );
}

/// Round trips of one `lock_all` acquire of `keys`, counted on `proxy`
/// (the release is not counted).
async fn lock_all_acquire(client: &LockClient, proxy: &FaultProxy, keys: &[&str]) -> Vec<u64> {
    let mut counts = Vec::new();
    for round in 0..WARM_UP + 10 {
        sleep(Duration::from_millis(5)).await;
        proxy.reset_counters();
        let guard = client
            .lock_all(keys.iter().copied())
            .ttl(TTL)
            .wait(bench::CONTENDED_LIMIT)
            .acquire()
            .await
            .expect("free keys are granted");
        if round >= WARM_UP {
            counts.push(proxy.round_trips());
        }
        assert!(guard.release().await.expect("release"));
    }
    counts.dedup();
    counts
}

/// `lock_all` of three free keys is one round trip (the set's script) on
/// one server, unfair and fair; the count tells it apart from the
/// one-key-at-a-time path, which a one-node Redlock (no set exchange)
/// takes: three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_all_on_free_keys_is_one_round_trip() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let keys = ["m/a", "m/b", "m/c"];
    for (scheme, options, expected) in [
        ("redis", "", 1),
        ("redis", "?fair=true", 1),
        ("redlock", "", 3),
    ] {
        let proxy = FaultProxy::start(server_addr(&server)).await.unwrap();
        let url = format!("{scheme}://127.0.0.1:{}{options}", proxy.port());
        let client = LockClient::new(lock_redis::connect(&url).await.unwrap());
        let counts = lock_all_acquire(&client, &proxy, &keys).await;
        assert_eq!(
            counts,
            [expected],
            "{url}: round trips of one lock_all of 3 free keys"
        );
    }
}
