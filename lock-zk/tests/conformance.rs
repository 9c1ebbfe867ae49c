//! The shared conformance suite against real ZooKeeper servers started here:
//! a standalone server, and a 3-member ensemble.

mod common;

use std::sync::Arc;

use common::ZkTarget;
use conformance::{Harness, run_suite};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_on_a_single_server() {
    let Some(target) = ZkTarget::single().await else {
        return;
    };
    let harness = Harness::new(Arc::new(target));
    let report = run_suite(&harness).await;
    println!("{}", report.table());
    report.assert_passed();
}
