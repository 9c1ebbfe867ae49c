//! Migration rollouts between real backends: Redis -> etcd, Redis ->
//! ZooKeeper, SQL -> etcd. During each, tasks contend on a few keys while
//! their phases move old -> dual -> new with adjacent phases overlapping:
//! the checker must find no overlapping holds and no fenced write accepted
//! out of order, and a straggler left on `old` must be refused; a wrong
//! rollout (old and new together) must see its `old` processes refused;
//! with `old` processes blind to the cutover the checker must flag it.
//!
//! And from a fleet that does not run this library yet: the first phase's
//! processes are real legacy clients (redis-py's `Lock`, kazoo's `Lock`, as
//! Python processes), ours join in `dual` on their exact keys and layout,
//! then move to `new`: no overlapping hold in any run, and the wrong
//! rollout (legacy clients beside `new` processes) flagged in every run.

use std::sync::Arc;

use conformance::OrSkip;
use conformance::legacy::rollout::{LegacyRolloutConfig, legacy_rollout_is_guarded};
use conformance::legacy::{LegacyKind, legacy_python};
use conformance::migration::rollout_is_guarded;
use conformance::servers::etcd::EtcdServer;
use conformance::servers::redis::RedisServer;
use conformance::servers::zookeeper::ZkServer;
use conformance::{HarnessError, Target};
use distlock::LockError;
use distlock::backend::LockBackend;

struct UrlTarget(String);

#[async_trait::async_trait]
impl Target for UrlTarget {
    fn name(&self) -> String {
        self.0.split(':').next().unwrap_or("url").to_owned()
    }
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        distlock::backend::open(&self.0).await
    }
}

async fn check(old: String, new: String) {
    let verdicts = rollout_is_guarded(
        Arc::new(UrlTarget(old.clone())),
        Arc::new(UrlTarget(new.clone())),
    )
    .await
    .unwrap_or_else(|e| panic!("{old} -> {new}: {e}"));
    println!("{old} -> {new}");
    for line in verdicts.lines() {
        println!("  {line}");
    }
    assert_eq!(verdicts.correct.check.stale_writes_accepted, 0);
    assert_eq!(verdicts.correct.straggler, "refused");
}

fn started<T>(r: Result<T, HarnessError>) -> Option<T> {
    r.or_skip()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_to_etcd() {
    let (Some(redis), Some(etcd)) = (
        started(RedisServer::start().await),
        started(EtcdServer::start().await),
    ) else {
        return;
    };
    check(redis.url(), etcd.url("migrate", "ttl=5s")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_to_zookeeper() {
    let (Some(redis), Some(zk)) = (
        started(RedisServer::start().await),
        started(ZkServer::start().await),
    ) else {
        return;
    };
    check(redis.url(), zk.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_to_etcd() {
    let Some(etcd) = started(EtcdServer::start().await) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("locks.db").display());
    check(sqlite, etcd.url("migrate", "ttl=5s")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_config_file_drives_the_facade() {
    let (Some(redis), Some(etcd)) = (
        started(RedisServer::start().await),
        started(EtcdServer::start().await),
    ) else {
        return;
    };
    let toml = format!(
        "[migration]\nold = \"{}\"\nnew = \"{}\"\nphase = \"dual\"\n",
        redis.url(),
        etcd.url("cfg", "ttl=5s")
    );
    let config = distlock::Config::from_toml_str(&toml).unwrap();
    let dual = distlock::connect_config(&config).await.unwrap();
    let guard = dual.lock("jobs/a").acquire().await.unwrap();
    assert!(guard.token().get() > distlock::NEW_EPOCH);
    // A process still on `old` is excluded through Redis, one on `new`
    // through etcd.
    let old = distlock::connect(&redis.url()).await.unwrap();
    assert!(old.lock("jobs/a").try_acquire().await.unwrap().is_none());
    let new = distlock::connect(&etcd.url("cfg", "ttl=5s")).await.unwrap();
    assert!(new.lock("jobs/a").try_acquire().await.unwrap().is_none());
    let info = dual.inspect("jobs/a").await.unwrap().unwrap();
    assert_eq!(info.token, Some(guard.token()));
    assert!(guard.release().await.unwrap());
}

/// Runs of each legacy rollout (correct and wrong) per test.
const LEGACY_RUNS: usize = 3;

async fn check_legacy(legacy: LegacyKind, old: String, new: String) {
    let Some(python) = legacy_python().or_skip() else {
        return;
    };
    let name = legacy.name();
    let verdicts = legacy_rollout_is_guarded(
        Arc::new(UrlTarget(old.clone())),
        Arc::new(UrlTarget(new.clone())),
        LegacyRolloutConfig::new(legacy, python),
        LEGACY_RUNS,
    )
    .await
    .unwrap_or_else(|e| panic!("{name} on {old} -> {new}: {e}"));
    println!("{name} on {old} -> {new}");
    for (rollout, reports) in [("correct", &verdicts.correct), ("wrong", &verdicts.wrong)] {
        for report in reports {
            println!(
                "  {rollout:>7}: {} ; grants {:?} ; unfenced writes {}",
                report.check.summary(),
                report.grants,
                report.unfenced_writes
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_fleet_to_etcd() {
    let (Some(redis), Some(etcd)) = (
        started(RedisServer::start().await),
        started(EtcdServer::start().await),
    ) else {
        return;
    };
    let legacy = LegacyKind::RedisPy {
        host: "127.0.0.1".to_owned(),
        port: redis.port(),
    };
    check_legacy(
        legacy,
        format!("{}?layout=plain", redis.url()),
        etcd.url("legacy", "ttl=5s"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_fleet_zookeeper_to_etcd() {
    let (Some(zk), Some(etcd)) = (
        started(ZkServer::start().await),
        started(EtcdServer::start().await),
    ) else {
        return;
    };
    let legacy = LegacyKind::Kazoo {
        hosts: zk.connect_string(),
    };
    check_legacy(
        legacy,
        format!("{}?layout=path&nodes=kazoo", zk.url()),
        etcd.url("legacy", "ttl=5s"),
    )
    .await;
}
