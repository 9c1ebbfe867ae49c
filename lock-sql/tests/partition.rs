//! The SQL backends under a real partition (in the kernel, see
//! `lock_testkit::netns`): the holder's connection is cut off, the server
//! sees a silent client, and whatever it does about that (keep-alive
//! probes, `idle_session_timeout`, `wait_timeout`) must not free the lock
//! before the holder's deadline.
//!
//! PostgreSQL session mode runs by default. Before the grant moved the
//! server's keep-alive out to the TTL, the server ended the cut-off
//! session about 8 s after its last packet and another client was granted
//! the key seconds before the holder was told (a 12 s TTL here).
//!
//! The others are long (a lab and a server per test) and run only when
//! asked, `DISTLOCK_PARTITIONS=all cargo test -p lock-sql --test
//! partition` (otherwise they print `skipped: set DISTLOCK_PARTITIONS=all`):
//! PostgreSQL row mode, MariaDB row mode and MariaDB session mode
//! (`GET_LOCK`, the session ended by `wait_timeout`, which the grant sets
//! to the TTL rounded up to whole seconds).
//!
//! The check's broken variant: a holder whose client believes its leases
//! run an hour longer than they do must be caught.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{CLIENT_OPTIONS, with_options};
use conformance::OrSkip;
use conformance::doubles::{HourLongerLeases, flawed_opener};
use conformance::netns::Lab;
use conformance::scenarios::{
    Cut, Locate, OBSERVER_HOST, PartitionEnv, all_partitions_selected, assert_cut_off_safe,
    assert_told_too_late_caught, assert_under_cut_safe,
};
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use lock_core::LockBackend;

/// Session mode: longer than the 8 s that the server's default-ish
/// keep-alive (5 s idle, 3 probes 1 s apart) took to end a silent
/// PostgreSQL session, so that a server-side liveness check shorter than
/// this shows.
const SESSION_TTL: Duration = Duration::from_secs(12);

/// Row mode: the row's `expires_at` alone frees the key.
const ROW_TTL: Duration = Duration::from_secs(4);

/// Clients of either mode (the URL says which), with the suite's short
/// operation timeouts.
fn opener() -> conformance::deploy::Opener {
    Arc::new(|url: String| {
        Box::pin(async move {
            let backend = lock_sql::connect(&with_options(&url, CLIENT_OPTIONS)).await?;
            Ok(Arc::new(backend) as Arc<dyn LockBackend>)
        })
    })
}

/// The lab and the server of one test, kept until its end.
struct Started<S> {
    lab: Arc<Lab>,
    server: S,
}

async fn postgres() -> Option<Started<PostgresServer>> {
    let lab = PartitionEnv::lab(&["server"]).or_skip()?;
    let server = PostgresServer::start_in(&lab, "server").await.or_skip()?;
    Some(Started { lab, server })
}

async fn mariadb() -> Option<Started<MariaDbServer>> {
    let lab = PartitionEnv::lab(&["server"]).or_skip()?;
    let server = MariaDbServer::start_in(&lab, "server").await.or_skip()?;
    Some(Started { lab, server })
}

