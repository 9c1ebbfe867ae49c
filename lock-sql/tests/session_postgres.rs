//! Session mode on PostgreSQL 15 started by the harness: the whole
//! conformance suite and the session scenarios (see session_common).

mod session_common;

use std::sync::Arc;

use conformance::{Harness, OrSkip, run_suite};
use session_common::SessionTarget;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_session() {
    let Some(target) = SessionTarget::postgres().await.or_skip() else {
        return;
    };
    let target = Arc::new(target);
    run_suite(&Harness::new(target.clone()))
        .await
        .assert_passed();
}
