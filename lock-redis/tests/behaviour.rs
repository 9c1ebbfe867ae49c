//! Redis-specific behaviour on real servers: interop with plain `SET NX PX`
//! clients, script-cache loss, restarts, Redlock with dead nodes, Sentinel
//! failover, batched renewal, and the failover negative control. Writes
//! guarded by the store (`run_guarded`) are in `behaviour/guarded.rs`.

mod common;

#[path = "behaviour/guarded.rs"]
mod guarded;

use std::sync::Arc;
use std::time::Duration;

use common::{Fleet, RedisTarget, deployed, raw, try_raw, waiting_for_a_replica};
use conformance::history::History;
use conformance::servers::redis::RedisServer;
use conformance::{Harness, OrSkip, Target, run_suite};
use lock_core::{Lease, LockBackend, LockBackendExt, LockClient, LockKey};
use lock_redis::{RedisBackend, RedisConfig};
use tokio::time::Instant;

/// Heavy tests run one at a time: several measure timing.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The node ports of a `redlock://a:p,b:q,...` URL.
fn redlock_ports(url: &str) -> Vec<u16> {
    let hosts = url.strip_prefix("redlock://").unwrap_or(url);
    let hosts = hosts.split(['?', '/']).next().unwrap_or_default();
    hosts
        .split(',')
        .filter_map(|h| h.rsplit(':').next()?.parse().ok())
        .collect()
}

fn key(name: &str) -> LockKey {
    LockKey::new(name).expect("valid key")
}

/// A Sentinel deployment for a failover test (the heavy tests' turn
/// held), a backend on it, and the key `name`, acquired and released once
/// on the first master.
async fn sentinel_in_use(
    name: &str,
) -> Option<(
    RedisTarget,
    tokio::sync::MutexGuard<'static, ()>,
    RedisBackend,
    LockKey,
)> {
    let target = RedisTarget::sentinel().await.or_skip()?;
    let serial = SERIAL.lock().await;
    let backend = target.backend().await.unwrap();
    let k = key(name);
    let ttl = Duration::from_secs(5);
    let lease = backend.try_acquire(&k, ttl).await.unwrap().expect("free");
    assert!(backend.release(&lease).await.unwrap());
    Some((target, serial, backend, k))
}

