//! MariaDB session mode: holder details and `list` from the holder rows
//! the grant writes (`<table>_session_holders`, a `MEMORY` table), and
//! PostgreSQL's refusal. (MySQL's token-row path, `<table>_session_tokens`,
//! has no server here to run on.)

use std::collections::BTreeMap;
use std::time::Duration;

use lock_core::{ErrorKind, ListQuery, LockBackend, LockBackendExt, LockKey};
use lock_sql::SqlSessionBackend;
use lock_sql::sqlx::{self, Connection};

use super::{SessionTarget, key, mysql_name};

const TTL: Duration = Duration::from_secs(30);

/// All pages of `list(prefix)` in pages of 2: key -> (holder, token, pid).
async fn listed(
    backend: &SqlSessionBackend,
    prefix: &str,
) -> BTreeMap<String, (String, Option<u64>, Option<u32>)> {
    let mut all = BTreeMap::new();
    let mut cursor = None;
    for _ in 0..50 {
        let page = backend
            .list(&ListQuery::new(prefix, 2).after(cursor.as_deref()))
            .await
            .unwrap();
        for info in page.locks {
            assert_eq!(info.remaining_ttl, None, "{}", info.key);
            let row = (
                info.holder,
                info.token.map(|t| t.get()),
                info.details.map(|d| d.pid),
            );
            assert!(
                all.insert(info.key.as_str().to_owned(), row).is_none(),
                "{} listed twice",
                info.key
            );
        }
        match page.cursor {
            Some(next) => cursor = Some(next),
            None => return all,
        }
    }
    panic!("list did not finish in 50 pages");
}

