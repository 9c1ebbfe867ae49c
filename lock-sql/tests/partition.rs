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
//! to the TTL rounded up to whole seconds); PostgreSQL behind PgBouncer on
//! a lab host of its own (row mode through transaction pooling, session
//! mode through session pooling, where a PgBouncer keep-alive shorter than
//! the TTL must be caught); and transaction-scoped locks
//! ([`lock_sql::TransactionLocks`]) whose holder is cut off with its
//! transaction open ([`transaction_lock_cut_off`]).
//!
//! The check's broken variant: a holder whose client believes its leases
//! run an hour longer than they do must be caught.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{CLIENT_OPTIONS, with_options};
use conformance::OrSkip;
use conformance::doubles::{HourLongerLeases, flawed_opener};
use conformance::netns::Lab;
use conformance::scenarios::{
    Cut, HOLDER_HOST, Locate, OBSERVER_HOST, PartitionEnv, Verdict, all_partitions_selected,
    assert_caught, assert_cut_off_safe, assert_told_too_late_caught, assert_under_cut_safe,
    holder_cut_off,
};
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::pgbouncer::{PgBouncerServer, PoolMode};
use conformance::servers::postgres::PostgresServer;
use lock_core::LockBackend;
use lock_sql::sqlx;
use tokio::sync::oneshot;

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
                    // A quiet grant is published after the publication
                    // delay (10 ms; see lock-sql's "Published grants").
                    let mut ports: Vec<i32> = Vec::new();
                    for _ in 0..20 {
                        ports = sqlx::query_scalar(
                            "SELECT client_port FROM pg_stat_activity \
                             WHERE application_name LIKE 'distlock %'",
                        )
                        .fetch_all(&mut conn)
                        .await
                        .map_err(|e| e.to_string())?;
                        if !ports.is_empty() {
                            break;
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
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

/// PostgreSQL on the lab's `server` host, PgBouncer in front of it on its
/// own `pooler` host (the holder's isolation cuts it from both).
struct Pooled {
    bouncer: PgBouncerServer,
    started: Started<PostgresServer>,
}

async fn postgres_behind_pgbouncer(mode: PoolMode, settings: &[(&str, &str)]) -> Option<Pooled> {
    let lab = PartitionEnv::lab(&["server", "pooler"]).or_skip()?;
    let server = PostgresServer::start_in(&lab, "server").await.or_skip()?;
    let bouncer = PgBouncerServer::start_in_with(&lab, "pooler", &server, mode, settings)
        .await
        .or_skip()?;
    Some(Pooled {
        bouncer,
        started: Started { lab, server },
    })
}

/// Row mode through PgBouncer's transaction pooling (`pooler=transaction`):
/// the row's `expires_at` alone frees the key, whatever the pooler does
/// with the cut-off client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_mode_through_pgbouncer_transaction_pooling_frees_a_cut_off_holders_lock_only_after_its_deadline()
 {
    if !all_partitions_selected() {
        return;
    }
    let Some(pooled) = postgres_behind_pgbouncer(PoolMode::Transaction, &[]).await else {
        return;
    };
    let url = with_options(&pooled.bouncer.url(), "pooler=transaction");
    let env = env(
        &pooled.started,
        "postgres-pgbouncer-transaction",
        &url,
        opener(),
        ROW_TTL,
    );
    assert_cut_off_safe(&env, "postgres row through pgbouncer transaction pooling").await;
}

/// PgBouncer 1.18 refuses a client whose startup packet carries
/// `options`, which session mode's connections send (their server-side
/// settings): in front of session mode, it must ignore it.
const SESSION_POOLER: (&str, &str) = ("ignore_startup_parameters", "extra_float_digits,options");

/// Session mode through PgBouncer's session pooling, PgBouncer configured
/// with `settings` besides [`SESSION_POOLER`], the holder cut off from
/// everything: [`holder_cut_off`] and its report, printed under `label`.
async fn session_through_session_pooling(
    settings: &[(&str, &str)],
    label: &str,
) -> Option<conformance::scenarios::ScenarioReport> {
    if !all_partitions_selected() {
        return None;
    }
    let mut all = vec![SESSION_POOLER];
    all.extend_from_slice(settings);
    let pooled = postgres_behind_pgbouncer(PoolMode::Session, &all).await?;
    let url = with_options(&pooled.bouncer.url(), "mode=session");
    let env = env(
        &pooled.started,
        "postgres-session-pgbouncer-session",
        &url,
        opener(),
        SESSION_TTL,
    );
    let report = holder_cut_off(&env).await;
    eprintln!(
        "{label}: {:?}: {}: {:?}",
        report.verdict, report.detail, report.figures
    );
    Some(report)
}

/// Session mode through PgBouncer's session pooling with PgBouncer's
/// defaults (TCP keep-alive on, the system's timing: 2 h idle): PgBouncer
/// keeps the cut-off client's server connection, and the server ends it
/// by the `idle_session_timeout` the grant set to the TTL, which PgBouncer
/// passes on (seen: "terminating connection due to idle-session timeout",
/// about 9.8 s after a cut 6 s into a 12 s TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_through_pgbouncer_session_pooling_frees_a_cut_off_holders_lock_only_after_its_deadline()
 {
    let label = "postgres session through pgbouncer session pooling";
    if let Some(report) = session_through_session_pooling(&[], label).await {
        assert_eq!(report.verdict, Verdict::Safe, "{label}: {}", report.detail);
    }
}

/// PgBouncer's own keep-alive toward its clients ends a cut-off client's
/// connection, and in session pooling resets its server connection
/// (`DISCARD ALL`, which unlocks every advisory lock): bounded at or above
/// the TTL (idle 12 s, then 3 probes 1 s apart: 15 s after the last
/// packet), the lock is still freed only after the holder's deadline. (The
/// server's `idle_session_timeout`, the TTL after the last statement, ends
/// the session first here, as with the defaults.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_through_pgbouncer_with_its_keepalive_above_the_ttl_is_safe() {
    let label = "postgres session through pgbouncer session pooling, keep-alive 12+3x1 s";
    let keepalive = [
        ("tcp_keepidle", "12"),
        ("tcp_keepintvl", "1"),
        ("tcp_keepcnt", "3"),
    ];
    if let Some(report) = session_through_session_pooling(&keepalive, label).await {
        assert_eq!(report.verdict, Verdict::Safe, "{label}: {}", report.detail);
    }
}

/// The broken variant: PgBouncer's keep-alive shorter than the TTL (idle
/// 2 s, then 2 probes 1 s apart) drops the cut-off client about 4 s after
/// its last packet and unlocks its keys with `DISCARD ALL`, long before
/// the holder's deadline: the check must catch the other client's grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pgbouncer_keepalive_shorter_than_the_ttl_is_caught() {
    let label = "postgres session through pgbouncer session pooling, keep-alive 2+2x1 s (broken)";
    let keepalive = [
        ("tcp_keepidle", "2"),
        ("tcp_keepintvl", "1"),
        ("tcp_keepcnt", "2"),
    ];
    if let Some(report) = session_through_session_pooling(&keepalive, label).await {
        assert_caught(&report, label);
    }
}

