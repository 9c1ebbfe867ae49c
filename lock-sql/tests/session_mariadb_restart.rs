//! MariaDB session mode across a crash of the server (SIGKILL and start
//! again, the test kit's `restart`): the first token after the restart is
//! above every token before it.
//!
//! The driver's tokens are the server's `UUID_SHORT()` counter, counted
//! from the run's origin, above the server run's epoch (a durable counter
//! bumped once per run). The counter starts again at every start of the
//! server; the epoch lifts the new run's tokens above the old. The broken
//! variant is the count alone (the token less the run's epoch): the same
//! check fails on it after the crash.

use conformance::OrSkip;
use conformance::servers::mariadb::MariaDbServer;
use lock_core::{LockBackend, LockBackendExt, LockKey, OwnerId};
use lock_sql::SqlSessionBackend;
use lock_sql::sqlx::{self, Connection};

mod restart_common;

use restart_common::{TTL, caught_going_back, grants, rises_above};

/// The broken token: the server's counter counted from the run's origin,
/// without the run's epoch (what a token would be if the driver dropped
/// the epoch), read from the run clock `clock`.
async fn count_alone(conn: &mut sqlx::MySqlConnection, clock: &str) -> u64 {
    let count: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT CAST(UUID_SHORT() & 72057594037927935 AS SIGNED) - origin FROM {clock} \
         WHERE id = 1"
    )))
    .fetch_one(conn)
    .await
    .unwrap();
    u64::try_from(count).unwrap()
}

/// `UUID_SHORT()` itself, less its server-id byte.
async fn counter(conn: &mut sqlx::MySqlConnection) -> u64 {
    let value: i64 = sqlx::query_scalar("SELECT CAST(UUID_SHORT() & 72057594037927935 AS SIGNED)")
        .fetch_one(conn)
        .await
        .unwrap();
    u64::try_from(value).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_a_server_crash() {
    let Some(mut server) = MariaDbServer::start().await.or_skip() else {
        return;
    };
    let url = format!("{}?mode=session&timeout=2s&pool_size=2", server.url());
    let prefix = format!("restart{}", &OwnerId::random().to_hex()[..8]);
    let backend = SqlSessionBackend::connect_url(&url).await.unwrap();
    let clock = backend.token_counter().to_owned();
    assert_eq!(
        backend.capabilities().fencing,
        lock_core::FencingScope::Global
    );
    let mut before = grants(&backend, &prefix, 40).await;
    assert!(
        before.windows(2).all(|w| w[0] < w[1]),
        "tokens rise across keys: {before:?}"
    );
    // Other clients of the server call UUID_SHORT() too: the counter
    // runs ahead of the grants, and the tokens stay in order.
    let mut raw = sqlx::MySqlConnection::connect(&server.url()).await.unwrap();
    let mut counts = Vec::new();
    for _ in 0..1_100 {
        counts.push(count_alone(&mut raw, &clock).await);
    }
    let counter_before = counter(&mut raw).await;
    before.extend(grants(&backend, &prefix, 4).await);
    assert!(
        before.windows(2).all(|w| w[0] < w[1]),
        "tokens rise past other callers of the counter: {before:?}"
    );
    drop(raw);

    server.restart().await.unwrap();
    let after_backend = SqlSessionBackend::connect_url(&url).await.unwrap();
    let after = grants(&after_backend, &prefix, 1).await[0];
    rises_above(&before, after).unwrap();
    let mut raw = sqlx::MySqlConnection::connect(&server.url()).await.unwrap();
    let counter_after = counter(&mut raw).await;
    println!(
        "UUID_SHORT() across the SIGKILL: {counter_before} before, {counter_after} after \
         ({}: it starts again from the start time in whole seconds); ours: {} before, \
         {after} after",
        if counter_after > counter_before {
            "rose"
        } else {
            "fell back"
        },
        before.iter().max().unwrap()
    );
    // Broken variant: the count alone (no run epoch) starts again.
    let alone = count_alone(&mut raw, &clock).await;
    caught_going_back(
        "",
        &counts,
        alone,
        &format!("the check passed the count alone ({alone}) after the crash"),
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
}

/// An earlier version's deployment: a server, a table named `prefix` and
/// a random suffix with `objects` (given that name) created by hand, a
/// plain connection, and this version's backend connected to it.
async fn earlier_deployment(
    prefix: &str,
    objects: impl Fn(&str) -> Vec<String>,
) -> Option<(
    MariaDbServer,
    String,
    sqlx::MySqlConnection,
    SqlSessionBackend,
)> {
    let server = MariaDbServer::start().await.or_skip()?;
    let table = format!("{prefix}{}", &OwnerId::random().to_hex()[..8]);
    let mut raw = sqlx::MySqlConnection::connect(&server.url()).await.unwrap();
    for statement in objects(&table) {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&mut raw)
            .await
            .unwrap();
    }
    let url = format!("{}?mode=session&timeout=2s&table={table}", server.url());
    let backend = SqlSessionBackend::connect_url(&url).await.unwrap();
    Some((server, table, raw, backend))
}

/// An existing deployment's per-key token table (the token-row schema of
/// earlier versions, a key at token 41): the run clock's tokens start
/// above it with no migration (the run's base, 2^40, is above any per-key
/// count). The broken variant, the count alone, starts below it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_start_above_an_old_token_table() {
    let Some((_server, _table, mut raw, backend)) = earlier_deployment("old", |table| {
        vec![
            format!(
                "CREATE TABLE `{table}_session_tokens` (name VARBINARY(1024) NOT NULL \
                 PRIMARY KEY, token BIGINT NOT NULL, owner VARCHAR(64) NOT NULL, \
                 conn BIGINT NOT NULL) ENGINE=InnoDB"
            ),
            format!("INSERT INTO `{table}_session_tokens` VALUES ('upgraded', 41, 'before', 0)"),
        ]
    })
    .await
    else {
        return;
    };
    let key = LockKey::new("upgraded").unwrap();
    let lease = backend.try_acquire(&key, TTL).await.unwrap().unwrap();
    rises_above(&[41], lease.token().get()).unwrap();
    let alone = count_alone(&mut raw, backend.token_counter()).await;
    assert!(
        rises_above(&[41], alone).is_err(),
        "the count alone ({alone}) is above the old token table's 41"
    );
    assert!(backend.release(&lease).await.unwrap());
}

