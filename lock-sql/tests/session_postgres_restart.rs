//! PostgreSQL session mode across crashes of the server: the tokens rise
//! across (a) a SIGKILL of one backend, after which the postmaster ends
//! every session and re-initialises (crash recovery, the postmaster stays
//! up), and (b) an immediate stop (`pg_ctl stop -m immediate`: SIGQUIT to
//! the postmaster, no shutdown checkpoint) and a start on the same data
//! directory.
//!
//! The tokens come from an `UNLOGGED` sequence, which crash recovery
//! resets to its start (1): the driver lifts each server run's tokens
//! above the runs before with a durable epoch (`<table>_session_runs`,
//! bumped once per run) that the first client of a run writes into the
//! sequence (`setval(seq, epoch << 40)`). The broken variant is the
//! unlogged sequence alone, read right after each crash: the same check
//! catches it going back. Transaction-scoped locks (`TransactionLocks`),
//! which take the same sequence, start a run themselves.

use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::postgres::PostgresServer;
use lock_core::{LockBackend, LockBackendExt, LockKey, OwnerId};
use lock_sql::sqlx::{self, Connection};
use lock_sql::{SqlSessionBackend, TransactionLocks};

mod restart_common;

use restart_common::{TTL, caught_going_back, grants, rises_above};

