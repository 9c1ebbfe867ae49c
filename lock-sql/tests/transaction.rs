//! Transaction-scoped locks ([`TransactionLocks`]) against PostgreSQL and
//! MariaDB started by the harness and a SQLite file: granted inside a
//! transaction, held by it against other transactions until its commit or
//! rollback, tokens that increase, tries that refuse, waits that end in
//! `Contended` (PostgreSQL: leaving the caller's transaction usable), a
//! deadlock broken by the server (PostgreSQL: `WouldDeadlock`), and
//! exclusion with the backend of the same URL (PostgreSQL session mode's
//! advisory locks, row mode's leases) both ways.
//!
//! Every exclusion check is a function answering `Err` on a violation; each
//! is also run on a broken variant, transaction locks of another table
//! (their keys map to other advisory keys and rows), and must catch it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use lock_core::{ErrorKind, LockBackend, LockBackendExt, LockKey};
use lock_sql::sqlx::{self, Pool};
use lock_sql::{SqlDialect, TransactionLockKind, TransactionLocks, TxDatabase};
use tokio::time::Instant;

/// A row-mode or session-mode lease's TTL in these checks.
const TTL: Duration = Duration::from_secs(30);

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

/// `url` with our options added.
/// The token of a try in `tx` that must be granted.
async fn granted_token<DB: TxDatabase>(
    locks: &TransactionLocks,
    tx: &mut sqlx::Transaction<'static, DB>,
    key: &LockKey,
) -> lock_core::FencingToken {
    let guard = locks.try_lock_in(tx, key).await.unwrap();
    guard.expect("a free key is granted").token()
}

fn with(url: &str, options: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{options}")
}

/// While a transaction of `first` holds `key`, a transaction of `second`
/// is refused; once the first commits, a new transaction of `second` gets
/// the key with a higher token.
async fn transactions_exclude<DB: TxDatabase>(
    first: &TransactionLocks,
    second: &TransactionLocks,
    pool: &Pool<DB>,
    key: &LockKey,
) -> Result<(), String> {
    let mut tx1 = pool.begin().await.unwrap();
    let held = first.try_lock_in(&mut tx1, key).await.unwrap();
    let held = held.ok_or("a free key was refused")?;
    let token = held.token();
    drop(held);
    let mut tx2 = pool.begin().await.unwrap();
    let other = second.try_lock_in(&mut tx2, key).await.unwrap();
    let other_token = other.as_ref().map(|g| g.token());
    drop(other);
    tx2.rollback().await.unwrap();
    tx1.commit().await.unwrap();
    if let Some(t) = other_token {
        return Err(format!(
            "a second transaction got {key} (token {t:?}) while the first held it (token {token:?})"
        ));
    }
    let mut tx3 = pool.begin().await.unwrap();
    let next = second.try_lock_in(&mut tx3, key).await.unwrap();
    let next = next.ok_or("the key was still held after the holder committed")?;
    let next_token = next.token();
    drop(next);
    tx3.commit().await.unwrap();
    if next_token <= token {
        return Err(format!(
            "the token went from {token:?} to {next_token:?} over two committed grants"
        ));
    }
    Ok(())
}

/// A rollback ends the lock.
async fn rollback_frees<DB: TxDatabase>(locks: &TransactionLocks, pool: &Pool<DB>, key: &LockKey) {
    let mut tx1 = pool.begin().await.unwrap();
    let held = locks.try_lock_in(&mut tx1, key).await.unwrap();
    assert!(held.is_some());
    drop(held);
    tx1.rollback().await.unwrap();
    let mut tx2 = pool.begin().await.unwrap();
    let again = locks.try_lock_in(&mut tx2, key).await.unwrap();
    assert!(again.is_some(), "the key was still held after a rollback");
    drop(again);
    tx2.commit().await.unwrap();
}