/// An existing deployment of the sequence tokens (earlier versions:
/// `run_base + NEXTVAL(<table>_session_seq)`, the run's epoch in
/// `<table>_session_run`), here in its fifth run with a million grants:
/// the first client of this version starts a run of its own (the durable
/// epoch bumped to 6), so its tokens start above every old one. The
/// broken variant, the old run's epoch read again with the new count,
/// starts below them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_start_above_the_sequence_tokens() {
    let Some((_server, table, mut raw, backend)) = earlier_deployment("seq", |table| {
        vec![
            format!(
                "CREATE TABLE `{table}_session_runs` (id TINYINT NOT NULL PRIMARY KEY, \
                 epoch BIGINT NOT NULL) ENGINE=InnoDB"
            ),
            format!("INSERT INTO `{table}_session_runs` VALUES (1, 5)"),
            format!(
                "CREATE TABLE `{table}_session_run` (id TINYINT NOT NULL PRIMARY KEY, \
                 epoch BIGINT NOT NULL) ENGINE=MEMORY"
            ),
            format!("INSERT INTO `{table}_session_run` VALUES (1, 5)"),
            format!(
                "CREATE SEQUENCE `{table}_session_seq` START WITH 1000000 MINVALUE 1 \
                 INCREMENT BY 1 CACHE 1000 NOCYCLE"
            ),
        ]
    })
    .await
    else {
        return;
    };
    let old_token: u64 = (5 << 40) + 1_000_000;
    let tokens = grants(&backend, "upgraded", 4).await;
    rises_above(&[old_token], tokens[0]).unwrap();
    let epoch: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT epoch FROM `{table}_session_runs` WHERE id = 1"
    )))
    .fetch_one(&mut raw)
    .await
    .unwrap();
    assert_eq!(epoch, 6, "the first client of this version started a run");
    let broken = (5 << 40) + count_alone(&mut raw, backend.token_counter()).await;
    caught_going_back(
        "",
        &[old_token],
        broken,
        &format!("the old run's epoch with the new count ({broken}) is above the old tokens"),
    );
}
