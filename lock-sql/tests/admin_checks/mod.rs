//! Row mode's operating calls on one database (issue 18), beside the
//! shared suite's admin cases: `gc` keeps every token monotonic and never
//! collects a held key, the `details` column is added to a table created
//! before it (by concurrent connects), `list` escapes `LIKE` wildcards and
//! refuses foreign cursors. Each check has its negative control.

use std::time::Duration;

use lock_core::{ErrorKind, LeaseKind, ListQuery, LockBackend, LockBackendExt, LockKey, LockShape};
use lock_sql::SqlBackend;
use lock_sql::sqlx::{self, AssertSqlSafe};

use crate::common::with_options;

const TTL: Duration = Duration::from_secs(30);

/// A fresh table for this run.
fn table(stem: &str) -> String {
    format!("adm_{stem}_{:08x}", rand_suffix())
}

fn rand_suffix() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    nanos ^ std::process::id().rotate_left(16)
}

/// Runs `sql` on the backend's users' pool, whatever the database.
async fn raw(backend: &SqlBackend, sql: &str) {
    let sql = AssertSqlSafe(sql.to_owned());
    if let Some(pool) = backend.pg_pool() {
        sqlx::query(sql).execute(pool).await.map(drop)
    } else if let Some(pool) = backend.mysql_pool() {
        sqlx::query(sql).execute(pool).await.map(drop)
    } else if let Some(pool) = backend.sqlite_pool() {
        sqlx::query(sql).execute(pool).await.map(drop)
    } else {
        unreachable!("a SqlBackend has one of the three pools")
    }
    .unwrap_or_else(|e| panic!("raw statement failed: {e}"));
}

/// Takes and gives back `key` `times` times; the last token.
async fn cycle(backend: &SqlBackend, key: &LockKey, times: usize) -> u64 {
    let mut last = 0;
    for _ in 0..times {
        let lease = backend.try_acquire(key, TTL).await.unwrap().expect("free");
        last = lease.token().get();
        assert!(backend.release(&lease).await.unwrap());
    }
    last
}

/// `Err` when the re-granted token is not above the one before removal.
fn monotonic(before: u64, after: u64) -> Result<(), String> {
    if after > before {
        Ok(())
    } else {
        Err(format!("token went backwards: {before} then {after}"))
    }
}

pub(crate) async fn admin_checks(url: &str) {
    gc_keeps_tokens_monotonic(url).await;
    details_column_is_added(url).await;
    list_escapes_and_refuses(url).await;
    watch_wakes_on_release(url).await;
    // Observers of an election wake on the same release wake-ups.
    let url = with_options(url, &format!("table={}", table("elect")));
    let candidate = SqlBackend::connect_url(&url).await.unwrap();
    let observer = SqlBackend::connect_url(&url).await.unwrap();
    let took = conformance::cases::observer_sees_resignation(
        std::sync::Arc::new(candidate),
        std::sync::Arc::new(observer),
    )
    .await
    .unwrap();
    println!("observer saw the resignation after {took:?}");
}

/// `watch_holder` of a held key wakes on the release wake-up (PostgreSQL's
/// `NOTIFY`; this process's own release on MariaDB and SQLite): with a
/// poll of a minute, a release and a `force_release` are seen within 1 s.
/// The control: an expiry publishes nothing, so the same watch sees it
/// only when it reads again at its 2 s deadline (the early wake-ups came
/// from the release, not from a read).
async fn watch_wakes_on_release(base: &str) {
    let url = with_options(base, &format!("table={}", table("watch")));
    let holder = SqlBackend::connect_url(&url).await.unwrap();
    let watcher = SqlBackend::connect_url(&url).await.unwrap();
    let poll = Duration::from_secs(60);
    for how in ["release", "force_release", "expiry"] {
        let key = LockKey::new(format!("watch/{how}")).unwrap();
        let ttl = if how == "expiry" {
            Duration::from_millis(500)
        } else {
            TTL
        };
        let lease = holder.try_acquire(&key, ttl).await.unwrap().unwrap();
        let act = async {
            match how {
                "release" => assert!(holder.release(&lease).await.unwrap()),
                "force_release" => assert!(watcher.force_release(&key).await.unwrap().is_some()),
                _ => {}
            }
        };
        let limit = Duration::from_secs(2);
        let (now, waited) = conformance::cases::watch_across(
            std::sync::Arc::new(watcher.clone()),
            &key,
            poll,
            limit,
            act,
        )
        .await
        .unwrap();
        println!("watch {how}: seen free after {waited:?}");
        assert!(now.is_none(), "{how}: still held after {waited:?}");
        if how == "expiry" {
            assert!(
                waited >= Duration::from_secs(2),
                "{how}: woke after {waited:?}"
            );
        } else {
            assert!(
                waited < Duration::from_secs(1),
                "{how}: woke after {waited:?}"
            );
        }
    }
}

