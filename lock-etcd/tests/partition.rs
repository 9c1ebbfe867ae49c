//! etcd under a real partition (in the kernel, see `lock_testkit::netns`):
//! the holder's host is cut off from a single member and from a
//! three-member cluster; the session lease the holder can no longer keep
//! alive expires on the server, which must come after the holder's
//! deadline (its lost signal). The broken variant: a holder told an hour
//! late is caught.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::suite_opener;
use conformance::OrSkip;
use conformance::doubles::{HourLongerLeases, flawed_opener};
use conformance::scenarios::{PartitionEnv, Verdict, holder_cut_off};
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
    let report = holder_cut_off(&env).await;
    eprintln!(
        "{} members: {}: {:?}",
        members.len(),
        report.detail,
        report.figures
    );
    assert_eq!(report.verdict, Verdict::Safe, "{}", report.detail);
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
    let report = holder_cut_off(&env).await;
    assert_eq!(report.verdict, Verdict::Violation, "{}", report.detail);
    assert!(report.detail.contains("granted"), "{}", report.detail);
}
