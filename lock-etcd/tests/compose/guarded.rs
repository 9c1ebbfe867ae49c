//! Writes guarded by the store (`owner_compares`, `guarded_txn`): the
//! shared cases of `conformance::fencing::guarded` on data in the same
//! etcd, and on a broken variant that writes without the compares
//! ([`Unchecked`]), which they must catch.

use conformance::fencing::guarded::{
    GuardedOutcome, GuardedStore, Unchecked, UncheckedWrite, assert_unchecked_fails,
    run_guarded_cases,
};
use lock_etcd::EtcdGuardedOutcome;
use lock_etcd::etcd_client::TxnOp;

use super::*;

/// The data: `<prefix>/<resource>`, beside the locks' prefix.
struct EtcdData {
    backend: EtcdBackend,
    prefix: String,
}

impl EtcdData {
    fn data_key(&self, resource: &str) -> String {
        format!("{}/{resource}", self.prefix)
    }
}

#[lock_core::async_trait]
impl GuardedStore for EtcdData {
    fn name(&self) -> String {
        "etcd guarded_txn".into()
    }

    async fn write(
        &self,
        lease: &Lease,
        resource: &str,
        value: &str,
    ) -> Result<GuardedOutcome, String> {
        let put = TxnOp::put(self.data_key(resource), value, None);
        match self.backend.guarded_txn(lease, [put]).await {
            Ok(EtcdGuardedOutcome::Written(_)) => Ok(GuardedOutcome::Written),
            Ok(EtcdGuardedOutcome::Refused) => Ok(GuardedOutcome::Refused),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, String> {
        let answer = self
            .backend
            .client()
            .kv_client()
            .get(self.data_key(resource), None)
            .await
            .map_err(|e| e.to_string())?;
        Ok(answer
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }
}

#[lock_core::async_trait]
impl UncheckedWrite for EtcdData {
    /// A plain put: the same data, no compare on the lock.
    async fn write_unchecked(&self, resource: &str, value: &str) -> Result<(), String> {
        self.backend
            .client()
            .kv_client()
            .put(self.data_key(resource), value, None)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_writes_land_only_for_the_holder() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let b = connect_at(&server, "guarded-locks").await;
    let data = |b: &EtcdBackend| EtcdData {
        backend: b.clone(),
        prefix: "guarded-data".into(),
    };
    let report = run_guarded_cases(Arc::new(b.clone()), Arc::new(data(&b))).await;
    println!("{report:?}");
    report.assert_passed();
    assert_eq!(
        report.passed().len(),
        conformance::fencing::guarded::GUARDED_CASES.len(),
        "every case ran: {report:?}"
    );

    // The same cases catch a write without the compares.
    let broken = Arc::new(Unchecked::new(data(&b)));
    let report = assert_unchecked_fails(Arc::new(b.clone()), broken).await;
    println!("unchecked store caught: {:?}", report.failed());

    // Shared leases are refused with a typed error, before anything is sent.
    let key = LockKey::new("guarded-read").unwrap();
    let read = b
        .try_acquire_kind(&key, lock_core::LeaseKind::Read, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let err = b.owner_compares(&read).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let put = TxnOp::put("guarded-data/read", "x", None);
    let err = b.guarded_txn(&read, [put]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(b.release(&read).await.unwrap());

    // A lease whose entry is looked up (granted by another backend) and
    // gone: refused, not an error.
    let other = connect_at(&server, "guarded-locks").await;
    let key = LockKey::new("guarded-elsewhere").unwrap();
    let lease = common::granted(&other, &key, Duration::from_secs(5)).await;
    let put = || TxnOp::put("guarded-data/elsewhere", "x", None);
    assert!(b.guarded_txn(&lease, [put()]).await.unwrap().is_written());
    assert!(other.release(&lease).await.unwrap());
    assert!(!b.guarded_txn(&lease, [put()]).await.unwrap().is_written());
}
