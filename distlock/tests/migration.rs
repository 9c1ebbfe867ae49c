//! Migration rollouts between real backends: Redis -> etcd, Redis ->
//! ZooKeeper, SQL -> etcd. During each, tasks contend on a few keys while
//! their phases move old -> dual -> new with adjacent phases overlapping:
//! the checker must find no overlapping holds and no fenced write accepted
//! out of order, and a straggler left on `old` must be refused; a wrong
//! rollout (old and new together) must see its `old` processes refused;
//! with `old` processes blind to the cutover the checker must flag it.

use std::sync::Arc;

use conformance::OrSkip;
use conformance::migration::rollout_is_guarded;
use conformance::servers::etcd::EtcdServer;
use conformance::servers::redis::RedisServer;
use conformance::servers::zookeeper::ZkServer;
use conformance::{HarnessError, Target};
use distlock::{LockBackend, LockError};

struct UrlTarget(String);

#[async_trait::async_trait]
impl Target for UrlTarget {
    fn name(&self) -> String {
        self.0.split(':').next().unwrap_or("url").to_owned()
    }
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        distlock::open(&self.0).await
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
    for (name, report) in [
        ("correct", &verdicts.correct),
        ("wrong", &verdicts.wrong),
        ("blind", &verdicts.blind),
    ] {
        println!(
            "  {name:>7}: {} ; grants {:?} ; fenced writes accepted {} rejected {} ; old refusals {} ; straggler {}",
            report.check.summary(),
            report.grants_by_phase,
            report.writes_accepted,
            report.writes_rejected,
            report.refusals,
            report.straggler
        );
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