fn env<S>(
    started: &Started<S>,
    name: &str,
    url: &str,
    holder: conformance::deploy::Opener,
    ttl: Duration,
) -> PartitionEnv {
    PartitionEnv::on_url(started.lab.clone(), name, url, holder, opener(), ttl)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_frees_a_cut_off_holders_lock_only_after_its_deadline() {
    let Some(started) = postgres().await else {
        return;
    };
    let url = with_options(&started.server.url(), "mode=session");
    let env = env(&started, "postgres-session", &url, opener(), SESSION_TTL);
    assert_cut_off_safe(&env, "postgres session").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_told_too_late_is_caught() {
    let Some(started) = postgres().await else {
        return;
    };
    let url = with_options(&started.server.url(), "mode=session");
    let flawed = flawed_opener(opener(), Arc::new(HourLongerLeases));
    let env = env(&started, "postgres-session", &url, flawed, SESSION_TTL);
    assert_told_too_late_caught(&env, "postgres session").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_mode_on_postgres_frees_a_cut_off_holders_lock_only_after_its_deadline() {
    if !all_partitions_selected() {
        return;
    }
    let Some(started) = postgres().await else {
        return;
    };
    let url = started.server.url();
    let env = env(&started, "postgres", &url, opener(), ROW_TTL);
    assert_cut_off_safe(&env, "postgres row").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_mode_on_mariadb_frees_a_cut_off_holders_lock_only_after_its_deadline() {
    if !all_partitions_selected() {
        return;
    }
    let Some(started) = mariadb().await else {
        return;
    };
    let url = started.server.url();
    let env = env(&started, "mariadb", &url, opener(), ROW_TTL);
    assert_cut_off_safe(&env, "mariadb row").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_on_mariadb_frees_a_cut_off_holders_lock_only_after_its_deadline() {
    if !all_partitions_selected() {
        return;
    }
    let Some(started) = mariadb().await else {
        return;
    };
    let url = with_options(&started.server.url(), "mode=session");
    let env = env(&started, "mariadb-session", &url, opener(), SESSION_TTL);
    assert_cut_off_safe(&env, "mariadb session").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_session_holder_told_too_late_is_caught() {
    if !all_partitions_selected() {
        return;
    }
    let Some(started) = mariadb().await else {
        return;
    };
    let url = with_options(&started.server.url(), "mode=session");
    let flawed = flawed_opener(opener(), Arc::new(HourLongerLeases));
    let env = env(&started, "mariadb-session", &url, flawed, SESSION_TTL);
    assert_told_too_late_caught(&env, "mariadb session").await;
}

/// The client port of the session that holds a lock, as the server sees it
/// (`pg_stat_activity`, the holder's `application_name`), asked from the
/// observer's host.
fn holding_session_port(lab: Arc<Lab>, url: String) -> Locate {
    Locate(Arc::new(move || {
        let (lab, url) = (lab.clone(), url.clone());
        Box::pin(async move {
            let thread = lab.host(OBSERVER_HOST).netns().spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                runtime.block_on(async {
                    use sqlx::Connection;
                    let mut conn = sqlx::PgConnection::connect(&url)
                        .await
                        .map_err(|e| e.to_string())?;
                    let ports: Vec<i32> = sqlx::query_scalar(
                        "SELECT client_port FROM pg_stat_activity \
                         WHERE application_name LIKE 'distlock %'",
                    )
                    .fetch_all(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                    match ports.as_slice() {
                        [port] => u16::try_from(*port).map_err(|e| e.to_string()),
                        other => Err(format!(
                            "expected one holding session, found ports {other:?}"
                        )),
                    }
                })
            });
            tokio::task::spawn_blocking(move || {
                thread
                    .join()
                    .map_err(|_| "the locating thread panicked".to_owned())?
                    .map_err(|e| e.to_string())?
            })
            .await
            .map_err(|e| e.to_string())?
        })
    }))
}

/// Only the connection that holds the lock is cut; the holder's pool keeps
/// its other connections. Its renewal must still fail (it runs on the
/// holding session, not on any pooled connection), and the server must not
/// end the session before the holder's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_with_only_its_holding_connection_cut_is_told_first() {
    if !all_partitions_selected() {
        return;
    }
    let Some(started) = postgres().await else {
        return;
    };
    let url = with_options(&started.server.url(), "mode=session");
    let env = env(&started, "postgres-session", &url, opener(), SESSION_TTL);
    let port = started
        .server
        .url()
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next()?.parse::<u16>().ok())
        .expect("a port in the server's URL");
    let cut = Cut::HolderConnection {
        server: "server".to_owned(),
        port,
        locate: holding_session_port(started.lab.clone(), started.server.url()),
    };
    assert_under_cut_safe(&env, &cut, "postgres session, holding connection cut").await;
}
