//! PostgreSQL 15 behind PgBouncer 1.18 (Debian `pgbouncer`), one server
//! and three poolers started by the harness, one per pool mode:
//!
//! - Row mode with `pooler=transaction` passes the conformance suite's
//!   short cases through transaction pooling. Its broken variant, row mode
//!   without the option (sqlx's named prepared statements), fails through
//!   the same pooler: a second client finds "prepared statement
//!   \"sqlx_s_1\" already exists" on the server connection the first one
//!   left it on.
//!   What the option costs, counted by a proxy: a try and a release take
//!   four times the round trips of a direct connection (`BEGIN`, `Parse`,
//!   `Bind`/`Execute`, `COMMIT` per statement).
//! - Session mode is refused at connect through transaction and statement
//!   pooling, with an error that names row mode and transaction-scoped
//!   locks, and passes a short subset of the suite through session
//!   pooling. The check's broken variant (session mode's statements on two
//!   client connections with nothing checked, as if the check always
//!   answered "no pooler") lets two clients both take the same advisory
//!   lock through transaction pooling: the pooler put both on one server
//!   session, where advisory locks are re-entrant. Through session pooling
//!   the same pair excludes.
//! - Row mode through statement pooling fails at its first grant with
//!   PgBouncer's "transaction blocks not allowed in statement pooling
//!   mode" (each statement runs in a transaction of its own).
//! - Transaction-scoped locks (`TransactionLocks`) exclude each other
//!   through transaction pooling, in both modes.

mod common;
mod proxied;

use std::sync::Arc;

use conformance::servers::pgbouncer::{PgBouncerServer, PoolMode};
use conformance::servers::postgres::PostgresServer;
use conformance::{Harness, OrSkip, UrlTarget, run_cases, short_cases};
use lock_core::{ErrorKind, LockBackend, LockBackendExt, LockKey};
use lock_sql::TransactionLocks;
use lock_sql::sqlx::{self, Connection, Row};
use std::time::Duration;

/// The lease of the single grants here.
const TTL: Duration = Duration::from_secs(30);

/// Options of the row-mode clients behind the transaction pooler: waiters
/// cannot hear `NOTIFY` there, so they re-check often.
const ROW_OPTIONS: &str = "pooler=transaction&recheck=50ms";

/// The suite's cases session mode runs through session pooling (its whole
/// suite runs on PostgreSQL directly in `session_postgres.rs`).
const SESSION_CASES: &[&str] = &[
    "bad_input_is_rejected",
    "only_owner_can_release_or_renew",
    "stale_release_is_refused",
    "mutual_exclusion",
    "fencing_tokens_increase",
    "acquire_times_out_at_deadline",
    "dropped_acquire_leaves_nothing",
];

