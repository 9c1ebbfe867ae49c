//! etcd under a real partition (in the kernel, see `lock_testkit::netns`):
//! the holder's host is cut off from a single member and from a
//! three-member cluster; the session lease the holder can no longer keep
//! alive expires on the server, which must come after the holder's
//! deadline (its lost signal). The broken variant: a holder told an hour
//! late is caught.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{cycle, suite_opener, twenty_cycles_in_a_row};
use conformance::OrSkip;
use conformance::doubles::{HourLongerLeases, flawed_opener};
use conformance::netns::spawn_runtime_in;
use conformance::scenarios::{
    ClusterCut, PartitionEnv, assert_cluster_cut_safe, assert_cut_off_safe,
    assert_told_too_late_caught,
};
use conformance::servers::etcd::EtcdServer;

const TTL: Duration = Duration::from_secs(4);

async fn env(
    members: &[&str],
    holder: conformance::deploy::Opener,
) -> Option<(PartitionEnv, EtcdServer)> {
    let lab = PartitionEnv::lab(members).or_skip()?;
    let server = EtcdServer::start_in(&lab, members).await.or_skip()?;
    let url = server.url("partition", &format!("ttl={}s", TTL.as_secs()));
    let env = PartitionEnv::on_url(lab, "etcd", &url, holder, suite_opener(), TTL);
    Some((env, server))
}

async fn cut_off(members: &[&str]) {
    let Some((env, _server)) = env(members, suite_opener()).await else {
        return;
    };
    assert_cut_off_safe(&env, &format!("etcd, {} members", members.len())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holder_is_told_before_a_single_member_frees_its_lock() {
    cut_off(&["etcd"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holder_is_told_before_a_cluster_frees_its_lock() {
    cut_off(&["m0", "m1", "m2"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_told_too_late_is_caught() {
    let flawed = flawed_opener(suite_opener(), Arc::new(HourLongerLeases));
    let Some((env, _server)) = env(&["etcd"], flawed).await else {
        return;
    };
    assert_told_too_late_caught(&env, "etcd").await;
}

/// The members of the clusters below.
const MEMBERS: [&str; 3] = ["m0", "m1", "m2"];

/// A three-member cluster on lab hosts. Once it has a leader, the holder
/// is attached where `which` says (one member, or every member); the
/// observer is attached to every other. Returns the env, the server, and
/// the holder's member.
async fn cluster_env(which: ClusterCut) -> Option<(PartitionEnv, EtcdServer, Option<usize>)> {
    let lab = PartitionEnv::lab(&MEMBERS).or_skip()?;
    let server = EtcdServer::start_in(&lab, &MEMBERS).await.or_skip()?;
    let leader = server
        .wait_leader(Duration::from_secs(10))
        .await
        .expect("the cluster elected no leader");
    let attached = which.attach(leader, MEMBERS.len());
    let query = format!("ttl={}s", TTL.as_secs());
    let url_of = |members: &[String]| format!("etcd://{}/partition?{query}", members.join(","));
    let env = PartitionEnv::attached_to(
        lab,
        "etcd",
        &server.endpoints(),
        attached,
        url_of,
        suite_opener(),
        TTL,
    );
    Some((env, server, attached))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_a_leader_cut_from_its_peers_is_told_before_the_cluster_frees_its_lock() {
    let label = "etcd leader cut from its peers";
    assert_cluster_cut_safe(ClusterCut::LeaderFromPeers, &MEMBERS, label, cluster_env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_a_follower_cut_from_its_peers_is_told_before_the_cluster_frees_its_lock() {
    let label = "etcd follower cut from its peers";
    assert_cluster_cut_safe(ClusterCut::FollowerFromPeers, &MEMBERS, label, cluster_env).await;
}

/// The members still reach one another; the holder reaches only m2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_from_two_members_fails_over_or_is_told_first() {
    let label = "etcd holder cut from two of three members";
    assert_cluster_cut_safe(
        ClusterCut::HolderFromAllButOne,
        &MEMBERS,
        label,
        cluster_env,
    )
    .await;
}

/// A client that reaches every member of a three-member cluster, and lists
/// first a follower that is then cut from its two peers (in the kernel,
/// while the client still reaches it): within 20 s of the cut, 20 cycles
/// in a row succeed. A transport that keeps sending some calls to the cut
/// member (which cannot commit anything) fails: those calls fail ("no
/// leader") or time out for as long as the cut lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaves_a_member_cut_from_its_peers() {
    let Some(lab) = PartitionEnv::lab(&MEMBERS).or_skip() else {
        return;
    };
    let Some(server) = EtcdServer::start_in(&lab, &MEMBERS).await.or_skip() else {
        return;
    };
    let leader = server
        .wait_leader(Duration::from_secs(10))
        .await
        .expect("the cluster elected no leader");
    let cut = (leader + 1) % MEMBERS.len();
    let mut endpoints = server.endpoints();
    endpoints.rotate_left(cut);
    let url = format!("etcd://{}/leave?ttl=60s&timeout=1s", endpoints.join(","));
    let peers: Vec<&'static str> = MEMBERS
        .iter()
        .copied()
        .filter(|m| *m != MEMBERS[cut])
        .collect();
    let in_lab = lab.clone();
    let observer = lab
        .host(conformance::scenarios::OBSERVER_HOST)
        .netns()
        .path();
    let outcome = spawn_runtime_in(observer, 2, move || async move {
        let backend = lock_etcd::connect(&url).await.map_err(|e| e.to_string())?;
        let key = lock_core::LockKey::new("k").unwrap();
        cycle(&backend, &key).await?;
        in_lab
            .cut_from(MEMBERS[cut], &peers)
            .map_err(|e| e.to_string())?;
        twenty_cycles_in_a_row(&backend, &key).await
    })
    .join();
    let _ = lab.heal();
    let failures = outcome
        .expect("the client thread panicked")
        .expect("the client thread entered the observer's namespace")
        .unwrap_or_else(|why| panic!("{why}"));
    println!("cycles failed before the client left the member: {failures:?}");
}
