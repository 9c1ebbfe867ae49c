//! Writes guarded by the store: the shared guarded-write cases
//! (`conformance::fencing::guarded`) on a standalone server, with the data
//! in data nodes of the same server, written two ways: a `multi` on the
//! backend's own session (`ZkBackend::guarded_multi`), and the owner check
//! in a `multi` of another session (`ZkOwnerCheck` with a raw client). The
//! same store without the check (a plain write) must fail them.

use std::sync::Arc;

use async_trait::async_trait;
use conformance::fencing::guarded::{
    GuardedOutcome, GuardedStore, Unchecked, UncheckedWrite, assert_unchecked_fails,
    run_guarded_cases,
};
use lock_core::{ErrorKind, FencingToken, Lease, LeaseKind, LockBackend, LockKey, OwnerId};
use lock_zk::{ZkBackend, ZkGuardedOutcome, ZkOwnerCheck, zookeeper_client as zk};

use crate::common::{self, Standalone};

/// How many times a write starts over when the data node appeared or went
/// between its look-up and its `multi` (another writer's create).
const ATTEMPTS: usize = 5;

fn persistent() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

/// Data nodes under `dir`, read with a raw client of the same server.
struct Data {
    raw: zk::Client,
    dir: String,
}

impl Data {
    fn path(&self, resource: &str) -> String {
        format!("{}/{resource}", self.dir)
    }

    async fn exists(&self, path: &str) -> Result<bool, String> {
        let stat = self.raw.check_stat(path).await;
        Ok(stat.map_err(|e| format!("stat {path}: {e}"))?.is_some())
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, String> {
        match self.raw.get_data(&self.path(resource)).await {
            Ok((data, _)) => String::from_utf8(data).map(Some).map_err(|e| e.to_string()),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(format!("read {resource}: {e}")),
        }
    }
}

/// The write of a data node: a create when it is missing, a set when it
/// exists.
fn add_write<W: AddWrite>(
    writer: &mut W,
    path: &str,
    value: &str,
    exists: bool,
) -> Result<(), zk::Error> {
    if exists {
        writer.set(path, value.as_bytes())
    } else {
        writer.create(path, value.as_bytes())
    }
}

/// The two writers a data write goes into.
trait AddWrite {
    fn set(&mut self, path: &str, data: &[u8]) -> Result<(), zk::Error>;
    fn create(&mut self, path: &str, data: &[u8]) -> Result<(), zk::Error>;
}

impl AddWrite for zk::CheckWriter<'_> {
    fn set(&mut self, path: &str, data: &[u8]) -> Result<(), zk::Error> {
        self.add_set_data(path, data, None)
    }
    fn create(&mut self, path: &str, data: &[u8]) -> Result<(), zk::Error> {
        self.add_create(path, data, &persistent())
    }
}

impl AddWrite for zk::MultiWriter<'_> {
    fn set(&mut self, path: &str, data: &[u8]) -> Result<(), zk::Error> {
        self.add_set_data(path, data, None)
    }
    fn create(&mut self, path: &str, data: &[u8]) -> Result<(), zk::Error> {
        self.add_create(path, data, &persistent())
    }
}

/// A data node appeared (or went) between the look-up and the `multi`.
fn raced(error: &zk::Error) -> bool {
    matches!(error, zk::Error::NodeExists | zk::Error::NoNode)
}

/// Guarded writes on the backend's own session: `guarded_multi`.
struct BackendSession {
    backend: ZkBackend,
    data: Data,
}

#[async_trait]
impl GuardedStore for BackendSession {
    fn name(&self) -> String {
        "zookeeper guarded_multi (the backend's session)".into()
    }

