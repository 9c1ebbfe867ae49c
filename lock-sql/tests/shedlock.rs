//! The ShedLock layout (`layout=shedlock`) against ShedLock's own
//! statements (`tests/shedlock_client`, a plain connection of its own) on
//! real PostgreSQL and MariaDB servers and a SQLite file, both directions:
//! while ShedLock holds, our try and short wait are refused; after its
//! unlock (row kept) ours takes the row; while ours holds, ShedLock's
//! insert fails and its update matches nothing; after our release its
//! update takes the row; tokens increase across ShedLock's turns.
//! Negative controls: a ShedLock update that ignores `lock_until`, and our
//! default layout, each get in beside the holder, and the same checks
//! report it. The shared conformance suite runs on the layout too (its
//! mutex cases; kinds and fault injection skip).

mod common;
mod shedlock_client;

use std::time::Duration;

use std::sync::Arc;

use conformance::deploy::{self, DeployedTarget, Opener};
use conformance::{Harness, OrSkip, run_cases, run_suite, short_cases};
use lock_core::{ErrorKind, LeaseKind, ListQuery, LockBackend, LockBackendExt, LockKey, OwnerId};
use lock_sql::{SqlAnyBackend, SqlBackend, SqlConfig, SqlSessionBackend};
use shedlock_client::ShedLock;
use tokio::time::Instant;

/// The three database tests take turns: each runs the shared suite, whose
/// 1 s operation timeout a 2-core machine running three suites at once
/// does not always meet.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// ShedLock's `lockedBy` (its host name).
const SHED_HOST: &str = "shedlock-host-1";

const OPTIONS: &str = "layout=shedlock&timeout=2s&pool_size=4";

/// The shared conformance suite's short cases on the ShedLock layout at
/// `url` (cases needing kinds, fairness or fault injection skip themselves
/// by capability or target); the whole suite runs on PostgreSQL.
async fn short_suite(name: &str, url: &str) {
    let target = Arc::new(common::UrlTarget {
        name: format!("{name}-shedlock"),
        url: url.to_owned(),
        open: Arc::new(|url: String| {
            Box::pin(
                async move { Ok(Arc::new(lock_sql::connect(&url).await?) as Arc<dyn LockBackend>) },
            )
        }),
    });
    run_cases(&Harness::new(target), &short_cases())
        .await
        .assert_passed();
}

/// A started deployment of `kind` whose clients use the ShedLock layout
/// (the suite's fault cases included: a paused server, proxied clients).
async fn deployed(kind: &str) -> Option<Arc<DeployedTarget>> {
    let opener: Opener = Arc::new(|url: String| {
        Box::pin(async move {
            let url = common::with_options(&url, "layout=shedlock");
            let url = common::with_options(&url, common::CLIENT_OPTIONS);
            Ok(Arc::new(lock_sql::connect(&url).await?) as Arc<dyn LockBackend>)
        })
    });
    let deployment = deploy::start(kind).await.or_skip()?;
    Some(Arc::new(DeployedTarget::new(deployment, opener)))
}

/// Our exclusion check: `backend` neither takes `key` at once nor within a
/// short wait. Anything it did get is released and reported.
async fn ours_refused(backend: &dyn LockBackend, key: &LockKey) -> Result<(), String> {
    let ttl = Duration::from_secs(5);
    if let Some(lease) = backend
        .try_acquire(key, ttl)
        .await
        .map_err(|e| e.to_string())?
    {
        let _ = backend.release(&lease).await;
        return Err(format!("{} took {key} beside its holder", backend.name()));
    }
    match backend
        .acquire(key, ttl, Instant::now() + Duration::from_millis(300))
        .await
    {
        Err(e) if e.is_contended() => Ok(()),
        Err(e) => Err(format!("unexpected error {e}")),
        Ok(lease) => {
            let _ = backend.release(&lease).await;
            Err(format!(
                "{} took {key} within a short wait beside its holder",
                backend.name()
            ))
        }
    }
}

/// ShedLock's exclusion check: its insert fails and its update matches
/// nothing.
async fn shedlock_refused(shed: &mut ShedLock, name: &str) -> Result<(), String> {
    let at_most = Duration::from_secs(30);
    if shed.insert(name, at_most).await {
        return Err(format!("{}'s insert took {name}", shed.locked_by));
    }
    match shed.update(name, at_most).await {
        0 => Ok(()),
        n => Err(format!(
            "{}'s update took {name} ({n} rows) beside its holder",
            shed.locked_by
        )),
    }
}

fn shed_of(backend: &SqlAnyBackend) -> &lock_sql::SqlShedLockBackend {
    backend.as_shedlock().expect("layout=shedlock")
}

