//! NATS JetStream under a real partition (in the kernel, see
//! `lock_testkit::netns`): the holder's host is cut off from one server
//! and from a three-node cluster (the bucket's stream with replicas 3);
//! the key the holder can no longer renew expires on the server, which
//! must come after the holder's deadline (its lost signal). The broken
//! variant: a holder told an hour late is caught. With
//! `DISTLOCK_PARTITIONS=all`, also a node (the stream's leader, then a
//! follower) cut from its two peers while the holder is attached to it
//! and another client to the others, and the holder cut from two of the
//! three nodes: no grant to the other client before the holder is told;
//! and the `nats-cluster` lab kind the kernel-partition soak starts.

mod common;

use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::deploy::Opener;
use conformance::doubles::{HourLongerLeases, flawed_opener};
use conformance::scenarios::{
    ClusterCut, OBSERVER_HOST, PartitionEnv, all_partitions_selected, assert_cluster_cut_safe,
    assert_cut_off_safe, assert_told_too_late_caught,
};
use conformance::servers::nats::NatsServer;
use lock_testkit::netns::{Lab, spawn_runtime_in};

/// The holder's TTL when it is cut off: the key expires on the stream's
/// leader, which keeps serving.
const TTL: Duration = Duration::from_secs(4);

/// The TTL when a node is cut from its peers: a stream leader cut off
/// loses its quorum, and the two others elect a new one (4.4-7.1 s after
/// a leader kill, see docs/backends/nats.md) before the key can expire
/// there; the other client waits at most twice the TTL and 5 s.
const ELECTION_TTL: Duration = Duration::from_secs(6);

/// The lab's hosts for the nodes of the clusters below.
const MEMBERS: [&str; 3] = ["n0", "n1", "n2"];

/// The bucket every test here uses.
const BUCKET: &str = "partition";

/// The stream that carries [`BUCKET`].
fn stream() -> String {
    format!("KV_{BUCKET}")
}

/// `nats://<addresses>/partition`, with `replicas` for a cluster.
fn url_of(addresses: &[String], nodes: usize) -> String {
    let mut url = format!("nats://{}/{BUCKET}", addresses.join(","));
    if nodes > 1 {
        url.push_str(&format!("?replicas={nodes}"));
    }
    url
}

async fn env(members: &[&str], holder: Opener) -> Option<(PartitionEnv, NatsServer)> {
    let lab = PartitionEnv::lab(members).or_skip()?;
    let server = NatsServer::start_in(&lab, members).await.or_skip()?;
    let env = PartitionEnv::on_url(
        lab,
        "nats",
        &server.url(BUCKET),
        holder,
        common::opener(),
        TTL,
    );
    Some((env, server))
}

