//! MariaDB session mode across a crash of the server (SIGKILL and start
//! again, the test kit's `restart`): the first token after the restart is
//! above every token before it.
//!
//! MariaDB 10.11 does not flush a sequence's writes at commit: after a
//! SIGKILL the sequence resumes from its last value on disk (up to about a
//! second back), and one created less than a second before the crash
//! loses its row. The driver's tokens add the server run's epoch (a
//! durable counter bumped once per run) above the sequence, so they rise
//! across the crash even when the sequence falls back, or is created
//! again. The broken variant is the sequence alone: the same check fails
//! on it after the sequence was created again (what the driver does when
//! a crash cost it its row), and the sequence's own fall-back after the
//! SIGKILL is printed.

use conformance::OrSkip;
use conformance::servers::mariadb::MariaDbServer;
use lock_core::{LockBackend, LockBackendExt, LockKey, OwnerId};
use lock_sql::SqlSessionBackend;
use lock_sql::sqlx::{self, Connection};

mod restart_common;

use restart_common::{TTL, grants, rises_above};

/// The sequence alone: `n` values of `NEXTVAL` in one statement (with
/// more than the cache's 1,000, the last ones from a refill just made).
async fn nextvals(conn: &mut sqlx::MySqlConnection, seq: &str, n: usize) -> Vec<u64> {
    let rows: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT NEXTVAL({seq}) FROM seq_1_to_{n}"
    )))
    .fetch_all(conn)
    .await
    .unwrap();
    rows.into_iter()
        .map(|v| u64::try_from(v).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_a_server_crash() {
    let Some(mut server) = MariaDbServer::start().await.or_skip() else {
        return;
    };
    let url = format!("{}?mode=session&timeout=2s&pool_size=2", server.url());
    let prefix = format!("restart{}", &OwnerId::random().to_hex()[..8]);
    let backend = SqlSessionBackend::connect_url(&url).await.unwrap();
    let seq = backend.token_counter().to_owned();
    assert_eq!(
        backend.capabilities().fencing,
        lock_core::FencingScope::Global
    );
    let mut before = grants(&backend, &prefix, 40).await;
    assert!(
        before.windows(2).all(|w| w[0] < w[1]),
        "tokens rise across keys: {before:?}"
    );
    let mut raw = sqlx::MySqlConnection::connect(&server.url()).await.unwrap();
    let raw_before = nextvals(&mut raw, &seq, 1_100).await;
    before.extend(grants(&backend, &prefix, 4).await);
    drop(raw);

    // Crash 1: SIGKILL right after a refill of the sequence's cache.
    server.restart().await.unwrap();
    let after_backend = SqlSessionBackend::connect_url(&url).await.unwrap();
    let after = grants(&after_backend, &prefix, 1).await[0];
    rises_above(&before, after).unwrap();
    let mut raw = sqlx::MySqlConnection::connect(&server.url()).await.unwrap();
    let raw_after = nextvals(&mut raw, &seq, 1).await[0];
    println!(
        "sequence alone across the SIGKILL: {} before, {raw_after} after ({}); ours: {} before, \
         {after} after",
        raw_before.iter().max().unwrap(),
        if rises_above(&raw_before, raw_after).is_ok() {
            "rose"
        } else {
            "fell back"
        },
        before.iter().max().unwrap()
    );
    let mut all = before.clone();
    all.extend(grants(&after_backend, &prefix, 8).await);
    // The old backend's sessions died with the server: its first calls
    // find them broken (an error each), then it opens new ones.
    let key = LockKey::new(format!("{prefix}/old")).unwrap();
    for _ in 0..4 {
        if let Ok(Some(lease)) = backend.try_acquire(&key, TTL).await {
            all.push(lease.token().get());
            assert!(backend.release(&lease).await.unwrap());
            break;
        }
    }
    all.extend(grants(&backend, &prefix, 8).await);
    // The holder table is back to its size (a restart sets a MEMORY
    // table's limit to the server's 16 MiB).
    let size: i64 = sqlx::query_scalar(
        "SELECT CAST(MAX_DATA_LENGTH AS SIGNED) FROM information_schema.TABLES \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'distlock_leases_session_holders'",
    )
    .fetch_one(&mut raw)
    .await
    .unwrap();
    assert!(
        size > 128 << 20,
        "holder table limit {size} after the restart"
    );
    assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");

    // Crash 2, and the sequence created again before the run's first
    // grant (as the driver does when a crash cost the sequence its row).
    drop((raw, backend, after_backend));
    server.restart().await.unwrap();
    let mut raw = sqlx::MySqlConnection::connect(&server.url()).await.unwrap();
    for statement in [
        format!("DROP SEQUENCE {seq}"),
        format!("CREATE SEQUENCE {seq} START WITH 1 MINVALUE 1 INCREMENT BY 1 CACHE 1000 NOCYCLE"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&mut raw)
            .await
            .unwrap();
    }
    let backend = SqlSessionBackend::connect_url(&url).await.unwrap();
    let after = grants(&backend, &prefix, 1).await[0];
    rises_above(&all, after).unwrap();
    // Broken variant: a token from the sequence alone (no run epoch).
    let alone = nextvals(&mut raw, &seq, 1).await[0];
    let caught = rises_above(&all, alone);
    assert!(
        caught.is_err(),
        "the check passed a token of the sequence alone ({alone}) after it was created again"
    );
    println!("broken variant caught: {}", caught.unwrap_err());
}

/// An existing deployment's per-key token table (the token-row schema of
/// earlier versions, a key at token 41): the sequence's tokens start above
/// it with no migration (the run's base, 2^40, is above any per-key
/// count). The broken variant, the sequence alone, starts below it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_start_above_an_old_token_table() {
    let Some(server) = MariaDbServer::start().await.or_skip() else {
        return;
    };
    let table = format!("old{}", &OwnerId::random().to_hex()[..8]);
    let mut raw = sqlx::MySqlConnection::connect(&server.url()).await.unwrap();
    let key = LockKey::new("upgraded").unwrap();
    for statement in [
        format!(
            "CREATE TABLE `{table}_session_tokens` (name VARBINARY(1024) NOT NULL PRIMARY KEY, \
             token BIGINT NOT NULL, owner VARCHAR(64) NOT NULL, conn BIGINT NOT NULL) \
             ENGINE=InnoDB"
        ),
        format!("INSERT INTO `{table}_session_tokens` VALUES ('upgraded', 41, 'before', 0)"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&mut raw)
            .await
            .unwrap();
    }
    let url = format!("{}?mode=session&timeout=2s&table={table}", server.url());
    let backend = SqlSessionBackend::connect_url(&url).await.unwrap();
    let lease = backend.try_acquire(&key, TTL).await.unwrap().unwrap();
    rises_above(&[41], lease.token().get()).unwrap();
    let alone = nextvals(&mut raw, backend.token_counter(), 1).await[0];
    assert!(
        rises_above(&[41], alone).is_err(),
        "the sequence alone ({alone}) is above the old token table's 41"
    );
    assert!(backend.release(&lease).await.unwrap());
}
