//! Session mode's PostgreSQL floor ([`SessionFloor`]) on a real server:
//! it keeps its connection's idle timeout as the driver's session does
//! (armed by a first full grant, kept by the lean release, left alone by a
//! lean grant, armed again by a full grant when the TTL moved out of
//! `ttl..=2*ttl`), replaces a connection the server ended for silence, and
//! releases a lock while holding another as the driver does.
//! What the server does with the floor's session is read from
//! `pg_stat_activity` on a connection of the test's own.

use std::time::Duration;

use conformance::OrSkip;
use conformance::floor::RawFloor;
use conformance::servers::postgres::PostgresServer;
use lock_bench::sql::SessionFloor;
use lock_sql::sqlx::{self, Connection};

/// Client sessions of the driver's (and the floor's) application name.
async fn floor_sessions(observer: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE backend_type = 'client backend' AND application_name LIKE 'distlock%'",
    )
    .fetch_one(observer)
    .await
    .expect("pg_stat_activity")
}

/// One grant and release of `key` for `ttl`; the token.
async fn cycle(floor: &SessionFloor, key: &str, ttl: Duration) -> u64 {
    let grant = floor.try_grant(key, ttl).await.expect("grant");
    let grant = grant.expect("the key is free");
    assert!(floor.release(&grant).await.expect("release"), "held");
    grant.token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_keeps_its_session_armed_as_the_driver_does() {
    let Some(server) = PostgresServer::start().await.or_skip() else {
        return;
    };
    let url = format!("{}?mode=session&table=floor_lean&timeout=2s", server.url());
    let floor = SessionFloor::connect(&url).await.expect("floor");
    let mut observer = sqlx::PgConnection::connect(&server.url())
        .await
        .expect("observer");
    let (key, ms) = ("lean", Duration::from_millis);
    assert_eq!(
        floor_sessions(&mut observer).await,
        1,
        "the floor's session"
    );

    // The first grant arms the idle timeout; the (lean) release keeps it:
    // the server ends the silent session after the TTL.
    let first = cycle(&floor, key, ms(1000)).await;
    tokio::time::sleep(ms(1700)).await;
    assert_eq!(
        floor_sessions(&mut observer).await,
        0,
        "the release kept the idle timeout armed"
    );
    // The floor opens a new session, as the driver does.
    let second = cycle(&floor, key, ms(1000)).await;
    assert!(second > first, "tokens rise: {first} then {second}");
    assert_eq!(floor_sessions(&mut observer).await, 1, "a new session");
    tokio::time::sleep(ms(1700)).await;
    assert_eq!(floor_sessions(&mut observer).await, 0, "armed again");

    // Armed for 1.5 s, a try for 1 s is lean: it leaves 1.5 s armed.
    cycle(&floor, key, ms(1500)).await;
    cycle(&floor, key, ms(1000)).await;
    tokio::time::sleep(ms(1200)).await;
    assert_eq!(
        floor_sessions(&mut observer).await,
        1,
        "the lean grant left the armed TTL alone"
    );
    tokio::time::sleep(ms(1000)).await;
    assert_eq!(floor_sessions(&mut observer).await, 0, "armed for 1.5 s");

    // Armed for 5 s, a try for 1 s (past twice its TTL) is full: 1 s armed.
    cycle(&floor, key, ms(5000)).await;
    cycle(&floor, key, ms(1000)).await;
    tokio::time::sleep(ms(1700)).await;
    assert_eq!(
        floor_sessions(&mut observer).await,
        0,
        "the full grant armed the shorter TTL"
    );
    let last = cycle(&floor, key, ms(1000)).await;
    assert!(last > second, "tokens rise: {second} then {last}");

    // Two locks: releasing one while the other is held sends the driver's
    // release that keeps the other (published as `distlock-multi`).
    let a = floor.try_grant("multi-a", ms(5000)).await.unwrap().unwrap();
    let b = floor.try_grant("multi-b", ms(5000)).await.unwrap().unwrap();
    assert!(floor.release(&a).await.unwrap());
    assert_eq!(published(&mut observer).await, "distlock-multi");
    assert!(floor.release(&b).await.unwrap());
    assert_eq!(published(&mut observer).await, "distlock");
}

/// The `application_name` of the floor's session.
async fn published(observer: &mut sqlx::PgConnection) -> String {
    sqlx::query_scalar(
        "SELECT application_name FROM pg_stat_activity \
         WHERE backend_type = 'client backend' AND application_name LIKE 'distlock%'",
    )
    .fetch_one(observer)
    .await
    .expect("pg_stat_activity")
}