async fn cut_off(members: &[&str]) {
    let Some((env, _server)) = env(members, common::opener()).await else {
        return;
    };
    assert_cut_off_safe(&env, &format!("nats, {} node(s)", members.len())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holder_is_told_before_a_cluster_frees_its_lock() {
    cut_off(&MEMBERS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holder_is_told_before_a_single_server_frees_its_lock() {
    if !all_partitions_selected() {
        return;
    }
    cut_off(&["nats"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_told_too_late_is_caught() {
    let flawed = flawed_opener(common::opener(), Arc::new(HourLongerLeases));
    let Some((env, _server)) = env(&["nats"], flawed).await else {
        return;
    };
    assert_told_too_late_caught(&env, "nats").await;
}

/// Creates the bucket (its stream with replicas 3) from the observer's
/// host, which reaches every node: the stream, and so its leader, exists
/// only once a client has opened the bucket.
fn create_bucket(lab: &Lab, url: String) {
    let observer = lab.host(OBSERVER_HOST).netns().path();
    spawn_runtime_in(observer, 0, move || async move {
        lock_nats::connect(&url).await.map(drop)
    })
    .join()
    .expect("the bucket thread panicked")
    .expect("the bucket thread entered the observer's namespace")
    .expect("the bucket was created");
}

/// A three-node cluster on lab hosts with the bucket created. Once its
/// stream has a leader, the holder is attached where `which` says (one
/// node, or every node); the other client is attached to every other
/// node. Prints which node leads the stream. Returns the env, the server,
/// and the holder's node.
async fn cluster_env(which: ClusterCut) -> Option<(PartitionEnv, NatsServer, Option<usize>)> {
    let lab = PartitionEnv::lab(&MEMBERS).or_skip()?;
    let server = NatsServer::start_in(&lab, &MEMBERS).await.or_skip()?;
    create_bucket(&lab, server.url(BUCKET));
    let leader = stream_leader(&server).await;
    let attached = which.attach(leader, MEMBERS.len());
    eprintln!("{which:?}: stream leader n{leader}, holder on {attached:?}");
    let addresses: Vec<String> = server.nodes().iter().map(|n| n.address()).collect();
    let env = PartitionEnv::attached_to(
        lab,
        "nats",
        &addresses,
        attached,
        |addresses| url_of(addresses, MEMBERS.len()),
        common::opener(),
        ELECTION_TTL,
    );
    Some((env, server, attached))
}

async fn stream_leader(server: &NatsServer) -> usize {
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(leader) = server.stream_leader(&stream()).await {
            return leader;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "the bucket's stream has no leader after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `which` on the cluster, printing which node leads the stream after the
/// heal.
async fn cluster_cut(which: ClusterCut, label: &str) {
    if let Some((_, _env, server)) =
        assert_cluster_cut_safe(which, &MEMBERS, label, cluster_env).await
    {
        let after = server
            .stream_leader(&stream())
            .await
            .map(|i| format!("n{i}"));
        eprintln!("{label}: stream leader after the heal: {after:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_the_stream_leader_cut_from_its_peers_is_told_before_another_is_granted() {
    cluster_cut(
        ClusterCut::LeaderFromPeers,
        "nats stream leader cut from its peers",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_a_follower_cut_from_its_peers_is_told_before_another_is_granted() {
    cluster_cut(
        ClusterCut::FollowerFromPeers,
        "nats follower cut from its peers",
    )
    .await;
}

/// The nodes still reach one another; the holder reaches only n2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_from_two_nodes_fails_over_or_is_told_first() {
    cluster_cut(
        ClusterCut::HolderFromAllButOne,
        "nats holder cut from two of three nodes",
    )
    .await;
}

/// The `nats-cluster` lab kind, as the kernel-partition soak uses it: a
/// client on a client host takes a key through one node's member URL; the
/// stream's leader is killed (the deployment's failover) and the key stays
/// held; a node cut from its peers and healed, and the killed node
/// restarted in its namespace, the cluster serves again and tokens keep
/// rising. About 23 s: only with `DISTLOCK_PARTITIONS=all`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lab_cluster_keeps_a_key_through_a_leader_kill_a_cut_and_a_restart() {
    use lock_core::{LockBackend, LockBackendExt};
    if !all_partitions_selected() {
        return;
    }
    let Some((mut deployment, hosts)) = conformance::deploy::start_in_lab("nats-cluster", 1)
        .await
        .or_skip()
    else {
        return;
    };
    assert_eq!(hosts.member_urls.len(), MEMBERS.len());
    let (url, member_url) = (deployment.url(), hosts.member_urls[2].clone());
    let (to_client, mut from_test) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
    let (to_test, mut from_client) = tokio::sync::mpsc::unbounded_channel::<String>();
    let client_host = hosts.lab.host(&hosts.clients[0]).netns().path();
    let client = spawn_runtime_in(client_host, 2, move || async move {
        let ttl = Duration::from_secs(30);
        let holder = lock_nats::connect(&member_url).await.expect("holder");
        let other = lock_nats::connect(&url).await.expect("other");
        let key = common::key("lab");
        let lease = holder.try_acquire(&key, ttl).await.unwrap().expect("free");
        let _ = to_test.send(format!("held, token {}", lease.token()));
        // After each fault: once the cluster answers, the key is still
        // the holder's.
        while let Some(fault) = from_test.recv().await {
            let until = tokio::time::Instant::now() + Duration::from_secs(30);
            let answer = loop {
                match other.try_acquire(&key, ttl).await {
                    Ok(answer) => break answer,
                    Err(e) if tokio::time::Instant::now() < until => {
                        assert!(e.is_unavailable() || e.is_timeout(), "{fault}: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => panic!("{fault}: no answer in 30 s: {e}"),
                }
            };
            assert!(answer.is_none(), "{fault}: an unexpired key was freed");
            let renewed = holder.renew(&lease).await.map(|_| "through");
            let _ = to_test.send(format!("{fault}: still held, renewal {renewed:?}"));
        }
        assert!(holder.release(&lease).await.unwrap());
        let next = other.try_acquire(&key, ttl).await.unwrap().expect("free");
        assert!(next.token() > lease.token(), "tokens keep rising");
        assert!(other.release(&next).await.unwrap());
    });
    let mut step = async |fault: &'static str| {
        if !fault.is_empty() {
            to_client.send(fault).expect("the client is gone");
        }
        let said = from_client.recv().await.expect("the client ended early");
        eprintln!("lab nats-cluster: {said}");
    };
    step("").await;
    assert!(deployment.fail_over().await.expect("a new stream leader"));
    step("leader killed").await;
    deployment
        .restart_nodes()
        .await
        .expect("the killed node back");
    step("killed node restarted").await;
    // The first node cut from its peers for 8 s, then healed.
    let servers: Vec<&str> = hosts.servers.iter().map(String::as_str).collect();
    hosts.lab.cut_from(servers[0], &servers[1..]).expect("cut");
    tokio::time::sleep(Duration::from_secs(8)).await;
    hosts.lab.heal().expect("heal");
    step("first node cut from its peers and healed").await;
    drop(to_client);
    tokio::task::spawn_blocking(move || client.join())
        .await
        .unwrap()
        .expect("the client panicked")
        .expect("the client entered its namespace");
}
