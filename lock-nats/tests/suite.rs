//! The whole conformance suite through the facade, on one nats-server and
//! on a 3-node JetStream cluster (the bucket's stream with replicas 3).

mod common;

use std::sync::Arc;

use conformance::{Harness, Target, run_suite};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_on_a_single_server() {
    assert!(distlock::supported_schemes().contains(&"nats"));
    let Some(target) = common::deployed("nats").await else {
        return;
    };
    assert_eq!(target.client().await.unwrap().name(), "nats");
    run_suite(&Harness::new(Arc::new(target)))
        .await
        .assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_on_a_three_node_cluster() {
    let Some(target) = common::deployed("nats-cluster").await else {
        return;
    };
    run_suite(&Harness::new(Arc::new(target)))
        .await
        .assert_passed();
}