/// Hashed GET_LOCK names (a mixed-case and a long key) are listed by their
/// key text with holder, token and this process's details; a row whose
/// lock a foreign session holds now, and a released one, are not listed;
/// tokens rise across keys (one sequence).
pub async fn mysql_token_rows(target: &SessionTarget) {
    let backend = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    assert!(backend.capabilities().holder_details);
    let table = backend.config().table_name().to_owned();
    let prefix = format!("{}/", key("rows").as_str());
    let at = |name: &str| LockKey::new(format!("{prefix}{name}")).unwrap();
    let (mixed, long, plain, gone) = (
        at("Mixed/Case"),
        at(&"k".repeat(200)),
        at("plain"),
        at("gone"),
    );
    assert!(mysql_name(&table, mixed.as_str()).starts_with('#'));
    assert!(mysql_name(&table, long.as_str()).starts_with('#'));
    let m = backend.try_acquire(&mixed, TTL).await.unwrap().unwrap();
    let l = backend.try_acquire(&long, TTL).await.unwrap().unwrap();
    let p = backend.try_acquire(&plain, TTL).await.unwrap().unwrap();
    let g = backend.try_acquire(&gone, TTL).await.unwrap().unwrap();
    assert!(backend.release(&g).await.unwrap());
    assert!(backend.release(&p).await.unwrap());

    // The plain key's lock taken by hand by a foreign session: its row
    // still names our last grant's connection, which no longer holds it.
    let raw = target.raw_url().await;
    let mut foreign = sqlx::MySqlConnection::connect(&raw).await.unwrap();
    let got: i64 = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
        .bind(mysql_name(&table, plain.as_str()))
        .fetch_one(&mut foreign)
        .await
        .unwrap();
    assert_eq!(got, 1);
    // Holder rows are written once a lock has been held for the
    // publication delay (10 ms).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pid = std::process::id();
    let ours = |t: u64| (String::new(), Some(t), Some(pid));
    let strip = |all: BTreeMap<String, (String, Option<u64>, Option<u32>)>| {
        all.into_iter()
            .map(|(k, (_, t, d))| (k, (String::new(), t, d)))
            .collect::<BTreeMap<_, _>>()
    };
    let expected: BTreeMap<String, _> = [
        (mixed.as_str().to_owned(), ours(m.token().get())),
        (long.as_str().to_owned(), ours(l.token().get())),
    ]
    .into();
    let all = listed(&backend, &prefix).await;
    assert_eq!(all[mixed.as_str()].0, m.owner().to_hex());
    // LIKE wildcards in a prefix are literal.
    let narrow = listed(&backend, &format!("{prefix}M")).await;
    assert_eq!(narrow.keys().collect::<Vec<_>>(), [mixed.as_str()]);
    for wild in ["%", "_ixed"] {
        let none = listed(&backend, &format!("{prefix}{wild}")).await;
        assert!(none.is_empty(), "prefix {wild:?} matched {none:?}");
    }
    assert_eq!(
        strip(all),
        expected,
        "held: the mixed-case and the long key"
    );
    let info = backend.inspect(&plain).await.unwrap().unwrap();
    assert!(info.holder.starts_with("server session "), "{info:?}");
    assert_eq!((info.token, info.details), (None, None));
    sqlx::query("SELECT RELEASE_LOCK(?)")
        .bind(mysql_name(&table, plain.as_str()))
        .execute(&mut foreign)
        .await
        .unwrap();

    // One sequence for every key: the four grants' tokens rise in grant
    // order, across keys.
    let tokens = [&m, &l, &p, &g].map(|lease| lease.token().get());
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    drop(foreign);
    for lease in [&m, &l] {
        assert!(backend.release(lease).await.unwrap());
    }
    // Nothing held under the prefix once the foreign session is gone.
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while !listed(&backend, &prefix).await.is_empty() {
        assert!(tokio::time::Instant::now() < until, "still listed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let bad = backend
        .list(&ListQuery::new(&prefix, 2).after(Some("other:1")))
        .await;
    assert!(matches!(&bad, Err(e) if e.kind() == ErrorKind::InvalidArgument));
}

/// PostgreSQL session mode: no details, `list` refused as Unsupported.
pub async fn postgres_lists_nothing(target: &SessionTarget) {
    let backend = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    assert!(!backend.capabilities().holder_details);
    let k = key("pgd");
    let lease = backend.try_acquire(&k, TTL).await.unwrap().unwrap();
    let info = backend.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.details, None);
    let refused = backend.list(&ListQuery::new(k.as_str(), 10)).await;
    assert!(
        matches!(&refused, Err(e) if e.kind() == ErrorKind::Unsupported),
        "{refused:?}"
    );
    assert!(backend.release(&lease).await.unwrap());
}

/// PostgreSQL's quiet grants (see the crate docs, "Published grants"), on
/// one session (`pool_size=1`): the first grant arms the session and
/// publishes itself; once released, a try sends the quiet grant, which a
/// task publishes after `publish_delay`. A quiet grant released before its
/// publication is due publishes nothing; a quiet grant of `a`, then `b` on
/// the same session (which publishes `distlock multi`): once both
/// publications are due, `inspect(b)` must not show `a`'s grant. A quiet
/// grant held alone is shown with its owner and token, by `inspect` right
/// after the grant too (it reads again after the publication delay). The
/// broken variant turns the publication checks off (the grant still held,
/// alone on its session): `a`'s publication then overwrites the multi
/// marker, and `inspect(b)` reports `a`'s token, which the check catches.
pub async fn postgres_quiet_publication(target: &SessionTarget) {
    for check in [true, false] {
        let (_proxy, url) = target.proxy("pool_size=1&publish_delay=200ms").await;
        let backend = SqlSessionBackend::connect_url(&url).await.unwrap();
        backend.set_publication_check(check);
        let tag = if check { "quiet" } else { "quiet-broken" };
        let (a, b) = (key(&format!("{tag}-a")), key(&format!("{tag}-b")));
        let first = backend.try_acquire(&a, TTL).await.unwrap().unwrap();
        assert!(backend.release(&first).await.unwrap());
        let young = backend.try_acquire(&a, TTL).await.unwrap().unwrap();
        assert!(backend.release(&young).await.unwrap());
        let held_a = backend.try_acquire(&a, TTL).await.unwrap().unwrap();
        let held_b = backend.try_acquire(&b, TTL).await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let seen_b = backend.inspect(&b).await.unwrap().unwrap();
        assert!(backend.release(&held_b).await.unwrap());
        assert!(backend.release(&held_a).await.unwrap());
        let verdict = match seen_b.token {
            Some(token) if token != held_b.token() => Err(format!(
                "inspect(b) showed token {token} (a's is {}, b's {})",
                held_a.token(),
                held_b.token()
            )),
            _ => Ok(()),
        };
        if !check {
            let caught = verdict.expect_err("broken variant: a's publication went unseen");
            println!("{}: broken variant caught: {caught}", target.name());
            continue;
        }
        verdict.unwrap();
        assert_eq!(seen_b.token, None, "b shares its session: {seen_b:?}");
        // Both released: nothing shown.
        assert!(backend.inspect(&a).await.unwrap().is_none());
        // A quiet grant alone: inspect right away waits for its publication.
        let alone = backend.try_acquire(&a, TTL).await.unwrap().unwrap();
        let seen = backend.inspect(&a).await.unwrap().unwrap();
        assert_eq!(seen.token, Some(alone.token()), "{seen:?}");
        assert_eq!(seen.holder, alone.owner().hex().as_str(), "{seen:?}");
        assert!(backend.release(&alone).await.unwrap());
        assert!(backend.inspect(&a).await.unwrap().is_none());
    }
}

/// MariaDB's waiting grant between its `GET_LOCK` and its publication (the
/// reply held by the proxy): the key's row is not the new holder's, so
/// `inspect` shows the holding session without owner or token and
/// `force_release` leaves it alone, although that session made the key's
/// previous grant (its row was deleted before the wait). Then the reply
/// arrives, the grant is published with a higher token. The broken
/// variant writes the deleted row back by hand: `inspect` then reports
/// the previous grant's owner and token for the new holder, which the
/// check catches.
pub async fn mariadb_waiting_grant_window(target: &SessionTarget) {
    let (proxy, url) = target.proxy("pool_size=1").await;
    let holder = SqlSessionBackend::connect_url(&url).await.unwrap();
    let probe = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let table = holder.config().table_name().to_owned();
    let k = key("window");
    let name = mysql_name(&table, k.as_str());
    let first = holder.try_acquire(&k, TTL).await.unwrap().unwrap();
    assert!(holder.release(&first).await.unwrap());
    let raw = target.raw_url().await;
    let mut foreign = sqlx::MySqlConnection::connect(&raw).await.unwrap();
    let got: i64 = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
        .bind(name.as_str())
        .fetch_one(&mut foreign)
        .await
        .unwrap();
    assert_eq!(got, 1);
    let waiting = {
        let holder = holder.clone();
        let k = k.clone();
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + Duration::from_secs(20);
            holder.acquire(&k, TTL, until).await
        })
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while target.waiting_sessions().await < 1 {
        assert!(tokio::time::Instant::now() < until, "no server-side wait");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.partition();
    sqlx::query("SELECT RELEASE_LOCK(?)")
        .bind(name.as_str())
        .execute(&mut foreign)
        .await
        .unwrap();
    let foreign_id: i64 = sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
        .fetch_one(&mut foreign)
        .await
        .unwrap();
    let mut seen = None;
    while tokio::time::Instant::now() < until {
        match probe.inspect(&k).await.unwrap() {
            Some(info) if info.holder != format!("server session {foreign_id}") => {
                seen = Some(info);
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let seen = seen.expect("the waiting session never got the lock");
    assert!(seen.holder.starts_with("server session "), "{seen:?}");
    assert_eq!(seen.token, None, "a token reported before the publication");
    let session: i64 = seen.holder["server session ".len()..].parse().unwrap();
    let refused = probe.force_release(&k).await;
    assert!(
        matches!(&refused, Err(e) if e.kind() == ErrorKind::Unsupported),
        "{refused:?}"
    );
    // Broken variant: the row the waiting grant deleted, written back.
    let holders = format!("`{table}_session_holders`");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {holders} (name, token, owner, conn, lock_name, details) \
         VALUES (?, ?, ?, ?, ?, NULL)"
    )))
    .bind(k.as_str().as_bytes())
    .bind(i64::try_from(first.token().get()).unwrap())
    .bind(first.owner().to_hex())
    .bind(session)
    .bind(name.as_str())
    .execute(&mut foreign)
    .await
    .unwrap();
    let stale = probe.inspect(&k).await.unwrap().unwrap();
    assert_eq!(
        stale.token,
        Some(first.token()),
        "broken variant: a stale row naming the waiting session was not read as its grant"
    );
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DELETE FROM {holders} WHERE name = ?"
    )))
    .bind(k.as_str().as_bytes())
    .execute(&mut foreign)
    .await
    .unwrap();
    proxy.heal();
    let lease = waiting.await.unwrap().unwrap();
    assert!(lease.token() > first.token());
    let info = probe.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.token, Some(lease.token()));
    assert!(holder.release(&lease).await.unwrap());
    println!(
        "{}: a waiting grant between its lock and its publication shows as server session \
         {session} without token (a stale row would have shown token {})",
        target.name(),
        first.token()
    );
}

