//! PostgreSQL session mode under a real partition (in the kernel, see
//! `lock_testkit::netns`): the holder's connection is cut off, the server
//! sees a silent client, and whatever it does about that (keep-alive
//! probes, `idle_session_timeout`) must not free the lock before the
//! holder's deadline. Before the grant moved the server's keep-alive out to
//! the TTL, the server ended the cut-off session about 8 s after its last
//! packet and another client was granted the key seconds before the
//! holder was told (a 12 s TTL here).
//!
//! The check's broken variant: a holder whose client believes its leases
//! run an hour longer than they do must be caught.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{CLIENT_OPTIONS, UrlTarget, with_options};
use conformance::OrSkip;
use conformance::doubles::{HourLongerLeases, flawed_opener};
use conformance::netns::Lab;
use conformance::scenarios::{HOLDER_HOST, OBSERVER_HOST, PartitionEnv, Verdict, holder_cut_off};
use conformance::servers::postgres::PostgresServer;
use lock_core::LockBackend;

/// Longer than the 8 s that the server's default-ish keep-alive (5 s idle,
/// 3 probes 1 s apart) took to end a silent session.
const TTL: Duration = Duration::from_secs(12);

/// Session-mode clients, with the suite's short operation timeouts.
fn opener() -> conformance::deploy::Opener {
    Arc::new(|url: String| {
        Box::pin(async move {
            let backend = lock_sql::connect(&with_options(&url, CLIENT_OPTIONS)).await?;
            Ok(Arc::new(backend) as Arc<dyn LockBackend>)
        })
    })
}

struct Started {
    lab: Arc<Lab>,
    server: PostgresServer,
}

async fn started() -> Option<Started> {
    let lab = Arc::new(Lab::new(&["server", HOLDER_HOST, OBSERVER_HOST]).or_skip()?);
    let server = PostgresServer::start_in(&lab, "server").await.or_skip()?;
    Some(Started { lab, server })
}

fn env(started: &Started, holder: conformance::deploy::Opener) -> PartitionEnv {
    let url = with_options(
        &started.server.url_at(started.lab.host("server").addr()),
        "mode=session",
    );
    PartitionEnv {
        lab: started.lab.clone(),
        holder: Arc::new(UrlTarget {
            name: "postgres-session".into(),
            url: url.clone(),
            open: holder,
        }),
        observer: Arc::new(UrlTarget {
            name: "postgres-session".into(),
            url,
            open: opener(),
        }),
        ttl: TTL,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_frees_a_cut_off_holders_lock_only_after_its_deadline() {
    let Some(started) = started().await else {
        return;
    };
    let report = holder_cut_off(&env(&started, opener())).await;
    eprintln!("{}: {:?}", report.detail, report.figures);
    assert_eq!(report.verdict, Verdict::Safe, "{}", report.detail);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_told_too_late_is_caught() {
    let Some(started) = started().await else {
        return;
    };
    let flawed = flawed_opener(opener(), Arc::new(HourLongerLeases));
    let started_at = Instant::now();
    let report = holder_cut_off(&env(&started, flawed)).await;
    assert_eq!(
        report.verdict,
        Verdict::Violation,
        "{} (after {:?})",
        report.detail,
        started_at.elapsed()
    );
    // Caught for the right reason: the grant came first, not an error.
    assert!(report.detail.contains("granted"), "{}", report.detail);
}
