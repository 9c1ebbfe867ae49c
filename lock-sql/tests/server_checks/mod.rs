//! What every server deployment (PostgreSQL, MariaDB) is put through before
//! its own checks: the whole conformance suite, the benchmark floor, fair
//! mode (the mutex cases with FIFO, and the fair checks), `try_acquire_all`
//! and the operating calls.

use std::sync::Arc;

use conformance::deploy::DeployedTarget;
use conformance::{Harness, OrSkip, run_suite};

use crate::{admin_checks, common, fair_checks, multi_checks};

/// Starts a deployment of `kind` (`postgres`, `mariadb`) and runs the
/// shared checks on it; the deployment and its clients' URL, or `None`
/// where the server is missing (a printed skip locally, a failure in CI).
pub(crate) async fn deployed_and_checked(kind: &str) -> Option<(Arc<DeployedTarget>, String)> {
    let target = common::deployed(kind).await.or_skip()?;
    let url = common::client_url(&target);
    run_suite(&Harness::new(target.clone()))
        .await
        .assert_passed();
    common::check_floor(&url).await;
    // Fair mode on the same server: the mutex cases (FIFO included) and
    // the fair checks (their broken variants run on SQLite: the same
    // checks, dialect-independent doubles).
    fair_checks::run_fair_suite(kind, &url).await;
    fair_checks::fair_checks(&url).await;
    multi_checks::multi_checks(&url).await;
    admin_checks::admin_checks(&url).await;
    Some((target, url))
}