/// Tries `k` until the client has re-resolved the master after a failover
/// (each error meanwhile temporary), for at most `within`; the lease,
/// whose grant is checked to live on the new master (on `new_master`).
async fn acquire_after_failover(
    backend: &RedisBackend,
    k: &LockKey,
    ttl: Duration,
    new_master: u16,
    within: Duration,
) -> Lease {
    let deadline = Instant::now() + within;
    let lease = loop {
        match backend.try_acquire(k, ttl).await {
            Ok(Some(lease)) => break lease,
            Ok(None) => panic!("the key is held after failover"),
            Err(err) => {
                assert!(err.is_temporary(), "{err}");
                assert!(Instant::now() < deadline, "never re-resolved: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let holder = stored_value(new_master, backend, k).await;
    assert_eq!(holder, Some(lease.owner().to_hex()));
    lease
}

/// The value of `k`'s Redis key (its holder) on the server on `port`.
async fn stored_value(port: u16, backend: &RedisBackend, k: &LockKey) -> Option<String> {
    redis::cmd("GET")
        .arg(backend.redis_key(k))
        .query_async(&mut raw(port).await)
        .await
        .unwrap()
}

/// A plain client's `SET <redis_key> other-client-random NX PX 10000`:
/// `Some("OK")` when it took the key.
async fn plain_set_nx_px(
    conn: &mut redis::aio::MultiplexedConnection,
    redis_key: &str,
) -> Option<String> {
    redis::cmd("SET")
        .arg(redis_key)
        .arg("other-client-random")
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .query_async(conn)
        .await
        .unwrap()
}

/// A plain client's `GET <redis_key>` of a key that is set.
async fn plain_get(conn: &mut redis::aio::MultiplexedConnection, redis_key: &str) -> String {
    redis::cmd("GET")
        .arg(redis_key)
        .query_async(conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interop_with_plain_set_nx_px_both_ways() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let backend = RedisBackend::connect(RedisConfig::from_url(&server.url()).unwrap())
        .await
        .unwrap();
    let mut other = raw(server.port()).await;
    let k = key("interop/job");
    let redis_key = backend.redis_key(&k);
    assert_eq!(redis_key, "distlock:{interop/job}");

    // Ours holds: a plain SET NX PX by another client fails.
    let lease = backend
        .try_acquire(&k, Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free");
    let set = plain_set_nx_px(&mut other, &redis_key).await;
    assert_eq!(set, None, "a plain SET NX PX got a key we hold");
    let stored = plain_get(&mut other, &redis_key).await;
    assert_eq!(
        stored,
        lease.owner().to_hex(),
        "the key holds our owner id as a plain string"
    );
    assert!(backend.release(&lease).await.unwrap());

    // The other client holds: ours fails, and never touches its key.
    let set = plain_set_nx_px(&mut other, &redis_key).await;
    assert_eq!(set.as_deref(), Some("OK"));
    assert!(
        backend
            .try_acquire(&k, Duration::from_secs(10))
            .await
            .unwrap()
            .is_none()
    );
    let info = backend.inspect(&k).await.unwrap().expect("held");
    assert_eq!(info.holder, "other-client-random");
    assert_eq!(info.token, None, "a foreign holder has no token of ours");
    // Our stale lease cannot release or renew the foreign holder's lock.
    assert!(!backend.release(&lease).await.unwrap());
    assert!(backend.renew(&lease).await.unwrap_err().is_not_held());
    let stored = plain_get(&mut other, &redis_key).await;
    assert_eq!(stored, "other-client-random");
    // A waiter gets it once the other client deletes its key (the re-check
    // covers clients that publish nothing).
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(&redis_key)
        .arg(300)
        .query_async(&mut other)
        .await
        .unwrap();
    let started = Instant::now();
    let lease = backend
        .acquire(
            &k,
            Duration::from_secs(10),
            started + Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(backend.release(&lease).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_script_cache_and_restart_are_survived() {
    let Some(mut server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let backend = RedisBackend::connect(RedisConfig::from_url(&server.url()).unwrap())
        .await
        .unwrap();
    let k = key("scripts");
    let ttl = Duration::from_secs(5);
    let first = backend.try_acquire(&k, ttl).await.unwrap().expect("free");
    let mut admin = raw(server.port()).await;
    let _: String = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut admin)
        .await
        .unwrap();
    // EVALSHA answers NOSCRIPT now: every script must fall back to EVAL.
    backend
        .renew(&first)
        .await
        .expect("renew after SCRIPT FLUSH");
    assert!(backend.inspect(&k).await.unwrap().is_some());
    assert!(backend.release(&first).await.unwrap());
    let second = backend.try_acquire(&k, ttl).await.unwrap().expect("free");
    assert!(second.token() > first.token());
    assert!(backend.release(&second).await.unwrap());

    // A restart (no persistence): the shared connection is re-established.
    server.process().restart().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let lease = loop {
        match backend.try_acquire(&k, ttl).await {
            Ok(Some(lease)) => break lease,
            Ok(None) => panic!("the restarted server has no lock"),
            Err(err) => {
                assert!(err.is_temporary(), "{err}");
                assert!(Instant::now() < deadline, "no reconnect: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    // Without persistence the counter restarted: the token went back. This
    // is the documented caveat (fencing_survives_failover = false).
    assert!(lease.token() <= second.token());
    assert!(!backend.capabilities().fencing_survives_failover);
    assert!(backend.release(&lease).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_gives_typed_errors_in_bounded_time() {
    let Some(mut server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let url = format!("{}?timeout=300ms", server.url());
    let backend = RedisBackend::connect(RedisConfig::from_url(&url).unwrap())
        .await
        .unwrap();
    server.process().pause().unwrap();
    let k = key("paused");
    let started = Instant::now();
    let err = backend
        .try_acquire(&k, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    // redis-rs's response timeout bounds the one request; its error reads
    // as the driver's own timeout did.
    assert!(err.to_string().contains("did not answer within"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let started = Instant::now();
    let err = backend
        .acquire(
            &k,
            Duration::from_secs(1),
            started + Duration::from_millis(700),
        )
        .await
        .unwrap_err();
    assert!(err.is_temporary(), "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    server.process().resume().unwrap();
    // Nothing is left: the timed-out acquires cleaned up or expired.
    let deadline = Instant::now() + Duration::from_secs(3);
    let lease = backend
        .acquire(&k, Duration::from_secs(1), deadline)
        .await
        .unwrap();
    assert!(backend.release(&lease).await.unwrap());

    // A dead port: Unavailable at connect time, quickly.
    let port = conformance::process::free_port().unwrap();
    let started = Instant::now();
    let err = lock_redis::connect(&format!("redis://:hunter2@127.0.0.1:{port}?timeout=500ms"))
        .await
        .unwrap_err();
    assert!(err.is_temporary(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redlock_suite_with_one_node_killed() {
    let Some(target) = deployed("redlock").await else {
        return;
    };
    let _serial = SERIAL.lock().await;
    assert_eq!(target.stop_nodes(1).await.unwrap(), Some(5));
    let harness = Harness::new(Arc::new(target));
    run_suite(&harness).await.assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redlock_with_three_of_five_killed_fails_in_time_and_leaves_nothing() {
    let Some(target) = deployed("redlock").await else {
        return;
    };
    let url = target.url();
    let backend = lock_redis::connect(&url).await.unwrap();
    assert_eq!(target.stop_nodes(3).await.unwrap(), Some(5));
    let ports = redlock_ports(&url);
    assert_eq!(ports.len(), 5, "{url}");
    let k = key("minority");
    let ttl = Duration::from_secs(10);
    let err = backend.try_acquire(&k, ttl).await.unwrap_err();
    assert!(err.is_unavailable() || err.is_timeout(), "{err}");
    let wait = Duration::from_millis(800);
    let started = Instant::now();
    let err = backend.acquire(&k, ttl, started + wait).await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(err.is_temporary(), "{err}");
    assert!(
        elapsed <= wait + Duration::from_millis(500),
        "gave up after {elapsed:?}"
    );
    // The two live nodes were granted each time and must have been released
    // (the three killed ones refuse the connection).
    let mut live = 0;
    for port in ports {
        let Ok(mut conn) = try_raw(port).await else {
            continue;
        };
        live += 1;
        let exists: i64 = redis::cmd("EXISTS")
            .arg(backend.redis_key(&k))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(exists, 0, "a partial Redlock grant was left on :{port}");
    }
    assert_eq!(live, 2, "two of five nodes must still answer");
    // A new backend cannot even connect without a majority.
    let err = lock_redis::connect(&url).await.unwrap_err();
    assert!(err.is_temporary(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinel_failover_re_resolves_the_master() {
    let Some((target, _serial, backend, k)) = sentinel_in_use("failover").await else {
        return;
    };
    let ttl = Duration::from_secs(5);

    // Graceful failover: the old master stays up as a replica, so a client
    // that kept talking to it would get READONLY.
    let (old_master, replica_port) = match &mut *target.fleet() {
        Fleet::Sentinel {
            master,
            replica,
            sentinel,
        } => {
            assert_eq!(sentinel.master_port().unwrap(), master.port());
            sentinel.failover().unwrap();
            (master.port(), replica.port())
        }
        _ => unreachable!(),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now_master = match &mut *target.fleet() {
            Fleet::Sentinel { sentinel, .. } => sentinel.master_port().ok(),
            _ => None,
        };
        if now_master == Some(replica_port) {
            break;
        }
        assert!(Instant::now() < deadline, "the sentinel never failed over");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Wait until the old master has been turned into a replica: before
    // that, it still accepts writes that the switch then throws away (the
    // window in which Redis loses locks on failover).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let role = conformance::servers::redis::redis_cli(old_master, &["ROLE"]);
        if role.is_ok_and(|r| r.starts_with("slave")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the old master was never demoted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The grant lives on the new master, not the old one.
    let lease =
        acquire_after_failover(&backend, &k, ttl, replica_port, Duration::from_secs(20)).await;
    let role: Vec<redis::Value> = redis::cmd("ROLE")
        .query_async(&mut raw(old_master).await)
        .await
        .unwrap();
    assert!(format!("{role:?}").contains("slave"), "{role:?}");
    assert!(backend.release(&lease).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_held_locks_are_renewed_in_batches() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let backend = RedisBackend::connect(RedisConfig::from_url(&server.url()).unwrap())
        .await
        .unwrap();
    let client = LockClient::new(backend.clone());
    let ttl = Duration::from_millis(900);
    let locks = 2_000;
    let mut guards = Vec::with_capacity(locks);
    for i in 0..locks {
        guards.push(
            client
                .lock(format!("many/{i}"))
                .ttl(ttl)
                .acquire()
                .await
                .unwrap(),
        );
    }
    // Several renewal periods (TTL/3 = 300 ms).
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    assert!(guards.iter().all(lock_core::LockGuard::is_held));
    let stats = backend.renewal_stats();
    assert!(
        stats.renewals >= 2 * locks as u64,
        "too few renewals: {stats:?}"
    );
    // One round trip per lock would be `renewals`; batching must do far better.
    assert!(
        stats.round_trips * 20 <= stats.renewals,
        "renewals were not batched: {stats:?}"
    );
    for guard in guards {
        assert!(guard.release().await.unwrap());
    }
}

/// The negative control: a master with an asynchronous replica grants a
/// lock, dies before replicating it, the replica is promoted, and a second
/// client is granted the same key. The history checker must report the
/// double grant and the token going backwards: Redis cannot prevent it,
/// and the suite must not hide it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_control_failover_double_grant_is_detected() {
    let Some((mut master, mut replica)) = RedisServer::start_with_synced_replica().await.or_skip()
    else {
        return;
    };
    let a = RedisBackend::connect(RedisConfig::from_url(&master.url()).unwrap())
        .await
        .unwrap();
    let history = Arc::new(History::new());
    let (rec_a, rec_b) = (history.process(), history.process());
    let k = key("negative-control");
    let ttl = Duration::from_secs(30);

    // A few grants that do reach the replica.
    for _ in 0..3 {
        let lease = a.try_acquire(&k, ttl).await.unwrap().expect("free");
        assert!(a.release(&lease).await.unwrap());
    }
    let mut m = raw(master.port()).await;
    let _: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2_000)
        .query_async(&mut m)
        .await
        .unwrap();
    // From now on the replica hears nothing: it is frozen, and the master
    // drops its link (data already in the replica's socket buffer would
    // otherwise still arrive when it resumes).
    replica.process().pause().unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut m)
        .await
        .unwrap();
    for _ in 0..3 {
        let lease = a.try_acquire(&k, ttl).await.unwrap().expect("free");
        assert!(a.release(&lease).await.unwrap());
    }
    rec_a.invoke(conformance::history::Op::Acquire, &k, None);
    let held = a.try_acquire(&k, ttl).await.unwrap().expect("free");
    rec_a.acquired(&k, held.token(), held.validity_deadline());
    // The master dies before replicating; the replica is promoted.
    master.process().kill().unwrap();
    replica.process().resume().unwrap();
    replica.promote().unwrap();
    let b = RedisBackend::connect(RedisConfig::from_url(&replica.url()).unwrap())
        .await
        .unwrap();
    rec_b.invoke(conformance::history::Op::Acquire, &k, None);
    let second = b
        .try_acquire(&k, ttl)
        .await
        .unwrap()
        .expect("the promoted replica never saw the first grant");
    rec_b.acquired(&k, second.token(), second.validity_deadline());

    let report = history.check();
    println!(
        "negative control (async replica, master killed before replication, replica promoted): {}",
        report.summary()
    );
    assert!(
        report.overlap_count >= 1,
        "the double grant was not detected: {}",
        report.summary()
    );
    assert_eq!(report.max_concurrent_holders, 2);
    assert!(
        report.token_regressions >= 1,
        "the token regression was not detected: {} (first {}, second {})",
        report.summary(),
        held.token(),
        second.token()
    );
    assert!(!report.is_safe_with_fencing());
    assert!(second.token() < held.token());
    assert_eq!(
        b.inspect(&k).await.unwrap().map(|i| i.holder),
        Some(second.owner().to_hex())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_replicas_undoes_unacknowledged_grants() {
    let Some((master, mut replica, backend)) = waiting_for_a_replica().await else {
        return;
    };
    assert_eq!(backend.config().replicas(), 1);
    let k = key("waited");
    let ttl = Duration::from_secs(10);
    let lease = backend.try_acquire(&k, ttl).await.unwrap().expect("free");
    // The replica has it.
    let on_replica = stored_value(replica.port(), &backend, &k).await;
    assert_eq!(on_replica, Some(lease.owner().to_hex()));
    assert!(backend.release(&lease).await.unwrap());

    // No replica acknowledges: the grant is refused and undone.
    replica.process().pause().unwrap();
    let started = Instant::now();
    let err = backend.try_acquire(&k, ttl).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert!(err.message().contains("replicas"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    let mut m = raw(master.port()).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(backend.redis_key(&k))
            .query_async(&mut m)
            .await
            .unwrap();
        if exists == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the unacknowledged grant was left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    replica.process().resume().unwrap();

    // WAIT is refused where it cannot mean anything.
    let err = lock_redis::connect("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?replicas=1")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), lock_core::ErrorKind::Unsupported);
}

/// Issue 37: `WAIT` confirms only the writes of the connection it runs on.
/// Here the client's shared connection is dropped (another call on it timed
/// out) while the grant script's answer is on its way back, so the next
/// call opens a fresh connection; a `WAIT` sent there would count a replica
/// that never got the grant (a fresh connection has written nothing to
/// wait for) and confirm it. The replica is frozen: the grant must be
/// refused and undone, as when nothing reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_replicas_confirms_on_the_grants_own_connection() {
    let _serial = SERIAL.lock().await;
    let Some((master, mut replica)) = RedisServer::start_with_synced_replica().await.or_skip()
    else {
        return;
    };
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], master.port()));
    let proxy = conformance::proxy::FaultProxy::start(upstream)
        .await
        .unwrap();
    let url = format!(
        "redis://127.0.0.1:{}?replicas=1&wait_timeout=200ms&timeout=5s",
        proxy.port()
    );
    let backend = Arc::new(lock_redis::connect(&url).await.unwrap());
    let (k, other) = (key("confirmed"), key("dropped-connection"));
    let ttl = Duration::from_secs(30);
    // Connected, and the paths warm (scripts loaded).
    let warm = backend.try_acquire(&k, ttl).await.unwrap().expect("free");
    assert!(backend.release(&warm).await.unwrap());
    replica.process().pause().unwrap();
    proxy.set_latency(Duration::from_millis(200), Duration::ZERO);
    // A waiting acquire whose attempt times out after 100 ms drops the
    // shared connection; the grant below was sent on it just before.
    let dropper = {
        let (backend, other) = (backend.clone(), other.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_millis(100);
            let _ = backend.acquire(&other, ttl, deadline).await;
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let granted = backend.try_acquire(&k, ttl).await;
    dropper.await.unwrap();
    proxy.set_latency(Duration::ZERO, Duration::ZERO);
    replica.process().resume().unwrap();
    match granted {
        Ok(lease) => panic!(
            "a grant no replica acknowledged was confirmed (WAIT ran on another connection): {lease:?}"
        ),
        Err(err) => assert!(err.message().contains("replicas"), "{err}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinel_master_killed_clients_follow_the_promoted_replica() {
    let Some((target, _serial, backend, k)) = sentinel_in_use("killed-master").await else {
        return;
    };
    let ttl = Duration::from_secs(5);
    let replica_port = match &mut *target.fleet() {
        Fleet::Sentinel {
            master, replica, ..
        } => {
            master.process().kill().unwrap();
            replica.port()
        }
        _ => unreachable!(),
    };
    // Errors are typed and temporary until the sentinel promotes the
    // replica (down-after 1 s); then the client re-resolves by itself.
    let lease =
        acquire_after_failover(&backend, &k, ttl, replica_port, Duration::from_secs(40)).await;
    assert!(backend.release(&lease).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_work_and_never_show() {
    let Some(server) = RedisServer::start_with(&["--requirepass", "s3cr3t-pw"])
        .await
        .or_skip()
    else {
        return;
    };
    let port = server.port();
    let backend = lock_redis::connect(&format!("redis://:s3cr3t-pw@127.0.0.1:{port}?prefix=app:"))
        .await
        .unwrap();
    assert!(!format!("{backend:?}").contains("s3cr3t-pw"));
    let k = key("auth");
    let lease = backend
        .try_acquire(&k, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free");
    assert_eq!(backend.redis_key(&k), "app:{auth}");
    assert!(backend.release(&lease).await.unwrap());

    let err = lock_redis::connect(&format!("redis://:wrong-pw@127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), lock_core::ErrorKind::Config, "{err}");
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("wrong-pw"), "{shown}");
    let err = lock_redis::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), lock_core::ErrorKind::Config, "{err}");
}