/// How the holder of a transaction lock ends its transaction once its link
/// is back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Committer {
    /// `COMMIT` on the transaction that holds the lock; an error ends it.
    Honest,
    /// Broken: when `COMMIT` fails, it writes its work again on a fresh
    /// connection, without the lock (what the check must catch).
    RetriesWithoutTheLock,
}

/// How long the observer waits for a transaction lock the cut-off holder
/// keeps (a bound, not a timing assertion: past it the observer gives up).
const TX_OBSERVER_WAIT: Duration = Duration::from_secs(20);

/// Runs the future `make` returns on a runtime of its own in the namespace
/// of `lab`'s host `host` (every lab address is reached from there), and
/// waits for its result off this runtime's threads.
async fn on_host<F, Fut, T>(lab: &Lab, host: &str, make: F) -> Result<T, String>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T, String>>,
    T: Send + 'static,
{
    let handle = conformance::netns::spawn_runtime_in(lab.host(host).netns().path(), 2, make);
    join_host(handle, host).await
}

async fn join_host<T: Send + 'static>(
    handle: std::thread::JoinHandle<std::io::Result<Result<T, String>>>,
    host: &str,
) -> Result<T, String> {
    let host = host.to_owned();
    tokio::task::spawn_blocking(move || {
        handle
            .join()
            .map_err(|_| format!("the {host} thread panicked"))?
            .map_err(|e| format!("entering {host}: {e}"))?
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Who waits for the cut-off holder's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Observer {
    /// A transaction lock of its own (`lock_in`), its work row written in
    /// that transaction.
    Transaction,
    /// Session mode's lock of the same key (`mode=session`, the same
    /// advisory key), its work row written while it holds the lease.
    Session,
}

/// The observer's grant (when, and its token) or `None` when the key was
/// still held at the end of its wait; its work row written under the lock.
type Observed = Option<(std::time::Instant, u64)>;

async fn write_work(conn: &mut sqlx::PgConnection, who: &str, token: u64) -> Result<(), String> {
    sqlx::query("INSERT INTO partition_work (who, token) VALUES ($1, $2)")
        .bind(who)
        .bind(i64::try_from(token).map_err(|e| e.to_string())?)
        .execute(conn)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

async fn observe_with_a_transaction_lock(
    url: &str,
    locks_url: &str,
    key: &lock_core::LockKey,
) -> Result<Observed, String> {
    use lock_sql::sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let locks = lock_sql::TransactionLocks::from_url(locks_url).map_err(|e| e.to_string())?;
    let mut tx = conn.begin().await.map_err(|e| e.to_string())?;
    let granted = match locks.lock_in(&mut tx, key, TX_OBSERVER_WAIT).await {
        Ok(mut guard) => {
            let at = std::time::Instant::now();
            let token = guard.token().get();
            write_work(guard.conn(), "observer", token).await?;
            Some((at, token))
        }
        Err(e) if e.kind() == lock_core::ErrorKind::Contended => None,
        Err(e) => return Err(format!("observer lock: {e}")),
    };
    tx.commit().await.map_err(|e| e.to_string())?;
    Ok(granted)
}

async fn observe_with_a_session_lock(
    url: &str,
    key: &lock_core::LockKey,
) -> Result<Observed, String> {
    use lock_core::LockBackendExt;
    use lock_sql::sqlx::Connection;
    let backend = lock_sql::connect(&with_options(
        url,
        &format!("mode=session&{CLIENT_OPTIONS}"),
    ))
    .await
    .map_err(|e| format!("observer client: {e}"))?;
    let deadline = tokio::time::Instant::now() + TX_OBSERVER_WAIT;
    let lease = match backend.acquire(key, SESSION_TTL, deadline).await {
        Ok(lease) => lease,
        Err(e) if e.kind() == lock_core::ErrorKind::Contended => return Ok(None),
        Err(e) => return Err(format!("observer lock: {e}")),
    };
    let at = std::time::Instant::now();
    let token = lease.token().get();
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    write_work(&mut conn, "observer", token).await?;
    backend.release(&lease).await.map_err(|e| e.to_string())?;
    Ok(Some((at, token)))
}

/// What the holder's transaction came to.
#[derive(Debug)]
struct HolderEnd {
    /// `COMMIT`'s answer.
    commit: Result<(), String>,
    /// The broken holder's write on a fresh connection, if it made one.
    retried: Option<Result<(), String>>,
}

/// The transaction-lock partition scenario: the holder (on the lab's
/// holder host, its connection opened with `settings` as server settings,
/// as a caller would) begins a transaction, takes the key's transaction
/// lock (`mode=session` URL: `pg_advisory_xact_lock`), writes its work row
/// and keeps the transaction open; its host is isolated; the observer, on
/// another host, waits up to [`TX_OBSERVER_WAIT`] for the same key's
/// transaction lock and, granted, writes its own work row and commits;
/// then the link heals and the holder commits. Judged from the work
/// table: if the observer was granted, none of the holder's work may have
/// landed (its transaction, which the server must have ended to free the
/// lock, cannot commit), or the holder's work landed beside the next
/// holder's. Printed under `label` as `label: Verdict: detail: figures`.
async fn transaction_lock_cut_off(
    settings: &'static [(&'static str, &'static str)],
    committer: Committer,
    observer: Observer,
    label: &str,
) -> Option<(Verdict, String)> {
    if !all_partitions_selected() {
        return None;
    }
    let started = postgres().await?;
    let outcome = transaction_lock_scenario(&started, settings, committer, observer).await;
    let (verdict, detail, figures) = match outcome {
        Ok(judged) => judged,
        Err(e) => (Verdict::Violation, e, BTreeMap::new()),
    };
    eprintln!("{label}: {verdict:?}: {detail}: {figures:?}");
    Some((verdict, detail))
}

type Judged = (Verdict, String, BTreeMap<&'static str, String>);

async fn transaction_lock_scenario(
    started: &Started<PostgresServer>,
    settings: &'static [(&'static str, &'static str)],
    committer: Committer,
    observer: Observer,
) -> Result<Judged, String> {
    use lock_sql::sqlx::Connection;
    use lock_sql::sqlx::postgres::{PgConnectOptions, PgConnection};

    let lab = &started.lab;
    let server_url = started.server.url();
    let locks_url = with_options(&server_url, "mode=session&timeout=5s");
    let key = lock_core::LockKey::new("tx-cut-off").map_err(|e| e.to_string())?;
    let str_err = |e: &dyn std::fmt::Display| e.to_string();

    // The work table and the token sequence, from the observer's host.
    let (url, lurl) = (server_url.clone(), locks_url.clone());
    on_host(lab, OBSERVER_HOST, move || async move {
        let mut conn = PgConnection::connect(&url).await.map_err(|e| str_err(&e))?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS partition_work (who text NOT NULL, token bigint NOT NULL)",
        )
        .execute(&mut conn)
        .await
        .map_err(|e| str_err(&e))?;
        let pool = sqlx::PgPool::connect(&url).await.map_err(|e| str_err(&e))?;
        let locks = lock_sql::TransactionLocks::from_url(&lurl).map_err(|e| str_err(&e))?;
        locks.prepare(&pool).await.map_err(|e| str_err(&e))?;
        pool.close().await;
        Ok(())
    })
    .await?;

    // The holder: takes the lock, writes, and waits with its transaction
    // open until told to commit.
    let (held_tx, held_rx) = oneshot::channel::<u64>();
    let (commit_tx, commit_rx) = oneshot::channel::<()>();
    let (url, lurl, hkey) = (server_url.clone(), locks_url.clone(), key.clone());
    let holder = conformance::netns::spawn_runtime_in(
        lab.host(HOLDER_HOST).netns().path(),
        2,
        move || async move {
            let options: PgConnectOptions = url.parse().map_err(|e| str_err(&e))?;
            let options = options.options(settings.iter().copied());
            let mut conn = PgConnection::connect_with(&options)
                .await
                .map_err(|e| str_err(&e))?;
            let locks = lock_sql::TransactionLocks::from_url(&lurl).map_err(|e| str_err(&e))?;
            let mut tx = conn.begin().await.map_err(|e| str_err(&e))?;
            let token = {
                let mut guard = locks
                    .lock_in(&mut tx, &hkey, Duration::from_secs(5))
                    .await
                    .map_err(|e| format!("holder lock: {e}"))?;
                let token = guard.token().get();
                write_work(guard.conn(), "holder", token).await?;
                token
            };
            let _ = held_tx.send(token);
            let _ = commit_rx.await;
            let commit = match tokio::time::timeout(Duration::from_secs(15), tx.commit()).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("COMMIT got no answer within 15 s".to_owned()),
            };
            let retried = match (&commit, committer) {
                (Err(_), Committer::RetriesWithoutTheLock) => Some(
                    async {
                        let mut fresh = PgConnection::connect_with(&options)
                            .await
                            .map_err(|e| str_err(&e))?;
                        write_work(&mut fresh, "holder", token).await
                    }
                    .await,
                ),
                _ => None,
            };
            Ok(HolderEnd { commit, retried })
        },
    );
    let Ok(holder_token) = held_rx.await else {
        return Err(format!(
            "the holder did not take the lock: {:?}",
            join_host(holder, HOLDER_HOST).await
        ));
    };

    // The holder sits idle in its transaction for a second before the
    // cut. Cut at once, the keep-alive variant once kept the key through
    // the whole wait (granted about 4.5 s after the cut in the other
    // runs); most likely the server's answer to the INSERT was still
    // unacknowledged (the client's delayed ACK), and TCP sends no
    // keep-alive probe while data is unacknowledged: the retransmissions
    // (about 15 min by default, bounded by `tcp_user_timeout`) end the
    // session instead.
    tokio::time::sleep(Duration::from_secs(1)).await;
    lab.isolate(HOLDER_HOST)
        .map_err(|e| format!("isolating the holder: {e}"))?;
    let cut_at = std::time::Instant::now();

    // The observer: the same key, waiting at most TX_OBSERVER_WAIT.
    let (url, lurl, okey) = (server_url.clone(), locks_url.clone(), key.clone());
    let observed = on_host(lab, OBSERVER_HOST, move || async move {
        match observer {
            Observer::Transaction => observe_with_a_transaction_lock(&url, &lurl, &okey).await,
            Observer::Session => observe_with_a_session_lock(&url, &okey).await,
        }
    })
    .await;

    let healed = lab.heal();
    let _ = commit_tx.send(());
    let end = join_host(holder, HOLDER_HOST).await;
    healed.map_err(|e| format!("healing: {e}"))?;
    let observed = observed?;
    let end = end?;

    // After the holder's commit (or its failure) the key must be free.
    let (url, lurl, akey) = (server_url.clone(), locks_url.clone(), key.clone());
    let (rows, free_after) = on_host(lab, OBSERVER_HOST, move || async move {
        let mut conn = PgConnection::connect(&url).await.map_err(|e| str_err(&e))?;
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT who, token FROM partition_work ORDER BY token, who")
                .fetch_all(&mut conn)
                .await
                .map_err(|e| str_err(&e))?;
        let locks = lock_sql::TransactionLocks::from_url(&lurl).map_err(|e| str_err(&e))?;
        let mut tx = conn.begin().await.map_err(|e| str_err(&e))?;
        let free = locks
            .lock_in(&mut tx, &akey, Duration::from_secs(5))
            .await
            .is_ok();
        tx.rollback().await.map_err(|e| str_err(&e))?;
        Ok((rows, free))
    })
    .await?;

    let holder_rows = rows.iter().filter(|(who, _)| who == "holder").count();
    let mut figures = BTreeMap::new();
    figures.insert("holder_token", holder_token.to_string());
    figures.insert("work_rows", format!("{rows:?}"));
    figures.insert("holder_commit", format!("{:?}", end.commit));
    if let Some(retried) = &end.retried {
        figures.insert("holder_retry_without_lock", format!("{retried:?}"));
    }
    figures.insert("key_free_after_the_holder_ended", free_after.to_string());
    let judged = match observed {
        Some((at, token)) => {
            let after = at.duration_since(cut_at);
            figures.insert(
                "observer_granted_after_cut_ms",
                after.as_millis().to_string(),
            );
            figures.insert("observer_token", token.to_string());
            if holder_rows > 0 {
                (
                    Verdict::Violation,
                    format!(
                        "the observer was granted {after:?} after the cut (token {token}) and the \
                         cut-off holder's work (token {holder_token}) landed too: {holder_rows} \
                         holder row(s) beside the next holder's"
                    ),
                    figures,
                )
            } else {
                (
                    Verdict::Safe,
                    format!(
                        "the observer was granted {after:?} after the cut; the holder's COMMIT \
                         failed after the heal ({}) and none of its work landed",
                        end.commit
                            .as_ref()
                            .err()
                            .map_or("it succeeded?", String::as_str)
                    ),
                    figures,
                )
            }
        }
        None => (
            if free_after {
                Verdict::Safe
            } else {
                Verdict::Violation
            },
            format!(
                "the key was not freed within {TX_OBSERVER_WAIT:?} of the cut (the observer gave \
                 up); the holder's COMMIT after the heal: {:?}; the key free after it: {free_after}",
                end.commit
            ),
            figures,
        ),
    };
    Ok(judged)
}

/// Caller's server settings as PostgreSQL's defaults leave them: nothing
/// ends an idle-in-transaction session but the TCP keep-alive at the
/// system's timing (2 h idle), so the cut-off holder keeps the key through
/// the observer's whole wait, and commits after the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_lock_of_a_cut_off_holder_with_server_defaults() {
    let label = "postgres transaction lock, server defaults";
    if let Some((verdict, detail)) =
        transaction_lock_cut_off(&[], Committer::Honest, Observer::Transaction, label).await
    {
        assert_eq!(verdict, Verdict::Safe, "{label}: {detail}");
    }
}

/// `idle_in_transaction_session_timeout` on the holder's connection: the
/// server ends the cut-off holder's session (and its transaction, and the
/// lock) that long after its last statement; the holder's COMMIT after the
/// heal must fail.
const IDLE_IN_TX: &[(&str, &str)] = &[("idle_in_transaction_session_timeout", "5s")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_lock_of_a_cut_off_holder_ended_by_idle_in_transaction_timeout() {
    let label = "postgres transaction lock, idle_in_transaction_session_timeout=5s";
    if let Some((verdict, detail)) =
        transaction_lock_cut_off(IDLE_IN_TX, Committer::Honest, Observer::Transaction, label).await
    {
        assert_eq!(verdict, Verdict::Safe, "{label}: {detail}");
    }
}

/// The server's TCP keep-alive on the holder's connection (idle 3 s, then 2
/// probes 1 s apart): the server ends the cut-off holder's session about
/// 5 s after its last packet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_lock_of_a_cut_off_holder_ended_by_the_servers_keepalive() {
    let label = "postgres transaction lock, server keep-alive 3+2x1 s";
    let keepalive = &[
        ("tcp_keepalives_idle", "3"),
        ("tcp_keepalives_interval", "1"),
        ("tcp_keepalives_count", "2"),
    ];
    if let Some((verdict, detail)) =
        transaction_lock_cut_off(keepalive, Committer::Honest, Observer::Transaction, label).await
    {
        assert_eq!(verdict, Verdict::Safe, "{label}: {detail}");
    }
}

/// The broken variant: a holder whose COMMIT failed writes its work again
/// on a fresh connection, without the lock, after the observer was
/// granted. The check must report its work landing beside the next
/// holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_lock_holder_that_retries_its_work_without_the_lock_is_caught() {
    let label = "postgres transaction lock, holder retrying without the lock (broken)";
    if let Some((verdict, detail)) = transaction_lock_cut_off(
        IDLE_IN_TX,
        Committer::RetriesWithoutTheLock,
        Observer::Transaction,
        label,
    )
    .await
    {
        assert_eq!(verdict, Verdict::Violation, "{label}: {detail}");
        assert!(detail.contains("landed too"), "{label}: {detail}");
    }
}

/// As [`a_transaction_lock_of_a_cut_off_holder_ended_by_idle_in_transaction_timeout`],
/// the observer waiting with session mode's lock of the same key (a
/// transaction lock of a `mode=session` URL takes session mode's advisory
/// key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_lock_of_a_cut_off_holder_and_a_session_mode_observer() {
    let label =
        "postgres transaction lock, idle_in_transaction_session_timeout=5s, session-mode observer";
    if let Some((verdict, detail)) =
        transaction_lock_cut_off(IDLE_IN_TX, Committer::Honest, Observer::Session, label).await
    {
        assert_eq!(verdict, Verdict::Safe, "{label}: {detail}");
    }
}
