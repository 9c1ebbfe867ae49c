//! The file backend against other processes: util-linux `flock(1)` both
//! ways, a holder killed with SIGKILL, tokens across processes, and bad
//! URLs.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use lock_core::{ErrorKind, LeaseKind, LockBackend, LockBackendExt, LockKey, LockShape};
use lock_file::FileBackend;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);

fn backend(dir: &Path) -> FileBackend {
    FileBackend::new(lock_file::FileConfig::new(dir)).expect("backend")
}

fn url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// The first line `child` prints.
fn first_line(stdout: &mut BufReader<ChildStdout>) -> String {
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read the child's line");
    line.trim().to_owned()
}

/// A process running util-linux `flock <path> sh -c 'echo held; cat >/dev/null'`:
/// it holds the lock (shared with `-s`) until its stdin closes.
fn shell_flock(path: &Path, shared: bool) -> (Child, BufReader<ChildStdout>) {
    let mut cmd = Command::new("flock");
    if shared {
        cmd.arg("-s");
    }
    let mut child = cmd
        .arg(path)
        .args(["sh", "-c", "echo held; cat >/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("util-linux flock(1) on PATH (Debian package util-linux)");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    assert_eq!(first_line(&mut out), "held");
    (child, out)
}

/// `flock -n [-s] <path> true`: whether it got the lock at once.
fn flock_n(path: &Path, shared: bool) -> bool {
    let mut cmd = Command::new("flock");
    cmd.arg("-n");
    if shared {
        cmd.arg("-s");
    }
    cmd.arg(path)
        .arg("true")
        .status()
        .expect("util-linux flock(1) on PATH")
        .success()
}

#[tokio::test]
async fn a_shell_flock_excludes_us_and_we_exclude_flock_n() {
    let dir = tempfile::tempdir().unwrap();
    let b = backend(dir.path());
    let key = LockKey::new("jobs/nightly run").unwrap();
    let lock_path = b.files(&key, LockShape::Mutex).unwrap().lock;
    assert_eq!(lock_path, dir.path().join("jobs%2Fnightly%20run.lock"));

    // flock(1) holds: we are kept out, and see a foreign holder.
    let (mut shell, _out) = shell_flock(&lock_path, false);
    assert!(b.try_acquire(&key, TTL).await.unwrap().is_none());
    let info = b.inspect(&key).await.unwrap().expect("held by flock(1)");
    assert!(info.holder.starts_with("pid "), "{info:?}");
    assert_eq!(info.token, None);
    let waiting = b.acquire(&key, TTL, Instant::now() + Duration::from_millis(300));
    assert_eq!(waiting.await.unwrap_err().kind(), ErrorKind::Contended);
    // The script ends: our waiting acquire gets in.
    drop(shell.stdin.take());
    let lease = b
        .acquire(&key, TTL, Instant::now() + Duration::from_secs(5))
        .await
        .expect("free once flock(1) let go");
    assert!(shell.wait().unwrap().success());

    // We hold: `flock -n` fails, shared or not; after release it succeeds.
    assert!(!flock_n(&lock_path, false));
    assert!(!flock_n(&lock_path, true));
    let info = b.inspect(&key).await.unwrap().expect("held by us");
    assert_eq!(info.holder, lease.owner().to_hex());
    assert_eq!(info.token, Some(lease.token()));
    assert!(b.release(&lease).await.unwrap());
    assert!(flock_n(&lock_path, false));
    assert!(b.inspect(&key).await.unwrap().is_none());
}

#[tokio::test]
async fn read_write_locks_are_shared_and_exclusive_flocks() {
    let dir = tempfile::tempdir().unwrap();
    let b = backend(dir.path());
    let key = LockKey::new("rw").unwrap();
    let rw_path = b.files(&key, LockShape::ReadWrite).unwrap().lock;
    let read = b
        .try_acquire_kind(&key, LeaseKind::Read, TTL)
        .await
        .unwrap()
        .expect("free");
    assert!(flock_n(&rw_path, true), "flock -s shares with our reader");
    assert!(
        !flock_n(&rw_path, false),
        "flock -x is kept out by our reader"
    );
    assert!(b.release(&read).await.unwrap());

    // A shell reader keeps our writer out, not our readers.
    let (mut shell, _out) = shell_flock(&rw_path, true);
    assert!(
        b.try_acquire_kind(&key, LeaseKind::Write, TTL)
            .await
            .unwrap()
            .is_none()
    );
    let read = b
        .try_acquire_kind(&key, LeaseKind::Read, TTL)
        .await
        .unwrap()
        .expect("readers share with flock -s");
    let holders = b.holders(&key, LockShape::ReadWrite).await.unwrap();
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert!(holders.iter().all(|h| h.kind == LeaseKind::Read));
    assert!(b.release(&read).await.unwrap());
    drop(shell.stdin.take());
    assert!(shell.wait().unwrap().success());
    let write = b
        .acquire_kind(
            &key,
            LeaseKind::Write,
            TTL,
            Instant::now() + Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert!(!flock_n(&rw_path, true));
    assert!(b.release(&write).await.unwrap());
}

/// The holder binary, holding `key` under `dir`; returns it with its token.
fn holder(dir: &Path, key: &str) -> (Child, u64) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lock-file-holder"))
        .arg(url(dir))
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the holder");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let line = first_line(&mut out);
    let token = line
        .strip_prefix("token ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("holder said {line:?}"));
    (child, token)
}

#[tokio::test]
async fn a_holder_killed_with_sigkill_frees_the_lock_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let b = backend(dir.path());
    let key = LockKey::new("killed").unwrap();
    let (mut child, token) = holder(dir.path(), key.as_str());
    assert!(b.try_acquire(&key, TTL).await.unwrap().is_none());
    let info = b.inspect(&key).await.unwrap().expect("held by the child");
    assert_eq!(info.token.map(|t| t.get()), Some(token));
    child.kill().expect("SIGKILL");
    let killed_at = Instant::now();
    child.wait().unwrap();
    let lease = b
        .acquire(&key, TTL, Instant::now() + Duration::from_secs(2))
        .await
        .expect("the kernel freed the dead holder's lock");
    let freed_after = killed_at.elapsed();
    assert!(lease.token().get() > token);
    assert!(
        freed_after < Duration::from_millis(500),
        "freed {freed_after:?} after the kill"
    );
    println!("freed {freed_after:?} after SIGKILL");
    b.release(&lease).await.unwrap();
}

#[tokio::test]
async fn tokens_rise_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let key = LockKey::new("tokens").unwrap();
    let mut seen = Vec::new();
    for round in 0..3 {
        let (mut child, token) = holder(dir.path(), key.as_str());
        seen.push(token);
        // Closing stdin makes the holder release and exit.
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
        // A new backend value each round: nothing is cached in-process.
        let b = backend(dir.path());
        let lease = b.try_acquire(&key, TTL).await.unwrap().expect("free");
        seen.push(lease.token().get());
        if round == 1 {
            // A grant never released, dropped with its backend: the
            // session ends, the lock is freed, the token is not reused.
            drop(b);
            continue;
        }
        assert!(b.release(&lease).await.unwrap());
    }
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    assert_eq!(seen.first(), Some(&1));
}

#[tokio::test]
async fn bad_urls_and_directories_are_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, "x").unwrap();
    let missing = dir.path().join("missing");
    for url in [
        "file:relative/dir".to_owned(),
        "file://relative/dir".to_owned(),
        "file://".to_owned(),
        "file://otherhost/tmp".to_owned(),
        format!("file://{}?ttl=1s", dir.path().display()),
        format!("file://{}", missing.display()),
        format!("file://{}", file.display()),
        // Files cannot be created there, even by root.
        "file:///proc".to_owned(),
    ] {
        let err = distlock::backend::open(&url).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
    }
    let ok = distlock::backend::open(&url(dir.path())).await.unwrap();
    assert_eq!(ok.name(), "file");
}

