//! Redis under a real partition (in the kernel, see
//! `lock_testkit::netns`): the holder's host is cut off from a single
//! server, from a Sentinel deployment (master, replica and three
//! sentinels, each on a host of its own) and from all five Redlock nodes.
//! The key the holder can no longer renew expires on the server(s) a TTL
//! after the last renewal they received, which must come after the
//! holder's deadline (its lost signal: last renewal sent + TTL - drift).
//! The broken variant: a holder told an hour late is caught.
//!
//! Long (a lab and servers per test): they run only when asked,
//! `DISTLOCK_PARTITIONS=all cargo test -p lock-redis --test partition`,
//! and otherwise print `skipped: set DISTLOCK_PARTITIONS=all`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::opener;
use conformance::OrSkip;
use conformance::doubles::{HourLongerLeases, flawed_opener};
use conformance::scenarios::{
    Cut, PartitionEnv, Verdict, all_partitions_selected, assert_cut_off_safe,
    assert_told_too_late_caught, holder_under_cut,
};
use conformance::servers::redis::{RedisServer, SentinelGroup};

const TTL: Duration = Duration::from_secs(4);

const REDLOCK_HOSTS: [&str; 5] = ["r1", "r2", "r3", "r4", "r5"];

/// A Sentinel deployment's hosts: the master first, its replica, three
/// sentinels.
const SENTINEL_HOSTS: [&str; 5] = ["master", "replica", "s1", "s2", "s3"];

/// A Sentinel deployment on lab hosts ([`SENTINEL_HOSTS`]).
async fn sentinel_lab() -> Option<(Arc<conformance::netns::Lab>, SentinelGroup)> {
    let lab = PartitionEnv::lab(&SENTINEL_HOSTS).or_skip()?;
    let group = SentinelGroup::start_in(&lab, "master", "replica", &SENTINEL_HOSTS[2..], "locks")
        .await
        .or_skip()?;
    Some((lab, group))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holder_is_told_before_a_single_server_frees_its_lock() {
    if !all_partitions_selected() {
        return;
    }
    let Some(lab) = PartitionEnv::lab(&["redis"]).or_skip() else {
        return;
    };
    let Some(server) = RedisServer::start_in(&lab, "redis").await.or_skip() else {
        return;
    };
    let env = PartitionEnv::on_url(lab, "redis", &server.url(), opener(), opener(), TTL);
    assert_cut_off_safe(&env, "redis single").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holder_is_told_before_a_sentinel_master_frees_its_lock() {
    if !all_partitions_selected() {
        return;
    }
    let Some((lab, group)) = sentinel_lab().await else {
        return;
    };
    let env = PartitionEnv::on_url(lab, "redis-sentinel", &group.url(), opener(), opener(), TTL);
    assert_cut_off_safe(&env, "redis sentinel").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_from_every_redlock_node_is_told_before_they_free_its_lock() {
    if !all_partitions_selected() {
        return;
    }
    let Some(lab) = PartitionEnv::lab(&REDLOCK_HOSTS).or_skip() else {
        return;
    };
    let Some(nodes) = RedisServer::start_many_in(&lab, &REDLOCK_HOSTS)
        .await
        .or_skip()
    else {
        return;
    };
    let url = RedisServer::redlock_url(&nodes);
    let env = PartitionEnv::on_url(lab, "redlock", &url, opener(), opener(), TTL);
    assert_cut_off_safe(&env, "redlock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_told_too_late_is_caught() {
    if !all_partitions_selected() {
        return;
    }
    let Some(lab) = PartitionEnv::lab(&["redis"]).or_skip() else {
        return;
    };
    let Some(server) = RedisServer::start_in(&lab, "redis").await.or_skip() else {
        return;
    };
    let flawed = flawed_opener(opener(), Arc::new(HourLongerLeases));
    let env = PartitionEnv::on_url(lab, "redis", &server.url(), flawed, opener(), TTL);
    assert_told_too_late_caught(&env, "redis single").await;
}

/// The Sentinel deployment's master is cut from its peers (the replica and
/// the three sentinels) while every client still reaches it: the sentinels
/// promote the replica, the holder keeps renewing on the old master, and
/// the observer (a new client per attempt, as a process started after the
/// failover: through the sentinels) is granted the key on the new one once
/// the replicated key expires there. Asynchronous replication makes
/// this a double grant, the caveat the backend table states; the scenario
/// must see it (`replicas=1` waits for the replica only after the grant,
/// not after each renewal, and does not change that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_master_cut_from_its_peers_double_grants() {
    if !all_partitions_selected() {
        return;
    }
    let Some((lab, group)) = sentinel_lab().await else {
        return;
    };
    let mut env =
        PartitionEnv::on_url(lab, "redis-sentinel", &group.url(), opener(), opener(), TTL);
    env.observer_fresh_clients = true;
    let cut = Cut::member_from_peers(&SENTINEL_HOSTS, 0);
    let report = holder_under_cut(&env, &cut).await;
    eprintln!(
        "redis sentinel, master cut from its peers: {:?}: {}: {:?}",
        report.verdict, report.detail, report.figures
    );
    assert_eq!(report.verdict, Verdict::Violation, "{}", report.detail);
    assert!(report.detail.contains("granted"), "{}", report.detail);
}
