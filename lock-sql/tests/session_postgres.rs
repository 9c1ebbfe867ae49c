//! Session mode on PostgreSQL 15 started by the harness: the whole
//! conformance suite and the session scenarios (see session_common).

mod session_common;

use std::time::Duration;

use conformance::{Harness, OrSkip, run_suite};
use session_common::SessionTarget;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_session() {
    let Some(target) = SessionTarget::postgres().await.or_skip() else {
        return;
    };
    run_suite(&Harness::new(target.deployed.clone()))
        .await
        .assert_passed();
    session_common::round_trips(&target).await;
    session_common::rows::postgres_lists_nothing(&target).await;
    session_common::tokens_across_clients(&target).await;
    session_common::dropped_wait(&target).await;
    session_common::unrenewed_lease_expires(&target, Duration::from_secs(1)).await;
    session_common::force_released(&target).await;
    session_common::force_release_spares_foreign_sessions(&target).await;
    session_common::killed_session(&target, false).await;
    session_common::killed_session(&target, true).await;
    session_common::partition(&target, Duration::from_secs(2)).await;
}