    async fn write(
        &self,
        lease: &Lease,
        resource: &str,
        value: &str,
    ) -> Result<GuardedOutcome, String> {
        let path = self.data.path(resource);
        for _ in 0..ATTEMPTS {
            let exists = self.data.exists(&path).await?;
            let outcome = self
                .backend
                .guarded_multi(lease, |multi| add_write(multi, &path, value, exists))
                .await
                .map_err(|e| e.to_string())?;
            match outcome {
                ZkGuardedOutcome::Written(_) => return Ok(GuardedOutcome::Written),
                ZkGuardedOutcome::Refused => return Ok(GuardedOutcome::Refused),
                ZkGuardedOutcome::OperationFailed { error, .. } if raced(&error) => continue,
                other => return Err(format!("write {resource}: {other:?}")),
            }
        }
        Err(format!("write {resource}: raced {ATTEMPTS} times"))
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, String> {
        self.data.read(resource).await
    }
}

/// Guarded writes on another session (the raw client's): the backend's
/// `owner_check` first in the raw client's `multi`.
struct OtherSession {
    backend: ZkBackend,
    data: Data,
}

#[async_trait]
impl GuardedStore for OtherSession {
    fn name(&self) -> String {
        "zookeeper owner_check (another session)".into()
    }

    async fn write(
        &self,
        lease: &Lease,
        resource: &str,
        value: &str,
    ) -> Result<GuardedOutcome, String> {
        let check = self.backend.owner_check(lease).map_err(|e| e.to_string())?;
        let path = self.data.path(resource);
        for _ in 0..ATTEMPTS {
            let exists = self.data.exists(&path).await?;
            let mut writer = check
                .check_writer(&self.data.raw)
                .map_err(|e| e.to_string())?;
            add_write(&mut writer, &path, value, exists).map_err(|e| e.to_string())?;
            match writer.commit().await {
                Ok(_) => return Ok(GuardedOutcome::Written),
                Err(err) if ZkOwnerCheck::refused(&err) => return Ok(GuardedOutcome::Refused),
                Err(zk::CheckWriteError::OperationFailed { source, .. }) if raced(&source) => {
                    continue;
                }
                Err(err) => return Err(format!("write {resource}: {err}")),
            }
        }
        Err(format!("write {resource}: raced {ATTEMPTS} times"))
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, String> {
        self.data.read(resource).await
    }
}

#[async_trait]
impl UncheckedWrite for OtherSession {
    async fn write_unchecked(&self, resource: &str, value: &str) -> Result<(), String> {
        let path = self.data.path(resource);
        for _ in 0..ATTEMPTS {
            let exists = self.data.exists(&path).await?;
            let mut writer = self.data.raw.new_multi_writer();
            add_write(&mut writer, &path, value, exists).map_err(|e| e.to_string())?;
            match writer.commit().await {
                Ok(_) => return Ok(()),
                Err(zk::MultiWriteError::OperationFailed { source, .. }) if raced(&source) => {
                    continue;
                }
                Err(err) => return Err(format!("write {resource}: {err}")),
            }
        }
        Err(format!("write {resource}: raced {ATTEMPTS} times"))
    }
}

/// The cases pass on both ways of writing (the expiry case skipped: leases
/// live as long as their session) and catch the unchecked write (released
/// and taken-over leases write). Besides: a caller's own failed operation
/// is told from a refusal, the check works in a `MultiWriter` the caller
/// builds, `guarded_multi` is refused by the ensemble (not only by its
/// local pre-check) for a node deleted behind the backend's back, and
/// leases the check cannot serve get typed errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_writes_on_a_single_server() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let backend = target.backend().await.expect("backend");
    let raw = target.raw().await;
    let dir = format!("/guarded-data-{}", &OwnerId::random().to_hex()[..8]);
    raw.create(&dir, &[], &persistent())
        .await
        .expect("data dir");
    let lock: Arc<dyn LockBackend> = Arc::new(backend.clone());
    let data = |raw: &zk::Client| Data {
        raw: raw.clone(),
        dir: dir.clone(),
    };
    let stores: [Arc<dyn GuardedStore>; 2] = [
        Arc::new(BackendSession {
            backend: backend.clone(),
            data: data(&raw),
        }),
        Arc::new(OtherSession {
            backend: backend.clone(),
            data: data(&raw),
        }),
    ];
    for store in stores {
        let report = run_guarded_cases(lock.clone(), store).await;
        println!("{report:?}");
        report.assert_passed();
        assert_eq!(
            report.passed(),
            [
                "holder_write_lands",
                "released_lease_is_refused",
                "taken_over_lease_is_refused"
            ],
            "{report:?}"
        );
    }
    let broken = Arc::new(Unchecked::new(OtherSession {
        backend: backend.clone(),
        data: data(&raw),
    }));
    let report = assert_unchecked_fails(lock.clone(), broken).await;
    assert!(
        report.failed().contains(&"taken_over_lease_is_refused"),
        "{report:?}"
    );