#[tokio::test]
async fn a_replaced_lock_file_fails_the_renewal() {
    let dir = tempfile::tempdir().unwrap();
    let b = backend(dir.path());
    let key = LockKey::new("replaced").unwrap();
    let lease = b.try_acquire(&key, TTL).await.unwrap().expect("free");
    b.renew(&lease).await.expect("ours");
    let path = b.files(&key, LockShape::Mutex).unwrap().lock;
    std::fs::remove_file(&path).unwrap();
    let err = b.renew(&lease).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(!b.release(&lease).await.unwrap());
    std::fs::File::create(path).unwrap().flush().unwrap();
}

/// A downgrade converts the `flock` in one step: a `flock -x` blocked in
/// the kernel on our write lock stays blocked through the downgrade (it is
/// woken when our exclusive lock goes, and finds the shared one already
/// there), and gets in once the reader leaves.
#[tokio::test]
async fn a_blocked_flock_does_not_slip_in_during_a_downgrade() {
    let dir = tempfile::tempdir().unwrap();
    let b = backend(dir.path());
    let key = LockKey::new("downgrade").unwrap();
    let rw_path = b.files(&key, LockShape::ReadWrite).unwrap().lock;
    let write = b
        .try_acquire_kind(&key, LeaseKind::Write, TTL)
        .await
        .unwrap()
        .expect("free");
    let mut waiter = Command::new("flock")
        .arg("-x")
        .arg(&rw_path)
        .arg("true")
        .spawn()
        .expect("util-linux flock(1) on PATH");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "flock -x beside a writer"
    );
    let read = LockBackendExt::downgrade(&b, &write).await.unwrap();
    assert_eq!(read.kind(), LeaseKind::Read);
    assert_eq!(read.token(), write.token());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "flock -x got in during or after the downgrade"
    );
    assert!(flock_n(&rw_path, true), "the downgraded lock is shared");
    assert!(b.renew(&write).await.is_err(), "the write lease is gone");
    assert!(b.release(&read).await.unwrap());
    assert!(waiter.wait().unwrap().success());
}
