//! Session mode on MariaDB 10.11 started by the harness: the whole
//! conformance suite and the session scenarios (see session_common).

mod session_common;

use conformance::{Harness, OrSkip, run_suite};
use session_common::SessionTarget;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_session() {
    let Some(target) = SessionTarget::mariadb().await.or_skip() else {
        return;
    };
    run_suite(&Harness::new(target.deployed.clone()))
        .await
        .assert_passed();
    session_common::round_trips(&target).await;
    session_common::rows::mysql_token_rows(&target).await;
    session_common::rows::mariadb_waiting_grant_window(&target).await;
    session_common::rows::mariadb_publication_race(&target).await;
    session_common::scenarios(&target).await;
    // The torn-reply check's broken variant: sqlx's MySQL reader reads the
    // rest of the dropped try's reply as the next call's.
    let broken = session_common::torn_reply_leaves_no_half_read_session(&target, false).await;
    assert!(
        matches!(broken, session_common::Torn::Broken(_)),
        "the torn-reply check's broken variant was not caught: {broken:?}"
    );
}
