//! Session mode on PostgreSQL 15 started by the harness: the whole
//! conformance suite and the session scenarios (see session_common).

mod session_common;

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
    session_common::rows::postgres_quiet_publication(&target).await;
    session_common::scenarios(&target).await;
    // The torn-reply check's broken variant, observed: sqlx's PostgreSQL
    // reader takes a message only once it is whole, so a dropped statement
    // leaves nothing half read, and this variant may well serve on.
    let observed = session_common::torn_reply_leaves_no_half_read_session(&target, false).await;
    println!("postgres, torn-reply broken variant: {observed:?}");
}