/// A waiting `lock_in` on a key another transaction holds ends in
/// `Contended` at its deadline; the waiting transaction is handed back
/// for the caller's checks.
async fn wait_times_out<DB: TxDatabase>(
    locks: &TransactionLocks,
    pool: &Pool<DB>,
    key: &LockKey,
    check_waiter: impl AsyncFnOnce(&mut sqlx::Transaction<'static, DB>),
) {
    let mut tx1 = pool.begin().await.unwrap();
    let held = locks.try_lock_in(&mut tx1, key).await.unwrap();
    assert!(held.is_some());
    drop(held);
    let mut tx2 = pool.begin().await.unwrap();
    let err = locks
        .lock_in(&mut tx2, key, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended, "{err}");
    check_waiter(&mut tx2).await;
    tx2.rollback().await.unwrap();
    tx1.commit().await.unwrap();
}

/// A waiting `lock_in` of `second` is granted only after the holding
/// transaction of `first` ended: the holder marks `ending` before its
/// commit, and the waiter must find it marked once granted.
async fn waiter_granted_after_commit<DB: TxDatabase>(
    first: &TransactionLocks,
    second: Arc<TransactionLocks>,
    pool: &Pool<DB>,
    key: &LockKey,
) -> Result<(), String> {
    let mut tx1 = pool.begin().await.unwrap();
    let held = first.try_lock_in(&mut tx1, key).await.unwrap();
    assert!(held.is_some());
    drop(held);
    let ending = Arc::new(AtomicBool::new(false));
    let mut waiter = {
        let (pool, key, ending) = (pool.clone(), key.clone(), Arc::clone(&ending));
        tokio::spawn(async move {
            let mut tx2 = pool.begin().await.unwrap();
            let granted = second
                .lock_in(&mut tx2, &key, Duration::from_secs(20))
                .await;
            let ended_first = ending.load(Ordering::SeqCst);
            let granted = granted.map(|g| g.token());
            tx2.commit().await.unwrap();
            (granted, ended_first)
        })
    };
    // Give the waiter time to start waiting, or (broken) to be granted:
    // it cannot finish before the commit unless it was granted.
    let early = tokio::time::timeout(Duration::from_secs(2), &mut waiter).await;
    ending.store(true, Ordering::SeqCst);
    tx1.commit().await.unwrap();
    let (granted, ended_first) = match early {
        Ok(done) => done.unwrap(),
        Err(_) => waiter.await.unwrap(),
    };
    granted.map_err(|e| format!("the waiter was not granted after the commit: {e}"))?;
    if !ended_first {
        return Err("the waiter was granted while the holder's transaction was open".into());
    }
    Ok(())
}

/// Exclusion with `backend` (the backend of the same URL), one way: a
/// lease of the backend refuses the transaction lock (try and wait); the
/// transaction gets the key once the lease is released.
async fn lease_excludes_transaction<DB: TxDatabase>(
    locks: &TransactionLocks,
    backend: &dyn LockBackend,
    pool: &Pool<DB>,
    key: &LockKey,
) -> Result<(), String> {
    let lease = backend.try_acquire(key, TTL).await.unwrap().unwrap();
    let mut tx = pool.begin().await.unwrap();
    let tried = locks
        .try_lock_in(&mut tx, key)
        .await
        .unwrap()
        .map(|g| g.token());
    let waited = match tried {
        Some(_) => None,
        None => Some(
            locks
                .lock_in(&mut tx, key, Duration::from_millis(300))
                .await
                .map(|g| g.token()),
        ),
    };
    tx.rollback().await.unwrap();
    backend.release(&lease).await.unwrap();
    if let Some(token) = tried {
        return Err(format!(
            "a transaction got {key} (token {token:?}) while a lease held it"
        ));
    }
    match waited {
        Some(Err(e)) if e.kind() == ErrorKind::Contended => {}
        other => return Err(format!("a wait on a leased key answered {other:?}")),
    }
    let mut tx = pool.begin().await.unwrap();
    let held = locks.try_lock_in(&mut tx, key).await.unwrap().is_some();
    tx.commit().await.unwrap();
    if !held {
        return Err("the released key was refused to a transaction".into());
    }
    Ok(())
}

/// Exclusion with `backend`, the other way: while a transaction lock
/// (`take` locks the key in the transaction it is given) holds the key
/// the backend's try does not get it; the backend gets it once the
/// transaction committed.
async fn transaction_excludes_backend<DB: TxDatabase>(
    take: impl AsyncFnOnce(&mut sqlx::Transaction<'static, DB>) -> bool,
    backend: &dyn LockBackend,
    pool: &Pool<DB>,
    key: &LockKey,
) -> Result<(), String> {
    let mut tx = pool.begin().await.unwrap();
    if !take(&mut tx).await {
        return Err("a free key was refused to a transaction".into());
    }
    // The backend's try may wait for the transaction's row lock up to its
    // operation timeout (an error then) or answer "held": anything but a
    // grant.
    let during = backend.try_acquire(key, Duration::from_secs(2)).await;
    tx.commit().await.unwrap();
    if let Ok(Some(lease)) = during {
        backend.release(&lease).await.unwrap();
        return Err(format!("the backend got {key} while a transaction held it"));
    }
    // A try that timed out may still be granted on the server once the
    // transaction ended (for its short TTL): wait it out.
    let after = backend
        .acquire(key, TTL, Instant::now() + Duration::from_secs(20))
        .await
        .map_err(|e| format!("the backend could not get the key after the commit: {e}"))?;
    backend.release(&after).await.unwrap();
    Ok(())
}

/// Both ways of exclusion with `backend`, on `locks` and (each caught) on
/// `broken`; on SQLite, where any transaction lock holds the whole file,
/// the transaction side's broken variant skips the lock instead.
async fn backend_checks<DB: TxDatabase>(
    locks: &TransactionLocks,
    broken: &TransactionLocks,
    backend: &dyn LockBackend,
    pool: &Pool<DB>,
    name: &str,
) {
    let k = |s: &str| key(&format!("tx/{name}/{s}"));
    lease_excludes_transaction(locks, backend, pool, &k("lease"))
        .await
        .unwrap();
    let caught = lease_excludes_transaction(broken, backend, pool, &k("lease-broken")).await;
    assert!(caught.is_err(), "{name}: the broken variant went unseen");
    let key_tx = k("tx");
    let taken = async |tx: &mut sqlx::Transaction<'static, DB>| {
        locks.try_lock_in(tx, &key_tx).await.unwrap().is_some()
    };
    transaction_excludes_backend(taken, backend, pool, &key_tx)
        .await
        .unwrap();
    let key_broken = k("tx-broken");
    let caught = if locks.dialect() == SqlDialect::Sqlite {
        let skipped = async |_: &mut sqlx::Transaction<'static, DB>| true;
        transaction_excludes_backend(skipped, backend, pool, &key_broken).await
    } else {
        let wrong = async |tx: &mut sqlx::Transaction<'static, DB>| {
            broken.try_lock_in(tx, &key_broken).await.unwrap().is_some()
        };
        transaction_excludes_backend(wrong, backend, pool, &key_broken).await
    };
    assert!(caught.is_err(), "{name}: the broken variant went unseen");
}