    // The caller's own operation failing (a create of a node that exists)
    // is neither a write nor a refusal.
    let key = common::key("guarded-extra");
    let lease = common::grant(&backend, &key, common::TTL, "free").await;
    let taken = format!("{dir}/taken");
    raw.create(&taken, b"x", &persistent())
        .await
        .expect("create");
    let outcome = backend
        .guarded_multi(&lease, |multi| {
            multi.add_set_data(&taken, b"y", None)?;
            multi.add_create(&taken, b"z", &persistent())
        })
        .await
        .expect("guarded multi");
    assert_eq!(
        outcome,
        ZkGuardedOutcome::OperationFailed {
            index: 1,
            error: zk::Error::NodeExists
        }
    );
    assert_eq!(raw.get_data(&taken).await.expect("read").0, b"x");

    // The check in a `MultiWriter` of the caller's, at index 1.
    let check = backend.owner_check(&lease).expect("owner check");
    assert_eq!(Some(check.path()), backend.node_path(&lease).as_deref());
    let write = |value: &'static [u8]| {
        let mut multi = raw.new_multi_writer();
        multi.add_set_data(&taken, value, None).expect("set");
        check.add_to(&mut multi).expect("check");
        multi.commit()
    };
    write(b"held").await.expect("a holder's multi");
    assert!(backend.release(&lease).await.expect("release"));
    let err = write(b"late").await.expect_err("a released lease's multi");
    assert!(ZkOwnerCheck::refused_at(&err, 1), "{err:?}");
    assert!(!ZkOwnerCheck::refused_at(&err, 0), "{err:?}");
    assert_eq!(raw.get_data(&taken).await.expect("read").0, b"held");

    // A node deleted behind the backend's back (it still tracks the lease
    // as held): `guarded_multi` is refused by the ensemble's check.
    let lease = common::grant(&backend, &key, common::TTL, "free again").await;
    let node = backend.node_path(&lease).expect("a node");
    raw.delete(&node, None).await.expect("delete the lock node");
    let outcome = backend
        .guarded_multi(&lease, |multi| multi.add_set_data(&taken, b"deleted", None))
        .await
        .expect("guarded multi");
    assert_eq!(outcome, ZkGuardedOutcome::Refused);
    assert_eq!(raw.get_data(&taken).await.expect("read").0, b"held");
    assert!(!backend.release(&lease).await.expect("release"));

    // Leases the check cannot serve.
    let read = common::take(&backend, &key, LeaseKind::Read, "a read share").await;
    let err = backend.owner_check(&read).expect_err("a read lease");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let err = backend
        .guarded_multi(&read, |_| Ok(()))
        .await
        .expect_err("a read lease");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(backend.release(&read).await.expect("release"));
    let foreign = Lease::from_parts(
        LockKey::new("guarded-foreign").unwrap(),
        OwnerId::random(),
        FencingToken::new(1),
        common::TTL,
        tokio::time::Instant::now() + common::TTL,
        "not-a-node".into(),
    );
    let err = backend.owner_check(&foreign).expect_err("a foreign lease");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}