/// A connection once the server accepts queries again (crash recovery
/// takes a moment after the postmaster re-initialises).
async fn connect_again(url: &str) -> sqlx::PgConnection {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match sqlx::PgConnection::connect(url).await {
            Ok(mut conn) => {
                if sqlx::query("SELECT 1").execute(&mut conn).await.is_ok() {
                    return conn;
                }
            }
            Err(e) => assert!(
                std::time::Instant::now() < until,
                "the server did not come back: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The broken variant: the unlogged sequence alone (no epoch), read
/// before any client started the new run.
async fn sequence_alone(conn: &mut sqlx::PgConnection, seq: &str) -> u64 {
    let value: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT nextval('{seq}')")))
        .fetch_one(conn)
        .await
        .unwrap();
    u64::try_from(value).unwrap()
}

/// SIGKILL of one backend: the postmaster ends every other session and
/// runs crash recovery while it stays up.
async fn kill_one_backend(url: &str) {
    let mut victim = sqlx::PgConnection::connect(url).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut victim)
        .await
        .unwrap();
    // SAFETY: kill(2) of a process id the server just named; no memory
    // preconditions.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    drop(victim);
}

/// `pg_ctl stop -m immediate`: SIGQUIT to the postmaster, which ends its
/// backends and exits without a checkpoint; then a start on the same data
/// directory (crash recovery).
async fn immediate_stop_and_start(server: &mut PostgresServer) {
    let pid = server.process().pid().expect("postmaster running");
    let pid = libc::pid_t::try_from(pid).unwrap();
    // SAFETY: as above, the postmaster's own pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGQUIT) }, 0);
    let until = std::time::Instant::now() + Duration::from_secs(20);
    // The postmaster is the test kit's child: it stays a zombie until
    // reaped, so wait for its state, not for its /proc entry.
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        if matches!(state, None | Some("Z" | "X")) {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the postmaster did not exit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.restart().await.unwrap();
}

/// Whether the server log says `needle` within 30 s (the postmaster
/// notices a killed backend a moment later; a connection accepted before
/// that is ended by the re-initialisation).
async fn log_says(server: &PostgresServer, needle: &str) -> bool {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(server.dir().join("postgres.log")).unwrap_or_default();
        if log.contains(needle) {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_server_crashes() {
    let Some(mut server) = PostgresServer::start().await.or_skip() else {
        return;
    };
    let url = format!("{}?mode=session&timeout=2s&pool_size=2", server.url());
    let prefix = format!("restart{}", &OwnerId::random().to_hex()[..8]);
    let backend = SqlSessionBackend::connect_url(&url).await.unwrap();
    let seq = backend.token_counter().to_owned();
    let mut all = grants(&backend, &prefix, 40).await;
    assert!(
        all.windows(2).all(|w| w[0] < w[1]),
        "tokens rise across keys: {all:?}"
    );
    assert!(all[0] > 1 << 40, "the first run's tokens: {}", all[0]);

    // (a) SIGKILL of one backend; the transaction locks start the run.
    kill_one_backend(&server.url()).await;
    assert!(
        log_says(&server, "all server processes terminated; reinitializing").await,
        "no crash recovery in the log"
    );
    let mut raw = connect_again(&server.url()).await;
    let alone = sequence_alone(&mut raw, &seq).await;
    caught_going_back(
        "(a) ",
        &all,
        alone,
        &format!(
            "the check passed the unlogged sequence alone ({alone}) after a backend's SIGKILL"
        ),
    );
    let locks = TransactionLocks::from_url(&url).unwrap();
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let key = LockKey::new(format!("{prefix}/tx")).unwrap();
    let guard = locks.try_lock_in(&mut tx, &key).await.unwrap().unwrap();
    let token = guard.token().get();
    drop(guard);
    tx.commit().await.unwrap();
    rises_above(&all, token).unwrap();
    all.push(token);
    // The old backend's sessions died with the crash: its first calls
    // find them broken (an error each), then it opens new ones.
    let key = LockKey::new(format!("{prefix}/old")).unwrap();
    for _ in 0..4 {
        if let Ok(Some(lease)) = backend.try_acquire(&key, TTL).await {
            rises_above(&all, lease.token().get()).unwrap();
            all.push(lease.token().get());
            assert!(backend.release(&lease).await.unwrap());
            break;
        }
    }
    all.extend(grants(&backend, &prefix, 8).await);
    assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");

    // (b) Immediate stop and start: a new backend starts the run.
    drop((raw, pool, backend));
    immediate_stop_and_start(&mut server).await;
    let mut raw = connect_again(&server.url()).await;
    let alone = sequence_alone(&mut raw, &seq).await;
    caught_going_back(
        "(b) ",
        &all,
        alone,
        &format!("the check passed the unlogged sequence alone ({alone}) after an immediate stop"),
    );
    let backend = SqlSessionBackend::connect_url(&url).await.unwrap();
    let after = grants(&backend, &prefix, 8).await;
    rises_above(&all, after[0]).unwrap();
    all.extend(after);
    assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");
    let epoch: i64 = sqlx::query_scalar("SELECT epoch FROM distlock_leases_session_runs")
        .fetch_one(&mut raw)
        .await
        .unwrap();
    assert_eq!(epoch, 3, "one run per start: the first, (a), (b)");
}

/// A session whose sequence was reset under it (what a pooler keeping the
/// client connection across a server restart would show; here a `setval`
/// by hand) refuses the token below the run's base: it gives the lock
/// back and is closed, and the try is made again on a new session, which
/// starts a new run above. The broken variant is the grant statement
/// without that check, sent by hand: it hands out token 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_below_the_run_base_is_refused() {
    let Some(server) = PostgresServer::start().await.or_skip() else {
        return;
    };
    let url = format!("{}?mode=session&timeout=2s&pool_size=1", server.url());
    let backend = SqlSessionBackend::connect_url(&url).await.unwrap();
    let seq = backend.token_counter().to_owned();
    let before = grants(&backend, "reset", 4).await;
    let mut raw = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("SELECT setval('{seq}', 1)")))
        .execute(&mut raw)
        .await
        .unwrap();
    let key = LockKey::new("reset/0").unwrap();
    let lease = backend.try_acquire(&key, TTL).await.unwrap().unwrap();
    rises_above(&before, lease.token().get()).unwrap();
    assert!(backend.release(&lease).await.unwrap());
    let epoch: i64 = sqlx::query_scalar("SELECT epoch FROM distlock_leases_session_runs")
        .fetch_one(&mut raw)
        .await
        .unwrap();
    assert_eq!(epoch, 2, "the refused grant's session started a new run");
    // Broken variant: the driver's grant statement alone.
    sqlx::query(sqlx::AssertSqlSafe(format!("SELECT setval('{seq}', 1)")))
        .execute(&mut raw)
        .await
        .unwrap();
    let texts =
        lock_sql::keys::statement_texts(lock_sql::SqlDialect::Postgres, "distlock_leases").unwrap();
    let grant = &texts.session.unwrap()[1];
    let token: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(grant.clone()))
        .bind(lock_sql::keys::pg_lock_key(
            "distlock_leases",
            "reset/broken",
        ))
        .bind("00ff")
        .bind("30000")
        .fetch_one(&mut raw)
        .await
        .unwrap();
    let token = u64::try_from(token.unwrap()).unwrap();
    caught_going_back(
        "",
        &before,
        token,
        &format!("the grant alone handed out {token}"),
    );
}

/// An existing deployment's token sequence (the `LOGGED` one of earlier
/// versions, `<table>_session_seq`), here far along: the new tokens start
/// above its last value with no migration (the first epoch is above it).
/// The broken variant is the first run's base without that floor
/// (epoch 1: token 2^40 + 1), caught below the old value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_start_above_an_old_logged_sequence() {
    let Some(server) = PostgresServer::start().await.or_skip() else {
        return;
    };
    let table = format!("old{}", &OwnerId::random().to_hex()[..8]);
    let old_token: i64 = (3 << 40) + 5;
    let mut raw = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    for statement in [
        format!("CREATE SEQUENCE \"{table}_session_seq\" AS BIGINT CACHE 1 NO CYCLE"),
        format!("SELECT setval('\"{table}_session_seq\"', {old_token})"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&mut raw)
            .await
            .unwrap();
    }
    let old = [u64::try_from(old_token).unwrap()];
    let url = format!("{}?mode=session&timeout=2s&table={table}", server.url());
    let backend = SqlSessionBackend::connect_url(&url).await.unwrap();
    let key = LockKey::new("upgraded").unwrap();
    let lease = backend.try_acquire(&key, TTL).await.unwrap().unwrap();
    rises_above(&old, lease.token().get()).unwrap();
    let without_floor = (1 << 40) + 1;
    assert!(
        rises_above(&old, without_floor).is_err(),
        "the first run's base without the old sequence's floor is above {old_token}"
    );
    assert!(backend.release(&lease).await.unwrap());
}