/// The checks every database runs on `locks` (and `broken`, locks of
/// another table, where a check must fail).
async fn common_checks<DB: TxDatabase>(
    locks: Arc<TransactionLocks>,
    broken: Arc<TransactionLocks>,
    backend: &dyn LockBackend,
    pool: &Pool<DB>,
    name: &str,
) {
    let k = |s: &str| key(&format!("tx/{name}/{s}"));
    transactions_exclude(&locks, &locks, pool, &k("exclude"))
        .await
        .unwrap();
    let caught = transactions_exclude(&locks, &broken, pool, &k("exclude-broken")).await;
    assert!(caught.is_err(), "{name}: the broken variant went unseen");

    rollback_frees(&locks, pool, &k("rollback")).await;

    backend_checks(&locks, &broken, backend, pool, name).await;

    // Tokens increase over grants (and the same transaction may take the
    // key again, with a new token).
    let key = k("tokens");
    let mut tx = pool.begin().await.unwrap();
    let a = granted_token(&locks, &mut tx, &key).await;
    let b = granted_token(&locks, &mut tx, &key).await;
    tx.commit().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let c = granted_token(&locks, &mut tx, &key).await;
    tx.commit().await.unwrap();
    assert!(a < b && b < c, "{name}: tokens {a:?}, {b:?}, {c:?}");
}

/// Server databases (PostgreSQL, MariaDB) also wait for a holder's commit.
async fn waiting_checks<DB: TxDatabase>(
    locks: Arc<TransactionLocks>,
    broken: Arc<TransactionLocks>,
    pool: &Pool<DB>,
    name: &str,
) {
    let k = |s: &str| key(&format!("tx/{name}/{s}"));
    waiter_granted_after_commit(&locks, Arc::clone(&locks), pool, &k("wait"))
        .await
        .unwrap();
    let caught = waiter_granted_after_commit(&locks, broken, pool, &k("wait-broken")).await;
    assert!(caught.is_err(), "{name}: the broken variant went unseen");
}