async fn gc_keeps_tokens_monotonic(base: &str) {
    let url = with_options(base, &format!("table={}", table("gc")));
    let backend = SqlBackend::connect_url(&url).await.unwrap();
    let stale = LockKey::new("gc/stale").unwrap();
    let held = LockKey::new("gc/held").unwrap();
    let expired = LockKey::new("gc/expired").unwrap();
    let before = cycle(&backend, &stale, 3).await;
    let lease = backend.try_acquire(&held, TTL).await.unwrap().unwrap();
    let short = backend
        .try_acquire(&expired, Duration::from_millis(20))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Rows used within the hour stay.
    let young = backend.gc(Duration::from_secs(3600)).await.unwrap();
    assert_eq!(young.removed, 0, "{young:?}");

    let report = backend.gc(Duration::ZERO).await.unwrap();
    assert_eq!(
        report.removed, 2,
        "the released and the expired row: {report:?}"
    );
    let floor = report
        .token_floor
        .expect("a floor after removing rows")
        .get();
    assert!(floor >= before.max(short.token().get()), "{report:?}");
    // The held key is never collected: still ours, still renewable.
    assert_eq!(
        backend.inspect(&held).await.unwrap().map(|i| i.token),
        Some(Some(lease.token()))
    );
    backend.renew(&lease).await.unwrap();
    let again = backend.try_acquire(&stale, TTL).await.unwrap().unwrap();
    monotonic(before, again.token().get()).unwrap();
    assert!(again.token().get() > floor);
    let late = backend.try_acquire(&expired, TTL).await.unwrap().unwrap();
    monotonic(short.token().get(), late.token().get()).unwrap();
    // Nothing left to collect: the rows are held or young.
    assert_eq!(backend.gc(Duration::ZERO).await.unwrap().removed, 0);
    println!(
        "{}: gc removed {} (scanned {}), floor {floor}, re-grant {} > {before}",
        backend.name(),
        report.removed,
        report.scanned,
        again.token()
    );

    // Negative control: a row deleted by hand (no floor raised) restarts
    // at 1, and the check above reports it.
    let control = LockKey::new("gc/control").unwrap();
    let fresh = SqlBackend::connect_url(&with_options(base, &format!("table={}", table("gcctl"))))
        .await
        .unwrap();
    let before = cycle(&fresh, &control, 3).await;
    let t = fresh.quoted_table().to_owned();
    raw(&fresh, &format!("DELETE FROM {t}")).await;
    let after = cycle(&fresh, &control, 1).await;
    assert!(
        monotonic(before, after).is_err(),
        "the control's token did not go back: {before} then {after}"
    );
    fresh.close().await.unwrap();
    backend.close().await.unwrap();
}