/// The deferred holder row (see the crate docs, "Lazy holder rows") races
/// the release: a grant released before its publication is due, then the
/// key granted again on the same connection (`pool_size=1`), which holds
/// the lock when the first grant's publication comes due. Its release
/// (before its own publication) and a third grant follow. Nothing may be
/// left: no holder row for the key once all are released, and `inspect`
/// of the third grant never shows the first grant's token. The broken
/// variant turns off the check that a publication's grant is still held:
/// the first grant's row is written for a lock it no longer holds, left
/// behind, and read back as the third grant's holder (which
/// `force_release` would have trusted).
pub async fn mariadb_publication_race(target: &SessionTarget) {
    for check in [true, false] {
        let (_proxy, url) = target.proxy("pool_size=1&publish_delay=400ms").await;
        let backend = SqlSessionBackend::connect_url(&url).await.unwrap();
        backend.set_publication_check(check);
        let table = backend.config().table_name().to_owned();
        let k = key(if check { "race" } else { "race-broken" });
        let mut raw = sqlx::MySqlConnection::connect(&target.raw_url().await)
            .await
            .unwrap();
        let start = tokio::time::Instant::now();
        let at = |ms: u64| tokio::time::sleep_until(start + Duration::from_millis(ms));
        // First grant (publication due at 400 ms), released at once.
        let first = backend.try_acquire(&k, TTL).await.unwrap().unwrap();
        assert!(backend.release(&first).await.unwrap());
        // Second grant on the same connection (due at 600 ms), released
        // at 500 ms: after the first one's publication came due.
        at(200).await;
        let second = backend.try_acquire(&k, TTL).await.unwrap().unwrap();
        at(500).await;
        assert!(backend.release(&second).await.unwrap());
        at(800).await;
        let left = holder_row(&mut raw, &table, &k).await;
        let third = backend.try_acquire(&k, TTL).await.unwrap().unwrap();
        let seen = backend.inspect(&k).await.unwrap().unwrap();
        assert!(backend.release(&third).await.unwrap());
        let verdict = match (left, seen.token) {
            (Some(token), _) => Err(format!(
                "a holder row (token {token}) left behind once every grant was released"
            )),
            (None, Some(token)) if token != third.token() => Err(format!(
                "inspect showed token {token} for the grant of token {}",
                third.token()
            )),
            _ => Ok(()),
        };
        if check {
            verdict.unwrap();
            assert_eq!(seen.token, Some(third.token()), "{seen:?}");
            // Its release deleted the third grant's row.
            assert_eq!(
                holder_row(&mut raw, &table, &k).await,
                None,
                "the released grant's row stayed"
            );
        } else {
            let caught = verdict.expect_err("broken variant: the stale publication went unseen");
            assert_eq!(left, Some(i64::try_from(first.token().get()).unwrap()));
            println!("{}: broken variant caught: {caught}", target.name());
        }
    }
}

/// The token of `key`'s row in the holder table of `table`, if any.
async fn holder_row(raw: &mut sqlx::MySqlConnection, table: &str, key: &LockKey) -> Option<i64> {
    let statement = format!("SELECT token FROM `{table}_session_holders` WHERE name = ?");
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(statement))
        .bind(key.as_str().as_bytes())
        .fetch_optional(raw)
        .await
        .unwrap()
}