/// Two transactions each holding one key and waiting for the other's: the
/// server breaks the deadlock by failing one wait, answered
/// `WouldDeadlock`, whose transaction stays usable (the wait's savepoint
/// was rolled back); the other is granted once the first ends.
async fn deadlock_is_broken(locks: &Arc<TransactionLocks>, pool: &sqlx::PgPool, name: &str) {
    let (a, b) = (
        key(&format!("tx/{name}/deadlock-a")),
        key(&format!("tx/{name}/deadlock-b")),
    );
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let run = |first: LockKey, second: LockKey| {
        let (pool, locks, barrier) = (pool.clone(), Arc::clone(locks), Arc::clone(&barrier));
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            assert!(locks.try_lock_in(&mut tx, &first).await.unwrap().is_some());
            barrier.wait().await;
            let waited = locks
                .lock_in(&mut tx, &second, Duration::from_secs(30))
                .await
                .map(|g| g.token());
            if waited.is_ok() {
                tx.commit().await.unwrap();
            } else {
                let one: i32 = sqlx::query_scalar("SELECT 1")
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                assert_eq!(one, 1, "the deadlock's victim cannot use its transaction");
                tx.rollback().await.unwrap();
            }
            waited.map_err(|e| e.kind())
        })
    };
    let first = run(a.clone(), b.clone());
    let second = run(b, a);
    let mut outcomes = [first.await.unwrap(), second.await.unwrap()];
    outcomes.sort_by_key(Result::is_ok);
    assert!(
        matches!(outcomes, [Err(ErrorKind::WouldDeadlock), Ok(_)]),
        "{name}: {outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let Some(server) = PostgresServer::start().await.or_skip() else {
        return;
    };
    let url = server.url();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    for (mode, kind) in [
        ("mode=session", TransactionLockKind::Advisory),
        ("mode=row", TransactionLockKind::Row),
    ] {
        let options = format!("{mode}&table=tx_locks&timeout=1s");
        let locks = Arc::new(TransactionLocks::from_url(&with(&url, &options)).unwrap());
        assert_eq!(locks.kind(), kind);
        let broken_options = format!("{mode}&table=tx_other&timeout=1s");
        let broken = Arc::new(TransactionLocks::from_url(&with(&url, &broken_options)).unwrap());
        let backend = lock_sql::connect(&with(&url, &options)).await.unwrap();
        locks.prepare(&pool).await.unwrap();
        broken.prepare(&pool).await.unwrap();
        let name = format!("postgres-{kind:?}");
        common_checks(
            Arc::clone(&locks),
            Arc::clone(&broken),
            &backend,
            &pool,
            &name,
        )
        .await;
        waiting_checks(Arc::clone(&locks), Arc::clone(&broken), &pool, &name).await;

        // A wait that times out leaves the caller's transaction usable,
        // with its own lock_timeout back.
        wait_times_out(
            &locks,
            &pool,
            &key(&format!("tx/{name}/timeout")),
            async |tx: &mut sqlx::Transaction<'static, sqlx::Postgres>| {
                let setting: String = sqlx::query_scalar("SHOW lock_timeout")
                    .fetch_one(&mut **tx)
                    .await
                    .unwrap();
                assert_eq!(setting, "0", "lock_timeout was left changed");
            },
        )
        .await;
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("SET LOCAL lock_timeout = '7s'")
            .execute(&mut *tx)
            .await
            .unwrap();
        let k = key(&format!("tx/{name}/usable"));
        let mut holder = pool.begin().await.unwrap();
        let held = locks.try_lock_in(&mut holder, &k).await.unwrap();
        assert!(held.is_some());
        drop(held);
        let err = locks
            .lock_in(&mut tx, &k, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Contended);
        let one: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(
            one, 1,
            "the transaction is not usable after a timed-out wait"
        );
        let setting: String = sqlx::query_scalar("SHOW lock_timeout")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(setting, "7s");
        holder.commit().await.unwrap();
        // The same transaction takes the key once it is free, and its own
        // work commits with it.
        let mut guard = locks
            .lock_in(&mut tx, &k, Duration::from_secs(5))
            .await
            .unwrap();
        sqlx::query("SELECT 1").execute(guard.conn()).await.unwrap();
        drop(guard);
        tx.commit().await.unwrap();

        deadlock_is_broken(&locks, &pool, &name).await;
    }

    // Session mode's advisory keys: a transaction lock and a session-mode
    // lock of the same key exclude each other (checked above for the
    // session kind); the row kind takes the same advisory key too.
    let session = lock_sql::connect(&with(&url, "mode=session&table=tx_locks&timeout=1s"))
        .await
        .unwrap();
    let row_locks = TransactionLocks::from_url(&with(&url, "table=tx_locks&timeout=1s")).unwrap();
    let k = key("tx/postgres/row-vs-session");
    let lease = session.try_acquire(&k, TTL).await.unwrap().unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(row_locks.try_lock_in(&mut tx, &k).await.unwrap().is_none());
    tx.rollback().await.unwrap();
    session.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb() {
    let Some(server) = MariaDbServer::start().await.or_skip() else {
        return;
    };
    let url = server.url();
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    let locks =
        Arc::new(TransactionLocks::from_url(&with(&url, "table=tx_locks&timeout=1s")).unwrap());
    let broken =
        Arc::new(TransactionLocks::from_url(&with(&url, "table=tx_other&timeout=1s")).unwrap());
    assert_eq!(locks.kind(), TransactionLockKind::Row);
    let session = TransactionLocks::from_url(&with(&url, "mode=session")).unwrap_err();
    assert_eq!(session.kind(), ErrorKind::Unsupported);
    let backend = lock_sql::connect(&with(&url, "table=tx_locks&timeout=1s"))
        .await
        .unwrap();
    locks.prepare(&pool).await.unwrap();
    broken.prepare(&pool).await.unwrap();
    common_checks(
        Arc::clone(&locks),
        Arc::clone(&broken),
        &backend,
        &pool,
        "mariadb",
    )
    .await;
    waiting_checks(Arc::clone(&locks), Arc::clone(&broken), &pool, "mariadb").await;
    wait_times_out(
        &locks,
        &pool,
        &key("tx/mariadb/timeout"),
        async |tx: &mut sqlx::Transaction<'static, sqlx::MySql>| {
            let one: i32 = sqlx::query_scalar("SELECT 1")
                .fetch_one(&mut **tx)
                .await
                .unwrap();
            assert_eq!(one, 1);
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let url = format!("sqlite://{}", path.display());
    // A short busy timeout: a transaction refused by another's write lock
    // answers soon.
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_millis(200));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    let locks = Arc::new(
        TransactionLocks::from_url(&with(&url, "table=tx_locks&busy_timeout=200ms")).unwrap(),
    );
    let broken = Arc::new(
        TransactionLocks::from_url(&with(&url, "table=tx_other&busy_timeout=200ms")).unwrap(),
    );
    let backend = lock_sql::connect(&with(&url, "table=tx_locks&busy_timeout=200ms&timeout=1s"))
        .await
        .unwrap();
    locks.prepare(&pool).await.unwrap();
    broken.prepare(&pool).await.unwrap();
    // A transaction lock on SQLite holds the file's write lock: the
    // "broken" locks of another table are still refused by it (there is
    // no per-key exclusion to break between two transactions), so the
    // transactions' check runs on the real locks only.
    let k = |s: &str| key(&format!("tx/sqlite/{s}"));
    transactions_exclude(&locks, &locks, &pool, &k("exclude"))
        .await
        .unwrap();
    rollback_frees(&locks, &pool, &k("rollback")).await;
    backend_checks(&locks, &broken, &backend, &pool, "sqlite").await;
    let key = k("tokens");
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let a = granted_token(&locks, &mut tx, &key).await;
    tx.commit().await.unwrap();
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let b = granted_token(&locks, &mut tx, &key).await;
    tx.commit().await.unwrap();
    assert!(a < b, "sqlite: tokens {a:?}, {b:?}");
    wait_times_out(
        &locks,
        &pool,
        &k("timeout"),
        async |tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>| {
            let one: i32 = sqlx::query_scalar("SELECT 1")
                .fetch_one(&mut **tx)
                .await
                .unwrap();
            assert_eq!(one, 1);
        },
    )
    .await;
    // A deferred transaction that read before another connection wrote
    // cannot write: a typed error that names BEGIN IMMEDIATE.
    let mut stale = pool.begin().await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM tx_locks")
        .fetch_one(&mut *stale)
        .await
        .unwrap();
    let mut writer = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    assert!(
        locks
            .try_lock_in(&mut writer, &k("stale-w"))
            .await
            .unwrap()
            .is_some()
    );
    writer.commit().await.unwrap();
    let err = locks
        .try_lock_in(&mut stale, &k("stale"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("BEGIN IMMEDIATE"), "{err}");
    stale.rollback().await.unwrap();

    // A live lease refuses a wait at once (its holder could not release
    // while this transaction holds the write lock).
    let lease = backend
        .try_acquire(&k("leased"), TTL)
        .await
        .unwrap()
        .unwrap();
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let err = locks
        .lock_in(&mut tx, &k("leased"), Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended);
    tx.rollback().await.unwrap();
    backend.release(&lease).await.unwrap();
}