fn target(name: &str, url: String) -> Arc<UrlTarget> {
    Arc::new(UrlTarget {
        name: name.to_owned(),
        url,
        open: Arc::new(|url: String| {
            Box::pin(
                async move { Ok(Arc::new(lock_sql::connect(&url).await?) as Arc<dyn LockBackend>) },
            )
        }),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer() {
    let Some(postgres) = PostgresServer::start().await.or_skip() else {
        return;
    };
    let Some(transaction) = PgBouncerServer::start(&postgres, PoolMode::Transaction)
        .await
        .or_skip()
    else {
        return;
    };
    let statement = PgBouncerServer::start(&postgres, PoolMode::Statement)
        .await
        .expect("pgbouncer in statement pooling");
    let session = PgBouncerServer::start(&postgres, PoolMode::Session)
        .await
        .expect("pgbouncer in session pooling");
    let tx_url = transaction.url();

    // Row mode without `pooler=transaction` (sqlx's named statements)
    // breaks through the transaction pooler: the broken variant.
    let mut named = Vec::new();
    let mut failures = Vec::new();
    for _ in 0..3 {
        match lock_sql::connect(&common::with_options(&tx_url, "table=named_leases")).await {
            Ok(client) => named.push(client),
            Err(err) => failures.push(err.to_string()),
        }
    }
    println!("row mode without pooler=transaction: {failures:?}");
    assert!(
        failures.iter().any(|e| e.contains("already exists")),
        "named prepared statements should collide through transaction pooling: {failures:?}"
    );
    drop(named);

    // Row mode with it: the short cases through transaction pooling.
    let row_url = common::with_options(
        &tx_url,
        &format!("{}&{ROW_OPTIONS}", common::CLIENT_OPTIONS),
    );
    run_cases(
        &Harness::new(target("pgbouncer-transaction-row", row_url.clone())),
        &short_cases(),
    )
    .await
    .assert_passed();

    // What the pooler-safe statements cost: round trips of a try and a
    // release, counted by a proxy, directly and through the pooler.
    let direct = proxied::proxy_to(postgres.port()).await;
    let pooled = proxied::proxy_to(transaction.port()).await;
    let direct_rt = try_cycle_round_trips(
        &proxied::through(&postgres.url(), postgres.port(), &direct),
        &direct,
    )
    .await;
    let pooled_rt = try_cycle_round_trips(
        &common::with_options(
            &proxied::through(&tx_url, transaction.port(), &pooled),
            ROW_OPTIONS,
        ),
        &pooled,
    )
    .await;
    println!(
        "round trips per try+release: {direct_rt} direct, {pooled_rt} with pooler=transaction"
    );
    assert_eq!(
        pooled_rt,
        4 * direct_rt,
        "BEGIN, Parse, Bind/Execute, COMMIT for each statement"
    );

    // Row mode through statement pooling: each statement's own
    // transaction is refused there, so its first grant fails.
    let statement_row = common::with_options(
        &statement.url(),
        &format!("{}&{ROW_OPTIONS}", common::CLIENT_OPTIONS),
    );
    let refused = match lock_sql::connect(&statement_row).await {
        Err(err) => err,
        Ok(client) => client
            .try_acquire(&LockKey::new("pgbouncer/statement").unwrap(), TTL)
            .await
            .expect_err("row mode granted through statement pooling"),
    };
    println!("row mode through statement pooling: {refused}");
    assert!(
        refused.to_string().contains("statement pooling"),
        "PgBouncer's refusal names statement pooling: {refused}"
    );

    // Session mode: refused through transaction and statement pooling.
    for pooler in [&transaction, &statement] {
        let url = common::with_options(&pooler.url(), "mode=session&timeout=2s");
        let err = lock_sql::connect(&url)
            .await
            .err()
            .unwrap_or_else(|| panic!("session mode was accepted through {url}"));
        println!("session mode through {url}: {err}");
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        let message = err.to_string();
        assert!(
            message.contains("row mode") && message.contains("transaction-scoped locks"),
            "the refusal names the modes to use: {message}"
        );
    }
    // The same check passes directly and through session pooling.
    for url in [postgres.url(), session.url()] {
        let url = common::with_options(&url, "mode=session&timeout=2s");
        lock_sql::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("session mode refused at {url}: {e}"));
    }
    let session_url = common::with_options(
        &session.url(),
        &format!("mode=session&{}", common::CLIENT_OPTIONS),
    );
    let cases: Vec<_> = short_cases()
        .into_iter()
        .filter(|c| SESSION_CASES.contains(&c.name))
        .collect();
    assert_eq!(cases.len(), SESSION_CASES.len(), "a case was renamed");
    run_cases(
        &Harness::new(target("pgbouncer-session-session", session_url)),
        &cases,
    )
    .await
    .assert_passed();

    // The check's broken variant: session mode's lock statement on two
    // client connections, nothing checked.
    let key = lock_sql::keys::pg_lock_key("distlock_leases", "pgbouncer/double");
    assert!(
        double_grant(&tx_url, key).await,
        "two clients should both hold the advisory lock through transaction pooling"
    );
    assert!(
        !double_grant(&session.url(), key).await,
        "the advisory lock should exclude through session pooling"
    );

    transaction_locks(&tx_url).await;
}

/// Whether two client connections to `url` both get advisory lock `key`
/// (session mode's grant, `pg_try_advisory_lock`), each believing it
/// holds it alone.
async fn double_grant(url: &str, key: i64) -> bool {
    let mut a = sqlx::PgConnection::connect(url).await.unwrap();
    let mut b = sqlx::PgConnection::connect(url).await.unwrap();
    // Simple protocol: one message each, whatever the pooler.
    let sql = format!("SELECT pg_try_advisory_lock({key})");
    let take = async |conn: &mut sqlx::PgConnection| -> (bool, i32) {
        let row = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("{sql}, pg_backend_pid()")))
            .fetch_one(conn)
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    let (a_holds, a_pid) = take(&mut a).await;
    let (b_holds, b_pid) = take(&mut b).await;
    println!(
        "{url}: A holds {a_holds} (server pid {a_pid}), B holds {b_holds} (server pid {b_pid})"
    );
    for conn in [&mut a, &mut b] {
        sqlx::raw_sql("SELECT pg_advisory_unlock_all()")
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
    assert!(a_holds, "the first client should get the free lock");
    a_holds && b_holds
}

/// Transaction-scoped locks through transaction pooling, both modes: while
/// a transaction holds a key, another transaction's try is refused (the
/// two transactions run on two server connections); after the holder's
/// commit the next try gets it with a higher token.
async fn transaction_locks(url: &str) {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(url)
        .await
        .unwrap();
    for mode in ["row", "session"] {
        let locks = TransactionLocks::from_url(&common::with_options(url, &format!("mode={mode}")))
            .unwrap();
        locks.prepare(&pool).await.unwrap();
        let key = LockKey::new(format!("pgbouncer/transaction/{mode}")).unwrap();
        let mut first = pool.begin().await.unwrap();
        let held = locks.try_lock_in(&mut first, &key).await.unwrap();
        let token = held.expect("a free key was refused").token();
        let mut second = pool.begin().await.unwrap();
        let refused = locks.try_lock_in(&mut second, &key).await.unwrap();
        assert!(
            refused.is_none(),
            "{mode}: a second transaction got {key} while the first held it"
        );
        second.rollback().await.unwrap();
        first.commit().await.unwrap();
        let mut third = pool.begin().await.unwrap();
        let next = locks.try_lock_in(&mut third, &key).await.unwrap();
        let next_token = next.expect("still held after the commit").token();
        third.commit().await.unwrap();
        assert!(
            next_token > token,
            "{mode}: token {token:?} -> {next_token:?}"
        );
        println!(
            "transaction locks ({mode}) through transaction pooling: tokens {token:?} -> {next_token:?}"
        );
    }
    pool.close().await;
}

/// Round trips per `try_acquire` + `release` of a free key at `url`
/// (through `proxy`).
async fn try_cycle_round_trips(url: &str, proxy: &conformance::proxy::FaultProxy) -> u64 {
    let client = lock_core::LockClient::new(lock_sql::connect(url).await.unwrap());
    proxied::per_cycle(proxy, 3, 20, async || {
        conformance::bench::try_cycle(&client, "pgbouncer/round-trips", TTL).await;
    })
    .await
}

/// What the docs say of sqlx 0.9's `statement-cache-capacity=0`: it
/// still names each statement it prepares (never reusing or closing it),
/// so two client connections through transaction pooling collide on
/// `sqlx_s_1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_without_statement_cache_still_names_statements() {
    let Some(postgres) = PostgresServer::start().await.or_skip() else {
        return;
    };
    let transaction = PgBouncerServer::start(&postgres, PoolMode::Transaction)
        .await
        .expect("pgbouncer in transaction pooling");
    let url = common::with_options(&transaction.url(), "statement-cache-capacity=0");
    let mut a = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut b = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut errors = Vec::new();
    for _ in 0..3 {
        for conn in [&mut a, &mut b] {
            if let Err(err) = sqlx::query("SELECT $1::int8")
                .bind(1_i64)
                .fetch_one(&mut *conn)
                .await
            {
                errors.push(err.to_string());
            }
        }
    }
    println!("statement-cache-capacity=0 through transaction pooling: {errors:?}");
    assert!(
        errors.iter().any(|e| e.contains("already exists")),
        "{errors:?}"
    );
}