/// Both directions on one database. `ours_url` has `layout=shedlock`;
/// `plain_url` is the database for ShedLock's connection and for our
/// default-layout negative control.
async fn interop(ours_url: &str, plain_url: &str) {
    let ours = lock_sql::connect(ours_url).await.unwrap();
    let shed_backend = shed_of(&ours);
    println!("{}: schema {:?}", ours.name(), shed_backend.schema_sql());
    for (label, sql) in shed_backend.statements_sql() {
        println!("{}: {label}: {sql}", ours.name());
    }
    let key = LockKey::new(format!("job-{}", &OwnerId::random().to_hex()[..12])).unwrap();
    let name = key.as_str();
    let mut shed = ShedLock::connect(plain_url, "shedlock", SHED_HOST).await;
    let at_most = Duration::from_secs(30);
    let ttl = Duration::from_secs(5);

    // ShedLock holds (its first lock of the name: the insert).
    assert!(
        shed.insert(name, at_most).await,
        "ShedLock's insert on a new name"
    );
    ours_refused(&ours, &key).await.unwrap();
    let info = ours.inspect(&key).await.unwrap().expect("held by ShedLock");
    assert_eq!(info.holder, SHED_HOST);
    assert_eq!(info.token, None, "a ShedLock holder has no token");
    assert_eq!(shed.extend(name, at_most).await, 1, "ShedLock's extend");
    ours_refused(&ours, &key).await.unwrap();
    // Negative control: our default layout does not see ShedLock's row.
    let lease_layout = SqlBackend::connect_url(&common::with_options(plain_url, "timeout=2s"))
        .await
        .unwrap();
    let caught = ours_refused(&lease_layout, &key).await;
    assert!(
        caught.is_err(),
        "the default layout must get in beside ShedLock"
    );
    println!("negative control (default layout): {}", caught.unwrap_err());

    // ShedLock's unlock keeps the row (lock_until = now): ours takes it.
    assert_eq!(shed.unlock(name, Duration::ZERO).await, 1);
    assert_eq!(shed.rows(name).await, 1);
    assert_eq!(shed.row(name).await.map(|r| r.1), Some(true));
    let first = ours
        .try_acquire(&key, ttl)
        .await
        .unwrap()
        .expect("free after unlock");
    let ours_by = shed_backend.locked_by(&first);
    assert!(ours_by.ends_with(&format!("/distlock/{}", first.owner().to_hex())));
    assert_eq!(shed.row(name).await, Some((ours_by.clone(), false)));

    // Ours holds: ShedLock's insert fails, its update, extend and unlock
    // match nothing.
    shedlock_refused(&mut shed, name).await.unwrap();
    assert_eq!(shed.extend(name, at_most).await, 0);
    assert_eq!(shed.unlock(name, Duration::ZERO).await, 0);
    // Another of ours (a new process, nothing cached) is refused too, and
    // its refused try does not move the holder's token.
    let newcomer = lock_sql::connect(ours_url).await.unwrap();
    ours_refused(&newcomer, &key).await.unwrap();
    ours.renew(&first).await.unwrap();
    let info = ours.inspect(&key).await.unwrap().expect("ours");
    assert_eq!(info.holder, ours_by);
    assert_eq!(info.token, Some(first.token()));
    shedlock_refused(&mut shed, name).await.unwrap();

    // Our release keeps the row; ShedLock's update takes it.
    assert!(ours.release(&first).await.unwrap());
    assert!(!ours.release(&first).await.unwrap(), "released twice");
    assert_eq!(shed.rows(name).await, 1);
    assert_eq!(shed.row(name).await, Some((ours_by, true)));
    if !shed.insert_is_upsert() {
        assert!(
            !shed.insert(name, at_most).await,
            "the row is kept: insert fails"
        );
    }
    assert_eq!(
        shed.update(name, at_most).await,
        1,
        "ShedLock's update after our release"
    );
    ours_refused(&ours, &key).await.unwrap();

    // ShedLock's lockAtLeastFor: its unlock keeps the lock until
    // locked_at + lockAtLeastFor; our wait gets it then.
    assert_eq!(shed.unlock(name, Duration::from_millis(700)).await, 1);
    assert!(ours.try_acquire(&key, ttl).await.unwrap().is_none());
    let second = ours
        .acquire(&key, ttl, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        second.token() > first.token(),
        "tokens go up across ShedLock's turn"
    );

    // ours -> ShedLock -> ours: tokens keep increasing. (On PostgreSQL
    // ShedLock's insert is an upsert that takes the free row itself.)
    assert!(ours.release(&second).await.unwrap());
    assert!(shed.lock(name, at_most).await);
    ours_refused(&ours, &key).await.unwrap();
    assert_eq!(shed.unlock(name, Duration::ZERO).await, 1);
    let third = ours.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert!(third.token() > second.token());
    assert!(ours.release(&third).await.unwrap());

    // Both at once on the free row, 40 times (ShedLock's update, as it
    // sends it for a name it has locked before; each side first in half of
    // the rounds): exactly one wins each time.
    let (mut ours_won, mut shed_won, mut last) = (0, 0, third.token());
    for round in 0..40 {
        let (mine, theirs) = if round % 2 == 0 {
            tokio::join!(ours.try_acquire(&key, ttl), shed.update(name, at_most))
        } else {
            let (theirs, mine) =
                tokio::join!(shed.update(name, at_most), ours.try_acquire(&key, ttl));
            (mine, theirs)
        };
        match (mine.unwrap(), theirs > 0) {
            (Some(lease), false) => {
                assert!(lease.token() > last, "token went backwards");
                last = lease.token();
                ours_won += 1;
                assert!(ours.release(&lease).await.unwrap());
            }
            (None, true) => {
                shed_won += 1;
                assert_eq!(shed.unlock(name, Duration::ZERO).await, 1);
            }
            (Some(_), true) => panic!("both took {name}"),
            (None, false) => panic!("nobody took the free {name}"),
        }
    }
    println!(
        "{}: races won: ours {ours_won}, ShedLock {shed_won}",
        ours.name()
    );

    // A ShedLock holder that dies (no unlock): free at lockAtMostFor.
    assert!(shed.lock(name, Duration::from_millis(600)).await);
    let since = Instant::now();
    let fourth = ours
        .acquire(&key, ttl, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    let waited = since.elapsed();
    assert!(
        waited >= Duration::from_millis(450),
        "took it after {waited:?}"
    );
    assert!(fourth.token() > last);
    assert!(ours.release(&fourth).await.unwrap());

    // Our lease expires: ShedLock's update takes the row; our renew and
    // release are refused.
    let short = ours
        .try_acquire(&key, Duration::from_millis(300))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(shed.update(name, at_most).await, 0, "still ours");
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(shed.update(name, at_most).await, 1, "ours expired");
    let err = ours.renew(&short).await.unwrap_err();
    assert!(err.is_not_held(), "{err}");
    assert!(!ours.release(&short).await.unwrap());
    assert_eq!(
        shed.row(name).await.map(|r| r.0),
        Some(SHED_HOST.to_owned())
    );
    assert_eq!(shed.unlock(name, Duration::ZERO).await, 1);

    // An operator deletes the row (a common way to clear a stuck ShedLock
    // lock): ours takes the name again, with a larger token.
    shed.delete(name).await;
    let again = ours
        .try_acquire(&key, ttl)
        .await
        .unwrap()
        .expect("row deleted");
    assert!(again.token() > short.token());
    assert!(ours.release(&again).await.unwrap());
    let short = again;

    // Negative control: a ShedLock update that ignores lock_until gets in
    // beside our holder, and the ShedLock check reports it.
    let held = ours.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert!(held.token() > short.token());
    shedlock_refused(&mut shed, name).await.unwrap();
    let mut broken = ShedLock::connect(plain_url, "shedlock", "shedlock-broken").await;
    broken.ignore_lock_until = true;
    let caught = shedlock_refused(&mut broken, name).await;
    assert!(caught.is_err(), "the broken ShedLock update must be caught");
    println!(
        "negative control (update without lock_until): {}",
        caught.unwrap_err()
    );
    // It took our row: our renew now fails.
    assert!(ours.renew(&held).await.unwrap_err().is_not_held());
    println!(
        "{}: tokens {} {} {} {} {} {}",
        ours.name(),
        first.token(),
        second.token(),
        third.token(),
        fourth.token(),
        short.token(),
        held.token()
    );
    operating(&ours, &mut shed, ours_url).await;
}

/// Issue 18 on the layout: holder details beside ShedLock's row (its
/// bytes unchanged, ShedLock still refused), never shown for a ShedLock
/// holder; list and force_release of a ShedLock holder; a gc that
/// collects nothing; no floor.
async fn operating(ours: &SqlAnyBackend, shed: &mut ShedLock, ours_url: &str) {
    let key = LockKey::new(format!("ops-{}", &OwnerId::random().to_hex()[..12])).unwrap();
    let name = key.as_str();
    let (ttl, at_most) = (Duration::from_secs(5), Duration::from_secs(30));
    let lease = ours.try_acquire(&key, ttl).await.unwrap().unwrap();
    let ours_by = shed_of(ours).locked_by(&lease);
    // ShedLock's row holds exactly what ShedLock compares; ShedLock is
    // still refused; the details come from the side table.
    assert_eq!(shed.row(name).await, Some((ours_by.clone(), false)));
    shedlock_refused(shed, name).await.unwrap();
    let info = ours.inspect(&key).await.unwrap().unwrap();
    let details = info.details.expect("details of our grant");
    assert_eq!(details.pid, std::process::id());
    let page = ours.list(&ListQuery::new(name, 10)).await.unwrap();
    assert_eq!(page.locks.len(), 1, "{page:?}");
    assert_eq!(page.locks[0].token, Some(lease.token()));
    assert!(ours.release(&lease).await.unwrap());

    // ShedLock holds after us: our stale details are not shown for it
    // (negative control: the side row still has them).
    assert_eq!(shed.update(name, at_most).await, 1);
    let info = ours.inspect(&key).await.unwrap().unwrap();
    assert_eq!((info.holder.as_str(), info.details), (SHED_HOST, None));
    let page = ours.list(&ListQuery::new(name, 10)).await.unwrap();
    assert_eq!(
        page.locks
            .iter()
            .map(|i| (i.holder.as_str(), i.token))
            .collect::<Vec<_>>(),
        [(SHED_HOST, None)]
    );
    // Breaking ShedLock's holder: its extend then matches nothing, ours
    // gets the name with a token above the last one.
    let broken = ours.force_release(&key).await.unwrap().expect("held");
    assert_eq!(broken.holder, SHED_HOST);
    assert_eq!(
        shed.extend(name, at_most).await,
        0,
        "broken ShedLock extends"
    );
    let next = ours.try_acquire(&key, ttl).await.unwrap().expect("free");
    assert!(next.token() > lease.token());
    // Breaking ours: our renew fails, our release says false.
    let ours_broken = ours.force_release(&key).await.unwrap().expect("held");
    assert_eq!(ours_broken.token, Some(next.token()));
    assert!(ours.renew(&next).await.unwrap_err().is_not_held());
    assert!(!ours.release(&next).await.unwrap());
    assert_eq!(ours.force_release(&key).await.unwrap(), None);
    // gc collects nothing on the layout (every row is kept), and leaves
    // ShedLock's row and our tokens row alone.
    let report = ours.gc(Duration::ZERO).await.unwrap();
    assert_eq!((report.removed, report.scanned), (0, 0), "{report:?}");
    let after = ours.try_acquire(&key, ttl).await.unwrap().expect("free");
    assert!(after.token() > next.token());
    assert!(ours.release(&after).await.unwrap());
    // No benchmark floor for the layout: refused, and none from the
    // driver's descriptor (so compare shows no floor instead of failing).
    let err = lock_bench::sql::SqlFloor::connect(ours_url)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let floor = lock_bench::for_driver("sql")
        .floor
        .expect("the driver has floors");
    assert!(floor(ours_url).await.unwrap().is_none());
}

/// What the layout refuses, and its table handling (SQLite and URLs only).
#[tokio::test]
async fn refusals_and_tables_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let url = format!("sqlite://{}?{OPTIONS}", path.display());
    let ours = lock_sql::connect(&url).await.unwrap();
    let ttl = Duration::from_secs(5);
    // Names up to 64 characters, as ShedLock's column.
    let longest = LockKey::new("n".repeat(64)).unwrap();
    let lease = ours.try_acquire(&longest, ttl).await.unwrap().unwrap();
    assert!(ours.release(&lease).await.unwrap());
    let too_long = LockKey::new("é".repeat(65)).unwrap();
    let err = ours.try_acquire(&too_long, ttl).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = ours
        .acquire(&too_long, ttl, Instant::now() + Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    // Only the mutex.
    let caps = ours.capabilities();
    assert!(!caps.shared_locks && !caps.semaphores && !caps.fifo);
    for kind in [
        LeaseKind::Read,
        LeaseKind::Write,
        LeaseKind::Permits { count: 1, limit: 2 },
    ] {
        let err = ours
            .try_acquire_kind(&longest, kind, ttl)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{kind:?}: {err}");
    }
    let err = lock_sql::connect(&format!("{url}&fair=true"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let err = SqlConfig::from_url("postgres://u@127.0.0.1:1/db?layout=shedlock&mode=session")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let err = SqlBackend::connect_url(&url).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let err = SqlSessionBackend::connect_url("postgres://u@127.0.0.1:1/db?layout=shedlock")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");

    // Missing tables with create_table=false: a Config error naming them.
    let other = dir.path().join("empty.db");
    let err = lock_sql::connect(&format!(
        "sqlite://{}?{OPTIONS}&create_table=false",
        other.display()
    ))
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.message().contains("\"shedlock\""), "{err}");
    // A table of that name without ShedLock's columns: refused, not altered.
    let odd = dir.path().join("odd.db");
    let odd_url = format!("sqlite://{}?mode=rwc", odd.display());
    {
        use lock_sql::sqlx::{self, Connection};
        let mut conn = sqlx::SqliteConnection::connect(&odd_url).await.unwrap();
        sqlx::query("CREATE TABLE shedlock (name TEXT PRIMARY KEY, until INTEGER)")
            .execute(&mut conn)
            .await
            .unwrap();
        let err = lock_sql::connect(&format!("sqlite://{}?{OPTIONS}", odd.display()))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        let columns: Vec<String> =
            sqlx::query_scalar("SELECT name FROM pragma_table_info('shedlock') ORDER BY cid")
                .fetch_all(&mut conn)
                .await
                .unwrap();
        assert_eq!(columns, ["name", "until"], "the existing table was altered");
    }
    // `table=` names the table; the tokens table follows it.
    let named = lock_sql::connect(&format!("{url}&table=jobs_lock"))
        .await
        .unwrap();
    let named = shed_of(&named);
    assert_eq!(named.quoted_table(), "\"jobs_lock\"");
    assert_eq!(named.quoted_tokens_table(), "\"jobs_lock_tokens\"");
    assert!(named.schema_sql()[0].contains("CREATE TABLE IF NOT EXISTS \"jobs_lock\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shedlock_statements_exclude_ours_on_sqlite() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let ours_url = format!("sqlite://{}?{OPTIONS}&busy_timeout=2s", path.display());
    // Created by our connect before ShedLock's connection opens it.
    let plain = format!("sqlite://{}", path.display());
    interop(&ours_url, &plain).await;
    short_suite("sqlite", &ours_url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shedlock_statements_exclude_ours_on_postgres() {
    let _serial = SERIAL.lock().await;
    let Some(target) = deployed("postgres").await else {
        return;
    };
    let url = target.url();
    interop(&common::with_options(&url, OPTIONS), &url).await;
    run_suite(&Harness::new(target)).await.assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shedlock_statements_exclude_ours_on_mariadb() {
    let _serial = SERIAL.lock().await;
    let Some(target) = deployed("mariadb").await else {
        return;
    };
    let url = target.url();
    interop(&common::with_options(&url, OPTIONS), &url).await;
    collations(&url).await;
    // The whole suite runs on PostgreSQL: MariaDB's statements differ, the
    // logic above them does not.
    run_cases(&Harness::new(target), &short_cases())
        .await
        .assert_passed();
}

/// MariaDB compares ShedLock names by the column's collation
/// (case-insensitive by default): `Job` and `job` are one lock, and share
/// one token counter. A tokens table whose collation differs is refused.
async fn collations(url: &str) {
    use lock_sql::sqlx::{self, Connection};
    let ours = lock_sql::connect(&common::with_options(url, OPTIONS))
        .await
        .unwrap();
    let suffix = &OwnerId::random().to_hex()[..8];
    let upper = LockKey::new(format!("Job-{suffix}")).unwrap();
    let lower = LockKey::new(format!("job-{suffix}")).unwrap();
    let ttl = Duration::from_secs(5);
    let held = ours.try_acquire(&upper, ttl).await.unwrap().unwrap();
    assert!(
        ours.try_acquire(&lower, ttl).await.unwrap().is_none(),
        "one lock"
    );
    assert!(ours.release(&held).await.unwrap());
    let next = ours.try_acquire(&lower, ttl).await.unwrap().unwrap();
    assert!(next.token() > held.token(), "one token counter");
    assert!(ours.release(&next).await.unwrap());

    let mut conn = sqlx::MySqlConnection::connect(url).await.unwrap();
    for statement in [
        "CREATE TABLE shed_mix (name VARCHAR(64) NOT NULL, lock_until TIMESTAMP(3) NOT NULL, \
         locked_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), \
         locked_by VARCHAR(255) NOT NULL, PRIMARY KEY (name))",
        "CREATE TABLE shed_mix_tokens (name VARBINARY(64) NOT NULL PRIMARY KEY, token BIGINT NOT NULL)",
    ] {
        sqlx::query(statement).execute(&mut conn).await.unwrap();
    }
    let err = lock_sql::connect(&common::with_options(
        url,
        &format!("{OPTIONS}&table=shed_mix"),
    ))
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.message().contains("collation"), "{err}");
}