async fn details_column_is_added(url: &str) {
    let url = with_options(url, &format!("table={}", table("mig")));
    let first = SqlBackend::connect_url(&url).await.unwrap();
    let t = first.quoted_table().to_owned();
    // The shared holders table's name, quoted the same way.
    let quote = &t[t.len() - 1..];
    let holders = format!("{}_holders{quote}", &t[..t.len() - 1]);
    raw(&first, &format!("ALTER TABLE {t} DROP COLUMN details")).await;
    raw(
        &first,
        &format!("ALTER TABLE {holders} DROP COLUMN details"),
    )
    .await;
    let key = LockKey::new("mig/k").unwrap();
    let shared = LockKey::new("mig/r").unwrap();
    // Negative control: without the columns the grant statements fail.
    let broken = first.try_acquire(&key, TTL).await;
    assert!(broken.is_err(), "a grant without the column: {broken:?}");
    let broken = first.try_acquire_kind(&shared, LeaseKind::Read, TTL).await;
    assert!(
        broken.is_err(),
        "a read grant without the column: {broken:?}"
    );
    // Concurrent connects add it once; none fails.
    let connects: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { SqlBackend::connect_url(&url).await })
        })
        .collect();
    let mut backends = Vec::new();
    for c in connects {
        backends.push(c.await.unwrap().expect("a concurrent connect"));
    }
    let lease = first.try_acquire(&key, TTL).await.unwrap().unwrap();
    let info = backends[0].inspect(&key).await.unwrap().unwrap();
    let details = info.details.expect("details after the column was added");
    assert_eq!(details.pid, std::process::id());
    assert!(first.release(&lease).await.unwrap());
    let reader = first
        .try_acquire_kind(&shared, LeaseKind::Read, TTL)
        .await
        .unwrap()
        .unwrap();
    let listed = backends[0]
        .holders(&shared, LockShape::ReadWrite)
        .await
        .unwrap();
    let details = listed[0].details.as_ref().expect("a reader's details");
    assert_eq!(details.pid, std::process::id());
    assert!(first.release(&reader).await.unwrap());
    for b in backends {
        b.close().await.unwrap();
    }
    first.close().await.unwrap();
}

async fn list_escapes_and_refuses(url: &str) {
    let url = with_options(url, &format!("table={}", table("list")));
    let backend = SqlBackend::connect_url(&url).await.unwrap();
    let wild = LockKey::new("l%x/1").unwrap();
    let plain = LockKey::new("lZx/1").unwrap();
    let under = LockKey::new("l_x/1").unwrap();
    let mut leases = Vec::new();
    for key in [&wild, &plain, &under] {
        leases.push(backend.try_acquire(key, TTL).await.unwrap().unwrap());
    }
    let names = |page: lock_core::LockPage| {
        page.locks
            .into_iter()
            .map(|i| i.key.as_str().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(backend.list(&ListQuery::new("l%x", 100)).await.unwrap()),
        ["l%x/1"]
    );
    assert_eq!(
        names(backend.list(&ListQuery::new("l_x", 100)).await.unwrap()),
        ["l_x/1"]
    );
    // Control: the unescaped pattern's other matches exist and are listed
    // under their common prefix.
    assert_eq!(
        names(backend.list(&ListQuery::new("l", 100)).await.unwrap()).len(),
        3
    );
    for bad in ["nope", "sql1:zz"] {
        let err = backend
            .list(&ListQuery::new("", 10).after(Some(bad)))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad}: {err}");
    }
    let err = backend.list(&ListQuery::new("", 0)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    // list_shared escapes the same way and takes the same cursors.
    let mut readers = Vec::new();
    for key in [&wild, &plain, &under] {
        let kind = LeaseKind::Read;
        readers.push(
            backend
                .try_acquire_kind(key, kind, TTL)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let shared = |prefix: &'static str| {
        let backend = backend.clone();
        async move {
            let query = ListQuery::new(prefix, 100);
            let page = backend.list_shared(LockShape::ReadWrite, &query);
            let page = page.await.unwrap();
            let keys: Vec<_> = page
                .locks
                .iter()
                .map(|l| l.key.as_str().to_owned())
                .collect();
            keys
        }
    };
    assert_eq!(shared("l%x").await, ["l%x/1"]);
    assert_eq!(shared("l_x").await, ["l_x/1"]);
    assert_eq!(shared("l").await.len(), 3);
    let err = backend
        .list_shared(
            LockShape::Semaphore,
            &ListQuery::new("", 10).after(Some("sql1:zz")),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    for lease in &readers {
        assert!(backend.release(lease).await.unwrap());
    }
    // A free key: nothing to break.
    for lease in &leases {
        assert!(backend.release(lease).await.unwrap());
    }
    assert_eq!(backend.force_release(&wild).await.unwrap(), None);
    backend.close().await.unwrap();
}
